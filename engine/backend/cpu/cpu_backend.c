/* CPU backend: OpenBLAS sgemm for GEMM, OpenMP loops over the single-source kernels. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/backend.h"
#include "cpu_internal.h"
#include "../cnn_args.h"
#include "../../kernels/elem.h"
#include "../../kernels/nf4.h"
#include "../../kernels/optim.h"
#include "../../kernels/rows.h"

#define PAR_MIN 8192 /* below this many elements a parallel region costs more than it saves */

static int dt(const vl_tensor *t) { return (int)t->dtype; }

static vl_status cpu_init(vl_ctx *c) { (void)c; return VL_OK; }
static void cpu_fini(vl_ctx *c) { (void)c; }
static vl_status cpu_sync(vl_ctx *c) { (void)c; return VL_OK; }
static vl_status cpu_timer_start(vl_ctx *c) { c->timer_t0 = vl_now(); return VL_OK; }
static vl_status cpu_timer_stop(vl_ctx *c, double *sec) { *sec = vl_now() - c->timer_t0; return VL_OK; }
static size_t cpu_fixed_ws(const vl_ctx *c) { (void)c; return 0; }

/* Copy the (rows, cols) region at p (leading dim ld, dtype d) into packed fp32. */
static void to_f32(float *dst, const void *p, int d, int64_t off, int64_t rows, int64_t cols,
                   int64_t ld) {
#pragma omp parallel for if (rows * cols > PAR_MIN)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < cols; k++) dst[r * cols + k] = vl_ld(p, d, off + r * ld + k);
}

