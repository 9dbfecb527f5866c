/* Synthetic segmentation set: generation (integer pixel synthesis shared with the jpegset,
 * class shapes with exact masks, TurboJPEG), the manifest, decoding (JPEG + PGM mask) as a
 * vl_dataset, and damage for tests. See segset.h for the content and the layout. */
#define _GNU_SOURCE
#include "segset.h"
#include "synth.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#define setf vl_synth_setf
/* Short local names for the shared synthesis helpers (synth.h). */
#define clamp255 vl_synth_clamp255
#define rnd_in vl_synth_rnd_in

#define SUBSAMP TJSAMP_420
/* As the jpegset: accurate DCT, fancy upsampling, stop at the first warning (damage). */
#define DECODE_FLAGS TJFLAG_STOPONWARNING
#define PGM_HDR_MAX 32 /* "P5\n2048 2048\n255\n" and then some */

static const char *errstr(int e, char *buf, size_t n) { return strerror_r(e, buf, n); }

/* ================================ class styles ======================================== */

enum { K_ELLIPSE, K_RECT, K_TRIANGLE, K_RING, K_DIAMOND, K_CROSS, N_KINDS };

/* Hue on a 0..1535 wheel (six 256-step segments: red, yellow, green, cyan, blue, magenta).
 * Classes are spread evenly around it, offset so that class 1 is not pure red. */
static int class_hue(int cls, int num_classes) { return 64 + (cls - 1) * 1536 / (num_classes - 1); }
static int class_kind(int cls) { return (cls - 1) % N_KINDS; }

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

typedef struct {
  vl_synth_canvas cv; /* size x size */
  uint8_t *mask;      /* size*size class ids */
  uint8_t *pgm;       /* PGM header + size*size */
  tjhandle tj;
  uint8_t *jbuf;
  unsigned long jcap;
} synth;

static void synth_free(synth *s) {
  vl_synth_canvas_free(&s->cv);
  free(s->mask);
  free(s->pgm);
  if (s->jbuf) tjFree(s->jbuf);
  if (s->tj) tjDestroy(s->tj);
  memset(s, 0, sizeof *s);
}

static int synth_init(synth *s, int size) {
  memset(s, 0, sizeof *s);
  if (vl_synth_canvas_init(&s->cv, size, size) != 0) return -1;
  s->mask = malloc((size_t)size * size);
  s->pgm = malloc(PGM_HDR_MAX + (size_t)size * size);
  s->jcap = tjBufSize(size, size, SUBSAMP);
  s->jbuf = tjAlloc((int)s->jcap);
  s->tj = tjInitCompress();
  if (!s->mask || !s->pgm || !s->jbuf || !s->tj) {
    synth_free(s);
    return -1;
  }
  return 0;
}

/* Is the rotated point (u, v) (pixels times S) inside a shape of kind k with half-extents
 * rx, ry? Integer arithmetic: sizes up to VL_SEGSET_SIZE_MAX keep every product in int64
 * (the ellipse's u^2 ry^2 is the largest, ~1e18 at 2048). */
static int inside(int kind, int64_t u, int64_t v, int64_t rx, int64_t ry, int64_t S) {
  int64_t au = u < 0 ? -u : u, av = v < 0 ? -v : v;
  switch (kind) {
  case K_ELLIPSE: return u * u * ry * ry + v * v * rx * rx <= rx * rx * ry * ry * S * S;
  case K_RECT: return au <= rx * S && av <= ry * S;
  case K_TRIANGLE: /* apex at v = -ry, base at v = +ry with half-width rx */
    return v <= ry * S && 2 * ry * au <= rx * (v + ry * S);
  case K_RING: {
    int64_t ix = rx * 55 / 100, iy = ry * 55 / 100;
    if (u * u * ry * ry + v * v * rx * rx > rx * rx * ry * ry * S * S) return 0;
    return ix < 1 || iy < 1 || u * u * iy * iy + v * v * ix * ix > ix * ix * iy * iy * S * S;
  }
  case K_DIAMOND: return au * ry + av * rx <= rx * ry * S;
  default: /* K_CROSS: two bars a third as thick as they are long */
    return (au <= rx * S && 3 * av <= ry * S) || (3 * au <= rx * S && av <= ry * S);
  }
}

/* One shape of `kind` in colour col over the canvas; where it lands, mask = cls (cls < 0:
 * the mask is left alone, a distractor). The background's texture and a shading gradient
 * are carried into the shape, which is alpha-blended over what is below. */
