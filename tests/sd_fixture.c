/* Reader of the Stable Diffusion parity fixtures written by tests/torch/make_sd_fixture.py
 * (format in that script's docstring; API in sd_fixture.h). Test-only code: a test
 * executable that needs it does #include "sd_fixture.c". The whole file is read into memory,
 * every record is bounds-checked and indexed once; values are copied out through memcpy
 * (the payloads are unaligned) and converted on request. */
#include "sd_fixture.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SDFX_MAGIC[8] = {'V', 'L', 'S', 'D', 'F', 'I', 'X', '1'};
static const char SDFX_END[8] = {'V', 'L', 'S', 'D', 'E', 'N', 'D', '1'};
#define SDFX_VERSION 1u
#define SDFX_GEN_BYTES 24

static void sdfx_err(char *err, size_t errn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sdfx_err(char *err, size_t errn, const char *fmt, ...) {
  if (!err || !errn) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errn, fmt, ap);
  va_end(ap);
}

void sdfx_fixture_path(char *buf, size_t n, const char *file) {
#ifdef VRAMLAB_SOURCE_DIR
  snprintf(buf, n, "%s/tests/fixtures/%s", VRAMLAB_SOURCE_DIR, file);
#else
  snprintf(buf, n, "tests/fixtures/%s", file);
#endif
}

