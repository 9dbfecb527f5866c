/* vramlab-gpu-check: every backend op run on CUDA and on the CPU backend with the same
 * seeded inputs (DESIGN.md "The CUDA backend must be verifiable without a GPU", point 3;
 * the idea of ggml's test-backend-ops). Per check: the op's status on both, NaN/Inf in the
 * CUDA output where the CPU output is finite, the normalised MSE
 *   nmse = sum (cuda - cpu)^2 / sum cpu^2
 * of every output against a per-check limit, and guard bytes: each tensor lives inside a
 * larger allocation whose GUARD bytes on either side must come back untouched.
 *
 * Without a GPU (not a CUDA build, or no device) every check prints "SKIP (no GPU)" and the
 * exit status is 0: skipped, never passed. With one, one line per check with PASS/FAIL and
 * the NMSE; exit status 1 when any check fails. `vramlab-gpu-check WORD` runs the checks
 * whose name contains WORD; `vramlab-gpu-check --self-test [WORD]` runs them with the CPU
 * backend on both sides, to check this tool itself where there is no GPU. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/backend.h"
#include "vramlab/quant.h"
#include "../engine/kernels/kcommon.h"
#include "../engine/kernels/nf4.h"

enum { CU = 0, CPU = 1 }; /* side index: the device under test, the reference */
static const char *SIDE[2] = {"cuda", "cpu"};

#define GUARD 256        /* bytes before and after each tensor (keeps 256-byte alignment) */
#define GUARD_BYTE 0xA5
#define CUDA_CAP ((size_t)2 << 30)

/* Limits: bit-identical for pure data movement; otherwise the last-bit differences of the
 * math libraries (expf, FMA contraction, summation order) after rounding to the storage
 * dtype: 1 ulp of fp16 is 2^-11 relative, of bf16 2^-8. */
#define EXACT 0.0

typedef struct {
  vl_ctx *ctx[2];
  vl_rng rng;
  double nmse;     /* worst NMSE seen in the current check */
  bool bad;
  char why[320];   /* first failure of the current check */
} chk;

/* A tensor on both sides with the same contents, each inside a guarded allocation. */
typedef struct {
  vl_tensor buf[2]; /* the allocation: GUARD | tensor | GUARD */
  vl_tensor t[2];   /* the op's view of the middle */
  size_t total;     /* bytes uploaded / downloaded, guards included */
  uint8_t *host;    /* the initial contents, guards included */
  bool ok;
} tp;

static void fail(chk *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(chk *k, const char *fmt, ...) {
  if (!k->bad) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->why, sizeof k->why, fmt, ap);
    va_end(ap);
  }
  k->bad = true;
}

static void status(chk *k, int side, vl_status s, const char *op) {
  if (s != VL_OK)
    fail(k, "%s %s: %s: %s", SIDE[side], op, vl_status_name(s), k->ctx[side]->err);
}

static float *randv(chk *k, int64_t n, float scale) {
  float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (!v) { perror("malloc"); exit(2); }
  for (int64_t i = 0; i < n; i++) v[i] = scale * vl_rng_normal(&k->rng);
  return v;
}

/* Allocate and fill on both sides. vals: n fp32 values (NF4 is quantised from them), or
 * NULL for zeros. */
static void tp_make(chk *k, tp *p, vl_dtype dt, int ndim, const int64_t *shape, const float *vals) {
  memset(p, 0, sizeof *p);
  vl_tensor shp;
  memset(&shp, 0, sizeof shp);
  vl_tensor_set_shape(&shp, dt, ndim, shape);
  p->total = shp.bytes + 2 * GUARD;
  p->host = malloc(p->total);
  if (!p->host) { perror("malloc"); exit(2); }
  memset(p->host, GUARD_BYTE, p->total);
  uint8_t *mid = p->host + GUARD;
  if (!vals) memset(mid, 0, shp.bytes);
  else if (dt == VL_NF4) {
    if (vl_nf4_quantize_host(mid, vals, shp.n) != 0) fail(k, "nf4 quantisation failed");
  } else {
    for (int64_t i = 0; i < shp.n; i++) vl_st(mid, (int)dt, i, vals[i]);
  }
  for (int s = 0; s < 2; s++) {
    vl_ctx *c = k->ctx[s];
    vl_status r = vl_tensor_alloc2(c, &p->buf[s], VL_F32, VL_MEM_TEMP, 1,
                                   (int64_t)((p->total + 3) / 4));
    status(k, s, r, "alloc");
    if (r != VL_OK) return;
    status(k, s, c->be->upload(c, &p->buf[s], 0, p->host, p->total), "upload");
    vl_tensor v = p->buf[s];
    vl_tensor_set_shape(&v, dt, ndim, shape);
    v.data = (char *)p->buf[s].data + GUARD;
    v.off = p->buf[s].off + GUARD;
    v.owned = false;
    p->t[s] = v;
  }
  p->ok = !k->bad;
}

static void tp_free(chk *k, tp *p) {
  for (int s = 0; s < 2; s++)
    if (p->buf[s].owned) vl_tensor_free(k->ctx[s], &p->buf[s]);
  free(p->host);
  memset(p, 0, sizeof *p);
}

/* Download both sides, check the guards, decode to fp32 (n elements of the view each). */
static bool tp_read(chk *k, tp *p, const char *what, float *out[2]) {
  out[0] = out[1] = NULL;
  if (!p->ok) return false;
  bool ok = true;
  for (int s = 0; s < 2; s++) {
    vl_ctx *c = k->ctx[s];
    uint8_t *raw = malloc(p->total);
    out[s] = malloc(sizeof(float) * (size_t)(p->t[s].n > 0 ? p->t[s].n : 1));
    if (!raw || !out[s]) { perror("malloc"); exit(2); }
    vl_status r = c->be->download(c, raw, &p->buf[s], 0, p->total);
    status(k, s, r, "download");
    if (r != VL_OK) { free(raw); ok = false; continue; }
    for (size_t i = 0; i < GUARD; i++)
      if (raw[i] != GUARD_BYTE || raw[p->total - 1 - i] != GUARD_BYTE) {
        fail(k, "%s: guard bytes around %s overwritten", SIDE[s], what);
        ok = false;
        break;
      }
    const vl_tensor *t = &p->t[s];
    for (int64_t i = 0; i < t->n; i++)
      out[s][i] = t->dtype == VL_NF4 ? vl_nf4_get(raw + GUARD, t->n, i)
                                     : vl_ld(raw + GUARD, (int)t->dtype, i);
    free(raw);
  }
  return ok;
}

/* Compare one output of the op on both sides. */
static void cmp(chk *k, tp *p, const char *what) {
  float *v[2];
  if (tp_read(k, p, what, v)) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < p->t[CU].n; i++) {
      double a = v[CU][i], b = v[CPU][i];
      if (isfinite(b) && !isfinite(a)) {
        fail(k, "%s[%lld]: cuda %g where cpu is %g", what, (long long)i, a, b);
        break;
      }
      if (!isfinite(b)) continue; /* both sides saw the same non-finite input */
      num += (a - b) * (a - b);
      den += b * b;
    }
    double e = den > 0 ? num / den : num;
    if (e > k->nmse || isnan(e)) k->nmse = e;
  }
  free(v[0]);
  free(v[1]);
}

/* The same value on both sides for a host-side result (sumsq). */
static void cmp_scalar(chk *k, double cu, double cpu, const char *what) {
  if (isfinite(cpu) && !isfinite(cu)) { fail(k, "%s: cuda %g where cpu is %g", what, cu, cpu); return; }
  double e = cpu != 0 ? (cu - cpu) * (cu - cpu) / (cpu * cpu) : cu * cu;
  if (e > k->nmse) k->nmse = e;
}

/* ---- checks: each gets up to three dtypes and an option from its table row ------------- */
typedef struct { vl_dtype a, b, c; int opt; } args;

#define EACH(s) for (int s = 0; s < 2; s++)
#define CALL(k, s, op, ...) status((k), (s), (k)->ctx[s]->be->op((k)->ctx[s], __VA_ARGS__), #op)

static void ck_copy(chk *k, args a) {
  int64_t n = 1024; /* a multiple of the NF4 block */
  float *x = randv(k, n, 1);
  tp t;
  tp_make(k, &t, a.a, 1, &n, x);
  cmp(k, &t, "tensor"); /* upload in tp_make, download in cmp */
  tp_free(k, &t);
  free(x);
}

/* opt 1: from pinned host memory (host_alloc), else from pageable; both asynchronous */
static void ck_upload_async(chk *k, args a) {
  int64_t n = 4099;
  float *xv = randv(k, n, 1);
  tp y;
  tp_make(k, &y, VL_F32, 1, &n, NULL);
  if (y.ok) EACH(s) {
    vl_ctx *c = k->ctx[s];
    float *h = c->be->host_alloc(c, (size_t)n * sizeof(float), a.opt != 0);
    if (!h) { fail(k, "host_alloc failed"); break; }
    memcpy(h, xv, (size_t)n * sizeof(float));
    status(k, s, c->be->upload_async(c, &y.t[s], 0, h, (size_t)n * sizeof(float)), "upload_async");
    status(k, s, c->be->sync(c), "sync");
    c->be->host_free(c, h, a.opt != 0);
  }
  cmp(k, &y, "y");
  tp_free(k, &y);
  free(xv);
}

