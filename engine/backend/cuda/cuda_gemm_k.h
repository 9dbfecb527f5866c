/* Single-source GEMM helper kernels of the CUDA backend (VL_HD, see kernels/kcommon.h):
 * the .cu wraps them in grid-stride launches, cuda_host.c's reference GEMM and the host
 * tests run the same bodies on the CPU. */
#ifndef VRAMLAB_CUDA_GEMM_K_H
#define VRAMLAB_CUDA_GEMM_K_H

#include "cuda_host.h"
#include "../../kernels/kcommon.h"
#include "../../kernels/nf4.h"

/* Pack element i of a (rows, cols) region at src (element offset off, leading dim ld) into
 * a contiguous (rows, cols) buffer: converts a mixed-dtype GEMM operand for one batch. */
VL_HD static inline void vl_kg_pack(void *dst, int ddt, const void *src, int sdt, int64_t off,
                                    int64_t ld, int64_t cols, int64_t i) {
  int64_t r = i / cols, k = i % cols;
  vl_st(dst, ddt, i, vl_ld(src, sdt, off + r * ld + k));
}

/* Element i of an NF4 buffer of n weights, dequantised into dst (dtype ddt). */
VL_HD static inline void vl_kg_nf4(void *dst, int ddt, const uint8_t *q, int64_t n, int64_t i) {
  vl_st(dst, ddt, i, vl_nf4_get(q, n, i));
}

/* Element idx of a column-major batched GEMM with cuBLAS semantics;
 * idx = (batch * n + j) * m + i for C(i, j) of that batch. beta == 0 does not read C (as
 * cuBLAS: C may hold garbage). Accumulates in fp32. */
VL_HD static inline void vl_kg_colmajor(const vl_cublas_args *a, const void *F, int fdt,
                                        const void *S, int sdt, void *C, int cdt, float alpha,
                                        float beta, int64_t idx) {
  int64_t i = idx % a->m, j = (idx / a->m) % a->n, b = idx / (a->m * a->n);
  int64_t fo = a->first_off + b * a->stride_a, so = a->second_off + b * a->stride_b;
  float acc = 0.0f;
  for (int64_t l = 0; l < a->k; l++) {
    float x = vl_ld(F, fdt, fo + (a->transa == VL_CU_OP_N ? i + l * a->lda : l + i * a->lda));
    float y = vl_ld(S, sdt, so + (a->transb == VL_CU_OP_N ? l + j * a->ldb : j + l * a->ldb));
    acc += x * y;
  }
  int64_t ci = a->c_off + b * a->stride_c + i + j * a->ldc;
  float cv = beta == 0.0f ? 0.0f : beta * vl_ld(C, cdt, ci);
  vl_st(C, cdt, ci, alpha * acc + cv);
}

#endif
