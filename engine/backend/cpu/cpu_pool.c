/* CPU backend, max pooling, 2x upsampling, zero padding and channel copy: OpenMP loops over the single-source bodies of
 * engine/kernels/pool.h. Arguments are checked by the operation's descriptor
 * (engine/backend/ops.c) before a kernel runs, on every backend. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "../../kernels/pool.h"

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

CPU_ENTRY(pad2d_fwd, vl_pad2d_fwd_args)
CPU_ENTRY(pad2d_bwd, vl_pad2d_bwd_args)

void vl_cpu_pool_ops(vl_backend *b) {
  b->ops[VL_OP_MAXPOOL_FWD] = vl_cpu_maxpool_fwd;
  b->ops[VL_OP_MAXPOOL_BWD] = vl_cpu_maxpool_bwd;
  b->ops[VL_OP_UPSAMPLE2X_FWD] = vl_cpu_upsample2x_fwd;
  b->ops[VL_OP_UPSAMPLE2X_BWD] = vl_cpu_upsample2x_bwd;
  b->ops[VL_OP_CHAN_COPY] = vl_cpu_chan_copy;
  b->ops[VL_OP_PAD2D_FWD] = vl_cpu_pad2d_fwd;
  b->ops[VL_OP_PAD2D_BWD] = vl_cpu_pad2d_bwd;
}
