/* Loss kernels (fused cross-entropy over token rows, per-pixel cross-entropy, fused MSE):
 * the loss and the gradient of the logits / prediction in one pass. Single-source bodies, one
 * per row or pixel; the CPU backend loops over them (cpu_loss.c), the CUDA backend wraps them
 * in grid-stride kernels or one block per row (cuda_loss.cu). */
#ifndef VRAMLAB_K_LOSS_H
#define VRAMLAB_K_LOSS_H
#include "kcommon.h"

/* Cross-entropy on row r: loss[r] = logsumexp(l) - l[t]; logits := s*(softmax - onehot).
 * Ignored rows (t < 0) get loss 0 and zero gradient. */
VL_HD static inline void vl_k_xent_row(void *logits, int ldt, float *loss, const int32_t *tgt,
                                       int64_t V, float s, int64_t r) {
  int64_t base = r * V;
  int32_t t = tgt[r];
  if (t < 0) {
    loss[r] = 0.0f;
    for (int64_t c = 0; c < V; c++) vl_st(logits, ldt, base + c, 0.0f);
    return;
  }
  float mx = -INFINITY;
  for (int64_t c = 0; c < V; c++) { float v = vl_ld(logits, ldt, base + c); mx = v > mx ? v : mx; }
  /* fp32 logits keep each exp in place (exact), so the last pass does not recompute it;
   * the target's logit is read first */
  float lt = vl_ld(logits, ldt, base + t), sum = 0.0f;
  for (int64_t c = 0; c < V; c++) {
    float e = expf(vl_ld(logits, ldt, base + c) - mx);
    sum += e;
    if (ldt == VL_K_F32) ((float *)logits)[base + c] = e;
  }
  loss[r] = logf(sum) + mx - lt;
  float inv = 1.0f / sum;
  for (int64_t c = 0; c < V; c++) {
    float e = ldt == VL_K_F32 ? ((float *)logits)[base + c]
                              : expf(vl_ld(logits, ldt, base + c) - mx);
    vl_st(logits, ldt, base + c, s * (e * inv - (c == t ? 1.0f : 0.0f)));
  }
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

#endif
