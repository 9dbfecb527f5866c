/* CPU backend, CNN element/plane ops: OpenMP loops over the single-source bodies of
 * engine/kernels/cnn.h (batch norm, ReLU, max pooling, bilinear or nearest 2x upsampling,
 * channel copy, per-pixel cross-entropy). Arguments are checked by the operation's descriptor
 * (engine/backend/ops.c) before a kernel runs, on every backend.
 *
 * Speed without a second implementation: where the tensors of a hot loop are fp32, the
 * loop calls the same body with the dtype as the constant VL_K_F32, so once inlined the
 * dtype switches of vl_ld/vl_st fold away and the contiguous runs vectorise; other dtypes
 * take the same call with the runtime dtype.
 *
 * Determinism: loops are parallel over channels, planes or elements, and every sum is
 * taken by one thread in a fixed order, so results do not depend on the thread count
 * (gpu-check --self-test compares two runs bit for bit). */
#include <string.h>

#include "cpu_internal.h"
#include "../../kernels/cnn.h"

#define F32 VL_K_F32
#define INLINE static inline __attribute__((always_inline))

static bool all_f32(const vl_tensor *a, const vl_tensor *b, const vl_tensor *c) {
  return a->dtype == VL_F32 && b->dtype == VL_F32 && (!c || c->dtype == VL_F32);
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

/* ---- ReLU ----------------------------------------------------------------------------- */

static vl_status cpu_relu_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n) {
  void *py = y->data;
  const void *px = x->data;
  if (all_f32(y, x, NULL)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t i = 0; i < n; i++) vl_k_relu_fwd(py, F32, px, F32, i);
  } else {
    int ydt = dt(y), xdt = dt(x);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t i = 0; i < n; i++) vl_k_relu_fwd(py, ydt, px, xdt, i);
  }
  return VL_OK;
}

static vl_status cpu_relu_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *y,
                          int64_t n) {
  void *pdx = dx->data;
  const void *pdy = dy->data, *py = y->data;
  if (all_f32(dx, dy, y)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t i = 0; i < n; i++) vl_k_relu_bwd(pdx, F32, pdy, F32, py, F32, i);
  } else {
    int dxdt = dt(dx), dydt = dt(dy), ydt = dt(y);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t i = 0; i < n; i++) vl_k_relu_bwd(pdx, dxdt, pdy, dydt, py, ydt, i);
  }
  return VL_OK;
}

/* ---- max pooling -------------------------------------------------------------------------- */

typedef struct { int64_t H, W, P, Q; int k, stride, pad; } pool_geo;

/* Output row (pl, oh) of P rows per plane: Q windows. */
INLINE void pool_fwd_row(void *y, int ydt, const void *x, int xdt, const pool_geo *g, int64_t row) {
  int64_t pl = row / g->P, oh = row - pl * g->P;
  for (int64_t ow = 0; ow < g->Q; ow++)
    vl_k_maxpool_fwd_at(y, ydt, x, xdt, g->H, g->W, g->k, g->stride, g->pad, g->P, g->Q, pl, oh,
                        ow);
}

static vl_status cpu_maxpool_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                             int64_t H, int64_t W, int k, int stride, int pad, int64_t P,
                             int64_t Q) {
  int64_t n = planes * P * Q;
  pool_geo g = {H, W, P, Q, k, stride, pad};
  void *py = y->data;
  const void *px = x->data;
  if (all_f32(y, x, NULL)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n * k * k) * NS_ROW))
    for (int64_t r = 0; r < planes * P; r++) pool_fwd_row(py, F32, px, F32, &g, r);
  } else {
    int ydt = dt(y), xdt = dt(x);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n * k * k) * NS_ROW))
    for (int64_t r = 0; r < planes * P; r++) pool_fwd_row(py, ydt, px, xdt, &g, r);
  }
  return VL_OK;
}

/* Input row (pl, h) of H rows per plane, the gather form. */
static void pool_bwd_row(void *dx, int dxdt, const void *dy, int dydt, const void *x, int xdt,
                         const pool_geo *g, int64_t row) {
  int64_t pl = row / g->H, h = row - pl * g->H;
  for (int64_t w = 0; w < g->W; w++)
    vl_k_maxpool_bwd_gather_at(dx, dxdt, dy, dydt, x, xdt, g->H, g->W, g->k, g->stride, g->pad,
                               g->P, g->Q, pl, h, w);
}

