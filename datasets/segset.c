/* Synthetic segmentation set: what is its own (class styles, shapes with exact masks, the
 * PGM mask files, the manifest's columns, mask decoding); the generation
 * driver, manifest parsing and JPEG reading are shared with the jpegset (synth.h). See
 * segset.h for the content and the layout. */
#define _GNU_SOURCE
#include "segset.h"
#include "synth.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include <unistd.h>

/* Short local names for the shared synthesis helpers (synth.h). */
#define clamp255 vl_synth_clamp255
#define rnd_in vl_synth_rnd_in

#define PGM_HDR_MAX 32 /* "P5\n2048 2048\n255\n" and then some */

/* ================================ class styles ======================================== */

/* Hue on a 0..1535 wheel (six 256-step segments: red, yellow, green, cyan, blue, magenta).
 * Classes are spread evenly around it, offset so that class 1 is not pure red. */
static int class_hue(int cls, int num_classes) { return 64 + (cls - 1) * 1536 / (num_classes - 1); }
static int class_kind(int cls) { return (cls - 1) % VL_SYNTH_KINDS; }

/* Integer HSV -> RGB; h any integer (wrapped), s and v in 0..255. */
static void hsv_rgb(int h, int s, int v, int rgb[3]) {
  h %= 1536;
  if (h < 0) h += 1536;
  int seg = h / 256, f = h % 256;
  int p = v * (255 - s) / 255;
  int q = v * (255 * 256 - s * f) / (255 * 256);
  int t = v * (255 * 256 - s * (255 - f)) / (255 * 256);
  int r, g, b;
  switch (seg) {
  case 0: r = v, g = t, b = p; break;
  case 1: r = q, g = v, b = p; break;
  case 2: r = p, g = v, b = t; break;
  case 3: r = p, g = q, b = v; break;
  case 4: r = t, g = p, b = v; break;
  default: r = v, g = p, b = q; break;
  }
  rgb[0] = r, rgb[1] = g, rgb[2] = b;
}

#define NOMINAL_S 220
#define NOMINAL_V 200

void vl_segset_class_rgb(int cls, int num_classes, uint8_t rgb[3]) {
  if (cls < 1 || num_classes < 2 || cls >= num_classes) {
    rgb[0] = rgb[1] = rgb[2] = 128;
    return;
  }
  int c[3];
  hsv_rgb(class_hue(cls, num_classes), NOMINAL_S, NOMINAL_V, c);
  for (int k = 0; k < 3; k++) rgb[k] = (uint8_t)c[k];
}

/* ================================ synthesis =========================================== */

/* One shape of `kind` in colour col over the size x size canvas; where it lands, mask =
 * cls (mask NULL: a distractor, the mask is left alone). The draws, in this order, are
 * part of the set's bytes. */
static void draw_shape(vl_synth_canvas *cv, uint8_t *mask, int size, vl_rng *r, int kind,
                       const int col[3], int cls) {
  const int m = size;
  vl_synth_shape sh = {.kind = kind};
  sh.rx = rnd_in(r, m * 8 / 100, m * 22 / 100);
  int aspect = kind == VL_SYNTH_RING || kind == VL_SYNTH_CROSS ? rnd_in(r, 80, 125) : rnd_in(r, 60, 150);
  sh.ry = sh.rx * aspect / 100;
  if (sh.rx < 2) sh.rx = 2;
  if (sh.ry < 2) sh.ry = 2;
  sh.cx = rnd_in(r, m / 10, m - 1 - m / 10);
  sh.cy = rnd_in(r, m / 10, m - 1 - m / 10);
  sh.rot = vl_synth_rot[vl_rng_below(r, 16)];
  sh.alpha = rnd_in(r, 200, 256);
  sh.tex_gain = rnd_in(r, 48, 160);              /* texture carried in, /256 */
  sh.gx = rnd_in(r, -30, 30);                    /* shading across the shape */
  sh.gy = rnd_in(r, -30, 30);
  sh.R = sh.rx + sh.ry;                          /* >= the farthest corner */
  memcpy(sh.col, col, sizeof sh.col);
  vl_synth_paint(cv, size, size, &sh, mask, cls);
}

