/* The per-sample image transform of the input pipeline: random-resized crop (torchvision's
 * RandomResizedCrop.get_params), bilinear resize to crop x crop, horizontal flip with
 * p = 0.5, normalisation, HWC uint8 -> CHW fp32; and the segmentation variant (whole image
 * resized, mask by nearest neighbour, the same flip for both). Both collate paths call
 * these functions, so their outputs are bit-identical. */
#include <math.h>
#include <stdint.h>

#include "vramlab/data.h"

typedef struct {
  int i, j, h, w; /* top, left, height, width of the crop in the source image */
} crop_box;

/* Python's round(): half to even, which nearbyint gives in the default rounding mode. */
static int py_round(double v) { return (int)nearbyint(v); }

static double uniform(vl_rng *r, double a, double b) { return a + (b - a) * vl_rng_uniform(r); }

static crop_box rrc_params(const vl_loader_cfg *c, int width, int height, vl_rng *rng) {
  crop_box b;
  const double area = (double)width * (double)height;
  const double lr0 = log((double)c->ratio_min), lr1 = log((double)c->ratio_max);
  for (int attempt = 0; attempt < 10; attempt++) {
    double target = area * uniform(rng, c->scale_min, c->scale_max);
    double ar = exp(uniform(rng, lr0, lr1));
    int w = py_round(sqrt(target * ar));
    int h = py_round(sqrt(target / ar));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      b.i = (int)vl_rng_below(rng, (uint64_t)(height - h + 1));
      b.j = (int)vl_rng_below(rng, (uint64_t)(width - w + 1));
      b.h = h;
      b.w = w;
      return b;
    }
  }
  /* Fallback: the largest centred crop whose aspect ratio is inside the range. */
  double in_ratio = (double)width / (double)height;
  int w, h;
  if (in_ratio < c->ratio_min) {
    w = width;
    h = py_round(w / (double)c->ratio_min);
  } else if (in_ratio > c->ratio_max) {
    h = height;
    w = py_round(h * (double)c->ratio_max);
  } else {
    w = width;
    h = height;
  }
  if (h < 1) h = 1;
  if (h > height) h = height;
  if (w < 1) w = 1;
  if (w > width) w = width;
  b.i = (height - h) / 2;
  b.j = (width - w) / 2;
  b.h = h;
  b.w = w;
  return b;
}

/* Taps of output pixel o for a len -> out resize with half-pixel centres
 * (align_corners=False): lower source index s0 (off added), upper s1, weight of s1. */
static void tap(int o, double scale, int off, int len, int *s0, int *s1, float *f) {
  double s = ((double)o + 0.5) * scale - 0.5;
  if (s < 0) s = 0;
  int a = (int)s;
  if (a >= len - 1) {
    *s0 = *s1 = off + len - 1;
    *f = 0.0f;
    return;
  }
  *s0 = off + a;
  *s1 = off + a + 1;
  *f = (float)(s - a);
}

/* Resize box b of img to crop x crop (bilinear), flipped horizontally when `flip`,
 * normalised, into dst as CHW floats. */
static void resize_normalise(const vl_loader_cfg *c, const vl_image *img, crop_box b, int flip,
                             float *dst) {
  const int crop = c->crop;
  /* Column taps once per image (48 KiB of stack at the largest crop): byte offsets of the
   * two source pixels and the weight, already in output (possibly flipped) order. */
  int x0[VL_LOADER_CROP_MAX], x1[VL_LOADER_CROP_MAX];
  float fx[VL_LOADER_CROP_MAX];
  const double sx = (double)b.w / crop, sy = (double)b.h / crop;
  for (int x = 0; x < crop; x++) {
    int a, e;
    float f;
    tap(x, sx, b.j, b.w, &a, &e, &f);
    int xo = flip ? crop - 1 - x : x;
    x0[xo] = a * 3;
    x1[xo] = e * 3;
    fx[xo] = f;
  }
  /* (v/255 - mean)/std as one multiply-add per value. */
  float scl[3], off[3];
  for (int ch = 0; ch < 3; ch++) {
    scl[ch] = 1.0f / (255.0f * c->std[ch]);
    off[ch] = -c->mean[ch] / c->std[ch];
  }
  const size_t plane = (size_t)crop * crop;
  const size_t stride = (size_t)img->w * 3;
  float *restrict d0 = dst, *restrict d1 = dst + plane, *restrict d2 = dst + 2 * plane;
  for (int y = 0; y < crop; y++) {
    int ya, yb;
    float fy;
    tap(y, sy, b.i, b.h, &ya, &yb, &fy);
    const uint8_t *r0 = img->pix + (size_t)ya * stride;
    const uint8_t *r1 = img->pix + (size_t)yb * stride;
    const size_t ro = (size_t)y * crop;
    for (int x = 0; x < crop; x++) {
      const uint8_t *p00 = r0 + x0[x], *p01 = r0 + x1[x];
      const uint8_t *p10 = r1 + x0[x], *p11 = r1 + x1[x];
      const float f = fx[x];
      float v[3];
      for (int ch = 0; ch < 3; ch++) {
        /* a + (b - a) * t is exact when a == b, so a flat region stays exactly flat. */
        float t = (float)p00[ch] + ((float)p01[ch] - (float)p00[ch]) * f;
        float u = (float)p10[ch] + ((float)p11[ch] - (float)p10[ch]) * f;
        v[ch] = (t + (u - t) * fy) * scl[ch] + off[ch];
      }
      d0[ro + x] = v[0];
      d1[ro + x] = v[1];
      d2[ro + x] = v[2];
    }
  }
}

void vl_transform(const vl_loader_cfg *c, const vl_image *img, vl_rng *rng, float *dst) {
  crop_box b = rrc_params(c, img->w, img->h, rng);
  const int flip = vl_rng_uniform(rng) < 0.5;
  resize_normalise(c, img, b, flip, dst);
}

/* PyTorch's nearest source index (aten UpSample.h nearest_idx): exact for the identity and
 * for doubling, else floorf(dst * scale) with a float scale, clamped to the last index. */
static int nearest_src(int o, int in, int out) {
  if (out == in) return o;
  if (out == 2 * in) return o >> 1;
  const float scale = (float)in / (float)out;
  int s = (int)floorf((float)o * scale);
  return s < in - 1 ? s : in - 1;
}

void vl_transform_seg(const vl_loader_cfg *c, const vl_image *img, vl_rng *rng, float *dst,
                      int32_t *ydst) {
  const int crop = c->crop;
  const crop_box whole = {0, 0, img->h, img->w};
  const int flip = vl_rng_uniform(rng) < 0.5;
  resize_normalise(c, img, whole, flip, dst);
  /* The mask: column sources once, in output (possibly flipped) order, as for the image. */
  int xs[VL_LOADER_CROP_MAX];
  for (int x = 0; x < crop; x++) xs[flip ? crop - 1 - x : x] = nearest_src(x, img->w, crop);
  for (int y = 0; y < crop; y++) {
    const uint8_t *row = img->mask + (size_t)nearest_src(y, img->h, crop) * (size_t)img->w;
    int32_t *d = ydst + (size_t)y * crop;
    for (int x = 0; x < crop; x++) d[x] = row[xs[x]];
  }
}
