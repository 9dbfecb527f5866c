/* Convolutional-network kernels (batch norm, ReLU, max pooling, bilinear and nearest 2x
 * upsampling, channel copy, per-pixel cross-entropy): single-source bodies, one per element,
 * channel, plane or pixel. The CPU backend loops over them with OpenMP (cpu_cnn.c), the CUDA
 * backend wraps them in grid-stride kernels (cuda_cnn.cu). Layout NCHW, row-major.
 *
 * Per-channel batch-norm sums run over N*HW elements, which can be millions: they are
 * accumulated in double. Two forms of each sum exist: over a contiguous run of one plane
 * (the CPU walks a channel plane by plane) and over a strided subset j0, j0+step, ... of
 * the channel's N*HW positions (a CUDA block sums one channel, one thread per stride);
 * both add the same per-element terms, and test_cnn_ops checks they agree. */
#ifndef VRAMLAB_K_CNN_H
#define VRAMLAB_K_CNN_H
#include "kcommon.h"

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

/* ---- max pooling -------------------------------------------------------------------------- */

/* Offset in the plane (h*W + w) of the maximum of output (oh, ow)'s k x k window, or -1 for
 * a window entirely in the padding. Padding is skipped, never compared; rows then columns,
 * a later element wins only when strictly greater or NaN: PyTorch's CPU order, so ties go to
 * the first maximum and a NaN propagates. */
VL_HD static inline int64_t vl_k_pool_argmax(const void *x, int xdt, int64_t base, int64_t H,
                                             int64_t W, int k, int stride, int pad, int64_t oh,
                                             int64_t ow, float *vmax) {
  int64_t h0 = oh * stride - pad, w0 = ow * stride - pad;
  int64_t hs = h0 < 0 ? 0 : h0, he = h0 + k < H ? h0 + k : H;
  int64_t ws = w0 < 0 ? 0 : w0, we = w0 + k < W ? w0 + k : W;
  if (hs >= he || ws >= we) { *vmax = -INFINITY; return -1; }
  int64_t best = hs * W + ws;
  float m = vl_ld(x, xdt, base + best);
  for (int64_t h = hs; h < he; h++)
    for (int64_t w = ws; w < we; w++) {
      float v = vl_ld(x, xdt, base + h * W + w);
      int take = (v > m) | (v != v); /* branch-free: the comparison is data-dependent */
      best = take ? h * W + w : best;
      m = take ? v : m;
    }
  *vmax = m;
  return best;
}

/* Output (pl, oh, ow) of (planes, P, Q). The per-index forms below decompose a flat index
 * (CUDA); the CPU walks rows and calls the coordinate forms (no divisions per element). */
VL_HD static inline void vl_k_maxpool_fwd_at(void *y, int ydt, const void *x, int xdt, int64_t H,
                                             int64_t W, int k, int stride, int pad, int64_t P,
                                             int64_t Q, int64_t pl, int64_t oh, int64_t ow) {
  float m;
  (void)vl_k_pool_argmax(x, xdt, pl * H * W, H, W, k, stride, pad, oh, ow, &m);
  vl_st(y, ydt, (pl * P + oh) * Q + ow, m);
}

VL_HD static inline void vl_k_maxpool_fwd(void *y, int ydt, const void *x, int xdt, int64_t H,
                                          int64_t W, int k, int stride, int pad, int64_t P,
                                          int64_t Q, int64_t i) {
  int64_t pl = i / (P * Q), r = i - pl * (P * Q), oh = r / Q;
  vl_k_maxpool_fwd_at(y, ydt, x, xdt, H, W, k, stride, pad, P, Q, pl, oh, r - oh * Q);
}

/* Backward as a gather, input (pl, h, w): the sum of dy over the outputs whose window has
 * its maximum here, in row-major output order. No atomics and no conflicts, so every
 * element is one independent thread (CUDA). */
