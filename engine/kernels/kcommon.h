/* Single-source kernel support (docs/architecture.md "The CUDA backend must be verifiable without a
 * GPU"): every kernel body in engine/kernels/ is a `VL_HD static inline` function; the CPU
 * backend loops over it with OpenMP, the CUDA backend wraps it in a grid-stride kernel.
 * Storage dtypes are read and written through vl_ld/vl_st with fp32 arithmetic. */
#ifndef VRAMLAB_KCOMMON_H
#define VRAMLAB_KCOMMON_H

#include <stdint.h>
#include <math.h>

#if defined(__CUDACC__)
#define VL_HD __host__ __device__
#else
#define VL_HD
#endif

/* On x86 CPUs with F16C the host path converts fp16 in hardware: the same round-to-nearest-
 * even results as the portable code below (test_core checks all 65536 values), 10x faster. */
#if !defined(__CUDACC__) && defined(__F16C__)
#include <immintrin.h>
#define VL_HOST_F16C 1
#endif

/* dtype codes, equal to vl_dtype (kept as int so the header compiles as CUDA C++). */
#define VL_K_F32 0
#define VL_K_F16 1
#define VL_K_BF16 2

/* No-alias promise for kernel pointer arguments (gcc and nvcc both accept __restrict__). */
#define VL_RESTRICT __restrict__

typedef union { float f; uint32_t u; } vl_fu32;

/* fp32 -> fp16, round to nearest even; overflow to inf, NaN stays NaN. The subnormal range
 * is rounded by letting the FPU add a magic constant whose exponent aligns the bits. */
VL_HD static inline uint16_t vl_f2h_sw(float f) {
  vl_fu32 v; v.f = f;
  uint32_t x = v.u;
  uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t o;
  if (x >= (uint32_t)(127 + 16) << 23) {            /* >= 65536, inf or nan */
    o = x > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (x < (uint32_t)113 << 23) {             /* below 2^-14: subnormal half or 0 */
    vl_fu32 magic; magic.u = (uint32_t)((127 - 15) + (23 - 10) + 1) << 23;
    vl_fu32 t; t.u = x;
    t.f += magic.f;
    o = (uint16_t)(t.u - magic.u);
  } else {
    uint32_t odd = (x >> 13) & 1u;
    x += ((uint32_t)(15 - 127) << 23) + 0xfffu;
    x += odd;
    o = (uint16_t)(x >> 13);
  }
  return (uint16_t)(o | (sign >> 16));
}

VL_HD static inline float vl_h2f_sw(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  vl_fu32 v;
  if (e == 0) {
    v.f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24 */
    v.u |= sign;
  } else if (e == 31) {
    v.u = sign | 0x7f800000u | (m << 13);
  } else {
    v.u = sign | ((e + 112) << 23) | (m << 13);
  }
  return v.f;
}

/* The conversions kernels use: hardware F16C on capable x86 hosts, the portable code
 * above everywhere else (CUDA devices included); test_core checks both agree. */
VL_HD static inline uint16_t vl_f2h(float f) {
#ifdef VL_HOST_F16C
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  return vl_f2h_sw(f);
#endif
}

VL_HD static inline float vl_h2f(uint16_t h) {
#ifdef VL_HOST_F16C
  return _cvtsh_ss(h);
#else
  return vl_h2f_sw(h);
#endif
}

VL_HD static inline uint16_t vl_f2bf(float f) {
  vl_fu32 v; v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

VL_HD static inline float vl_bf2f(uint16_t b) {
  vl_fu32 v; v.u = (uint32_t)b << 16;
  return v.f;
}

VL_HD static inline float vl_ld(const void *p, int dt, int64_t i) {
  if (dt == VL_K_F32) return ((const float *)p)[i];
  if (dt == VL_K_F16) return vl_h2f(((const uint16_t *)p)[i]);
  return vl_bf2f(((const uint16_t *)p)[i]);
}

VL_HD static inline void vl_st(void *p, int dt, int64_t i, float x) {
  if (dt == VL_K_F32) ((float *)p)[i] = x;
  else if (dt == VL_K_F16) ((uint16_t *)p)[i] = vl_f2h(x);
  else ((uint16_t *)p)[i] = vl_f2bf(x);
}

/* Round-trip through a storage dtype (what a value becomes once stored). */
VL_HD static inline float vl_round_to(int dt, float x) {
  if (dt == VL_K_F16) return vl_h2f(vl_f2h(x));
  if (dt == VL_K_BF16) return vl_bf2f(vl_f2bf(x));
  return x;
}

/* ---- walking one channel of (N, C, HW) ----------------------------------------------- */

/* Position j = n*HW + i of a channel, advanced by a fixed step without a division per
 * element (64-bit division is slow on GPUs; a CUDA thread steps by the block size). */
typedef struct { int64_t n, i, dn, di; } vl_k_cpos;

VL_HD static inline vl_k_cpos vl_k_cpos_at(int64_t HW, int64_t j, int64_t step) {
  vl_k_cpos p;
  p.n = j / HW; p.i = j - p.n * HW;
  p.dn = step / HW; p.di = step - p.dn * HW;
  return p;
}
VL_HD static inline int64_t vl_k_cpos_off(const vl_k_cpos *p, int64_t C, int64_t HW, int64_t c) {
  return (p->n * C + c) * HW + p->i;
}
VL_HD static inline void vl_k_cpos_next(vl_k_cpos *p, int64_t HW) {
  p->n += p->dn; p->i += p->di;
  if (p->i >= HW) { p->i -= HW; p->n++; }
}

/* The CPU's vectorised double sums (norm.h, act.h): reductions into locals named a1 and a2. */
#if defined(_OPENMP) && !defined(__CUDACC__)
#define VL_K_SIMD_A12 _Pragma("omp simd reduction(+ : a1, a2)")
#else
#define VL_K_SIMD_A12
#endif

#endif