/* Sample i's image into cv->rgb and its class ids into mask (size*size). */
static void synth_sample(vl_synth_canvas *cv, uint8_t *mask, uint64_t seed, int64_t i, int size,
                         int num_classes) {
  vl_rng r;
  vl_rng_seed(&r, seed ^ vl_mix64((uint64_t)i * 0x9E3779B97F4A7C15ull + 0x5E65E7ull));
  vl_synth_background(cv, size, size, &r);
  memset(mask, 0, (size_t)size * size);

  /* Half the images: one unsaturated distractor first, background in the mask. */
  if (rnd_in(&r, 0, 1)) {
    int col[3];
    hsv_rgb(rnd_in(&r, 0, 1535), rnd_in(&r, 0, 50), rnd_in(&r, 60, 220), col);
    draw_shape(cv, NULL, size, &r, rnd_in(&r, 0, VL_SYNTH_KINDS - 1), col, 0);
  }
  /* Hue jitter: a sixth of the spacing between classes (at most 1/16 of the wheel), so
   * families never meet. */
  int hj = 1536 / (num_classes - 1) / 6;
  if (hj > 96) hj = 96;
  int nshapes = rnd_in(&r, 2, 6);
  for (int k = 0; k < nshapes; k++) {
    int cls = 1 + (int)vl_rng_below(&r, (uint64_t)(num_classes - 1));
    int col[3];
    hsv_rgb(class_hue(cls, num_classes) + rnd_in(&r, -hj, hj), rnd_in(&r, 170, 255),
            rnd_in(&r, 150, 250), col);
    draw_shape(cv, mask, size, &r, class_kind(cls), col, cls);
  }
  vl_synth_noise(cv, size, size, &r, 8, 20);
}

/* ================================ generation ========================================== */

void vl_segset_gen_cfg_default(vl_segset_gen_cfg *c) {
  memset(c, 0, sizeof *c);
  c->n = 512;
  c->size = 128;
  c->num_classes = 5;
  c->seed = 1;
  c->quality = 90;
}

static void mask_name(int64_t i, char *buf, size_t n) { snprintf(buf, n, "mask_%07lld.pgm", (long long)i); }

static size_t pgm_header(char *buf, size_t n, int w, int h) {
  return (size_t)snprintf(buf, n, "P5\n%d %d\n255\n", w, h);
}

/* Sample i synthesised and written, the JPEG's size into *result (synth.h's
 * vl_synth_gen.sample). The mask is drawn straight into the PGM file's pixels, after the
 * header, in the worker's extra memory. */
static vl_status gen_sample(vl_synth_worker *wk, const void *cfg, int64_t i, void *result,
                            const char *dir, vl_err *err) {
  const vl_segset_gen_cfg *c = cfg;
  const int size = c->size;
  char iname[32], mname[32];
  vl_synth_image_name(i, iname, sizeof iname);
  mask_name(i, mname, sizeof mname);
  uint8_t *pgm = wk->extra;
  size_t h = pgm_header((char *)pgm, PGM_HDR_MAX, size, size);
  synth_sample(&wk->cv, pgm + h, c->seed, i, size, c->num_classes);
  VL_TRY(vl_synth_write_jpeg(wk, dir, iname, size, size, result, err));
  return vl_synth_write_atomic(dir, mname, pgm, h + (size_t)size * size, err);
}

static int manifest_line(const void *cfg, int64_t i, const void *result, char *buf, size_t n) {
  const vl_segset_gen_cfg *c = cfg;
  if (i < 0)
    return snprintf(buf, n, "# vramlab-segset version=%d n=%lld size=%d classes=%d seed=%llu "
                            "quality=%d columns=image,mask,bytes\n",
                    VL_SEGSET_VERSION, (long long)c->n, c->size, c->num_classes,
                    (unsigned long long)c->seed, c->quality);
  char a[32], b[32];
  vl_synth_image_name(i, a, sizeof a);
  mask_name(i, b, sizeof b);
  return snprintf(buf, n, "%s\t%s\t%lld\n", a, b, (long long)*(const int64_t *)result);
}

