/* CPU backend, Stable Diffusion's ops: OpenMP loops over the single-source bodies of
 * engine/kernels/sd.h (GroupNorm, LayerNorm, activations, GEGLU, bias, zero padding,
 * timestep embedding, fused MSE, the VAE's Gaussian sample). Arguments are checked by the
 * operation's descriptor (engine/backend/ops.c) before a kernel runs, on every backend.
 *
 * As in cpu_cnn.c, hot loops call the body with the storage dtype as a constant when their
 * activation tensors share one (fp32, fp16 or bf16: the dtype switches of vl_ld/vl_st fold
 * away and the runs vectorise; DISPATCH below), else with the runtime dtypes. Parameters
 * (gamma, beta, a bias) read once per channel keep their runtime dtype; read per element
 * (LayerNorm, a linear layer's bias) they are constants too when fp32 (an AMP master copy)
 * or in the activations' dtype (frozen).
 *
 * Determinism: loops are parallel over segments (a GroupNorm group, a LayerNorm row),
 * channels, column blocks, rows or elements, and every sum is taken by one thread in a fixed
 * order, so results do not depend on the thread count. Norm backwards take two passes: dx
 * per segment, then dgamma/dbeta per channel (GroupNorm) or per block of 16 columns
 * (LayerNorm) over every segment, so no two threads add into one parameter gradient. */
#include "cpu_internal.h"
#include "../../kernels/sd.h"

#define F32 VL_K_F32
#define INLINE static inline __attribute__((always_inline))
#define COLS 16      /* columns per LayerNorm / bias column block: one cache line of fp32 */

/* The dtype a, b and c (c may be NULL) share, or -1. */
static int same_dt(const vl_tensor *a, const vl_tensor *b, const vl_tensor *c) {
  return a->dtype == b->dtype && (!c || c->dtype == a->dtype) ? dt(a) : -1;
}

/* LOOP(A, B, C) with the dtypes of three tensors (the third may be NULL: C is then A):
 * compile-time constants when they share fp32, fp16 or bf16, else their runtime values. Each
 * op names its loop after itself (GN_FWD_LOOP, DB_COLS_LOOP, ...) and parallelises it with
 * PAR_FOR, over a count named n. */
#define PAR_FOR _Pragma("omp parallel for num_threads(vl_cpu_threads((double)n * NS_ROW))")
#define DISPATCH(ta, tb, tc, LOOP)                                                         \
  do {                                                                                     \
    switch (same_dt((ta), (tb), (tc))) {                                                   \
    case VL_K_F32: LOOP(VL_K_F32, VL_K_F32, VL_K_F32); break;                              \
    case VL_K_F16: LOOP(VL_K_F16, VL_K_F16, VL_K_F16); break;                              \
    case VL_K_BF16: LOOP(VL_K_BF16, VL_K_BF16, VL_K_BF16); break;                          \
    default: LOOP(dt(ta), dt(tb), ((tc) ? dt(tc) : dt(ta))); break;                        \
    }                                                                                      \
  } while (0)

/* ---- GroupNorm ------------------------------------------------------------------------ */

typedef struct {
  int64_t C, HW, G, cpg; /* cpg = C/G channels per group */
  const void *gamma, *beta;
  int gdt, bdt;
} gn_shape;

/* Group s = n*G + g: shifted sums channel by channel, statistics, normalisation. */
INLINE void gn_fwd_group(void *y, int ydt, const void *x, int xdt, float *mean, float *rstd,
                         const gn_shape *sh, float eps, int64_t s) {
  int64_t n = s / sh->G, g = s - n * sh->G, c0 = g * sh->cpg, base = (n * sh->C + c0) * sh->HW;
  float K = vl_ld(x, xdt, base);
  double s1 = 0.0, s2 = 0.0;
  for (int64_t k = 0; k < sh->cpg; k++)
    vl_k_bn_sums_run(x, xdt, base + k * sh->HW, sh->HW, K, &s1, &s2);
  vl_k_stat st = vl_k_seg_finish(mean, rstd, s, s1, s2, K, sh->cpg * sh->HW, eps);
  for (int64_t k = 0; k < sh->cpg; k++)
    vl_k_gn_apply_plane(y, ydt, x, xdt, st, sh->gamma, sh->gdt, sh->beta, sh->bdt, c0 + k,
                        base + k * sh->HW, sh->HW);
}

