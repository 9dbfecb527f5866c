/* CPU backend: OpenMP loops over the single-source kernels (GEMM: cpu_gemm.c). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/backend.h"
#include "cpu_internal.h"
#include "../../kernels/elem.h"
#include "../../kernels/optim.h"
#include "../../kernels/rows.h"

#define F32 VL_K_F32
#define COLS 16 /* columns per block of the column sums (rmsnorm dw, embedding dw) */

static bool all_f32(const vl_tensor *a, const vl_tensor *b, const vl_tensor *c) {
  return a->dtype == VL_F32 && b->dtype == VL_F32 && (!c || c->dtype == VL_F32);
}

/* The backend's state on a context (c->be_state). */
typedef struct {
  double timer_t0; /* host clock at timer_start */
} cpu_state;

static vl_status cpu_init(vl_ctx *c) {
  c->be_state = calloc(1, sizeof(cpu_state));
  return c->be_state ? VL_OK : vl_fail(c, VL_ERR_OOM, "cpu backend state");
}
static void cpu_fini(vl_ctx *c) {
  free(c->be_state);
  c->be_state = NULL;
}
static vl_status cpu_sync(vl_ctx *c) { (void)c; return VL_OK; }
static vl_status cpu_timer_start(vl_ctx *c) {
  ((cpu_state *)c->be_state)->timer_t0 = vl_now();
  return VL_OK;
}
static vl_status cpu_timer_stop(vl_ctx *c, double *sec) {
  *sec = vl_now() - ((cpu_state *)c->be_state)->timer_t0;
  return VL_OK;
}
static size_t cpu_fixed_ws(const vl_ctx *c) { (void)c; return 0; }

static vl_status cpu_upload(vl_ctx *c, vl_tensor *dst, size_t off, const void *src, size_t n) {
  (void)c;
  memcpy((char *)dst->data + off, src, n);
  return VL_OK;
}
static vl_status cpu_download(vl_ctx *c, void *dst, const vl_tensor *src, size_t off, size_t n) {
  (void)c;
  memcpy(dst, (const char *)src->data + off, n);
  return VL_OK;
}
static void *cpu_host_alloc(vl_ctx *c, size_t bytes, bool pinned) {
  (void)c; (void)pinned; /* nothing to pin for: batches stay in host memory */
  return malloc(bytes ? bytes : 1);
}
static void cpu_host_free(vl_ctx *c, void *p, bool pinned) { (void)c; (void)pinned; free(p); }

static vl_status cpu_zero(vl_ctx *c, const void *p) {
  const vl_zero_args *a = p;
  (void)c;
  memset(a->y->data, 0, a->y->bytes);
  return VL_OK;
}

static vl_status cpu_convert(vl_ctx *c, const void *p) {
  const vl_convert_args *a = p;
  vl_tensor *y = a->y;
  const vl_tensor *x = a->x;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_MEM);
  (void)c;
  if (y->dtype == x->dtype && y->data != x->data && n > 0) { /* a copy */
    memcpy(y->data, x->data, vl_dtype_bytes(y->dtype, n));
    return VL_OK;
  }
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; i++) vl_k_convert(y->data, dt(y), x->data, dt(x), i);
  return VL_OK;
}

#define AXPBY(YD, XD)                                                                      \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t i = 0; i < n; i++)  \
      vl_k_axpby(py, YD, fa, px, XD, fb, i)
static vl_status cpu_axpby(vl_ctx *c, const void *p) {
  const vl_axpby_args *a = p;
  void *py = a->y->data;
  const void *px = a->x->data;
  int64_t n = a->n;
  float fa = a->a, fb = a->b;
  int nt = vl_cpu_threads((double)n * NS_MEM);
  (void)c;
  if (a->y->dtype == VL_F32 && a->x->dtype == VL_F32) AXPBY(F32, F32);
  else AXPBY(dt(a->y), dt(a->x));
  return VL_OK;
}

