/* Stable Diffusion's kernels (GroupNorm, LayerNorm, SiLU / GELU / quick-GELU, GEGLU, bias,
 * zero padding, timestep embedding, fused MSE, the VAE's Gaussian sample): single-source
 * bodies, one per element, row, channel or normalised segment. The CPU backend loops over
 * them with OpenMP (cpu_sd.c), the CUDA backend wraps them in grid-stride kernels or one
 * block per segment (cuda_sd.cu). Layout NCHW / row-major.
 *
 * Norms. GroupNorm's group (n, g) and LayerNorm's row r are both a contiguous segment of
 * M elements: M = (C/G)*HW at (n*C + g*C/G)*HW, element j of channel g*C/G + j/HW; a
 * LayerNorm row is the same with C/G = C channels of HW = 1 element. Their statistics are
 * shifted sums in double (the shift K is the segment's first element: no cancellation
 * when |mean| >> std), as batch norm's (cnn.h). Each sum has two forms: over contiguous
 * runs (the CPU, one thread per segment) and over a strided subset j0, j0+step, ... (a
 * CUDA block per segment, one thread per stride, then a tree); both add the same
 * per-element terms and test_sd_ops checks that they agree.
 *
 * Backward of a norm with xhat = (x - mean) rstd, y = xhat gamma_c + beta_c, per segment:
 *   dxhat = dy gamma_c,  sg = sum dxhat,  sgx = sum dxhat (x - mean),
 *   dx = rstd (dxhat - sg/M - (x - mean) rstd^2 sgx/M),
 * and per channel over every segment that holds it: dgamma_c += sum dy xhat,
 * dbeta_c += sum dy. */
#ifndef VRAMLAB_K_SD_H
#define VRAMLAB_K_SD_H
#include "kcommon.h"
#include "cnn.h" /* vl_k_cpos (stepping through channel planes), vl_k_bn_sums_run */

/* The CPU's vectorised double sums: reductions into locals named a1 and a2. */
#if defined(_OPENMP) && !defined(__CUDACC__)
#define VL_K_SIMD_A12 _Pragma("omp simd reduction(+ : a1, a2)")
#else
#define VL_K_SIMD_A12
#endif

/* ---- norms: statistics ---------------------------------------------------------------- */

/* Shifted sums d = x - K, d^2 over elements j0, j0+step, ... < M of the segment at base. */
VL_HD static inline void vl_k_seg_sums_strided(const void *x, int xdt, int64_t base, int64_t M,
                                               float K, int64_t j0, int64_t step, double *s1,
                                               double *s2) {
  for (int64_t j = j0; j < M; j += step) {
    double d = (double)vl_ld(x, xdt, base + j) - (double)K;
    *s1 += d;
    *s2 += d * d;
  }
}

/* Segment s's mean and rstd (biased variance, as nn.GroupNorm / nn.LayerNorm) from its M
 * shifted sums, saved for backward. */
typedef struct { float mean, rstd; } vl_k_stat;

VL_HD static inline vl_k_stat vl_k_seg_finish(float *mean, float *rstd, int64_t s, double s1,
                                              double s2, float K, int64_t M, float eps) {
  double md = s1 / (double)M;
  double var = s2 / (double)M - md * md;
  if (var < 0.0) var = 0.0; /* rounding: a constant segment */
  vl_k_stat st;
  st.mean = (float)((double)K + md);
  st.rstd = (float)(1.0 / sqrt(var + (double)eps));
  mean[s] = st.mean;
  rstd[s] = st.rstd;
  return st;
}

/* ---- norms: forward ------------------------------------------------------------------- */

/* y = (x - mean) rstd gamma_c + beta_c at offset o. */
VL_HD static inline void vl_k_norm_apply(void *y, int ydt, const void *x, int xdt, vl_k_stat st,
                                         const void *gamma, int gdt, const void *beta, int bdt,
                                         int64_t c, int64_t o) {
  float a = st.rstd * vl_ld(gamma, gdt, c);
  vl_st(y, ydt, o, (vl_ld(x, xdt, o) - st.mean) * a + vl_ld(beta, bdt, c));
}

/* GroupNorm (CPU form): channel k of group (n, g) of x (N, C, HW), a contiguous plane. */
VL_HD static inline void vl_k_gn_apply_plane(void *y, int ydt, const void *x, int xdt,
                                             vl_k_stat st, const void *gamma, int gdt,
                                             const void *beta, int bdt, int64_t c, int64_t o,
                                             int64_t HW) {
  float a = st.rstd * vl_ld(gamma, gdt, c), b = vl_ld(beta, bdt, c), m = st.mean;
  for (int64_t i = 0; i < HW; i++) vl_st(y, ydt, o + i, (vl_ld(x, xdt, o + i) - m) * a + b);
}