static vl_status cpu_gemm(vl_ctx *c, const void *args) {
  const vl_gemm *g = args;
  if (g->ws_bytes < vl_gemm_ws_cpu(g))
    return vl_fail(c, VL_ERR_INVALID, "gemm workspace %zu < %zu", g->ws_bytes, vl_gemm_ws_cpu(g));
  float *ws = g->ws;
  int64_t arows = g->ta ? g->K : g->M, acols = g->ta ? g->M : g->K;
  int64_t brows = g->tb ? g->N : g->K, bcols = g->tb ? g->K : g->N;
  float *wa = NULL, *wb = NULL, *wc = NULL;
  if (g->A->dtype != VL_F32) { wa = ws; ws += arows * acols; }
  if (g->B->dtype == VL_NF4) {
    if (g->b_off != 0 || g->ldb != bcols || (size_t)(brows * bcols) != (size_t)g->B->n)
      return vl_fail(c, VL_ERR_UNSUPPORTED, "nf4 gemm operand must be a whole contiguous matrix");
    wb = ws; ws += g->B->n;
    const uint8_t *q = g->B->data;
    int64_t n = g->B->n;
#pragma omp parallel for if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) wb[i] = vl_nf4_get(q, n, i);
  } else if (g->B->dtype != VL_F32) {
    wb = ws; ws += brows * bcols;
  }
  if (g->C->dtype != VL_F32) wc = ws;
  for (int64_t b = 0; b < g->batch; b++) {
    const float *pa, *pb;
    int64_t lda = g->lda, ldb = g->ldb, ldc = g->ldc;
    if (wa) { to_f32(wa, g->A->data, dt(g->A), g->a_off + b * g->sa, arows, acols, g->lda); pa = wa; lda = acols; }
    else pa = (const float *)g->A->data + g->a_off + b * g->sa;
    if (g->B->dtype == VL_NF4) { pb = wb; ldb = bcols; }
    else if (wb) { to_f32(wb, g->B->data, dt(g->B), g->b_off + b * g->sb, brows, bcols, g->ldb); pb = wb; ldb = bcols; }
    else pb = (const float *)g->B->data + g->b_off + b * g->sb;
    float *pc;
    int64_t coff = g->c_off + b * g->sc;
    if (wc) {
      if (g->beta != 0.0f) to_f32(wc, g->C->data, dt(g->C), coff, g->M, g->N, g->ldc);
      pc = wc; ldc = g->N;
    } else {
      pc = (float *)g->C->data + coff;
    }
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                (blasint)g->M, (blasint)g->N, (blasint)g->K, g->alpha, pa, (blasint)lda, pb,
                (blasint)ldb, g->beta, pc, (blasint)ldc);
    if (wc) {
      int64_t M = g->M, N = g->N;
#pragma omp parallel for if (M * N > PAR_MIN)
      for (int64_t r = 0; r < M; r++)
        for (int64_t k = 0; k < N; k++) vl_st(g->C->data, dt(g->C), coff + r * g->ldc + k, wc[r * N + k]);
    }
  }
  return VL_OK;
}

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
  (void)c;
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++) vl_k_convert(y->data, dt(y), x->data, dt(x), i);
  return VL_OK;
}
static vl_status cpu_axpby(vl_ctx *c, const void *p) {
  const vl_axpby_args *a = p;
  vl_tensor *y = a->y;
  const vl_tensor *x = a->x;
  int64_t n = a->n;
  float fa = a->a, fb = a->b;
  (void)c;
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++) vl_k_axpby(y->data, dt(y), fa, x->data, dt(x), fb, i);
  return VL_OK;
}
static vl_status cpu_embed_fwd(vl_ctx *c, const void *p) {
  const vl_embed_fwd_args *a = p;
  int64_t R = a->R, C = a->C;
  VL_TRY(vl_check_ids(c, "embed_fwd", "token ids", a->tok, R));
  vl_tensor *out = a->out;
  const vl_tensor *wte = a->wte;
  const int32_t *tok = a->tok ? a->tok->data : NULL;
#pragma omp parallel for if (R * C > PAR_MIN)
  for (int64_t i = 0; i < R * C; i++) vl_k_embed_fwd(out->data, dt(out), wte->data, dt(wte), tok, C, i);
  return VL_OK;
}
static vl_status cpu_embed_bwd(vl_ctx *c, const void *p) {
  const vl_embed_bwd_args *a = p;
  int64_t R = a->R, C = a->C;
  VL_TRY(vl_check_ids(c, "embed_bwd", "token ids", a->tok, R));
  vl_tensor *dw = a->dwte;
  const vl_tensor *dout = a->dout;
  const int32_t *tok = a->tok ? a->tok->data : NULL;
#pragma omp parallel for if (R * C > PAR_MIN)
  for (int64_t k = 0; k < C; k++) vl_k_embed_bwd_col(dw->data, dt(dw), dout->data, dt(dout), tok, R, C, k);
  return VL_OK;
}
static vl_status cpu_rmsnorm_fwd(vl_ctx *c, const void *p) {
  const vl_rmsnorm_fwd_args *a = p;
  vl_tensor *out = a->out, *rstd = a->rstd;
  const vl_tensor *x = a->x, *w = a->w;
  int64_t R = a->R, C = a->C;
  float eps = a->eps;
  (void)c;
#pragma omp parallel for if (R * C > PAR_MIN)
  for (int64_t r = 0; r < R; r++)
    vl_k_rmsnorm_fwd_row(out->data, dt(out), rstd->data, x->data, dt(x), w->data, dt(w), C, eps, r);
  return VL_OK;
}
static vl_status cpu_rmsnorm_bwd(vl_ctx *c, const void *p) {
  const vl_rmsnorm_bwd_args *a = p;
  vl_tensor *dx = a->dx, *dw = a->dw;
  const vl_tensor *dout = a->dout, *x = a->x, *w = a->w, *rstd = a->rstd;
  int64_t R = a->R, C = a->C;
  (void)c;
#pragma omp parallel for if (R * C > PAR_MIN)
  for (int64_t r = 0; r < R; r++)
    vl_k_rmsnorm_bwd_row(dx->data, dt(dx), dout->data, dt(dout), x->data, dt(x), w->data, dt(w),
                         rstd->data, C, r);
  if (dw) {
#pragma omp parallel for if (R * C > PAR_MIN)
    for (int64_t k = 0; k < C; k++)
      vl_k_rmsnorm_dw_col(dw->data, dt(dw), dout->data, dt(dout), x->data, dt(x), rstd->data, R, C, k);
  }
  return VL_OK;
}
static vl_status cpu_rope(vl_ctx *c, const void *p) {
  const vl_rope_args *a = p;
  vl_tensor *x = a->x;
  int64_t T = a->T, H = a->H, D = a->D, n = a->B * T * H * (D / 2);
  float theta = a->theta;
  int inverse = a->inverse;
  (void)c;
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++) vl_k_rope(x->data, dt(x), T, H, D, theta, inverse, i);
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
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t r = 0; r < rows; r++)
    memcpy((char *)y->data + r * rb, (const char *)x->data + vl_k_permute_src_row(T, H, back, r) * rb, rb);
  return VL_OK;
}
static vl_status cpu_softmax_fwd(vl_ctx *c, const void *p) {
  const vl_softmax_fwd_args *a = p;
  vl_tensor *P = a->P;
  const vl_tensor *S = a->S;
  int64_t rows = a->rows, T = a->T;
  float scale = a->scale;
  (void)c;
#pragma omp parallel for if (rows * T > PAR_MIN)
  for (int64_t r = 0; r < rows; r++) vl_k_softmax_row(P->data, dt(P), S->data, dt(S), T, scale, a->causal, r);
  return VL_OK;
}
static vl_status cpu_softmax_bwd(vl_ctx *c, const void *p) {
  const vl_softmax_bwd_args *a = p;
  vl_tensor *dS = a->dS;
  const vl_tensor *dP = a->dP, *P = a->P;
  int64_t rows = a->rows, T = a->T;
  float scale = a->scale;
  (void)c;
#pragma omp parallel for if (rows * T > PAR_MIN)
  for (int64_t r = 0; r < rows; r++)
    vl_k_softmax_bwd_row(dS->data, dt(dS), dP->data, dt(dP), P->data, dt(P), T, scale, a->causal, r);
  return VL_OK;
}
static vl_status cpu_swiglu_fwd(vl_ctx *c, const void *p) {
  const vl_swiglu_fwd_args *a = p;
  vl_tensor *out = a->out;
  const vl_tensor *g = a->g, *u = a->u;
  int64_t n = a->n;
  (void)c;
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++) vl_k_swiglu_fwd(out->data, dt(out), g->data, u->data, dt(g), i);
  return VL_OK;
}
static vl_status cpu_swiglu_bwd(vl_ctx *c, const void *p) {
  const vl_swiglu_bwd_args *a = p;
  vl_tensor *dg = a->dg, *du = a->du;
  const vl_tensor *dout = a->dout, *g = a->g, *u = a->u;
  int64_t n = a->n;
  (void)c;
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    vl_k_swiglu_bwd(dg->data, du->data, dt(dg), dout->data, dt(dout), g->data, u->data, dt(g), i);
  return VL_OK;
}
static vl_status cpu_xent(vl_ctx *c, const void *p) {
  const vl_xent_fused_args *a = p;
  int64_t R = a->R, V = a->V;
  float s = a->dloss_scale;
  VL_TRY(vl_check_ids(c, "xent_fused", "targets", a->tgt, R));
  vl_tensor *logits = a->logits, *loss = a->loss;
  const int32_t *tgt = a->tgt ? a->tgt->data : NULL;
#pragma omp parallel for if (R * V > PAR_MIN)
  for (int64_t r = 0; r < R; r++) vl_k_xent_row(logits->data, dt(logits), loss->data, tgt, V, s, r);
  return VL_OK;
}
static vl_status cpu_sumsq(vl_ctx *c, const void *p) {
  const vl_sumsq_args *a = p;
  const vl_tensor *x = a->x;
  int64_t n = a->n;
  (void)c;
  /* A NaN or Inf element makes the double sum non-finite (a finite float squared cannot
   * overflow a double), so one check at the end finds it. */
  double acc = 0;
  if (x->dtype == VL_F32) {
    const float *p = x->data;
#pragma omp parallel for simd reduction(+ : acc) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) acc += (double)p[i] * p[i];
  } else {
#pragma omp parallel for reduction(+ : acc) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) { double v = vl_ld(x->data, dt(x), i); acc += v * v; }
  }
  *a->nonfinite = !isfinite(acc);
  *a->out = *a->nonfinite ? 0 : acc;
  return VL_OK;
}
static vl_status cpu_adamw(vl_ctx *c, const void *args) {
  const vl_adamw_args *a = args;
  vl_tensor *p = a->p, *m = a->m, *v = a->v;
  const vl_tensor *g = a->g;
  const vl_optim_hp *h = a->hp;
  int64_t n = a->n;
  (void)c;
  float bc1 = 1.0f - powf(h->beta1, (float)h->t), bc2 = 1.0f - powf(h->beta2, (float)h->t);
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    vl_k_adamw(p->data, g->data, m->data, v->data, h->lr, h->beta1, h->beta2, h->eps,
               h->weight_decay, bc1, bc2, h->grad_scale, i);
  return VL_OK;
}
static vl_status cpu_sgd(vl_ctx *c, const void *args) {
  const vl_sgd_args *a = args;
  vl_tensor *p = a->p, *mom = a->mom;
  const vl_tensor *g = a->g;
  const vl_optim_hp *h = a->hp;
  int64_t n = a->n;
  (void)c;
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    vl_k_sgd(p->data, g->data, mom->data, h->lr, h->momentum, h->weight_decay, h->grad_scale, i);
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
  float vr_mean = 0.0f;
  if (R > 1) {
#pragma omp parallel for if (n > PAR_MIN)
    for (int64_t r = 0; r < R; r++) vl_k_adafactor_row(vrp, gp, C, b2t, eps1, h->grad_scale, r);
    double s = 0;
    for (int64_t r = 0; r < R; r++) s += vrp[r];
    vr_mean = (float)(s / (double)R);
  }
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t k = 0; k < C; k++) vl_k_adafactor_col(vcp, gp, R, C, b2t, eps1, h->grad_scale, k);
  double ss = 0;
