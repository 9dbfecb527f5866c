/* Checkpoints of any vl_model's training state: the writer (a counting pass for the size,
 * then one buffer written atomically), the reader (every section checked against the
 * model before anything is written into it), and the step-<n>.ckpt + latest folder layout
 * the training loop saves into. The format is in vramlab/ckpt.h. */
#include "vramlab/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vramlab/backend.h"
#include "vramlab/cache.h" /* vl_crc32 */
#include "vramlab/fileio.h"

#define N_SLOTS 5 /* a parameter's tensors: w, master, state[0..2] */
static const char *const slot_names[N_SLOTS] = {"w", "master", "state[0]", "state[1]", "state[2]"};

static vl_tensor *slot(vl_param *p, int k) {
  return k == 0 ? &p->w : k == 1 ? &p->master : &p->state[k - 2];
}
/* An allocated tensor has bytes (a never-allocated one is all zeros). */
static bool present(const vl_tensor *t) { return t->bytes > 0; }

void vl_ckpt_meta_free(vl_ckpt_meta *meta) {
  if (!meta) return;
  free(meta->losses);
  free(meta->blob);
  memset(meta, 0, sizeof *meta);
}

/* ---- settings: "name=value\n" lines ------------------------------------------------------- */
static bool name_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.';
}

/* Whether text (k bytes) is settings text: lines "name=value\n", name of name_char, value
 * printable ASCII. */
static bool settings_ok(const char *t, size_t k) {
  size_t i = 0;
  while (i < k) {
    size_t n0 = i;
    while (i < k && name_char(t[i])) i++;
    if (i == n0 || i == k || t[i] != '=') return false;
    for (i++; i < k && t[i] != '\n'; i++)
      if (t[i] < 0x20 || t[i] > 0x7e) return false;
    if (i == k) return false; /* every line ends in a newline */
    i++;
  }
  return true;
}

int vl_ckpt_setting(char *buf, size_t n, const char *name, const char *fmt, ...) {
  size_t used = strnlen(buf, n);
  bool named = *name != 0;
  for (const char *q = name; *q && named; q++) named = name_char(*q);
  if (used >= n || !named) return -1;
  char *line = buf + used;
  size_t room = n - used;
  int a = snprintf(line, room, "%s=", name), b = -1;
  if (a >= 0 && (size_t)a < room) {
    va_list ap;
    va_start(ap, fmt);
    b = vsnprintf(line + a, room - (size_t)a, fmt, ap);
    va_end(ap);
  }
  size_t len = (size_t)a + (size_t)b; /* the line without its newline */
  if (a < 0 || b < 0 || len + 1 >= room) {
    *line = 0;
    return -1;
  }
  line[len] = '\n';
  line[len + 1] = 0;
  if (!settings_ok(line, len + 1)) {
    *line = 0;
    return -1;
  }
  return 0;
}

int vl_ckpt_setting_f32(char *buf, size_t n, const char *name, float v) {
  char t[32];
  if (v == truncf(v) && fabsf(v) < 1e9f) /* a whole number as one: 10000, not 1e+04 */
    snprintf(t, sizeof t, "%.0f", (double)v);
  else
    for (int digits = 1; digits <= 9; digits++) { /* 9 significant digits give any float back */
      snprintf(t, sizeof t, "%.*g", digits, (double)v);
      if (strtof(t, NULL) == v) break;
    }
  return vl_ckpt_setting(buf, n, name, "%s", t);
}

/* The value of setting `name` (k bytes) in settings text t (n bytes), or NULL; *vn its length. */
static const char *setting_find(const char *t, size_t n, const char *name, size_t k, size_t *vn) {
  for (size_t i = 0; i < n;) {
    const char *line = t + i, *nl = memchr(line, '\n', n - i);
    size_t ln = nl ? (size_t)(nl - line) : n - i;
    if (ln > k && line[k] == '=' && !memcmp(line, name, k)) {
      *vn = ln - k - 1;
      return line + k + 1;
    }
    i += ln + 1;
  }
  return NULL;
}

/* ---- writing ------------------------------------------------------------------------------ */
/* p NULL: count the bytes only (the first pass). */
typedef struct {
  uint8_t *p;
  size_t n;
  int sections;
} wbuf;

