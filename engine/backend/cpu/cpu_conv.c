/* CPU convolutions through oneDNN (DESIGN.md: the arena owns every byte).
 *
 * Layouts are the framework's plain ones (src/dst nchw, weights oihw), so no reorders and
 * no hidden copies: oneDNN then picks its GEMM-based implementation (im2col / col2im into
 * the scratchpad, its JIT sgemm, or a direct GEMM for 1x1). The scratchpad mode is
 * `user`: oneDNN allocates nothing itself; the caller passes workspace taken from the arena
 * (VL_MEM_WORKSPACE) of exactly vl_conv_ws_cpu bytes, which the planner also calls, so
 * planned peak equals measured peak.
 *
 * oneDNN here (2.6, AVX2) has no fp16 convolution, so fp16/bf16 operands are converted to
 * fp32 buffers inside the same workspace (counted), and results converted back; the fp32
 * path uses the tensors in place. Weight-gradient accumulation goes through an fp32
 * buffer too (oneDNN overwrites diff_weights).
 *
 * Primitive descriptors and primitives are created once per (shape, direction) and cached
 * for the process (a ResNet-101 U-Net has a few dozen distinct shapes); backward ones take
 * the forward one as their hint, as oneDNN requires. */
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
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

typedef struct {
  conv_key k;
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;   /* made on first execution */
  size_t scratch;          /* oneDNN scratchpad bytes */
  char impl[48];
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

/* Creates the primitive descriptor of e->k (the forward hint first for backward). Called
 * with g.mu held. */
static dnnl_status_t make_pd(conv_entry *e, const conv_entry *fwd) {
  const conv_key *k = &e->k;
  dnnl_memory_desc_t src, wei, dst;
  md4(&src, k->N, k->C, k->H, k->W, dnnl_nchw);
  md4(&wei, k->K, k->C, k->R, k->S, dnnl_oihw);
  int64_t P = (k->H + 2 * k->pad - k->dil * (k->R - 1) - 1) / k->stride + 1;
  int64_t Q = (k->W + 2 * k->pad - k->dil * (k->S - 1) - 1) / k->stride + 1;
  md4(&dst, k->N, k->K, P, Q, dnnl_nchw);
  dnnl_dims_t strides = {k->stride, k->stride}, dil = {k->dil - 1, k->dil - 1},
              pad = {k->pad, k->pad};
  dnnl_convolution_desc_t d;
  dnnl_status_t s;
  if (k->dir == VL_CONV_FWD)
    s = dnnl_dilated_convolution_forward_desc_init(&d, dnnl_forward_training,
                                                   dnnl_convolution_direct, &src, &wei, NULL,
                                                   &dst, strides, dil, pad, pad);
  else if (k->dir == VL_CONV_BWD_DATA)
    s = dnnl_dilated_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, &src,
                                                         &wei, &dst, strides, dil, pad, pad);
  else
    s = dnnl_dilated_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, &src,
                                                            &wei, NULL, &dst, strides, dil,
                                                            pad, pad);
  if (s != dnnl_success) return s;
  dnnl_primitive_attr_t attr;
  if ((s = dnnl_primitive_attr_create(&attr)) != dnnl_success) return s;
  s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (s == dnnl_success)
    s = dnnl_primitive_desc_create(&e->pd, &d, attr, g.eng, fwd ? fwd->pd : NULL);
  dnnl_primitive_attr_destroy(attr);
  if (s != dnnl_success) return s;
  const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
  e->scratch = sp ? dnnl_memory_desc_get_size(sp) : 0;
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(e->pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
      impl)
    snprintf(e->impl, sizeof e->impl, "%s", impl);
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
static int entry_locked(const vl_conv *cv, vl_conv_dir dir, char *why, size_t whyn) {
  dnnl_status_t s;
  if (!g.eng) {
    s = dnnl_engine_create(&g.eng, dnnl_cpu, 0);
    if (s == dnnl_success) s = dnnl_stream_create(&g.strm, g.eng, dnnl_stream_default_flags);
    if (s != dnnl_success) {
      snprintf(why, whyn, "oneDNN engine/stream: status %d", (int)s);
      return -1;
    }
  }
  conv_key k = key_of(cv, dir);
  int i = find_locked(&k), f = -1;
  if (i >= 0) return i;
  if (dir != VL_CONV_FWD && (f = entry_locked(cv, VL_CONV_FWD, why, whyn)) < 0) return -1;
  if (g.n == g.cap) {
    int cap = g.cap ? 2 * g.cap : 64;
    conv_entry *ne = realloc(g.e, (size_t)cap * sizeof *ne);
    if (!ne) {
      snprintf(why, whyn, "out of host memory for the oneDNN primitive cache");
      return -1;
    }
    g.e = ne;
    g.cap = cap;
  }
  conv_entry *e = &g.e[g.n];
  memset(e, 0, sizeof *e);
  e->k = k;
  if ((s = make_pd(e, f >= 0 ? &g.e[f] : NULL)) != dnnl_success) {
    snprintf(why, whyn, "oneDNN has no convolution for N=%lld C=%lld %lldx%lld K=%lld %lldx%lld "
             "stride %d pad %d dilation %d (direction %d): status %d", (long long)cv->N,
             (long long)cv->C, (long long)cv->H, (long long)cv->W, (long long)cv->K,
             (long long)cv->R, (long long)cv->S, cv->stride, cv->pad, cv->dil, (int)dir, (int)s);
    return -1;
  }
  return g.n++;
}

