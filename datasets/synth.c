/* Shared helpers of the synthetic image sets: files (atomic writes, reads),
 * integer pixel synthesis (textured backgrounds, shapes, sensor noise), the generation
 * driver, the read side of a dataset and manifest parsing. See synth.h. */
#define _GNU_SOURCE
#include "synth.h"

#include "vramlab/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

const char *vl_synth_errstr(int e, char *buf, size_t n) { return strerror_r(e, buf, n); }
#define errstr vl_synth_errstr

vl_status vl_synth_join(char *buf, size_t n, const char *dir, const char *name, vl_err *err) {
  int k = snprintf(buf, n, "%s/%s", dir, name);
  if (k >= 0 && (size_t)k < n) return VL_OK;
  return vl_err_set(err, VL_ERR_INVALID, "path too long: %s/%s", dir, name);
}

/* ==================================== files ========================================== */

/* The files themselves are the engine's (vramlab/fileio.h): one copy for harness, cases and
 * data sets. */
vl_status vl_synth_mkdir_p(const char *dir, vl_err *err) { return vl_file_mkdir_p(dir, err); }

vl_status vl_synth_write_atomic(const char *dir, const char *name, const void *data, size_t len,
                                vl_err *err) {
  char path[PATH_MAX];
  VL_TRY(vl_synth_join(path, sizeof path, dir, name, err));
  return vl_file_write_atomic(path, data, len, err);
}

void vl_synth_fsync_dir(const char *dir) { vl_file_fsync_dir(dir); }

vl_status vl_synth_read_file(const char *path, uint64_t max_bytes, uint8_t **buf, size_t *cap,
                             size_t *len, vl_err *err) {
  vl_status s = vl_file_read(path, max_bytes, "max_file_bytes", buf, cap, len, err);
  if (s == VL_OK && *len == 0)
    return vl_err_set(err, VL_ERR_IO, "%s: empty file (0 bytes)", path);
  return s;
}

/* ============================== pixel synthesis ======================================= */
/* Integer arithmetic only, so the bytes depend on nothing but the seed. */

static const int oct_cell[VL_SYNTH_OCTAVES] = {96, 48, 24, 12, 6, 3, 2};
static const int oct_amp[VL_SYNTH_OCTAVES] = {40, 32, 30, 30, 34, 38, 38}; /* peak levels, before roughness */
#define CHROMA_CELL 80

const int vl_synth_rot[16][2] = {
    {1024, 0},    {1004, 200},  {946, 392},   {851, 569},  {724, 724},  {569, 851},
    {392, 946},   {200, 1004},  {0, 1024},    {-200, 1004}, {-392, 946}, {-569, 851},
    {-724, 724},  {-851, 569},  {-946, 392},  {-1004, 200}};

void vl_synth_canvas_free(vl_synth_canvas *c) {
  for (int k = 0; k < VL_SYNTH_FIELDS; k++) {
    vl_synth_field *f = &c->f[k];
    free(f->lat);
    free(f->xi);
    free(f->xw);
    free(f->yi);
    free(f->yw);
    free(f->row);
    free(f->xend);
  }
  free(c->tex);
  free(c->rgb);
  free(c->acc);
  memset(c, 0, sizeof *c);
}

int vl_synth_canvas_init(vl_synth_canvas *c, int wmax, int hmax) {
  memset(c, 0, sizeof *c);
  c->wmax = wmax;
  c->hmax = hmax;
  for (int k = 0; k < VL_SYNTH_FIELDS; k++) {
    int cell = k < VL_SYNTH_OCTAVES ? oct_cell[k] : CHROMA_CELL;
    vl_synth_field *f = &c->f[k];
    f->cell = cell;
    size_t gw = (size_t)wmax / cell + 3, gh = (size_t)hmax / cell + 3;
    f->lat = malloc(gw * gh);
    f->xi = malloc((size_t)wmax * sizeof *f->xi);
    f->xw = malloc((size_t)wmax * sizeof *f->xw);
    f->yi = malloc((size_t)hmax * sizeof *f->yi);
    f->yw = malloc((size_t)hmax * sizeof *f->yw);
    f->row = malloc(gw * sizeof *f->row);
    f->xend = malloc(gw * sizeof *f->xend);
    if (!f->lat || !f->xi || !f->xw || !f->yi || !f->yw || !f->row || !f->xend) goto fail;
  }
  c->tex = malloc((size_t)wmax * hmax * sizeof *c->tex);
  c->rgb = malloc((size_t)wmax * hmax * 3);
  c->acc = malloc(3 * (size_t)wmax * sizeof *c->acc);
  if (!c->tex || !c->rgb || !c->acc) goto fail;
  return 0;
fail:
  vl_synth_canvas_free(c);
  return -1;
}

static int smooth_w(int t, int cell) {
  int u = (t * 256 + cell / 2) / cell;          /* 0..255 */
  return (u * u * (768 - 2 * u)) / 65536;       /* smoothstep, 0..~255 */
}

