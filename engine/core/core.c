/* Status names, dtypes, categories, tensors, RNG, clock, byte parsing. */
#define _POSIX_C_SOURCE 200809L
#include "vramlab/core.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "../kernels/nf4.h"

const char *vl_status_name(vl_status s) {
  switch (s) {
    case VL_OK: return "ok";
    case VL_ERR_OOM: return "out of memory";
    case VL_ERR_INVALID: return "invalid argument";
    case VL_ERR_IO: return "i/o error";
    case VL_ERR_NUMERIC: return "non-finite value";
    case VL_ERR_UNSUPPORTED: return "unsupported";
    case VL_ERR_BACKEND: return "backend failure";
    case VL_ERR_INTERRUPTED: return "interrupted";
    case VL_ERR_COMM: return "communication failure";
  }
  return "unknown status";
}

static const char *const dtype_names[VL_DTYPE_COUNT] = {"fp32", "fp16", "bf16", "nf4", "i32"};
const char *vl_dtype_name(vl_dtype d) { return d < VL_DTYPE_COUNT ? dtype_names[d] : "?"; }

int vl_dtype_parse(const char *s, vl_dtype *out) {
  for (int i = 0; i < VL_DTYPE_COUNT; i++)
    if (!strcasecmp(s, dtype_names[i])) { *out = (vl_dtype)i; return 0; }
  if (!strcasecmp(s, "float32") || !strcasecmp(s, "f32")) { *out = VL_F32; return 0; }
  if (!strcasecmp(s, "float16") || !strcasecmp(s, "f16") || !strcasecmp(s, "half")) { *out = VL_F16; return 0; }
  if (!strcasecmp(s, "bfloat16")) { *out = VL_BF16; return 0; }
  if (!strcasecmp(s, "int32")) { *out = VL_I32; return 0; }
  return -1;
}

size_t vl_dtype_bytes(vl_dtype d, int64_t n) {
  switch (d) {
    case VL_F32: return (size_t)n * 4;
    case VL_F16:
    case VL_BF16: return (size_t)n * 2;
    case VL_NF4: return 4 * (size_t)(1 + vl_nf4_ngroups(n)) + (size_t)n / 2 + (size_t)n / VL_NF4_BLOCK;
    case VL_I32: return (size_t)n * 4;
    default: return 0;
  }
}

static const char *const cat_names[VL_MEM_NCAT] = {"frozen", "params", "grads", "optim", "acts",
                                                   "temp", "workspace", "data", "comm"};
const char *vl_mem_cat_name(vl_mem_cat c) { return c < VL_MEM_NCAT ? cat_names[c] : "?"; }

const char *vl_device_name(vl_device d) {
  return d == VL_DEV_CPU ? "cpu" : d == VL_DEV_CUDA ? "cuda" : d == VL_DEV_PLAN ? "plan" : "?";
}

vl_status vl_err_set(vl_err *e, vl_status s, const char *fmt, ...) {
  if (e) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
  }
  return s;
}

vl_status vl_fail(vl_ctx *c, vl_status s, const char *fmt, ...) {
  if (c) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
  }
  return s;
}

void vl_count(vl_ctx *c, double flops, double bytes) {
  if (c->recomputing) c->flops_recompute += flops;
  else c->flops += flops;
  c->bytes_moved += bytes;
}

void vl_tensor_set_shape(vl_tensor *t, vl_dtype dtype, int ndim, const int64_t *shape) {
  t->dtype = dtype;
  t->ndim = ndim;
  int64_t n = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    t->shape[i] = shape[i];
    t->stride[i] = n;
    n *= shape[i];
  }
  for (int i = ndim; i < VL_MAX_DIMS; i++) { t->shape[i] = 1; t->stride[i] = n; }
  t->n = n;
  t->bytes = vl_dtype_bytes(dtype, n);
}