static void ck_sync(chk *k, args a) {
  (void)a;
  EACH(s) status(k, s, k->ctx[s]->be->sync(k->ctx[s]), "sync");
}

static void ck_zero(chk *k, args a) {
  int64_t n = 3001;
  float *x = randv(k, n, 1);
  tp y;
  tp_make(k, &y, a.a, 1, &n, x);
  if (y.ok) EACH(s) CALL(k, s, zero, &y.t[s]);
  cmp(k, &y, "y");
  tp_free(k, &y);
  free(x);
}

static void ck_convert(chk *k, args a) {
  int64_t n = 4099;
  float *xv = randv(k, n, 3), *yv = randv(k, n, 1);
  xv[0] = 70000.0f; /* overflows fp16 */
  xv[1] = 1e-6f;    /* fp16 subnormal */
  tp x, y;
  tp_make(k, &x, a.a, 1, &n, xv);
  tp_make(k, &y, a.b, 1, &n, yv);
  if (x.ok && y.ok) EACH(s) CALL(k, s, convert, &y.t[s], &x.t[s], n - 3); /* tail untouched */
  cmp(k, &y, "y");
  tp_free(k, &x); tp_free(k, &y);
  free(xv); free(yv);
}

static void ck_axpby(chk *k, args a) {
  int64_t n = 5003;
  float *xv = randv(k, n, 1), *yv = randv(k, n, 1), *nanv = randv(k, n, 1);
  for (int64_t i = 0; i < n; i++) nanv[i] = NAN; /* b = 0 must ignore y's garbage */
  tp x, y, z;
  tp_make(k, &x, a.b, 1, &n, xv);
  tp_make(k, &y, a.a, 1, &n, yv);
  tp_make(k, &z, a.a, 1, &n, nanv);
  if (x.ok && y.ok && z.ok) EACH(s) {
    CALL(k, s, axpby, &y.t[s], 0.75f, &x.t[s], -1.25f, n);
    CALL(k, s, axpby, &z.t[s], 2.0f, &x.t[s], 0.0f, n);
  }
  cmp(k, &y, "y");
  cmp(k, &z, "y (b=0)");
  tp_free(k, &x); tp_free(k, &y); tp_free(k, &z);
  free(xv); free(yv); free(nanv);
}

static int32_t *tokens(chk *k, int64_t R, int64_t V, bool some_ignored) {
  int32_t *t = malloc(sizeof(int32_t) * (size_t)R);
  if (!t) { perror("malloc"); exit(2); }
  for (int64_t r = 0; r < R; r++) t[r] = (int32_t)vl_rng_below(&k->rng, (uint64_t)V);
  if (some_ignored)
    for (int64_t r = 0; r < R; r += 5) t[r] = -1;
  return t;
}

/* Token ids in a device tensor on each side (ops read ids from device memory). */
static void tok_make(chk *k, tp *p, const int32_t *tok, int64_t R) {
  tp_make(k, p, VL_F32, 1, &R, NULL); /* 4-byte elements, zeroed, with guards */
  if (!p->ok) return;
  EACH(s) status(k, s, k->ctx[s]->be->upload(k->ctx[s], &p->buf[s], GUARD, tok, sizeof(int32_t) * (size_t)R), "upload ids");
}
#define IDS(p, s) ((const int32_t *)(p).t[s].data)

static void ck_embed_fwd(chk *k, args a) {
  int64_t V = 53, C = 96, R = 70, ws[2] = {V, C}, os[2] = {R, C};
  float *w = randv(k, V * C, 1);
  int32_t *tok = tokens(k, R, V, false);
  tp wte, out, ids;
  tp_make(k, &wte, a.b, 2, ws, w);
  tp_make(k, &out, a.a, 2, os, NULL);
  tok_make(k, &ids, tok, R);
  if (wte.ok && out.ok && ids.ok) EACH(s) CALL(k, s, embed_fwd, &out.t[s], &wte.t[s], IDS(ids, s), R, C);
  cmp(k, &out, "out");
  tp_free(k, &wte); tp_free(k, &out); tp_free(k, &ids);
  free(w); free(tok);
}

static void ck_embed_bwd(chk *k, args a) {
  int64_t V = 11, C = 130, R = 97, ws[2] = {V, C}, os[2] = {R, C}; /* many repeated tokens */
  float *w = randv(k, V * C, 1), *d = randv(k, R * C, 1);
  int32_t *tok = tokens(k, R, V, false);
  tp dw, dout, ids;
  tp_make(k, &dw, a.a, 2, ws, w);
  tp_make(k, &dout, a.b, 2, os, d);
  tok_make(k, &ids, tok, R);
  if (dw.ok && dout.ok && ids.ok) EACH(s) CALL(k, s, embed_bwd, &dw.t[s], &dout.t[s], IDS(ids, s), R, C);
  cmp(k, &dw, "dwte");
  tp_free(k, &dw); tp_free(k, &dout); tp_free(k, &ids);
  free(w); free(d); free(tok);
}

static float *around_one(chk *k, int64_t n) {
  float *w = randv(k, n, 0.2f);
  for (int64_t i = 0; i < n; i++) w[i] += 1.0f;
  return w;
}

static void ck_rmsnorm_fwd(chk *k, args a) {
  int64_t R = 33, C = 200, xs[2] = {R, C};
  float *xv = randv(k, R * C, 2), *wv = around_one(k, C);
  tp x, w, out, rstd;
  tp_make(k, &x, a.a, 2, xs, xv);
  tp_make(k, &w, a.b, 1, &C, wv);
  tp_make(k, &out, a.a, 2, xs, NULL);
  tp_make(k, &rstd, VL_F32, 1, &R, NULL);
  if (x.ok && w.ok && out.ok && rstd.ok)
    EACH(s) CALL(k, s, rmsnorm_fwd, &out.t[s], &rstd.t[s], &x.t[s], &w.t[s], R, C, 1e-5f);
  cmp(k, &out, "out");
  cmp(k, &rstd, "rstd");
  tp_free(k, &x); tp_free(k, &w); tp_free(k, &out); tp_free(k, &rstd);
  free(xv); free(wv);
}

/* opt 1: frozen norm weight (dw NULL) */
static void ck_rmsnorm_bwd(chk *k, args a) {
  int64_t R = 29, C = 160, xs[2] = {R, C};
  float *xv = randv(k, R * C, 1), *wv = around_one(k, C), *dyv = randv(k, R * C, 1);
  float *dxv = randv(k, R * C, 1), *dwv = randv(k, C, 1), *rv = randv(k, R, 0.1f);
  for (int64_t r = 0; r < R; r++) rv[r] = 1.0f + fabsf(rv[r]);
  tp x, w, dy, dx, dw, rstd;
  tp_make(k, &x, a.a, 2, xs, xv);
  tp_make(k, &w, a.b, 1, &C, wv);
  tp_make(k, &dy, a.a, 2, xs, dyv);
  tp_make(k, &dx, a.a, 2, xs, dxv);
  tp_make(k, &dw, VL_F32, 1, &C, dwv);
  tp_make(k, &rstd, VL_F32, 1, &R, rv);
  if (x.ok && w.ok && dy.ok && dx.ok && dw.ok && rstd.ok)
    EACH(s) CALL(k, s, rmsnorm_bwd, &dx.t[s], a.opt ? NULL : &dw.t[s], &dy.t[s], &x.t[s],
                 &w.t[s], &rstd.t[s], R, C);
  cmp(k, &dx, "dx");
  cmp(k, &dw, "dw");
  tp_free(k, &x); tp_free(k, &w); tp_free(k, &dy); tp_free(k, &dx); tp_free(k, &dw);
  tp_free(k, &rstd);
  free(xv); free(wv); free(dyv); free(dxv); free(dwv); free(rv);
}

/* opt 1: inverse rotation */
static void ck_rope(chk *k, args a) {
  int64_t B = 2, T = 19, H = 3, D = 16, sh[4] = {B, T, H, D};
  float *xv = randv(k, B * T * H * D, 1);
  tp x;
  tp_make(k, &x, a.a, 4, sh, xv);
  if (x.ok) EACH(s) CALL(k, s, rope, &x.t[s], B, T, H, D, 10000.0f, a.opt != 0);
  cmp(k, &x, "x");
  tp_free(k, &x);
  free(xv);
}

/* opt 1: back = true, (B,H,T,D) -> (B,T,H,D) */
static void ck_permute(chk *k, args a) {
  int64_t B = 2, T = 7, H = 5, D = 12, sh[4] = {B, T, H, D};
  float *xv = randv(k, B * T * H * D, 1);
  tp x, y;
  tp_make(k, &x, a.a, 4, sh, xv);
  tp_make(k, &y, a.a, 4, sh, NULL);
  if (x.ok && y.ok) EACH(s) CALL(k, s, permute, &y.t[s], &x.t[s], B, T, H, D, a.opt != 0);
  cmp(k, &y, "y");
  tp_free(k, &x); tp_free(k, &y);
  free(xv);
}

