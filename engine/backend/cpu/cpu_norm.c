/* CPU backend, RMSNorm, LayerNorm, GroupNorm and batch norm: OpenMP loops over the single-source bodies of
 * engine/kernels/norm.h. Arguments are checked by the operation's descriptor
 * (engine/backend/ops.c) before a kernel runs, on every backend.
 *
 * Determinism: loops are parallel over segments (a GroupNorm group, a LayerNorm row, an
 * RMSNorm row) or channels (batch norm), and every sum is taken by one thread in a fixed
 * order, so results do not depend on the thread count. Norm backwards take two passes: dx
 * per segment, then dgamma/dbeta per channel (GroupNorm, batch norm) or per block of COLS
 * columns (LayerNorm, RMSNorm) over every segment, so no two threads add into one parameter
 * gradient. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "../../kernels/norm.h"

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

/* ---- batch norm ------------------------------------------------------------------------ */

typedef struct {
  int64_t N, C, HW;
  const void *gamma, *beta;
  int gdt, bdt;
} bn_shape;

/* Channel c: shifted sums plane by plane (x, N planes of HW), statistics, normalisation. */
INLINE void bn_train_chan(void *y, int ydt, const void *x, int xdt, float *mean, float *rstd,
                          float *rmean, float *rvar, const bn_shape *s, float eps, float momentum,
                          int64_t c) {
  int64_t N = s->N, C = s->C, HW = s->HW;
  float K = vl_k_bn_shift(x, xdt, HW, c);
  double s1 = 0.0, s2 = 0.0;
  for (int64_t n = 0; n < N; n++) vl_k_bn_sums_run(x, xdt, (n * C + c) * HW, HW, K, &s1, &s2);
  vl_k_bn_affine a = vl_k_bn_train_finish(mean, rstd, rmean, rvar, s->gamma, s->gdt, s->beta,
                                          s->bdt, c, s1, s2, K, N * HW, eps, momentum);
  for (int64_t n = 0; n < N; n++) {
    int64_t o = (n * C + c) * HW;
    for (int64_t i = 0; i < HW; i++) vl_k_bn_apply(y, ydt, x, xdt, a, o + i);
  }
}

static vl_status cpu_bn_fwd_train(vl_ctx *c, vl_tensor *y, vl_tensor *mean, vl_tensor *rstd,
                              vl_tensor *rmean, vl_tensor *rvar, const vl_tensor *x,
                              const vl_tensor *gamma, const vl_tensor *beta, int64_t N, int64_t C,
                              int64_t HW, float eps, float momentum) {
  int64_t n = N * C * HW;
  if (n == 0) return VL_OK;
  bn_shape s = {N, C, HW, gamma->data, beta->data, dt(gamma), dt(beta)};
  float *pm = mean->data, *pr = rstd->data;
  float *prm = rmean ? rmean->data : NULL, *prv = rvar ? rvar->data : NULL;
  if (all_f32(y, x, NULL)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t k = 0; k < C; k++)
      bn_train_chan(y->data, F32, x->data, F32, pm, pr, prm, prv, &s, eps, momentum, k);
  } else {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t k = 0; k < C; k++)
      bn_train_chan(y->data, dt(y), x->data, dt(x), pm, pr, prm, prv, &s, eps, momentum, k);
  }
  return VL_OK;
}

/* Plane p = n*C + c with channel c's running statistics. */
INLINE void bn_eval_plane(void *y, int ydt, const void *x, int xdt, const float *rmean,
                          const float *rvar, const bn_shape *s, float eps, int64_t p) {
  vl_k_bn_affine a = vl_k_bn_eval_affine(rmean, rvar, s->gamma, s->gdt, s->beta, s->bdt, eps,
                                         p % s->C);
  int64_t o = p * s->HW;
  for (int64_t i = 0; i < s->HW; i++) vl_k_bn_apply(y, ydt, x, xdt, a, o + i);
}

static vl_status cpu_bn_fwd_eval(vl_ctx *c, vl_tensor *y, const vl_tensor *x, const vl_tensor *gamma,
                             const vl_tensor *beta, const vl_tensor *rmean, const vl_tensor *rvar,
                             int64_t N, int64_t C, int64_t HW, float eps) {
  int64_t n = N * C * HW;
  if (n == 0) return VL_OK;
  bn_shape s = {N, C, HW, gamma->data, beta->data, dt(gamma), dt(beta)};
  const float *rm = rmean->data, *rv = rvar->data;
  if (all_f32(y, x, NULL)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t p = 0; p < N * C; p++)
      bn_eval_plane(y->data, F32, x->data, F32, rm, rv, &s, eps, p);
  } else {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t p = 0; p < N * C; p++)
      bn_eval_plane(y->data, dt(y), x->data, dt(x), rm, rv, &s, eps, p);
  }
  return VL_OK;
}

