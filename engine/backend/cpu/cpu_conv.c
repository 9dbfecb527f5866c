/* CPU convolutions through oneDNN (docs/architecture.md "Memory accounting": the arena owns every byte).
 *
 * The primitive is created with format `any`, so oneDNN picks its fastest layout (on AVX2
 * its direct JIT kernels on 8-channel-blocked tensors, 1.5-3x faster here than its GEMM path
 * on plain NCHW, reorders included); tensors stay NCHW / OIHW in the engine and are reordered
 * into and out of that layout around the call, into buffers inside the workspace. The
 * scratchpad mode is `user` for the convolution and the reorders: oneDNN allocates nothing
 * itself; the caller passes workspace taken from the arena (VL_MEM_WORKSPACE) of exactly
 * vl_conv_ws_cpu bytes, which the planner also calls, so planned peak equals measured peak.
 *
 * oneDNN here (2.6, AVX2) has no fp16 convolution, so fp16/bf16 operands are converted to
 * fp32 buffers inside the same workspace (counted), and results converted back. Weight-
 * gradient accumulation goes through an fp32 buffer too (oneDNN overwrites diff_weights).
 *
 * Primitive descriptors and primitives are created once per (shape, direction) and cached
 * for the process (a ResNet-101 U-Net has a few dozen distinct shapes); backward ones take
 * the forward one as their hint, as oneDNN requires. */
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "../../kernels/kcommon.h"

#define ALIGN 64

typedef struct {
  int64_t N, C, H, W, K, R, S;
  int stride, pad, dil, dir;
} conv_key;

/* Operand slots of a direction: a and b are read, c is written.
 *   fwd: a = x (src), b = w, c = y (dst)      bwd data: a = dy, b = w, c = dx
 *   bwd weight: a = x, b = dy, c = dw */