/* opt 1: P aliases S (in place) */
static void ck_softmax_fwd(chk *k, args a) {
  int64_t T = 17, rows = 2 * 3 * T, sh[2] = {rows, T};
  float *sv = randv(k, rows * T, 3);
  tp S, P;
  tp_make(k, &S, a.a, 2, sh, sv);
  tp_make(k, &P, a.b, 2, sh, NULL);
  if (S.ok && P.ok)
    EACH(s) CALL(k, s, softmax_causal_fwd, a.opt ? &S.t[s] : &P.t[s], &S.t[s], rows, T, 0.35f);
  cmp(k, a.opt ? &S : &P, "P");
  tp_free(k, &S); tp_free(k, &P);
  free(sv);
}

/* opt 1: dS aliases dP */
static void ck_softmax_bwd(chk *k, args a) {
  int64_t T = 13, rows = 4 * T, sh[2] = {rows, T};
  float *pv = randv(k, rows * T, 1), *dpv = randv(k, rows * T, 1);
  for (int64_t r = 0; r < rows; r++) { /* a causal probability row */
    int64_t q = r % T;
    float sum = 0;
    for (int64_t c = 0; c < T; c++) { pv[r * T + c] = c <= q ? expf(pv[r * T + c]) : 0; sum += pv[r * T + c]; }
    for (int64_t c = 0; c <= q; c++) pv[r * T + c] /= sum;
  }
  tp P, dP, dS;
  tp_make(k, &P, a.a, 2, sh, pv);
  tp_make(k, &dP, a.a, 2, sh, dpv);
  tp_make(k, &dS, a.a, 2, sh, NULL);
  if (P.ok && dP.ok && dS.ok)
    EACH(s) CALL(k, s, softmax_causal_bwd, a.opt ? &dP.t[s] : &dS.t[s], &dP.t[s], &P.t[s], rows, T,
                 0.35f);
  cmp(k, a.opt ? &dP : &dS, "dS");
  tp_free(k, &P); tp_free(k, &dP); tp_free(k, &dS);
  free(pv); free(dpv);
}

static void ck_swiglu_fwd(chk *k, args a) {
  int64_t n = 6007;
  float *gv = randv(k, n, 2), *uv = randv(k, n, 1);
  tp g, u, out;
  tp_make(k, &g, a.a, 1, &n, gv);
  tp_make(k, &u, a.a, 1, &n, uv);
  tp_make(k, &out, a.b, 1, &n, NULL);
  if (g.ok && u.ok && out.ok) EACH(s) CALL(k, s, swiglu_fwd, &out.t[s], &g.t[s], &u.t[s], n);
  cmp(k, &out, "out");
  tp_free(k, &g); tp_free(k, &u); tp_free(k, &out);
  free(gv); free(uv);
}

static void ck_swiglu_bwd(chk *k, args a) {
  int64_t n = 6007;
  float *gv = randv(k, n, 2), *uv = randv(k, n, 1), *dv = randv(k, n, 1);
  tp g, u, d, dg, du;
  tp_make(k, &g, a.a, 1, &n, gv);
  tp_make(k, &u, a.a, 1, &n, uv);
  tp_make(k, &d, a.a, 1, &n, dv);
  tp_make(k, &dg, a.b, 1, &n, NULL);
  tp_make(k, &du, a.b, 1, &n, NULL);
  if (g.ok && u.ok && d.ok && dg.ok && du.ok)
    EACH(s) CALL(k, s, swiglu_bwd, &dg.t[s], &du.t[s], &d.t[s], &g.t[s], &u.t[s], n);
  cmp(k, &dg, "dg");
  cmp(k, &du, "du");
  tp_free(k, &g); tp_free(k, &u); tp_free(k, &d); tp_free(k, &dg); tp_free(k, &du);
  free(gv); free(uv); free(dv);
}

static void ck_xent(chk *k, args a) {
  int64_t R = 19, V = 300, sh[2] = {R, V};
  float *lv = randv(k, R * V, 2);
  int32_t *tgt = tokens(k, R, V, true);
  tp logits, loss, ids;
  tp_make(k, &logits, a.a, 2, sh, lv);
  tp_make(k, &loss, VL_F32, 1, &R, NULL);
  tok_make(k, &ids, tgt, R);
  if (logits.ok && loss.ok && ids.ok)
    EACH(s) CALL(k, s, xent_fused, &logits.t[s], &loss.t[s], IDS(ids, s), R, V, 1.0f / (float)R);
  cmp(k, &logits, "dlogits");
  cmp(k, &loss, "loss");
  tp_free(k, &logits); tp_free(k, &loss); tp_free(k, &ids);
  free(lv); free(tgt);
}

/* opt 1: one NaN and one Inf in the input: both sides must report non-finite */
static void ck_sumsq(chk *k, args a) {
  int64_t n = 300007;
  float *xv = randv(k, n, 1);
  if (a.opt) { xv[n / 3] = NAN; xv[n - 1] = INFINITY; }
  tp x;
  tp_make(k, &x, a.a, 1, &n, xv);
  double out[2] = {0, 0};
  bool nf[2] = {false, false};
  if (x.ok) EACH(s) CALL(k, s, sumsq, &x.t[s], n, &out[s], &nf[s]);
  if (nf[CU] != nf[CPU]) fail(k, "nonfinite: cuda %d, cpu %d", nf[CU], nf[CPU]);
  if (a.opt && !nf[CU]) fail(k, "cuda missed the NaN/Inf");
  cmp_scalar(k, out[CU], out[CPU], "sum of squares");
  cmp(k, &x, "x (unchanged)");
  tp_free(k, &x);
  free(xv);
}

static vl_optim_hp hparams(void) {
  vl_optim_hp h;
  memset(&h, 0, sizeof h);
  h.lr = 1e-2f; h.beta1 = 0.9f; h.beta2 = 0.999f; h.eps = 1e-8f; h.weight_decay = 0.01f;
  h.t = 3; h.eps2 = 1e-3f; h.clip_thr = 1.0f; h.decay_pow = 0.8f; h.momentum = 0.9f;
  h.grad_scale = 0.5f;
  return h;
}

static void ck_adamw(chk *k, args a) {
  (void)a;
  int64_t n = 7001;
  float *pv = randv(k, n, 1), *gv = randv(k, n, 1), *mv = randv(k, n, 0.1f), *vv = randv(k, n, 0.1f);
  for (int64_t i = 0; i < n; i++) vv[i] = vv[i] * vv[i];
  tp p, g, m, v;
  tp_make(k, &p, VL_F32, 1, &n, pv);
  tp_make(k, &g, VL_F32, 1, &n, gv);
  tp_make(k, &m, VL_F32, 1, &n, mv);
  tp_make(k, &v, VL_F32, 1, &n, vv);
  vl_optim_hp h = hparams();
  if (p.ok && g.ok && m.ok && v.ok) EACH(s) CALL(k, s, adamw, &p.t[s], &g.t[s], &m.t[s], &v.t[s], n, &h);
  cmp(k, &p, "p"); cmp(k, &m, "m"); cmp(k, &v, "v");
  tp_free(k, &p); tp_free(k, &g); tp_free(k, &m); tp_free(k, &v);
  free(pv); free(gv); free(mv); free(vv);
}

static void ck_sgd(chk *k, args a) {
  (void)a;
  int64_t n = 7001;
  float *pv = randv(k, n, 1), *gv = randv(k, n, 1), *mv = randv(k, n, 0.1f);
  tp p, g, m;
  tp_make(k, &p, VL_F32, 1, &n, pv);
  tp_make(k, &g, VL_F32, 1, &n, gv);
  tp_make(k, &m, VL_F32, 1, &n, mv);
  vl_optim_hp h = hparams();
  if (p.ok && g.ok && m.ok) EACH(s) CALL(k, s, sgd, &p.t[s], &g.t[s], &m.t[s], n, &h);
  cmp(k, &p, "p"); cmp(k, &m, "momentum");
  tp_free(k, &p); tp_free(k, &g); tp_free(k, &m);
  free(pv); free(gv); free(mv);
}