static vl_status cpu_groupnorm_fwd(vl_ctx *c, const vl_groupnorm_fwd_args *a) {
  int64_t n = a->N * a->C * a->HW;
  if (n == 0) return VL_OK;
  gn_shape sh = {a->C, a->HW, a->G, a->C / a->G, a->gamma->data, a->beta->data, dt(a->gamma),
                 dt(a->beta)};
  float *pm = a->mean->data, *pr = a->rstd->data;
  void *py = a->y->data;
  const void *px = a->x->data;
  int64_t S = a->N * a->G;
#define GN_FWD_LOOP(YD, XD, _)                                                             \
  PAR_FOR for (int64_t s = 0; s < S; s++) gn_fwd_group(py, YD, px, XD, pm, pr, &sh, a->eps, s)
  DISPATCH(a->y, a->x, NULL, GN_FWD_LOOP);
#undef GN_FWD_LOOP
  return VL_OK;
}

/* dx of group s: the two sums channel by channel, then dx plane by plane. */
INLINE void gn_bwd_group(void *dx, int dxdt, const void *dy, int dydt, const void *x, int xdt,
                         const float *mean, const float *rstd, const gn_shape *sh, int acc,
                         int64_t s) {
  int64_t n = s / sh->G, g = s - n * sh->G, c0 = g * sh->cpg, base = (n * sh->C + c0) * sh->HW;
  double sg = 0.0, sgx = 0.0;
  for (int64_t k = 0; k < sh->cpg; k++)
    vl_k_norm_bwd_sums_run(dy, dydt, x, xdt, base + k * sh->HW, sh->HW, mean[s],
                           vl_ld(sh->gamma, sh->gdt, c0 + k), &sg, &sgx);
  vl_k_norm_grad kg = vl_k_norm_bwd_finish(mean[s], rstd[s], sg, sgx, sh->cpg * sh->HW);
  for (int64_t k = 0; k < sh->cpg; k++) {
    float gm = vl_ld(sh->gamma, sh->gdt, c0 + k);
    int64_t o = base + k * sh->HW;
    for (int64_t i = 0; i < sh->HW; i++)
      vl_k_norm_bwd_apply(dx, dxdt, dy, dydt, x, xdt, gm, kg, acc, o + i);
  }
}

/* dgamma/dbeta of channel c: N planes, each with its group's statistics. */
INLINE void gn_dgb_chan(void *dgamma, int dgdt, void *dbeta, int dbdt, const void *dy, int dydt,
                        const void *x, int xdt, const float *mean, const float *rstd, int64_t N,
                        const gn_shape *sh, int64_t c) {
  double sb = 0.0, sgm = 0.0;
  int64_t g = c / sh->cpg;
  for (int64_t n = 0; n < N; n++)
    vl_k_norm_dgb_run(dy, dydt, x, xdt, (n * sh->C + c) * sh->HW, sh->HW, mean[n * sh->G + g],
                      rstd[n * sh->G + g], &sb, &sgm);
  vl_k_norm_dgb_finish(dgamma, dgdt, dbeta, dbdt, c, sb, sgm);
}

