/* Spatial kernels beside the convolutions (max pooling, bilinear and nearest 2x upsampling,
 * zero padding, channel copy for concatenation): single-source bodies, one per element, row
 * or plane, layout NCHW. The CPU backend loops over them with OpenMP (cpu_pool.c), the CUDA
 * backend wraps them in grid-stride kernels (cuda_pool.cu). Convolutions themselves are
 * library calls (cpu_conv.c: oneDNN, cuda_conv.cu: cuDNN). */
#ifndef VRAMLAB_K_POOL_H
#define VRAMLAB_K_POOL_H
#include "kcommon.h"

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

#endif