vl_status vl_segset_generate(const char *dir, const vl_segset_gen_cfg *cfg, vl_err *err) {
  if (!dir || !cfg)
    return vl_err_set(err, VL_ERR_INVALID, "segset: no output directory or configuration");
  if (cfg->size < VL_SEGSET_SIZE_MIN || cfg->size > VL_SEGSET_SIZE_MAX)
    return vl_err_set(err, VL_ERR_INVALID, "segset: size must be in %d..%d (got %d)", VL_SEGSET_SIZE_MIN,
                      VL_SEGSET_SIZE_MAX, cfg->size);
  if (cfg->num_classes < 2 || cfg->num_classes > VL_SEGSET_CLASSES_MAX)
    return vl_err_set(err, VL_ERR_INVALID, "segset: num_classes must be in 2..%d, background included (got %d)",
                      VL_SEGSET_CLASSES_MAX, cfg->num_classes);
  const vl_synth_gen g = {
      .kind = "segset", .manifest = VL_SEGSET_MANIFEST, .cfg = cfg, .n = cfg->n,
      .quality = cfg->quality, .threads = cfg->threads, .progress = cfg->progress,
      .user = cfg->user, .wmax = cfg->size, .hmax = cfg->size,
      .extra_bytes = PGM_HDR_MAX + (size_t)cfg->size * cfg->size, .result_bytes = sizeof(int64_t),
      .sample = gen_sample, .manifest_line = manifest_line};
  return vl_synth_generate(dir, &g, err);
}

/* ================================ manifest ============================================ */

typedef struct {
  int64_t bytes;
  uint32_t img_off, mask_off; /* names, offsets into `names` */
} item;

struct vl_segset {
  char *dir;
  int64_t n;
  item *it;
  char *names;
  vl_segset_info info;
};

void vl_segset_close(vl_segset *s) {
  if (!s) return;
  free(s->dir);
  free(s->it);
  free(s->names);
  free(s);
}

int64_t vl_segset_len(const vl_segset *s) { return s ? s->n : 0; }

void vl_segset_info_get(const vl_segset *s, vl_segset_info *out) { *out = s->info; }

const char *vl_segset_path(const vl_segset *s, int64_t i, bool mask, char *buf, size_t n) {
  if (!s || i < 0 || i >= s->n) return NULL;
  const char *name = s->names + (mask ? s->it[i].mask_off : s->it[i].img_off);
  return vl_synth_join(buf, n, s->dir, name, NULL) == VL_OK ? buf : NULL;
}

/* An open in progress: the set being filled and what the header said (-1: absent). */
typedef struct {
  vl_segset *s;
  long long n, size, classes, quality;
  size_t names_len;
} parse_state;

/* The lines do not say the size or the classes, so the header must (synth.h's
 * vl_synth_manifest.header). */
static vl_status check_header(void *set, const char *mpath, vl_err *err) {
  const parse_state *ps = set;
  const char *missing = ps->n < 0 ? "n" : ps->size < 0 ? "size" : ps->classes < 0 ? "classes" : NULL;
  if (missing)
    return vl_err_set(err, VL_ERR_IO, "%s:1: the header has no %s= (a segset header gives n, size and classes)", mpath, missing);
  return VL_OK;
}

static uint32_t add_name(parse_state *ps, const char *name) {
  uint32_t off = (uint32_t)ps->names_len;
  memcpy(ps->s->names + off, name, strlen(name) + 1);
  ps->names_len += strlen(name) + 1;
  return off;
}