static void put(wbuf *w, const void *src, size_t k) {
  if (w->p && k) memcpy(w->p + w->n, src, k);
  w->n += k;
}
static void put_le(wbuf *w, uint64_t v, int bytes) {
  uint8_t b[8];
  for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
  put(w, b, (size_t)bytes);
}
static void put_u8(wbuf *w, unsigned v) { put_le(w, v, 1); }
static void put_u32(wbuf *w, uint32_t v) { put_le(w, v, 4); }
static void put_i64(wbuf *w, int64_t v) { put_le(w, (uint64_t)v, 8); }
static void put_f32(wbuf *w, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  put_u32(w, u);
}
static void put_f64(wbuf *w, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  put_le(w, u, 8);
}
static void put_str(wbuf *w, const char *s) {
  size_t k = strlen(s);
  put_u32(w, (uint32_t)k);
  put(w, s, k);
}
static void patch_le(wbuf *w, size_t at, uint64_t v, int bytes) {
  if (!w->p) return;
  for (int i = 0; i < bytes; i++) w->p[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

typedef struct {
  size_t start, len_at;
} wsec;

static wsec sec_begin(wbuf *w, const char *name) {
  wsec s = {w->n, 0};
  put_str(w, name);
  s.len_at = w->n;
  put_i64(w, 0); /* the payload length, patched by sec_end */
  return s;
}
static void sec_end(wbuf *w, wsec s) {
  patch_le(w, s.len_at, (uint64_t)(w->n - s.len_at - 8), 8);
  put_u32(w, w->p ? vl_crc32(0, w->p + s.start, w->n - s.start) : 0);
  w->sections++;
}

/* A tensor's description and its bytes, downloaded from the device into the buffer. */
static vl_status put_tensor(vl_ctx *c, wbuf *w, const vl_tensor *t) {
  put_u8(w, (unsigned)t->dtype);
  put_u8(w, (unsigned)t->ndim);
  for (int d = 0; d < t->ndim; d++) put_i64(w, t->shape[d]);
  put_i64(w, (int64_t)t->bytes);
  if (w->p) VL_TRY(c->be->download(c, w->p + w->n, t, 0, t->bytes));
  w->n += t->bytes;
  return VL_OK;
}

static vl_status emit(vl_model *m, const vl_train_state *ts, const vl_ckpt_meta *meta, wbuf *w) {
  vl_ctx *c = m->c;
  put(w, VL_CKPT_MAGIC, 8);
  put_u32(w, VL_CKPT_VERSION);
  wsec s = sec_begin(w, "header");
  put_str(w, m->type->name);
  put_str(w, meta->tag);
  put_i64(w, meta->step);
  put_i64(w, ts->n);
  put_i64(w, ts->n_buffers);
  sec_end(w, s);

  s = sec_begin(w, "settings");
  put_str(w, meta->settings ? meta->settings : "");
  sec_end(w, s);

  s = sec_begin(w, "losses");
  put_i64(w, meta->n_losses);
  put_i64(w, meta->skipped);
  for (long i = 0; i < meta->n_losses; i++) put_f64(w, meta->losses[i]);
  sec_end(w, s);

  s = sec_begin(w, "case");
  put(w, meta->blob, meta->blob_len);
  sec_end(w, s);

  const vl_optim_cfg *o = ts->optim;
  s = sec_begin(w, "optimizer");
  put_u32(w, (uint32_t)o->opt);
  const float hp[] = {o->hp.lr, o->hp.beta1, o->hp.beta2, o->hp.eps, o->hp.weight_decay,
                      o->hp.eps2, o->hp.clip_thr, o->hp.decay_pow, o->hp.momentum};
  for (size_t i = 0; i < sizeof hp / sizeof *hp; i++) put_f32(w, hp[i]);
  put_u8(w, o->adafactor_beta1);
  put_f32(w, ts->clip);
  sec_end(w, s);

  const vl_scaler *sc = ts->scaler;
  s = sec_begin(w, "scaler");
  put_u8(w, sc->fp16);
  put_f32(w, sc->scale);
  put_u32(w, (uint32_t)sc->window);
  put_u32(w, (uint32_t)sc->good);
  put_i64(w, sc->t);
  sec_end(w, s);

  char name[sizeof ts->p->name + 16];
  for (int i = 0; i < ts->n; i++) {
    vl_param *p = &ts->p[i];
    snprintf(name, sizeof name, "param:%s", p->name);
    s = sec_begin(w, name);
    put_str(w, p->name);
    put_i64(w, p->rows);
    put_i64(w, p->cols);
    put_u8(w, p->trainable);
    unsigned mask = 0;
    for (int k = 0; k < N_SLOTS; k++)
      if (present(slot(p, k))) mask |= 1u << k;
    put_u8(w, mask);
    for (int k = 0; k < N_SLOTS; k++)
      if (mask >> k & 1) VL_TRY(put_tensor(c, w, slot(p, k)));
    sec_end(w, s);
  }
  for (int i = 0; i < ts->n_buffers; i++) {
    snprintf(name, sizeof name, "buffer:%d", i);
    s = sec_begin(w, name);
    VL_TRY(put_tensor(c, w, ts->buffers[i]));
    sec_end(w, s);
  }
  int before = w->sections;
  s = sec_begin(w, "end");
  put_i64(w, before);
  sec_end(w, s);
  return VL_OK;
}

/* The model's training state, or a message saying why there is none. */
static vl_status train_state(vl_model *m, const char *path, vl_train_state *ts) {
  vl_ctx *c = m->c;
  if (c->plan || !c->be->download || !c->be->upload)
    return vl_fail(c, VL_ERR_UNSUPPORTED, "checkpoint %s: the %s device holds no data to save or restore", path,
                   vl_device_name(c->device));
  vl_status s = vl_model_train_state(m, ts);
  if (s != VL_OK)
    return vl_fail(c, s, "checkpoint %s: model %s hands out no training state (%s)", path, m->type->name,
                   vl_status_name(s));
  if (!ts->optim || !ts->scaler || (ts->n > 0 && !ts->p) || (ts->n_buffers > 0 && !ts->buffers))
    return vl_fail(c, VL_ERR_UNSUPPORTED, "checkpoint %s: model %s's training state lacks its optimizer, scaler or "
                   "tensors", path, m->type->name);
  return VL_OK;
}

static vl_status check_meta(vl_ctx *c, const char *path, const vl_ckpt_meta *meta) {
  size_t sn = meta->settings ? strnlen(meta->settings, VL_CKPT_SETTINGS_MAX + 1) : 0;
  if (strnlen(meta->tag, VL_CKPT_TAG_MAX) >= VL_CKPT_TAG_MAX || meta->step < 0 || meta->step > VL_CKPT_STEPS_MAX ||
      meta->n_losses < 0 || meta->n_losses > VL_CKPT_STEPS_MAX || meta->skipped < 0 ||
      (meta->n_losses && !meta->losses) || (meta->blob_len && !meta->blob) || meta->blob_len > VL_CKPT_BLOB_MAX ||
      sn > VL_CKPT_SETTINGS_MAX || (sn && !settings_ok(meta->settings, sn)))
    return vl_fail(c, VL_ERR_INVALID, "checkpoint %s: bad metadata (step %ld, %ld losses, blob of %zu bytes, "
                   "settings of %zu)", path, meta->step, meta->n_losses, meta->blob_len, sn);
  return VL_OK;
}

vl_status vl_ckpt_save(vl_model *m, const char *path, const vl_ckpt_meta *meta) {
  vl_ctx *c = m->c;
  vl_train_state ts;
  VL_TRY(train_state(m, path, &ts));
  VL_TRY(check_meta(c, path, meta));
  wbuf w = {0};
  VL_TRY(emit(m, &ts, meta, &w)); /* counts */
  size_t total = w.n;
  w = (wbuf){malloc(total ? total : 1), 0, 0};
  if (!w.p) return vl_fail(c, VL_ERR_OOM, "checkpoint %s: no host memory for its %zu bytes", path, total);
  vl_status s = emit(m, &ts, meta, &w);
  if (s == VL_OK && w.n != total) s = vl_fail(c, VL_ERR_BACKEND, "checkpoint %s: wrote %zu bytes, counted %zu", path,
                                              w.n, total);
  if (s == VL_OK) {
    vl_err err;
    if (vl_file_write_atomic(path, w.p, w.n, &err)) s = vl_fail(c, VL_ERR_IO, "checkpoint: %s", err.msg);
  }
  free(w.p);
  return s;
}

/* ---- reading ------------------------------------------------------------------------------ */
typedef struct {
  const uint8_t *d;
  size_t n, pos;
  const char *file;
  vl_ctx *c;
  vl_status st;       /* the first failure */
  char sec[300];      /* the section being read */
  const uint8_t *pl;  /* its payload */
  size_t pl_n, pl_pos;
} rd;

/* Record the first failure (status s, the message naming the file); always false, so a
 * check reads `return bad(...)`. */
__attribute__((format(printf, 3, 4))) static bool bad(rd *r, vl_status s, const char *fmt, ...) {
  if (r->st != VL_OK) return false;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  r->st = vl_fail(r->c, s, "checkpoint %s: %s", r->file, msg);
  return false;
}

static uint64_t get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Field reads from the current section's payload: false (and the message) when it ends
 * inside the field. */
static bool take(rd *r, size_t k, const char *field, const uint8_t **out) {
  if (r->st != VL_OK) return false;
  if (r->pl_n - r->pl_pos < k)
    return bad(r, VL_ERR_IO, "section '%s' ends inside field '%s' (at byte %zu)", r->sec, field,
        (size_t)(r->pl - r->d) + r->pl_pos);
  *out = r->pl + r->pl_pos;
  r->pl_pos += k;
  return true;
}
static bool get_uint(rd *r, int bytes, const char *field, uint64_t *v) {
  const uint8_t *p = NULL;
  if (!take(r, (size_t)bytes, field, &p)) return false;
  *v = get_le(p, bytes);
  return true;
}
static bool get_i64(rd *r, const char *field, int64_t *v) {
  uint64_t u;
  if (!get_uint(r, 8, field, &u)) return false;
  *v = (int64_t)u;
  return true;
}
static bool get_f32(rd *r, const char *field, float *v) {
  uint64_t u;
  if (!get_uint(r, 4, field, &u)) return false;
  uint32_t b = (uint32_t)u;
  memcpy(v, &b, 4);
  return true;
}
/* A string of at most max - 1 bytes into out (NUL-terminated, printable or refused). */
static bool get_str(rd *r, const char *field, char *out, size_t max) {
  uint64_t k;
  const uint8_t *p = NULL;
  if (!get_uint(r, 4, field, &k)) return false;
  if (k >= max)
    return bad(r, VL_ERR_IO, "section '%s': field '%s' is %llu bytes long (limit %zu)", r->sec, field,
        (unsigned long long)k, max - 1);
  if (!take(r, (size_t)k, field, &p)) return false;
  for (uint64_t i = 0; i < k; i++)
    if (p[i] < 0x20 || p[i] > 0x7e)
      return bad(r, VL_ERR_IO, "section '%s': field '%s' holds a non-printable byte", r->sec, field);
  memcpy(out, p, (size_t)k);
  out[k] = 0;
  return true;
}

/* The section name made printable for messages. */
static void printable(char *dst, size_t dn, const uint8_t *s, size_t n) {
  size_t j = 0;
  for (size_t i = 0; i < n && j + 5 < dn; i++) {
    if (s[i] >= 0x20 && s[i] <= 0x7e && s[i] != '\'') dst[j++] = (char)s[i];
    else j += (size_t)snprintf(dst + j, dn - j, "\\x%02x", s[i]);
  }
  dst[j] = 0;
}

/* Open the next section: its framing, its checksum, then its name against `want` (a
 * parameter's section names the parameter: another name there is another model's). */
static bool sec_open(rd *r, const char *want) {
  if (r->st != VL_OK) return false;
  size_t at = r->pos;
  if (r->n - r->pos < 4)
    return bad(r, VL_ERR_IO, "truncated at byte %zu (section '%s' expected)", r->n, want);
  uint64_t nl = get_le(r->d + r->pos, 4);
  if (nl < 1 || nl > 255)
    return bad(r, VL_ERR_IO, "bad section name length %llu at byte %zu (section '%s' expected)", (unsigned long long)nl, at,
        want);
  if (r->n - r->pos - 4 < nl + 8)
    return bad(r, VL_ERR_IO, "truncated at byte %zu (section '%s' expected)", r->n, want);
  const uint8_t *name = r->d + r->pos + 4;
  printable(r->sec, sizeof r->sec, name, (size_t)nl);
  uint64_t pn = get_le(name + nl, 8);
  size_t head = 4 + (size_t)nl + 8, left = r->n - r->pos - head;
  if (left < 4 || pn > left - 4)
    return bad(r, VL_ERR_IO, "truncated at byte %zu (section '%s' needs %llu bytes from byte %zu)", r->n, r->sec,
        (unsigned long long)pn + 4, r->pos + head);
  size_t body = head + (size_t)pn;
  uint32_t crc = (uint32_t)get_le(r->d + r->pos + body, 4);
  if (vl_crc32(0, r->d + r->pos, body) != crc)
    return bad(r, VL_ERR_IO, "bad checksum in section '%s' (bytes %zu..%zu)", r->sec, at, at + body + 3);
  size_t wl = strlen(want);
  if (nl != wl || memcmp(name, want, wl))
    return bad(r, VL_ERR_INVALID, "section '%s' at byte %zu where this model has '%s'", r->sec, at, want);
  r->pl = name + nl + 8;
  r->pl_n = (size_t)pn;
  r->pl_pos = 0;
  r->pos += body + 4;
  return true;
}
static bool sec_close(rd *r) {
  if (r->st != VL_OK) return false;
  if (r->pl_pos != r->pl_n)
    return bad(r, VL_ERR_IO, "section '%s' has %zu stray bytes after its fields", r->sec, r->pl_n - r->pl_pos);
  return true;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t j = (size_t)snprintf(buf, n, "(");
  for (int d = 0; d < ndim && j < n; d++)
    j += (size_t)snprintf(buf + j, n - j, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (j < n) snprintf(buf + j, n - j, ")");
}

/* One tensor's description against the model's tensor t; *data := its bytes in the file. */
/* The index of the first element of a float tensor's bytes d (n of them, little-endian, in
 * dtype dt) whose exponent is all ones (Inf or NaN; *nan says which), or -1. Other dtypes
 * (i32; nf4, 4-bit codes of frozen weights) have no such value: -1. */
static int64_t first_non_finite(vl_dtype dt, const uint8_t *d, size_t n, bool *nan) {
  int w = dt == VL_F32 ? 4 : dt == VL_F16 || dt == VL_BF16 ? 2 : 0;
  uint32_t exp = dt == VL_F32 ? 0x7f800000u : dt == VL_F16 ? 0x7c00u : 0x7f80u;
  uint32_t sign = dt == VL_F32 ? 0x80000000u : 0x8000u;
  for (size_t i = 0; w && i + (size_t)w <= n; i += (size_t)w) {
    uint32_t v = (uint32_t)get_le(d + i, w);
    if ((v & exp) != exp) continue;
    *nan = (v & ~(exp | sign)) != 0;
    return (int64_t)(i / (size_t)w);
  }
  return -1;
}

/* A restored weight, master, optimizer state or buffer holds no Inf or NaN: the next step
 * would spread it through the model (a run that diverged saves no such state: its loss is
 * refused first). */
static bool finite_tensor(rd *r, const char *what, const vl_tensor *t, const uint8_t *d) {
  bool nan = false;
  int64_t at = first_non_finite(t->dtype, d, t->bytes, &nan);
  if (at < 0) return true;
  return bad(r, VL_ERR_NUMERIC, "%s holds %s (element %lld)", what, nan ? "nan" : "inf", (long long)at);
}

static bool get_tensor(rd *r, const char *what, const vl_tensor *t, const uint8_t **data) {
  uint64_t dt, nd;
  int64_t shape[VL_MAX_DIMS], bytes;
  if (!get_uint(r, 1, "dtype", &dt) || !get_uint(r, 1, "ndim", &nd)) return false;
  if (dt >= VL_DTYPE_COUNT || nd < 1 || nd > VL_MAX_DIMS)
    return bad(r, VL_ERR_IO, "%s: bad dtype %llu or ndim %llu", what, (unsigned long long)dt, (unsigned long long)nd);
  for (uint64_t d = 0; d < nd; d++)
    if (!get_i64(r, "shape", &shape[d])) return false;
  if (!get_i64(r, "bytes", &bytes)) return false;
  char a[128], b[128];
  if ((vl_dtype)dt != t->dtype)
    return bad(r, VL_ERR_INVALID, "%s is %s, the model's %s", what, vl_dtype_name((vl_dtype)dt),
               vl_dtype_name(t->dtype));
  if ((int)nd != t->ndim || memcmp(shape, t->shape, (size_t)nd * sizeof *shape)) {
    fmt_shape(a, sizeof a, (int)nd, shape);
    fmt_shape(b, sizeof b, t->ndim, t->shape);
    return bad(r, VL_ERR_INVALID, "%s has shape %s, the model %s", what, a, b);
  }
  if (bytes < 0 || (uint64_t)bytes != t->bytes)
    return bad(r, VL_ERR_IO, "%s holds %lld bytes, the model's %zu", what, (long long)bytes, t->bytes);
  return take(r, t->bytes, "data", data) && finite_tensor(r, what, t, *data);
}

typedef struct {
  int64_t step, n_params, n_buffers;
  char model[VL_CKPT_NAME_MAX], tag[VL_CKPT_TAG_MAX];
  int64_t n_losses, skipped;
  const uint8_t *losses, *blob;
  size_t blob_len;
  vl_scaler scaler;
  const uint8_t **data; /* (n_params * N_SLOTS + n_buffers) tensor bytes in the file */
} parsed;

static bool read_header(rd *r, vl_model *m, const vl_train_state *ts, const char *tag, parsed *P) {
  uint64_t ver;
  size_t head = r->n < 8 ? r->n : 8;
  if (r->n == 0) return bad(r, VL_ERR_IO, "truncated at byte 0 (an empty file)");
  if (memcmp(r->d, VL_CKPT_MAGIC, head))
    return bad(r, VL_ERR_IO, "not a vramlab checkpoint (bad magic in its first 8 bytes)");
  if (r->n < 12) return bad(r, VL_ERR_IO, "truncated at byte %zu (magic and format version expected)", r->n);
  ver = get_le(r->d + 8, 4);
  if (ver == 1)
    return bad(r, VL_ERR_INVALID, "format version 1 records no settings, so this build (version %u) cannot tell "
               "whether the run continues it: start a fresh run", VL_CKPT_VERSION);
  if (ver != VL_CKPT_VERSION)
    return bad(r, VL_ERR_IO, "format version %llu, this build reads version %u", (unsigned long long)ver,
               VL_CKPT_VERSION);
  r->pos = 12;
  if (!sec_open(r, "header") || !get_str(r, "model", P->model, sizeof P->model) ||
      !get_str(r, "tag", P->tag, sizeof P->tag) || !get_i64(r, "step", &P->step) ||
      !get_i64(r, "parameters", &P->n_params) || !get_i64(r, "buffers", &P->n_buffers) || !sec_close(r))
    return false;
  if (strcmp(P->model, m->type->name))
    return bad(r, VL_ERR_INVALID, "field 'model' is '%s', this run's model is '%s'", P->model, m->type->name);
  if (tag && strcmp(P->tag, tag))
    return bad(r, VL_ERR_INVALID, "field 'tag' is '%s', this run's '%s'", P->tag, tag);
  if (P->step < 0) return bad(r, VL_ERR_IO, "field 'step' is %lld", (long long)P->step);
  if (P->n_params != ts->n)
    return bad(r, VL_ERR_INVALID, "field 'parameters' is %lld, the model has %d", (long long)P->n_params, ts->n);
  if (P->n_buffers != ts->n_buffers)
    return bad(r, VL_ERR_INVALID, "field 'buffers' is %lld, the model has %d", (long long)P->n_buffers,
               ts->n_buffers);
  return true;
}

/* The first line of settings text a (an bytes) whose setting b (bn bytes) lacks or holds
 * otherwise: its name into name (at most nn - 1 bytes) and true; false when there is none. */
static bool first_difference(const char *a, size_t an, const char *b, size_t bn, char *name, size_t nn) {
  for (size_t i = 0; i < an;) {
    const char *line = a + i, *eq = memchr(line, '=', an - i), *nl = memchr(line, '\n', an - i);
    size_t k = (size_t)(eq - line), vn = (size_t)(nl - eq - 1), on = 0;
    const char *other = setting_find(b, bn, line, k, &on);
    if (!other || on != vn || memcmp(other, eq + 1, vn)) {
      snprintf(name, nn, "%.*s", (int)k, line);
      return true;
    }
    i = (size_t)(nl - a) + 1;
  }
  return false;
}

/* "name=value" of setting `name` in text t, or "no setting 'name'", into out. */
static void describe(char *out, size_t n, const char *t, size_t tn, const char *name) {
  size_t vn = 0;
  const char *v = setting_find(t, tn, name, strlen(name), &vn);
  if (v) snprintf(out, n, "%s=%.*s", name, (int)vn, v);
  else snprintf(out, n, "no setting '%s'", name);
}

/* The settings section; when the run names its settings (want), each compared with the
 * file's, both ways, the first difference refused naming it. */
static bool read_settings(rd *r, const char *want) {
  uint64_t k;
  const uint8_t *p = NULL;
  if (!sec_open(r, "settings") || !get_uint(r, 4, "settings", &k)) return false;
  if (k > VL_CKPT_SETTINGS_MAX)
    return bad(r, VL_ERR_IO, "section 'settings' is %llu bytes long (limit %zu)", (unsigned long long)k,
               VL_CKPT_SETTINGS_MAX);
  if (!take(r, (size_t)k, "settings", &p) || !sec_close(r)) return false;
  const char *t = (const char *)p;
  if (!settings_ok(t, (size_t)k)) return bad(r, VL_ERR_IO, "section 'settings' is not name=value lines");
  if (!want) return true;
  size_t wn = strlen(want);
  if (wn > VL_CKPT_SETTINGS_MAX || !settings_ok(want, wn))
    return bad(r, VL_ERR_INVALID, "this run's settings are not name=value lines (a caller's bug)");
  char name[256], file[320], run[320];
  if (!first_difference(t, (size_t)k, want, wn, name, sizeof name) &&
      !first_difference(want, wn, t, (size_t)k, name, sizeof name))
    return true;
  describe(file, sizeof file, t, (size_t)k, name);
  describe(run, sizeof run, want, wn, name);
  if (r->st == VL_OK) r->st = vl_fail(r->c, VL_ERR_INVALID, "checkpoint %s was made with %s, this run has %s", r->file,
                                      file, run);
  return false;
}

static bool read_losses_case(rd *r, parsed *P) {
  if (!sec_open(r, "losses") || !get_i64(r, "n", &P->n_losses) || !get_i64(r, "skipped", &P->skipped))
    return false;
  if (P->n_losses != P->step || P->skipped < 0 || P->skipped > P->n_losses)
    return bad(r, VL_ERR_IO, "section 'losses': %lld losses and %lld skipped for step %lld", (long long)P->n_losses,
               (long long)P->skipped, (long long)P->step);
  if ((uint64_t)P->n_losses > (r->pl_n - r->pl_pos) / 8)
    return bad(r, VL_ERR_IO, "section 'losses' ends inside field 'losses'");
  if (!take(r, (size_t)P->n_losses * 8, "losses", &P->losses) || !sec_close(r)) return false;
  for (int64_t i = 0; i < P->n_losses; i++) {
    uint64_t u = get_le(P->losses + 8 * i, 8);
    double v;
    memcpy(&v, &u, 8);
    if (!isfinite(v)) return bad(r, VL_ERR_NUMERIC, "section 'losses': the loss of step %lld is %g", (long long)i + 1, v);
  }
  if (!sec_open(r, "case")) return false;
  P->blob_len = r->pl_n;
  if (P->blob_len > VL_CKPT_BLOB_MAX)
    return bad(r, VL_ERR_IO, "section 'case' holds %zu bytes (limit %zu)", P->blob_len, VL_CKPT_BLOB_MAX);
  return take(r, P->blob_len, "case", &P->blob) && sec_close(r);
}

static bool same_f32(rd *r, const char *field, float file, float model) {
  if (memcmp(&file, &model, sizeof file) == 0) return true;
  return bad(r, VL_ERR_INVALID, "optimizer field '%s' is %.9g, the model's %.9g", field, (double)file,
             (double)model);
}

static bool read_optim_scaler(rd *r, const vl_train_state *ts, parsed *P) {
  const vl_optim_cfg *o = ts->optim;
  uint64_t opt, b1, fp16, window, good;
  static const char *const names[] = {"lr", "beta1", "beta2", "eps", "weight_decay", "eps2", "clip_thr",
                                      "decay_pow", "momentum"};
  const float model[] = {o->hp.lr, o->hp.beta1, o->hp.beta2, o->hp.eps, o->hp.weight_decay,
                         o->hp.eps2, o->hp.clip_thr, o->hp.decay_pow, o->hp.momentum};
  if (!sec_open(r, "optimizer") || !get_uint(r, 4, "optimizer", &opt)) return false;
  if (opt != (uint64_t)o->opt)
    return bad(r, VL_ERR_INVALID, "optimizer field 'optimizer' is %s, the model's %s",
               opt < VL_OPT_COUNT ? vl_optimizer_name((vl_optimizer)opt) : "unknown", vl_optimizer_name(o->opt));
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    float v;
    if (!get_f32(r, names[i], &v) || !same_f32(r, names[i], v, model[i])) return false;
  }
  float clip;
  if (!get_uint(r, 1, "adafactor_beta1", &b1) || !get_f32(r, "clip", &clip)) return false;
  if ((b1 != 0) != o->adafactor_beta1)
    return bad(r, VL_ERR_INVALID, "optimizer field 'adafactor_beta1' is %s, the model's %s", b1 ? "true" : "false",
               o->adafactor_beta1 ? "true" : "false");
  if (!same_f32(r, "clip", clip, ts->clip) || !sec_close(r)) return false;

  vl_scaler *s = &P->scaler;
  int64_t t;
  if (!sec_open(r, "scaler") || !get_uint(r, 1, "fp16", &fp16) || !get_f32(r, "scale", &s->scale) ||
      !get_uint(r, 4, "window", &window) || !get_uint(r, 4, "good", &good) || !get_i64(r, "t", &t) || !sec_close(r))
    return false;
  if ((fp16 != 0) != ts->scaler->fp16)
    return bad(r, VL_ERR_INVALID, "scaler field 'fp16' is %s, the model's %s", fp16 ? "true" : "false",
               ts->scaler->fp16 ? "true" : "false");
  if ((int64_t)(int32_t)window != ts->scaler->window)
    return bad(r, VL_ERR_INVALID, "scaler field 'window' is %d, the model's %d", (int)(int32_t)window,
               ts->scaler->window);
  if (!(s->scale > 0) || !isfinite(s->scale) || (int32_t)good < 0 || t < 0)
    return bad(r, VL_ERR_IO, "scaler fields out of range (scale %g, good %d, t %lld)", (double)s->scale,
               (int)(int32_t)good, (long long)t);
  s->fp16 = fp16 != 0;
  s->window = (int32_t)window;
  s->good = (int32_t)good;
  s->t = t;
  return true;
}

/* How messages call parameter i: its name, or its index when it has none (a model's
 * table may hold unused slots, e.g. Mistral's LoRA factors of linears LoRA leaves alone). */
static const char *pname(const vl_param *p, int i, char *buf, size_t n) {
  if (p->name[0]) snprintf(buf, n, "parameter '%s'", p->name);
  else snprintf(buf, n, "parameter %d (unnamed)", i);
  return buf;
}

static bool read_param(rd *r, vl_param *p, int i, const uint8_t **data) {
  char want[sizeof p->name + 16], name[sizeof p->name], who[sizeof p->name + 32], what[sizeof p->name + 64];
  snprintf(want, sizeof want, "param:%s", p->name);
  pname(p, i, who, sizeof who);
  if (!sec_open(r, want) || !get_str(r, "name", name, sizeof name)) return false;
  if (strcmp(name, p->name)) return bad(r, VL_ERR_IO, "%s: field 'name' is '%s'", who, name);
  int64_t rows, cols;
  uint64_t trainable, mask;
  if (!get_i64(r, "rows", &rows) || !get_i64(r, "cols", &cols) || !get_uint(r, 1, "trainable", &trainable) ||
      !get_uint(r, 1, "present", &mask))
    return false;
  if (rows != p->rows || cols != p->cols)
    return bad(r, VL_ERR_INVALID, "%s has shape (%lld, %lld), the model (%lld, %lld)", who, (long long)rows,
               (long long)cols, (long long)p->rows, (long long)p->cols);
  if ((trainable != 0) != p->trainable)
    return bad(r, VL_ERR_INVALID, "%s is %s, the model's is %s", who, trainable ? "trainable" : "frozen",
               p->trainable ? "trainable" : "frozen");
  if (mask >> N_SLOTS) return bad(r, VL_ERR_IO, "%s: field 'present' is 0x%02llx", who, (unsigned long long)mask);
  for (int k = 0; k < N_SLOTS; k++) {
    bool in_file = mask >> k & 1, in_model = present(slot(p, k));
    if (in_file != in_model)
      return bad(r, VL_ERR_INVALID, "%s: tensor '%s' is %s the checkpoint but %s the model", who, slot_names[k],
                 in_file ? "in" : "not in", in_model ? "in" : "not in");
  }
  for (int k = 0; k < N_SLOTS; k++) {
    data[k] = NULL;
    if (!(mask >> k & 1)) continue;
    snprintf(what, sizeof what, "%s tensor '%s'", who, slot_names[k]);
    if (!get_tensor(r, what, slot(p, k), &data[k])) return false;
  }
  return sec_close(r);
}

/* Everything checked; nothing written into the model. */
static bool parse(rd *r, vl_model *m, const vl_train_state *ts, const char *tag, const char *settings, parsed *P) {
  if (!read_header(r, m, ts, tag, P) || !read_settings(r, settings) || !read_losses_case(r, P) ||
      !read_optim_scaler(r, ts, P))
    return false;
  P->data = calloc((size_t)ts->n * N_SLOTS + (size_t)ts->n_buffers + 1, sizeof *P->data);
  if (!P->data) return bad(r, VL_ERR_OOM, "no host memory for %d tensor references", ts->n * N_SLOTS);
  for (int i = 0; i < ts->n; i++)
    if (!read_param(r, &ts->p[i], i, P->data + (size_t)i * N_SLOTS)) return false;
  char want[32], what[48];
  for (int i = 0; i < ts->n_buffers; i++) {
    snprintf(want, sizeof want, "buffer:%d", i);
    snprintf(what, sizeof what, "buffer %d", i);
    if (!sec_open(r, want) ||
        !get_tensor(r, what, ts->buffers[i], &P->data[(size_t)ts->n * N_SLOTS + (size_t)i]) || !sec_close(r))
      return false;
  }
  int64_t count;
  if (!sec_open(r, "end") || !get_i64(r, "sections", &count) || !sec_close(r)) return false;
  if (count != 6 + ts->n + ts->n_buffers)
    return bad(r, VL_ERR_IO, "section 'end' counts %lld sections, the file has %d", (long long)count,
               6 + ts->n + ts->n_buffers);
  if (r->pos != r->n) return bad(r, VL_ERR_IO, "%zu stray bytes after section 'end'", r->n - r->pos);
  return true;
}

static vl_status apply(vl_ctx *c, const vl_train_state *ts, const parsed *P) {
  for (int i = 0; i < ts->n; i++)
    for (int k = 0; k < N_SLOTS; k++) {
      const uint8_t *d = P->data[(size_t)i * N_SLOTS + (size_t)k];
      vl_tensor *t = slot(&ts->p[i], k);
      if (d) VL_TRY(c->be->upload(c, t, 0, d, t->bytes));
    }
  for (int i = 0; i < ts->n_buffers; i++) {
    vl_tensor *t = ts->buffers[i];
    VL_TRY(c->be->upload(c, t, 0, P->data[(size_t)ts->n * N_SLOTS + (size_t)i], t->bytes));
  }
  if (c->be->sync) VL_TRY(c->be->sync(c));
  *ts->scaler = P->scaler;
  return VL_OK;
}

static vl_status fill_meta(vl_ctx *c, const char *name, const parsed *P, vl_ckpt_meta *meta) {
  memset(meta, 0, sizeof *meta);
  snprintf(meta->model, sizeof meta->model, "%s", P->model);
  snprintf(meta->tag, sizeof meta->tag, "%s", P->tag);
  meta->step = (long)P->step;
  meta->n_losses = (long)P->n_losses;
  meta->skipped = (long)P->skipped;
  meta->losses = malloc((size_t)P->n_losses * sizeof(double) + 1);
  meta->blob = malloc(P->blob_len + 1);
  meta->blob_len = P->blob_len;
  if (!meta->losses || !meta->blob) {
    vl_ckpt_meta_free(meta);
    return vl_fail(c, VL_ERR_OOM, "checkpoint %s: no host memory for its losses and case state", name);
  }
  for (int64_t i = 0; i < P->n_losses; i++) {
    uint64_t u = get_le(P->losses + 8 * i, 8);
    memcpy(&meta->losses[i], &u, 8);
  }
  if (P->blob_len) memcpy(meta->blob, P->blob, P->blob_len);
  return VL_OK;
}

vl_status vl_ckpt_read_mem(vl_model *m, const uint8_t *d, size_t n, const char *name, const char *tag,
                           const char *settings, bool do_apply, vl_ckpt_meta *meta) {
  if (meta) memset(meta, 0, sizeof *meta);
  vl_train_state ts;
  VL_TRY(train_state(m, name, &ts));
  rd r = {.d = d, .n = n, .file = name, .c = m->c, .st = VL_OK};
  parsed P = {0};
  bool ok = parse(&r, m, &ts, tag, settings, &P);
  vl_status s = ok ? VL_OK : r.st;
  if (s == VL_OK && meta) s = fill_meta(m->c, name, &P, meta);
  if (s == VL_OK && do_apply) s = apply(m->c, &ts, &P);
  if (s != VL_OK && meta) vl_ckpt_meta_free(meta);
  free(P.data);
  return s;
}

/* The most bytes a checkpoint of m can hold: its framing and tensors as the writer counts
 * them, with the longest tag, settings, case blob and loss history the format allows. */
static vl_status max_file_bytes(vl_model *m, const char *path, uint64_t *max) {
  vl_train_state ts;
  VL_TRY(train_state(m, path, &ts));
  wbuf w = {0};
  VL_TRY(emit(m, &ts, &(vl_ckpt_meta){0}, &w)); /* counts: an empty tag, blob and history */
  *max = (uint64_t)w.n + VL_CKPT_TAG_MAX + VL_CKPT_SETTINGS_MAX + VL_CKPT_BLOB_MAX + 8 * (uint64_t)VL_CKPT_STEPS_MAX;
  return VL_OK;
}

vl_status vl_ckpt_load(vl_model *m, const char *path, const char *tag, const char *settings, vl_ckpt_meta *meta) {
  if (meta) memset(meta, 0, sizeof *meta);
  uint64_t max;
  VL_TRY(max_file_bytes(m, path, &max));
  uint8_t *buf = NULL;
  size_t cap = 0, len = 0;
  vl_err err;
  /* the size is checked before a byte is read: a huge (or sparse) file is refused, not
   * allocated; and a file that cannot be held is a bad checkpoint, never an out-of-memory
   * result of the run (VL_ERR_OOM would read as "the device ran out of memory") */
  vl_status s = vl_file_read(path, max, "the most a checkpoint of this model can hold", &buf, &cap, &len, &err);
  if (s != VL_OK) {
    free(buf);
    return vl_fail(m->c, s == VL_ERR_OOM ? VL_ERR_IO : s, "checkpoint: %s", err.msg);
  }
  s = vl_ckpt_read_mem(m, buf, len, path, tag, settings, true, meta);
  free(buf);
  return s;
}

/* ---- the folder the loop saves into -------------------------------------------------------- */
/* The k of a checkpoint's file name "step-<k>.ckpt" (k written as the writer writes it), or
 * -1 for any other name. */
static long step_of(const char *name) {
  if (strncmp(name, "step-", 5) || name[5] < '0' || name[5] > '9') return -1;
  char *end;
  errno = 0;
  long k = strtol(name + 5, &end, 10);
  char canon[64];
  if (errno || strcmp(end, ".ckpt")) return -1;
  snprintf(canon, sizeof canon, "step-%ld.ckpt", k);
  return strcmp(canon, name) ? -1 : k;
}
/* The names whose temporary files the folder's writers leave: checkpoints and `latest`. */
static int ckpt_owned(const char *name) { return !strcmp(name, "latest") || step_of(name) >= 0; }

static int desc(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x < y) - (x > y);
}

/* Remove the step-<k>.ckpt files of dir beyond the keep of the highest k <= upto (best
 * effort: a file that cannot be removed stays, and the save has succeeded anyway). */
static void prune(const char *dir, long keep, long upto) {
  DIR *d = opendir(dir);
  if (!d) return;
  long *steps = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    long k = step_of(e->d_name);
    if (k < 0 || k > upto) continue;
    if (n == cap) {
      long *g = realloc(steps, (cap = cap ? 2 * cap : 64) * sizeof *g);
      if (!g) { /* an incomplete list could lose one of the newest: prune nothing */
        n = 0;
        break;
      }
      steps = g;
    }
    steps[n++] = k;
  }
  closedir(d);
  if (n) qsort(steps, n, sizeof *steps, desc);
  char path[4096];
  for (size_t i = (size_t)keep; i < n; i++)
    if ((size_t)snprintf(path, sizeof path, "%s/step-%ld.ckpt", dir, steps[i]) < sizeof path) (void)unlink(path);
  free(steps);
}