static vl_status cpu_embed_fwd(vl_ctx *c, const void *p) {
  const vl_embed_fwd_args *a = p;
  int64_t R = a->R, C = a->C;
  vl_tensor *out = a->out;
  const vl_tensor *wte = a->wte;
  const int32_t *tok = a->tok ? a->tok->data : NULL;
  int nt = vl_cpu_threads((double)(R * C) * NS_MEM);
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < R * C; i++)
    vl_k_embed_fwd(out->data, dt(out), wte->data, dt(wte), tok, C, i);
  return VL_OK;
}

/* dwte by blocks of COLS columns, each block's rows in order: per column the adds of
 * vl_k_embed_bwd_col in its order, reading rows instead of striding down columns. */
#define EMBED_BWD(WD, OD)                                                                  \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t b = 0; b < nb; b++) { \
    int64_t c0 = b * COLS, c1 = c0 + COLS < C ? c0 + COLS : C;                             \
    for (int64_t r = 0; r < R; r++)                                                        \
      for (int64_t k = c0; k < c1; k++) vl_k_embed_bwd_add(pw, WD, po, OD, tok, C, r, k);  \
  }
static vl_status cpu_embed_bwd(vl_ctx *c, const void *p) {
  const vl_embed_bwd_args *a = p;
  int64_t R = a->R, C = a->C, nb = (C + COLS - 1) / COLS;
  void *pw = a->dwte->data;
  const void *po = a->dout->data;
  const int32_t *tok = a->tok ? a->tok->data : NULL;
  int nt = vl_cpu_threads((double)(R * C) * NS_MEM);
  if (a->dwte->dtype == VL_F32 && a->dout->dtype == VL_F32) EMBED_BWD(F32, F32)
  else EMBED_BWD(dt(a->dwte), dt(a->dout))
  return VL_OK;
}

#define RMSNORM_FWD(OD, XD, WD)                                                            \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t r = 0; r < R; r++)  \
      vl_k_rmsnorm_fwd_row(po, OD, rstd, px, XD, pw, WD, C, eps, r)
static vl_status cpu_rmsnorm_fwd(vl_ctx *c, const void *p) {
  const vl_rmsnorm_fwd_args *a = p;
  void *po = a->out->data;
  float *rstd = a->rstd->data;
  const void *px = a->x->data, *pw = a->w->data;
  int64_t R = a->R, C = a->C;
  float eps = a->eps;
  int nt = vl_cpu_threads((double)(R * C) * NS_ROW);
  (void)c;
  if (all_f32(a->out, a->x, a->w)) RMSNORM_FWD(F32, F32, F32);
  else RMSNORM_FWD(dt(a->out), dt(a->x), dt(a->w));
  return VL_OK;
}

/* One parallel region: dx row by row, then dw by blocks of COLS columns over every row in
 * order (vl_k_rmsnorm_dw_col's sums, reading rows instead of striding down columns). */
#define RMSNORM_BWD(DXD, DYD, XD, WD, DWD)                                                 \
  _Pragma("omp parallel num_threads(nt) if (nt > 1)") {                                    \
    _Pragma("omp for") for (int64_t r = 0; r < R; r++)                                     \
        vl_k_rmsnorm_bwd_row(pdx, DXD, pdy, DYD, px, XD, pw, WD, rstd, C, r);              \
    if (pdw) {                                                                             \
      _Pragma("omp for") for (int64_t b = 0; b < nb; b++) {                                \
        int64_t c0 = b * COLS, c1 = c0 + COLS < C ? c0 + COLS : C;                         \
        float acc[COLS] = {0.0f};                                                          \
        for (int64_t r = 0; r < R; r++)                                                    \
          for (int64_t k = c0; k < c1; k++)                                                \
            acc[k - c0] += vl_k_rmsnorm_dw_term(pdy, DYD, px, XD, rstd, C, r, k);          \
        for (int64_t k = c0; k < c1; k++) vl_st(pdw, DWD, k, vl_ld(pdw, DWD, k) + acc[k - c0]); \
      }                                                                                    \
    }                                                                                      \
  }