static void field_setup(vl_synth_field *f, int w, int h, int amp, vl_rng *r) {
  f->amp = amp;
  /* (x + ox) / cell + 1 <= (w - 1 + cell - 1) / cell + 1 <= w / cell + 2 */
  f->gw = w / f->cell + 3;
  f->gh = h / f->cell + 3;
  int n = f->gw * f->gh;
  for (int i = 0; i < n; i += 8) {
    uint64_t v = vl_rng_u64(r);
    for (int b = 0; b < 8 && i + b < n; b++) f->lat[i + b] = (int8_t)(uint8_t)(v >> (8 * b));
  }
  /* A random sub-cell offset so lattice lines do not line up between octaves. */
  int ox = (int)vl_rng_below(r, (uint64_t)f->cell), oy = (int)vl_rng_below(r, (uint64_t)f->cell);
  for (int x = 0; x < w; x++) {
    f->xi[x] = (int16_t)((x + ox) / f->cell);
    f->xw[x] = (int16_t)smooth_w((x + ox) % f->cell, f->cell);
    f->xend[f->xi[x]] = (int16_t)(x + 1);
  }
  for (int y = 0; y < h; y++) {
    f->yi[y] = (int16_t)((y + oy) / f->cell);
    f->yw[y] = (int16_t)smooth_w((y + oy) % f->cell, f->cell);
  }
}

/* acc[x] += amp * noise(x, y) * 256 * 128 (noise in [-1, 1)). Right shifts of negative
 * values are arithmetic (GCC and Clang define it so). Runs of x in one lattice cell share
 * their end values, so the inner loop vectorises. */
static void field_row(vl_synth_field *f, int w, int y, int32_t *acc) {
  int cy = f->yi[y], wy = f->yw[y];
  const int8_t *l0 = f->lat + (size_t)cy * f->gw, *l1 = l0 + f->gw;
  int cmax = f->xi[w - 1] + 1;
  for (int k = 0; k <= cmax; k++) f->row[k] = l0[k] * 256 + (l1[k] - l0[k]) * wy;
  const int16_t *xw = f->xw;
  const int amp = f->amp;
  for (int x = 0; x < w;) {
    int c = f->xi[x];
    int x1 = f->xend[c] < w ? f->xend[c] : w;
    int32_t a = f->row[c] * 256, d = f->row[c + 1] - f->row[c];
    for (; x < x1; x++) acc[x] += ((a + d * xw[x]) >> 8) * amp; /* value * 65536 >> 8 */
  }
}

void vl_synth_background(vl_synth_canvas *s, int w, int h, vl_rng *r) {
  /* Texture: octaves of value noise; roughness scales the fine ones, so some images are
   * smooth (sky) and some busy (foliage), and file sizes spread like photos'. */
  int rough = vl_synth_rnd_in(r, 50, 200); /* percent */
  for (int k = 0; k < VL_SYNTH_OCTAVES; k++) {
    int amp = k < 2 ? oct_amp[k] : oct_amp[k] * rough / 100;
    field_setup(&s->f[k], w, h, amp, r);
  }
  for (int c = 0; c < 3; c++) field_setup(&s->f[VL_SYNTH_OCTAVES + c], w, h, vl_synth_rnd_in(r, 10, 35), r);

  /* Background: a bilinear gradient between four random corner colours. */
  int corner[4][3];
  for (int k = 0; k < 4; k++)
    for (int c = 0; c < 3; c++) corner[k][c] = vl_synth_rnd_in(r, 25, 230);
  int tint[3];
  for (int c = 0; c < 3; c++) tint[c] = vl_synth_rnd_in(r, 180, 256);

  for (int y = 0; y < h; y++) {
    int32_t *acc = s->acc;
    memset(acc, 0, (size_t)w * sizeof *acc);
    for (int k = 0; k < VL_SYNTH_OCTAVES; k++) field_row(&s->f[k], w, y, acc);
    int16_t *trow = s->tex + (size_t)y * w;
    for (int x = 0; x < w; x++) trow[x] = (int16_t)(acc[x] >> 15);
    for (int c = 0; c < 3; c++) {
      /* Gradient ends of this row, times 65536. */
      int64_t left = ((int64_t)corner[0][c] * (h - 1 - y) + (int64_t)corner[2][c] * y) * 65536 / (h - 1);
      int64_t right = ((int64_t)corner[1][c] * (h - 1 - y) + (int64_t)corner[3][c] * y) * 65536 / (h - 1);
      int64_t step = (right - left) / (w - 1);
      memset(acc, 0, (size_t)w * sizeof *acc);
      field_row(&s->f[VL_SYNTH_OCTAVES + c], w, y, acc);
      uint8_t *px = s->rgb + (size_t)y * w * 3 + c;
      int64_t g = left;
      for (int x = 0; x < w; x++, g += step) {
        int v = (int)(g >> 16) + (acc[x] >> 15) + ((trow[x] * tint[c]) >> 8);
        px[3 * x] = (uint8_t)vl_synth_clamp255(v);
      }
    }
  }
}

/* Is the rotated point (u, v) (pixels times S) inside a shape of kind k with half-extents
 * rx, ry? Integer arithmetic: sizes up to 2048 keep every product in int64 (the ellipse's
 * u^2 ry^2 is the largest, ~1e18 at 2048). */
