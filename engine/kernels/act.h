/* Element-wise kernels: copies and conversions, axpby, activations (SiLU / GELU /
 * quick-GELU, ReLU, SwiGLU, GEGLU), bias over (outer, C, inner) and the VAE's Gaussian
 * sample. Single-source bodies, one per element, row or channel plane; the CPU backend loops
 * over them with OpenMP (cpu_act.c), the CUDA backend wraps them in grid-stride kernels
 * (cuda_act.cu). */
#ifndef VRAMLAB_K_ACT_H
#define VRAMLAB_K_ACT_H
#include "kcommon.h"

/* ---- ReLU ----------------------------------------------------------------------------- */

/* y = max(x, 0); a NaN stays NaN, as torch.relu. */
VL_HD static inline void vl_k_relu_fwd(void *y, int ydt, const void *x, int xdt, int64_t i) {
  float v = vl_ld(x, xdt, i);
  vl_st(y, ydt, i, v < 0.0f ? 0.0f : v);
}

/* dx = dy where y > 0, else 0 (even when dy is NaN: the unit was off). */
VL_HD static inline void vl_k_relu_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *y,
                                       int ydt, int64_t i) {
  float g = vl_ld(dy, dydt, i);
  vl_st(dx, dxdt, i, vl_ld(y, ydt, i) > 0.0f ? g : 0.0f);
}

/* ---- activations ---------------------------------------------------------------------- */

#define VL_K_QUICK_GELU 1.702f
#define VL_K_SQRT1_2 0.70710678118654752440f   /* 1/sqrt(2) */
#define VL_K_INV_SQRT_2PI 0.39894228040143267794f /* 1/sqrt(2 pi) */

VL_HD static inline float vl_k_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* act(x); act codes are vl_act (ops.h): 0 SiLU, 1 GELU (erf), 2 quick-GELU. */
VL_HD static inline float vl_k_act(int act, float x) {
  if (act == 0) return x * vl_k_sigmoid(x);
  if (act == 1) return 0.5f * x * (1.0f + erff(x * VL_K_SQRT1_2));
  return x * vl_k_sigmoid(VL_K_QUICK_GELU * x);
}

/* act'(x): SiLU s (1 + x (1 - s)); GELU Phi(x) + x phi(x); quick-GELU with a = 1.702:
 * s + a x s (1 - s), s = sigmoid(a x). */
VL_HD static inline float vl_k_act_grad(int act, float x) {
  if (act == 0) {
    float s = vl_k_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
  }
  if (act == 1)
    return 0.5f * (1.0f + erff(x * VL_K_SQRT1_2)) + x * VL_K_INV_SQRT_2PI * expf(-0.5f * x * x);
  float s = vl_k_sigmoid(VL_K_QUICK_GELU * x);
  return s + VL_K_QUICK_GELU * x * s * (1.0f - s);
}

VL_HD static inline void vl_k_act_fwd(void *y, int ydt, const void *x, int xdt, int act,
                                      int64_t i) {
  vl_st(y, ydt, i, vl_k_act(act, vl_ld(x, xdt, i)));
}

/* dx = dy act'(x); dx may alias dy or x (each element reads both first). */
VL_HD static inline void vl_k_act_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *x,
                                      int xdt, int act, int64_t i) {
  float g = vl_ld(dy, dydt, i);
  vl_st(dx, dxdt, i, g * vl_k_act_grad(act, vl_ld(x, xdt, i)));
}

/* ---- GEGLU (diffusers: hidden, gate = h.chunk(2, -1); hidden * gelu(gate)) ------------ */

/* Element (r, f) of out (R, F) from h (R, 2F): value h[r, f], gate h[r, F + f]. */
VL_HD static inline void vl_k_geglu_fwd_at(void *out, int odt, const void *h, int hdt, int64_t F,
                                           int64_t r, int64_t f) {
  int64_t hv = r * 2 * F + f;
  vl_st(out, odt, r * F + f, vl_ld(h, hdt, hv) * vl_k_act(1, vl_ld(h, hdt, hv + F)));
}