static vl_status cpu_rmsnorm_bwd(vl_ctx *c, const void *p) {
  const vl_rmsnorm_bwd_args *a = p;
  void *pdx = a->dx->data, *pdw = a->dw ? a->dw->data : NULL;
  const void *pdy = a->dout->data, *px = a->x->data, *pw = a->w->data;
  const float *rstd = a->rstd->data;
  int64_t R = a->R, C = a->C, nb = (C + COLS - 1) / COLS;
  int dwd = a->dw ? dt(a->dw) : F32;
  int nt = vl_cpu_threads((double)(R * C) * NS_ROW * (a->dw ? 3 : 2));
  (void)c;
  if (all_f32(a->dx, a->dout, a->x) && a->w->dtype == VL_F32 && dwd == F32)
    RMSNORM_BWD(F32, F32, F32, F32, F32)
  else
    RMSNORM_BWD(dt(a->dx), dt(a->dout), dt(a->x), dt(a->w), dwd)
  return VL_OK;
}

/* Each (t, d) angle once (T*D/2 sines and cosines, not B*T*H*D/2), then every (b, h) row at
 * position t rotated with it; per element the same values as vl_k_rope. */
#define ROPE_MAX_HALF 256
#define ROPE(XD)                                                                           \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t t = 0; t < T; t++) { \
    float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];                                            \
    for (int64_t d = 0; d < half; d++)                                                     \
      vl_k_rope_angle(t, d, D, theta, inverse, &cs[d], &sn[d]);                            \
    for (int64_t b = 0; b < B; b++)                                                        \
      for (int64_t h = 0; h < H; h++) {                                                    \
        int64_t base = ((b * T + t) * H + h) * D;                                          \
        for (int64_t d = 0; d < half; d++) vl_k_rope_pair(px, XD, base, d, half, cs[d], sn[d]); \
      }                                                                                    \
  }
static vl_status cpu_rope(vl_ctx *c, const void *p) {
  const vl_rope_args *a = p;
  void *px = a->x->data;
  int64_t B = a->B, T = a->T, H = a->H, D = a->D, half = D / 2, n = B * T * H * half;
  float theta = a->theta;
  int inverse = a->inverse;
  (void)c;
  if (half > ROPE_MAX_HALF) { /* wider heads than the angle table: angle per element */
    int nt = vl_cpu_threads((double)n * NS_TRIG);
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t i = 0; i < n; i++) vl_k_rope(px, dt(a->x), T, H, D, theta, inverse, i);
    return VL_OK;
  }
  int nt = vl_cpu_threads((double)n * NS_MEM * 2 + (double)(T * half) * NS_TRIG);
  if (a->x->dtype == VL_F32) ROPE(F32)
  else ROPE(dt(a->x))
  return VL_OK;
}

static vl_status cpu_permute(vl_ctx *c, const void *p) {
  const vl_permute_args *a = p;
  vl_tensor *y = a->y;
  const vl_tensor *x = a->x;
  int64_t T = a->T, H = a->H, D = a->D, n = a->B * T * H * D, rows = a->B * T * H;
  int back = a->back;
  if (y->dtype != x->dtype) return vl_fail(c, VL_ERR_INVALID, "permute: dtypes differ");
  /* whole rows of D contiguous elements: one copy per row, same index map as the kernel */
  size_t rb = vl_dtype_bytes(y->dtype, D);
  int nt = vl_cpu_threads((double)n * NS_MEM);
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t r = 0; r < rows; r++)
    memcpy((char *)y->data + r * rb,
           (const char *)x->data + vl_k_permute_src_row(T, H, back, r) * rb, rb);
  return VL_OK;
}

#define SOFTMAX_FWD(PD, SD)                                                                \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t r = 0; r < rows; r++) \
      vl_k_softmax_row(pP, PD, pS, SD, T, scale, causal, r)