static void draw_shape(synth *s, int size, vl_rng *r, int kind, const int col[3], int cls) {
  const int m = size;
  int64_t rx = rnd_in(r, m * 8 / 100, m * 22 / 100);
  int aspect = kind == K_RING || kind == K_CROSS ? rnd_in(r, 80, 125) : rnd_in(r, 60, 150);
  int64_t ry = rx * aspect / 100;
  if (rx < 2) rx = 2;
  if (ry < 2) ry = 2;
  int cx = rnd_in(r, m / 10, m - 1 - m / 10), cy = rnd_in(r, m / 10, m - 1 - m / 10);
  const int *cs = vl_synth_rot[vl_rng_below(r, 16)];
  int64_t co = cs[0], si = cs[1];
  int alpha = rnd_in(r, 200, 256);
  int tex_gain = rnd_in(r, 48, 160);                    /* texture carried in, /256 */
  int gx = rnd_in(r, -30, 30), gy = rnd_in(r, -30, 30); /* shading across the shape */
  const int64_t S = 1024, R = rx + ry;                  /* R >= the farthest corner */
  const int64_t invR = 65536 / R;
  int x0 = cx - (int)R, x1 = cx + (int)R, y0 = cy - (int)R, y1 = cy + (int)R;
  if (x0 < 0) x0 = 0;
  if (y0 < 0) y0 = 0;
  if (x1 > size - 1) x1 = size - 1;
  if (y1 > size - 1) y1 = size - 1;
  for (int y = y0; y <= y1; y++) {
    int64_t dy = y - cy;
    for (int x = x0; x <= x1; x++) {
      int64_t dx = x - cx;
      int64_t u = dx * co + dy * si, v = dy * co - dx * si; /* rotated, times 1024 */
      if (!inside(kind, u, v, rx, ry, S)) continue;
      size_t at = (size_t)y * size + x;
      int shade = (int)(((dx * gx + dy * gy) * invR) >> 16);
      int t = (s->cv.tex[at] * tex_gain) >> 8;
      uint8_t *px = s->cv.rgb + at * 3;
      for (int c = 0; c < 3; c++) {
        int val = clamp255(col[c] + t + shade);
        px[c] = (uint8_t)((val * alpha + px[c] * (256 - alpha)) >> 8);
      }
      if (cls >= 0) s->mask[at] = (uint8_t)cls;
    }
  }
}