static vl_status cpu_groupnorm_bwd(vl_ctx *c, const vl_groupnorm_bwd_args *a) {
  int64_t n = a->N * a->C * a->HW;
  if (n == 0) return VL_OK;
  gn_shape sh = {a->C, a->HW, a->G, a->C / a->G, a->gamma->data, NULL, dt(a->gamma), 0};
  const float *pm = a->mean->data, *pr = a->rstd->data;
  int64_t S = a->N * a->G;
  int acc = a->accumulate ? 1 : 0;
  void *pdx = a->dx->data;
  const void *pdy = a->dy->data, *px = a->x->data;
#define GN_DX_LOOP(DXD, DYD, XD)                                                           \
  PAR_FOR for (int64_t s = 0; s < S; s++)                                                  \
      gn_bwd_group(pdx, DXD, pdy, DYD, px, XD, pm, pr, &sh, acc, s)
  DISPATCH(a->dx, a->dy, a->x, GN_DX_LOOP);
#undef GN_DX_LOOP
  if (!a->dgamma && !a->dbeta) return VL_OK;
  void *dg = data_or_null(a->dgamma), *db = data_or_null(a->dbeta);
  int dgdt = dt_or_f32(a->dgamma), dbdt = dt_or_f32(a->dbeta);
#define GN_DGB_LOOP(DYD, XD, _)                                                            \
  PAR_FOR for (int64_t k = 0; k < a->C; k++)                                               \
      gn_dgb_chan(dg, dgdt, db, dbdt, pdy, DYD, px, XD, pm, pr, a->N, &sh, k)
  DISPATCH(a->dy, a->x, NULL, GN_DGB_LOOP);
#undef GN_DGB_LOOP
  return VL_OK;
}

/* ---- LayerNorm ---------------------------------------------------------------------------- */

static vl_status cpu_layernorm_fwd(vl_ctx *c, const vl_layernorm_fwd_args *a) {
  int64_t n = a->R * a->C;
  if (n == 0) return VL_OK;
  float *pm = a->mean->data, *pr = a->rstd->data;
  void *py = a->y->data;
  const void *px = a->x->data, *g = a->gamma->data, *b = a->beta->data;
  int gdt = dt(a->gamma), bdt = dt(a->beta), pdt = gdt == bdt ? gdt : -1;
#define ROWS(YD, XD, GD, BD)                                                               \
  PAR_FOR for (int64_t r = 0; r < a->R; r++)                                               \
      vl_k_ln_fwd_row(py, YD, pm, pr, px, XD, g, GD, b, BD, a->C, a->eps, r)
#define LN_FWD_LOOP(YD, XD, _)                                                             \
  if (pdt == VL_K_F32) ROWS(YD, XD, VL_K_F32, VL_K_F32);                                   \
  else if (pdt == XD) ROWS(YD, XD, XD, XD);                                                \
  else ROWS(YD, XD, gdt, bdt)
  DISPATCH(a->y, a->x, NULL, LN_FWD_LOOP);
#undef LN_FWD_LOOP
#undef ROWS
  return VL_OK;
}

/* dgamma/dbeta of columns [c0, c0 + nc) over every row (each thread one column block). */
INLINE void ln_dgb_block(void *dgamma, int dgdt, void *dbeta, int dbdt, const void *dy, int dydt,
                         const void *x, int xdt, const float *mean, const float *rstd, int64_t R,
                         int64_t C, int64_t c0) {
  double sb[COLS] = {0}, sgm[COLS] = {0};
  int nc = (int)(C - c0 < COLS ? C - c0 : COLS);
  vl_k_ln_dgb_cols(dy, dydt, x, xdt, mean, rstd, R, C, c0, nc, 0, 1, sb, sgm);
  for (int k = 0; k < nc; k++)
    vl_k_norm_dgb_finish(dgamma, dgdt, dbeta, dbdt, c0 + k, sb[k], sgm[k]);
}