static int inside(int kind, int64_t u, int64_t v, int64_t rx, int64_t ry, int64_t S) {
  int64_t au = u < 0 ? -u : u, av = v < 0 ? -v : v;
  switch (kind) {
  case VL_SYNTH_ELLIPSE: return u * u * ry * ry + v * v * rx * rx <= rx * rx * ry * ry * S * S;
  case VL_SYNTH_RECT: return au <= rx * S && av <= ry * S;
  case VL_SYNTH_TRIANGLE: /* apex at v = -ry, base at v = +ry with half-width rx */
    return v <= ry * S && 2 * ry * au <= rx * (v + ry * S);
  case VL_SYNTH_RING: {
    int64_t ix = rx * 55 / 100, iy = ry * 55 / 100;
    if (u * u * ry * ry + v * v * rx * rx > rx * rx * ry * ry * S * S) return 0;
    return ix < 1 || iy < 1 || u * u * iy * iy + v * v * ix * ix > ix * ix * iy * iy * S * S;
  }
  case VL_SYNTH_DIAMOND: return au * ry + av * rx <= rx * ry * S;
  default: /* VL_SYNTH_CROSS: two bars a third as thick as they are long */
    return (au <= rx * S && 3 * av <= ry * S) || (3 * au <= rx * S && av <= ry * S);
  }
}

/* One pixel of a shape: its colour lifted by the texture t and the shade, alpha-blended. */
static void blend(uint8_t *px, const int col[3], int t, int shade, int alpha) {
  for (int c = 0; c < 3; c++) {
    int val = vl_synth_clamp255(col[c] + t + shade);
    px[c] = (uint8_t)((val * alpha + px[c] * (256 - alpha)) >> 8);
  }
}

void vl_synth_paint(vl_synth_canvas *c, int w, int h, const vl_synth_shape *sh, uint8_t *mask,
                    int cls) {
  const int64_t S = 1024, R = sh->R, invR = 65536 / R;
  const int64_t co = sh->rot[0], si = sh->rot[1];
  int x0 = sh->cx - (int)R, x1 = sh->cx + (int)R, y0 = sh->cy - (int)R, y1 = sh->cy + (int)R;
  if (x0 < 0) x0 = 0;
  if (y0 < 0) y0 = 0;
  if (x1 > w - 1) x1 = w - 1;
  if (y1 > h - 1) y1 = h - 1;
  for (int y = y0; y <= y1; y++) {
    int64_t dy = y - sh->cy;
    for (int x = x0; x <= x1; x++) {
      int64_t dx = x - sh->cx;
      int64_t u = dx * co + dy * si, v = dy * co - dx * si; /* rotated, times 1024 */
      if (!inside(sh->kind, u, v, sh->rx, sh->ry, S)) continue;
      size_t at = (size_t)y * w + x;
      int shade = (int)(((dx * sh->gx + dy * sh->gy) * invR) >> 16);
      int t = (c->tex[at] * sh->tex_gain) >> 8;
      blend(c->rgb + at * 3, sh->col, t, shade, sh->alpha);
      if (mask) mask[at] = (uint8_t)cls;
    }
  }
}

void vl_synth_noise(vl_synth_canvas *s, int w, int h, vl_rng *r, int sig_lo, int sig_hi) {
  int sig_q = vl_synth_rnd_in(r, sig_lo, sig_hi); /* sigma = 147.8 * sig_q / 256 */
  const int rl = w * 3;
  uint32_t *rb = (uint32_t *)s->acc; /* w*3 u32 of random bits per row (acc holds 3*wmax) */
  for (int y = 0; y < h; y++) {
    for (int k = 0; k < rl; k += 2) {
      uint64_t v = vl_rng_u64(r);
      rb[k] = (uint32_t)v;
      if (k + 1 < rl) rb[k + 1] = (uint32_t)(v >> 32);
    }
    uint8_t *p = s->rgb + (size_t)y * rl;
    for (int k = 0; k < rl; k++) {
      uint32_t v = rb[k];
      int sum = (int)(v & 255) + (int)((v >> 8) & 255) + (int)((v >> 16) & 255) + (int)(v >> 24) - 510;
      p[k] = (uint8_t)vl_synth_clamp255(p[k] + ((sum * sig_q + 128) >> 8));
    }
  }
}

/* ================================ generation ========================================== */

#define SUBSAMP TJSAMP_420

void vl_synth_image_name(int64_t i, char *buf, size_t n) {
  snprintf(buf, n, "img_%07lld.jpg", (long long)i);
}

static void worker_free(vl_synth_worker *wk) {
  vl_synth_canvas_free(&wk->cv);
  if (wk->jbuf) tjFree(wk->jbuf);
  if (wk->tj) tjDestroy(wk->tj);
  free(wk->extra);
  memset(wk, 0, sizeof *wk);
}

static int worker_init(vl_synth_worker *wk, const vl_synth_gen *g) {
  memset(wk, 0, sizeof *wk);
  int ok = vl_synth_canvas_init(&wk->cv, g->wmax, g->hmax) == 0;
  /* The worst case of the largest image: the encoder never reallocates (NOREALLOC). */
  wk->jcap = tjBufSize(g->wmax, g->hmax, SUBSAMP);
  wk->jbuf = tjAlloc((int)wk->jcap);
  wk->tj = tjInitCompress();
  wk->quality = g->quality;
  wk->extra = g->extra_bytes ? malloc(g->extra_bytes) : NULL;
  if (!ok || !wk->jbuf || !wk->tj || (g->extra_bytes && !wk->extra)) {
    worker_free(wk);
    return -1;
  }
  return 0;
}

