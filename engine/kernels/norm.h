/* Normalisation kernels (RMSNorm, LayerNorm, GroupNorm, batch norm): single-source bodies,
 * one per row, channel or normalised segment. The CPU backend loops over them with OpenMP
 * (cpu_norm.c), the CUDA backend wraps them in grid-stride kernels or one block per segment
 * (cuda_norm.cu). Layout NCHW / row-major.
 *
 * GroupNorm's group (n, g) and LayerNorm's row r are both a contiguous segment of M elements:
 * M = (C/G)*HW at (n*C + g*C/G)*HW, element j of channel g*C/G + j/HW; a LayerNorm row is the
 * same with C/G = C channels of HW = 1 element. Their statistics, like batch norm's (whose
 * per-channel sums run over N*HW elements, which can be millions), are shifted sums in double
 * (the shift K is the segment's or channel's first element: no cancellation when
 * |mean| >> std). Each sum has two forms: over contiguous runs (the CPU, one thread per
 * segment or channel) and over a strided subset j0, j0+step, ... (a CUDA block per segment or
 * channel, one thread per stride, then a tree); both add the same per-element terms and
 * test_sd_ops / test_cnn_ops check that they agree.
 *
 * Backward of a norm with xhat = (x - mean) rstd, y = xhat gamma_c + beta_c, per segment:
 *   dxhat = dy gamma_c,  sg = sum dxhat,  sgx = sum dxhat (x - mean),
 *   dx = rstd (dxhat - sg/M - (x - mean) rstd^2 sgx/M),
 * and per channel over every segment that holds it: dgamma_c += sum dy xhat,
 * dbeta_c += sum dy. */
#ifndef VRAMLAB_K_NORM_H
#define VRAMLAB_K_NORM_H
#include "kcommon.h"

/* RMSNorm (Mistral): out = x / sqrt(mean(x^2) + eps) * w ; rstd[r] kept for backward. */
VL_HD static inline void vl_k_rmsnorm_fwd_row(void *out, int odt, float *rstd, const void *x,
                                              int xdt, const void *w, int wdt, int64_t C,
                                              float eps, int64_t r) {
  float ss = 0.0f;
  for (int64_t c = 0; c < C; c++) { float v = vl_ld(x, xdt, r * C + c); ss += v * v; }
  float rs = 1.0f / sqrtf(ss / (float)C + eps);
  rstd[r] = rs;
  for (int64_t c = 0; c < C; c++)
    vl_st(out, odt, r * C + c, vl_ld(x, xdt, r * C + c) * rs * vl_ld(w, wdt, c));
}

/* dx[r] += rstd*w*dy - rstd^3/C * x * sum(dy*w*x) */
VL_HD static inline void vl_k_rmsnorm_bwd_row(void *dx, int dxdt, const void *dy, int dydt,
                                              const void *x, int xdt, const void *w, int wdt,
                                              const float *rstd, int64_t C, int64_t r) {
  float rs = rstd[r], dot = 0.0f;
  for (int64_t c = 0; c < C; c++)
    dot += vl_ld(dy, dydt, r * C + c) * vl_ld(w, wdt, c) * vl_ld(x, xdt, r * C + c);
  float k = rs * rs * rs * dot / (float)C;
  for (int64_t c = 0; c < C; c++) {
    int64_t i = r * C + c;
    float g = rs * vl_ld(w, wdt, c) * vl_ld(dy, dydt, i) - k * vl_ld(x, xdt, i);
    vl_st(dx, dxdt, i, vl_ld(dx, dxdt, i) + g);
  }
}

/* Row r's term of dw[c]. */
VL_HD static inline float vl_k_rmsnorm_dw_term(const void *dy, int dydt, const void *x, int xdt,
                                               const float *rstd, int64_t C, int64_t r,
                                               int64_t c) {
  return vl_ld(dy, dydt, r * C + c) * vl_ld(x, xdt, r * C + c) * rstd[r];
}

/* dw[c] += sum_r dy[r,c] * x[r,c] * rstd[r], the sum in row order from 0. (The CPU takes
 * blocks of columns row by row: the same sums in the same order.) */
