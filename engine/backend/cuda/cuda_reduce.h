/* Block reductions and launch shapes the CUDA kernel files share (device code: included by
 * .cu files only, after cuda_internal.h). */
#ifndef VRAMLAB_CUDA_REDUCE_H
#define VRAMLAB_CUDA_REDUCE_H
#include "cuda_internal.h"

#define SEG_THREADS VL_THREADS /* one block per norm segment / channel / MSE row */
#define COL_X 32               /* column kernels: columns per block ... */
#define COL_Y 8                /* ... and row lanes */

/* Sum a and b over the block (blockDim.x == NT, a power of two); the totals are returned to
 * every thread. Ends with a barrier, so sh may be reused at once. */
template <int NT>
__device__ static inline void block_sum2(double *a, double *b, double (*sh)[NT]) {
  int t = (int)threadIdx.x;
  sh[0][t] = *a;
  sh[1][t] = *b;
  __syncthreads();
  for (int k = NT / 2; k > 0; k >>= 1) {
    if (t < k) { sh[0][t] += sh[0][t + k]; sh[1][t] += sh[1][t + k]; }
    __syncthreads();
  }
  *a = sh[0][0];
  *b = sh[1][0];
  __syncthreads();
}

/* The same over the COL_Y row lanes (threadIdx.y) of a COL_X x COL_Y block, per column
 * threadIdx.x; the totals land in lane 0. */
__device__ static inline void lane_sum2(double *a, double *b, double (*sh)[COL_Y][COL_X]) {
  int x = (int)threadIdx.x, y = (int)threadIdx.y;
  sh[0][y][x] = *a;
  sh[1][y][x] = *b;
  __syncthreads();
  for (int k = COL_Y / 2; k > 0; k >>= 1) {
    if (y < k) { sh[0][y][x] += sh[0][y + k][x]; sh[1][y][x] += sh[1][y + k][x]; }
    __syncthreads();
  }
  *a = sh[0][0][x];
  *b = sh[1][0][x];
  __syncthreads();
}

/* One block per segment, at most max_blocks (the kernels loop over segments). */
static inline int seg_blocks(const cu_state *s, int64_t S) {
  return S < (int64_t)s->max_blocks ? (int)S : s->max_blocks;
}
/* Column kernels: one block per COL_X columns, at most max_blocks. */
static inline int col_blocks(const cu_state *s, int64_t C) {
  return seg_blocks(s, (C + COL_X - 1) / COL_X);
}

/* ---- reductions: per-block partial sums in double, summed on the host in block order
 * (deterministic for a given grid). The block size must be VL_THREADS. */
__device__ static inline double block_sum(double v, double *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int k = VL_THREADS / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  return sh[0];
}

/* Copy `blocks` partial sums to the host and add them in block order. */
static inline vl_status reduce_finish(vl_ctx *c, cu_state *s, int blocks, double *sum, int *bad) {
  CU_CHECK(c, cudaMemcpyAsync(s->red_host, s->red_dev, sizeof(double) * blocks,
                              cudaMemcpyDeviceToHost, s->stream));
  if (bad)
    CU_CHECK(c, cudaMemcpyAsync(s->bad_host, s->bad_dev, sizeof(int) * blocks,
                                cudaMemcpyDeviceToHost, s->stream));
  CU_CHECK(c, cudaStreamSynchronize(s->stream));
  double acc = 0.0;
  int b = 0;
  for (int i = 0; i < blocks; i++) {
    acc += s->red_host[i];
    if (bad) b |= s->bad_host[i];
  }
  *sum = acc;
  if (bad) *bad = b;
  return VL_OK;
}

static inline int red_blocks(int64_t n) {
  int b;
  vl_cuda_grid(n, VL_THREADS, VL_RED_BLOCKS, &b);
  return b;
}

/* One block per channel, at most max_blocks (the kernels loop over channels). */
static inline int chan_blocks(const cu_state *s, int64_t C) {
  return C < (int64_t)s->max_blocks ? (int)C : s->max_blocks;
}

#endif