#pragma omp parallel for reduction(+ : ss) if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    float u = vl_k_adafactor_u(gp, vrp, vcp, vr_mean, R, C, h->grad_scale, i);
    ss += (double)u * u;
  }
  float rms = (float)sqrt(ss / (double)n);
  float div = rms / h->clip_thr > 1.0f ? rms / h->clip_thr : 1.0f;
  float *mp = m ? m->data : NULL;
#pragma omp parallel for if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    vl_k_adafactor_apply(pp, mp, gp, vrp, vcp, vr_mean, R, C, h->grad_scale, div, h->lr, h->beta1,
                         h->weight_decay, i);
  return VL_OK;
}

const vl_backend vl_backend_cpu = {
    .name = "cpu", .device = VL_DEV_CPU,
    .init = cpu_init, .fini = cpu_fini, .sync = cpu_sync,
    .timer_start = cpu_timer_start, .timer_stop = cpu_timer_stop,
    .fixed_ws_bytes = cpu_fixed_ws, .upload = cpu_upload, .download = cpu_download,
    .host_alloc = cpu_host_alloc, .host_free = cpu_host_free, .upload_async = cpu_upload,
    .ops = {
        [VL_OP_GEMM] = cpu_gemm,
        [VL_OP_CONV_FWD] = vl_cpu_conv_fwd,
        [VL_OP_CONV_BWD_DATA] = vl_cpu_conv_bwd_data,
        [VL_OP_CONV_BWD_WEIGHT] = vl_cpu_conv_bwd_weight,
        [VL_OP_ZERO] = cpu_zero,
        [VL_OP_CONVERT] = cpu_convert,
        [VL_OP_AXPBY] = cpu_axpby,
        [VL_OP_EMBED_FWD] = cpu_embed_fwd,
        [VL_OP_EMBED_BWD] = cpu_embed_bwd,
        [VL_OP_RMSNORM_FWD] = cpu_rmsnorm_fwd,
        [VL_OP_RMSNORM_BWD] = cpu_rmsnorm_bwd,
        [VL_OP_ROPE] = cpu_rope,
        [VL_OP_PERMUTE] = cpu_permute,
        [VL_OP_SOFTMAX_FWD] = cpu_softmax_fwd,
        [VL_OP_SOFTMAX_BWD] = cpu_softmax_bwd,
        [VL_OP_SWIGLU_FWD] = cpu_swiglu_fwd,
        [VL_OP_SWIGLU_BWD] = cpu_swiglu_bwd,
        [VL_OP_XENT_FUSED] = cpu_xent,
        [VL_OP_SUMSQ] = cpu_sumsq,
        [VL_OP_ADAMW] = cpu_adamw,
        [VL_OP_SGD] = cpu_sgd,
        [VL_OP_ADAFACTOR] = cpu_adafactor,
        [VL_OP_BN_FWD_TRAIN] = vl_cpu_bn_fwd_train,
        [VL_OP_BN_FWD_EVAL] = vl_cpu_bn_fwd_eval,
        [VL_OP_BN_BWD] = vl_cpu_bn_bwd,
        [VL_OP_RELU_FWD] = vl_cpu_relu_fwd,
        [VL_OP_RELU_BWD] = vl_cpu_relu_bwd,
        [VL_OP_MAXPOOL_FWD] = vl_cpu_maxpool_fwd,
        [VL_OP_MAXPOOL_BWD] = vl_cpu_maxpool_bwd,
        [VL_OP_UPSAMPLE2X_FWD] = vl_cpu_upsample2x_fwd,
        [VL_OP_UPSAMPLE2X_BWD] = vl_cpu_upsample2x_bwd,
        [VL_OP_CHAN_COPY] = vl_cpu_chan_copy,
        [VL_OP_XENT_PIX] = vl_cpu_xent_pix,
        [VL_OP_GROUPNORM_FWD] = vl_cpu_groupnorm_fwd,
        [VL_OP_GROUPNORM_BWD] = vl_cpu_groupnorm_bwd,
        [VL_OP_LAYERNORM_FWD] = vl_cpu_layernorm_fwd,
        [VL_OP_LAYERNORM_BWD] = vl_cpu_layernorm_bwd,
        [VL_OP_ACT_FWD] = vl_cpu_act_fwd,
        [VL_OP_ACT_BWD] = vl_cpu_act_bwd,
        [VL_OP_GEGLU_FWD] = vl_cpu_geglu_fwd,
        [VL_OP_GEGLU_BWD] = vl_cpu_geglu_bwd,
        [VL_OP_BIAS_FWD] = vl_cpu_bias_fwd,
        [VL_OP_BIAS_BWD] = vl_cpu_bias_bwd,
        [VL_OP_PAD2D_FWD] = vl_cpu_pad2d_fwd,
        [VL_OP_PAD2D_BWD] = vl_cpu_pad2d_bwd,
        [VL_OP_TIMESTEP_EMBED] = vl_cpu_timestep_embed,
        [VL_OP_MSE_FUSED] = vl_cpu_mse_fused,
        [VL_OP_GAUSS_SAMPLE] = vl_cpu_gauss_sample,
        [VL_OP_ATTN_FWD] = vl_cpu_attn_fwd,
        [VL_OP_ATTN_BWD] = vl_cpu_attn_bwd,
    },
};
