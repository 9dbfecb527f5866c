/* GEMM workspace rules, pure functions of the call (the planner uses them too).
 * CPU: OpenBLAS sgemm is fp32-only, so every non-fp32 operand (and a non-fp32 C) is
 * converted into fp32 scratch, one batch at a time; an NF4 B is dequantised whole.
 * CUDA: see vl_cuda_gemm_plan_make (NF4 dequantised to A's type as bitsandbytes does for
 * training; mixed A/B types converted to fp32 when cuBLAS can write C, else the generic
 * kernel reads them as they are). The cuBLAS workspace is fixed and taken at init. */
#include "vramlab/backend.h"
#include "cuda/cuda_host.h"

size_t vl_gemm_ws_cpu(const vl_gemm *g) {
  size_t ws = 0;
  if (g->A->dtype != VL_F32) ws += 4 * (size_t)(g->M * g->K);
  if (g->B->dtype == VL_NF4) ws += 4 * (size_t)g->B->n;
  else if (g->B->dtype != VL_F32) ws += 4 * (size_t)(g->K * g->N);
  if (g->C->dtype != VL_F32) ws += 4 * (size_t)(g->M * g->N);
  return ws;
}

/* The CUDA rule is whatever the CUDA backend's GEMM plan needs (cuda_host.c, pure C and
 * compiled in every build), so the planner and the backend cannot drift apart. */
size_t vl_gemm_ws_cuda(const vl_gemm *g) {
  vl_cuda_gemm_plan p;
  return vl_cuda_gemm_plan_make(g, &p) == VL_OK ? p.ws_need : 0;
}