VL_HD static inline void vl_k_maxpool_bwd_gather_at(void *dx, int dxdt, const void *dy, int dydt,
                                                    const void *x, int xdt, int64_t H, int64_t W,
                                                    int k, int stride, int pad, int64_t P,
                                                    int64_t Q, int64_t pl, int64_t h, int64_t w) {
  /* outputs whose window [o*stride - pad, o*stride - pad + k) contains h (resp. w) */
  int64_t lo_h = h + pad - k + 1, lo_w = w + pad - k + 1;
  int64_t oh0 = lo_h <= 0 ? 0 : (lo_h + stride - 1) / stride, oh1 = (h + pad) / stride;
  int64_t ow0 = lo_w <= 0 ? 0 : (lo_w + stride - 1) / stride, ow1 = (w + pad) / stride;
  if (oh1 > P - 1) oh1 = P - 1;
  if (ow1 > Q - 1) ow1 = Q - 1;
  int64_t r = h * W + w;
  float acc = 0.0f, m;
  for (int64_t oh = oh0; oh <= oh1; oh++)
    for (int64_t ow = ow0; ow <= ow1; ow++)
      if (vl_k_pool_argmax(x, xdt, pl * H * W, H, W, k, stride, pad, oh, ow, &m) == r)
        acc += vl_ld(dy, dydt, (pl * P + oh) * Q + ow);
  vl_st(dx, dxdt, pl * H * W + r, acc);
}

VL_HD static inline void vl_k_maxpool_bwd_gather(void *dx, int dxdt, const void *dy, int dydt,
                                                 const void *x, int xdt, int64_t H, int64_t W,
                                                 int k, int stride, int pad, int64_t P,
                                                 int64_t Q, int64_t i) {
  int64_t pl = i / (H * W), r = i - pl * (H * W), h = r / W;
  vl_k_maxpool_bwd_gather_at(dx, dxdt, dy, dydt, x, xdt, H, W, k, stride, pad, P, Q, pl, h,
                             r - h * W);
}

/* Backward as a scatter over plane pl (one thread per plane: the CPU). With an fp32 dx it
 * adds the same values in the same order as the gather, so the two agree bit for bit; with
 * fp16/bf16 dx the gather rounds once and this after each add, so use the gather there. */
VL_HD static inline void vl_k_maxpool_bwd_plane(void *dx, int dxdt, const void *dy, int dydt,
                                                const void *x, int xdt, int64_t H, int64_t W,
                                                int k, int stride, int pad, int64_t P, int64_t Q,
                                                int64_t pl) {
  int64_t base = pl * H * W;
  for (int64_t r = 0; r < H * W; r++) vl_st(dx, dxdt, base + r, 0.0f);
  float m;
  for (int64_t oh = 0; oh < P; oh++)
    for (int64_t ow = 0; ow < Q; ow++) {
      int64_t a = vl_k_pool_argmax(x, xdt, base, H, W, k, stride, pad, oh, ow, &m);
      if (a >= 0)
        vl_st(dx, dxdt, base + a,
              vl_ld(dx, dxdt, base + a) + vl_ld(dy, dydt, (pl * P + oh) * Q + ow));
    }
}

/* ---- bilinear 2x upsampling (align_corners=False) ----------------------------------------- */

/* Source of output d along a dimension of n inputs, as PyTorch's upsample_bilinear2d: the
 * centre-aligned coordinate (d + 0.5)/2 - 0.5, clamped at 0 on the left; i1 stays at the
 * last input on the right. */
typedef struct { int64_t i0, i1; float l0, l1; } vl_k_up_src;

VL_HD static inline vl_k_up_src vl_k_up2_src(int64_t d, int64_t n) {
  float s = 0.5f * ((float)d + 0.5f) - 0.5f;
  if (s < 0.0f) s = 0.0f;
  vl_k_up_src r;
  r.i0 = (int64_t)s;
  if (r.i0 > n - 1) r.i0 = n - 1;
  r.i1 = r.i0 + (r.i0 < n - 1 ? 1 : 0);
  r.l1 = s - (float)r.i0;
  r.l0 = 1.0f - r.l1;
  return r;
}

/* Output (pl, oh, ow) of (planes, 2H, 2W) from its row and column sources; the same with
 * the sources computed here; and its per-index form. (The CPU computes each row's and each
 * column's source once per call.) */
VL_HD static inline void vl_k_up2_fwd_from(void *y, int ydt, const void *x, int xdt, int64_t H,
                                           int64_t W, int64_t pl, int64_t oh, int64_t ow,
                                           vl_k_up_src sh, vl_k_up_src sw) {
  int64_t b = pl * H * W;
  float v00 = vl_ld(x, xdt, b + sh.i0 * W + sw.i0), v01 = vl_ld(x, xdt, b + sh.i0 * W + sw.i1);
  float v10 = vl_ld(x, xdt, b + sh.i1 * W + sw.i0), v11 = vl_ld(x, xdt, b + sh.i1 * W + sw.i1);
  vl_st(y, ydt, (pl * 2 * H + oh) * 2 * W + ow,
        sh.l0 * (sw.l0 * v00 + sw.l1 * v01) + sh.l1 * (sw.l0 * v10 + sw.l1 * v11));
}