vl_status vl_tensor_alloc(vl_ctx *c, vl_tensor *t, vl_dtype dtype, vl_mem_cat cat, int ndim,
                          const int64_t *shape) {
  memset(t, 0, sizeof *t);
  if (ndim < 1 || ndim > VL_MAX_DIMS) return vl_fail(c, VL_ERR_INVALID, "tensor rank %d", ndim);
  for (int i = 0; i < ndim; i++)
    if (shape[i] <= 0) return vl_fail(c, VL_ERR_INVALID, "tensor dim %d is %lld", i, (long long)shape[i]);
  vl_tensor_set_shape(t, dtype, ndim, shape);
  if (dtype == VL_NF4 && t->n % VL_NF4_BLOCK)
    return vl_fail(c, VL_ERR_INVALID, "nf4 tensor of %lld elements: not a multiple of 64", (long long)t->n);
  t->device = c->device;
  t->cat = cat;
  size_t off;
  vl_status s = vl_arena_alloc(c->arena, t->bytes, cat, &off);
  if (s != VL_OK) {
    char b1[32], b2[32];
    vl_mem_stats stats;
    vl_arena_stats(c->arena, &stats);
    size_t bytes = t->bytes;
    memset(t, 0, sizeof *t);
    return vl_fail(c, s, "out of memory: %s for %s with %s in use under a cap of %s",
                   vl_fmt_bytes(bytes, b1, sizeof b1), vl_mem_cat_name(cat),
                   vl_fmt_bytes(stats.cur_total, b2, sizeof b2),
                   stats.cap == VL_NO_CAP ? "none" : vl_fmt_bytes(stats.cap, (char[32]){0}, 32));
  }
  t->off = off;
  char *base = vl_arena_base(c->arena);
  t->data = base ? base + off : NULL;
  t->owned = true;
  return VL_OK;
}

vl_status vl_tensor_alloc2(vl_ctx *c, vl_tensor *t, vl_dtype dtype, vl_mem_cat cat, int64_t d0,
                           int64_t d1) {
  int64_t sh[2] = {d0, d1};
  return vl_tensor_alloc(c, t, dtype, cat, 2, sh);
}

void vl_tensor_free(vl_ctx *c, vl_tensor *t) {
  if (t->owned) vl_arena_free(c->arena, t->off);
  memset(t, 0, sizeof *t);
}

vl_tensor vl_tensor_view(const vl_tensor *t, size_t byte_off, vl_dtype dtype, int ndim,
                         const int64_t *shape) {
  vl_tensor v;
  memset(&v, 0, sizeof v);
  vl_tensor_set_shape(&v, dtype, ndim, shape);
  v.device = t->device;
  v.cat = t->cat;
  v.off = t->off + byte_off;
  v.data = t->data ? (char *)t->data + byte_off : NULL;
  v.owned = false;
  return v;
}

vl_tensor vl_tensor_rows(const vl_tensor *t, int64_t r0, int64_t nr) {
  vl_tensor v = *t;
  int64_t row = t->n / t->shape[0];
  v.shape[0] = nr;
  v.n = nr * row;
  v.bytes = vl_dtype_bytes(t->dtype, v.n);
  size_t boff = vl_dtype_bytes(t->dtype, r0 * row);
  v.off = t->off + boff;
  v.data = t->data ? (char *)t->data + boff : NULL;
  v.owned = false;
  return v;
}

/* ---- RNG ---- */
uint64_t vl_mix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = vl_mix64(*x);
  *x += 0x9e3779b97f4a7c15ULL;
  return z;
}
void vl_rng_seed(vl_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}
static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
uint64_t vl_rng_u64(vl_rng *r) {
  uint64_t *s = r->s;
  uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
  return res;
}
double vl_rng_uniform(vl_rng *r) { return (double)(vl_rng_u64(r) >> 11) * 0x1.0p-53; }
static float box_muller(double u1, double u2);
float vl_rng_normal(vl_rng *r) {
  double u1 = vl_rng_uniform(r), u2 = vl_rng_uniform(r);
  return box_muller(u1, u2);
}
uint64_t vl_rng_below(vl_rng *r, uint64_t n) { return n ? vl_rng_u64(r) % n : 0; }

