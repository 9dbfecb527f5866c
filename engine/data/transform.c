/* The per-sample image transform of the input pipeline: random-resized crop (torchvision's
 * RandomResizedCrop.get_params), bilinear resize to crop x crop, horizontal flip with
 * p = 0.5, normalisation, HWC uint8 -> CHW fp32; and the segmentation variant (whole image
 * resized, mask by nearest neighbour, the same flip for both); and Stable Diffusion's
 * (Pillow's antialiased bilinear resize of the short side, centre or random crop, optional
 * flip, [-1, 1]). Both collate paths call these functions, so their outputs are
 * bit-identical. */
#include <math.h>
#include <stdbool.h>
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

/* ============================ Stable Diffusion's transform ============================ */
/* Pillow's Image.resize(BILINEAR) (libImaging/Resample.c: precompute_coeffs,
 * normalize_coeffs_8bpc, ImagingResampleHorizontal_8bpc / Vertical_8bpc), evaluated only
 * on the crop window, then crop, flip and [-1, 1] (data.h). */

#define PIL_PREC 22 /* Pillow's PRECISION_BITS for 8-bit images: 32 - 8 - 2 */

/* Taps of one output pixel: the first source index and how many follow. */
typedef struct {
  int lo, n;
} span;

/* The resized size: short side to crop, the long side as torchvision computes it,
 * int(crop * long / short) (the product exact, one correctly rounded division). */
static void sd_size(int w, int h, int crop, int *nw, int *nh) {
  if (w <= h) {
    *nw = crop;
    *nh = (int)((double)((int64_t)crop * h) / w);
  } else {
    *nh = crop;
    *nw = (int)((double)((int64_t)crop * w) / h);
  }
}

/* Pillow's filter support for in -> out: 1 (the triangle's half-width), stretched by the
 * reduction factor when downscaling. */
static double sd_support(int in, int out) {
  double scale = (double)in / out;
  return scale < 1.0 ? 1.0 : scale;
}

/* Pillow's ksize: the most taps an output pixel can have. */
static int sd_ksize(int in, int out) { return (int)ceil(sd_support(in, out)) * 2 + 1; }