/* opt 0: (R,C) matrix with a first moment; 1: a vector (R = 1) without; 2: matrix without */
static void ck_adafactor(chk *k, args a) {
  int64_t R = a.opt == 1 ? 1 : 37, C = 150, n = R * C;
  float *pv = randv(k, n, 1), *gv = randv(k, n, 1), *mv = randv(k, n, 0.1f);
  float *vrv = randv(k, R, 0.1f), *vcv = randv(k, C, 0.1f);
  for (int64_t i = 0; i < R; i++) vrv[i] = vrv[i] * vrv[i] + 1e-3f;
  for (int64_t i = 0; i < C; i++) vcv[i] = vcv[i] * vcv[i] + 1e-3f;
  tp p, g, m, vr, vc;
  tp_make(k, &p, VL_F32, 1, &n, pv);
  tp_make(k, &g, VL_F32, 1, &n, gv);
  tp_make(k, &m, VL_F32, 1, &n, mv);
  tp_make(k, &vr, VL_F32, 1, &R, vrv);
  tp_make(k, &vc, VL_F32, 1, &C, vcv);
  vl_optim_hp h = hparams();
  bool with_m = a.opt == 0;
  if (!with_m) h.beta1 = 0.0f;
  if (p.ok && g.ok && m.ok && vr.ok && vc.ok)
    EACH(s) CALL(k, s, adafactor, &p.t[s], &g.t[s], &vr.t[s], &vc.t[s], with_m ? &m.t[s] : NULL,
                 R, C, &h);
  cmp(k, &p, "p"); cmp(k, &vc, "vc");
  if (R > 1) cmp(k, &vr, "vr");
  if (with_m) cmp(k, &m, "m");
  tp_free(k, &p); tp_free(k, &g); tp_free(k, &m); tp_free(k, &vr); tp_free(k, &vc);
  free(pv); free(gv); free(mv); free(vrv); free(vcv);
}

/* GEMM with A, B, C dtypes a.a, a.b, a.c; opt bit 0: ta, bit 1: tb, bit 2: batch 3 with
 * padded leading dims, offsets and strides (an NF4 B stays whole and shared). */
static void ck_gemm(chk *k, args a) {
  bool ta = a.opt & 1, tb = a.opt & 2, big = a.opt & 4;
  int64_t M = 37, N = 64, K = 48, batch = big ? 3 : 1, pad = big ? 5 : 0;
  int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  vl_gemm g;
  memset(&g, 0, sizeof g);
  g.ta = ta; g.tb = tb; g.M = M; g.N = N; g.K = K; g.batch = batch;
  g.alpha = 0.8f; g.beta = big ? 0.5f : 0.0f;
  g.lda = ac + pad; g.a_off = pad; g.sa = ar * g.lda + pad;
  if (a.b == VL_NF4) { g.ldb = bc; g.b_off = 0; g.sb = 0; }
  else { g.ldb = bc + pad; g.b_off = 2 * pad; g.sb = br * g.ldb + pad; }
  g.ldc = N + pad; g.c_off = 3 * pad; g.sc = M * g.ldc + pad;
  int64_t na = g.a_off + (batch - 1) * g.sa + ar * g.lda;
  int64_t nb = a.b == VL_NF4 ? br * bc : g.b_off + (batch - 1) * g.sb + br * g.ldb;
  int64_t nc = g.c_off + (batch - 1) * g.sc + M * g.ldc;
  float *av = randv(k, na, 1), *bv = randv(k, nb, 1), *cv = randv(k, nc, 1);
  tp A, B, C;
  tp_make(k, &A, a.a, 1, &na, av);
  tp_make(k, &B, a.b, 1, &nb, bv);
  tp_make(k, &C, a.c, 1, &nc, cv);
  if (A.ok && B.ok && C.ok) EACH(s) {
    vl_ctx *c = k->ctx[s];
    vl_gemm gs = g;
    gs.A = &A.t[s]; gs.B = &B.t[s]; gs.C = &C.t[s];
    gs.ws_bytes = c->be->gemm_ws_bytes(c, &gs);
    vl_tensor ws;
    memset(&ws, 0, sizeof ws);
    if (gs.ws_bytes) {
      vl_status r = vl_tensor_alloc2(c, &ws, VL_F32, VL_MEM_WORKSPACE, 1,
                                     (int64_t)((gs.ws_bytes + 3) / 4));
      status(k, s, r, "workspace alloc");
      if (r != VL_OK) continue;
      gs.ws = ws.data;
    }
    CALL(k, s, gemm, &gs);
    if (s == CU) status(k, s, c->be->sync(c), "sync"); /* before the workspace is freed */
    if (ws.owned) vl_tensor_free(c, &ws);
  }
  cmp(k, &C, "C");
  tp_free(k, &A); tp_free(k, &B); tp_free(k, &C);
  free(av); free(bv); free(cv);
}

/* ---- convolutional networks ------------------------------------------------------------ */

/* x (N, C, HW) with channel c around 0.5 c, so the per-channel statistics differ */
static float *chan_offset(chk *k, int64_t N, int64_t C, int64_t HW, float scale) {
  float *v = randv(k, N * C * HW, scale);
  for (int64_t i = 0; i < N * C * HW; i++) v[i] += 0.5f * (float)((i / HW) % C);
  return v;
}

/* BN shapes: opt bit 0 ("big HW") makes HW larger than the CUDA block (a block stride
 * stays within a plane or wraps to the next), else HW is smaller and not a divisor of it
 * (a stride crosses planes); N*HW spans several strides either way. */
static void bn_shape(int opt, int64_t *N, int64_t *C, int64_t *HW) {
  if (opt & 1) { *N = 2; *C = 5; *HW = 300; }
  else { *N = 6; *C = 19; *HW = 143; }
}

/* x/y in a.a, gamma/beta in a.b; opt bit 1: no running statistics */
static void ck_bn_train(chk *k, args a) {
  int64_t N, C, HW;
  bn_shape(a.opt, &N, &C, &HW);
  int64_t n = N * C * HW;
  float *xv = chan_offset(k, N, C, HW, 2), *gv = around_one(k, C), *bv = randv(k, C, 1);
  float *rmv = randv(k, C, 1), *rvv = around_one(k, C);
  tp x, y, g, b, mean, rstd, rm, rv;
  tp_make(k, &x, a.a, 1, &n, xv);
  tp_make(k, &y, a.a, 1, &n, NULL);
  tp_make(k, &g, a.b, 1, &C, gv);
  tp_make(k, &b, a.b, 1, &C, bv);
  tp_make(k, &mean, VL_F32, 1, &C, NULL);
  tp_make(k, &rstd, VL_F32, 1, &C, NULL);
  tp_make(k, &rm, VL_F32, 1, &C, rmv);
  tp_make(k, &rv, VL_F32, 1, &C, rvv);
  bool stats = !(a.opt & 2);
  if (x.ok && y.ok && g.ok && b.ok && mean.ok && rstd.ok && rm.ok && rv.ok)
    EACH(s) CALL(k, s, bn_fwd_train, &y.t[s], &mean.t[s], &rstd.t[s], stats ? &rm.t[s] : NULL,
                 stats ? &rv.t[s] : NULL, &x.t[s], &g.t[s], &b.t[s], N, C, HW, 1e-5f, 0.1f);
  cmp(k, &y, "y");
  cmp(k, &mean, "mean");
  cmp(k, &rstd, "rstd");
  cmp(k, &rm, "running mean"); /* unchanged on both without stats */
  cmp(k, &rv, "running var");
  tp_free(k, &x); tp_free(k, &y); tp_free(k, &g); tp_free(k, &b); tp_free(k, &mean);
  tp_free(k, &rstd); tp_free(k, &rm); tp_free(k, &rv);
  free(xv); free(gv); free(bv); free(rmv); free(rvv);
}

/* opt bit 1: y aliases x */
static void ck_bn_eval(chk *k, args a) {
  int64_t N, C, HW;
  bn_shape(a.opt, &N, &C, &HW);
  int64_t n = N * C * HW;
  float *xv = chan_offset(k, N, C, HW, 2), *gv = around_one(k, C), *bv = randv(k, C, 1);
  float *rmv = randv(k, C, 1), *rvv = around_one(k, C);
  tp x, y, g, b, rm, rv;
  tp_make(k, &x, a.a, 1, &n, xv);
  tp_make(k, &y, a.a, 1, &n, NULL);
  tp_make(k, &g, a.b, 1, &C, gv);
  tp_make(k, &b, a.b, 1, &C, bv);
  tp_make(k, &rm, VL_F32, 1, &C, rmv);
  tp_make(k, &rv, VL_F32, 1, &C, rvv);
  tp *out = a.opt & 2 ? &x : &y;
  if (x.ok && y.ok && g.ok && b.ok && rm.ok && rv.ok)
    EACH(s) CALL(k, s, bn_fwd_eval, &out->t[s], &x.t[s], &g.t[s], &b.t[s], &rm.t[s], &rv.t[s], N,
                 C, HW, 1e-5f);
  cmp(k, out, "y");
  tp_free(k, &x); tp_free(k, &y); tp_free(k, &g); tp_free(k, &b); tp_free(k, &rm); tp_free(k, &rv);
  free(xv); free(gv); free(bv); free(rmv); free(rvv);
}

/* x/dy/dx in a.a, gamma in a.b, dgamma/dbeta in a.c (accumulated into random values);
 * opt bit 1: no dgamma/dbeta; bit 2: dx aliases dy. mean/rstd are the batch's own. */