/* LayerNorm (CPU form): row r of x (R, C), all of it. */
VL_HD static inline void vl_k_ln_fwd_row(void *y, int ydt, float *mean, float *rstd, const void *x,
                                         int xdt, const void *gamma, int gdt, const void *beta,
                                         int bdt, int64_t C, float eps, int64_t r) {
  int64_t o = r * C;
  float K = vl_ld(x, xdt, o);
  double s1 = 0.0, s2 = 0.0;
  vl_k_bn_sums_run(x, xdt, o, C, K, &s1, &s2);
  vl_k_stat st = vl_k_seg_finish(mean, rstd, r, s1, s2, K, C, eps);
  for (int64_t c = 0; c < C; c++)
    vl_k_norm_apply(y, ydt, x, xdt, st, gamma, gdt, beta, bdt, c, o + c);
}

/* ---- norms: backward, dx ---------------------------------------------------------------- */

/* sg += gamma_c sum dy, sgx += gamma_c sum dy (x - mean) over the contiguous run [o, o+len)
 * of one channel (GroupNorm's plane). */
VL_HD static inline void vl_k_norm_bwd_sums_run(const void *dy, int dydt, const void *x, int xdt,
                                                int64_t o, int64_t len, float mean, float g,
                                                double *sg, double *sgx) {
  double a1 = 0.0, a2 = 0.0;
  VL_K_SIMD_A12
  for (int64_t j = 0; j < len; j++) {
    double d = (double)vl_ld(dy, dydt, o + j);
    a1 += d;
    a2 += d * ((double)vl_ld(x, xdt, o + j) - (double)mean);
  }
  *sg += (double)g * a1;
  *sgx += (double)g * a2;
}

/* The same sums over elements j0, j0+step, ... < M of the segment at base whose element j is
 * channel c0 + j/HW: the position walks (channel, i) without a division per element. */
VL_HD static inline void vl_k_norm_bwd_sums_strided(const void *dy, int dydt, const void *x,
                                                    int xdt, const void *gamma, int gdt,
                                                    int64_t base, int64_t M, int64_t HW,
                                                    int64_t c0, float mean, int64_t j0,
                                                    int64_t step, double *sg, double *sgx) {
  vl_k_cpos p = vl_k_cpos_at(HW, j0, step); /* p.n: channel within the segment */
  for (int64_t j = j0; j < M; j += step) {
    double d = (double)vl_ld(dy, dydt, base + j) * (double)vl_ld(gamma, gdt, c0 + p.n);
    *sg += d;
    *sgx += d * ((double)vl_ld(x, xdt, base + j) - (double)mean);
    vl_k_cpos_next(&p, HW);
  }
}

/* dx = rstd (dy gamma_c - k1 - (x - mean) k2), k1 = sg/M, k2 = rstd^2 sgx/M. */
typedef struct { float mean, rstd, k1, k2; } vl_k_norm_grad;

VL_HD static inline vl_k_norm_grad vl_k_norm_bwd_finish(float mean, float rstd, double sg,
                                                        double sgx, int64_t M) {
  vl_k_norm_grad k;
  k.mean = mean;
  k.rstd = rstd;
  k.k1 = (float)(sg / (double)M);
  k.k2 = (float)((double)rstd * (double)rstd * sgx / (double)M);
  return k;
}

/* dx at offset o of channel c; added to what dx holds when acc. */
VL_HD static inline void vl_k_norm_bwd_apply(void *dx, int dxdt, const void *dy, int dydt,
                                             const void *x, int xdt, float g, vl_k_norm_grad k,
                                             int acc, int64_t o) {
  float v = k.rstd * (vl_ld(dy, dydt, o) * g - k.k1 - (vl_ld(x, xdt, o) - k.mean) * k.k2);
  vl_st(dx, dxdt, o, acc ? vl_ld(dx, dxdt, o) + v : v);
}

/* The strided forms of the element passes (a CUDA block over one segment at base, whose
 * element j is channel c0 + j/HW): forward y, and backward dx. */
VL_HD static inline void vl_k_norm_fwd_strided(void *y, int ydt, const void *x, int xdt,
                                               vl_k_stat st, const void *gamma, int gdt,
                                               const void *beta, int bdt, int64_t base,
                                               int64_t M, int64_t HW, int64_t c0, int64_t j0,
                                               int64_t step) {
  vl_k_cpos p = vl_k_cpos_at(HW, j0, step);
  for (int64_t j = j0; j < M; j += step) {
    vl_k_norm_apply(y, ydt, x, xdt, st, gamma, gdt, beta, bdt, c0 + p.n, base + j);
    vl_k_cpos_next(&p, HW);
  }
}