/* One sample line: image file, mask file, bytes (synth.h's vl_synth_manifest.line). */
static vl_status parse_line(void *set, char **fld, const char *mpath, int lineno, vl_err *err) {
  parse_state *ps = set;
  for (int k = 0; k < 2; k++)
    if (!vl_synth_plain_name(fld[k]))
      return vl_err_set(err, VL_ERR_IO, "%s:%d: bad %s file name \"%s\" (a plain name in the set's directory)", mpath,
                        lineno, k ? "mask" : "image", fld[k]);
  long long bytes;
  if (vl_synth_parse_int(fld[2], 1, 1ll << 40, &bytes))
    return vl_err_set(err, VL_ERR_IO, "%s:%d: bad bytes \"%s\" (a positive integer)", mpath, lineno, fld[2]);
  vl_segset *s = ps->s;
  item *it = &s->it[s->n++];
  it->bytes = bytes;
  it->img_off = add_name(ps, fld[0]);
  it->mask_off = add_name(ps, fld[1]);
  if (bytes > s->info.max_bytes) s->info.max_bytes = bytes;
  s->info.total_bytes += bytes;
  return VL_OK;
}

/* Room for every line of a manifest of len bytes: lines and names are bounded by it
 * (synth.h's vl_synth_manifest.prepare). */
static int prepare(void *set, const char *dir, int64_t lines, size_t len) {
  parse_state *ps = set;
  vl_segset *s = ps->s = calloc(1, sizeof *s);
  if (!s) return -1;
  s->dir = strdup(dir);
  s->it = calloc((size_t)lines, sizeof *s->it);
  s->names = malloc(len + 1);
  if (!s->dir || !s->it || !s->names) {
    vl_segset_close(s);
    ps->s = NULL;
    return -1;
  }
  return 0;
}

/* dir's manifest (text NULL) or the len bytes at text, parsed as dir's. */
static vl_status open_from(vl_segset **out, const char *dir, const char *text, size_t len, vl_err *err) {
  *out = NULL;
  parse_state ps = {.n = -1, .size = -1, .classes = -1, .quality = -1};
  unsigned long long seed = 0;
  const vl_synth_key keys[] = {{"n", 1, INT64_MAX, &ps.n},
                               {"size", VL_SEGSET_SIZE_MIN, VL_SEGSET_SIZE_MAX, &ps.size},
                               {"classes", 2, VL_SEGSET_CLASSES_MAX, &ps.classes},
                               {"quality", 1, 100, &ps.quality},
                               {NULL, 0, 0, NULL}};
  const vl_synth_manifest m = {
      .kind = "segset", .name = VL_SEGSET_MANIFEST, .magic = "# vramlab-segset",
      .version = VL_SEGSET_VERSION, .what = "segmentation set", .gen = "vramlab data gen --kind seg",
      .keys = keys, .seed = &seed, .n = &ps.n, .nfields = 3,
      .fields = "image file, mask file, bytes", .noun = "sample", .header = check_header,
      .prepare = prepare, .line = parse_line, .set = &ps};
  vl_status st = vl_synth_manifest_load(dir, &m, text, len, err);
  if (st != VL_OK) {
    vl_segset_close(ps.s);
    return st;
  }
  vl_segset_info *in = &ps.s->info;
  in->n = ps.s->n;
  in->version = VL_SEGSET_VERSION;
  in->size = (int)ps.size;
  in->num_classes = (int)ps.classes;
  in->quality = (int)ps.quality;
  in->seed = seed;
  *out = ps.s;
  return VL_OK;
}

vl_status vl_segset_open(vl_segset **out, const char *dir, vl_err *err) {
  return open_from(out, dir, NULL, 0, err);
}

vl_status vl_segset_parse(vl_segset **out, const char *dir, const char *text, size_t len, vl_err *err) {
  if (!text) {
    *out = NULL;
    return vl_err_set(err, VL_ERR_INVALID, "segset: no manifest text");
  }
  return open_from(out, dir, text, len, err);
}