static void ck_bn_bwd(chk *k, args a) {
  int64_t N, C, HW;
  bn_shape(a.opt, &N, &C, &HW);
  int64_t n = N * C * HW, M = N * HW;
  float *xv = chan_offset(k, N, C, HW, 2), *gv = around_one(k, C), *dyv = randv(k, n, 1);
  float *dgv = randv(k, C, 1), *dbv = randv(k, C, 1), *mv = randv(k, C, 1), *rsv = randv(k, C, 1);
  for (int64_t c = 0; c < C; c++) { /* the statistics of x as stored */
    double s = 0, ss = 0;
    for (int64_t j = 0; j < M; j++) s += vl_round_to((int)a.a, xv[(j / HW * C + c) * HW + j % HW]);
    for (int64_t j = 0; j < M; j++) {
      double d = vl_round_to((int)a.a, xv[(j / HW * C + c) * HW + j % HW]) - s / (double)M;
      ss += d * d;
    }
    mv[c] = (float)(s / (double)M);
    rsv[c] = (float)(1.0 / sqrt(ss / (double)M + 1e-5));
  }
  tp x, g, dy, dx, dg, db, mean, rstd;
  tp_make(k, &x, a.a, 1, &n, xv);
  tp_make(k, &g, a.b, 1, &C, gv);
  tp_make(k, &dy, a.a, 1, &n, dyv);
  tp_make(k, &dx, a.a, 1, &n, NULL);
  tp_make(k, &dg, a.c, 1, &C, dgv);
  tp_make(k, &db, a.c, 1, &C, dbv);
  tp_make(k, &mean, VL_F32, 1, &C, mv);
  tp_make(k, &rstd, VL_F32, 1, &C, rsv);
  bool grads = !(a.opt & 2);
  tp *out = a.opt & 4 ? &dy : &dx;
  if (x.ok && g.ok && dy.ok && dx.ok && dg.ok && db.ok && mean.ok && rstd.ok)
    EACH(s) CALL(k, s, bn_bwd, &out->t[s], grads ? &dg.t[s] : NULL, grads ? &db.t[s] : NULL,
                 &dy.t[s], &x.t[s], &g.t[s], &mean.t[s], &rstd.t[s], N, C, HW);
  cmp(k, out, "dx");
  cmp(k, &dg, "dgamma");
  cmp(k, &db, "dbeta");
  tp_free(k, &x); tp_free(k, &g); tp_free(k, &dy); tp_free(k, &dx); tp_free(k, &dg);
  tp_free(k, &db); tp_free(k, &mean); tp_free(k, &rstd);
  free(xv); free(gv); free(dyv); free(dgv); free(dbv); free(mv); free(rsv);
}

/* y in a.a, x in a.b; opt 1: in place (a.a == a.b) */
static void ck_relu_fwd(chk *k, args a) {
  int64_t n = 10007;
  float *xv = randv(k, n, 1);
  xv[3] = NAN; /* propagates, on both */
  tp x, y;
  tp_make(k, &x, a.b, 1, &n, xv);
  tp_make(k, &y, a.a, 1, &n, NULL);
  tp *out = a.opt ? &x : &y;
  if (x.ok && y.ok) EACH(s) CALL(k, s, relu_fwd, &out->t[s], &x.t[s], n);
  cmp(k, out, "y");
  tp_free(k, &x); tp_free(k, &y);
  free(xv);
}

/* dx/dy in a.a, y in a.b; opt 1: dx aliases dy */
static void ck_relu_bwd(chk *k, args a) {
  int64_t n = 10007;
  float *yv = randv(k, n, 1), *dyv = randv(k, n, 1);
  for (int64_t i = 0; i < n; i++) yv[i] = yv[i] > 0 ? yv[i] : 0.0f; /* a ReLU output */
  tp y, dy, dx;
  tp_make(k, &y, a.b, 1, &n, yv);
  tp_make(k, &dy, a.a, 1, &n, dyv);
  tp_make(k, &dx, a.a, 1, &n, NULL);
  tp *out = a.opt ? &dy : &dx;
  if (y.ok && dy.ok && dx.ok) EACH(s) CALL(k, s, relu_bwd, &out->t[s], &dy.t[s], &y.t[s], n);
  cmp(k, out, "dx");
  tp_free(k, &y); tp_free(k, &dy); tp_free(k, &dx);
  free(yv); free(dyv);
}

/* Pool geometries: 0: ResNet's stem 3x3/2 pad 1; 1: U-Net's 2x2/2; 2: 3x3/2 pad 1 with
 * ceil_mode sizes (the last windows hang over the edge). */
typedef struct { int64_t planes, H, W; int k, s, p; int64_t P, Q; } pool_geo;
static pool_geo pool_geom(int opt) {
  static const pool_geo g[3] = {{6, 17, 17, 3, 2, 1, 9, 9},
                                {6, 16, 14, 2, 2, 0, 8, 7},
                                {6, 16, 14, 3, 2, 1, 9, 8}};
  return g[opt % 3];
}
/* Values on a grid of 0.25 so windows hold ties (the first maximum must win on both). */
static float *tied(chk *k, int64_t n) {
  float *v = randv(k, n, 1);
  for (int64_t i = 0; i < n; i++) v[i] = 0.25f * roundf(4.0f * v[i]) - 2.0f;
  return v;
}

static void ck_maxpool_fwd(chk *k, args a) {
  pool_geo g = pool_geom(a.opt);
  int64_t ni = g.planes * g.H * g.W, no = g.planes * g.P * g.Q;
  float *xv = tied(k, ni);
  tp x, y;
  tp_make(k, &x, a.b, 1, &ni, xv);
  tp_make(k, &y, a.a, 1, &no, NULL);
  if (x.ok && y.ok)
    EACH(s) CALL(k, s, maxpool_fwd, &y.t[s], &x.t[s], g.planes, g.H, g.W, g.k, g.s, g.p, g.P, g.Q);
  cmp(k, &y, "y");
  tp_free(k, &x); tp_free(k, &y);
  free(xv);
}

/* dx/dy in a.a, x in a.b. The CUDA gather adds each input's gradients in the same order as
 * the CPU (a scatter for fp32 dx), so this is bit-exact. */
static void ck_maxpool_bwd(chk *k, args a) {
  pool_geo g = pool_geom(a.opt);
  int64_t ni = g.planes * g.H * g.W, no = g.planes * g.P * g.Q;
  float *xv = tied(k, ni), *dyv = randv(k, no, 1), *dxv = randv(k, ni, 1);
  tp x, dy, dx;
  tp_make(k, &x, a.b, 1, &ni, xv);
  tp_make(k, &dy, a.a, 1, &no, dyv);
  tp_make(k, &dx, a.a, 1, &ni, dxv); /* overwritten, garbage before */
  if (x.ok && dy.ok && dx.ok)
    EACH(s) CALL(k, s, maxpool_bwd, &dx.t[s], &dy.t[s], &x.t[s], g.planes, g.H, g.W, g.k, g.s,
                 g.p, g.P, g.Q);
  cmp(k, &dx, "dx");
  tp_free(k, &x); tp_free(k, &dy); tp_free(k, &dx);
  free(xv); free(dyv); free(dxv);
}

/* y/dy in a.a, x/dx in a.b; opt 1: a 1-pixel-wide plane (both edges clamp at once) */
static void ck_upsample_fwd(chk *k, args a) {
  int64_t P = 5, H = a.opt ? 9 : 13, W = a.opt ? 1 : 11, lo = P * H * W, hi = 4 * lo;
  float *xv = randv(k, lo, 1);
  tp x, y;
  tp_make(k, &x, a.b, 1, &lo, xv);
  tp_make(k, &y, a.a, 1, &hi, NULL);
  if (x.ok && y.ok) EACH(s) CALL(k, s, upsample2x_fwd, &y.t[s], &x.t[s], P, H, W);
  cmp(k, &y, "y");
  tp_free(k, &x); tp_free(k, &y);
  free(xv);
}

static void ck_upsample_bwd(chk *k, args a) {
  int64_t P = 5, H = a.opt ? 9 : 13, W = a.opt ? 1 : 11, lo = P * H * W, hi = 4 * lo;
  float *dyv = randv(k, hi, 1), *dxv = randv(k, lo, 1);
  tp dy, dx;
  tp_make(k, &dy, a.a, 1, &hi, dyv);
  tp_make(k, &dx, a.b, 1, &lo, dxv); /* overwritten */
  if (dy.ok && dx.ok) EACH(s) CALL(k, s, upsample2x_bwd, &dx.t[s], &dy.t[s], P, H, W);
  cmp(k, &dx, "dx");
  tp_free(k, &dy); tp_free(k, &dx);
  free(dyv); free(dxv);
}

/* y in a.a, x in a.b; opt 1: accumulate. Channels [3, 10) of x (12) into [5, 12) of y (16). */
static void ck_chan_copy(chk *k, args a) {
  int64_t N = 3, yC = 16, xC = 12, HW = 7 * 9, ny = N * yC * HW, nx = N * xC * HW;
  float *yv = randv(k, ny, 1), *xv = randv(k, nx, 1);
  tp y, x;
  tp_make(k, &y, a.a, 1, &ny, yv);
  tp_make(k, &x, a.b, 1, &nx, xv);
  if (y.ok && x.ok) EACH(s) CALL(k, s, chan_copy, &y.t[s], yC, 5, &x.t[s], xC, 3, 7, N, HW, a.opt != 0);
  cmp(k, &y, "y");
  tp_free(k, &y); tp_free(k, &x);
  free(yv); free(xv);
}