vl_status vl_ckpt_save_dir(vl_model *m, const char *dir, const vl_ckpt_meta *meta, long keep_last, char *path,
                           size_t pn) {
  vl_ctx *c = m->c;
  char name[64], latest[4096];
  vl_err err;
  snprintf(name, sizeof name, "step-%ld.ckpt", meta->step);
  int k = snprintf(path, pn, "%s/%s", dir, name), l = snprintf(latest, sizeof latest, "%s/latest", dir);
  if (k < 0 || (size_t)k >= pn || l < 0 || (size_t)l >= sizeof latest)
    return vl_fail(c, VL_ERR_INVALID, "checkpoint folder %.200s: path too long", dir);
  if (vl_file_mkdir_p(dir, &err)) return vl_fail(c, VL_ERR_IO, "checkpoint folder: %s", err.msg);
  /* a killed writer's half-written file is no checkpoint: its room is this one's */
  (void)vl_file_remove_stale_temps(dir, ckpt_owned, NULL, NULL);
  VL_TRY(vl_ckpt_save(m, path, meta));
  char text[80];
  int tn = snprintf(text, sizeof text, "%s\n", name);
  if (vl_file_write_atomic(latest, text, (size_t)tn, &err))
    return vl_fail(c, VL_ERR_IO, "checkpoint: %s", err.msg);
  if (keep_last > 0) prune(dir, keep_last, meta->step);
  return VL_OK;
}