/* A copy of the entry (pd and primitive handles are stable once made); the primitive is
 * made here when `prim` and not yet made. false with a reason in why. */
static bool entry(const vl_conv *cv, vl_conv_dir dir, bool prim, conv_entry *out, char *why,
                  size_t whyn) {
  pthread_mutex_lock(&g.mu);
  int i = entry_locked(cv, dir, why, whyn);
  bool ok = i >= 0;
  if (ok && prim && !g.e[i].prim) {
    dnnl_status_t s = dnnl_primitive_create(&g.e[i].prim, g.e[i].pd);
    if (s != dnnl_success) {
      g.e[i].prim = NULL;
      snprintf(why, whyn, "dnnl_primitive_create: status %d", (int)s);
      ok = false;
    }
  }
  if (ok) *out = g.e[i];
  pthread_mutex_unlock(&g.mu);
  return ok;
}

/* ---- workspace layout: [oneDNN scratchpad | fp32 buffers of the converted operands] ---- */

typedef struct {
  size_t scratch, a, b, c, total; /* a/b/c: fp32 stand-ins (see ws_layout) */
} ws_layout;

static size_t f32b(int64_t a, int64_t b, int64_t c, int64_t d) {
  return (size_t)a * (size_t)b * (size_t)c * (size_t)d * sizeof(float);
}

/* fwd:  a = x, b = w, c = y    bwd data: a = dy, b = w, c = dx    bwd weight: a = x, b = dy,
 * c = dw. A buffer is 0 bytes when its operand is fp32 and used in place. */
static ws_layout layout(const vl_conv *cv, vl_conv_dir dir, bool acc, size_t scratch) {
  ws_layout L = {.scratch = up(scratch)};
  bool xf = cv->xdt == VL_F32, wf = cv->wdt == VL_F32, gf = cv->gdt == VL_F32;
  size_t x = f32b(cv->N, cv->C, cv->H, cv->W), y = f32b(cv->N, cv->K, cv->P, cv->Q),
         w = f32b(cv->K, cv->C, cv->R, cv->S);
  if (dir == VL_CONV_FWD) {
    L.a = xf ? 0 : up(x); L.b = wf ? 0 : up(w); L.c = xf ? 0 : up(y);
  } else if (dir == VL_CONV_BWD_DATA) {
    L.a = xf ? 0 : up(y); L.b = wf ? 0 : up(w); L.c = xf ? 0 : up(x);
  } else {
    L.a = xf ? 0 : up(x); L.b = xf ? 0 : up(y); L.c = (gf && !acc) ? 0 : up(w);
  }
  L.total = L.scratch + L.a + L.b + L.c;
  return L;
}

size_t vl_conv_ws_cpu(const vl_conv *cv, vl_conv_dir dir, bool accumulate) {
  char why[256];
  conv_entry e;
  /* no primitive: the call itself reports why; plan what the buffers need */
  return layout(cv, dir, accumulate, entry(cv, dir, false, &e, why, sizeof why) ? e.scratch : 0)
      .total;
}