static vl_status cpu_softmax_fwd(vl_ctx *c, const void *p) {
  const vl_softmax_fwd_args *a = p;
  void *pP = a->P->data;
  const void *pS = a->S->data;
  int64_t rows = a->rows, T = a->T;
  float scale = a->scale;
  int causal = a->causal;
  int nt = vl_cpu_threads((double)(rows * T) * (causal ? 0.5 : 1.0) * NS_EXP);
  (void)c;
  if (a->P->dtype == VL_F32 && a->S->dtype == VL_F32) SOFTMAX_FWD(F32, F32);
  else SOFTMAX_FWD(dt(a->P), dt(a->S));
  return VL_OK;
}

#define SOFTMAX_BWD(DD, PD)                                                                \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t r = 0; r < rows; r++) \
      vl_k_softmax_bwd_row(pdS, DD, pdP, DD, pP, PD, T, scale, causal, r)
static vl_status cpu_softmax_bwd(vl_ctx *c, const void *p) {
  const vl_softmax_bwd_args *a = p;
  void *pdS = a->dS->data;
  const void *pdP = a->dP->data, *pP = a->P->data;
  int64_t rows = a->rows, T = a->T;
  float scale = a->scale;
  int causal = a->causal;
  int nt = vl_cpu_threads((double)(rows * T) * NS_ROW);
  (void)c;
  if (all_f32(a->dS, a->dP, a->P)) {
    SOFTMAX_BWD(F32, F32);
  } else {
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < rows; r++)
      vl_k_softmax_bwd_row(pdS, dt(a->dS), pdP, dt(a->dP), pP, dt(a->P), T, scale, causal, r);
  }
  return VL_OK;
}

#define SWIGLU_FWD(OD, GD)                                                                 \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t i = 0; i < n; i++)  \
      vl_k_swiglu_fwd(po, OD, pg, pu, GD, i)
static vl_status cpu_swiglu_fwd(vl_ctx *c, const void *p) {
  const vl_swiglu_fwd_args *a = p;
  void *po = a->out->data;
  const void *pg = a->g->data, *pu = a->u->data;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_EXP);
  (void)c;
  if (a->out->dtype == VL_F32 && a->g->dtype == VL_F32) SWIGLU_FWD(F32, F32);
  else SWIGLU_FWD(dt(a->out), dt(a->g));
  return VL_OK;
}

#define SWIGLU_BWD(GD, OD)                                                                 \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t i = 0; i < n; i++)  \
      vl_k_swiglu_bwd(pdg, pdu, GD, pdo, OD, pg, pu, GD, i)
static vl_status cpu_swiglu_bwd(vl_ctx *c, const void *p) {
  const vl_swiglu_bwd_args *a = p;
  void *pdg = a->dg->data, *pdu = a->du->data;
  const void *pdo = a->dout->data, *pg = a->g->data, *pu = a->u->data;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_EXP);
  (void)c;
  if (a->dg->dtype == VL_F32 && a->dout->dtype == VL_F32 && a->g->dtype == VL_F32)
    SWIGLU_BWD(F32, F32);
  else
    SWIGLU_BWD(dt(a->dg), dt(a->dout));
  return VL_OK;
}

static vl_status cpu_xent(vl_ctx *c, const void *p) {
  const vl_xent_fused_args *a = p;
  int64_t R = a->R, V = a->V;
  float s = a->dloss_scale;
  void *pl = a->logits->data;
  float *loss = a->loss->data;
  const int32_t *tgt = a->tgt ? a->tgt->data : NULL;
  int nt = vl_cpu_threads((double)(R * V) * NS_EXP);
  if (a->logits->dtype == VL_F32) {
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < R; r++) vl_k_xent_row(pl, F32, loss, tgt, V, s, r);
  } else {
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < R; r++) vl_k_xent_row(pl, dt(a->logits), loss, tgt, V, s, r);
  }
  return VL_OK;
}