/* The transform of vl_rng_normal on two uniforms already drawn. */
static float box_muller(double u1, double u2) {
  if (u1 < 1e-300) u1 = 1e-300;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- jumping the stream ahead --------------------------------------------------------------
 * xoshiro256's step is linear over GF(2) on its 256 state bits: a 256 x 256 bit matrix M. The
 * state n steps on is M^n s, made of the powers M^(2^k) (squared once, then kept): a jump of
 * any n costs at most 64 matrix-vector products, so a long stream splits into segments that
 * threads draw at once, each exactly as the one sequential stream would. */
typedef struct { uint64_t col[256][4]; } gf2_mat; /* column j: M applied to unit vector j */

static void mat_vec(const gf2_mat *m, const uint64_t v[4], uint64_t out[4]) {
  uint64_t r[4] = {0, 0, 0, 0};
  for (int j = 0; j < 256; j++)
    if (v[j >> 6] >> (j & 63) & 1)
      for (int w = 0; w < 4; w++) r[w] ^= m->col[j][w];
  memcpy(out, r, sizeof r);
}

static gf2_mat *jump_pow; /* jump_pow[k] = M^(2^k), k < 64 */
static pthread_once_t jump_once = PTHREAD_ONCE_INIT;

static void jump_init(void) {
  gf2_mat *p = malloc(64 * sizeof *p);
  if (!p) return;
  for (int j = 0; j < 256; j++) { /* M: one step of each unit state */
    vl_rng u = {{0, 0, 0, 0}};
    u.s[j >> 6] = 1ull << (j & 63);
    (void)vl_rng_u64(&u);
    memcpy(p[0].col[j], u.s, sizeof u.s);
  }
  for (int k = 1; k < 64; k++)
    for (int j = 0; j < 256; j++) mat_vec(&p[k - 1], p[k - 1].col[j], p[k].col[j]);
  jump_pow = p;
}

int vl_rng_jump(vl_rng *r, uint64_t n) {
  pthread_once(&jump_once, jump_init);
  if (!jump_pow) return -1;
  for (int k = 0; k < 64; k++)
    if (n >> k & 1) mat_vec(&jump_pow[k], r->s, r->s);
  return 0;
}

void vl_rng_normal_fill(vl_rng *r, float *out, int64_t n, float scale) {
  enum { SEG = 1 << 20 };
  vl_rng start = *r;
  if (n < 2 * SEG || vl_rng_jump(&start, 0)) { /* small, or no jump table: one at a time */
    for (int64_t i = 0; i < n; i++) out[i] = scale * vl_rng_normal(r);
    return;
  }
  /* segment g starts 2 * g * SEG draws on (two uniforms a normal) */
  int64_t nseg = (n + SEG - 1) / SEG;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < nseg; g++) {
    vl_rng q = start;
    vl_rng_jump(&q, 2 * (uint64_t)g * SEG);
    int64_t i1 = (g + 1) * SEG < n ? (g + 1) * SEG : n;
    for (int64_t i = g * SEG; i < i1; i++) {
      double u1 = vl_rng_uniform(&q), u2 = vl_rng_uniform(&q);
      out[i] = scale * box_muller(u1, u2);
    }
  }
  vl_rng_jump(r, 2 * (uint64_t)n); /* where the loop would have left it */
}

double vl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int vl_parse_bytes(const char *s, size_t *out) {
  if (!s || !*s) return -1;
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0) || !isfinite(v)) return -1;
  while (*end == ' ') end++;
  double m = 1;
  if (!*end || !strcasecmp(end, "b")) m = 1;
  else if (!strcasecmp(end, "k") || !strcasecmp(end, "kb")) m = 1e3;
  else if (!strcasecmp(end, "kib")) m = 1024.0;
  else if (!strcasecmp(end, "m") || !strcasecmp(end, "mb")) m = 1e6;
  else if (!strcasecmp(end, "mib")) m = 1048576.0;
  else if (!strcasecmp(end, "g") || !strcasecmp(end, "gb")) m = 1e9;
  else if (!strcasecmp(end, "gib")) m = 1073741824.0;
  else if (!strcasecmp(end, "tb")) m = 1e12;
  else if (!strcasecmp(end, "tib")) m = 1099511627776.0;
  else return -1;
  double b = v * m;
  if (b >= 1.8e19) return -1;
  *out = (size_t)(b + 0.5);
  return 0;
}

const char *vl_fmt_bytes(size_t b, char *buf, size_t n) {
  if (b == VL_NO_CAP) snprintf(buf, n, "none");
  else if (b >= (size_t)1 << 30) snprintf(buf, n, "%.2f GiB", (double)b / 1073741824.0);
  else if (b >= (size_t)1 << 20) snprintf(buf, n, "%.2f MiB", (double)b / 1048576.0);
  else if (b >= 1024) snprintf(buf, n, "%.2f KiB", (double)b / 1024.0);
  else snprintf(buf, n, "%zu B", b);
  return buf;
}