VL_HD static inline void vl_k_norm_bwd_strided(void *dx, int dxdt, const void *dy, int dydt,
                                               const void *x, int xdt, const void *gamma, int gdt,
                                               vl_k_norm_grad k, int acc, int64_t base, int64_t M,
                                               int64_t HW, int64_t c0, int64_t j0, int64_t step) {
  vl_k_cpos p = vl_k_cpos_at(HW, j0, step);
  for (int64_t j = j0; j < M; j += step) {
    vl_k_norm_bwd_apply(dx, dxdt, dy, dydt, x, xdt, vl_ld(gamma, gdt, c0 + p.n), k, acc,
                        base + j);
    vl_k_cpos_next(&p, HW);
  }
}

/* LayerNorm (CPU form): dx of row r of (R, C). */
VL_HD static inline void vl_k_ln_bwd_row(void *dx, int dxdt, const void *dy, int dydt,
                                         const void *x, int xdt, const void *gamma, int gdt,
                                         const float *mean, const float *rstd, int64_t C,
                                         int acc, int64_t r) {
  int64_t o = r * C;
  float m = mean[r];
  double a1 = 0.0, a2 = 0.0; /* sg, sgx */
  VL_K_SIMD_A12
  for (int64_t c = 0; c < C; c++) {
    double d = (double)vl_ld(dy, dydt, o + c) * (double)vl_ld(gamma, gdt, c);
    a1 += d;
    a2 += d * ((double)vl_ld(x, xdt, o + c) - (double)m);
  }
  vl_k_norm_grad k = vl_k_norm_bwd_finish(m, rstd[r], a1, a2, C);
  for (int64_t c = 0; c < C; c++)
    vl_k_norm_bwd_apply(dx, dxdt, dy, dydt, x, xdt, vl_ld(gamma, gdt, c), k, acc, o + c);
}

/* ---- norms: backward, dgamma and dbeta ------------------------------------------------ */

/* sum dy and sum dy (x - mean) rstd over a contiguous run [o, o+len) with one segment's
 * statistics (GroupNorm: plane (n, c)). */
VL_HD static inline void vl_k_norm_dgb_run(const void *dy, int dydt, const void *x, int xdt,
                                           int64_t o, int64_t len, float mean, float rstd,
                                           double *sb, double *sgm) {
  double a1 = 0.0, a2 = 0.0;
  VL_K_SIMD_A12
  for (int64_t j = 0; j < len; j++) {
    double d = (double)vl_ld(dy, dydt, o + j);
    a1 += d;
    a2 += d * ((double)vl_ld(x, xdt, o + j) - (double)mean);
  }
  *sb += a1;
  *sgm += (double)rstd * a2;
}

/* GroupNorm, channel c of (N, C, HW) in G groups of cpg channels: positions j0, j0+step, ...
 * < M = N*HW of the channel, each with its sample's statistics (n*G + c/cpg). */
VL_HD static inline void vl_k_gn_dgb_strided(const void *dy, int dydt, const void *x, int xdt,
                                             const float *mean, const float *rstd, int64_t C,
                                             int64_t HW, int64_t M, int64_t G, int64_t cpg,
                                             int64_t c, int64_t j0, int64_t step, double *sb,
                                             double *sgm) {
  int64_t g = c / cpg;
  vl_k_cpos p = vl_k_cpos_at(HW, j0, step);
  for (int64_t j = j0; j < M; j += step) {
    int64_t o = vl_k_cpos_off(&p, C, HW, c), s = p.n * G + g;
    double d = (double)vl_ld(dy, dydt, o);
    *sb += d;
    *sgm += d * ((double)vl_ld(x, xdt, o) - (double)mean[s]) * (double)rstd[s];
    vl_k_cpos_next(&p, HW);
  }
}

/* LayerNorm, columns [c0, c0+nc) of (R, C) over rows r0, r0+rstep, ... < R: sums per column
 * into sb[k], sgm[k] (k < nc). The CPU takes 16 columns (a cache line) per call over
 * every row, a CUDA thread one column over a strided subset of rows. */
VL_HD static inline void vl_k_ln_dgb_cols(const void *dy, int dydt, const void *x, int xdt,
                                          const float *mean, const float *rstd, int64_t R,
                                          int64_t C, int64_t c0, int nc, int64_t r0,
                                          int64_t rstep, double *sb, double *sgm) {
  for (int64_t r = r0; r < R; r += rstep) {
    double m = (double)mean[r], rs = (double)rstd[r];
    for (int k = 0; k < nc; k++) {
      double d = (double)vl_ld(dy, dydt, r * C + c0 + k);
      sb[k] += d;
      sgm[k] += d * ((double)vl_ld(x, xdt, r * C + c0 + k) - m) * rs;
    }
  }
}

