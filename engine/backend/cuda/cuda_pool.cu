/* CUDA backend, max pooling, 2x upsampling, zero padding and channel copy: grid-stride kernels over the
 * single-source bodies of engine/kernels/pool.h, the same bodies the CPU backend loops over
 * (cpu_pool.c). Arguments are checked by the operation's descriptor (engine/backend/ops.c)
 * before a kernel runs. */
#include <math.h>

#include "cuda_internal.h"
#include "../../kernels/pool.h"

__global__ void k_maxpool_fwd(void *y, int ydt, const void *x, int xdt, int64_t H, int64_t W, int k,
                              int stride, int pad, int64_t P, int64_t Q, int64_t n) {
  GRID_STRIDE(i, n) vl_k_maxpool_fwd(y, ydt, x, xdt, H, W, k, stride, pad, P, Q, i);
}
/* The gather form: one thread per input element, no atomics, the CPU's order of sums. */
__global__ void k_maxpool_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *x, int xdt,
                              int64_t H, int64_t W, int k, int stride, int pad, int64_t P,
                              int64_t Q, int64_t n) {
  GRID_STRIDE(i, n)
  vl_k_maxpool_bwd_gather(dx, dxdt, dy, dydt, x, xdt, H, W, k, stride, pad, P, Q, i);
}
__global__ void k_up2_fwd(void *y, int ydt, const void *x, int xdt, int64_t H, int64_t W,
                          int64_t n) {
  GRID_STRIDE(i, n) vl_k_up2_fwd(y, ydt, x, xdt, H, W, i);
}
__global__ void k_up2_bwd(void *dx, int dxdt, const void *dy, int dydt, int64_t H, int64_t W,
                          int64_t n) {
  GRID_STRIDE(i, n) vl_k_up2_bwd(dx, dxdt, dy, dydt, H, W, i);
}
__global__ void k_up2n_fwd(void *y, int ydt, const void *x, int xdt, int64_t H, int64_t W,
                           int64_t n) {
  GRID_STRIDE(i, n) vl_k_up2n_fwd(y, ydt, x, xdt, H, W, i);
}
__global__ void k_up2n_bwd(void *dx, int dxdt, const void *dy, int dydt, int64_t H, int64_t W,
                           int64_t n) {
  GRID_STRIDE(i, n) vl_k_up2n_bwd(dx, dxdt, dy, dydt, H, W, i);
}
__global__ void k_chan_copy(void *y, int ydt, int64_t yC, int64_t y_c0, const void *x, int xdt,
                            int64_t xC, int64_t x_c0, int64_t nc, int64_t HW, int acc, int64_t n) {
  GRID_STRIDE(i, n) vl_k_chan_copy(y, ydt, yC, y_c0, x, xdt, xC, x_c0, nc, HW, acc, i);
}

static vl_status cu_maxpool_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                                int64_t H, int64_t W, int k, int stride, int pad, int64_t P,
                                int64_t Q) {
  int64_t n = planes * P * Q;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_maxpool_fwd, y->data, dt(y), x->data, dt(x), H, W, k, stride,
           pad, P, Q, n);
  return VL_OK;
}

static vl_status cu_maxpool_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *x,
                                int64_t planes, int64_t H, int64_t W, int k, int stride, int pad,
                                int64_t P, int64_t Q) {
  int64_t n = planes * H * W;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_maxpool_bwd, dx->data, dt(dx), dy->data, dt(dy), x->data,
           dt(x), H, W, k, stride, pad, P, Q, n);
  return VL_OK;
}

static vl_status cu_upsample2x_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                                   int64_t H, int64_t W, bool nearest) {
  int64_t nhi = planes * 4 * H * W;
  if (nhi > 0 && nearest)
    LAUNCH(c, st(c), nhi, VL_THREADS, k_up2n_fwd, y->data, dt(y), x->data, dt(x), H, W, nhi);
  else if (nhi > 0)
    LAUNCH(c, st(c), nhi, VL_THREADS, k_up2_fwd, y->data, dt(y), x->data, dt(x), H, W, nhi);
  return VL_OK;
}

