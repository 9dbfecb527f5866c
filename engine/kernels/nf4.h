/* NF4 storage (QLoRA): 4-bit NormalFloat codes in 64-weight blocks, the block absmax
 * double-quantised to 8-bit codes in groups of 256 with one fp32 scale per group and one
 * fp32 mean. Layout of a tensor of n weights (n % 64 == 0):
 *   [mean f32][scale f32 x ngroups][codes n/2 bytes, even element in the high nibble]
 *   [absmax codes nblocks bytes]
 * bitsandbytes uses its dynamic 8-bit map for the absmax codes; this suite uses a linear
 * symmetric int8 map: the same bytes per weight, error documented by the round-trip test. */
#ifndef VRAMLAB_K_NF4_H
#define VRAMLAB_K_NF4_H
#include "kcommon.h"

#define VL_NF4_BLOCK 64
#define VL_NF4_GROUP 256

/* The 16 NF4 levels: quantiles of N(0,1) scaled to [-1, 1] (Dettmers et al. 2023). */
#define VL_NF4_LEVELS                                                                    \
  {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,             \
   -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,            \
   0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f, \
   0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f}

VL_HD static inline float vl_nf4_level(int q) {
  const float lv[16] = VL_NF4_LEVELS;
  return lv[q & 15];
}

VL_HD static inline int64_t vl_nf4_ngroups(int64_t n) {
  int64_t nb = n / VL_NF4_BLOCK;
  return (nb + VL_NF4_GROUP - 1) / VL_NF4_GROUP;
}

/* Value of element i of an NF4 buffer holding n weights. */
VL_HD static inline float vl_nf4_get(const uint8_t *buf, int64_t n, int64_t i) {
  int64_t ng = vl_nf4_ngroups(n);
  const float *f = (const float *)buf;
  float mean = f[0];
  const float *scale = f + 1;
  const uint8_t *codes = buf + 4 * (1 + ng);
  const int8_t *qabs = (const int8_t *)(codes + n / 2);
  int64_t b = i / VL_NF4_BLOCK;
  float absmax = (float)qabs[b] / 127.0f * scale[b / VL_NF4_GROUP] + mean;
  uint8_t byte = codes[i / 2];
  int q = (i & 1) ? (byte & 15) : (byte >> 4);
  return vl_nf4_level(q) * absmax;
}

/* Nearest NF4 level index for x in [-1, 1]. */
VL_HD static inline int vl_nf4_nearest(float x) {
  int best = 0;
  float bd = 1e30f;
  for (int q = 0; q < 16; q++) {
    float d = fabsf(x - vl_nf4_level(q));
    if (d < bd) { bd = d; best = q; }
  }
  return best;
}

#endif