static void ck_xent_pix(chk *k, args a) {
  int64_t N = 2, K = 21, HW = 15 * 13, nl = N * K * HW, np = N * HW;
  float *lv = randv(k, nl, 2);
  int32_t *tgt = tokens(k, np, K, true);
  tp logits, loss, ids;
  tp_make(k, &logits, a.a, 1, &nl, lv);
  tp_make(k, &loss, VL_F32, 1, &np, NULL);
  tok_make(k, &ids, tgt, np);
  if (logits.ok && loss.ok && ids.ok)
    EACH(s) CALL(k, s, xent_pix, &logits.t[s], &loss.t[s], IDS(ids, s), N, K, HW, 1.0f / (float)np);
  cmp(k, &logits, "dlogits");
  cmp(k, &loss, "loss");
  tp_free(k, &logits); tp_free(k, &loss); tp_free(k, &ids);
  free(lv); free(tgt);
}

/* Convolutions: x, dx, y, dy in a.a, w in a.b, dw in a.c. opt & 3 picks the shape
 * (N=2, C=8, 9x9 -> K=16): 0: 3x3 pad 1 stride 1; 1: 3x3 pad 1 stride 2; 2: 3x3 dilation 2
 * pad 2; 3: 1x1 stride 2 (a ResNet downsampling shortcut). opt & 4: accumulate (weight
 * gradient). Each side sizes its own workspace (conv_ws_bytes) and takes it from its arena
 * as VL_MEM_WORKSPACE, as the layers do. */
static bool conv_shape(chk *k, args a, vl_conv *cv) {
  static const int geo[4][5] = {{3, 3, 1, 1, 1}, {3, 3, 2, 1, 1}, {3, 3, 1, 2, 2}, {1, 1, 2, 0, 1}};
  const int *g = geo[a.opt & 3]; /* R, S, stride, pad, dil */
  if (!vl_conv_init(cv, 2, 8, 9, 9, 16, g[0], g[1], g[2], g[3], g[4])) {
    fail(k, "vl_conv_init rejected the shape");
    return false;
  }
  cv->xdt = a.a; cv->wdt = a.b; cv->gdt = a.c;
  return true;
}

/* Workspace for one side (ws->owned tells whether one was taken). */
static void *conv_ws(chk *k, int s, const vl_conv *cv, vl_conv_dir dir, bool acc, vl_tensor *ws,
                     size_t *bytes) {
  vl_ctx *c = k->ctx[s];
  memset(ws, 0, sizeof *ws);
  *bytes = c->be->conv_ws_bytes(c, cv, dir, acc);
  if (!*bytes) return NULL;
  vl_status r = vl_tensor_alloc2(c, ws, VL_F32, VL_MEM_WORKSPACE, 1, (int64_t)((*bytes + 3) / 4));
  status(k, s, r, "workspace alloc");
  return r == VL_OK ? ws->data : NULL;
}

static void conv_ws_free(chk *k, int s, vl_tensor *ws) {
  vl_ctx *c = k->ctx[s];
  if (s == CU) status(k, s, c->be->sync(c), "sync"); /* the op may still use it */
  if (ws->owned) vl_tensor_free(c, ws);
}

static void ck_conv_fwd(chk *k, args a) {
  vl_conv cv;
  if (!conv_shape(k, a, &cv)) return;
  int64_t xs[4] = {cv.N, cv.C, cv.H, cv.W}, ws4[4] = {cv.K, cv.C, cv.R, cv.S};
  int64_t ys[4] = {cv.N, cv.K, cv.P, cv.Q};
  float *xv = randv(k, xs[0] * xs[1] * xs[2] * xs[3], 1);
  float *wv = randv(k, ws4[0] * ws4[1] * ws4[2] * ws4[3], 0.3f);
  tp x, w, y;
  tp_make(k, &x, a.a, 4, xs, xv);
  tp_make(k, &w, a.b, 4, ws4, wv);
  tp_make(k, &y, a.a, 4, ys, NULL);
  if (x.ok && w.ok && y.ok) EACH(s) {
    vl_tensor wst;
    size_t nb = 0;
    void *p = conv_ws(k, s, &cv, VL_CONV_FWD, false, &wst, &nb);
    if (nb && !p) continue;
    CALL(k, s, conv_fwd, &cv, &y.t[s], &x.t[s], &w.t[s], p, nb);
    conv_ws_free(k, s, &wst);
  }
  cmp(k, &y, "y");
  tp_free(k, &x); tp_free(k, &w); tp_free(k, &y);
  free(xv); free(wv);
}

static void ck_conv_bwd_data(chk *k, args a) {
  vl_conv cv;
  if (!conv_shape(k, a, &cv)) return;
  int64_t xs[4] = {cv.N, cv.C, cv.H, cv.W}, ws4[4] = {cv.K, cv.C, cv.R, cv.S};
  int64_t ys[4] = {cv.N, cv.K, cv.P, cv.Q};
  float *dyv = randv(k, ys[0] * ys[1] * ys[2] * ys[3], 1);
  float *wv = randv(k, ws4[0] * ws4[1] * ws4[2] * ws4[3], 0.3f);
  float *dxv = randv(k, xs[0] * xs[1] * xs[2] * xs[3], 1);
  tp dy, w, dx;
  tp_make(k, &dy, a.a, 4, ys, dyv);
  tp_make(k, &w, a.b, 4, ws4, wv);
  tp_make(k, &dx, a.a, 4, xs, dxv); /* overwritten */
  if (dy.ok && w.ok && dx.ok) EACH(s) {
    vl_tensor wst;
    size_t nb = 0;
    void *p = conv_ws(k, s, &cv, VL_CONV_BWD_DATA, false, &wst, &nb);
    if (nb && !p) continue;
    CALL(k, s, conv_bwd_data, &cv, &dx.t[s], &dy.t[s], &w.t[s], p, nb);
    conv_ws_free(k, s, &wst);
  }
  cmp(k, &dx, "dx");
  tp_free(k, &dy); tp_free(k, &w); tp_free(k, &dx);
  free(dyv); free(wv); free(dxv);
}

static void ck_conv_bwd_weight(chk *k, args a) {
  vl_conv cv;
  if (!conv_shape(k, a, &cv)) return;
  bool acc = (a.opt & 4) != 0;
  int64_t xs[4] = {cv.N, cv.C, cv.H, cv.W}, ws4[4] = {cv.K, cv.C, cv.R, cv.S};
  int64_t ys[4] = {cv.N, cv.K, cv.P, cv.Q};
  float *xv = randv(k, xs[0] * xs[1] * xs[2] * xs[3], 1);
  float *dyv = randv(k, ys[0] * ys[1] * ys[2] * ys[3], 1);
  float *dwv = randv(k, ws4[0] * ws4[1] * ws4[2] * ws4[3], 1); /* kept when accumulating */
  tp x, dy, dw;
  tp_make(k, &x, a.a, 4, xs, xv);
  tp_make(k, &dy, a.a, 4, ys, dyv);
  tp_make(k, &dw, a.c, 4, ws4, dwv);
  if (x.ok && dy.ok && dw.ok) EACH(s) {
    vl_tensor wst;
    size_t nb = 0;
    void *p = conv_ws(k, s, &cv, VL_CONV_BWD_WEIGHT, acc, &wst, &nb);
    if (nb && !p) continue;
    CALL(k, s, conv_bwd_weight, &cv, &dw.t[s], &x.t[s], &dy.t[s], acc, p, nb);
    conv_ws_free(k, s, &wst);
  }
  cmp(k, &dw, "dw");
  tp_free(k, &x); tp_free(k, &dy); tp_free(k, &dw);
  free(xv); free(dyv); free(dwv);
}

/* ---- the table ---------------------------------------------------------------------- */
typedef struct {
  const char *name;
  void (*fn)(chk *, args);
  args a;
  double limit;
} check;

#define F32 VL_F32
#define F16 VL_F16
#define BF16 VL_BF16
#define NF4 VL_NF4
#define A1(d) {d, d, d, 0}
#define A2(d, e) {d, e, d, 0}
#define AO(d, o) {d, d, d, o}

