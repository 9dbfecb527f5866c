/* Shared helpers of the synthetic image sets: files (atomic writes, reads, JPEG damage) and
 * integer pixel synthesis (textured backgrounds, sensor noise). See synth.h. */
#define _GNU_SOURCE
#include "synth.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

void vl_synth_setf(char *err, size_t errn, const char *fmt, ...) {
  if (!err || !errn) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errn, fmt, ap);
  va_end(ap);
}
#define setf vl_synth_setf

static const char *errstr(int e, char *buf, size_t n) { return strerror_r(e, buf, n); }

/* ==================================== files ========================================== */

int vl_synth_mkdir_p(const char *dir, char *err, size_t errn) {
  size_t len = strlen(dir);
  if (len == 0) {
    setf(err, errn, "empty output directory name");
    return -1;
  }
  char *p = strdup(dir);
  if (!p) {
    setf(err, errn, "out of memory");
    return -1;
  }
  char eb[128];
  for (size_t i = 1; i <= len; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
      setf(err, errn, "cannot create directory %s: %s", p, errstr(errno, eb, sizeof eb));
      free(p);
      return -1;
    }
    p[i] = c;
  }
  free(p);
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    setf(err, errn, "%s exists and is not a directory", dir);
    return -1;
  }
  return 0;
}

static int write_all(int fd, const void *data, size_t len) {
  const uint8_t *q = data;
  while (len) {
    ssize_t k = write(fd, q, len);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    q += k;
    len -= (size_t)k;
  }
  return 0;
}

int vl_synth_write_atomic(const char *dir, const char *name, const void *data, size_t len,
                          char *err, size_t errn) {
  char path[PATH_MAX], tmp[PATH_MAX], eb[128];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
      snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld", dir, name, (long)getpid()) >= (int)sizeof tmp) {
    setf(err, errn, "path too long: %s/%s", dir, name);
    return -1;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    setf(err, errn, "cannot create %s: %s", tmp, errstr(errno, eb, sizeof eb));
    return -1;
  }
  if (write_all(fd, data, len) != 0) {
    setf(err, errn, "cannot write %s: %s", tmp, errstr(errno, eb, sizeof eb));
    close(fd);
    unlink(tmp);
    return -1;
  }
  if (fsync(fd) != 0) {
    setf(err, errn, "fsync %s: %s", tmp, errstr(errno, eb, sizeof eb));
    close(fd);
    unlink(tmp);
    return -1;
  }
  if (close(fd) != 0) {
    setf(err, errn, "close %s: %s", tmp, errstr(errno, eb, sizeof eb));
    unlink(tmp);
    return -1;
  }
  if (rename(tmp, path) != 0) {
    setf(err, errn, "cannot rename %s to %s: %s", tmp, path, errstr(errno, eb, sizeof eb));
    unlink(tmp);
    return -1;
  }
  return 0;
}

void vl_synth_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

vl_status vl_synth_read_file(const char *path, uint8_t **buf, size_t *cap, size_t *len,
                             char *err, size_t errn) {
  char eb[128];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    setf(err, errn, "%s: cannot open: %s", path, errstr(errno, eb, sizeof eb));
    return VL_ERR_IO;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    setf(err, errn, "%s: not a regular file", path);
    close(fd);
    return VL_ERR_IO;
  }
  size_t size = (size_t)st.st_size;
  if (size == 0) {
    setf(err, errn, "%s: empty file (0 bytes)", path);
    close(fd);
    return VL_ERR_IO;
  }
  if (size > *cap) {
    uint8_t *nb = realloc(*buf, size);
    if (!nb) {
      setf(err, errn, "%s: out of memory for a %zu-byte file buffer", path, size);
      close(fd);
      return VL_ERR_OOM;
    }
    *buf = nb;
    *cap = size;
  }
  size_t got = 0;
  while (got < size) {
    ssize_t k = read(fd, *buf + got, size - got);
    if (k < 0) {
      if (errno == EINTR) continue;
      setf(err, errn, "%s: read error: %s", path, errstr(errno, eb, sizeof eb));
      close(fd);
      return VL_ERR_IO;
    }
    if (k == 0) break; /* shrank under us: decode what is there */
    got += (size_t)k;
  }
  close(fd);
  *len = got;
  return VL_OK;
}

int vl_synth_damage_jpeg(const char *dir, const char *name, int mode, uint64_t salt,
                         char *err, size_t errn) {
  char path[PATH_MAX], eb[128];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
    setf(err, errn, "path too long: %s/%s", dir, name);
    return -1;
  }
  if (mode == 2) {
    static const char junk[] =
        "This is not a JPEG file: vramlab replaced the image to test corrupt-file handling.\n";
    return vl_synth_write_atomic(dir, name, junk, sizeof junk - 1, err, errn);
  }
  int rc = -1;
  uint8_t *buf = NULL;
  size_t cap = 0, len = 0;
  if (vl_synth_read_file(path, &buf, &cap, &len, err, errn) == VL_OK) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      setf(err, errn, "%s: cannot open for writing: %s", path, errstr(errno, eb, sizeof eb));
    } else if (mode == 0) {
      if (ftruncate(fd, (off_t)(len / 2)) != 0 || fsync(fd) != 0)
        setf(err, errn, "%s: cannot truncate: %s", path, errstr(errno, eb, sizeof eb));
      else
        rc = 0;
    } else {
      /* Entropy-coded data: after the SOS segment, up to the EOI marker. */
      size_t sos = 0;
      for (size_t k = 2; k + 3 < len; k++)
        if (buf[k] == 0xFF && buf[k + 1] == 0xDA) {
          sos = k;
          break;
        }
      size_t start = sos ? sos + 2 + ((size_t)buf[sos + 2] << 8 | buf[sos + 3]) : 0;
      size_t end = len >= 2 ? len - 2 : 0;
      enum { G = 64 };
      if (!sos || start + 4 * G > end) {
        setf(err, errn, "%s: no entropy-coded data long enough to damage (is it a JPEG?)", path);
      } else {
        uint8_t g[G];
        vl_rng r;
        vl_rng_seed(&r, vl_mix64(salt ^ 0xBADBADull));
        for (int k = 0; k < G; k++) g[k] = (uint8_t)vl_rng_u64(&r);
        /* A stray EOI marker: the decoder runs out of data mid-scan, which libjpeg reports
         * (random bytes alone can decode into wrong pixels without a word). */
        g[G / 2] = 0xFF;
        g[G / 2 + 1] = 0xD9;
        off_t at = (off_t)(start + (end - start) / 2 - G / 2);
        if (pwrite(fd, g, G, at) != G || fsync(fd) != 0)
          setf(err, errn, "%s: cannot write: %s", path, errstr(errno, eb, sizeof eb));
        else
          rc = 0;
      }
    }
    if (fd >= 0) close(fd);
  }
  free(buf);
  return rc;
}

tjhandle vl_synth_tj_renew(tjhandle tj) {
  if (tj) tjDestroy(tj);
  return tjInitDecompress();
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