enum { SA = 0, SB = 1, SC = 2, NSLOT = 3 };
static const int ARG[3][NSLOT] = {
    {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
    {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
    {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS}};

typedef struct {
  conv_key k;
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;   /* made on first execution */
  size_t scratch;          /* oneDNN scratchpad bytes */
  dnnl_memory_desc_t user[NSLOT], impl[NSLOT]; /* plain NCHW/OIHW, and oneDNN's choice */
  bool reorder[NSLOT];     /* impl differs from user: reordered through a buffer */
  size_t rbytes[NSLOT];    /* that buffer's bytes */
  dnnl_primitive_desc_t rpd[NSLOT];
  dnnl_primitive_t rprim[NSLOT]; /* made with prim */
  size_t rscratch;         /* largest reorder scratchpad */
  char impl_name[48];
} conv_entry;

static struct {
  pthread_mutex_t mu;
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  conv_entry *e;
  int n, cap;
  bool failed;
  char why[160];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t up(size_t b) { return (b + ALIGN - 1) / ALIGN * ALIGN; }

static conv_key key_of(const vl_conv *cv, vl_conv_dir dir) {
  conv_key k;
  memset(&k, 0, sizeof k); /* compared with memcmp: padding must be zero */
  k.N = cv->N; k.C = cv->C; k.H = cv->H; k.W = cv->W;
  k.K = cv->K; k.R = cv->R; k.S = cv->S;
  k.stride = cv->stride; k.pad = cv->pad; k.dil = cv->dil; k.dir = (int)dir;
  return k;
}

static void md4(dnnl_memory_desc_t *md, int64_t a, int64_t b, int64_t c, int64_t d,
                dnnl_format_tag_t tag) {
  dnnl_dims_t dims = {a, b, c, d};
  (void)dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, tag);
}

static dnnl_status_t user_attr(dnnl_primitive_attr_t *attr) {
  dnnl_status_t s = dnnl_primitive_attr_create(attr);
  if (s == dnnl_success) s = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
  return s;
}

static size_t scratch_of(const_dnnl_primitive_desc_t pd) {
  const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  return sp ? dnnl_memory_desc_get_size(sp) : 0;
}

/* The reorder between slot s's plain layout and oneDNN's (into it for a and b, out of it
 * for c), when they differ. */
static dnnl_status_t make_reorder(conv_entry *e, int s) {
  e->reorder[s] = !dnnl_memory_desc_equal(&e->user[s], &e->impl[s]);
  if (!e->reorder[s]) return dnnl_success;
  e->rbytes[s] = dnnl_memory_desc_get_size(&e->impl[s]);
  dnnl_primitive_attr_t attr;
  dnnl_status_t st = user_attr(&attr);
  if (st != dnnl_success) return st;
  const dnnl_memory_desc_t *from = s == SC ? &e->impl[s] : &e->user[s];
  const dnnl_memory_desc_t *to = s == SC ? &e->user[s] : &e->impl[s];
  st = dnnl_reorder_primitive_desc_create(&e->rpd[s], from, g.eng, to, g.eng, attr);
  dnnl_primitive_attr_destroy(attr);
  if (st == dnnl_success && scratch_of(e->rpd[s]) > e->rscratch) e->rscratch = scratch_of(e->rpd[s]);
  return st;
}

/* Creates the primitive descriptor of e->k (the forward hint first for backward) and its
 * reorders. Called with g.mu held. */
static dnnl_status_t make_pd(conv_entry *e, const conv_entry *fwd) {
  const conv_key *k = &e->k;
  int64_t P = (k->H + 2 * k->pad - k->dil * (k->R - 1) - 1) / k->stride + 1;
  int64_t Q = (k->W + 2 * k->pad - k->dil * (k->S - 1) - 1) / k->stride + 1;
  dnnl_memory_desc_t x, w, y, xa, wa, ya;
  md4(&x, k->N, k->C, k->H, k->W, dnnl_nchw);
  md4(&w, k->K, k->C, k->R, k->S, dnnl_oihw);
  md4(&y, k->N, k->K, P, Q, dnnl_nchw);
  md4(&xa, k->N, k->C, k->H, k->W, dnnl_format_tag_any);
  md4(&wa, k->K, k->C, k->R, k->S, dnnl_format_tag_any);
  md4(&ya, k->N, k->K, P, Q, dnnl_format_tag_any);
  dnnl_dims_t strides = {k->stride, k->stride}, dil = {k->dil - 1, k->dil - 1},
              pad = {k->pad, k->pad};
  dnnl_convolution_desc_t d;
  dnnl_status_t s;
  if (k->dir == VL_CONV_FWD)
    s = dnnl_dilated_convolution_forward_desc_init(&d, dnnl_forward_training,
                                                   dnnl_convolution_direct, &xa, &wa, NULL,
                                                   &ya, strides, dil, pad, pad);
  else if (k->dir == VL_CONV_BWD_DATA)
    s = dnnl_dilated_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, &xa,
                                                         &wa, &ya, strides, dil, pad, pad);
  else
    s = dnnl_dilated_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, &xa,
                                                            &wa, NULL, &ya, strides, dil,
                                                            pad, pad);
  if (s != dnnl_success) return s;
  dnnl_primitive_attr_t attr;
  if ((s = user_attr(&attr)) != dnnl_success) return s;
  s = dnnl_primitive_desc_create(&e->pd, &d, attr, g.eng, fwd ? fwd->pd : NULL);
  dnnl_primitive_attr_destroy(attr);
  if (s != dnnl_success) return s;
  e->scratch = scratch_of(e->pd);
  const dnnl_memory_desc_t *plain[3][NSLOT] = {{&x, &w, &y}, {&y, &w, &x}, {&x, &y, &w}};
  for (int i = 0; i < NSLOT; i++) {
    e->user[i] = *plain[k->dir][i];
    const dnnl_memory_desc_t *m = dnnl_primitive_desc_query_md(e->pd, dnnl_query_exec_arg_md, ARG[k->dir][i]);
    if (!m) return dnnl_runtime_error;
    e->impl[i] = *m;
    if ((s = make_reorder(e, i)) != dnnl_success) return s;
  }
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(e->pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
      impl)
    snprintf(e->impl_name, sizeof e->impl_name, "%s", impl);
  return dnnl_success;
}

static int find_locked(const conv_key *k) {
  for (int i = 0; i < g.n; i++)
    if (!memcmp(&g.e[i].k, k, sizeof *k)) return i;
  return -1;
}

/* Index of the cached entry of (cv, dir), created on first use (the forward one first, as
 * the hint of a backward one); -1 with a reason in `why`. Indices stay valid when the
 * cache grows. Called with g.mu held. */
