/* CUDA backend, CNN element/plane ops: grid-stride kernels over the single-source bodies of
 * engine/kernels/cnn.h, the bodies the CPU backend loops over (docs/architecture.md "The CUDA
 * backend must be verifiable without a GPU"). Arguments are checked by the operation's
 * descriptor (engine/backend/ops.c) before a kernel runs, on every backend.
 *
 * Batch norm's per-channel sums over N*HW take one block per channel (a grid-stride loop
 * over channels at block granularity): each thread sums a strided subset of the channel
 * with the cnn.h strided body, a fixed-shape tree in shared memory adds the partial sums
 * (deterministic for a given block size), thread 0 finishes the channel with the same
 * body as the CPU, and the block then writes the channel's outputs. One kernel per op, no
 * scratch memory, and dx may alias dy because the whole channel is summed before any of
 * it is written. The only CUDA-only code is the tree; gpu-check compares the result with
 * the CPU backend (its plane-by-plane sums) under a rounding-level limit.
 *
 * Target ids of xent_pix are a VL_I32 tensor in device memory (the step's data block). */
#include "cuda_internal.h"
#include "../../kernels/cnn.h"

/* ---- batch norm: one block of VL_THREADS per channel ----------------------------------- */

/* Sum a and b over the block (blockDim.x == VL_THREADS, a power of two); the totals are
 * returned to every thread. Ends with a barrier, so sh may be reused at once. */
__device__ static void block_sum2(double *a, double *b, double (*sh)[VL_THREADS]) {
  int t = (int)threadIdx.x;
  sh[0][t] = *a;
  sh[1][t] = *b;
  __syncthreads();
  for (int k = VL_THREADS / 2; k > 0; k >>= 1) {
    if (t < k) { sh[0][t] += sh[0][t + k]; sh[1][t] += sh[1][t + k]; }
    __syncthreads();
  }
  *a = sh[0][0];
  *b = sh[1][0];
  __syncthreads();
}

__global__ void k_bn_train(void *y, int ydt, float *mean, float *rstd, float *rmean, float *rvar,
                           const void *x, int xdt, const void *gamma, int gdt, const void *beta,
                           int bdt, int64_t N, int64_t C, int64_t HW, float eps, float momentum) {
  __shared__ double sh[2][VL_THREADS];
  __shared__ vl_k_bn_affine aff;
  int64_t M = N * HW;
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    float K = vl_k_bn_shift(x, xdt, HW, c);
    double s1 = 0.0, s2 = 0.0;
    vl_k_bn_sums_strided(x, xdt, C, HW, M, c, K, threadIdx.x, blockDim.x, &s1, &s2);
    block_sum2(&s1, &s2, sh);
    if (threadIdx.x == 0)
      aff = vl_k_bn_train_finish(mean, rstd, rmean, rvar, gamma, gdt, beta, bdt, c, s1, s2, K, M,
                                 eps, momentum);
    __syncthreads();
    vl_k_bn_affine a = aff;
    vl_k_cpos p = vl_k_cpos_at(HW, threadIdx.x, blockDim.x);
    for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
      vl_k_bn_apply(y, ydt, x, xdt, a, vl_k_cpos_off(&p, C, HW, c));
      vl_k_cpos_next(&p, HW);
    }
    __syncthreads(); /* aff is rewritten by the next channel */
  }
}

__global__ void k_bn_bwd(void *dx, int dxdt, void *dgamma, int dgdt, void *dbeta, int dbdt,
                         const void *dy, int dydt, const void *x, int xdt, const void *gamma,
                         int gdt, const float *mean, const float *rstd, int64_t N, int64_t C,
                         int64_t HW) {
  __shared__ double sh[2][VL_THREADS];
  __shared__ vl_k_bn_grad grad;
  int64_t M = N * HW;
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double sg = 0.0, sgx = 0.0;
    vl_k_bn_bwd_sums_strided(dy, dydt, x, xdt, C, HW, M, c, mean[c], threadIdx.x, blockDim.x,
                             &sg, &sgx);
    block_sum2(&sg, &sgx, sh);
    if (threadIdx.x == 0)
      grad = vl_k_bn_bwd_finish(dgamma, dgdt, dbeta, dbdt, gamma, gdt, mean, rstd, c, sg, sgx, M);
    __syncthreads();
    vl_k_bn_grad k = grad;
    vl_k_cpos p = vl_k_cpos_at(HW, threadIdx.x, blockDim.x);
    for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
      vl_k_bn_bwd_apply(dx, dxdt, dy, dydt, x, xdt, k, vl_k_cpos_off(&p, C, HW, c));
      vl_k_cpos_next(&p, HW);
    }
    __syncthreads();
  }
}