vl_status vl_synth_write_jpeg(vl_synth_worker *wk, const char *dir, const char *name, int w, int h,
                              int64_t *bytes, vl_err *err) {
  unsigned long jsize = wk->jcap;
  if (tjCompress2(wk->tj, wk->cv.rgb, w, 0, h, TJPF_RGB, &wk->jbuf, &jsize, SUBSAMP, wk->quality,
                  TJFLAG_NOREALLOC) != 0) {
    return vl_err_set(err, VL_ERR_IO, "%s/%s: TurboJPEG cannot encode: %s", dir, name, tjGetErrorStr2(wk->tj));
  }
  VL_TRY(vl_synth_write_atomic(dir, name, wk->jbuf, jsize, err));
  *bytes = (int64_t)jsize;
  return VL_OK;
}

static vl_status gen_args(const vl_synth_gen *g, vl_err *err) {
  if (g->n < 1)
    return vl_err_set(err, VL_ERR_INVALID, "%s: n must be at least 1 (got %lld)", g->kind, (long long)g->n);
  if (g->quality < 1 || g->quality > 100)
    return vl_err_set(err, VL_ERR_INVALID, "%s: quality must be in 1..100 (got %d)", g->kind, g->quality);
  if (g->threads < 0)
    return vl_err_set(err, VL_ERR_INVALID, "%s: threads must be >= 0 (got %d)", g->kind, g->threads);
  return VL_OK;
}

/* No manifest while samples are being (re)written: a half-made set cannot be opened. */
static vl_status remove_manifest(const char *dir, const char *name, vl_err *err) {
  char mpath[PATH_MAX], eb[128];
  VL_TRY(vl_synth_join(mpath, sizeof mpath, dir, name, err));
  if (unlink(mpath) != 0 && errno != ENOENT)
    return vl_err_set(err, VL_ERR_IO, "cannot remove the old %s: %s", mpath, errstr(errno, eb, sizeof eb));
  return VL_OK;
}

static int gen_threads(const vl_synth_gen *g) {
  int nt = g->threads > 0 ? g->threads : omp_get_max_threads();
  if (nt < 1) nt = 1;
  if ((int64_t)nt > g->n) nt = (int)g->n;
  return nt;
}

/* The first error of a generation, shared by its threads: later ones are dropped, and
 * samples not yet started are skipped. */
typedef struct {
  int failed;
  vl_status status;
  char msg[512];
} first_error;

static void fail_once(first_error *fe, vl_status s, const char *msg) {
#pragma omp critical(vl_synth_gen_err)
  if (!fe->msg[0]) {
    snprintf(fe->msg, sizeof fe->msg, "%s", msg);
    fe->status = s;
  }
#pragma omp atomic write
  fe->failed = 1;
}

static int has_failed(first_error *fe) {
  int f;
#pragma omp atomic read
  f = fe->failed;
  return f;
}

static void gen_one(vl_synth_worker *wk, const char *dir, const vl_synth_gen *g, uint8_t *results,
                    int64_t i, first_error *fe) {
  vl_err lerr = {""};
  vl_status s = g->sample(wk, g->cfg, i, results + (size_t)i * g->result_bytes, dir, &lerr);
  if (s != VL_OK) fail_once(fe, s, lerr.msg);
}

/* Every sample on nt threads, in chunks: after each (the loop's barrier: all of it is on
 * disk) the calling thread, the team's master, reports progress. */
static void gen_all(const char *dir, const vl_synth_gen *g, uint8_t *results, int nt,
                    first_error *fe) {
  const int64_t chunk = 4 * (int64_t)nt < 32 ? 32 : 4 * (int64_t)nt;
#pragma omp parallel num_threads(nt)
  {
    vl_synth_worker wk;
    int ok = worker_init(&wk, g) == 0;
    if (!ok) {
      char msg[160];
      snprintf(msg, sizeof msg, "%s: cannot set up an encoder (out of memory or TurboJPEG failure)", g->kind);
      fail_once(fe, VL_ERR_OOM, msg);
    }
    for (int64_t c0 = 0; c0 < g->n; c0 += chunk) {
      int64_t c1 = c0 + chunk < g->n ? c0 + chunk : g->n;
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = c0; i < c1; i++)
        if (ok && !has_failed(fe)) gen_one(&wk, dir, g, results, i, fe);
      /* the implicit barrier above: samples < c1 are on disk */
#pragma omp master
      if (!has_failed(fe) && g->progress) g->progress(c1, g->n, g->user);
    }
    worker_free(&wk);
  }
}

/* Appends line i (the header when i < 0) to the buffer *m: a line that does not fit is
 * formatted again once the buffer has grown. */
static int append_line(const vl_synth_gen *g, const uint8_t *results, int64_t i, char **m,
                       size_t *len, size_t *cap) {
  const void *res = i < 0 ? NULL : results + (size_t)i * g->result_bytes;
  for (;;) {
    int k = g->manifest_line(g->cfg, i, res, *m + *len, *cap - *len);
    if (k < 0) return -1;
    if ((size_t)k < *cap - *len) {
      *len += (size_t)k;
      return 0;
    }
    size_t ncap = 2 * *cap + (size_t)k;
    char *nm = realloc(*m, ncap);
    if (!nm) return -1;
    *m = nm;
    *cap = ncap;
  }
}