static int entry_locked(const vl_conv *cv, vl_conv_dir dir, vl_err *why) {
  dnnl_status_t s;
  if (!g.eng) {
    s = dnnl_engine_create(&g.eng, dnnl_cpu, 0);
    if (s == dnnl_success) s = dnnl_stream_create(&g.strm, g.eng, dnnl_stream_default_flags);
    if (s != dnnl_success) {
      vl_err_set(why, VL_ERR_BACKEND, "oneDNN engine/stream: status %d", (int)s);
      return -1;
    }
  }
  conv_key k = key_of(cv, dir);
  int i = find_locked(&k), f = -1;
  if (i >= 0) return i;
  if (dir != VL_CONV_FWD && (f = entry_locked(cv, VL_CONV_FWD, why)) < 0) return -1;
  if (g.n == g.cap) {
    int cap = g.cap ? 2 * g.cap : 64;
    conv_entry *ne = realloc(g.e, (size_t)cap * sizeof *ne);
    if (!ne) {
      vl_err_set(why, VL_ERR_OOM, "out of host memory for the oneDNN primitive cache");
      return -1;
    }
    g.e = ne;
    g.cap = cap;
  }
  conv_entry *e = &g.e[g.n];
  memset(e, 0, sizeof *e);
  e->k = k;
  if ((s = make_pd(e, f >= 0 ? &g.e[f] : NULL)) != dnnl_success) {
    vl_err_set(why, VL_ERR_BACKEND, "oneDNN has no convolution for N=%lld C=%lld %lldx%lld K=%lld %lldx%lld "
             "stride %d pad %d dilation %d (direction %d): status %d", (long long)cv->N,
             (long long)cv->C, (long long)cv->H, (long long)cv->W, (long long)cv->K,
             (long long)cv->R, (long long)cv->S, cv->stride, cv->pad, cv->dil, (int)dir, (int)s);
    return -1;
  }
  return g.n++;
}

/* A copy of the entry (pd and primitive handles are stable once made); the primitive is
 * made here when `prim` and not yet made. false with a reason in why. */
static bool entry(const vl_conv *cv, vl_conv_dir dir, bool prim, conv_entry *out, vl_err *why) {
  pthread_mutex_lock(&g.mu);
  int i = entry_locked(cv, dir, why);
  bool ok = i >= 0;
  if (ok && prim && !g.e[i].prim) {
    conv_entry *e = &g.e[i];
    dnnl_status_t s = dnnl_success;
    for (int j = 0; s == dnnl_success && j < NSLOT; j++)
      if (e->reorder[j] && !e->rprim[j]) s = dnnl_primitive_create(&e->rprim[j], e->rpd[j]);
    if (s == dnnl_success) s = dnnl_primitive_create(&e->prim, e->pd);
    if (s != dnnl_success) {
      e->prim = NULL;
      vl_err_set(why, VL_ERR_BACKEND, "dnnl_primitive_create: status %d", (int)s);
      ok = false;
    }
  }
  if (ok) *out = g.e[i];
  pthread_mutex_unlock(&g.mu);
  return ok;
}

/* ---- workspace layout ------------------------------------------------------------------
 * [conv scratchpad | fp32 stand-ins f[a], f[b], f[c] | oneDNN-layout buffers l[a], l[b], l[c]
 *  | reorder scratchpad]. An fp32 stand-in is 0 bytes when its operand is fp32 and used in
 * place; a layout buffer is 0 bytes when oneDNN takes the plain layout. */

typedef struct {
  size_t scratch, f[NSLOT], l[NSLOT], rscratch, total;
} ws_layout;

static size_t f32b(int64_t a, int64_t b, int64_t c, int64_t d) {
  return (size_t)a * (size_t)b * (size_t)c * (size_t)d * sizeof(float);
}