VL_HD static inline void vl_k_up2_fwd_at(void *y, int ydt, const void *x, int xdt, int64_t H,
                                         int64_t W, int64_t pl, int64_t oh, int64_t ow) {
  vl_k_up2_fwd_from(y, ydt, x, xdt, H, W, pl, oh, ow, vl_k_up2_src(oh, H), vl_k_up2_src(ow, W));
}

VL_HD static inline void vl_k_up2_fwd(void *y, int ydt, const void *x, int xdt, int64_t H,
                                      int64_t W, int64_t i) {
  int64_t OH = 2 * H, OW = 2 * W;
  int64_t pl = i / (OH * OW), r = i - pl * (OH * OW), oh = r / OW;
  vl_k_up2_fwd_at(y, ydt, x, xdt, H, W, pl, oh, r - oh * OW);
}

/* Weight of input m in output d (both clamped sources may be m at the edges). */
VL_HD static inline float vl_k_up2_weight(int64_t d, int64_t n, int64_t m) {
  vl_k_up_src s = vl_k_up2_src(d, n);
  return (s.i0 == m ? s.l0 : 0.0f) + (s.i1 == m ? s.l1 : 0.0f);
}

/* Backward as a gather, input (pl, h, w): only outputs 2m-1 .. 2m+2 of each dimension
 * read input m, so 16 candidates, summed in row-major output order. wt[a] is the weight of
 * output 2m-1+a in input m of n (0 outside the output). */
VL_HD static inline void vl_k_up2_bwd_weights(int64_t m, int64_t n, float wt[4]) {
  for (int a = 0; a < 4; a++) {
    int64_t o = 2 * m - 1 + a;
    wt[a] = o >= 0 && o < 2 * n ? vl_k_up2_weight(o, n, m) : 0.0f;
  }
}

/* The gather with the row weights wh (of h) and column weights ww (of w) given; the same with
 * them computed here. (The CPU computes each row's and each column's weights once per
 * call.) */
VL_HD static inline void vl_k_up2_bwd_from(void *dx, int dxdt, const void *dy, int dydt,
                                           int64_t H, int64_t W, int64_t pl, int64_t h,
                                           int64_t w, const float *wh, const float *ww) {
  int64_t OH = 2 * H, OW = 2 * W;
  float acc = 0.0f;
  for (int a = 0; a < 4; a++) {
    if (wh[a] == 0.0f) continue;
    int64_t row = (pl * OH + 2 * h - 1 + a) * OW + 2 * w - 1;
    for (int b = 0; b < 4; b++)
      if (ww[b] != 0.0f) acc += wh[a] * ww[b] * vl_ld(dy, dydt, row + b);
  }
  vl_st(dx, dxdt, (pl * H + h) * W + w, acc);
}

VL_HD static inline void vl_k_up2_bwd_at(void *dx, int dxdt, const void *dy, int dydt, int64_t H,
                                         int64_t W, int64_t pl, int64_t h, int64_t w) {
  float wh[4], ww[4];
  vl_k_up2_bwd_weights(h, H, wh);
  vl_k_up2_bwd_weights(w, W, ww);
  vl_k_up2_bwd_from(dx, dxdt, dy, dydt, H, W, pl, h, w, wh, ww);
}

VL_HD static inline void vl_k_up2_bwd(void *dx, int dxdt, const void *dy, int dydt, int64_t H,
                                      int64_t W, int64_t i) {
  int64_t pl = i / (H * W), r = i - pl * (H * W), h = r / W;
  vl_k_up2_bwd_at(dx, dxdt, dy, dydt, H, W, pl, h, r - h * W);
}

/* ---- nearest 2x upsampling (F.interpolate(scale_factor=2, mode="nearest")) ------------- */

/* Output (pl, oh, ow) = input (pl, oh/2, ow/2): PyTorch's source floor(d * 0.5). */
VL_HD static inline void vl_k_up2n_fwd_at(void *y, int ydt, const void *x, int xdt, int64_t H,
                                          int64_t W, int64_t pl, int64_t oh, int64_t ow) {
  vl_st(y, ydt, (pl * 2 * H + oh) * 2 * W + ow,
        vl_ld(x, xdt, (pl * H + (oh >> 1)) * W + (ow >> 1)));
}