__global__ void k_bn_eval(void *y, int ydt, const void *x, int xdt, const float *rmean,
                          const float *rvar, const void *gamma, int gdt, const void *beta, int bdt,
                          int64_t C, int64_t HW, float eps, int64_t n) {
  GRID_STRIDE(i, n)
  vl_k_bn_eval_elem(y, ydt, x, xdt, rmean, rvar, gamma, gdt, beta, bdt, C, HW, eps, i);
}

/* ---- element / plane kernels ----------------------------------------------------------- */

__global__ void k_relu_fwd(void *y, int ydt, const void *x, int xdt, int64_t n) {
  GRID_STRIDE(i, n) vl_k_relu_fwd(y, ydt, x, xdt, i);
}
__global__ void k_relu_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *y, int ydt,
                           int64_t n) {
  GRID_STRIDE(i, n) vl_k_relu_bwd(dx, dxdt, dy, dydt, y, ydt, i);
}
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
/* One thread per pixel: adjacent threads read adjacent pixels of each class plane. */
__global__ void k_xent_pix(void *logits, int ldt, float *loss, const int32_t *tgt, int64_t K,
                           int64_t HW, float s, int64_t n) {
  GRID_STRIDE(p, n) vl_k_xent_pix(logits, ldt, loss, tgt, K, HW, s, p);
}

/* ---- ops --------------------------------------------------------------------------------- */

/* One block per channel, at most max_blocks (the kernels loop over channels). */
static int chan_blocks(const cu_state *s, int64_t C) {
  return C < (int64_t)s->max_blocks ? (int)C : s->max_blocks;
}

static vl_status cu_bn_fwd_train(vl_ctx *c, vl_tensor *y, vl_tensor *mean, vl_tensor *rstd,
                                 vl_tensor *rmean, vl_tensor *rvar, const vl_tensor *x,
                                 const vl_tensor *gamma, const vl_tensor *beta, int64_t N,
                                 int64_t C, int64_t HW, float eps, float momentum) {
  int64_t n = N * C * HW;
  if (n == 0) return VL_OK;
  cu_state *s = st(c);
  k_bn_train<<<chan_blocks(s, C), VL_THREADS, 0, s->stream>>>(
      y->data, dt(y), (float *)mean->data, (float *)rstd->data,
      rmean ? (float *)rmean->data : NULL, rvar ? (float *)rvar->data : NULL, x->data, dt(x),
      gamma->data, dt(gamma), beta->data, dt(beta), N, C, HW, eps, momentum);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

static vl_status cu_bn_fwd_eval(vl_ctx *c, vl_tensor *y, const vl_tensor *x, const vl_tensor *gamma,
                                const vl_tensor *beta, const vl_tensor *rmean,
                                const vl_tensor *rvar, int64_t N, int64_t C, int64_t HW,
                                float eps) {
  int64_t n = N * C * HW;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_bn_eval, y->data, dt(y), x->data, dt(x),
           (const float *)rmean->data, (const float *)rvar->data, gamma->data, dt(gamma),
           beta->data, dt(beta), C, HW, eps, n);
  return VL_OK;
}