static ws_layout layout(const vl_conv *cv, vl_conv_dir dir, bool acc, const conv_entry *e) {
  ws_layout L = {.scratch = up(e ? e->scratch : 0), .rscratch = up(e ? e->rscratch : 0)};
  bool xf = cv->xdt == VL_F32, wf = cv->wdt == VL_F32, gf = cv->gdt == VL_F32;
  size_t x = f32b(cv->N, cv->C, cv->H, cv->W), y = f32b(cv->N, cv->K, cv->P, cv->Q),
         w = f32b(cv->K, cv->C, cv->R, cv->S);
  if (dir == VL_CONV_FWD) {
    L.f[SA] = xf ? 0 : up(x); L.f[SB] = wf ? 0 : up(w); L.f[SC] = xf ? 0 : up(y);
  } else if (dir == VL_CONV_BWD_DATA) {
    L.f[SA] = xf ? 0 : up(y); L.f[SB] = wf ? 0 : up(w); L.f[SC] = xf ? 0 : up(x);
  } else {
    L.f[SA] = xf ? 0 : up(x); L.f[SB] = xf ? 0 : up(y); L.f[SC] = (gf && !acc) ? 0 : up(w);
  }
  L.total = L.scratch + L.rscratch;
  for (int i = 0; i < NSLOT; i++) {
    L.l[i] = e && e->reorder[i] ? up(e->rbytes[i]) : 0;
    L.total += L.f[i] + L.l[i];
  }
  return L;
}

static char *f_at(char *base, const ws_layout *L, int s) {
  size_t off = L->scratch;
  for (int i = 0; i < s; i++) off += L->f[i];
  return base + off;
}
static char *l_at(char *base, const ws_layout *L, int s) {
  size_t off = L->scratch + L->f[SA] + L->f[SB] + L->f[SC];
  for (int i = 0; i < s; i++) off += L->l[i];
  return base + off;
}

size_t vl_conv_ws_cpu(const vl_conv *cv, vl_conv_dir dir, bool accumulate) {
  vl_err why;
  conv_entry e;
  /* no primitive: the call itself reports why; plan what the buffers need */
  return layout(cv, dir, accumulate, entry(cv, dir, false, &e, &why) ? &e : NULL).total;
}

/* ---- execution ---------------------------------------------------------------------- */

static void to_f32(float *dst, const void *src, int dt, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(vl_cpu_threads((double)n * NS_MEM))
  for (int64_t i = 0; i < n; i++) dst[i] = vl_ld(src, dt, i);
}
static void from_f32(void *dst, int dt, const float *src, int64_t n, bool acc) {
#pragma omp parallel for schedule(static) num_threads(vl_cpu_threads((double)n * NS_MEM))
  for (int64_t i = 0; i < n; i++) vl_st(dst, dt, i, src[i] + (acc ? vl_ld(dst, dt, i) : 0.0f));
}

static int64_t nel(const vl_tensor *t) { return (int64_t)(t->bytes / vl_dtype_bytes(t->dtype, 1)); }

static vl_status check(vl_ctx *c, const char *op, const vl_tensor *t, const char *name, int64_t n) {
  if (!t || !t->data) return vl_fail(c, VL_ERR_INVALID, "%s: %s is NULL", op, name);
  if (nel(t) < n)
    return vl_fail(c, VL_ERR_INVALID, "%s: %s holds %lld elements, the shape needs %lld", op,
                   name, (long long)nel(t), (long long)n);
  return VL_OK;
}

/* Memory objects over caller buffers for one execution (destroyed together). */
typedef struct {
  dnnl_memory_t m[16]; /* 3 reorders x 3 + the convolution's 4 */
  int n;
  dnnl_status_t st;
} mems;

static dnnl_memory_t mem(mems *M, const dnnl_memory_desc_t *md, void *ptr) {
  if (M->st != dnnl_success) return NULL;
  if (M->n == (int)(sizeof M->m / sizeof *M->m)) {
    M->st = dnnl_out_of_memory;
    return NULL;
  }
  dnnl_memory_t m = NULL;
  M->st = dnnl_memory_create(&m, md, g.eng, ptr);
  if (M->st == dnnl_success) M->m[M->n++] = m;
  return m;
}

static dnnl_status_t exec(dnnl_primitive_t prim, int n, const int *ids, dnnl_memory_t *m) {
  dnnl_exec_arg_t args[4];
  for (int i = 0; i < n; i++) args[i] = (dnnl_exec_arg_t){ids[i], m[i]};
  return dnnl_primitive_execute(prim, g.strm, n, args);
}