/* Sums over [0, n) in a fixed shape: SUM_PARTS parts of a size that depends on n only, each
 * summed in order by one thread, then the parts in order; so the sum does not depend on the
 * thread count. TERM(i) is the double term of element i. */
#define SUM_PARTS 64
#define FIXED_SUM(out, n, nt, TERM)                                                        \
  do {                                                                                     \
    double part_[SUM_PARTS];                                                               \
    int64_t len_ = ((n) + SUM_PARTS - 1) / SUM_PARTS;                                      \
    _Pragma("omp parallel for num_threads(nt) if (nt > 1)")                                \
    for (int p_ = 0; p_ < SUM_PARTS; p_++) {                                               \
      int64_t i0_ = p_ * len_, i1_ = i0_ + len_ < (n) ? i0_ + len_ : (n);                  \
      double acc_ = 0;                                                                     \
      _Pragma("omp simd reduction(+ : acc_)") for (int64_t i = i0_; i < i1_; i++) acc_ += TERM; \
      part_[p_] = acc_;                                                                    \
    }                                                                                      \
    double s_ = 0;                                                                         \
    for (int p_ = 0; p_ < SUM_PARTS; p_++) s_ += part_[p_];                                \
    (out) = s_;                                                                            \
  } while (0)

static inline double sq(double u) { return u * u; }

static vl_status cpu_sumsq(vl_ctx *c, const void *p) {
  const vl_sumsq_args *a = p;
  const vl_tensor *x = a->x;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_MEM);
  (void)c;
  /* A NaN or Inf element makes the double sum non-finite (a finite float squared cannot
   * overflow a double), so one check at the end finds it. */
  double acc = 0;
  if (x->dtype == VL_F32) {
    const float *px = x->data;
    FIXED_SUM(acc, n, nt, sq(px[i]));
  } else {
    const void *px = x->data;
    int xd = dt(x);
    FIXED_SUM(acc, n, nt, sq(vl_ld(px, xd, i)));
  }
  *a->nonfinite = !isfinite(acc);
  *a->out = *a->nonfinite ? 0 : acc;
  return VL_OK;
}
static vl_status cpu_adamw(vl_ctx *c, const void *args) {
  const vl_adamw_args *a = args;
  float *p = a->p->data, *m = a->m->data, *v = a->v->data;
  const float *g = a->g->data;
  const vl_optim_hp *h = a->hp;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_OPT);
  (void)c;
  float bc1 = 1.0f - powf(h->beta1, (float)h->t), bc2 = 1.0f - powf(h->beta2, (float)h->t);
  float lr = h->lr, b1 = h->beta1, b2 = h->beta2, eps = h->eps, wd = h->weight_decay;
  float gs = h->grad_scale;
#pragma omp parallel for simd num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; i++) vl_k_adamw(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2, gs, i);
  return VL_OK;
}
static vl_status cpu_sgd(vl_ctx *c, const void *args) {
  const vl_sgd_args *a = args;
  float *p = a->p->data, *mom = a->mom->data;
  const float *g = a->g->data;
  const vl_optim_hp *h = a->hp;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_MEM);
  float lr = h->lr, mu = h->momentum, wd = h->weight_decay, gs = h->grad_scale;
  (void)c;