/* Channel c: the two sums, dgamma/dbeta, then dx (all of the channel's dy is read before
 * any of its dx is written, so dx may alias dy). */
INLINE void bn_bwd_chan(void *dx, int dxdt, const void *dy, int dydt, const void *x, int xdt,
                        void *dgamma, int dgdt, void *dbeta, int dbdt, const float *mean,
                        const float *rstd, const bn_shape *s, int64_t c) {
  int64_t N = s->N, C = s->C, HW = s->HW;
  double sg = 0.0, sgx = 0.0;
  for (int64_t n = 0; n < N; n++)
    vl_k_bn_bwd_sums_run(dy, dydt, x, xdt, (n * C + c) * HW, HW, mean[c], &sg, &sgx);
  vl_k_bn_grad k = vl_k_bn_bwd_finish(dgamma, dgdt, dbeta, dbdt, s->gamma, s->gdt, mean, rstd, c,
                                      sg, sgx, N * HW);
  for (int64_t n = 0; n < N; n++) {
    int64_t o = (n * C + c) * HW;
    for (int64_t i = 0; i < HW; i++) vl_k_bn_bwd_apply(dx, dxdt, dy, dydt, x, xdt, k, o + i);
  }
}

static vl_status cpu_bn_bwd(vl_ctx *c, vl_tensor *dx, vl_tensor *dgamma, vl_tensor *dbeta,
                        const vl_tensor *dy, const vl_tensor *x, const vl_tensor *gamma,
                        const vl_tensor *mean, const vl_tensor *rstd, int64_t N, int64_t C,
                        int64_t HW) {
  int64_t n = N * C * HW;
  if (n == 0) return VL_OK;
  bn_shape s = {N, C, HW, gamma->data, NULL, dt(gamma), 0};
  void *dg = dgamma ? dgamma->data : NULL, *db = dbeta ? dbeta->data : NULL;
  int dgdt = dgamma ? dt(dgamma) : F32, dbdt = dbeta ? dt(dbeta) : F32;
  const float *pm = mean->data, *pr = rstd->data;
  if (all_f32(dx, dy, x)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t k = 0; k < C; k++)
      bn_bwd_chan(dx->data, F32, dy->data, F32, x->data, F32, dg, dgdt, db, dbdt, pm, pr, &s, k);
  } else {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t k = 0; k < C; k++)
      bn_bwd_chan(dx->data, dt(dx), dy->data, dt(dy), x->data, dt(x), dg, dgdt, db, dbdt, pm, pr,
                  &s, k);
  }
  return VL_OK;
}

/* ---- the op table's entries: unpack the argument structs (vramlab/ops.h) ------------------ */

static vl_status vl_cpu_bn_fwd_train(vl_ctx *c, const void *p) {
  const vl_bn_fwd_train_args *a = p;
  return cpu_bn_fwd_train(c, a->y, a->mean, a->rstd, a->rmean, a->rvar, a->x, a->gamma, a->beta,
                          a->N, a->C, a->HW, a->eps, a->momentum);
}
static vl_status vl_cpu_bn_fwd_eval(vl_ctx *c, const void *p) {
  const vl_bn_fwd_eval_args *a = p;
  return cpu_bn_fwd_eval(c, a->y, a->x, a->gamma, a->beta, a->rmean, a->rvar, a->N, a->C, a->HW,
                         a->eps);
}
static vl_status vl_cpu_bn_bwd(vl_ctx *c, const void *p) {
  const vl_bn_bwd_args *a = p;
  return cpu_bn_bwd(c, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean, a->rstd, a->N,
                    a->C, a->HW);
}

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

CPU_ENTRY(groupnorm_fwd, vl_groupnorm_fwd_args)
CPU_ENTRY(groupnorm_bwd, vl_groupnorm_bwd_args)
CPU_ENTRY(layernorm_fwd, vl_layernorm_fwd_args)
CPU_ENTRY(layernorm_bwd, vl_layernorm_bwd_args)

void vl_cpu_norm_ops(vl_backend *b) {
  b->ops[VL_OP_RMSNORM_FWD] = cpu_rmsnorm_fwd;
  b->ops[VL_OP_RMSNORM_BWD] = cpu_rmsnorm_bwd;
  b->ops[VL_OP_BN_FWD_TRAIN] = vl_cpu_bn_fwd_train;
  b->ops[VL_OP_BN_FWD_EVAL] = vl_cpu_bn_fwd_eval;
  b->ops[VL_OP_BN_BWD] = vl_cpu_bn_bwd;
  b->ops[VL_OP_GROUPNORM_FWD] = vl_cpu_groupnorm_fwd;
  b->ops[VL_OP_GROUPNORM_BWD] = vl_cpu_groupnorm_bwd;
  b->ops[VL_OP_LAYERNORM_FWD] = vl_cpu_layernorm_fwd;
  b->ops[VL_OP_LAYERNORM_BWD] = vl_cpu_layernorm_bwd;
}
