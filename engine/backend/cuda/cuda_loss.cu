/* CUDA backend, fused cross-entropy (token rows, pixels) and fused MSE: grid-stride kernels, or one block per row over the
 * single-source bodies of engine/kernels/loss.h, the same bodies the CPU backend loops over
 * (cpu_loss.c). Arguments are checked by the operation's descriptor (engine/backend/ops.c)
 * before a kernel runs. */
#include <math.h>

#include "cuda_internal.h"
#include "cuda_reduce.h"
#include "../../kernels/loss.h"

__global__ void k_xent(void *logits, int ldt, float *loss, const int32_t *tgt, int64_t V,
                       float s, int64_t R) {
  GRID_STRIDE(r, R) vl_k_xent_row(logits, ldt, loss, tgt, V, s, r);
}

static vl_status cu_xent(vl_ctx *c, vl_tensor *logits, vl_tensor *loss, const vl_tensor *ids,
                         int64_t R, int64_t V, float scale) {
  if (R <= 0) return VL_OK;
  const int32_t *tgt = (const int32_t *)ids->data;
  LAUNCH(c, st(c), R, VL_ROW_THREADS, k_xent, logits->data, dt(logits), (float *)loss->data, tgt,
         V, scale, R);
  return VL_OK;
}

static vl_status op_xent(vl_ctx *c, const void *p) {
  ARGS(vl_xent_fused_args);
  return cu_xent(c, a->logits, a->loss, a->tgt, a->R, a->V, a->dloss_scale);
}

/* One thread per pixel: adjacent threads read adjacent pixels of each class plane. */
__global__ void k_xent_pix(void *logits, int ldt, float *loss, const int32_t *tgt, int64_t K,
                           int64_t HW, float s, int64_t n) {
  GRID_STRIDE(p, n) vl_k_xent_pix(logits, ldt, loss, tgt, K, HW, s, p);
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

static vl_status op_xent_pix(vl_ctx *c, const void *p) {
  ARGS(vl_xent_pix_args);
  return cu_xent_pix(c, a->logits, a->loss, a->tgt, a->N, a->K, a->HW, a->dloss_scale);
}

/* One block per row: each element's square into the sum and its gradient in place. */
__global__ void k_mse(void *pred, int pdt, float *loss, const void *target, int tdt, int64_t R,
                      int64_t C, float scale) {
  __shared__ double sh[2][SEG_THREADS];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    double s = 0.0, unused = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += SEG_THREADS)
      s += vl_k_mse_elem(pred, pdt, target, tdt, scale, r * C + c);
    block_sum2<SEG_THREADS>(&s, &unused, sh);
    if (threadIdx.x == 0) loss[r] = (float)s;
  }
}

static vl_status op_mse_fused(vl_ctx *c, const void *p) {
  ARGS(vl_mse_fused_args);
  int64_t n = a->R * a->C;
  if (a->R == 0) return VL_OK;
  cu_state *s = st(c);
  k_mse<<<seg_blocks(s, a->R), SEG_THREADS, 0, s->stream>>>(
      n ? a->pred->data : NULL, dt(a->pred), (float *)a->loss->data, n ? a->target->data : NULL,
      dt(a->target), a->R, a->C, a->dloss_scale);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

void vl_cuda_loss_ops(vl_backend *b) {
  b->ops[VL_OP_XENT_FUSED] = op_xent;
  b->ops[VL_OP_XENT_PIX] = op_xent_pix;
  b->ops[VL_OP_MSE_FUSED] = op_mse_fused;
}