/* Slot s between its plain buffer and oneDNN's layout (in for a and b, out for c). */
static dnnl_status_t reorder(const conv_entry *e, int s, mems *M, void *plain, void *lay, void *rs) {
  int ids[3] = {DNNL_ARG_FROM, DNNL_ARG_TO, DNNL_ARG_SCRATCHPAD};
  dnnl_memory_t m[3];
  m[0] = s == SC ? mem(M, &e->impl[s], lay) : mem(M, &e->user[s], plain);
  m[1] = s == SC ? mem(M, &e->user[s], plain) : mem(M, &e->impl[s], lay);
  const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(e->rpd[s], dnnl_query_scratchpad_md, 0);
  bool has_rs = sp && dnnl_memory_desc_get_size(sp) > 0;
  if (has_rs) m[2] = mem(M, sp, rs);
  if (M->st != dnnl_success) return M->st;
  return exec(e->rprim[s], has_rs ? 3 : 2, ids, m);
}

/* Runs (cv, dir) on the three plain fp32 operands (plain[a], plain[b] read, plain[c]
 * written), reordering through the workspace where oneDNN wants another layout. */
static vl_status run(vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, float *plain[NSLOT],
                     char *base, const ws_layout *L) {
  vl_err why;
  conv_entry ent, *e = &ent;
  if (!entry(cv, dir, true, e, &why)) return vl_fail(c, VL_ERR_BACKEND, "conv: %s", why.msg);
  mems M = {.st = dnnl_success};
  void *rs = base + L->total - L->rscratch;
  dnnl_status_t s = dnnl_success;
  void *use[NSLOT];
  for (int i = 0; i < NSLOT; i++) use[i] = e->reorder[i] ? (void *)l_at(base, L, i) : (void *)plain[i];
  for (int i = SA; s == dnnl_success && i <= SB; i++)
    if (e->reorder[i]) s = reorder(e, i, &M, plain[i], use[i], rs);
  if (s == dnnl_success) {
    int ids[4] = {ARG[dir][SA], ARG[dir][SB], ARG[dir][SC], DNNL_ARG_SCRATCHPAD};
    dnnl_memory_t m[4];
    for (int i = 0; i < NSLOT; i++) m[i] = mem(&M, &e->impl[i], use[i]);
    if (e->scratch) {
      const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
      m[3] = sp ? mem(&M, sp, base) : NULL;
    }
    s = M.st != dnnl_success ? M.st : exec(e->prim, e->scratch ? 4 : 3, ids, m);
  }
  if (s == dnnl_success && e->reorder[SC]) s = reorder(e, SC, &M, plain[SC], use[SC], rs);
  if (s == dnnl_success) s = dnnl_stream_wait(g.strm);
  vl_cpu_par_warm(); /* oneDNN's OpenMP workers are still awake (cpu_par.c) */
  for (int i = 0; i < M.n; i++) dnnl_memory_destroy(M.m[i]);
  if (s != dnnl_success) return vl_fail(c, VL_ERR_BACKEND, "conv: oneDNN status %d", (int)s);
  return VL_OK;
}

/* The workspace layout for this call, checked against what the caller passed. */
static vl_status carve(vl_ctx *c, const char *op, const vl_conv *cv, vl_conv_dir dir, bool acc,
                       void *ws, size_t ws_bytes, ws_layout *L) {
  vl_err why;
  conv_entry e;
  if (!entry(cv, dir, false, &e, &why))
    return vl_fail(c, VL_ERR_BACKEND, "%s: %s", op, why.msg);
  *L = layout(cv, dir, acc, &e);
  if (ws_bytes < L->total || (L->total && !ws))
    return vl_fail(c, VL_ERR_INVALID, "%s: workspace of %zu bytes, needs %zu (the op's workspace)",
                   op, ws_bytes, L->total);
  return VL_OK;
}

/* One direction: operands in slot order (a, b read; c written, or added to with acc), each
 * reached through an fp32 stand-in when it is not fp32 (or, for c, when accumulating). */