vl_status vl_segset_first_use(vl_segset **out, const char *dir, const vl_segset_gen_cfg *cfg, bool *make,
                              vl_err *err) {
  *out = NULL;
  char gen[700];
  vl_err e2;
  snprintf(gen, sizeof gen, "vramlab data gen --kind seg --out %s --n %lld --size %d --classes %d --seed %llu --quality %d",
           dir, (long long)cfg->n, cfg->size, cfg->num_classes, (unsigned long long)cfg->seed, cfg->quality);
  VL_TRY(vl_synth_first_use(dir, VL_SEGSET_MANIFEST, gen, make, err));
  if (*make) return VL_OK;
  if (vl_segset_open(out, dir, &e2) != VL_OK)
    return vl_err_set(err, VL_ERR_IO,
                      "%s. The segmentation set in %s is damaged and is left as it is: delete the "
                      "folder (the next run makes it again) or remake it with `%s`",
                      e2.msg, dir, gen);
  const vl_segset_info *in = &(*out)->info;
  if (in->n != cfg->n || in->size != cfg->size || in->num_classes != cfg->num_classes ||
      in->seed != cfg->seed || (in->quality != -1 && in->quality != cfg->quality)) {
    vl_status st = vl_err_set(err, VL_ERR_IO,
                              "%s holds a segmentation set of n=%lld size=%d classes=%d seed=%llu "
                              "quality=%d, not the n=%lld size=%d classes=%d seed=%llu quality=%d asked "
                              "for: it is left as it is; delete the folder (the next run makes it again) "
                              "or use another",
                              dir, (long long)in->n, in->size, in->num_classes, (unsigned long long)in->seed,
                              in->quality, (long long)cfg->n, cfg->size, cfg->num_classes,
                              (unsigned long long)cfg->seed, cfg->quality);
    vl_segset_close(*out);
    *out = NULL;
    return st;
  }
  return VL_OK;
}

/* ================================ decoding ============================================ */