static vl_status cpu_layernorm_bwd(vl_ctx *c, const vl_layernorm_bwd_args *a) {
  int64_t n = a->R * a->C;
  if (n == 0) return VL_OK;
  const float *pm = a->mean->data, *pr = a->rstd->data;
  const void *g = a->gamma->data;
  int gdt = dt(a->gamma), acc = a->accumulate ? 1 : 0;
  void *pdx = a->dx->data;
  const void *pdy = a->dy->data, *px = a->x->data;
#define ROWS(DXD, DYD, XD, GD)                                                             \
  PAR_FOR for (int64_t r = 0; r < a->R; r++)                                               \
      vl_k_ln_bwd_row(pdx, DXD, pdy, DYD, px, XD, g, GD, pm, pr, a->C, acc, r)
#define LN_DX_LOOP(DXD, DYD, XD)                                                           \
  if (gdt == VL_K_F32) ROWS(DXD, DYD, XD, VL_K_F32);                                       \
  else if (gdt == XD) ROWS(DXD, DYD, XD, XD);                                              \
  else ROWS(DXD, DYD, XD, gdt)
  DISPATCH(a->dx, a->dy, a->x, LN_DX_LOOP);
#undef LN_DX_LOOP
#undef ROWS
  if (!a->dgamma && !a->dbeta) return VL_OK;
  void *dg = data_or_null(a->dgamma), *db = data_or_null(a->dbeta);
  int dgdt = dt_or_f32(a->dgamma), dbdt = dt_or_f32(a->dbeta);
  int64_t nblk = (a->C + COLS - 1) / COLS;
#define LN_DGB_LOOP(DYD, XD, _)                                                            \
  PAR_FOR for (int64_t q = 0; q < nblk; q++)                                               \
      ln_dgb_block(dg, dgdt, db, dbdt, pdy, DYD, px, XD, pm, pr, a->R, a->C, q * COLS)
  DISPATCH(a->dy, a->x, NULL, LN_DGB_LOOP);
#undef LN_DGB_LOOP
  return VL_OK;
}

/* ---- activations, GEGLU ----------------------------------------------------------------- */

static vl_status cpu_act_fwd(vl_ctx *c, const vl_act_fwd_args *a) {
  int64_t n = a->n;
  int act = (int)a->act;
  void *py = n ? a->y->data : NULL;
  const void *px = n ? a->x->data : NULL;
#define ACT_FWD_LOOP(YD, XD, _)                                                            \
  PAR_FOR for (int64_t i = 0; i < n; i++) vl_k_act_fwd(py, YD, px, XD, act, i)
  DISPATCH(a->y, a->x, NULL, ACT_FWD_LOOP);
#undef ACT_FWD_LOOP
  return VL_OK;
}

static vl_status cpu_act_bwd(vl_ctx *c, const vl_act_bwd_args *a) {
  int64_t n = a->n;
  int act = (int)a->act;
  void *pdx = n ? a->dx->data : NULL;
  const void *pdy = n ? a->dy->data : NULL, *px = n ? a->x->data : NULL;
#define ACT_BWD_LOOP(DXD, DYD, XD)                                                         \
  PAR_FOR for (int64_t i = 0; i < n; i++) vl_k_act_bwd(pdx, DXD, pdy, DYD, px, XD, act, i)
  DISPATCH(a->dx, a->dy, a->x, ACT_BWD_LOOP);
#undef ACT_BWD_LOOP
  return VL_OK;
}

INLINE void geglu_fwd_row(void *out, int odt, const void *h, int hdt, int64_t F, int64_t r) {
  for (int64_t f = 0; f < F; f++) vl_k_geglu_fwd_at(out, odt, h, hdt, F, r, f);
}
INLINE void geglu_bwd_row(void *dh, int dhdt, const void *dout, int ddt, const void *h, int hdt,
                          int64_t F, int64_t r) {
  for (int64_t f = 0; f < F; f++) vl_k_geglu_bwd_at(dh, dhdt, dout, ddt, h, hdt, F, r, f);
}

static vl_status cpu_geglu_fwd(vl_ctx *c, const vl_geglu_fwd_args *a) {
  int64_t n = a->R * a->F;
  if (n == 0) return VL_OK;
  void *po = a->out->data;
  const void *ph = a->h->data;
#define GEGLU_FWD_LOOP(OD, HD, _)                                                          \
  PAR_FOR for (int64_t r = 0; r < a->R; r++) geglu_fwd_row(po, OD, ph, HD, a->F, r)
  DISPATCH(a->out, a->h, NULL, GEGLU_FWD_LOOP);
#undef GEGLU_FWD_LOOP
  return VL_OK;
}