static const check CHECKS[] = {
    {"upload/download f32", ck_copy, A1(F32), EXACT},
    {"upload/download bf16", ck_copy, A1(BF16), EXACT},
    {"upload/download nf4", ck_copy, A1(NF4), EXACT},
    {"sync", ck_sync, A1(F32), EXACT},
    {"upload_async pageable", ck_upload_async, A1(F32), EXACT},
    {"upload_async pinned", ck_upload_async, {VL_F32, VL_F32, VL_F32, 1}, EXACT},
    {"zero f32", ck_zero, A1(F32), EXACT},
    {"zero f16", ck_zero, A1(F16), EXACT},
    {"zero bf16", ck_zero, A1(BF16), EXACT},
    {"convert f32->f16", ck_convert, A2(F32, F16), EXACT},
    {"convert f32->bf16", ck_convert, A2(F32, BF16), EXACT},
    {"convert f16->f32", ck_convert, A2(F16, F32), EXACT},
    {"convert bf16->f16", ck_convert, A2(BF16, F16), EXACT},
    {"convert f16->bf16", ck_convert, A2(F16, BF16), EXACT},
    {"axpby f32", ck_axpby, A1(F32), 1e-12},
    {"axpby f16 (x f32)", ck_axpby, A2(F16, F32), 1e-6},
    {"axpby bf16", ck_axpby, A1(BF16), 1e-4},
    {"embed_fwd f32", ck_embed_fwd, A1(F32), EXACT},
    {"embed_fwd bf16 (wte f32)", ck_embed_fwd, A2(BF16, F32), EXACT},
    {"embed_fwd f16", ck_embed_fwd, A1(F16), EXACT},
    {"embed_bwd f32", ck_embed_bwd, A1(F32), 1e-12},
    {"embed_bwd f32 (dout bf16)", ck_embed_bwd, A2(F32, BF16), 1e-12},
    {"embed_bwd f16", ck_embed_bwd, A1(F16), 1e-6},
    {"rmsnorm_fwd f32", ck_rmsnorm_fwd, A1(F32), 1e-9},
    {"rmsnorm_fwd f16", ck_rmsnorm_fwd, A1(F16), 1e-5},
    {"rmsnorm_fwd bf16 (w f32)", ck_rmsnorm_fwd, A2(BF16, F32), 5e-4},
    {"rmsnorm_bwd f32", ck_rmsnorm_bwd, A1(F32), 1e-9},
    {"rmsnorm_bwd f32 (no dw)", ck_rmsnorm_bwd, AO(F32, 1), 1e-9},
    {"rmsnorm_bwd f16", ck_rmsnorm_bwd, A1(F16), 1e-5},
    {"rmsnorm_bwd bf16", ck_rmsnorm_bwd, A1(BF16), 5e-4},
    {"rope f32", ck_rope, A1(F32), 1e-9},
    {"rope f32 inverse", ck_rope, AO(F32, 1), 1e-9},
    {"rope f16", ck_rope, A1(F16), 1e-5},
    {"rope bf16 inverse", ck_rope, AO(BF16, 1), 5e-4},
    {"permute f32", ck_permute, A1(F32), EXACT},
    {"permute f32 back", ck_permute, AO(F32, 1), EXACT},
    {"permute bf16", ck_permute, A1(BF16), EXACT},
    {"permute f16 back", ck_permute, AO(F16, 1), EXACT},
    {"softmax_causal_fwd f32", ck_softmax_fwd, A1(F32), 1e-9},
    {"softmax_causal_fwd f32 in place", ck_softmax_fwd, AO(F32, 1), 1e-9},
    {"softmax_causal_fwd f16", ck_softmax_fwd, A1(F16), 1e-5},
    {"softmax_causal_fwd bf16 (P f32)", ck_softmax_fwd, A2(BF16, F32), 1e-9},
    {"softmax_causal_bwd f32", ck_softmax_bwd, A1(F32), 1e-9},
    {"softmax_causal_bwd f32 in place", ck_softmax_bwd, AO(F32, 1), 1e-9},
    {"softmax_causal_bwd f16", ck_softmax_bwd, A1(F16), 1e-5},
    {"softmax_causal_bwd bf16", ck_softmax_bwd, A1(BF16), 5e-4},
    {"swiglu_fwd f32", ck_swiglu_fwd, A1(F32), 1e-9},
    {"swiglu_fwd f16", ck_swiglu_fwd, A1(F16), 1e-5},
    {"swiglu_fwd bf16 (out f32)", ck_swiglu_fwd, A2(BF16, F32), 1e-9},
    {"swiglu_bwd f32", ck_swiglu_bwd, A1(F32), 1e-9},
    {"swiglu_bwd f16", ck_swiglu_bwd, A1(F16), 1e-5},
    {"swiglu_bwd bf16 (grads f32)", ck_swiglu_bwd, A2(BF16, F32), 1e-9},
    {"xent_fused f32", ck_xent, A1(F32), 1e-9},
    {"xent_fused f16", ck_xent, A1(F16), 1e-5},
    {"xent_fused bf16", ck_xent, A1(BF16), 5e-4},
    {"sumsq f32", ck_sumsq, A1(F32), 1e-20},
    {"sumsq f16", ck_sumsq, A1(F16), 1e-20},
    {"sumsq bf16 non-finite", ck_sumsq, AO(BF16, 1), 1e-20},
    {"adamw f32", ck_adamw, A1(F32), 1e-9},
    {"sgd f32", ck_sgd, A1(F32), 1e-9},
    {"adafactor f32 matrix", ck_adafactor, AO(F32, 0), 1e-9},
    {"adafactor f32 vector", ck_adafactor, AO(F32, 1), 1e-9},
    {"adafactor f32 matrix beta1=0", ck_adafactor, AO(F32, 2), 1e-9},
    {"gemm f32 NN", ck_gemm, {F32, F32, F32, 0}, 1e-9},
    {"gemm f32 TN", ck_gemm, {F32, F32, F32, 1}, 1e-9},
    {"gemm f32 NT", ck_gemm, {F32, F32, F32, 2}, 1e-9},
    {"gemm f32 TT", ck_gemm, {F32, F32, F32, 3}, 1e-9},
    {"gemm f32 NN batched padded", ck_gemm, {F32, F32, F32, 4}, 1e-9},
    {"gemm f32 TT batched padded", ck_gemm, {F32, F32, F32, 7}, 1e-9},
    {"gemm f16 NT", ck_gemm, {F16, F16, F16, 2}, 1e-5},
    {"gemm f16->f32 TN batched", ck_gemm, {F16, F16, F32, 5}, 1e-9},
    {"gemm bf16 NN", ck_gemm, {BF16, BF16, BF16, 0}, 5e-4},
    {"gemm bf16->f32 NT batched", ck_gemm, {BF16, BF16, F32, 6}, 1e-9},
    {"gemm bf16 x f32 -> f32 batched", ck_gemm, {BF16, F32, F32, 4}, 1e-9},
    {"gemm f32 x f16 -> f32 TT", ck_gemm, {F32, F16, F32, 3}, 1e-9},
    {"gemm bf16 x f32 -> bf16 (kernel)", ck_gemm, {BF16, F32, BF16, 1}, 5e-4},
    {"gemm f32 -> f16 (kernel) batched", ck_gemm, {F32, F32, F16, 6}, 1e-5},
    {"gemm f16 x nf4 -> f16", ck_gemm, {F16, NF4, F16, 0}, 1e-5},
    {"gemm bf16 x nf4 -> bf16 NT", ck_gemm, {BF16, NF4, BF16, 2}, 5e-4},
    {"gemm f32 x nf4 -> f32 batched", ck_gemm, {F32, NF4, F32, 4}, 1e-9},
    {"gemm bf16 x nf4 -> f32 TN", ck_gemm, {BF16, NF4, F32, 1}, 5e-4},
    /* CNN ops. Batch norm: per-channel sums in double in another order (a block tree on
     * CUDA), then fp32 math with the compilers' own FMA contraction: rounding level. */
    {"bn_fwd_train f32", ck_bn_train, AO(F32, 0), 1e-9},
    {"bn_fwd_train f32 big HW, no running", ck_bn_train, AO(F32, 3), 1e-9},
    {"bn_fwd_train f16 (gamma f32)", ck_bn_train, A2(F16, F32), 1e-5},
    {"bn_fwd_train bf16", ck_bn_train, AO(BF16, 1), 5e-4},
    {"bn_fwd_eval f32", ck_bn_eval, AO(F32, 0), 1e-9},
    {"bn_fwd_eval f32 in place", ck_bn_eval, AO(F32, 3), 1e-9},
    {"bn_fwd_eval bf16 in place, gamma f32", ck_bn_eval, {BF16, F32, BF16, 2}, 5e-4},
    {"bn_bwd f32", ck_bn_bwd, AO(F32, 0), 1e-9},
    {"bn_bwd f32 big HW, dx over dy", ck_bn_bwd, AO(F32, 5), 1e-9},
    {"bn_bwd f32 no dgamma/dbeta", ck_bn_bwd, AO(F32, 2), 1e-9},
    {"bn_bwd f16 (gamma, grads f32)", ck_bn_bwd, {F16, F32, F32, 0}, 1e-5},
    {"bn_bwd bf16 dx over dy", ck_bn_bwd, {BF16, BF16, F32, 4}, 5e-4},
    /* ReLU, pooling, channel copy: data movement and comparisons, bit-exact */
    {"relu_fwd f32", ck_relu_fwd, A1(F32), EXACT},
    {"relu_fwd f32 in place", ck_relu_fwd, AO(F32, 1), EXACT},
    {"relu_fwd bf16 (x f32)", ck_relu_fwd, A2(BF16, F32), EXACT},
    {"relu_fwd f16 in place", ck_relu_fwd, AO(F16, 1), EXACT},
    {"relu_bwd f32", ck_relu_bwd, A1(F32), EXACT},
    {"relu_bwd f32 in place", ck_relu_bwd, AO(F32, 1), EXACT},
    {"relu_bwd bf16 in place", ck_relu_bwd, AO(BF16, 1), EXACT},
    {"maxpool_fwd f32 3x3/2 pad 1", ck_maxpool_fwd, AO(F32, 0), EXACT},
    {"maxpool_fwd f32 2x2/2", ck_maxpool_fwd, AO(F32, 1), EXACT},
    {"maxpool_fwd bf16 ceil sizes", ck_maxpool_fwd, AO(BF16, 2), EXACT},
    {"maxpool_fwd f16 (x f32)", ck_maxpool_fwd, {F16, F32, F16, 0}, EXACT},
    {"maxpool_bwd f32 3x3/2 pad 1", ck_maxpool_bwd, AO(F32, 0), EXACT},
    {"maxpool_bwd f32 2x2/2", ck_maxpool_bwd, AO(F32, 1), EXACT},
    {"maxpool_bwd f32 ceil sizes", ck_maxpool_bwd, AO(F32, 2), EXACT},
    {"maxpool_bwd f16 3x3/2 pad 1", ck_maxpool_bwd, AO(F16, 0), EXACT},
    {"maxpool_bwd bf16 (x f32) ceil sizes", ck_maxpool_bwd, {BF16, F32, BF16, 2}, EXACT},
    {"chan_copy f32", ck_chan_copy, A1(F32), EXACT},
    {"chan_copy f32 accumulate", ck_chan_copy, AO(F32, 1), EXACT},
    {"chan_copy bf16 <- f32", ck_chan_copy, A2(BF16, F32), EXACT},
    {"chan_copy f16 accumulate", ck_chan_copy, AO(F16, 1), EXACT},
    /* upsampling: 4 weighted terms (16 in backward), FMA contraction may differ */
    {"upsample2x_fwd f32", ck_upsample_fwd, A1(F32), 1e-12},
    {"upsample2x_fwd f32 width 1", ck_upsample_fwd, AO(F32, 1), 1e-12},
    {"upsample2x_fwd f16", ck_upsample_fwd, A1(F16), 1e-5},
    {"upsample2x_fwd bf16 (x f32)", ck_upsample_fwd, A2(BF16, F32), 5e-4},
    {"upsample2x_bwd f32", ck_upsample_bwd, A1(F32), 1e-12},
    {"upsample2x_bwd f32 width 1", ck_upsample_bwd, AO(F32, 1), 1e-12},
    {"upsample2x_bwd bf16", ck_upsample_bwd, A1(BF16), 5e-4},
    {"upsample2x_bwd f16 (dx f32)", ck_upsample_bwd, A2(F16, F32), 1e-9},
    {"xent_pix f32", ck_xent_pix, A1(F32), 1e-9},
    {"xent_pix f16", ck_xent_pix, A1(F16), 1e-5},
    {"xent_pix bf16", ck_xent_pix, A1(BF16), 5e-4},
    /* convolutions (oneDNN against cuDNN): sums of C*R*S = 72 products in another order;
     * cuDNN may run fp32 through TF32 tensor cores (~1e-7), a wrong index is ~1 */
    {"conv_fwd f32 3x3/1", ck_conv_fwd, {F32, F32, F32, 0}, 1e-6},
    {"conv_fwd f32 3x3/2", ck_conv_fwd, {F32, F32, F32, 1}, 1e-6},
    {"conv_fwd f32 3x3 dil 2", ck_conv_fwd, {F32, F32, F32, 2}, 1e-6},
    {"conv_fwd f32 1x1/2", ck_conv_fwd, {F32, F32, F32, 3}, 1e-6},
    {"conv_fwd f16 3x3/1", ck_conv_fwd, {F16, F16, F32, 0}, 1e-5},
    {"conv_fwd bf16 3x3/2", ck_conv_fwd, {BF16, BF16, F32, 1}, 5e-4},
    {"conv_bwd_data f32 3x3/1", ck_conv_bwd_data, {F32, F32, F32, 0}, 1e-6},
    {"conv_bwd_data f32 3x3/2", ck_conv_bwd_data, {F32, F32, F32, 1}, 1e-6},
    {"conv_bwd_data f32 3x3 dil 2", ck_conv_bwd_data, {F32, F32, F32, 2}, 1e-6},
    {"conv_bwd_data f32 1x1/2", ck_conv_bwd_data, {F32, F32, F32, 3}, 1e-6},
    {"conv_bwd_data f16 3x3/2", ck_conv_bwd_data, {F16, F16, F32, 1}, 1e-5},
    {"conv_bwd_data bf16 1x1/2", ck_conv_bwd_data, {BF16, BF16, F32, 3}, 5e-4},
    {"conv_bwd_weight f32 3x3/1", ck_conv_bwd_weight, {F32, F32, F32, 0}, 1e-6},
    {"conv_bwd_weight f32 3x3/1 accumulate", ck_conv_bwd_weight, {F32, F32, F32, 4}, 1e-6},
    {"conv_bwd_weight f32 3x3/2", ck_conv_bwd_weight, {F32, F32, F32, 1}, 1e-6},
    {"conv_bwd_weight f32 3x3/2 accumulate", ck_conv_bwd_weight, {F32, F32, F32, 5}, 1e-6},
    {"conv_bwd_weight f32 3x3 dil 2", ck_conv_bwd_weight, {F32, F32, F32, 2}, 1e-6},
    {"conv_bwd_weight f32 dil 2 accumulate", ck_conv_bwd_weight, {F32, F32, F32, 6}, 1e-6},
    {"conv_bwd_weight f32 1x1/2", ck_conv_bwd_weight, {F32, F32, F32, 3}, 1e-6},
    {"conv_bwd_weight f32 1x1/2 accumulate", ck_conv_bwd_weight, {F32, F32, F32, 7}, 1e-6},
    {"conv_bwd_weight f16 accumulate", ck_conv_bwd_weight, {F16, F16, F32, 4}, 1e-5},
    {"conv_bwd_weight bf16 (dw bf16)", ck_conv_bwd_weight, {BF16, BF16, BF16, 1}, 5e-4},
};
#define NCHECKS (sizeof CHECKS / sizeof CHECKS[0])