VL_HD static inline void vl_k_rmsnorm_dw_col(void *dw, int dwdt, const void *dy, int dydt,
                                             const void *x, int xdt, const float *rstd,
                                             int64_t R, int64_t C, int64_t c) {
  float acc = 0.0f;
  for (int64_t r = 0; r < R; r++) acc += vl_k_rmsnorm_dw_term(dy, dydt, x, xdt, rstd, C, r, c);
  vl_st(dw, dwdt, c, vl_ld(dw, dwdt, c) + acc);
}

/* ---- batch norm ------------------------------------------------------------------------ */

/* The shift of channel c's sums: its first element. Sums of (x - K) and (x - K)^2 give the
 * variance without the cancellation of E[x^2] - E[x]^2 when |mean| >> std. */
VL_HD static inline float vl_k_bn_shift(const void *x, int xdt, int64_t HW, int64_t c) {
  return vl_ld(x, xdt, c * HW);
}

/* Sums of d = x - K and d^2 over the contiguous run x[o, o+len). */
VL_HD static inline void vl_k_bn_sums_run(const void *x, int xdt, int64_t o, int64_t len, float K,
                                          double *s1, double *s2) {
  double a1 = 0.0, a2 = 0.0;
#if defined(_OPENMP) && !defined(__CUDACC__)
#pragma omp simd reduction(+ : a1, a2)
#endif
  for (int64_t j = 0; j < len; j++) {
    double d = (double)vl_ld(x, xdt, o + j) - (double)K;
    a1 += d;
    a2 += d * d;
  }
  *s1 += a1;
  *s2 += a2;
}

/* The same sums over positions j0, j0+step, ... < N*HW of channel c. */
VL_HD static inline void vl_k_bn_sums_strided(const void *x, int xdt, int64_t C, int64_t HW,
                                              int64_t M, int64_t c, float K, int64_t j0,
                                              int64_t step, double *s1, double *s2) {
  vl_k_cpos p = vl_k_cpos_at(HW, j0, step);
  for (int64_t j = j0; j < M; j += step) {
    double d = (double)vl_ld(x, xdt, vl_k_cpos_off(&p, C, HW, c)) - (double)K;
    *s1 += d;
    *s2 += d * d;
    vl_k_cpos_next(&p, HW);
  }
}

/* y = (x - mean) * scale + beta with scale = rstd * gamma: training and evaluation. */
typedef struct { float mean, scale, beta; } vl_k_bn_affine;

VL_HD static inline vl_k_bn_affine vl_k_bn_affine_of(float mean, float rstd, const void *gamma,
                                                     int gdt, const void *beta, int bdt,
                                                     int64_t c) {
  vl_k_bn_affine a;
  a.mean = mean;
  a.scale = rstd * vl_ld(gamma, gdt, c);
  a.beta = vl_ld(beta, bdt, c);
  return a;
}

/* Channel c's batch statistics from its M = N*HW shifted sums: mean and rstd (biased
 * variance, as the normalisation uses) saved for backward; the running statistics updated
 * as PyTorch does, the variance unbiased (M/(M-1), M >= 2 checked by the caller). */
VL_HD static inline vl_k_bn_affine vl_k_bn_train_finish(float *mean, float *rstd, float *rmean,
                                                        float *rvar, const void *gamma, int gdt,
                                                        const void *beta, int bdt, int64_t c,
                                                        double s1, double s2, float K,
                                                        int64_t M, float eps, float momentum) {
  double md = s1 / (double)M;
  double var = s2 / (double)M - md * md;
  if (var < 0.0) var = 0.0; /* rounding: a constant channel */
  float mu = (float)((double)K + md);
  float rs = (float)(1.0 / sqrt(var + (double)eps));
  mean[c] = mu;
  rstd[c] = rs;
  if (rmean) rmean[c] = (1.0f - momentum) * rmean[c] + momentum * mu;
  if (rvar)
    rvar[c] = (1.0f - momentum) * rvar[c] + momentum * (float)(var * (double)M / (double)(M - 1));
  return vl_k_bn_affine_of(mu, rs, gamma, gdt, beta, bdt, c);
}

/* Evaluation mode: the running statistics of channel c. */
VL_HD static inline vl_k_bn_affine vl_k_bn_eval_affine(const float *rmean, const float *rvar,
                                                       const void *gamma, int gdt,
                                                       const void *beta, int bdt, float eps,
                                                       int64_t c) {
  return vl_k_bn_affine_of(rmean[c], 1.0f / sqrtf(rvar[c] + eps), gamma, gdt, beta, bdt, c);
}