static vl_status cu_upsample2x_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, int64_t planes,
                                   int64_t H, int64_t W, bool nearest) {
  int64_t nlo = planes * H * W;
  if (nlo > 0 && nearest)
    LAUNCH(c, st(c), nlo, VL_THREADS, k_up2n_bwd, dx->data, dt(dx), dy->data, dt(dy), H, W, nlo);
  else if (nlo > 0)
    LAUNCH(c, st(c), nlo, VL_THREADS, k_up2_bwd, dx->data, dt(dx), dy->data, dt(dy), H, W, nlo);
  return VL_OK;
}

static vl_status cu_chan_copy(vl_ctx *c, vl_tensor *y, int64_t yC, int64_t y_c0, const vl_tensor *x,
                              int64_t xC, int64_t x_c0, int64_t nc, int64_t N, int64_t HW,
                              bool accumulate) {
  int64_t n = N * nc * HW;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_chan_copy, y->data, dt(y), yC, y_c0, x->data, dt(x), xC,
           x_c0, nc, HW, accumulate ? 1 : 0, n);
  return VL_OK;
}

static vl_status op_maxpool_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_maxpool_fwd_args);
  return cu_maxpool_fwd(c, a->y, a->x, a->planes, a->H, a->W, a->k, a->stride, a->pad, a->P, a->Q);
}
static vl_status op_maxpool_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_maxpool_bwd_args);
  return cu_maxpool_bwd(c, a->dx, a->dy, a->x, a->planes, a->H, a->W, a->k, a->stride, a->pad,
                        a->P, a->Q);
}
static vl_status op_up2_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_upsample2x_fwd_args);
  return cu_upsample2x_fwd(c, a->y, a->x, a->planes, a->H, a->W, a->nearest);
}
static vl_status op_up2_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_upsample2x_bwd_args);
  return cu_upsample2x_bwd(c, a->dx, a->dy, a->planes, a->H, a->W, a->nearest);
}
static vl_status op_chan_copy(vl_ctx *c, const void *p) {
  ARGS(vl_chan_copy_args);
  return cu_chan_copy(c, a->y, a->yC, a->y_c0, a->x, a->xC, a->x_c0, a->nc, a->N, a->HW,
                      a->accumulate);
}

__global__ void k_pad_fwd(void *y, int ydt, const void *x, int xdt, vl_k_pad g, int64_t n) {
  GRID_STRIDE(i, n) vl_k_pad_fwd(y, ydt, x, xdt, g, i);
}
__global__ void k_pad_bwd(void *dx, int dxdt, const void *dy, int dydt, vl_k_pad g, int64_t n) {
  GRID_STRIDE(i, n) vl_k_pad_bwd(dx, dxdt, dy, dydt, g, i);
}

static vl_k_pad pad_geo(int64_t H, int64_t W, int top, int bottom, int left, int right) {
  vl_k_pad g = {H, W, H + top + bottom, W + left + right, top, left};
  return g;
}

static vl_status op_pad2d_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_pad2d_fwd_args);
  int64_t nin = a->planes * a->H * a->W;
  int64_t nout = a->planes * (a->H + a->top + a->bottom) * (a->W + a->left + a->right);
  if (nout > 0)
    LAUNCH(c, st(c), nout, VL_THREADS, k_pad_fwd, a->y->data, dt(a->y), nin ? a->x->data : NULL,
           dt(a->x), pad_geo(a->H, a->W, a->top, a->bottom, a->left, a->right), nout);
  return VL_OK;
}

static vl_status op_pad2d_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_pad2d_bwd_args);
  int64_t nin = a->planes * a->H * a->W;
  if (nin > 0)
    LAUNCH(c, st(c), nin, VL_THREADS, k_pad_bwd, a->dx->data, dt(a->dx), a->dy->data, dt(a->dy),
           pad_geo(a->H, a->W, a->top, a->bottom, a->left, a->right), nin);
  return VL_OK;
}

void vl_cuda_pool_ops(vl_backend *b) {
  b->ops[VL_OP_MAXPOOL_FWD] = op_maxpool_fwd;
  b->ops[VL_OP_MAXPOOL_BWD] = op_maxpool_bwd;
  b->ops[VL_OP_UPSAMPLE2X_FWD] = op_up2_fwd;
  b->ops[VL_OP_UPSAMPLE2X_BWD] = op_up2_bwd;
  b->ops[VL_OP_CHAN_COPY] = op_chan_copy;
  b->ops[VL_OP_PAD2D_FWD] = op_pad2d_fwd;
  b->ops[VL_OP_PAD2D_BWD] = op_pad2d_bwd;
}
