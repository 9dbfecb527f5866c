/* Convolution geometry shared by every backend and the planner (pure). */
#include "vramlab/backend.h"

bool vl_conv_init(vl_conv *cv, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                  int64_t S, int stride, int pad, int dil) {
  if (!cv || N < 1 || C < 1 || H < 1 || W < 1 || K < 1 || R < 1 || S < 1 || stride < 1 ||
      pad < 0 || dil < 1)
    return false;
  int64_t P = (H + 2 * (int64_t)pad - (int64_t)dil * (R - 1) - 1) / stride + 1;
  int64_t Q = (W + 2 * (int64_t)pad - (int64_t)dil * (S - 1) - 1) / stride + 1;
  /* the numerator can be negative when the dilated kernel exceeds the padded input */
  if (H + 2 * (int64_t)pad < (int64_t)dil * (R - 1) + 1 ||
      W + 2 * (int64_t)pad < (int64_t)dil * (S - 1) + 1 || P < 1 || Q < 1)
    return false;
  *cv = (vl_conv){.N = N, .C = C, .H = H, .W = W, .K = K, .R = R, .S = S, .stride = stride,
                  .pad = pad, .dil = dil, .P = P, .Q = Q,
                  .xdt = VL_F32, .wdt = VL_F32, .gdt = VL_F32};
  return true;
}

double vl_conv_flops(const vl_conv *cv) {
  return 2.0 * (double)cv->N * (double)cv->K * (double)cv->P * (double)cv->Q * (double)cv->C *
         (double)cv->R * (double)cv->S;
}