/* fp32 dx: one scatter per plane (each window's argmax found once); otherwise the gather,
 * which rounds dx once (see vl_k_maxpool_bwd_plane). Both give the CUDA gather's values. */
static vl_status cpu_maxpool_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *x,
                             int64_t planes, int64_t H, int64_t W, int k, int stride, int pad,
                             int64_t P, int64_t Q) {
  int64_t n = planes * H * W;
  pool_geo g = {H, W, P, Q, k, stride, pad};
  void *pdx = dx->data;
  const void *pdy = dy->data, *px = x->data;
  int dxdt = dt(dx), dydt = dt(dy), xdt = dt(x);
  if (all_f32(dx, dy, x)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n * k * k) * NS_ROW))
    for (int64_t p = 0; p < planes; p++)
      vl_k_maxpool_bwd_plane(pdx, F32, pdy, F32, px, F32, H, W, k, stride, pad, P, Q, p);
  } else if (dx->dtype == VL_F32) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n * k * k) * NS_ROW))
    for (int64_t p = 0; p < planes; p++)
      vl_k_maxpool_bwd_plane(pdx, F32, pdy, dydt, px, xdt, H, W, k, stride, pad, P, Q, p);
  } else {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n * k * k) * NS_ROW))
    for (int64_t r = 0; r < planes * H; r++) pool_bwd_row(pdx, dxdt, pdy, dydt, px, xdt, &g, r);
  }
  return VL_OK;
}

/* ---- 2x upsampling: bilinear, or nearest ------------------------------------------------ */

/* Bilinear sources of each output column (forward) and weights of each input column
 * (backward) are tabled once per call when a row has at most UP_TABLE of them; each row's
 * own are computed once per row. The per-element bodies take them as arguments, so the
 * values are those of vl_k_up2_fwd_at / vl_k_up2_bwd_at. */
#define UP_TABLE 1024

/* Output row (pl, oh) of 2H rows per plane; sw: the 2W column sources, or NULL. */
INLINE void up_fwd_row(void *y, int ydt, const void *x, int xdt, int64_t H, int64_t W,
                       bool nearest, const vl_k_up_src *sw, int64_t row) {
  int64_t pl = row / (2 * H), oh = row - pl * 2 * H;
  if (nearest) {
    for (int64_t ow = 0; ow < 2 * W; ow++) vl_k_up2n_fwd_at(y, ydt, x, xdt, H, W, pl, oh, ow);
  } else if (sw) {
    vl_k_up_src sh = vl_k_up2_src(oh, H);
    for (int64_t ow = 0; ow < 2 * W; ow++)
      vl_k_up2_fwd_from(y, ydt, x, xdt, H, W, pl, oh, ow, sh, sw[ow]);
  } else {
    for (int64_t ow = 0; ow < 2 * W; ow++) vl_k_up2_fwd_at(y, ydt, x, xdt, H, W, pl, oh, ow);
  }
}

/* Input row (pl, h) of H rows per plane; ww: the W columns' 4 weights each, or NULL. */
INLINE void up_bwd_row(void *dx, int dxdt, const void *dy, int dydt, int64_t H, int64_t W,
                       bool nearest, const float (*ww)[4], int64_t row) {
  int64_t pl = row / H, h = row - pl * H;
  if (nearest) {
    for (int64_t w = 0; w < W; w++) vl_k_up2n_bwd_at(dx, dxdt, dy, dydt, H, W, pl, h, w);
  } else if (ww) {
    float wh[4];
    vl_k_up2_bwd_weights(h, H, wh);
    for (int64_t w = 0; w < W; w++)
      vl_k_up2_bwd_from(dx, dxdt, dy, dydt, H, W, pl, h, w, wh, ww[w]);
  } else {
    for (int64_t w = 0; w < W; w++) vl_k_up2_bwd_at(dx, dxdt, dy, dydt, H, W, pl, h, w);
  }
}