static vl_status write_manifest(const char *dir, const vl_synth_gen *g, const uint8_t *results,
                                vl_err *err) {
  size_t cap = 4096, len = 0;
  char *m = malloc(cap);
  int rc = m ? 0 : -1;
  for (int64_t i = -1; rc == 0 && i < g->n; i++) rc = append_line(g, results, i, &m, &len, &cap);
  vl_status s = rc != 0 ? vl_err_set(err, VL_ERR_OOM, "out of memory for the manifest")
                        : vl_synth_write_atomic(dir, g->manifest, m, len, err);
  free(m);
  return s;
}

vl_status vl_synth_generate(const char *dir, const vl_synth_gen *g, vl_err *err) {
  VL_TRY(gen_args(g, err));
  VL_TRY(vl_synth_mkdir_p(dir, err));
  VL_TRY(remove_manifest(dir, g->manifest, err));
  uint8_t *results = calloc((size_t)g->n, g->result_bytes);
  if (!results)
    return vl_err_set(err, VL_ERR_OOM, "out of memory for %lld manifest entries", (long long)g->n);
  first_error fe = {0};
  gen_all(dir, g, results, gen_threads(g), &fe);
  vl_status rc = VL_OK;
  if (fe.failed) {
    rc = vl_err_set(err, fe.status, "%s", fe.msg);
  } else {
    rc = write_manifest(dir, g, results, err);
    if (rc == VL_OK) vl_synth_fsync_dir(dir);
  }
  free(results);
  return rc;
}

/* ================================== reading =========================================== */

/* Decoding as PIL/libjpeg do by default (accurate DCT, fancy upsampling), stopping at the
 * first warning (a warning means damaged data, e.g. premature end of file) and refusing a
 * progressive file of more than 500 scans (TJFLAG_LIMITSCANS: a few hundred bytes of
 * crafted scans can otherwise keep the decoder busy for minutes). */
#define DECODE_FLAGS (TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS)

vl_synth_reader *vl_synth_reader_new(size_t cap, size_t aux_cap) {
  vl_synth_reader *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->max_file = VL_LOADER_MAX_FILE_BYTES;
  /* The manifest's sizes are the sharer's to choose: no buffer larger than a file may be.
   * A buffer that cannot be had now is grown on first use instead. */
  if (cap > r->max_file) cap = (size_t)r->max_file;
  if (aux_cap > r->max_file) aux_cap = (size_t)r->max_file;
  r->buf = cap ? malloc(cap) : NULL;
  r->cap = r->buf ? cap : 0;
  r->aux = aux_cap ? malloc(aux_cap) : NULL;
  r->aux_cap = r->aux ? aux_cap : 0;
  return r;
}

static void reader_clear(vl_synth_reader *r) {
  free(r->buf);
  free(r->aux);
}

void vl_synth_reader_delete(void *self, void *reader) {
  (void)self;
  if (!reader) return;
  reader_clear(reader);
  free(reader);
}

void vl_synth_reader_limit(void *self, void *reader, uint64_t max_file_bytes) {
  (void)self;
  ((vl_synth_reader *)reader)->max_file = max_file_bytes;
}

size_t vl_synth_reader_bytes(size_t cap, size_t aux_cap, int max_w) {
  return cap + aux_cap + sizeof(vl_synth_reader) + 65536 + (size_t)max_w * 3 * 48;
}

vl_status vl_synth_grow(uint8_t **buf, size_t *cap, size_t need, const char *path, const char *what,
                        int w, int h, vl_err *err) {
  if (*cap >= need && *buf) return VL_OK;
  uint8_t *nb = realloc(*buf, need);
  if (!nb)
    return vl_err_set(err, VL_ERR_OOM, "%s: out of memory for a %dx%d %s", path, w, h, what);
  *buf = nb;
  *cap = need;
  return VL_OK;
}

static const char *colorspace_name(int cs) {
  switch (cs) {
  case TJCS_RGB: return "RGB";
  case TJCS_YCbCr: return "YCbCr";
  case TJCS_GRAY: return "grayscale";
  case TJCS_CMYK: return "CMYK";
  case TJCS_YCCK: return "CMYK (stored as YCCK)";
  default: return "unknown";
  }
}