/* dgamma_c += sgm, dbeta_c += sb (either may be NULL: frozen). */
VL_HD static inline void vl_k_norm_dgb_finish(void *dgamma, int dgdt, void *dbeta, int dbdt,
                                              int64_t c, double sb, double sgm) {
  if (dgamma) vl_st(dgamma, dgdt, c, vl_ld(dgamma, dgdt, c) + (float)sgm);
  if (dbeta) vl_st(dbeta, dbdt, c, vl_ld(dbeta, dbdt, c) + (float)sb);
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

/* ---- zero padding --------------------------------------------------------------------- */

/* Output (pl, oh, ow) of (planes, H+t+b, W+l+r): x[pl, oh-t, ow-l] inside, else 0. */
typedef struct { int64_t H, W, OH, OW; int top, left; } vl_k_pad;

VL_HD static inline void vl_k_pad_fwd_at(void *y, int ydt, const void *x, int xdt, vl_k_pad g,
                                         int64_t pl, int64_t oh, int64_t ow) {
  int64_t h = oh - g.top, w = ow - g.left;
  float v = h >= 0 && h < g.H && w >= 0 && w < g.W ? vl_ld(x, xdt, (pl * g.H + h) * g.W + w) : 0.0f;
  vl_st(y, ydt, (pl * g.OH + oh) * g.OW + ow, v);
}

/* Backward (the crop): dx[pl, h, w] = dy[pl, h+t, w+l]. */
VL_HD static inline void vl_k_pad_bwd_at(void *dx, int dxdt, const void *dy, int dydt, vl_k_pad g,
                                         int64_t pl, int64_t h, int64_t w) {
  vl_st(dx, dxdt, (pl * g.H + h) * g.W + w,
        vl_ld(dy, dydt, (pl * g.OH + h + g.top) * g.OW + w + g.left));
}

VL_HD static inline void vl_k_pad_fwd(void *y, int ydt, const void *x, int xdt, vl_k_pad g,
                                      int64_t i) {
  int64_t pl = i / (g.OH * g.OW), r = i - pl * (g.OH * g.OW), oh = r / g.OW;
  vl_k_pad_fwd_at(y, ydt, x, xdt, g, pl, oh, r - oh * g.OW);
}
VL_HD static inline void vl_k_pad_bwd(void *dx, int dxdt, const void *dy, int dydt, vl_k_pad g,
                                      int64_t i) {
  int64_t pl = i / (g.H * g.W), r = i - pl * (g.H * g.W), h = r / g.W;
  vl_k_pad_bwd_at(dx, dxdt, dy, dydt, g, pl, h, r - h * g.W);
}

/* ---- timestep embedding (diffusers' get_timestep_embedding) ----------------------------- */

/* Element i = b*dim + k of emb (B, dim), half = dim/2, j = k mod half:
 * e = t[b] exp(-ln(max_period) j / (half - shift)), in fp32 as diffusers computes it;
 * the first half is sin e and the second cos e, swapped when flip. */
VL_HD static inline void vl_k_timestep_embed(void *emb, int edt, const int32_t *t, int64_t dim,
                                             int flip, float shift, float max_period, int64_t i) {
  int64_t b = i / dim, k = i - b * dim, half = dim / 2;
  int second = k >= half;
  int64_t j = second ? k - half : k;
  float ex = -logf(max_period) * (float)j;
  ex = ex / ((float)half - shift);
  float e = (float)t[b] * expf(ex);
  int use_cos = second != (flip != 0);
  vl_st(emb, edt, i, use_cos ? cosf(e) : sinf(e));
}

/* ---- fused MSE ----------------------------------------------------------------------- */

/* Element o: (pred - target)^2 into the row's sum; pred := s * 2 (pred - target). */
VL_HD static inline double vl_k_mse_elem(void *pred, int pdt, const void *target, int tdt, float s,
                                         int64_t o) {
  float d = vl_ld(pred, pdt, o) - vl_ld(target, tdt, o);
  vl_st(pred, pdt, o, s * 2.0f * d);
  return (double)d * (double)d;
}

/* Row r of (R, C) (the CPU; a CUDA block strides the row with the element body). */
VL_HD static inline void vl_k_mse_row(void *pred, int pdt, float *loss, const void *target,
                                      int tdt, int64_t C, float s, int64_t r) {
  double acc = 0.0;
  for (int64_t c = 0; c < C; c++) acc += vl_k_mse_elem(pred, pdt, target, tdt, s, r * C + c);
  loss[r] = (float)acc;
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

#endif
