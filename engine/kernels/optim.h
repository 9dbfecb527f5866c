/* Optimizer update kernels (fp32 params, grads and state). */
#ifndef VRAMLAB_K_OPTIM_H
#define VRAMLAB_K_OPTIM_H
#include "kcommon.h"

/* AdamW as torch.optim.AdamW: decoupled decay first, then the bias-corrected Adam step.
 * bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. */
VL_HD static inline void vl_k_adamw(float *VL_RESTRICT p, const float *VL_RESTRICT g,
                                    float *VL_RESTRICT m, float *VL_RESTRICT v, float lr,
                                    float b1, float b2, float eps, float wd, float bc1,
                                    float bc2, float gscale, int64_t i) {
  float gi = g[i] * gscale;
  float mi = b1 * m[i] + (1.0f - b1) * gi;
  float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
  m[i] = mi; v[i] = vi;
  float pi = p[i] * (1.0f - lr * wd);
  p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}

/* SGD with momentum as torch.optim.SGD (dampening 0, L2 weight decay). */
VL_HD static inline void vl_k_sgd(float *VL_RESTRICT p, const float *VL_RESTRICT g,
                                  float *VL_RESTRICT mom, float lr, float mu,
                                  float wd, float gscale, int64_t i) {
  float gi = g[i] * gscale + wd * p[i];
  float b = mu * mom[i] + gi;
  mom[i] = b;
  p[i] -= lr * b;
}

/* Adafactor (Shazeer & Stern 2018) pieces. Row r of the factored second moment:
 * vr[r] = b2t*vr[r] + (1-b2t) * mean_c(g^2 + eps1). */
VL_HD static inline void vl_k_adafactor_row(float *vr, const float *g, int64_t C, float b2t,
                                            float eps1, float gscale, int64_t r) {
  float acc = 0.0f;
  for (int64_t c = 0; c < C; c++) { float gi = g[r * C + c] * gscale; acc += gi * gi + eps1; }
  vr[r] = b2t * vr[r] + (1.0f - b2t) * acc / (float)C;
}

VL_HD static inline void vl_k_adafactor_col(float *vc, const float *g, int64_t R, int64_t C,
                                            float b2t, float eps1, float gscale, int64_t c) {
  float acc = 0.0f;
  for (int64_t r = 0; r < R; r++) { float gi = g[r * C + c] * gscale; acc += gi * gi + eps1; }
  vc[c] = b2t * vc[c] + (1.0f - b2t) * acc / (float)R;
}

/* Unscaled update of element i of a (R,C) matrix: g / sqrt(vr[r]/mean(vr) * vc[c]).
 * For vectors (R == 1) vc holds the unfactored v and vr_mean is ignored. */
VL_HD static inline float vl_k_adafactor_u(const float *g, const float *vr, const float *vc,
                                           float vr_mean, int64_t R, int64_t C, float gscale,
                                           int64_t i) {
  int64_t r = i / C, c = i % C;
  float v = R == 1 ? vc[c] : vr[r] / vr_mean * vc[c];
  return g[i] * gscale / sqrtf(v);
}

/* Final pass: the update clipped by div (max(1, RMS/clip)), the optional first moment m
 * (NULL when beta1 = 0), decoupled weight decay, then the step. */
VL_HD static inline void vl_k_adafactor_apply(float *p, float *m, const float *g, const float *vr,
                                              const float *vc, float vr_mean, int64_t R,
                                              int64_t C, float gscale, float div, float lr,
                                              float b1, float wd, int64_t i) {
  float u = vl_k_adafactor_u(g, vr, vc, vr_mean, R, C, gscale, i) / div;
  if (m) { m[i] = b1 * m[i] + (1.0f - b1) * u; u = m[i]; }
  p[i] -= lr * (u + wd * p[i]);
}

#endif