uint64_t sdfx_fnv1a(const void *p, size_t n) {
  const uint8_t *b = p;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

double sdfx_gen(uint64_t seed, double base, int32_t e, int64_t i) {
  uint64_t z = seed + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z = z ^ (z >> 31);
  int64_t q = (int64_t)(z >> 48) - 32768;
  return base + ldexp((double)q, e - 15); /* both terms exact: no rounding, FMA or not */
}

/* ---- parsing ------------------------------------------------------------------------------ */

typedef struct {
  const sdfx_file *f;
  size_t pos;
  int rec;           /* record being parsed, -1 for the header */
  const char *name;  /* its name once known */
  char *err;
  size_t errn;
} sdfx_cursor;

/* Advance over n bytes, copying them to dst when not NULL. */
static int sdfx_take(sdfx_cursor *c, void *dst, size_t n, const char *what) {
  if (n > c->f->size || c->pos > c->f->size - n) {
    if (c->rec < 0)
      sdfx_err(c->err, c->errn, "%s: truncated: its %s needs %zu bytes at offset %zu, the file has %zu "
               "(regenerate it: %s)", c->f->path, what, n, c->pos, c->f->size, SDFX_REGEN);
    else
      sdfx_err(c->err, c->errn, "%s: truncated: record %d (%s) %s needs %zu bytes at offset %zu, the file has "
               "%zu (regenerate it: %s)", c->f->path, c->rec, c->name ? c->name : "?", what, n, c->pos,
               c->f->size, SDFX_REGEN);
    return -1;
  }
  if (dst) memcpy(dst, c->f->buf + c->pos, n);
  c->pos += n;
  return 0;
}

static size_t sdfx_dtype_size(uint32_t dt) {
  switch (dt) {
  case SDFX_F32: return 4;
  case SDFX_F64: return 8;
  case SDFX_I64: return 8;
  default: return 0;
  }
}

static int sdfx_parse_record(sdfx_cursor *c, sdfx_record *r, char *name_store) {
  const char *path = c->f->path;
  uint32_t len, dt, ndim;
  c->name = NULL;
  if (sdfx_take(c, &len, 4, "name length") != 0) return -1;
  if (len < 1 || len > 255) {
    sdfx_err(c->err, c->errn, "%s: record %d at offset %zu: name length %u outside 1..255 (damaged file?)", path,
             c->rec, c->pos - 4, len);
    return -1;
  }
  if (sdfx_take(c, name_store, len, "name") != 0) return -1;
  name_store[len] = 0;
  for (uint32_t i = 0; i < len; i++)
    if (name_store[i] < 0x21 || name_store[i] > 0x7e) {
      sdfx_err(c->err, c->errn, "%s: record %d: name has a non-printable byte 0x%02x (damaged file?)", path, c->rec,
               (unsigned)(uint8_t)name_store[i]);
      return -1;
    }
  r->name = c->name = name_store;
  if (sdfx_take(c, &dt, 4, "dtype") != 0 || sdfx_take(c, &ndim, 4, "ndim") != 0) return -1;
  if (dt < SDFX_F32 || dt > SDFX_GEN) {
    sdfx_err(c->err, c->errn, "%s: record %s: unknown dtype code %u", path, r->name, dt);
    return -1;
  }
  if (ndim > SDFX_MAX_DIMS) {
    sdfx_err(c->err, c->errn, "%s: record %s: %u dims, at most %d", path, r->name, ndim, SDFX_MAX_DIMS);
    return -1;
  }
  r->dtype = (sdfx_dtype)dt;
  r->ndim = (int)ndim;
  r->n = 1;
  for (uint32_t d = 0; d < ndim; d++) {
    if (sdfx_take(c, &r->dims[d], 8, "dims") != 0) return -1;
    if (r->dims[d] < 1 || r->dims[d] > ((int64_t)1 << 40) / r->n) {
      sdfx_err(c->err, c->errn, "%s: record %s: dim %u is %lld (must be >= 1, total < 2^40)", path, r->name, d,
               (long long)r->dims[d]);
      return -1;
    }
    r->n *= r->dims[d];
  }
  r->payload = c->f->buf + c->pos;
  if (dt == SDFX_GEN) {
    uint8_t g[SDFX_GEN_BYTES];
    uint32_t zero;
    if (sdfx_take(c, g, SDFX_GEN_BYTES, "generator") != 0) return -1;
    memcpy(&r->gen_seed, g, 8);
    memcpy(&r->gen_base, g + 8, 8);
    memcpy(&r->gen_e, g + 16, 4);
    memcpy(&zero, g + 20, 4);
    /* exact in float32: base 0 (any sane e) or base 1 with 16 - e <= 24 significant bits */
    bool ok = zero == 0 && r->gen_e <= 0 && r->gen_e >= -100 &&
              (r->gen_base == 0.0 || (r->gen_base == 1.0 && r->gen_e >= -8));
    if (!ok) {
      sdfx_err(c->err, c->errn, "%s: record %s: generator base %g, exponent %d outside the exact range (damaged "
               "file?)", path, r->name, r->gen_base, (int)r->gen_e);
      return -1;
    }
  } else if (sdfx_take(c, NULL, (size_t)r->n * sdfx_dtype_size(dt), "data") != 0) {
    return -1;
  }
  return 0;
}

void sdfx_close(sdfx_file *f) {
  free(f->buf);
  free(f->rec);
  free(f->names);
  memset(f, 0, sizeof *f);
}

static int sdfx_slurp(sdfx_file *f, const char *path, char *err, size_t errn) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    sdfx_err(err, errn, "%s: cannot open: %s; regenerate the SD fixtures from the repository root with `%s` "
             "(needs torch, diffusers, transformers, peft)", path, strerror(errno), SDFX_REGEN);
    return -1;
  }
  int rc = -1;
  long sz = -1;
  if (fseek(fp, 0, SEEK_END) == 0) sz = ftell(fp);
  if (sz < 0 || fseek(fp, 0, SEEK_SET) != 0) {
    sdfx_err(err, errn, "%s: cannot find its size: %s", path, strerror(errno));
  } else if ((size_t)sz > SDFX_MAX_BYTES) {
    sdfx_err(err, errn, "%s: %ld bytes, more than the %zu a fixture may have", path, sz, SDFX_MAX_BYTES);
  } else if (!(f->buf = malloc((size_t)sz + 1))) {
    sdfx_err(err, errn, "%s: out of memory for %ld bytes", path, sz);
  } else if (fread(f->buf, 1, (size_t)sz, fp) != (size_t)sz) {
    sdfx_err(err, errn, "%s: read error: %s", path, ferror(fp) ? strerror(errno) : "short read");
  } else {
    f->size = (size_t)sz;
    rc = 0;
  }
  fclose(fp);
  return rc;
}