static vl_status cpu_upsample2x_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                                int64_t H, int64_t W, bool nearest) {
  int64_t nhi = planes * 4 * H * W;
  void *py = y->data;
  const void *px = x->data;
  vl_k_up_src tab[UP_TABLE];
  const vl_k_up_src *sw = !nearest && 2 * W <= UP_TABLE ? tab : NULL;
  for (int64_t ow = 0; sw && ow < 2 * W; ow++) tab[ow] = vl_k_up2_src(ow, W);
  if (all_f32(y, x, NULL)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(nhi) * NS_ROW))
    for (int64_t r = 0; r < planes * 2 * H; r++) up_fwd_row(py, F32, px, F32, H, W, nearest, sw, r);
  } else {
    int ydt = dt(y), xdt = dt(x);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(nhi) * NS_ROW))
    for (int64_t r = 0; r < planes * 2 * H; r++) up_fwd_row(py, ydt, px, xdt, H, W, nearest, sw, r);
  }
  return VL_OK;
}

static vl_status cpu_upsample2x_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, int64_t planes,
                                int64_t H, int64_t W, bool nearest) {
  int64_t nhi = planes * 4 * H * W;
  void *pdx = dx->data;
  const void *pdy = dy->data;
  float tab[UP_TABLE][4];
  const float(*ww)[4] = !nearest && W <= UP_TABLE ? (const float(*)[4])tab : NULL;
  for (int64_t w = 0; ww && w < W; w++) vl_k_up2_bwd_weights(w, W, tab[w]);
  if (all_f32(dx, dy, NULL)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(nhi) * NS_ROW))
    for (int64_t r = 0; r < planes * H; r++) up_bwd_row(pdx, F32, pdy, F32, H, W, nearest, ww, r);
  } else {
    int dxdt = dt(dx), dydt = dt(dy);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(nhi) * NS_ROW))
    for (int64_t r = 0; r < planes * H; r++) up_bwd_row(pdx, dxdt, pdy, dydt, H, W, nearest, ww, r);
  }
  return VL_OK;
}

/* ---- channel copy ------------------------------------------------------------------------ */

/* Plane q = s*nc + k of the copy: its offsets in y and x (planes of HW elements). */
static void cc_offsets(int64_t q, int64_t nc, int64_t HW, int64_t yC, int64_t y_c0, int64_t xC,
                       int64_t x_c0, int64_t *yo, int64_t *xo) {
  int64_t s = q / nc, k = q - s * nc;
  *yo = (s * yC + y_c0 + k) * HW;
  *xo = (s * xC + x_c0 + k) * HW;
}

/* One plane at a time (N*nc of them, so a batch of 1 still spreads over the threads): a
 * memcpy when nothing converts or adds, else the element body over the plane. */
static vl_status cpu_chan_copy(vl_ctx *c, vl_tensor *y, int64_t yC, int64_t y_c0, const vl_tensor *x,
                           int64_t xC, int64_t x_c0, int64_t nc, int64_t N, int64_t HW,
                           bool accumulate) {
  int64_t n = N * nc * HW;
  if (n == 0) return VL_OK;
  void *py = y->data;
  const void *px = x->data;
  int ydt = dt(y), xdt = dt(x), acc = accumulate ? 1 : 0;
  if (!accumulate && y->dtype == x->dtype) {
    size_t eb = vl_dtype_bytes(y->dtype, 1);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t q = 0; q < N * nc; q++) {
      int64_t yo, xo;
      cc_offsets(q, nc, HW, yC, y_c0, xC, x_c0, &yo, &xo);
      memcpy((char *)py + (size_t)yo * eb, (const char *)px + (size_t)xo * eb, (size_t)HW * eb);
    }
  } else if (all_f32(y, x, NULL)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t q = 0; q < N * nc; q++) {
      int64_t yo, xo;
      cc_offsets(q, nc, HW, yC, y_c0, xC, x_c0, &yo, &xo);
      for (int64_t j = 0; j < HW; j++) vl_k_chan_copy_at(py, F32, yo + j, px, F32, xo + j, acc);
    }
  } else {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t q = 0; q < N * nc; q++) {
      int64_t yo, xo;
      cc_offsets(q, nc, HW, yC, y_c0, xC, x_c0, &yo, &xo);
      for (int64_t j = 0; j < HW; j++) vl_k_chan_copy_at(py, ydt, yo + j, px, xdt, xo + j, acc);
    }
  }
  return VL_OK;
}

/* ---- per-pixel cross-entropy ----------------------------------------------------------- */

/* Targets are in host memory here, so a label >= K is reported as an error before anything is
 * written (the CUDA backend cannot see them cheaply: its kernel gives that pixel a NaN loss). */