vl_status vl_ckpt_resolve(const char *arg, char *path, size_t pn, vl_err *err) {
  struct stat st;
  if (!arg || !*arg) return vl_err_set(err, VL_ERR_INVALID, "no checkpoint named");
  if (stat(arg, &st) != 0) return vl_err_set(err, VL_ERR_IO, "%s: %s", arg, strerror(errno));
  if (S_ISREG(st.st_mode)) {
    if ((size_t)snprintf(path, pn, "%s", arg) >= pn)
      return vl_err_set(err, VL_ERR_INVALID, "%.200s: path too long", arg);
    return VL_OK;
  }
  if (!S_ISDIR(st.st_mode)) return vl_err_set(err, VL_ERR_IO, "%s: neither a checkpoint file nor a folder", arg);
  char latest[4096];
  vl_err e;
  if ((size_t)snprintf(latest, sizeof latest, "%s/latest", arg) >= sizeof latest)
    return vl_err_set(err, VL_ERR_INVALID, "%.200s: path too long", arg);
  size_t n = 0;
  char *text;
  if (vl_file_read_text(latest, 256, "the limit of a latest file", &text, &n, &e))
    return vl_err_set(err, VL_ERR_IO, "%s holds no checkpoint: %s", arg, e.msg);
  while (n && (text[n - 1] == '\n' || text[n - 1] == '\r')) text[--n] = 0;
  /* a file name in the folder: nothing that walks out of it */
  bool ok = n > 0 && text[0] != '.' && !strchr(text, '/');
  for (size_t i = 0; ok && i < n; i++) ok = text[i] > 0x20 && text[i] < 0x7f;
  vl_status rc = VL_OK;
  if (!ok) rc = vl_err_set(err, VL_ERR_IO, "%s: does not name a checkpoint file of the folder", latest);
  else if ((size_t)snprintf(path, pn, "%s/%s", arg, text) >= pn)
    rc = vl_err_set(err, VL_ERR_INVALID, "%.200s: path too long", arg);
  else if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
    rc = vl_err_set(err, VL_ERR_IO, "%s names %s, which is missing or not a file", latest, path);
  free(text);
  return rc;
}