/* dh[r, f] = dout gelu(gate), dh[r, F+f] = dout value gelu'(gate); dh may alias h (both
 * halves of the pair are read before either is written). */
VL_HD static inline void vl_k_geglu_bwd_at(void *dh, int dhdt, const void *dout, int ddt,
                                           const void *h, int hdt, int64_t F, int64_t r,
                                           int64_t f) {
  int64_t hv = r * 2 * F + f;
  float v = vl_ld(h, hdt, hv), g = vl_ld(h, hdt, hv + F), d = vl_ld(dout, ddt, r * F + f);
  float dv = d * vl_k_act(1, g), dg = d * v * vl_k_act_grad(1, g);
  vl_st(dh, dhdt, hv, dv);
  vl_st(dh, dhdt, hv + F, dg);
}

/* Per-index forms (CUDA): i = r*F + f. */
VL_HD static inline void vl_k_geglu_fwd(void *out, int odt, const void *h, int hdt, int64_t F,
                                        int64_t i) {
  int64_t r = i / F;
  vl_k_geglu_fwd_at(out, odt, h, hdt, F, r, i - r * F);
}
VL_HD static inline void vl_k_geglu_bwd(void *dh, int dhdt, const void *dout, int ddt,
                                        const void *h, int hdt, int64_t F, int64_t i) {
  int64_t r = i / F;
  vl_k_geglu_bwd_at(dh, dhdt, dout, ddt, h, hdt, F, r, i - r * F);
}

/* ---- bias over (outer, C, inner) -------------------------------------------------------- */

/* y[i] += b[c] (or b[o*C + c] when per_outer), i = (o*C + c)*inner + k. */
VL_HD static inline void vl_k_bias_fwd(void *y, int ydt, const void *b, int bdt, int64_t C,
                                       int64_t inner, int per_outer, int64_t i) {
  int64_t p = i / inner, c = p % C; /* p = o*C + c */
  vl_st(y, ydt, i, vl_ld(y, ydt, i) + vl_ld(b, bdt, per_outer ? p : c));
}

/* The plane p = o*C + c (inner contiguous elements) with its bias value (the CPU). */
VL_HD static inline void vl_k_bias_fwd_plane(void *y, int ydt, const void *b, int bdt, int64_t C,
                                             int64_t inner, int per_outer, int64_t p) {
  float v = vl_ld(b, bdt, per_outer ? p : p % C);
  int64_t o = p * inner;
  for (int64_t k = 0; k < inner; k++) vl_st(y, ydt, o + k, vl_ld(y, ydt, o + k) + v);
}

/* Row o of a (outer, C) view (inner = 1: a linear layer's (R, N)). */
VL_HD static inline void vl_k_bias_fwd_row(void *y, int ydt, const void *b, int bdt, int64_t C,
                                           int per_outer, int64_t o) {
  int64_t bo = per_outer ? o * C : 0;
  for (int64_t c = 0; c < C; c++)
    vl_st(y, ydt, o * C + c, vl_ld(y, ydt, o * C + c) + vl_ld(b, bdt, bo + c));
}

/* Sum of dy over elements j0, j0+step, ... < M of channel c of (outer, C, inner), M =
 * outer*inner (the position walks (o, k)); per_outer: the sum of plane (o, c) alone is the
 * same call with base (o*C + c)*inner, C = 1 and M = inner. */
VL_HD static inline double vl_k_bias_sum_strided(const void *dy, int dydt, int64_t base, int64_t C,
                                                 int64_t inner, int64_t M, int64_t c, int64_t j0,
                                                 int64_t step) {
  double s = 0.0;
  vl_k_cpos p = vl_k_cpos_at(inner, j0, step);
  for (int64_t j = j0; j < M; j += step) {
    s += (double)vl_ld(dy, dydt, base + vl_k_cpos_off(&p, C, inner, c));
    vl_k_cpos_next(&p, inner);
  }
  return s;
}