static vl_status cpu_geglu_bwd(vl_ctx *c, const vl_geglu_bwd_args *a) {
  int64_t n = a->R * a->F;
  if (n == 0) return VL_OK;
  void *pdh = a->dh->data;
  const void *pd = a->dout->data, *ph = a->h->data;
#define GEGLU_BWD_LOOP(DHD, DD, HD)                                                        \
  PAR_FOR for (int64_t r = 0; r < a->R; r++) geglu_bwd_row(pdh, DHD, pd, DD, ph, HD, a->F, r)
  DISPATCH(a->dh, a->dout, a->h, GEGLU_BWD_LOOP);
#undef GEGLU_BWD_LOOP
  return VL_OK;
}

/* ---- bias ------------------------------------------------------------------------------- */

/* Planes of `inner` elements (convolutions: the bias read once per plane), or rows of C
 * when inner is 1 (linear layers: the bias read per element, a constant dtype when it
 * shares y's), so the inner loop is the long contiguous one. */
static vl_status cpu_bias_fwd(vl_ctx *c, const vl_bias_fwd_args *a) {
  int64_t n = a->outer * a->C * a->inner;
  if (n == 0) return VL_OK;
  void *py = a->y->data;
  const void *pb = a->b->data;
  int bdt = dt(a->b), po = a->per_outer ? 1 : 0;
  int64_t C = a->C, inner = a->inner;
  if (inner == 1) {
#define ROWS(YD, BD)                                                                       \
  PAR_FOR for (int64_t o = 0; o < a->outer; o++) vl_k_bias_fwd_row(py, YD, pb, BD, C, po, o)
#define BIAS_ROWS_LOOP(YD, _a, _b)                                                         \
  if (bdt == VL_K_F32) ROWS(YD, VL_K_F32);                                                 \
  else if (bdt == YD) ROWS(YD, YD);                                                        \
  else ROWS(YD, bdt)
    DISPATCH(a->y, a->y, NULL, BIAS_ROWS_LOOP);
#undef BIAS_ROWS_LOOP
#undef ROWS
  } else {
#define BIAS_PLANES_LOOP(YD, _a, _b)                                                       \
  PAR_FOR for (int64_t p = 0; p < a->outer * C; p++)                                       \
      vl_k_bias_fwd_plane(py, YD, pb, bdt, C, inner, po, p)
    DISPATCH(a->y, a->y, NULL, BIAS_PLANES_LOOP);
#undef BIAS_PLANES_LOOP
  }
  return VL_OK;
}

/* Column block [c0, c0 + COLS) of (outer, C) (inner 1) summed over every row. */
INLINE void bias_bwd_cols(void *db, int dbdt, const void *dy, int dydt, int64_t R, int64_t C,
                          int acc, int64_t c0) {
  double s[COLS] = {0};
  int nc = (int)(C - c0 < COLS ? C - c0 : COLS);
  vl_k_colsum(dy, dydt, R, C, c0, nc, 0, 1, s);
  for (int k = 0; k < nc; k++) vl_k_bias_bwd_store(db, dbdt, c0 + k, s[k], acc);
}

/* Channel c of (outer, C, inner): outer contiguous planes. */
INLINE void bias_bwd_chan(void *db, int dbdt, const void *dy, int dydt, int64_t outer, int64_t C,
                          int64_t inner, int acc, int64_t c) {
  double s = 0.0;
  for (int64_t o = 0; o < outer; o++) s += vl_k_sum_run(dy, dydt, (o * C + c) * inner, inner);
  vl_k_bias_bwd_store(db, dbdt, c, s, acc);
}