int sdfx_open(sdfx_file *f, const char *path, char *err, size_t errn) {
  memset(f, 0, sizeof *f);
  snprintf(f->path, sizeof f->path, "%s", path);
  if (sdfx_slurp(f, path, err, errn) != 0) goto fail;
  sdfx_cursor c = {f, 0, -1, NULL, err, errn};
  char magic[8];
  uint32_t version, n;
  if (sdfx_take(&c, magic, 8, "magic") != 0) goto fail;
  if (memcmp(magic, SDFX_MAGIC, 8) != 0) {
    sdfx_err(err, errn, "%s: bad magic (not a vramlab SD fixture \"VLSDFIX1\"); regenerate it: %s", path, SDFX_REGEN);
    goto fail;
  }
  if (sdfx_take(&c, &version, 4, "version") != 0 || sdfx_take(&c, &n, 4, "record count") != 0) goto fail;
  if (version != SDFX_VERSION) {
    sdfx_err(err, errn, "%s: format version %u, this reader knows %u; regenerate it: %s", path, version,
             SDFX_VERSION, SDFX_REGEN);
    goto fail;
  }
  /* each record takes at least 12 + 1 bytes: a count beyond that is damage, not a big file */
  if (n == 0 || (size_t)n > f->size / 13) {
    sdfx_err(err, errn, "%s: %u records cannot fit in %zu bytes: truncated or damaged; regenerate it: %s", path,
             n, f->size, SDFX_REGEN);
    goto fail;
  }
  f->rec = calloc(n, sizeof *f->rec);
  f->names = malloc((size_t)n * 256);
  if (!f->rec || !f->names) {
    sdfx_err(err, errn, "%s: out of memory for %u records", path, n);
    goto fail;
  }
  for (uint32_t i = 0; i < n; i++) {
    c.rec = (int)i;
    if (sdfx_parse_record(&c, &f->rec[i], f->names + (size_t)i * 256) != 0) goto fail;
    for (uint32_t j = 0; j < i; j++)
      if (strcmp(f->rec[j].name, f->rec[i].name) == 0) {
        sdfx_err(err, errn, "%s: record name %s appears twice (records %u and %u)", path, f->rec[i].name, j, i);
        goto fail;
      }
  }
  f->n = (int)n;
  c.rec = -1;
  size_t body = c.pos;
  char end[8];
  uint64_t hash;
  if (sdfx_take(&c, end, 8, "end marker") != 0) goto fail;
  if (memcmp(end, SDFX_END, 8) != 0) {
    sdfx_err(err, errn, "%s: no end marker after the last record (offset %zu): damaged file; regenerate it: %s",
             path, body, SDFX_REGEN);
    goto fail;
  }
  if (sdfx_take(&c, &hash, 8, "checksum") != 0) goto fail;
  if (c.pos != f->size) {
    sdfx_err(err, errn, "%s: %zu trailing bytes after the checksum (damaged file?)", path, f->size - c.pos);
    goto fail;
  }
  uint64_t want = sdfx_fnv1a(f->buf, body);
  if (want != hash) {
    sdfx_err(err, errn, "%s: checksum mismatch (stored %016llx, computed %016llx): damaged file; regenerate it: %s",
             path, (unsigned long long)hash, (unsigned long long)want, SDFX_REGEN);
    goto fail;
  }
  return 0;
fail:
  sdfx_close(f);
  snprintf(f->path, sizeof f->path, "%s", path);
  return -1;
}

/* ---- lookup and conversion ------------------------------------------------------------------ */

const sdfx_record *sdfx_find(const sdfx_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->rec[i].name, name) == 0) return &f->rec[i];
  return NULL;
}

int sdfx_count_prefix(const sdfx_file *f, const char *prefix) {
  int k = 0;
  size_t n = strlen(prefix);
  for (int i = 0; i < f->n; i++) k += strncmp(f->rec[i].name, prefix, n) == 0;
  return k;
}

/* The record, checked to be a float record (want_int false) or an int64 one, of n values. */
static const sdfx_record *sdfx_lookup(const sdfx_file *f, const char *name, bool want_int, int64_t n, char *err,
                                      size_t errn) {
  const sdfx_record *r = sdfx_find(f, name);
  if (!r) {
    sdfx_err(err, errn, "%s: no record named %s", f->path, name);
    return NULL;
  }
  if ((r->dtype == SDFX_I64) != want_int) {
    sdfx_err(err, errn, "%s: record %s holds %s values, asked for %s", f->path, name,
             r->dtype == SDFX_I64 ? "int64" : "float", want_int ? "int64" : "float");
    return NULL;
  }
  if (n >= 0 && r->n != n) {
    sdfx_err(err, errn, "%s: record %s holds %lld values, the caller expects %lld", f->path, name,
             (long long)r->n, (long long)n);
    return NULL;
  }
  return r;
}