int main(int argc, char **argv) {
  /* --self-test: the CPU backend on both sides. Checks this tool (inputs, guards, NMSE)
   * on a machine without a GPU; every check must come out at nmse 0. Not a GPU result. */
  bool self = argc > 1 && strcmp(argv[1], "--self-test") == 0;
  const char *only = argc > 1 + self ? argv[1 + self] : NULL;
  if (!self && !vl_cuda_available()) {
    int n = 0;
    for (size_t i = 0; i < NCHECKS; i++) {
      if (only && !strstr(CHECKS[i].name, only)) continue;
      printf("%-36s SKIP (no GPU)\n", CHECKS[i].name);
      n++;
    }
    printf("gpu-check: %d checks skipped, none run: %s\n", n,
           vl_backend_cuda() ? "no CUDA device visible" : "built without CUDA");
    return 0;
  }
  chk k;
  memset(&k, 0, sizeof k);
  vl_status s = self ? vl_ctx_create(&k.ctx[CU], VL_DEV_CPU, VL_NO_CAP)
                     : vl_ctx_create(&k.ctx[CU], VL_DEV_CUDA, CUDA_CAP);
  if (s != VL_OK) {
    printf("gpu-check: FAIL: cannot create a CUDA context: %s\n", vl_status_name(s));
    return 1;
  }
  s = vl_ctx_create(&k.ctx[CPU], VL_DEV_CPU, VL_NO_CAP);
  if (s != VL_OK) {
    printf("gpu-check: FAIL: cannot create a CPU context: %s\n", vl_status_name(s));
    vl_ctx_destroy(k.ctx[CU]);
    return 1;
  }
  if (self) SIDE[CU] = "cpu (as device)";
  int run = 0, failed = 0;
  for (size_t i = 0; i < NCHECKS; i++) {
    const check *c = &CHECKS[i];
    if (only && !strstr(c->name, only)) continue;
    k.nmse = 0;
    k.bad = false;
    k.why[0] = 0;
    vl_rng_seed(&k.rng, 1000 + i); /* fixed per check: reruns see the same inputs */
    c->fn(&k, c->a);
    double limit = self ? 0.0 : c->limit;
    bool ok = !k.bad && k.nmse <= limit;
    if (!k.bad && !ok) snprintf(k.why, sizeof k.why, "nmse above the limit %.1e", limit);
    printf("%-36s %s  nmse=%.3e  (limit %.1e)%s%s\n", c->name,
           ok ? (self ? "ok (self-test)" : "PASS") : "FAIL", k.nmse, limit, ok ? "" : "  ",
           ok ? "" : k.why);
    run++;
    failed += !ok;
  }
  printf("gpu-check: %d checks, %d %s, %d failed (%s)\n", run, run - failed,
         self ? "agree" : "passed", failed,
         self ? "self-test: cpu against cpu, NOT a GPU result" : "device: cuda, reference: cpu");
  vl_ctx_destroy(k.ctx[CU]);
  vl_ctx_destroy(k.ctx[CPU]);
  return failed ? 1 : 0;
}
