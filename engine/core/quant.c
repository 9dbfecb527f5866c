/* Host-side NF4 quantisation (done once, when a frozen base is loaded). */
#include "vramlab/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/nf4.h"

int vl_nf4_quantize_host(uint8_t *dst, const float *src, int64_t n) {
  if (n <= 0 || n % VL_NF4_BLOCK) return -1;
  int64_t nb = n / VL_NF4_BLOCK, ng = vl_nf4_ngroups(n);
  float *absmax = malloc((size_t)nb * sizeof(float));
  if (!absmax) return -1;
  double mean = 0;
  /* blocks are independent: on every thread (a 7B model quantises 7e9 weights); the mean is
   * summed in block order after, so the result is the same bits on any thread count */
#pragma omp parallel for schedule(static) if (nb > 4096)
  for (int64_t b = 0; b < nb; b++) {
    float m = 0;
    for (int64_t k = 0; k < VL_NF4_BLOCK; k++) {
      float a = fabsf(src[b * VL_NF4_BLOCK + k]);
      if (a > m) m = a;
    }
    absmax[b] = m;
  }
  for (int64_t b = 0; b < nb; b++) mean += absmax[b];
  mean /= (double)nb;
  float *f = (float *)dst;
  f[0] = (float)mean;
  float *scale = f + 1;
  uint8_t *codes = dst + 4 * (1 + ng);
  int8_t *qabs = (int8_t *)(codes + n / 2);
  for (int64_t g = 0; g < ng; g++) {
    int64_t b0 = g * VL_NF4_GROUP, b1 = b0 + VL_NF4_GROUP < nb ? b0 + VL_NF4_GROUP : nb;
    float s = 0;
    for (int64_t b = b0; b < b1; b++) {
      float d = fabsf(absmax[b] - (float)mean);
      if (d > s) s = d;
    }
    scale[g] = s;
    for (int64_t b = b0; b < b1; b++) {
      float q = s > 0 ? roundf((absmax[b] - (float)mean) / s * 127.0f) : 0.0f;
      qabs[b] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
    }
  }
  memset(codes, 0, (size_t)n / 2);
  /* a block's codes are its own bytes (VL_NF4_BLOCK is even) */
#pragma omp parallel for schedule(static) if (nb > 4096)
  for (int64_t b = 0; b < nb; b++) {
    /* Codes are chosen against the absmax that dequantisation will see. */
    float am = (float)qabs[b] / 127.0f * scale[b / VL_NF4_GROUP] + (float)mean;
    for (int64_t k = 0; k < VL_NF4_BLOCK; k++) {
      int64_t i = b * VL_NF4_BLOCK + k;
      int q = vl_nf4_nearest(am > 0 ? src[i] / am : 0.0f);
      codes[i / 2] |= (uint8_t)((i & 1) ? q : q << 4);
    }
  }
  free(absmax);
  return 0;
}

void vl_nf4_dequantize_host(float *dst, const uint8_t *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = vl_nf4_get(src, n, i);
}

float vl_nf4_get_host(const uint8_t *buf, int64_t n, int64_t i) { return vl_nf4_get(buf, n, i); }