/* vl_synth_decode_jpeg with the fresh decompressor tj. */
static vl_status decode_with(tjhandle tj, const char *path, const uint8_t *buf, size_t len,
                             const vl_synth_jpeg_want *want, vl_image *out, vl_err *err) {
  /* A file of another size than the set says changed since the set was made: said with
   * the decoder's words when it fails, and on its own when it decodes. */
  char note[96] = "";
  if ((int64_t)len != want->bytes)
    snprintf(note, sizeof note, " (the file is %zu bytes, the manifest says %lld)", len, (long long)want->bytes);
  int w = 0, h = 0, ss = 0, cs = -1;
  if (tjDecompressHeader3(tj, buf, (unsigned long)len, &w, &h, &ss, &cs) != 0)
    return vl_err_set(err, VL_ERR_IO, "%s: not a readable JPEG (TurboJPEG: %s)%s", path, tjGetErrorStr2(tj), note);
  /* TurboJPEG 2.1 takes a stream that ends before its frame header (a start marker and
   * nothing else, or tables only) for a "tables-only" stream: success, 0x0. */
  if (w < 1 || h < 1)
    return vl_err_set(err, VL_ERR_IO, "%s: truncated JPEG (no frame header)%s", path, note);
  /* TurboJPEG cannot convert CMYK to RGB; PIL converts it with a formula of its own. */
  if (cs == TJCS_CMYK || cs == TJCS_YCCK)
    return vl_err_set(err, VL_ERR_IO, "%s: unsupported colour space %s (the loader reads RGB, YCbCr and grayscale JPEGs)%s",
                      path, colorspace_name(cs), note);
  if (w != want->w || h != want->h)
    return vl_err_set(err, VL_ERR_IO, "%s: the JPEG is %dx%d but %s %dx%d", path, w, h, want->says, want->w, want->h);
  if (vl_synth_grow(&out->pix, &out->cap, (size_t)w * (size_t)h * 3, path, "image", w, h, err) != VL_OK)
    return VL_ERR_OOM;
  if (tjDecompress2(tj, buf, (unsigned long)len, out->pix, w, 0, h, TJPF_RGB, DECODE_FLAGS) != 0) {
    const int code = tjGetErrorCode(tj);
    const char *why = tjGetErrorStr2(tj);
    /* libjpeg's "Quantization table 0x00 was not defined": the file relies on tables it
     * does not carry (an abbreviated stream), which no decoder of this one file has. */
    const char *what = strstr(why, "Quantization table") ? "missing quantisation table" : "corrupt or truncated JPEG";
    return vl_err_set(err, VL_ERR_IO, "%s: %s (TurboJPEG %s: %s)%s", path, what,
                      code == TJERR_WARNING ? "warning" : "error", why, note);
  }
  if (note[0])
    return vl_err_set(err, VL_ERR_IO, "%s: decodes, but it changed since the set was made%s", path, note);
  return VL_OK;
}

/* One decompressor per image, never reused: libjpeg keeps the quantisation and Huffman
 * tables of earlier images on a handle (abbreviated datastreams), so on a reused handle a
 * file without its own DQT decodes "successfully" with the tables of whatever image that
 * worker read before, and the pixels and skip counts then depend on the read order and the
 * worker count. TurboJPEG 2.1 also leaves a handle whose decode failed mid-header broken
 * for the next file. A fresh handle is cheap: making and freeing one took 0.1 us, and the
 * synthetic set (500x375 on average) decoded at 0.79 ms per image with one handle per
 * image as with one for all (the difference within the 2% noise). */
vl_status vl_synth_decode_jpeg(const char *path, const uint8_t *buf, size_t len,
                               const vl_synth_jpeg_want *want, vl_image *out, vl_err *err) {
  tjhandle tj = tjInitDecompress();
  if (!tj)
    return vl_err_set(err, VL_ERR_OOM, "%s: cannot create a TurboJPEG decompressor: %s", path, tjGetErrorStr2(NULL));
  vl_status status = decode_with(tj, path, buf, len, want, out, err);
  tjDestroy(tj);
  return status;
}

vl_status vl_synth_read_jpeg(vl_synth_reader *r, const char *path, const vl_synth_jpeg_want *want,
                             vl_image *out, vl_err *err) {
  size_t len = 0;
  VL_TRY(vl_synth_read_file(path, r->max_file, &r->buf, &r->cap, &len, err));
  return vl_synth_decode_jpeg(path, r->buf, len, want, out, err);
}

vl_status vl_synth_ds_read(const char *kind, void *set, int64_t n, void *scratch, int64_t i,
                           vl_synth_read_fn read_fn, vl_image *out, vl_err *err) {
  if (i < 0 || i >= n)
    return vl_err_set(err, VL_ERR_INVALID, "%s: index %lld out of range [0, %lld)", kind, (long long)i, (long long)n);
  vl_synth_reader local = {.max_file = VL_LOADER_MAX_FILE_BYTES};
  vl_synth_reader *r = scratch ? scratch : &local;
  vl_status status = read_fn(set, r, i, out, err);
  if (r == &local) reader_clear(&local);
  return status;
}

vl_dataset vl_synth_dataset(void *set, int64_t (*len)(void *self), void *(*scratch_new)(void *self),
                            vl_status (*read)(void *self, void *scratch, int64_t i, vl_image *out,
                                              vl_err *err)) {
  vl_dataset d;
  memset(&d, 0, sizeof d);
  d.self = set;
  d.len = len;
  d.scratch_new = scratch_new;
  d.scratch_free = vl_synth_reader_delete;
  d.scratch_limit = vl_synth_reader_limit;
  d.read = read;
  return d;
}

/* ================================= manifests ========================================== */