static double triangle(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

/* Output index xx of an in -> out resize: Pillow's taps and their weights, normalised to sum
 * 1 in double (wd, ksize of them), then rounded to fixed point as Pillow rounds them (k). */
static span sd_taps(int in, int out, int xx, double *wd, int32_t *k) {
  const double scale = (double)in / out;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = filterscale; /* the triangle's support is 1 */
  const double center = (xx + 0.5) * scale;
  const double ss = 1.0 / filterscale;
  int xmin = (int)(center - support + 0.5);
  if (xmin < 0) xmin = 0;
  int xmax = (int)(center + support + 0.5);
  if (xmax > in) xmax = in;
  xmax -= xmin;
  double ww = 0.0;
  for (int x = 0; x < xmax; x++) {
    double w = triangle((x + xmin - center + 0.5) * ss);
    wd[x] = w;
    ww += w;
  }
  for (int x = 0; x < xmax; x++) {
    if (ww != 0.0) wd[x] /= ww;
    k[x] = (int32_t)(wd[x] < 0 ? -0.5 + wd[x] * (1 << PIL_PREC) : 0.5 + wd[x] * (1 << PIL_PREC));
  }
  return (span){xmin, xmax};
}

static inline uint8_t clip8(int32_t ss) {
  int32_t v = ss >> PIL_PREC;
  v = v < 0 ? 0 : v;
  return (uint8_t)(v > 255 ? 255 : v);
}

/* Pillow 13 runs the vertical pass first when the height shrinks by more than twice as many
 * pixels as the width does (and both passes are needed: read off its ImagingResampleInner,
 * and checked on 400 random sizes); older Pillow sources always run the horizontal one
 * first. The order changes the rounding between the passes. */
static bool sd_vertical_first(int w, int h, int nw, int nh) {
  return nw != w && nh != h && h - nh > 0 && h - nh > 2 * (w - nw);
}

/* Source columns the crop's `crop` consecutive output columns read at most: the taps of
 * output x span (x + 0.5) * scale +- support, rounded outwards, and each column's window
 * may be widened to ksize taps (sd_pad). */
static int sd_cols(int crop, int w, int nw) {
  const double scale = (double)w / nw;
  const double c = (crop - 1) * scale + 2 * sd_support(w, nw) + 3 + 2 * sd_ksize(w, nw);
  return c < w ? (int)c : w;
}

/* vl_transform_sd's scratch, carved from one block. */
typedef struct {
  int kx, ky, ncols;
  span *xs;        /* crop: each output column's taps */
  int32_t *xk;     /* crop x kx fixed-point weights */
  int32_t *yk;     /* ky: the current output row's weights */
  double *wd;      /* max(kx, ky): weights before rounding */
  uint8_t *ring;   /* horizontal first: ky rows of 3*crop bytes (resampled source rows);
                      vertical first: one output row */
  int32_t *acc;    /* 3 * max(crop, ncols): a row being accumulated */
  uint8_t *vrow;   /* vertical first: 3*ncols bytes, a row after the vertical pass */
} sd_scratch;

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The block's layout for kx, ky taps and ncols source columns (vertical first, else 0) at
 * crop; its size when base is NULL. */
static size_t sd_layout(int crop, int kx, int ky, int ncols, void *base, sd_scratch *s) {
  const size_t wide = (size_t)(crop > ncols ? crop : ncols);
  const size_t sz[7] = {(size_t)crop * sizeof(span), (size_t)crop * kx * sizeof(int32_t),
                        (size_t)ky * sizeof(int32_t), (size_t)(kx > ky ? kx : ky) * sizeof(double),
                        (size_t)ky * crop * 3, wide * 3 * sizeof(int32_t), (size_t)ncols * 3};
  size_t off[7], total = 0;
  for (int i = 0; i < 7; i++) {
    off[i] = total;
    total += up64(sz[i]);
  }
  if (base) {
    uint8_t *b = base;
    s->kx = kx;
    s->ky = ky;
    s->ncols = ncols;
    s->xs = (span *)(b + off[0]);
    s->xk = (int32_t *)(b + off[1]);
    s->yk = (int32_t *)(b + off[2]);
    s->wd = (double *)(b + off[3]);
    s->ring = b + off[4];
    s->acc = (int32_t *)(b + off[5]);
    s->vrow = b + off[6];
  }
  return total;
}

/* The layout for a w x h image at crop (into s when base is given); its size. */
static size_t sd_plan(int crop, int w, int h, void *base, sd_scratch *s) {
  int nw, nh;
  sd_size(w, h, crop, &nw, &nh);
  const int ncols = sd_vertical_first(w, h, nw, nh) ? sd_cols(crop, w, nw) : 0;
  return sd_layout(crop, sd_ksize(w, nw), sd_ksize(h, nh), ncols, base, s);
}

size_t vl_transform_sd_scratch_bytes(int crop, int w, int h) { return sd_plan(crop, w, h, NULL, NULL); }

size_t vl_transform_sd_scratch_bound(int crop, size_t max_pixels) {
  /* The short side s is at most sqrt(pixels). Each axis shrinks by at most 2 s / crop: the
   * short one by s / crop, the long one by long / floor(t) with t = crop * long / s >= 1,
   * and floor(t) >= t / 2. So the support is at most max(1, ceil(2 s / crop)), and the
   * columns a crop reads at most (crop - 1) * 2 s / crop + 2 support + 3 + 2 ksize
   * <= 2 s + 2 sup + 3 + 2 (2 sup + 1) (sd_cols). */
  size_t s = (size_t)sqrt((double)max_pixels);
  while (s * s > max_pixels) s--;
  while ((s + 1) * (s + 1) <= max_pixels) s++;
  size_t sup = (2 * s + (size_t)crop - 1) / (size_t)crop;
  if (sup < 1) sup = 1;
  if (sup > (size_t)INT32_MAX / 8) sup = (size_t)INT32_MAX / 8;
  const int k = (int)(2 * sup + 1);
  const size_t cols = 2 * s + 2 * sup + 3 + 2 * (size_t)k;
  return sd_layout(crop, k, k, cols < (size_t)INT32_MAX ? (int)cols : INT32_MAX, NULL, NULL);
}

/* Column xo's taps widened to exactly kx (w >= kx): the window moved left where it would
 * pass the right edge, the weights shifted into it and zeros around them. The sums are the
 * same (exact integers), and every column then has kx taps, which sd_hrow unrolls. */
static void sd_pad(span *sp, int32_t *k, int kx, int w) {
  const int lo = sp->lo + kx <= w ? sp->lo : w - kx, sh = sp->lo - lo;
  for (int t = sp->n - 1; t >= 0; t--) k[t + sh] = k[t];
  for (int t = 0; t < sh; t++) k[t] = 0;
  for (int t = sh + sp->n; t < kx; t++) k[t] = 0;
  *sp = (span){lo, kx};
}

/* sd_hrow's loop for columns of K taps each (K a constant where the compiler can unroll). */
static inline void sd_hrow_k(const uint8_t *src, int off, const sd_scratch *s, int crop,
                             uint8_t *out, int K) {
  for (int xo = 0; xo < crop; xo++) {
    const span sp = s->xs[xo];
    const int n = K ? K : sp.n;
    const int32_t *k = s->xk + (size_t)xo * s->kx;
    const uint8_t *p = src + (size_t)(sp.lo - off) * 3;
    int32_t s0 = 1 << (PIL_PREC - 1), s1 = s0, s2 = s0;
    for (int t = 0; t < n; t++, p += 3) {
      s0 += p[0] * k[t];
      s1 += p[1] * k[t];
      s2 += p[2] * k[t];
    }
    out[3 * xo] = clip8(s0);
    out[3 * xo + 1] = clip8(s1);
    out[3 * xo + 2] = clip8(s2);
  }
}

/* One row resampled horizontally over the crop's columns into out (3*crop bytes); src
 * holds the row's source columns from `off` on. `padded`: every column has kx taps. */
static void sd_hrow(const uint8_t *src, int off, const sd_scratch *s, int crop, bool padded,
                    uint8_t *out) {
  if (padded && s->kx == 3) sd_hrow_k(src, off, s, crop, out, 3);
  else if (padded && s->kx == 5) sd_hrow_k(src, off, s, crop, out, 5);
  else if (padded && s->kx == 7) sd_hrow_k(src, off, s, crop, out, 7);
  else sd_hrow_k(src, off, s, crop, out, 0);
}

/* acc[0 .. len) = rows lo .. lo+n-1 weighted by k[0 .. n), Pillow's rounding bias
 * included; row y is at base + (mod ? y % mod : y) * stride. */
static void sd_vsum(const uint8_t *base, size_t stride, int mod, int lo, const int32_t *k, int n,
                    size_t len, int32_t *acc) {
  for (size_t i = 0; i < len; i++) acc[i] = 1 << (PIL_PREC - 1);
  for (int t = 0; t < n; t++) {
    const uint8_t *row = base + (size_t)(mod ? (lo + t) % mod : lo + t) * stride;
    const int32_t kt = k[t];
    for (size_t i = 0; i < len; i++) acc[i] += row[i] * kt;
  }
}

/* Output row yo as CHW floats, mirrored when flip: its 3*crop interleaved values are bytes
 * (px) or sums still to round (acc, when px is NULL). */
static void sd_store(const uint8_t *px, const int32_t *acc, int crop, int yo, int flip,
                     const float *lut, float *dst) {
  const size_t plane = (size_t)crop * crop;
  float *d0 = dst + (size_t)yo * crop, *d1 = d0 + plane, *d2 = d1 + plane;
  for (int xo = 0; xo < crop; xo++) {
    const int xd = flip ? crop - 1 - xo : xo;
    if (px) {
      d0[xd] = lut[px[3 * xo]];
      d1[xd] = lut[px[3 * xo + 1]];
      d2[xd] = lut[px[3 * xo + 2]];
    } else {
      d0[xd] = lut[clip8(acc[3 * xo])];
      d1[xd] = lut[clip8(acc[3 * xo + 1])];
      d2[xd] = lut[clip8(acc[3 * xo + 2])];
    }
  }
}

/* Horizontal pass first (or only one pass): each source row the crop reads is resampled
 * horizontally once into the ring, then each output row sums its rows vertically. */
static void sd_h_then_v(const vl_image *img, const sd_scratch *s, int crop, int top, int left,
                        bool hpass, bool vpass, bool padded, int nh, int flip, const float *lut,
                        float *dst) {
  const size_t stride = (size_t)img->w * 3, rl = (size_t)crop * 3;
  int have = 0; /* source rows [.., have) are done, the last ky of them in the ring */
  for (int yo = 0; yo < crop; yo++) {
    span sy = {top + yo, 1};
    int32_t one = 1 << PIL_PREC;
    const int32_t *k = &one;
    if (vpass) {
      sy = sd_taps(img->h, nh, top + yo, s->wd, s->yk);
      k = s->yk;
    }
    /* The window [lo, lo + n) only moves down and n <= ky, so row y's slot y % ky is
     * still its own. */
    for (int y = have > sy.lo ? have : sy.lo; hpass && y < sy.lo + sy.n; y++)
      sd_hrow(img->pix + (size_t)y * stride, 0, s, crop, padded, s->ring + (size_t)(y % s->ky) * rl);
    if (sy.lo + sy.n > have) have = sy.lo + sy.n;
    if (hpass) sd_vsum(s->ring, rl, s->ky, sy.lo, k, sy.n, rl, s->acc);
    else sd_vsum(img->pix + (size_t)left * 3, stride, 0, sy.lo, k, sy.n, rl, s->acc);
    sd_store(NULL, s->acc, crop, yo, flip, lut, dst);
  }
}

/* Vertical pass first (Pillow 13, see sd_vertical_first): each output row sums its source
 * rows over the columns the crop reads, rounds them to bytes, then resamples horizontally. */
static void sd_v_then_h(const vl_image *img, const sd_scratch *s, int crop, int top, int nh,
                        bool padded, int flip, const float *lut, float *dst) {
  const size_t stride = (size_t)img->w * 3;
  const int c0 = s->xs[0].lo, c1 = s->xs[crop - 1].lo + s->xs[crop - 1].n;
  const size_t len = (size_t)(c1 - c0) * 3;
  for (int yo = 0; yo < crop; yo++) {
    const span sy = sd_taps(img->h, nh, top + yo, s->wd, s->yk);
    sd_vsum(img->pix + (size_t)c0 * 3, stride, 0, sy.lo, s->yk, sy.n, len, s->acc);
    for (size_t i = 0; i < len; i++) s->vrow[i] = clip8(s->acc[i]);
    sd_hrow(s->vrow, c0, s, crop, padded, s->ring);
    sd_store(s->ring, NULL, crop, yo, flip, lut, dst);
  }
}

void vl_transform_sd(const vl_loader_cfg *c, const vl_image *img, vl_rng *rng, float *dst,
                     void *scratch) {
  const int crop = c->crop, w = img->w, h = img->h;
  int nw, nh;
  sd_size(w, h, crop, &nw, &nh);
  /* crop window in the resized image, then the flip: the draws in torchvision's order */
  int top, left;
  if (!c->sd_random_crop) {
    top = py_round((nh - crop) / 2.0);
    left = py_round((nw - crop) / 2.0);
  } else if (nh == crop && nw == crop) {
    top = left = 0;
  } else {
    top = (int)vl_rng_below(rng, (uint64_t)(nh - crop + 1));
    left = (int)vl_rng_below(rng, (uint64_t)(nw - crop + 1));
  }
  const int flip = c->sd_flip && vl_rng_uniform(rng) < 0.5;

  sd_scratch s = {0};
  sd_plan(crop, w, h, scratch, &s);
  /* Pillow skips a pass whose size does not change (its taps would be the identity). */
  const bool hpass = nw != w, vpass = nh != h, padded = w >= s.kx;
  for (int xo = 0; hpass && xo < crop; xo++) {
    int32_t *k = s.xk + (size_t)xo * s.kx;
    s.xs[xo] = sd_taps(w, nw, left + xo, s.wd, k);
    if (padded) sd_pad(&s.xs[xo], k, s.kx, w);
  }
  /* ToTensor then Normalize, in float as torch does them */
  float lut[256];
  for (int v = 0; v < 256; v++) lut[v] = ((float)v / 255.0f - 0.5f) / 0.5f;
  if (sd_vertical_first(w, h, nw, nh)) sd_v_then_h(img, &s, crop, top, nh, padded, flip, lut, dst);
  else sd_h_then_v(img, &s, crop, top, left, hpass, vpass, padded, nh, flip, lut, dst);
}