static void synth_sample(synth *s, uint64_t seed, int64_t i, int size, int num_classes) {
  vl_rng r;
  vl_rng_seed(&r, seed ^ vl_mix64((uint64_t)i * 0x9E3779B97F4A7C15ull + 0x5E65E7ull));
  vl_synth_background(&s->cv, size, size, &r);
  memset(s->mask, 0, (size_t)size * size);

  /* Half the images: one unsaturated distractor first, background in the mask. */
  if (rnd_in(&r, 0, 1)) {
    int col[3];
    hsv_rgb(rnd_in(&r, 0, 1535), rnd_in(&r, 0, 50), rnd_in(&r, 60, 220), col);
    draw_shape(s, size, &r, rnd_in(&r, 0, N_KINDS - 1), col, -1);
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
    draw_shape(s, size, &r, class_kind(cls), col, cls);
  }
  vl_synth_noise(&s->cv, size, size, &r, 8, 20);
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

static void image_name(int64_t i, char *buf, size_t n) { snprintf(buf, n, "img_%07lld.jpg", (long long)i); }
static void mask_name(int64_t i, char *buf, size_t n) { snprintf(buf, n, "mask_%07lld.pgm", (long long)i); }

static size_t pgm_header(char *buf, size_t n, int w, int h) {
  return (size_t)snprintf(buf, n, "P5\n%d %d\n255\n", w, h);
}

static int write_manifest(const char *dir, const vl_segset_gen_cfg *cfg, const int64_t *bytes,
                          char *err, size_t errn) {
  size_t cap = 512 + (size_t)cfg->n * 64, len = 0;
  char *m = malloc(cap);
  if (!m) {
    setf(err, errn, "out of memory for the manifest");
    return -1;
  }
  len += (size_t)snprintf(m + len, cap - len,
                          "# vramlab-segset version=%d n=%lld size=%d classes=%d seed=%llu "
                          "quality=%d columns=image,mask,bytes\n",
                          VL_SEGSET_VERSION, (long long)cfg->n, cfg->size, cfg->num_classes,
                          (unsigned long long)cfg->seed, cfg->quality);
  for (int64_t i = 0; i < cfg->n; i++) {
    char a[32], b[32];
    image_name(i, a, sizeof a);
    mask_name(i, b, sizeof b);
    len += (size_t)snprintf(m + len, cap - len, "%s\t%s\t%lld\n", a, b, (long long)bytes[i]);
  }
  int rc = vl_synth_write_atomic(dir, VL_SEGSET_MANIFEST, m, len, err, errn);
  free(m);
  return rc;
}

int vl_segset_generate(const char *dir, const vl_segset_gen_cfg *cfg, char *err, size_t errn) {
  if (!dir || !cfg) {
    setf(err, errn, "segset: no output directory or configuration");
    return -1;
  }
  if (cfg->n < 1) {
    setf(err, errn, "segset: n must be at least 1 (got %lld)", (long long)cfg->n);
    return -1;
  }
  if (cfg->size < VL_SEGSET_SIZE_MIN || cfg->size > VL_SEGSET_SIZE_MAX) {
    setf(err, errn, "segset: size must be in %d..%d (got %d)", VL_SEGSET_SIZE_MIN,
         VL_SEGSET_SIZE_MAX, cfg->size);
    return -1;
  }
  if (cfg->num_classes < 2 || cfg->num_classes > VL_SEGSET_CLASSES_MAX) {
    setf(err, errn, "segset: num_classes must be in 2..%d, background included (got %d)",
         VL_SEGSET_CLASSES_MAX, cfg->num_classes);
    return -1;
  }
  if (cfg->quality < 1 || cfg->quality > 100) {
    setf(err, errn, "segset: quality must be in 1..100 (got %d)", cfg->quality);
    return -1;
  }
  if (cfg->threads < 0) {
    setf(err, errn, "segset: threads must be >= 0 (got %d)", cfg->threads);
    return -1;
  }
  if (vl_synth_mkdir_p(dir, err, errn) != 0) return -1;
  /* No manifest while samples are being (re)written: a half-made set cannot be opened. */
  char mpath[PATH_MAX], eb[128];
  snprintf(mpath, sizeof mpath, "%s/%s", dir, VL_SEGSET_MANIFEST);
  if (unlink(mpath) != 0 && errno != ENOENT) {
    setf(err, errn, "cannot remove the old %s: %s", mpath, errstr(errno, eb, sizeof eb));
    return -1;
  }
  int64_t *bytes = calloc((size_t)cfg->n, sizeof *bytes);
  if (!bytes) {
    setf(err, errn, "out of memory for %lld manifest entries", (long long)cfg->n);
    return -1;
  }
  int nt = cfg->threads > 0 ? cfg->threads : omp_get_max_threads();
  if (nt < 1) nt = 1;
  if ((int64_t)nt > cfg->n) nt = (int)cfg->n;
  int64_t chunk = 4 * (int64_t)nt < 32 ? 32 : 4 * (int64_t)nt;
  const int size = cfg->size;
  int failed = 0;
  char first_err[512] = "";

#pragma omp parallel num_threads(nt)
  {
    synth s;
    int ok = synth_init(&s, size) == 0;
    if (!ok) {
#pragma omp critical(vl_segset_err)
      if (!first_err[0]) snprintf(first_err, sizeof first_err, "segset: cannot set up an encoder (out of memory or TurboJPEG failure)");
#pragma omp atomic write
      failed = 1;
    }
    for (int64_t c0 = 0; c0 < cfg->n; c0 += chunk) {
      int64_t c1 = c0 + chunk < cfg->n ? c0 + chunk : cfg->n;
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = c0; i < c1; i++) {
        int f;
#pragma omp atomic read
        f = failed;
        if (f || !ok) continue;
        synth_sample(&s, cfg->seed, i, size, cfg->num_classes);
        unsigned long jsize = s.jcap;
        char lerr[512] = "", iname[32], mname[32];
        image_name(i, iname, sizeof iname);
        mask_name(i, mname, sizeof mname);
        size_t h = pgm_header((char *)s.pgm, PGM_HDR_MAX, size, size);
        memcpy(s.pgm + h, s.mask, (size_t)size * size);
        if (tjCompress2(s.tj, s.cv.rgb, size, 0, size, TJPF_RGB, &s.jbuf, &jsize, SUBSAMP,
                        cfg->quality, TJFLAG_NOREALLOC) != 0) {
          snprintf(lerr, sizeof lerr, "%s/%s: TurboJPEG cannot encode: %s", dir, iname, tjGetErrorStr2(s.tj));
        } else if (vl_synth_write_atomic(dir, iname, s.jbuf, jsize, lerr, sizeof lerr) == 0 &&
                   vl_synth_write_atomic(dir, mname, s.pgm, h + (size_t)size * size, lerr, sizeof lerr) == 0) {
          bytes[i] = (int64_t)jsize;
        }
        if (lerr[0]) {
#pragma omp critical(vl_segset_err)
          if (!first_err[0]) snprintf(first_err, sizeof first_err, "%s", lerr);
#pragma omp atomic write
          failed = 1;
        }
      }
      /* the implicit barrier above: samples < c1 are on disk */
#pragma omp master
      {
        int f;
#pragma omp atomic read
        f = failed;
        if (!f && cfg->progress) cfg->progress(c1, cfg->n, cfg->user);
      }
    }
    if (ok) synth_free(&s);
  }

  int rc = 0;
  if (failed) {
    setf(err, errn, "%s", first_err);
    rc = -1;
  } else {
    rc = write_manifest(dir, cfg, bytes, err, errn);
    if (rc == 0) vl_synth_fsync_dir(dir);
  }
  free(bytes);
  return rc;
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

static const char *item_path(const vl_segset *s, int64_t i, int mask, char *buf, size_t n) {
  if (!s || i < 0 || i >= s->n) return NULL;
  const char *name = s->names + (mask ? s->it[i].mask_off : s->it[i].img_off);
  int k = snprintf(buf, n, "%s/%s", s->dir, name);
  return k < 0 || (size_t)k >= n ? NULL : buf;
}

/* Whole decimal integer in [lo, hi]; 0 on success. */
static int parse_int(const char *t, long long lo, long long hi, long long *out) {
  if (!t || !*t || *t == ' ' || *t == '+') return -1;
  char *end;
  errno = 0;
  long long v = strtoll(t, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int plain_name(const char *name) {
  return *name && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..") && strlen(name) <= 255;
}

/* The header line (NUL-terminated, magic already checked); 0 or -1 with a message. */
static int parse_header(char *p, const char *mpath, vl_segset_info *info, long long *hdr_n,
                        char *err, size_t errn) {
  long long version = -1, size = -1, classes = -1, quality = -1;
  char *save = NULL;
  for (char *t = strtok_r(p, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
    char *eq = strchr(t, '=');
    if (!eq) continue;
    *eq = '\0';
    const char *v = eq + 1;
    int perr = 0;
    if (!strcmp(t, "version")) perr = parse_int(v, 0, INT_MAX, &version);
    else if (!strcmp(t, "n")) perr = parse_int(v, 1, INT64_MAX, hdr_n);
    else if (!strcmp(t, "size")) perr = parse_int(v, VL_SEGSET_SIZE_MIN, VL_SEGSET_SIZE_MAX, &size);
    else if (!strcmp(t, "classes")) perr = parse_int(v, 2, VL_SEGSET_CLASSES_MAX, &classes);
    else if (!strcmp(t, "quality")) perr = parse_int(v, 1, 100, &quality);
    else if (!strcmp(t, "seed")) {
      char *end;
      errno = 0;
      info->seed = strtoull(v, &end, 10);
      perr = errno || !*v || *end || *v == '-';
    }
    if (perr) {
      setf(err, errn, "%s:1: bad header value %s=%s", mpath, t, v);
      return -1;
    }
  }
  if (version < 0) {
    setf(err, errn, "%s:1: the header has no version=", mpath);
    return -1;
  }
  if (version != VL_SEGSET_VERSION) {
    setf(err, errn, "%s:1: unknown manifest version %lld (this build reads version %d; regenerate the set with `vramlab data gen --kind seg`)",
         mpath, version, VL_SEGSET_VERSION);
    return -1;
  }
  const char *missing = *hdr_n < 0 ? "n" : size < 0 ? "size" : classes < 0 ? "classes" : NULL;
  if (missing) {
    setf(err, errn, "%s:1: the header has no %s= (a segset header gives n, size and classes)", mpath, missing);
    return -1;
  }
  info->version = (int)version;
  info->size = (int)size;
  info->num_classes = (int)classes;
  info->quality = (int)quality;
  return 0;
}

int vl_segset_open(vl_segset **out, const char *dir, char *err, size_t errn) {
  *out = NULL;
  char mpath[PATH_MAX], eb[128];
  if (!dir || snprintf(mpath, sizeof mpath, "%s/%s", dir, VL_SEGSET_MANIFEST) >= (int)sizeof mpath) {
    setf(err, errn, "segset: bad directory name");
    return -1;
  }
  uint8_t *raw = NULL;
  size_t cap = 0, len = 0;
  struct stat st;
  if (stat(mpath, &st) != 0) {
    int e = errno;
    setf(err, errn, "%s: cannot open: %s%s", mpath, errstr(e, eb, sizeof eb),
         e == ENOENT ? " (no segmentation set here: make one with `vramlab data gen --kind seg "
                       "--out DIR`; an interrupted generation leaves no manifest)"
                     : "");
    return -1;
  }
  vl_status rs = vl_synth_read_file(mpath, &raw, &cap, &len, err, errn);
  if (rs != VL_OK) {
    free(raw);
    if (rs == VL_ERR_IO && st.st_size == 0)
      setf(err, errn, "%s:1: empty manifest (expected a header \"# vramlab-segset version=%d ...\")",
           mpath, VL_SEGSET_VERSION);
    return -1;
  }
  char *text = realloc(raw, len + 1);
  if (!text) {
    free(raw);
    setf(err, errn, "%s: out of memory", mpath);
    return -1;
  }
  text[len] = '\0';
  if (memchr(text, '\0', len)) {
    free(text);
    setf(err, errn, "%s: binary data in the manifest (NUL byte)", mpath);
    return -1;
  }

  int64_t lines = 1;
  for (size_t k = 0; k < len; k++) lines += text[k] == '\n';
  vl_segset *s = calloc(1, sizeof *s);
  if (s) {
    s->dir = strdup(dir);
    s->it = calloc((size_t)lines, sizeof *s->it);
    s->names = malloc(len + 1);
  }
  if (!s || !s->dir || !s->it || !s->names) {
    free(text);
    vl_segset_close(s);
    setf(err, errn, "%s: out of memory", mpath);
    return -1;
  }
  static const char magic[] = "# vramlab-segset";
  size_t names_len = 0;
  long long hdr_n = -1;
  int lineno = 0, bad = 0;
  char *p = text;
  while (*p || lineno == 0) {
    lineno++;
    char *nl = strchr(p, '\n');
    char *next = nl ? nl + 1 : p + strlen(p);
    if (nl) *nl = '\0';
    size_t ll = strlen(p);
    if (ll && p[ll - 1] == '\r') p[--ll] = '\0';
    if (lineno == 1) {
      if (strncmp(p, magic, sizeof magic - 1) != 0 ||
          (p[sizeof magic - 1] != ' ' && p[sizeof magic - 1] != '\0')) {
        setf(err, errn, "%s:1: not a vramlab-segset manifest (the header must start with \"%s\")", mpath, magic);
        bad = 1;
        break;
      }
      if (parse_header(p + sizeof magic - 1, mpath, &s->info, &hdr_n, err, errn) != 0) {
        bad = 1;
        break;
      }
      p = next;
      continue;
    }
    if (ll == 0) {
      setf(err, errn, "%s:%d: empty line (expected image file, mask file, bytes)", mpath, lineno);
      bad = 1;
      break;
    }
    char *fld[3];
    int nf = 0;
    for (char *q = p;;) {
      if (nf < 3) fld[nf] = q;
      nf++;
      char *tab = strchr(q, '\t');
      if (!tab) break;
      *tab = '\0';
      q = tab + 1;
    }
    if (nf != 3) {
      setf(err, errn, "%s:%d: expected 3 tab-separated fields (image file, mask file, bytes), found %d",
           mpath, lineno, nf);
      bad = 1;
      break;
    }
    for (int k = 0; k < 2 && !bad; k++)
      if (!plain_name(fld[k])) {
        setf(err, errn, "%s:%d: bad %s file name \"%s\" (a plain name in the set's directory)", mpath,
             lineno, k ? "mask" : "image", fld[k]);
        bad = 1;
      }
    if (bad) break;
    long long bytes;
    if (parse_int(fld[2], 1, 1ll << 40, &bytes)) {
      setf(err, errn, "%s:%d: bad bytes \"%s\" (a positive integer)", mpath, lineno, fld[2]);
      bad = 1;
      break;
    }
    item *it = &s->it[s->n++];
    it->bytes = bytes;
    it->img_off = (uint32_t)names_len;
    memcpy(s->names + names_len, fld[0], strlen(fld[0]) + 1);
    names_len += strlen(fld[0]) + 1;
    it->mask_off = (uint32_t)names_len;
    memcpy(s->names + names_len, fld[1], strlen(fld[1]) + 1);
    names_len += strlen(fld[1]) + 1;
    if (bytes > s->info.max_bytes) s->info.max_bytes = bytes;
    s->info.total_bytes += bytes;
    p = next;
  }
  free(text);
  if (!bad && s->n == 0) {
    setf(err, errn, "%s: no samples listed", mpath);
    bad = 1;
  }
  if (!bad && hdr_n != s->n) {
    setf(err, errn, "%s:%d: the header says n=%lld but %lld sample lines follow (truncated or edited manifest?)",
         mpath, lineno, hdr_n, (long long)s->n);
    bad = 1;
  }
  if (bad) {
    vl_segset_close(s);
    return -1;
  }
  s->info.n = s->n;
  *out = s;
  return 0;
}

/* ================================ decoding ============================================ */

typedef struct {
  tjhandle tj;
  uint8_t *buf, *mbuf; /* the JPEG file, the mask file */
  size_t cap, mcap;
} sscratch;

static vl_status decode_jpeg(tjhandle tj, const char *path, const uint8_t *buf, size_t len,
                             int64_t bytes, int size, vl_image *out, char *err, size_t errn) {
  char note[96] = "";
  if ((int64_t)len != bytes)
    snprintf(note, sizeof note, " (the file is %zu bytes, the manifest says %lld)", len, (long long)bytes);
  int w = 0, h = 0, ss = 0, cs = 0;
  if (tjDecompressHeader3(tj, buf, (unsigned long)len, &w, &h, &ss, &cs) != 0) {
    setf(err, errn, "%s: not a readable JPEG (TurboJPEG: %s)%s", path, tjGetErrorStr2(tj), note);
    return VL_ERR_IO;
  }
  if (w != size || h != size) {
    setf(err, errn, "%s: the JPEG is %dx%d but the set's size is %dx%d", path, w, h, size, size);
    return VL_ERR_IO;
  }
  size_t need = (size_t)w * (size_t)h * 3;
  if (out->cap < need || !out->pix) {
    uint8_t *np = realloc(out->pix, need);
    if (!np) {
      setf(err, errn, "%s: out of memory for a %dx%d image", path, w, h);
      return VL_ERR_OOM;
    }
    out->pix = np;
    out->cap = need;
  }
  if (tjDecompress2(tj, buf, (unsigned long)len, out->pix, w, 0, h, TJPF_RGB, DECODE_FLAGS) != 0) {
    int code = tjGetErrorCode(tj);
    setf(err, errn, "%s: corrupt or truncated JPEG (TurboJPEG %s: %s)%s", path,
         code == TJERR_WARNING ? "warning" : "error", tjGetErrorStr2(tj), note);
    return VL_ERR_IO;
  }
  if (note[0]) {
    setf(err, errn, "%s: decodes, but it changed since the set was made%s", path, note);
    return VL_ERR_IO;
  }
  return VL_OK;
}

/* A PGM header number: skips whitespace and '#' comments (to the end of the line), then
 * reads decimal digits. 0, or -1 when there is no number. */
static int pgm_number(const uint8_t *b, size_t len, size_t *pos, long *val) {
  size_t k = *pos;
  for (;;) {
    while (k < len && (b[k] == ' ' || b[k] == '\t' || b[k] == '\n' || b[k] == '\r' || b[k] == '\v' || b[k] == '\f')) k++;
    if (k < len && b[k] == '#') {
      while (k < len && b[k] != '\n') k++;
      continue;
    }
    break;
  }
  long v = 0;
  size_t d0 = k;
  while (k < len && b[k] >= '0' && b[k] <= '9' && k - d0 < 9) v = v * 10 + (b[k++] - '0');
  if (k == d0 || (k < len && b[k] >= '0' && b[k] <= '9')) return -1; /* none, or too long */
  *pos = k;
  *val = v;
  return 0;
}

/* The mask file buf (len bytes) into dst (size*size), checked against the set. */
static vl_status decode_mask(const char *path, const uint8_t *buf, size_t len, int size,
                             int num_classes, uint8_t *dst, char *err, size_t errn) {
  if (len < 2 || buf[0] != 'P' || buf[1] != '5') {
    setf(err, errn, "%s: bad PGM header: not a binary PGM mask (the file must start with \"P5\", it starts with 0x%02x 0x%02x)",
         path, len > 0 ? buf[0] : 0, len > 1 ? buf[1] : 0);
    return VL_ERR_IO;
  }
  size_t pos = 2;
  long w, h, maxval;
  if (pos >= len || !(buf[pos] == ' ' || buf[pos] == '\t' || buf[pos] == '\n' || buf[pos] == '\r' || buf[pos] == '#') ||
      pgm_number(buf, len, &pos, &w) || pgm_number(buf, len, &pos, &h) ||
      pgm_number(buf, len, &pos, &maxval) || pos >= len ||
      !(buf[pos] == ' ' || buf[pos] == '\t' || buf[pos] == '\n' || buf[pos] == '\r')) {
    setf(err, errn, "%s: bad PGM header (expected \"P5 width height maxval\" and one whitespace before the pixels)", path);
    return VL_ERR_IO;
  }
  pos++; /* the single whitespace before the pixel data */
  if (maxval != 255) {
    setf(err, errn, "%s: bad PGM header: maxval %ld (masks are one byte per pixel, maxval 255)", path, maxval);
    return VL_ERR_IO;
  }
  if (w != size || h != size) {
    setf(err, errn, "%s: wrong mask dimensions: the mask is %ldx%ld but the image is %dx%d", path, w, h, size, size);
    return VL_ERR_IO;
  }
  const size_t need = (size_t)size * size, have = len - pos;
  if (have < need) {
    setf(err, errn, "%s: truncated mask: %zu of %zu pixel bytes", path, have, need);
    return VL_ERR_IO;
  }
  if (have > need) {
    setf(err, errn, "%s: wrong mask size: %zu bytes past the %dx%d pixel data", path, have - need, size, size);
    return VL_ERR_IO;
  }
  const uint8_t *px = buf + pos;
  uint8_t mx = 0;
  for (size_t k = 0; k < need; k++) mx = px[k] > mx ? px[k] : mx;
  if (mx >= num_classes) { /* find where, for the message (the rare path) */
    size_t k = 0;
    while (px[k] < num_classes) k++;
    setf(err, errn, "%s: class id %d at (x %zu, y %zu) is >= num_classes %d", path, px[k],
         k % (size_t)size, k / (size_t)size, num_classes);
    return VL_ERR_IO;
  }
  memcpy(dst, px, need);
  return VL_OK;
}

static int64_t ds_len(void *self) { return ((vl_segset *)self)->n; }

static size_t mask_file_bytes(const vl_segset *s) { return PGM_HDR_MAX + (size_t)s->info.size * s->info.size; }

static void *ds_scratch_new(void *self) {
  vl_segset *s = self;
  sscratch *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->tj = tjInitDecompress();
  if (!j->tj) {
    free(j);
    return NULL;
  }
  /* Sized for the set's files up front; read_file grows them if a file is larger. */
  j->buf = malloc((size_t)s->info.max_bytes);
  j->cap = j->buf ? (size_t)s->info.max_bytes : 0;
  j->mbuf = malloc(mask_file_bytes(s));
  j->mcap = j->mbuf ? mask_file_bytes(s) : 0;
  return j;
}

static void ds_scratch_free(void *self, void *scratch) {
  (void)self;
  sscratch *j = scratch;
  if (!j) return;
  if (j->tj) tjDestroy(j->tj);
  free(j->buf);
  free(j->mbuf);
  free(j);
}

static vl_status read_sample(vl_segset *s, sscratch *j, int64_t i, vl_image *out, char *err, size_t errn) {
  const int size = s->info.size;
  char path[PATH_MAX];
  size_t len = 0;
  if (!item_path(s, i, 0, path, sizeof path)) {
    setf(err, errn, "segset: path of image %lld too long", (long long)i);
    return VL_ERR_IO;
  }
  vl_status st = vl_synth_read_file(path, &j->buf, &j->cap, &len, err, errn);
  if (st == VL_OK) {
    st = decode_jpeg(j->tj, path, j->buf, len, s->it[i].bytes, size, out, err, errn);
    if (st == VL_ERR_IO) j->tj = vl_synth_tj_renew(j->tj); /* see synth.h */
  }
  if (st != VL_OK) return st;
  if (!item_path(s, i, 1, path, sizeof path)) {
    setf(err, errn, "segset: path of mask %lld too long", (long long)i);
    return VL_ERR_IO;
  }
  st = vl_synth_read_file(path, &j->mbuf, &j->mcap, &len, err, errn);
  if (st != VL_OK) return st;
  const size_t need = (size_t)size * size;
  if (out->mask_cap < need || !out->mask) {
    uint8_t *nm = realloc(out->mask, need);
    if (!nm) {
      setf(err, errn, "%s: out of memory for a %dx%d mask", path, size, size);
      return VL_ERR_OOM;
    }
    out->mask = nm;
    out->mask_cap = need;
  }
  st = decode_mask(path, j->mbuf, len, size, s->info.num_classes, out->mask, err, errn);
  if (st != VL_OK) return st;
  out->w = size;
  out->h = size;
  out->c = 3;
  out->label = 0;
  return VL_OK;
}

static vl_status ds_read(void *self, void *scratch, int64_t i, vl_image *out, char *err,
                         size_t errn) {
  vl_segset *s = self;
  if (i < 0 || i >= s->n) {
    setf(err, errn, "segset: index %lld out of range [0, %lld)", (long long)i, (long long)s->n);
    return VL_ERR_INVALID;
  }
  sscratch local = {0}, *j = scratch ? scratch : &local;
  if (!j->tj) j->tj = tjInitDecompress(); /* a local one, or after a failed renewal */
  if (!j->tj) {
    setf(err, errn, "segset: cannot create a TurboJPEG decompressor: %s", tjGetErrorStr2(NULL));
    return VL_ERR_OOM;
  }
  vl_status st = read_sample(s, j, i, out, err, errn);
  if (j == &local) {
    if (local.tj) tjDestroy(local.tj);
    free(local.buf);
    free(local.mbuf);
  }
  return st;
}

vl_dataset vl_segset_dataset(vl_segset *s) {
  vl_dataset d;
  memset(&d, 0, sizeof d);
  d.self = s;
  d.len = ds_len;
  d.scratch_new = ds_scratch_new;
  d.scratch_free = ds_scratch_free;
  d.read = ds_read;
  /* Both file buffers + libjpeg's working memory while decoding (an estimate, as the
   * jpegset's: a few MCU rows of each component and the upsampling buffers). The decoded
   * image and mask live in the loader's vl_image. */
  d.scratch_bytes = (size_t)s->info.max_bytes + mask_file_bytes(s) + sizeof(sscratch) + 65536 +
                    (size_t)s->info.size * 3 * 48;
  d.max_image_bytes = (size_t)s->info.size * s->info.size * 3;
  return d;
}

/* ================================ damage ============================================== */

static int rewrite_mask(const char *dir, const char *name, int what, int size, int num_classes,
                        char *err, size_t errn) {
  char path[PATH_MAX], eb[128];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
    setf(err, errn, "path too long: %s/%s", dir, name);
    return -1;
  }
  uint8_t *buf = NULL;
  size_t cap = 0, len = 0;
  if (vl_synth_read_file(path, &buf, &cap, &len, err, errn) != VL_OK) {
    free(buf);
    return -1;
  }
  int rc = -1;
  if (what == VL_SEGSET_MASK_TRUNCATE) {
    if (truncate(path, (off_t)(len / 2)) != 0)
      setf(err, errn, "%s: cannot truncate: %s", path, errstr(errno, eb, sizeof eb));
    else
      rc = 0;
  } else if (what == VL_SEGSET_MASK_WRONG_SIZE) {
    /* A well-formed PGM of (size/2) x size: the first half of every row. */
    const int w2 = size / 2;
    uint8_t *o = malloc(PGM_HDR_MAX + (size_t)w2 * size);
    size_t h = o ? pgm_header((char *)o, PGM_HDR_MAX, w2, size) : 0;
    const size_t pix0 = len - (size_t)size * size; /* the generator's header length */
    if (!o || len < (size_t)size * size) {
      setf(err, errn, "%s: %s", path, o ? "too short to resize (already damaged?)" : "out of memory");
    } else {
      for (int y = 0; y < size; y++) memcpy(o + h + (size_t)y * w2, buf + pix0 + (size_t)y * size, (size_t)w2);
      rc = vl_synth_write_atomic(dir, name, o, h + (size_t)w2 * size, err, errn);
    }
    free(o);
  } else if (what == VL_SEGSET_MASK_BAD_CLASS) {
    if (len < (size_t)size * size) {
      setf(err, errn, "%s: too short to damage (already damaged?)", path);
    } else {
      size_t at = len - (size_t)size * size + (size_t)(size / 2) * size + size / 3;
      buf[at] = (uint8_t)(num_classes < 256 ? num_classes : 255);
      rc = vl_synth_write_atomic(dir, name, buf, len, err, errn);
    }
  } else { /* VL_SEGSET_MASK_BAD_HEADER: an ASCII PGM magic on binary data */
    buf[0] = 'P';
    if (len > 1) buf[1] = '2';
    rc = vl_synth_write_atomic(dir, name, buf, len, err, errn);
  }
  free(buf);
  return rc;
}

int vl_segset_corrupt(const char *dir, int64_t i, int what, char *err, size_t errn) {
  if (what < VL_SEGSET_IMG_TRUNCATE || what > VL_SEGSET_MASK_MISSING) {
    setf(err, errn, "segset: unknown corrupt mode %d (0..2: image truncate, garbage, not a JPEG; "
                    "3..6: mask truncate, wrong size, bad class, bad header; 7, 8: delete the "
                    "image, the mask)", what);
    return -1;
  }
  vl_segset *s = NULL;
  if (vl_segset_open(&s, dir, err, errn) != 0) return -1;
  if (i < 0 || i >= s->n) {
    setf(err, errn, "segset: sample %lld is not in the set (n = %lld)", (long long)i, (long long)s->n);
    vl_segset_close(s);
    return -1;
  }
  const char *iname = s->names + s->it[i].img_off, *mname = s->names + s->it[i].mask_off;
  int rc = -1;
  if (what <= VL_SEGSET_IMG_NOT_JPEG) {
    rc = vl_synth_damage_jpeg(dir, iname, what, (uint64_t)i, err, errn);
  } else if (what == VL_SEGSET_IMG_MISSING || what == VL_SEGSET_MASK_MISSING) {
    char path[PATH_MAX], eb[128];
    snprintf(path, sizeof path, "%s/%s", dir, what == VL_SEGSET_IMG_MISSING ? iname : mname);
    if (unlink(path) != 0) setf(err, errn, "cannot delete %s: %s", path, errstr(errno, eb, sizeof eb));
    else rc = 0;
  } else {
    rc = rewrite_mask(dir, mname, what, s->info.size, s->info.num_classes, err, errn);
  }
  vl_segset_close(s);
  return rc;
}