VL_HD static inline void vl_k_up2n_fwd(void *y, int ydt, const void *x, int xdt, int64_t H,
                                       int64_t W, int64_t i) {
  int64_t OH = 2 * H, OW = 2 * W;
  int64_t pl = i / (OH * OW), r = i - pl * (OH * OW), oh = r / OW;
  vl_k_up2n_fwd_at(y, ydt, x, xdt, H, W, pl, oh, r - oh * OW);
}

/* Backward, input (pl, h, w): the sum of its 2x2 outputs in row-major order, in fp32. */
VL_HD static inline void vl_k_up2n_bwd_at(void *dx, int dxdt, const void *dy, int dydt, int64_t H,
                                          int64_t W, int64_t pl, int64_t h, int64_t w) {
  int64_t OW = 2 * W, o = (pl * 2 * H + 2 * h) * OW + 2 * w;
  float acc = vl_ld(dy, dydt, o) + vl_ld(dy, dydt, o + 1);
  acc += vl_ld(dy, dydt, o + OW);
  acc += vl_ld(dy, dydt, o + OW + 1);
  vl_st(dx, dxdt, (pl * H + h) * W + w, acc);
}

VL_HD static inline void vl_k_up2n_bwd(void *dx, int dxdt, const void *dy, int dydt, int64_t H,
                                       int64_t W, int64_t i) {
  int64_t pl = i / (H * W), r = i - pl * (H * W), h = r / W;
  vl_k_up2n_bwd_at(dx, dxdt, dy, dydt, H, W, pl, h, r - h * W);
}

/* ---- channel copy (concat) ------------------------------------------------------------ */

/* y[yo] = x[xo] (+ y[yo] when acc). */
VL_HD static inline void vl_k_chan_copy_at(void *y, int ydt, int64_t yo, const void *x, int xdt,
                                           int64_t xo, int acc) {
  float v = vl_ld(x, xdt, xo);
  vl_st(y, ydt, yo, acc ? vl_ld(y, ydt, yo) + v : v);
}

/* Element i of the copied block (N, nc, HW). */
VL_HD static inline void vl_k_chan_copy(void *y, int ydt, int64_t yC, int64_t y_c0, const void *x,
                                        int xdt, int64_t xC, int64_t x_c0, int64_t nc, int64_t HW,
                                        int acc, int64_t i) {
  int64_t blk = nc * HW, n = i / blk, r = i - n * blk; /* r = k*HW + s */
  vl_k_chan_copy_at(y, ydt, (n * yC + y_c0) * HW + r, x, xdt, (n * xC + x_c0) * HW + r, acc);
}

/* ---- per-pixel cross-entropy ------------------------------------------------------------- */

/* Pixel p = n*HW + s of logits (N, K, HW), class k at (n*K + k)*HW + s: as vl_k_xent_row with
 * a class stride of HW. Ignored pixels (t < 0) get loss 0 and zero gradient; a target >= K
 * (a bad label the device cannot report) gets a NaN loss, so the step sees a non-finite
 * loss instead of a read out of bounds. */
VL_HD static inline void vl_k_xent_pix(void *logits, int ldt, float *loss, const int32_t *tgt,
                                       int64_t K, int64_t HW, float s, int64_t p) {
  int64_t n = p / HW, base = n * K * HW + (p - n * HW);
  int32_t t = tgt[p];
  if (t < 0 || t >= K) {
    loss[p] = t < 0 ? 0.0f : NAN;
    for (int64_t k = 0; k < K; k++) vl_st(logits, ldt, base + k * HW, 0.0f);
    return;
  }
  float mx = -INFINITY;
  for (int64_t k = 0; k < K; k++) {
    float v = vl_ld(logits, ldt, base + k * HW);
    mx = v > mx ? v : mx;
  }
  /* fp32 logits keep each exp in place (exact), so the last pass does not recompute it;
   * the target's logit is read first */
  float lt = vl_ld(logits, ldt, base + (int64_t)t * HW), sum = 0.0f;
  for (int64_t k = 0; k < K; k++) {
    float e = expf(vl_ld(logits, ldt, base + k * HW) - mx);
    sum += e;
    if (ldt == VL_K_F32) ((float *)logits)[base + k * HW] = e;
  }
  loss[p] = logf(sum) + mx - lt;
  float inv = 1.0f / sum;
  for (int64_t k = 0; k < K; k++) {
    float e = ldt == VL_K_F32 ? ((float *)logits)[base + k * HW]
                              : expf(vl_ld(logits, ldt, base + k * HW) - mx);
    vl_st(logits, ldt, base + k * HW, s * (e * inv - (k == t ? 1.0f : 0.0f)));
  }
}

#endif