size_t vl_cpu_conv_ws(const vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, bool accumulate) {
  (void)c;
  return vl_conv_ws_cpu(cv, dir, accumulate);
}

/* ---- execution ---------------------------------------------------------------------- */

static void to_f32(float *dst, const void *src, int dt, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) dst[i] = vl_ld(src, dt, i);
}
static void from_f32(void *dst, int dt, const float *src, int64_t n, bool acc) {
#pragma omp parallel for schedule(static)
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

/* Runs the primitive of (cv, dir) with the three fp32 operands and the scratchpad. */
static vl_status run(vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, int arg_a, float *a,
                     int arg_b, float *b, int arg_c, float *cc, void *scratch) {
  char why[256];
  conv_entry ent, *e = &ent;
  if (!entry(cv, dir, true, e, why, sizeof why)) return vl_fail(c, VL_ERR_BACKEND, "conv: %s", why);
  dnnl_status_t s;
  int args_id[4] = {arg_a, arg_b, arg_c, DNNL_ARG_SCRATCHPAD};
  void *ptr[4] = {a, b, cc, scratch};
  dnnl_exec_arg_t args[4];
  dnnl_memory_t mem[4] = {0};
  int n = e->scratch ? 4 : 3;
  for (int i = 0; i < n; i++) {
    const dnnl_memory_desc_t *md =
        dnnl_primitive_desc_query_md(e->pd, dnnl_query_exec_arg_md, args_id[i]);
    if (!md || (s = dnnl_memory_create(&mem[i], md, g.eng, ptr[i])) != dnnl_success) {
      for (int j = 0; j < i; j++) dnnl_memory_destroy(mem[j]);
      return vl_fail(c, VL_ERR_BACKEND, "conv: oneDNN memory for argument %d: %d", args_id[i], (int)s);
    }
    args[i].arg = args_id[i];
    args[i].memory = mem[i];
  }
  s = dnnl_primitive_execute(e->prim, g.strm, n, args);
  if (s == dnnl_success) s = dnnl_stream_wait(g.strm);
  for (int i = 0; i < n; i++) dnnl_memory_destroy(mem[i]);
  if (s != dnnl_success) return vl_fail(c, VL_ERR_BACKEND, "conv: dnnl_primitive_execute: %d", (int)s);
  return VL_OK;
}

/* Workspace pieces, or the operand itself when it is fp32 (no buffer). */
static vl_status carve(vl_ctx *c, const char *op, const vl_conv *cv, vl_conv_dir dir, bool acc,
                       void *ws, size_t ws_bytes, ws_layout *L, char **base) {
  char why[256];
  conv_entry e;
  if (!entry(cv, dir, false, &e, why, sizeof why))
    return vl_fail(c, VL_ERR_BACKEND, "%s: %s", op, why);
  *L = layout(cv, dir, acc, e.scratch);
  if (ws_bytes < L->total || (L->total && !ws))
    return vl_fail(c, VL_ERR_INVALID, "%s: workspace of %zu bytes, needs %zu (conv_ws_bytes)",
                   op, ws_bytes, L->total);
  *base = ws;
  return VL_OK;
}

vl_status vl_cpu_conv_fwd(vl_ctx *c, const vl_conv *cv, vl_tensor *y, const vl_tensor *x,
                          const vl_tensor *w, void *ws, size_t ws_bytes) {
  const char *op = "conv_fwd";
  int64_t nx = cv->N * cv->C * cv->H * cv->W, ny = cv->N * cv->K * cv->P * cv->Q,
          nw = cv->K * cv->C * cv->R * cv->S;
  vl_status r;
  if ((r = check(c, op, x, "x", nx)) || (r = check(c, op, w, "w", nw)) ||
      (r = check(c, op, y, "y", ny)))
    return r;
  ws_layout L;
  char *b;
  if ((r = carve(c, op, cv, VL_CONV_FWD, false, ws, ws_bytes, &L, &b))) return r;
  float *xa = L.a ? (float *)(b + L.scratch) : (float *)x->data;
  float *wb = L.b ? (float *)(b + L.scratch + L.a) : (float *)w->data;
  float *yc = L.c ? (float *)(b + L.scratch + L.a + L.b) : (float *)y->data;
  if (L.a) to_f32(xa, x->data, x->dtype, nx);
  if (L.b) to_f32(wb, w->data, w->dtype, nw);
  if ((r = run(c, cv, VL_CONV_FWD, DNNL_ARG_SRC, xa, DNNL_ARG_WEIGHTS, wb, DNNL_ARG_DST, yc, b)))
    return r;
  if (L.c) from_f32(y->data, y->dtype, yc, ny, false);
  return VL_OK;
}

vl_status vl_cpu_conv_bwd_data(vl_ctx *c, const vl_conv *cv, vl_tensor *dx, const vl_tensor *dy,
                               const vl_tensor *w, void *ws, size_t ws_bytes) {
  const char *op = "conv_bwd_data";
  int64_t nx = cv->N * cv->C * cv->H * cv->W, ny = cv->N * cv->K * cv->P * cv->Q,
          nw = cv->K * cv->C * cv->R * cv->S;
  vl_status r;
  if ((r = check(c, op, dy, "dy", ny)) || (r = check(c, op, w, "w", nw)) ||
      (r = check(c, op, dx, "dx", nx)))
    return r;
  ws_layout L;
  char *b;
  if ((r = carve(c, op, cv, VL_CONV_BWD_DATA, false, ws, ws_bytes, &L, &b))) return r;
  float *dya = L.a ? (float *)(b + L.scratch) : (float *)dy->data;
  float *wb = L.b ? (float *)(b + L.scratch + L.a) : (float *)w->data;
  float *dxc = L.c ? (float *)(b + L.scratch + L.a + L.b) : (float *)dx->data;
  if (L.a) to_f32(dya, dy->data, dy->dtype, ny);
  if (L.b) to_f32(wb, w->data, w->dtype, nw);
  if ((r = run(c, cv, VL_CONV_BWD_DATA, DNNL_ARG_DIFF_DST, dya, DNNL_ARG_WEIGHTS, wb,
               DNNL_ARG_DIFF_SRC, dxc, b)))
    return r;
  if (L.c) from_f32(dx->data, dx->dtype, dxc, nx, false);
  return VL_OK;
}

vl_status vl_cpu_conv_bwd_weight(vl_ctx *c, const vl_conv *cv, vl_tensor *dw, const vl_tensor *x,
                                 const vl_tensor *dy, bool accumulate, void *ws, size_t ws_bytes) {
  const char *op = "conv_bwd_weight";
  int64_t nx = cv->N * cv->C * cv->H * cv->W, ny = cv->N * cv->K * cv->P * cv->Q,
          nw = cv->K * cv->C * cv->R * cv->S;
  vl_status r;
  if ((r = check(c, op, x, "x", nx)) || (r = check(c, op, dy, "dy", ny)) ||
      (r = check(c, op, dw, "dw", nw)))
    return r;
  ws_layout L;
  char *b;
  if ((r = carve(c, op, cv, VL_CONV_BWD_WEIGHT, accumulate, ws, ws_bytes, &L, &b))) return r;
  float *xa = L.a ? (float *)(b + L.scratch) : (float *)x->data;
  float *dyb = L.b ? (float *)(b + L.scratch + L.a) : (float *)dy->data;
  float *dwc = L.c ? (float *)(b + L.scratch + L.a + L.b) : (float *)dw->data;
  if (L.a) to_f32(xa, x->data, x->dtype, nx);
  if (L.b) to_f32(dyb, dy->data, dy->dtype, ny);
  if ((r = run(c, cv, VL_CONV_BWD_WEIGHT, DNNL_ARG_SRC, xa, DNNL_ARG_DIFF_DST, dyb,
               DNNL_ARG_DIFF_WEIGHTS, dwc, b)))
    return r;
  if (L.c) from_f32(dw->data, dw->dtype, dwc, nw, accumulate);
  return VL_OK;
}

const char *vl_cpu_conv_impl(const vl_conv *cv, vl_conv_dir dir) {
  char why[256];
  static _Thread_local conv_entry e;
  return entry(cv, dir, false, &e, why, sizeof why) ? e.impl : "none";
}