int vl_synth_parse_int(const char *t, long long lo, long long hi, long long *out) {
  if (!t || !*t || *t == ' ' || *t == '+') return -1;
  char *end;
  errno = 0;
  long long v = strtoll(t, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int vl_synth_plain_name(const char *name) {
  return *name && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..") && strlen(name) <= 255;
}

/* Missing: with a hint, since the usual cause is a set never made or an interrupted run. */
static vl_status manifest_missing(const char *mpath, const vl_synth_manifest *m, int e, vl_err *err) {
  char eb[128];
  if (e == ENOENT)
    return vl_err_set(err, VL_ERR_IO,
                      "%s: cannot open: %s (no %s here: make one with `%s --out DIR`; an "
                      "interrupted generation leaves no manifest)",
                      mpath, errstr(e, eb, sizeof eb), m->what, m->gen);
  return vl_err_set(err, VL_ERR_IO, "%s: cannot open: %s", mpath, errstr(e, eb, sizeof eb));
}

/* The manifest's text, NUL-terminated (free it), into *out and its length: dir's file when
 * src is NULL, else a copy of the len bytes at src. VL_ERR_IO or VL_ERR_OOM with a message
 * (*out NULL). */
static vl_status manifest_text(const char *mpath, const vl_synth_manifest *m, const char *src,
                               size_t *len, char **out, vl_err *err) {
  char *text = NULL;
  *out = NULL;
  if (src) {
    text = malloc(*len + 1);
    if (text) memcpy(text, src, *len);
  } else {
    struct stat st;
    if (stat(mpath, &st) != 0) return manifest_missing(mpath, m, errno, err);
    uint8_t *raw = NULL;
    size_t cap = 0;
    *len = 0;
    vl_status rs = vl_synth_read_file(mpath, VL_SYNTH_MANIFEST_MAX, &raw, &cap, len, err);
    if (rs != VL_OK && !(rs == VL_ERR_IO && S_ISREG(st.st_mode) && st.st_size == 0)) {
      free(raw);
      return rs;
    }
    text = realloc(raw, *len + 1); /* an empty one: said below, with what a header is */
    if (!text) free(raw);
  }
  if (!text) return vl_err_set(err, VL_ERR_OOM, "%s: out of memory", mpath);
  text[*len] = '\0';
  if (*len == 0) {
    free(text);
    return vl_err_set(err, VL_ERR_IO, "%s:1: empty manifest (expected a header \"%s version=%d ...\")", mpath,
                      m->magic, m->version);
  }
  /* The parser works on C strings: a NUL would end the manifest early, silently. */
  if (memchr(text, '\0', *len)) {
    free(text);
    return vl_err_set(err, VL_ERR_IO, "%s: binary data in the manifest (NUL byte)", mpath);
  }
  *out = text;
  return VL_OK;
}

static int parse_seed(const char *v, unsigned long long *seed) {
  char *end;
  errno = 0;
  unsigned long long s = strtoull(v, &end, 10);
  if (errno || !*v || *end || *v == '-') return -1; /* strtoull would wrap "-4" around */
  if (seed) *seed = s;
  return 0;
}

/* One header value; keys the set does not know are skipped (a later version may add some). */
static int parse_value(const vl_synth_manifest *m, const char *key, const char *v, long long *version) {
  if (!strcmp(key, "version")) return vl_synth_parse_int(v, 0, INT_MAX, version);
  if (!strcmp(key, "seed")) return parse_seed(v, m->seed);
  for (const vl_synth_key *k = m->keys; k && k->key; k++)
    if (!strcmp(key, k->key)) return vl_synth_parse_int(v, k->lo, k->hi, k->val);
  return 0;
}

static vl_status parse_keys(char *p, const char *mpath, const vl_synth_manifest *m, long long *version,
                            vl_err *err) {
  char *save = NULL;
  for (char *t = strtok_r(p, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
    char *eq = strchr(t, '=');
    if (!eq) continue;
    *eq = '\0';
    if (parse_value(m, t, eq + 1, version) != 0)
      return vl_err_set(err, VL_ERR_IO, "%s:1: bad header value %s=%s", mpath, t, eq + 1);
  }
  return VL_OK;
}

static vl_status parse_header(char *line, const char *mpath, const vl_synth_manifest *m, vl_err *err) {
  size_t ml = strlen(m->magic);
  if (strncmp(line, m->magic, ml) != 0 || (line[ml] != ' ' && line[ml] != '\0')) {
    /* magic + 2: the set's name without the "# " */
    return vl_err_set(err, VL_ERR_IO, "%s:1: not a %s manifest (the header must start with \"%s\")", mpath,
                      m->magic + 2, m->magic);
  }
  long long version = -1;
  VL_TRY(parse_keys(line + ml, mpath, m, &version, err));
  if (version < 0)
    return vl_err_set(err, VL_ERR_IO, "%s:1: the header has no version=", mpath);
  if (version != m->version)
    return vl_err_set(err, VL_ERR_IO,
                      "%s:1: unknown manifest version %lld (this build reads version %d; regenerate the set with `%s`)",
                      mpath, version, m->version, m->gen);
  return m->header ? m->header(m->set, mpath, err) : VL_OK;
}

/* The line at *p, NUL-terminated without its "\n" or "\r\n"; *p moves past it. */
static char *next_line(char **p) {
  char *line = *p, *nl = strchr(line, '\n');
  *p = nl ? nl + 1 : line + strlen(line);
  if (nl) *nl = '\0';
  size_t ll = strlen(line);
  if (ll && line[ll - 1] == '\r') line[ll - 1] = '\0';
  return line;
}

static vl_status split_fields(char *line, char **fld, const char *mpath, int lineno,
                              const vl_synth_manifest *m, vl_err *err) {
  if (!*line)
    return vl_err_set(err, VL_ERR_IO, "%s:%d: empty line (expected %s)", mpath, lineno, m->fields);
  int nf = 0;
  for (char *q = line;;) {
    if (nf < m->nfields) fld[nf] = q;
    nf++;
    char *tab = strchr(q, '\t');
    if (!tab) break;
    *tab = '\0';
    q = tab + 1;
  }
  if (nf != m->nfields)
    return vl_err_set(err, VL_ERR_IO, "%s:%d: expected %d tab-separated fields (%s), found %d", mpath, lineno,
                      m->nfields, m->fields, nf);
  return VL_OK;
}

/* text parsed in place: the header, then every line, then the count. VL_OK, or VL_ERR_IO
 * (VL_ERR_OOM) with a message. */
static vl_status manifest_parse(char *text, const char *mpath, const vl_synth_manifest *m, vl_err *err) {
  char *p = text;
  VL_TRY(parse_header(next_line(&p), mpath, m, err));
  int lineno = 1;
  int64_t count = 0;
  for (; *p; count++) {
    char *fld[VL_SYNTH_MAX_FIELDS];
    lineno++;
    VL_TRY(split_fields(next_line(&p), fld, mpath, lineno, m, err));
    VL_TRY(m->line(m->set, fld, mpath, lineno, err));
  }
  if (count == 0)
    return vl_err_set(err, VL_ERR_IO, "%s: no %ss listed", mpath, m->noun);
  if (m->n && *m->n >= 0 && *m->n != count)
    return vl_err_set(err, VL_ERR_IO, "%s:%d: the header says n=%lld but %lld %s lines follow (truncated or edited manifest?)",
                      mpath, lineno, *m->n, (long long)count, m->noun);
  return VL_OK;
}

vl_status vl_synth_manifest_load(const char *dir, const vl_synth_manifest *m, const char *src,
                                 size_t len, vl_err *err) {
  char mpath[PATH_MAX];
  if (!dir || vl_synth_join(mpath, sizeof mpath, dir, m->name, NULL) != VL_OK)
    return vl_err_set(err, VL_ERR_IO, "%s: bad directory name", m->kind);
  char *text;
  VL_TRY(manifest_text(mpath, m, src, &len, &text, err));
  int64_t lines = 1; /* a bound on the samples */
  for (size_t k = 0; k < len; k++) lines += text[k] == '\n';
  vl_status rc = m->prepare(m->set, dir, lines, len) != 0 ? vl_err_set(err, VL_ERR_OOM, "%s: out of memory", mpath)
                                                          : manifest_parse(text, mpath, m, err);
  free(text);
  return rc;
}

/* ================================= first use ========================================== */

/* prefix, at least 7 decimal digits, suffix: the names vl_synth_image_name and the segset
 * give the files of a sample. */
static bool numbered(const char *s, size_t n, const char *prefix, const char *suffix) {
  size_t p = strlen(prefix), q = strlen(suffix);
  if (n < p + 7 + q || strncmp(s, prefix, p) || strncmp(s + n - q, suffix, q)) return false;
  for (size_t k = p; k < n - q; k++)
    if (s[k] < '0' || s[k] > '9') return false;
  return true;
}

/* A file that an interrupted generation leaves: a sample's image or mask, or the temporary
 * ".NAME.tmp.PID" of one of them or of the manifest (see vl_synth_write_atomic). */
static bool gen_leftover(const char *name, const char *manifest) {
  size_t n = strlen(name);
  if (name[0] == '.') {
    const char *t = NULL;
    for (const char *p = strstr(name, ".tmp."); p; p = strstr(p + 1, ".tmp.")) t = p;
    if (!t || !t[5]) return false;
    for (const char *d = t + 5; *d; d++)
      if (*d < '0' || *d > '9') return false;
    name++;
    n = (size_t)(t - name);
    if (n == strlen(manifest) && !strncmp(name, manifest, n)) return true;
  }
  return numbered(name, n, "img_", ".jpg") || numbered(name, n, "mask_", ".pgm");
}

vl_status vl_synth_first_use(const char *dir, const char *manifest, const char *gen, bool *make, vl_err *err) {
  char eb[128], mpath[PATH_MAX];
  struct stat st;
  *make = false;
  if (stat(dir, &st) != 0) {
    if (errno == ENOENT) {
      *make = true;
      return VL_OK;
    }
    return vl_err_set(err, VL_ERR_IO, "%s: cannot stat: %s", dir, errstr(errno, eb, sizeof eb));
  }
  if (!S_ISDIR(st.st_mode))
    return vl_err_set(err, VL_ERR_IO, "%s exists and is not a directory", dir);
  VL_TRY(vl_synth_join(mpath, sizeof mpath, dir, manifest, err));
  /* lstat: whatever is there (a dangling link, a FIFO) is the open's to report */
  if (lstat(mpath, &st) == 0) return VL_OK;
  if (errno != ENOENT)
    return vl_err_set(err, VL_ERR_IO, "%s: cannot stat: %s", mpath, errstr(errno, eb, sizeof eb));
  DIR *d = opendir(dir);
  if (!d)
    return vl_err_set(err, VL_ERR_IO, "%s: cannot list: %s", dir, errstr(errno, eb, sizeof eb));
  char other[256] = "";
  for (struct dirent *e; !other[0] && (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !gen_leftover(e->d_name, manifest))
      snprintf(other, sizeof other, "%s", e->d_name);
  closedir(d);
  if (!other[0]) {
    *make = true;
    return VL_OK;
  }
  return vl_err_set(err, VL_ERR_IO,
                    "%s is not empty (it holds \"%s\") and has no %s: a data set is made only in "
                    "a new or empty folder (vramlab never writes into one that holds other "
                    "files); delete the folder or use another%s%s%s",
                    dir, other, manifest, gen ? ", or make a set there yourself with `" : "", gen ? gen : "",
                    gen ? "`" : "");
}