static vl_status cu_bn_bwd(vl_ctx *c, vl_tensor *dx, vl_tensor *dgamma, vl_tensor *dbeta,
                           const vl_tensor *dy, const vl_tensor *x, const vl_tensor *gamma,
                           const vl_tensor *mean, const vl_tensor *rstd, int64_t N, int64_t C,
                           int64_t HW) {
  int64_t n = N * C * HW;
  if (n == 0) return VL_OK;
  cu_state *s = st(c);
  k_bn_bwd<<<chan_blocks(s, C), VL_THREADS, 0, s->stream>>>(
      dx->data, dt(dx), dgamma ? dgamma->data : NULL, dgamma ? dt(dgamma) : VL_K_F32,
      dbeta ? dbeta->data : NULL, dbeta ? dt(dbeta) : VL_K_F32, dy->data, dt(dy), x->data, dt(x),
      gamma->data, dt(gamma), (const float *)mean->data, (const float *)rstd->data, N, C, HW);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

static vl_status cu_relu_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n) {
  if (n > 0) LAUNCH(c, st(c), n, VL_THREADS, k_relu_fwd, y->data, dt(y), x->data, dt(x), n);
  return VL_OK;
}

static vl_status cu_relu_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *y,
                             int64_t n) {
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_relu_bwd, dx->data, dt(dx), dy->data, dt(dy), y->data, dt(y),
           n);
  return VL_OK;
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

static vl_status cu_xent_pix(vl_ctx *c, vl_tensor *logits, vl_tensor *loss, const vl_tensor *ids,
                             int64_t N, int64_t K, int64_t HW, float dloss_scale) {
  int64_t n = N * HW;
  const int32_t *tgt = ids ? (const int32_t *)ids->data : NULL; /* device memory */
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_xent_pix, logits->data, dt(logits), (float *)loss->data, tgt,
           K, HW, dloss_scale, n);
  return VL_OK;
}

/* ---- the op table's entries: unpack the argument structs (vramlab/ops.h) ------------------ */

#define ARGS(type) const type *a = (const type *)p
static vl_status op_bn_fwd_train(vl_ctx *c, const void *p) {
  ARGS(vl_bn_fwd_train_args);
  return cu_bn_fwd_train(c, a->y, a->mean, a->rstd, a->rmean, a->rvar, a->x, a->gamma, a->beta,
                         a->N, a->C, a->HW, a->eps, a->momentum);
}
static vl_status op_bn_fwd_eval(vl_ctx *c, const void *p) {
  ARGS(vl_bn_fwd_eval_args);
  return cu_bn_fwd_eval(c, a->y, a->x, a->gamma, a->beta, a->rmean, a->rvar, a->N, a->C, a->HW,
                        a->eps);
}
static vl_status op_bn_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_bn_bwd_args);
  return cu_bn_bwd(c, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean, a->rstd, a->N,
                   a->C, a->HW);
}
static vl_status op_relu_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_relu_fwd_args);
  return cu_relu_fwd(c, a->y, a->x, a->n);
}
static vl_status op_relu_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_relu_bwd_args);
  return cu_relu_bwd(c, a->dx, a->dy, a->y, a->n);
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
static vl_status op_xent_pix(vl_ctx *c, const void *p) {
  ARGS(vl_xent_pix_args);
  return cu_xent_pix(c, a->logits, a->loss, a->tgt, a->N, a->K, a->HW, a->dloss_scale);
}

void vl_cuda_cnn_ops(vl_backend *b) {
  b->ops[VL_OP_BN_FWD_TRAIN] = op_bn_fwd_train;
  b->ops[VL_OP_BN_FWD_EVAL] = op_bn_fwd_eval;
  b->ops[VL_OP_BN_BWD] = op_bn_bwd;
  b->ops[VL_OP_RELU_FWD] = op_relu_fwd;
  b->ops[VL_OP_RELU_BWD] = op_relu_bwd;
  b->ops[VL_OP_MAXPOOL_FWD] = op_maxpool_fwd;
  b->ops[VL_OP_MAXPOOL_BWD] = op_maxpool_bwd;
  b->ops[VL_OP_UPSAMPLE2X_FWD] = op_up2_fwd;
  b->ops[VL_OP_UPSAMPLE2X_BWD] = op_up2_bwd;
  b->ops[VL_OP_CHAN_COPY] = op_chan_copy;
  b->ops[VL_OP_XENT_PIX] = op_xent_pix;
}
