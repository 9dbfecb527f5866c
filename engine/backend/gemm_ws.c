/* GEMM workspace rules, pure functions of the call (the planner uses them too).
 * CPU: OpenBLAS sgemm is fp32-only, so every non-fp32 operand (and a non-fp32 C) is
 * converted into fp32 scratch, one batch at a time; an NF4 B is dequantised whole.
 * CUDA: cublasGemmEx takes fp16/bf16/fp32 directly when A and B share a type; NF4 is
 * dequantised to A's type (fp16/bf16, as bitsandbytes does for training), mixed A/B types
 * are converted to fp32. The cuBLAS workspace itself is fixed and taken at init (fixed_ws_bytes). */
#include "vramlab/backend.h"

static size_t region(bool t, int64_t rows, int64_t cols) { (void)t; return (size_t)(rows * cols); }

size_t vl_gemm_ws_cpu(const vl_gemm *g) {
  size_t ws = 0;
  if (g->A->dtype != VL_F32) ws += 4 * region(g->ta, g->M, g->K);
  if (g->B->dtype == VL_NF4) ws += 4 * (size_t)g->B->n;
  else if (g->B->dtype != VL_F32) ws += 4 * region(g->tb, g->K, g->N);
  if (g->C->dtype != VL_F32) ws += 4 * region(false, g->M, g->N);
  return ws;
}

size_t vl_gemm_ws_cuda(const vl_gemm *g) {
  size_t ws = 0;
  vl_dtype a = g->A->dtype, b = g->B->dtype;
  /* NF4 is dequantised to A's type (2 bytes a weight for fp16/bf16 A, 4 for fp32) */
  if (b == VL_NF4) return (a == VL_F32 ? 4 : 2) * (size_t)g->B->n;
  if (a != b) {
    if (a != VL_F32) ws += 4 * region(g->ta, g->M, g->K);
    if (b != VL_F32) ws += 4 * region(g->tb, g->K, g->N);
  }
  return ws;
}