/* One element at offset o. */
VL_HD static inline void vl_k_bn_apply(void *y, int ydt, const void *x, int xdt,
                                       vl_k_bn_affine a, int64_t o) {
  vl_st(y, ydt, o, (vl_ld(x, xdt, o) - a.mean) * a.scale + a.beta);
}

/* Evaluation mode, element i of (N, C, HW): the per-element form (CUDA). */
VL_HD static inline void vl_k_bn_eval_elem(void *y, int ydt, const void *x, int xdt,
                                           const float *rmean, const float *rvar,
                                           const void *gamma, int gdt, const void *beta, int bdt,
                                           int64_t C, int64_t HW, float eps, int64_t i) {
  int64_t c = (i / HW) % C;
  vl_k_bn_apply(y, ydt, x, xdt, vl_k_bn_eval_affine(rmean, rvar, gamma, gdt, beta, bdt, eps, c), i);
}

/* Backward sums of channel c: sum dy and sum dy*(x - mean), over a contiguous run ... */
VL_HD static inline void vl_k_bn_bwd_sums_run(const void *dy, int dydt, const void *x, int xdt,
                                              int64_t o, int64_t len, float mean, double *sg,
                                              double *sgx) {
  double a1 = 0.0, a2 = 0.0;
#if defined(_OPENMP) && !defined(__CUDACC__)
#pragma omp simd reduction(+ : a1, a2)
#endif
  for (int64_t j = 0; j < len; j++) {
    double g = (double)vl_ld(dy, dydt, o + j);
    a1 += g;
    a2 += g * ((double)vl_ld(x, xdt, o + j) - (double)mean);
  }
  *sg += a1;
  *sgx += a2;
}

/* ... and over positions j0, j0+step, ... < N*HW. */
VL_HD static inline void vl_k_bn_bwd_sums_strided(const void *dy, int dydt, const void *x, int xdt,
                                                  int64_t C, int64_t HW, int64_t M, int64_t c,
                                                  float mean, int64_t j0, int64_t step,
                                                  double *sg, double *sgx) {
  vl_k_cpos p = vl_k_cpos_at(HW, j0, step);
  for (int64_t j = j0; j < M; j += step) {
    int64_t o = vl_k_cpos_off(&p, C, HW, c);
    double g = (double)vl_ld(dy, dydt, o);
    *sg += g;
    *sgx += g * ((double)vl_ld(x, xdt, o) - (double)mean);
    vl_k_cpos_next(&p, HW);
  }
}

/* With xhat = (x - mean) rstd and the sums above:
 *   dgamma += rstd * sum(dy (x-mean)),  dbeta += sum(dy),
 *   dx = gamma rstd (dy - sum(dy)/M - xhat * dgamma_c/M)
 *      = a (dy - k1 - (x - mean) k2),  a = gamma rstd, k1 = sum(dy)/M,
 *                                      k2 = rstd^2 sum(dy (x-mean))/M. */
typedef struct { float mean, a, k1, k2; } vl_k_bn_grad;

VL_HD static inline vl_k_bn_grad vl_k_bn_bwd_finish(void *dgamma, int dgdt, void *dbeta, int dbdt,
                                                    const void *gamma, int gdt, const float *mean,
                                                    const float *rstd, int64_t c, double sg,
                                                    double sgx, int64_t M) {
  double rs = (double)rstd[c];
  if (dgamma) vl_st(dgamma, dgdt, c, vl_ld(dgamma, dgdt, c) + (float)(rs * sgx));
  if (dbeta) vl_st(dbeta, dbdt, c, vl_ld(dbeta, dbdt, c) + (float)sg);
  vl_k_bn_grad k;
  k.mean = mean[c];
  k.a = (float)(rs * (double)vl_ld(gamma, gdt, c));
  k.k1 = (float)(sg / (double)M);
  k.k2 = (float)(rs * rs * sgx / (double)M);
  return k;
}

/* dx at offset o; dx may alias dy (each element reads its own dy first). */
VL_HD static inline void vl_k_bn_bwd_apply(void *dx, int dxdt, const void *dy, int dydt,
                                           const void *x, int xdt, vl_k_bn_grad k, int64_t o) {
  float g = vl_ld(dy, dydt, o);
  vl_st(dx, dxdt, o, k.a * (g - k.k1 - (vl_ld(x, xdt, o) - k.mean) * k.k2));
}

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

#endif