static vl_status cpu_bias_bwd(vl_ctx *c, const vl_bias_bwd_args *a) {
  int64_t n = a->outer * a->C * a->inner, nb = (a->per_outer ? a->outer : 1) * a->C;
  if (nb == 0) return VL_OK;
  void *pdb = a->db->data;
  const void *pdy = n ? a->dy->data : NULL;
  int dbdt = dt(a->db), acc = a->accumulate ? 1 : 0;
  int64_t C = a->C, inner = a->inner, outer = a->outer;
  int64_t nblk = (C + COLS - 1) / COLS;
  if (a->per_outer) { /* db[o, c]: one plane each */
#define DB_PLANES_LOOP(DYD, _a, _b)                                                        \
  PAR_FOR for (int64_t p = 0; p < nb; p++)                                                 \
      vl_k_bias_bwd_store(pdb, dbdt, p, vl_k_sum_run(pdy, DYD, p * inner, inner), acc)
    DISPATCH(a->dy, a->dy, NULL, DB_PLANES_LOOP);
#undef DB_PLANES_LOOP
  } else if (inner == 1) {
#define DB_COLS_LOOP(DYD, _a, _b)                                                          \
  PAR_FOR for (int64_t q = 0; q < nblk; q++)                                               \
      bias_bwd_cols(pdb, dbdt, pdy, DYD, outer, C, acc, q * COLS)
    DISPATCH(a->dy, a->dy, NULL, DB_COLS_LOOP);
#undef DB_COLS_LOOP
  } else {
#define DB_CHANS_LOOP(DYD, _a, _b)                                                         \
  PAR_FOR for (int64_t k = 0; k < C; k++)                                                  \
      bias_bwd_chan(pdb, dbdt, pdy, DYD, outer, C, inner, acc, k)
    DISPATCH(a->dy, a->dy, NULL, DB_CHANS_LOOP);
#undef DB_CHANS_LOOP
  }
  return VL_OK;
}

/* ---- zero padding -------------------------------------------------------------------------- */

static vl_k_pad pad_geo(int64_t H, int64_t W, int top, int bottom, int left, int right) {
  vl_k_pad g = {H, W, H + top + bottom, W + left + right, top, left};
  return g;
}

static vl_status cpu_pad2d_fwd(vl_ctx *c, const vl_pad2d_fwd_args *a) {
  int64_t nin = a->planes * a->H * a->W;
  int64_t nout = a->planes * (a->H + a->top + a->bottom) * (a->W + a->left + a->right);
  if (nout == 0) return VL_OK;
  vl_k_pad g = pad_geo(a->H, a->W, a->top, a->bottom, a->left, a->right);
  void *py = a->y->data;
  const void *px = nin ? a->x->data : NULL;
  int ydt = dt(a->y), xdt = dt(a->x);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(nout) * NS_ROW))
  for (int64_t row = 0; row < a->planes * g.OH; row++) {
    int64_t pl = row / g.OH, oh = row - pl * g.OH;
    for (int64_t ow = 0; ow < g.OW; ow++) vl_k_pad_fwd_at(py, ydt, px, xdt, g, pl, oh, ow);
  }
  return VL_OK;
}

static vl_status cpu_pad2d_bwd(vl_ctx *c, const vl_pad2d_bwd_args *a) {
  int64_t nin = a->planes * a->H * a->W;
  if (nin == 0) return VL_OK;
  vl_k_pad g = pad_geo(a->H, a->W, a->top, a->bottom, a->left, a->right);
  void *pdx = a->dx->data;
  const void *pdy = a->dy->data;
  int dxdt = dt(a->dx), dydt = dt(a->dy);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(nin) * NS_ROW))
  for (int64_t row = 0; row < a->planes * a->H; row++) {
    int64_t pl = row / a->H, h = row - pl * a->H;
    for (int64_t w = 0; w < a->W; w++) vl_k_pad_bwd_at(pdx, dxdt, pdy, dydt, g, pl, h, w);
  }
  return VL_OK;
}

/* ---- timestep embedding, MSE, Gaussian sample ------------------------------------------- */

static vl_status cpu_timestep_embed(vl_ctx *c, const vl_timestep_embed_args *a) {
  int64_t n = a->B * a->dim;
  if (n == 0) return VL_OK;
  const int32_t *t = a->t->data; /* host memory on this backend */
  void *pe = a->emb->data;
  int edt = dt(a->emb), flip = a->flip_sin_to_cos ? 1 : 0;
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
  for (int64_t i = 0; i < n; i++)
    vl_k_timestep_embed(pe, edt, t, a->dim, flip, a->shift, a->max_period, i);
  return VL_OK;
}