static double sdfx_value(const sdfx_record *r, int64_t i) {
  switch (r->dtype) {
  case SDFX_F32: {
    float v;
    memcpy(&v, r->payload + 4 * i, 4);
    return v;
  }
  case SDFX_F64: {
    double v;
    memcpy(&v, r->payload + 8 * i, 8);
    return v;
  }
  case SDFX_GEN: return sdfx_gen(r->gen_seed, r->gen_base, r->gen_e, i);
  default: return NAN;
  }
}

int sdfx_read_f64(const sdfx_file *f, const char *name, double *out, int64_t n, char *err, size_t errn) {
  const sdfx_record *r = sdfx_lookup(f, name, false, n, err, errn);
  if (!r) return -1;
  for (int64_t i = 0; i < r->n; i++) out[i] = sdfx_value(r, i);
  return 0;
}

int sdfx_read_f32(const sdfx_file *f, const char *name, float *out, int64_t n, char *err, size_t errn) {
  const sdfx_record *r = sdfx_lookup(f, name, false, n, err, errn);
  if (!r) return -1;
  if (r->dtype == SDFX_F32) memcpy(out, r->payload, (size_t)r->n * 4);
  else for (int64_t i = 0; i < r->n; i++) out[i] = (float)sdfx_value(r, i);
  return 0;
}

int sdfx_read_i64(const sdfx_file *f, const char *name, int64_t *out, int64_t n, char *err, size_t errn) {
  const sdfx_record *r = sdfx_lookup(f, name, true, n, err, errn);
  if (!r) return -1;
  memcpy(out, r->payload, (size_t)r->n * 8);
  return 0;
}

float *sdfx_get_f32(const sdfx_file *f, const char *name, int64_t *n, char *err, size_t errn) {
  const sdfx_record *r = sdfx_lookup(f, name, false, -1, err, errn);
  if (!r) return NULL;
  float *out = malloc((size_t)r->n * sizeof *out);
  if (!out) {
    sdfx_err(err, errn, "%s: out of memory for record %s", f->path, name);
    return NULL;
  }
  sdfx_read_f32(f, name, out, r->n, err, errn);
  if (n) *n = r->n;
  return out;
}

double *sdfx_get_f64(const sdfx_file *f, const char *name, int64_t *n, char *err, size_t errn) {
  const sdfx_record *r = sdfx_lookup(f, name, false, -1, err, errn);
  if (!r) return NULL;
  double *out = malloc((size_t)r->n * sizeof *out);
  if (!out) {
    sdfx_err(err, errn, "%s: out of memory for record %s", f->path, name);
    return NULL;
  }
  sdfx_read_f64(f, name, out, r->n, err, errn);
  if (n) *n = r->n;
  return out;
}

int sdfx_check_shape(const sdfx_file *f, const char *name, int ndim, const int64_t *dims, char *err,
                     size_t errn) {
  const sdfx_record *r = sdfx_find(f, name);
  if (!r) {
    sdfx_err(err, errn, "%s: no record named %s", f->path, name);
    return -1;
  }
  bool same = r->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = r->dims[d] == dims[d];
  if (!same) {
    char got[160] = "", want[160] = "";
    size_t a = 0, b = 0;
    for (int d = 0; d < r->ndim && a < sizeof got; d++)
      a += (size_t)snprintf(got + a, sizeof got - a, "%s%lld", d ? ", " : "", (long long)r->dims[d]);
    for (int d = 0; d < ndim && b < sizeof want; d++)
      b += (size_t)snprintf(want + b, sizeof want - b, "%s%lld", d ? ", " : "", (long long)dims[d]);
    sdfx_err(err, errn, "%s: record %s has shape (%s), expected (%s)", f->path, name, got, want);
    return -1;
  }
  return 0;
}
