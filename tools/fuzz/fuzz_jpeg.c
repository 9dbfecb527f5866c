/* libFuzzer target: bytes -> the loader's path for one JPEG sample, the way the jpegset and
 * segset read() run it after reading the file: vl_synth_decode_jpeg (header checks against
 * what the set says, then TurboJPEG with a decompressor of its own), then the loader's
 * per-sample transform (random-resized crop, flip, normalise). Everything twice: the same
 * bytes must give the same status, message and pixels, and the same transformed floats
 * (abort() otherwise), since decoding may depend on nothing but the bytes. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "datasets/synth.h"
#include "vramlab/data.h"

/* What the fuzz "manifest" says: the header's own size when it is at most this many
 * pixels (so whole images decode), else a small one (the file is refused before any
 * allocation, as a set whose manifest says otherwise). Keeps an execution under a few ms. */
#define MAX_PIXELS (256 * 256)
#define CROP 16

static vl_status decode(const uint8_t *d, size_t n, const vl_synth_jpeg_want *want, vl_image *im, vl_err *err) {
  err->msg[0] = 0;
  vl_status st = vl_synth_decode_jpeg("fuzz.jpg", d, n, want, im, err);
  if (st != VL_OK && !err->msg[0]) abort(); /* a refusal always says why */
  if (st != VL_OK && st != VL_ERR_IO && st != VL_ERR_OOM) abort();
  return st;
}

static void transform(const vl_image *im, uint64_t seed, float *x) {
  vl_loader_cfg c;
  vl_loader_cfg_default(&c);
  c.crop = CROP;
  vl_rng r;
  vl_rng_seed(&r, seed);
  vl_transform(&c, im, &r, x);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  int w = 0, h = 0, ss = 0, cs = 0;
  tjhandle tj = tjInitDecompress();
  if (!tj) return 0;
  int hdr = tjDecompressHeader3(tj, d, (unsigned long)n, &w, &h, &ss, &cs);
  tjDestroy(tj);
  vl_synth_jpeg_want want = {64, 48, (int64_t)n, "the fuzz manifest says"};
  if (hdr == 0 && w >= 1 && h >= 1 && (int64_t)w * h <= MAX_PIXELS) want.w = w, want.h = h;
  if (n % 7 == 3) want.bytes = (int64_t)n + 1; /* sometimes a file that "changed" */
  vl_image a = {0}, b = {0};
  vl_err ea, eb;
  vl_status sa = decode(d, n, &want, &a, &ea);
  vl_status sb = decode(d, n, &want, &b, &eb);
  if (sa != sb || strcmp(ea.msg, eb.msg)) abort();
  if (sa == VL_OK) {
    const size_t np = (size_t)want.w * (size_t)want.h * 3;
    if (a.cap < np || b.cap < np || memcmp(a.pix, b.pix, np)) abort();
    a.w = b.w = want.w, a.h = b.h = want.h, a.c = b.c = 3;
    static float x[3 * CROP * CROP], y[3 * CROP * CROP];
    transform(&a, n, x);
    transform(&b, n, y);
    if (memcmp(x, y, sizeof x)) abort();
    for (size_t k = 0; k < sizeof x / sizeof x[0]; k++)
      if (!isfinite(x[k])) abort();
  }
  free(a.pix);
  free(b.pix);
  return 0;
}