static vl_status cpu_mse_fused(vl_ctx *c, const vl_mse_fused_args *a) {
  int64_t n = a->R * a->C;
  if (a->R == 0) return VL_OK;
  void *pp = n ? a->pred->data : NULL;
  const void *pt = n ? a->target->data : NULL;
  float *pl = a->loss->data;
  int pdt = dt(a->pred), tdt = dt(a->target);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
  for (int64_t r = 0; r < a->R; r++) vl_k_mse_row(pp, pdt, pl, pt, tdt, a->C, a->dloss_scale, r);
  return VL_OK;
}

static vl_status cpu_gauss_sample(vl_ctx *c, const vl_gauss_sample_args *a) {
  int64_t n = a->N * a->C * a->HW;
  if (n == 0) return VL_OK;
  void *pz = a->z->data;
  const void *pm = a->moments->data, *pn = a->noise->data;
  int zdt = dt(a->z), mdt = dt(a->moments), ndt = dt(a->noise);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
  for (int64_t i = 0; i < n; i++)
    vl_k_gauss_sample(pz, zdt, pm, mdt, pn, ndt, a->C, a->HW, a->scale, i);
  return VL_OK;
}

/* ---- the op table's entries: the argument structs of vramlab/ops.h ------------------------ */

#define ENTRY(name, type)                                                                  \
  static vl_status vl_cpu_##name(vl_ctx *c, const void *p) {                               \
    return cpu_##name(c, (const type *)p);                                                 \
  }
ENTRY(groupnorm_fwd, vl_groupnorm_fwd_args)
ENTRY(groupnorm_bwd, vl_groupnorm_bwd_args)
ENTRY(layernorm_fwd, vl_layernorm_fwd_args)
ENTRY(layernorm_bwd, vl_layernorm_bwd_args)
ENTRY(act_fwd, vl_act_fwd_args)
ENTRY(act_bwd, vl_act_bwd_args)
ENTRY(geglu_fwd, vl_geglu_fwd_args)
ENTRY(geglu_bwd, vl_geglu_bwd_args)
ENTRY(bias_fwd, vl_bias_fwd_args)
ENTRY(bias_bwd, vl_bias_bwd_args)
ENTRY(pad2d_fwd, vl_pad2d_fwd_args)
ENTRY(pad2d_bwd, vl_pad2d_bwd_args)
ENTRY(timestep_embed, vl_timestep_embed_args)
ENTRY(mse_fused, vl_mse_fused_args)
ENTRY(gauss_sample, vl_gauss_sample_args)
#undef ENTRY

void vl_cpu_sd_ops(vl_backend *b) {
  b->ops[VL_OP_GROUPNORM_FWD] = vl_cpu_groupnorm_fwd;
  b->ops[VL_OP_GROUPNORM_BWD] = vl_cpu_groupnorm_bwd;
  b->ops[VL_OP_LAYERNORM_FWD] = vl_cpu_layernorm_fwd;
  b->ops[VL_OP_LAYERNORM_BWD] = vl_cpu_layernorm_bwd;
  b->ops[VL_OP_ACT_FWD] = vl_cpu_act_fwd;
  b->ops[VL_OP_ACT_BWD] = vl_cpu_act_bwd;
  b->ops[VL_OP_GEGLU_FWD] = vl_cpu_geglu_fwd;
  b->ops[VL_OP_GEGLU_BWD] = vl_cpu_geglu_bwd;
  b->ops[VL_OP_BIAS_FWD] = vl_cpu_bias_fwd;
  b->ops[VL_OP_BIAS_BWD] = vl_cpu_bias_bwd;
  b->ops[VL_OP_PAD2D_FWD] = vl_cpu_pad2d_fwd;
  b->ops[VL_OP_PAD2D_BWD] = vl_cpu_pad2d_bwd;
  b->ops[VL_OP_TIMESTEP_EMBED] = vl_cpu_timestep_embed;
  b->ops[VL_OP_MSE_FUSED] = vl_cpu_mse_fused;
  b->ops[VL_OP_GAUSS_SAMPLE] = vl_cpu_gauss_sample;
}