#pragma omp parallel for simd num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; i++) vl_k_sgd(p, g, mom, lr, mu, wd, gs, i);
  return VL_OK;
}
static vl_status cpu_adafactor(vl_ctx *c, const void *args) {
  const vl_adafactor_args *a = args;
  vl_tensor *p = a->p, *vr = a->vr, *vc = a->vc, *m = a->m;
  const vl_tensor *g = a->g;
  const vl_optim_hp *h = a->hp;
  int64_t R = a->R, C = a->C;
  (void)c;
  float b2t = 1.0f - powf((float)h->t, -h->decay_pow);
  const float eps1 = 1e-30f;
  float *gp = g->data, *pp = p->data, *vrp = vr->data, *vcp = vc->data;
  int64_t n = R * C;
  int nt = vl_cpu_threads((double)n * NS_OPT);
  float vr_mean = 0.0f;
  if (R > 1) {
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < R; r++) vl_k_adafactor_row(vrp, gp, C, b2t, eps1, h->grad_scale, r);
    double s = 0;
    for (int64_t r = 0; r < R; r++) s += vrp[r];
    vr_mean = (float)(s / (double)R);
  }
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t k = 0; k < C; k++) vl_k_adafactor_col(vcp, gp, R, C, b2t, eps1, h->grad_scale, k);
  double ss = 0;
  float gs = h->grad_scale;
  FIXED_SUM(ss, n, nt, sq(vl_k_adafactor_u(gp, vrp, vcp, vr_mean, R, C, gs, i)));
  float rms = (float)sqrt(ss / (double)n);
  float div = rms / h->clip_thr > 1.0f ? rms / h->clip_thr : 1.0f;
  float *mp = m ? m->data : NULL;
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; i++)
    vl_k_adafactor_apply(pp, mp, gp, vrp, vcp, vr_mean, R, C, h->grad_scale, div, h->lr, h->beta1,
                         h->weight_decay, i);
  return VL_OK;
}

/* This file's kernels: the LLM ops, copies and the optimizers. */
static void core_ops(vl_backend *b) {
  b->ops[VL_OP_ZERO] = cpu_zero;
  b->ops[VL_OP_CONVERT] = cpu_convert;
  b->ops[VL_OP_AXPBY] = cpu_axpby;
  b->ops[VL_OP_EMBED_FWD] = cpu_embed_fwd;
  b->ops[VL_OP_EMBED_BWD] = cpu_embed_bwd;
  b->ops[VL_OP_RMSNORM_FWD] = cpu_rmsnorm_fwd;
  b->ops[VL_OP_RMSNORM_BWD] = cpu_rmsnorm_bwd;
  b->ops[VL_OP_ROPE] = cpu_rope;
  b->ops[VL_OP_PERMUTE] = cpu_permute;
  b->ops[VL_OP_SOFTMAX_FWD] = cpu_softmax_fwd;
  b->ops[VL_OP_SOFTMAX_BWD] = cpu_softmax_bwd;
  b->ops[VL_OP_SWIGLU_FWD] = cpu_swiglu_fwd;
  b->ops[VL_OP_SWIGLU_BWD] = cpu_swiglu_bwd;
  b->ops[VL_OP_XENT_FUSED] = cpu_xent;
  b->ops[VL_OP_SUMSQ] = cpu_sumsq;
  b->ops[VL_OP_ADAMW] = cpu_adamw;
  b->ops[VL_OP_SGD] = cpu_sgd;
  b->ops[VL_OP_ADAFACTOR] = cpu_adafactor;
}

/* The table: filled once, on first use, by this file and each kernel file (cpu_internal.h),
 * the way the CUDA backend fills its own. */
static vl_backend g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void make_backend(void) {
  g_cpu = (vl_backend){
      .name = "cpu", .device = VL_DEV_CPU,
      .init = cpu_init, .fini = cpu_fini, .sync = cpu_sync,
      .timer_start = cpu_timer_start, .timer_stop = cpu_timer_stop,
      .fixed_ws_bytes = cpu_fixed_ws, .upload = cpu_upload, .download = cpu_download,
      .host_alloc = cpu_host_alloc, .host_free = cpu_host_free, .upload_async = cpu_upload,
  };
  core_ops(&g_cpu);
  vl_cpu_gemm_ops(&g_cpu);
  vl_cpu_conv_ops(&g_cpu);
  vl_cpu_cnn_ops(&g_cpu);
  vl_cpu_sd_ops(&g_cpu);
  vl_cpu_attn_ops(&g_cpu);
}

const vl_backend *vl_backend_cpu(void) {
  pthread_once(&g_cpu_once, make_backend);
  return &g_cpu;
}