static vl_status cpu_xent_pix(vl_ctx *c, vl_tensor *logits, vl_tensor *loss, const vl_tensor *tt,
                          int64_t N, int64_t K, int64_t HW, float dloss_scale) {
  int64_t n = N * HW;
  const int32_t *tgt = tt ? tt->data : NULL;
  for (int64_t p = 0; p < n; p++)
    if (tgt[p] >= K)
      return vl_fail(c, VL_ERR_INVALID, "xent_pix: pixel %lld has target %d, only %lld classes",
                     (long long)p, (int)tgt[p], (long long)K);
  void *pl = logits->data;
  float *ploss = loss->data;
  int ldt = dt(logits), nt = vl_cpu_threads((double)(n * K) * NS_EXP);
  if (ldt == F32) {
#pragma omp parallel for num_threads(nt)
    for (int64_t p = 0; p < n; p++) vl_k_xent_pix(pl, F32, ploss, tgt, K, HW, dloss_scale, p);
  } else {
#pragma omp parallel for num_threads(nt)
    for (int64_t p = 0; p < n; p++) vl_k_xent_pix(pl, ldt, ploss, tgt, K, HW, dloss_scale, p);
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
static vl_status vl_cpu_relu_fwd(vl_ctx *c, const void *p) {
  const vl_relu_fwd_args *a = p;
  return cpu_relu_fwd(c, a->y, a->x, a->n);
}
static vl_status vl_cpu_relu_bwd(vl_ctx *c, const void *p) {
  const vl_relu_bwd_args *a = p;
  return cpu_relu_bwd(c, a->dx, a->dy, a->y, a->n);
}
static vl_status vl_cpu_maxpool_fwd(vl_ctx *c, const void *p) {
  const vl_maxpool_fwd_args *a = p;
  return cpu_maxpool_fwd(c, a->y, a->x, a->planes, a->H, a->W, a->k, a->stride, a->pad, a->P, a->Q);
}
static vl_status vl_cpu_maxpool_bwd(vl_ctx *c, const void *p) {
  const vl_maxpool_bwd_args *a = p;
  return cpu_maxpool_bwd(c, a->dx, a->dy, a->x, a->planes, a->H, a->W, a->k, a->stride, a->pad,
                         a->P, a->Q);
}
static vl_status vl_cpu_upsample2x_fwd(vl_ctx *c, const void *p) {
  const vl_upsample2x_fwd_args *a = p;
  return cpu_upsample2x_fwd(c, a->y, a->x, a->planes, a->H, a->W, a->nearest);
}
static vl_status vl_cpu_upsample2x_bwd(vl_ctx *c, const void *p) {
  const vl_upsample2x_bwd_args *a = p;
  return cpu_upsample2x_bwd(c, a->dx, a->dy, a->planes, a->H, a->W, a->nearest);
}
static vl_status vl_cpu_chan_copy(vl_ctx *c, const void *p) {
  const vl_chan_copy_args *a = p;
  return cpu_chan_copy(c, a->y, a->yC, a->y_c0, a->x, a->xC, a->x_c0, a->nc, a->N, a->HW,
                       a->accumulate);
}
static vl_status vl_cpu_xent_pix(vl_ctx *c, const void *p) {
  const vl_xent_pix_args *a = p;
  return cpu_xent_pix(c, a->logits, a->loss, a->tgt, a->N, a->K, a->HW, a->dloss_scale);
}

void vl_cpu_cnn_ops(vl_backend *b) {
  b->ops[VL_OP_BN_FWD_TRAIN] = vl_cpu_bn_fwd_train;
  b->ops[VL_OP_BN_FWD_EVAL] = vl_cpu_bn_fwd_eval;
  b->ops[VL_OP_BN_BWD] = vl_cpu_bn_bwd;
  b->ops[VL_OP_RELU_FWD] = vl_cpu_relu_fwd;
  b->ops[VL_OP_RELU_BWD] = vl_cpu_relu_bwd;
  b->ops[VL_OP_MAXPOOL_FWD] = vl_cpu_maxpool_fwd;
  b->ops[VL_OP_MAXPOOL_BWD] = vl_cpu_maxpool_bwd;
  b->ops[VL_OP_UPSAMPLE2X_FWD] = vl_cpu_upsample2x_fwd;
  b->ops[VL_OP_UPSAMPLE2X_BWD] = vl_cpu_upsample2x_bwd;
  b->ops[VL_OP_CHAN_COPY] = vl_cpu_chan_copy;
  b->ops[VL_OP_XENT_PIX] = vl_cpu_xent_pix;
}