/* PGM whitespace (Netpbm's: blank, tab, CR, LF, vertical tab, form feed). */
static bool pgm_space(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* A PGM header number: skips whitespace and '#' comments (to the end of the line), then
 * reads decimal digits, at most 9 (so no arithmetic on it can overflow), which must end at
 * whitespace or a comment. 0, or -1 when there is no such number. */
static int pgm_number(const uint8_t *b, size_t len, size_t *pos, long *val) {
  size_t k = *pos;
  for (;;) {
    while (k < len && pgm_space(b[k])) k++;
    if (k < len && b[k] == '#') {
      while (k < len && b[k] != '\n') k++;
      continue;
    }
    break;
  }
  long v = 0;
  size_t d0 = k;
  while (k < len && b[k] >= '0' && b[k] <= '9' && k - d0 < 9) v = v * 10 + (b[k++] - '0');
  if (k == d0 || k >= len || !(pgm_space(b[k]) || b[k] == '#')) return -1; /* none, too long, or "32x" */
  *pos = k;
  *val = v;
  return 0;
}

vl_status vl_segset_decode_mask(const char *path, const uint8_t *buf, size_t len, int size,
                                int num_classes, uint8_t *dst, vl_err *err) {
  if (len < 2 || buf[0] != 'P' || buf[1] != '5')
    return vl_err_set(err, VL_ERR_IO, "%s: bad PGM header: not a binary PGM mask (the file must start with \"P5\", it starts with 0x%02x 0x%02x)",
                      path, len > 0 ? buf[0] : 0, len > 1 ? buf[1] : 0);
  size_t pos = 2;
  long w, h, maxval;
  /* "P5", whitespace, width, height, maxval (comments allowed between them), then exactly
   * one whitespace byte before the pixels. */
  if (pos >= len || !(pgm_space(buf[pos]) || buf[pos] == '#') || pgm_number(buf, len, &pos, &w) ||
      pgm_number(buf, len, &pos, &h) || pgm_number(buf, len, &pos, &maxval) ||
      !pgm_space(buf[pos])) {
    return vl_err_set(err, VL_ERR_IO, "%s: bad PGM header (expected \"P5 width height maxval\", each a decimal number of at most 9 digits, and one whitespace before the pixels)", path);
  }
  pos++; /* the single whitespace before the pixel data */
  if (w < 1 || h < 1)
    return vl_err_set(err, VL_ERR_IO, "%s: bad PGM header: %ldx%ld pixels", path, w, h);
  if (maxval != 255)
    return vl_err_set(err, VL_ERR_IO, "%s: bad PGM header: maxval %ld (masks are one byte per pixel, maxval 255)", path, maxval);
  /* Checked against the set before any size is computed from the file's numbers. */
  if (w != size || h != size)
    return vl_err_set(err, VL_ERR_IO, "%s: wrong mask dimensions: the mask is %ldx%ld but the image is %dx%d", path, w, h, size, size);
  const size_t need = (size_t)size * (size_t)size, have = len - pos;
  if (have < need)
    return vl_err_set(err, VL_ERR_IO, "%s: truncated mask: %zu of %zu pixel bytes", path, have, need);
  if (have > need)
    return vl_err_set(err, VL_ERR_IO, "%s: wrong mask size: %zu bytes past the %dx%d pixel data", path, have - need, size, size);
  const uint8_t *px = buf + pos;
  uint8_t mx = 0;
  for (size_t k = 0; k < need; k++) mx = px[k] > mx ? px[k] : mx;
  if (mx >= num_classes) { /* find where, for the message (the rare path) */
    size_t k = 0;
    while (px[k] < num_classes) k++;
    return vl_err_set(err, VL_ERR_IO, "%s: class id %d at (x %zu, y %zu) is >= num_classes %d", path, px[k],
                      k % (size_t)size, k / (size_t)size, num_classes);
  }
  memcpy(dst, px, need);
  return VL_OK;
}

static size_t mask_file_bytes(const vl_segset *s) { return PGM_HDR_MAX + (size_t)s->info.size * s->info.size; }

/* Sample i's mask file read into r->aux and checked into out->mask (grown). */
static vl_status read_mask(const vl_segset *s, vl_synth_reader *r, int64_t i, vl_image *out,
                           vl_err *err) {
  const int size = s->info.size;
  char path[PATH_MAX];
  size_t len = 0;
  if (!vl_segset_path(s, i, true, path, sizeof path))
    return vl_err_set(err, VL_ERR_IO, "segset: path of mask %lld too long", (long long)i);
  VL_TRY(vl_synth_read_file(path, r->max_file, &r->aux, &r->aux_cap, &len, err));
  VL_TRY(vl_synth_grow(&out->mask, &out->mask_cap, (size_t)size * size, path, "mask", size, size,
                       err));
  return vl_segset_decode_mask(path, r->aux, len, size, s->info.num_classes, out->mask, err);
}

/* Sample i's image and mask with r (synth.h's vl_synth_read_fn). */
static vl_status read_sample(void *set, vl_synth_reader *r, int64_t i, vl_image *out, vl_err *err) {
  const vl_segset *s = set;
  const int size = s->info.size;
  char path[PATH_MAX];
  if (!vl_segset_path(s, i, false, path, sizeof path))
    return vl_err_set(err, VL_ERR_IO, "segset: path of image %lld too long", (long long)i);
  const vl_synth_jpeg_want want = {size, size, s->it[i].bytes, "the set's size is"};
  VL_TRY(vl_synth_read_jpeg(r, path, &want, out, err));
  VL_TRY(read_mask(s, r, i, out, err));
  out->w = size;
  out->h = size;
  out->c = 3;
  out->label = 0;
  return VL_OK;
}

static int64_t ds_len(void *self) { return ((vl_segset *)self)->n; }

static void *ds_scratch_new(void *self) {
  const vl_segset *s = self;
  return vl_synth_reader_new((size_t)s->info.max_bytes, mask_file_bytes(s));
}

static vl_status ds_read(void *self, void *scratch, int64_t i, vl_image *out, vl_err *err) {
  return vl_synth_ds_read("segset", self, ((vl_segset *)self)->n, scratch, i, read_sample, out,
                          err);
}

vl_dataset vl_segset_dataset(vl_segset *s) {
  vl_dataset d = vl_synth_dataset(s, ds_len, ds_scratch_new, ds_read);
  /* The decoded image and mask live in the loader's vl_image. */
  d.scratch_bytes = vl_synth_reader_bytes((size_t)s->info.max_bytes, mask_file_bytes(s), s->info.size);
  d.max_image_bytes = (size_t)s->info.size * s->info.size * 3;
  return d;
}