static vl_status conv_call(vl_ctx *c, const char *op, const vl_conv *cv, vl_conv_dir dir,
                           bool acc, const vl_tensor *t[NSLOT], const char *const name[NSLOT],
                           void *ws, size_t ws_bytes) {
  int64_t nx = cv->N * cv->C * cv->H * cv->W, ny = cv->N * cv->K * cv->P * cv->Q,
          nw = cv->K * cv->C * cv->R * cv->S;
  const int64_t nn[3][NSLOT] = {{nx, nw, ny}, {ny, nw, nx}, {nx, ny, nw}};
  const int64_t *n = nn[dir];
  vl_status r;
  for (int i = 0; i < NSLOT; i++)
    if ((r = check(c, op, t[i], name[i], n[i]))) return r;
  ws_layout L;
  if ((r = carve(c, op, cv, dir, acc, ws, ws_bytes, &L))) return r;
  float *plain[NSLOT];
  for (int i = 0; i < NSLOT; i++) {
    plain[i] = L.f[i] ? (float *)f_at(ws, &L, i) : (float *)t[i]->data;
    if (L.f[i] && i != SC) to_f32(plain[i], t[i]->data, t[i]->dtype, n[i]);
  }
  if ((r = run(c, cv, dir, plain, ws, &L))) return r;
  if (L.f[SC]) from_f32(t[SC]->data, t[SC]->dtype, plain[SC], n[SC], acc);
  return VL_OK;
}

static vl_status vl_cpu_conv_fwd(vl_ctx *c, const void *args) {
  const vl_conv_fwd_args *a = args;
  const vl_tensor *t[NSLOT] = {a->x, a->w, a->y};
  const char *const nm[NSLOT] = {"x", "w", "y"};
  return conv_call(c, "conv_fwd", &a->cv, VL_CONV_FWD, false, t, nm, a->ws, a->ws_bytes);
}

static vl_status vl_cpu_conv_bwd_data(vl_ctx *c, const void *args) {
  const vl_conv_bwd_data_args *a = args;
  const vl_tensor *t[NSLOT] = {a->dy, a->w, a->dx};
  const char *const nm[NSLOT] = {"dy", "w", "dx"};
  return conv_call(c, "conv_bwd_data", &a->cv, VL_CONV_BWD_DATA, false, t, nm, a->ws, a->ws_bytes);
}

static vl_status vl_cpu_conv_bwd_weight(vl_ctx *c, const void *args) {
  const vl_conv_bwd_weight_args *a = args;
  const vl_tensor *t[NSLOT] = {a->x, a->dy, a->dw};
  const char *const nm[NSLOT] = {"x", "dy", "dw"};
  return conv_call(c, "conv_bwd_weight", &a->cv, VL_CONV_BWD_WEIGHT, a->accumulate, t, nm, a->ws,
                   a->ws_bytes);
}

const char *vl_cpu_conv_impl(const vl_conv *cv, vl_conv_dir dir) {
  vl_err why;
  static _Thread_local conv_entry e;
  return entry(cv, dir, false, &e, &why) ? e.impl_name : "none";
}

/* ---- what the CPU's numbers depend on -----------------------------------------------------
 * oneDNN picks a convolution's kernel, blocked layouts and scratchpad by the host's ISA and
 * cache sizes, so two hosts of one CPU model may compute and allocate differently. The key
 * hashes (FNV-1a, 64 bits) every primitive made so far: its shape and direction, the
 * implementation oneDNN chose, its scratchpad, reorder buffers and reorder scratchpad. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

void vl_cpu_conv_key(char *out, size_t n) {
  pthread_mutex_lock(&g.mu);
  uint64_t h = 14695981039346656037ull;
  for (int i = 0; i < g.n; i++) {
    const conv_entry *e = &g.e[i];
    h = fnv(h, &e->k, sizeof e->k);
    h = fnv(h, e->impl_name, strlen(e->impl_name) + 1);
    uint64_t sz[2 + NSLOT] = {e->scratch, e->rscratch, e->rbytes[0], e->rbytes[1], e->rbytes[2]};
    h = fnv(h, sz, sizeof sz);
  }
  int prims = g.n;
  pthread_mutex_unlock(&g.mu);
  const dnnl_version_t *v = dnnl_version();
  snprintf(out, n, "onednn-%d.%d-isa%d-%dprims-%016llx", v->major, v->minor, (int)dnnl_get_effective_cpu_isa(),
           prims, (unsigned long long)h);
}

void vl_cpu_conv_ops(vl_backend *b) {
  b->ops[VL_OP_CONV_FWD] = vl_cpu_conv_fwd;
  b->ops[VL_OP_CONV_BWD_DATA] = vl_cpu_conv_bwd_data;
  b->ops[VL_OP_CONV_BWD_WEIGHT] = vl_cpu_conv_bwd_weight;
}