/* Sum over a contiguous run [o, o+len) (the CPU's planes). */
VL_HD static inline double vl_k_sum_run(const void *x, int xdt, int64_t o, int64_t len) {
  double s = 0.0;
#if defined(_OPENMP) && !defined(__CUDACC__)
#pragma omp simd reduction(+ : s)
#endif
  for (int64_t j = 0; j < len; j++) s += (double)vl_ld(x, xdt, o + j);
  return s;
}

/* Column sums of columns [c0, c0+nc) of (R, C) over rows r0, r0+rstep, ... into s[k]. */
VL_HD static inline void vl_k_colsum(const void *x, int xdt, int64_t R, int64_t C, int64_t c0,
                                     int nc, int64_t r0, int64_t rstep, double *s) {
  for (int64_t r = r0; r < R; r += rstep)
    for (int k = 0; k < nc; k++) s[k] += (double)vl_ld(x, xdt, r * C + c0 + k);
}

/* db[q] = sum, or db[q] += sum when acc. */
VL_HD static inline void vl_k_bias_bwd_store(void *db, int dbdt, int64_t q, double sum, int acc) {
  vl_st(db, dbdt, q, acc ? (float)((double)vl_ld(db, dbdt, q) + sum) : (float)sum);
}

/* ---- the VAE's Gaussian sample ---------------------------------------------------------- */

/* Element i = (n*C + c)*HW + k of z (N, C, HW): mean moments[n, c, k], log-variance
 * moments[n, C + c, k] clamped to [-30, 20], z = scale (mean + exp(logvar/2) noise[i]). */
VL_HD static inline void vl_k_gauss_sample(void *z, int zdt, const void *mom, int mdt,
                                           const void *noise, int ndt, int64_t C, int64_t HW,
                                           float scale, int64_t i) {
  int64_t p = i / HW, k = i - p * HW, n = p / C, c = p - n * C;
  int64_t om = (n * 2 * C + c) * HW + k;
  float lv = vl_ld(mom, mdt, om + C * HW);
  lv = lv < -30.0f ? -30.0f : (lv > 20.0f ? 20.0f : lv);
  vl_st(z, zdt, i, scale * (vl_ld(mom, mdt, om) + expf(0.5f * lv) * vl_ld(noise, ndt, i)));
}

VL_HD static inline void vl_k_convert(void *y, int ydt, const void *x, int xdt, int64_t i) {
  vl_st(y, ydt, i, vl_ld(x, xdt, i));
}

VL_HD static inline void vl_k_axpby(void *y, int ydt, float a, const void *x, int xdt, float b,
                                    int64_t i) {
  float yv = b == 0.0f ? 0.0f : b * vl_ld(y, ydt, i); /* b=0 ignores NaN garbage in y */
  vl_st(y, ydt, i, a * vl_ld(x, xdt, i) + yv);
}

/* out = silu(g) * u */
VL_HD static inline void vl_k_swiglu_fwd(void *out, int odt, const void *g, const void *u,
                                         int dt, int64_t i) {
  float gv = vl_ld(g, dt, i), uv = vl_ld(u, dt, i);
  float s = 1.0f / (1.0f + expf(-gv));
  vl_st(out, odt, i, gv * s * uv);
}

VL_HD static inline void vl_k_swiglu_bwd(void *dg, void *du, int gdt, const void *dout, int odt,
                                         const void *g, const void *u, int dt, int64_t i) {
  float gv = vl_ld(g, dt, i), uv = vl_ld(u, dt, i), d = vl_ld(dout, odt, i);
  float s = 1.0f / (1.0f + expf(-gv));
  vl_st(dg, gdt, i, d * uv * s * (1.0f + gv * (1.0f - s)));
  vl_st(du, gdt, i, d * gv * s);
}

#endif
