/* Internal helpers shared by the synthetic image sets (jpegset, segset): atomic file
 * writes, whole-file reads, JPEG damage for tests, and the integer pixel synthesis of a
 * photo-like textured background (gradients + multi-octave value noise) and of per-pixel
 * sensor noise. Not a public interface: names carry the vl_synth_ prefix only because the
 * sets are linked into one library.
 *
 * Everything that makes pixels is integer arithmetic and draws from the caller's vl_rng in
 * a fixed order, so a set's bytes depend on its seed only (not on threads or compiler
 * flags). Changing the order or count of draws here changes every generated set. */
#ifndef VRAMLAB_DATASETS_SYNTH_H
#define VRAMLAB_DATASETS_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include <turbojpeg.h>

#include "vramlab/core.h"

/* ---- files ------------------------------------------------------------------------ */

void vl_synth_setf(char *err, size_t errn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Creates dir and its parents. 0, or -1 with a message. */
int vl_synth_mkdir_p(const char *dir, char *err, size_t errn);
/* dir/name written atomically: dir/.name.tmp.PID, fsync, rename. 0, or -1 with a message. */
int vl_synth_write_atomic(const char *dir, const char *name, const void *data, size_t len,
                          char *err, size_t errn);
void vl_synth_fsync_dir(const char *dir);
/* Whole file into *buf (grown with realloc, capacity *cap); *len its size. A missing,
 * unreadable, empty or non-regular file is VL_ERR_IO with a message starting "path: ". */
vl_status vl_synth_read_file(const char *path, uint8_t **buf, size_t *cap, size_t *len,
                             char *err, size_t errn);

/* Damage the JPEG dir/name in place: mode 0 truncates it to half its size, mode 1
 * overwrites 64 bytes in the middle of its entropy-coded data with garbage seeded by
 * `salt` (always including a stray EOI marker, so the decoder must notice), mode 2
 * replaces it with a text file. 0, or -1 with a message. */
int vl_synth_damage_jpeg(const char *dir, const char *name, int mode, uint64_t salt,
                         char *err, size_t errn);

/* A fresh decompressor in place of `tj` (destroyed). TurboJPEG 2.1 leaves a handle whose
 * decode failed mid-header in a state where the next calls fail too (repeating the old
 * error on good files) or report a 0x0 image, so a reader replaces its handle after every
 * decode error. NULL when none could be made: the caller makes one on next use. */
tjhandle vl_synth_tj_renew(tjhandle tj);

/* ---- pixel synthesis ---------------------------------------------------------------- */

static inline int vl_synth_clamp255(int v) { return v < 0 ? 0 : v > 255 ? 255 : v; }
static inline int vl_synth_rnd_in(vl_rng *r, int lo, int hi) {
  return lo + (int)vl_rng_below(r, (uint64_t)(hi - lo + 1));
}

/* cos, sin of k*pi/16 (k = 0..15) times 1024: rotations in integer arithmetic. */
extern const int vl_synth_rot[16][2];

#define VL_SYNTH_OCTAVES 7
#define VL_SYNTH_FIELDS (VL_SYNTH_OCTAVES + 3) /* luminance octaves + one chroma field per channel */

/* One value-noise field: a lattice of int8 values every `cell` pixels, bilinear with a
 * smoothstep weight between them. Tables sized for the canvas's largest image. */
typedef struct {
  int cell, gw, gh, amp;
  int8_t *lat;
  int16_t *xi, *xw; /* per x: lattice column, weight 0..256 */
  int16_t *xend;    /* per lattice column: first x past it */
  int16_t *yi, *yw; /* per y: lattice row, weight 0..256 */
  int32_t *row;     /* lattice row interpolated in y, scaled by 256 */
} vl_synth_field;

/* Per-thread working memory for images up to wmax x hmax. */
typedef struct {
  int wmax, hmax;
  vl_synth_field f[VL_SYNTH_FIELDS];
  int16_t *tex;  /* w*h luminance texture, levels (shapes carry it too) */
  uint8_t *rgb;  /* w*h*3, HWC */
  int32_t *acc;  /* 3 * wmax: a row accumulator, or a row of noise bits */
} vl_synth_canvas;

int vl_synth_canvas_init(vl_synth_canvas *c, int wmax, int hmax); /* 0, or -1: out of memory */
void vl_synth_canvas_free(vl_synth_canvas *c);

/* The background of a w x h image (w, h >= 2, within the canvas) into c->rgb, and its
 * luminance texture into c->tex: a bilinear gradient between four random corner colours,
 * octaves of value noise whose fine ones are scaled by a random roughness (some images
 * smooth like sky, some busy like foliage), and a slow chroma field per channel. */
void vl_synth_background(vl_synth_canvas *c, int w, int h, vl_rng *r);

/* Sensor-like noise over c->rgb: a sum of four uniform bytes (Irwin-Hall, sd 147.8) scaled
 * to a per-image sigma of 147.8 * q / 256 levels, q drawn in [sig_lo, sig_hi]. */
void vl_synth_noise(vl_synth_canvas *c, int w, int h, vl_rng *r, int sig_lo, int sig_hi);

#endif
