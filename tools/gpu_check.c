/* vramlab-gpu-check: every case of tools/gpu_check_cases.c run on CUDA and on the CPU backend
 * with the same seeded inputs, through the one dispatch point vl_op_run (docs/architecture.md "The CUDA
 * backend must be verifiable without a GPU", point 3; the idea of ggml's test-backend-ops).
 * Per case: the op's status on both sides, NaN/Inf in the CUDA output where the CPU output is
 * finite, the normalised MSE
 *   nmse = sum (cuda - cpu)^2 / sum cpu^2
 * of every output against the case's limit, and guard bytes: each tensor lives inside a
 * larger allocation whose GUARD bytes on either side must come back untouched.
 *
 *   vramlab-gpu-check [WORD]            cases whose name contains WORD (all without)
 *   vramlab-gpu-check --op NAME         the cases of one operation (or copy, upload_async, sync)
 *   vramlab-gpu-check --list            print the cases, run nothing
 *   vramlab-gpu-check --self-test ...   the CPU backend on both sides: checks this tool where
 *                                       there is no GPU (every case must agree exactly)
 *   vramlab-gpu-check --require-gpu ... as without it, but exit status 1 when no case ran on
 *                                       a GPU (GPU runners: a skip must not read as a pass)
 * Without a GPU every case prints "SKIP (no GPU)" and the exit status is 0: skipped, never
 * passed (1 with --require-gpu). With one, one line per case with PASS/FAIL and the NMSE;
 * exit status 1 when any case fails.
 *
 * One builder per operation (below) makes the case's tensors from its shape, dtypes and
 * flags, marks its outputs, and fills the operation's argument struct for each side. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gpu_check_cases.h"
#include "vramlab/fileio.h"
#include "vramlab/backend.h"
#include "vramlab/elem.h"
#include "vramlab/quant.h"

enum { CU = 0, CPU = 1 }; /* side index: the device under test, the reference */
static const char *SIDE[2] = {"cuda", "cpu"};

#define GUARD 256        /* bytes before and after each tensor (keeps 256-byte alignment) */
#define GUARD_BYTE 0xA5
#define CUDA_CAP ((size_t)2 << 30)
#define MAX_T 12         /* tensors of one case */
#define MAX_OUT 6        /* compared outputs of one case */
#define ARGS_BYTES 256   /* room for any argument struct */

/* A tensor on both sides with the same contents, each inside a guarded allocation. */
typedef struct {
  vl_tensor buf[2]; /* the allocation: GUARD | tensor | GUARD */
  vl_tensor t[2];   /* the op's view of the middle */
  size_t total;     /* bytes uploaded / downloaded, guards included */
  uint8_t *host;    /* the initial contents, guards included */
  bool ok;
} tp;

/* One case in flight. */
typedef struct {
  vl_ctx *ctx[2];
  vl_rng rng;
  const vl_gc_case *cs;
  double nmse;     /* worst NMSE over the outputs */
  bool bad;
  char why[320];   /* the first failure */
  tp t[MAX_T];
  int nt;
  tp *out[MAX_OUT];
  const char *out_name[MAX_OUT];
  int nout;
  _Alignas(16) unsigned char args[2][ARGS_BYTES];
  bool scalar;     /* a host-side result too (sumsq): */
  double sum[2];
  bool nonfinite[2];
  vl_optim_hp hp;
} run;

static void fail(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(run *r, const char *fmt, ...) {
  if (!r->bad) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
  }
  r->bad = true;
}

static void status(run *r, int side, vl_status s, const char *what) {
  if (s != VL_OK) fail(r, "%s %s: %s: %s", SIDE[side], what, vl_status_name(s), r->ctx[side]->err);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) { perror("malloc"); exit(2); }
  return p;
}

/* n normal values times scale (the caller frees). */
static float *rnd(run *r, int64_t n, float scale) {
  float *v = xmalloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = scale * vl_rng_normal(&r->rng);
  return v;
}

/* ---- guarded tensors ----------------------------------------------------------------- */

/* A new tensor of shape (n) on both sides, filled from vals (fp32 values; NF4 quantised from
 * them; VL_I32 takes them as integers) or zeros when vals is NULL. Takes vals (frees it). */
static tp *ten(run *r, vl_dtype dt, int64_t n, float *vals) {
  if (r->nt == MAX_T) { fprintf(stderr, "gpu-check: too many tensors\n"); exit(2); }
  tp *p = &r->t[r->nt++];
  memset(p, 0, sizeof *p);
  vl_tensor shp;
  memset(&shp, 0, sizeof shp);
  vl_tensor_set_shape(&shp, dt, 1, &n);
  p->total = shp.bytes + 2 * GUARD;
  p->host = xmalloc(p->total);
  memset(p->host, GUARD_BYTE, p->total);
  uint8_t *mid = p->host + GUARD;
  if (!vals) memset(mid, 0, shp.bytes);
  else if (dt == VL_NF4) {
    if (vl_nf4_quantize_host(mid, vals, shp.n) != 0) fail(r, "nf4 quantisation failed");
  } else if (dt == VL_I32) {
    for (int64_t i = 0; i < n; i++) ((int32_t *)mid)[i] = (int32_t)vals[i];
  } else {
    for (int64_t i = 0; i < n; i++) vl_elem_set(mid, dt, i, vals[i]);
  }
  free(vals);
  for (int s = 0; s < 2; s++) {
    vl_ctx *c = r->ctx[s];
    vl_status st = vl_tensor_alloc2(c, &p->buf[s], VL_F32, VL_MEM_TEMP, 1,
                                    (int64_t)((p->total + 3) / 4));
    status(r, s, st, "alloc");
    if (st != VL_OK) return p;
    status(r, s, c->be->upload(c, &p->buf[s], 0, p->host, p->total), "upload");
    vl_tensor v = p->buf[s];
    vl_tensor_set_shape(&v, dt, 1, &n);
    v.data = (char *)p->buf[s].data + GUARD;
    v.off = p->buf[s].off + GUARD;
    v.owned = false;
    p->t[s] = v;
  }
  p->ok = !r->bad;
  return p;
}

static tp *out(run *r, tp *p, const char *name) {
  if (r->nout < MAX_OUT) {
    r->out[r->nout] = p;
    r->out_name[r->nout++] = name;
  }
  return p;
}

static void tp_free(run *r, tp *p) {
  for (int s = 0; s < 2; s++)
    if (p->buf[s].owned) vl_tensor_free(r->ctx[s], &p->buf[s]);
  free(p->host);
  memset(p, 0, sizeof *p);
}

/* Download both sides, check the guards, decode to fp32 (n elements of the view each). */
static bool tp_read(run *r, tp *p, const char *what, float *v[2]) {
  v[0] = v[1] = NULL;
  if (!p->ok) return false;
  bool ok = true;
  for (int s = 0; s < 2; s++) {
    vl_ctx *c = r->ctx[s];
    uint8_t *raw = xmalloc(p->total);
    const vl_tensor *t = &p->t[s];
    v[s] = xmalloc(sizeof(float) * (size_t)t->n);
    vl_status st = c->be->download(c, raw, &p->buf[s], 0, p->total);
    status(r, s, st, "download");
    if (st != VL_OK) { free(raw); ok = false; continue; }
    for (size_t i = 0; i < GUARD; i++)
      if (raw[i] != GUARD_BYTE || raw[p->total - 1 - i] != GUARD_BYTE) {
        fail(r, "%s: guard bytes around %s overwritten", SIDE[s], what);
        ok = false;
        break;
      }
    for (int64_t i = 0; i < t->n; i++)
      v[s][i] = t->dtype == VL_NF4 ? vl_nf4_get_host(raw + GUARD, t->n, i)
                : t->dtype == VL_I32 ? (float)((const int32_t *)(raw + GUARD))[i]
                                     : vl_elem_get(raw + GUARD, t->dtype, i);
    free(raw);
  }
  return ok;
}

/* Compare one output of the op on both sides. */
static void cmp(run *r, tp *p, const char *what) {
  float *v[2];
  if (tp_read(r, p, what, v)) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < p->t[CU].n; i++) {
      double a = v[CU][i], b = v[CPU][i];
      if (isfinite(b) && !isfinite(a)) {
        fail(r, "%s[%lld]: cuda %g where cpu is %g", what, (long long)i, a, b);
        break;
      }
      if (!isfinite(b)) continue; /* both sides saw the same non-finite input */
      num += (a - b) * (a - b);
      den += b * b;
    }
    double e = den > 0 ? num / den : num;
    if (e > r->nmse || isnan(e)) r->nmse = e;
  }
  free(v[0]);
  free(v[1]);
}

/* ---- builders: the case's tensors and each side's arguments ----------------------------- */

#define EACH(s) for (int s = 0; s < 2; s++)
#define ARGS(type, s) ((type *)r->args[s])
#define T(p, s) (&(p)->t[s])
#define DT(i) (c->dt[i])
#define HAS(f) ((c->flags & (f)) != 0)

/* n ids uniform in [0, V); every fifth -1 (ignored) when some_ignored */
static float *ids(run *r, int64_t n, int64_t V, bool some_ignored) {
  float *t = xmalloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) t[i] = (float)vl_rng_below(&r->rng, (uint64_t)V);
  if (some_ignored)
    for (int64_t i = 0; i < n; i += 5) t[i] = -1;
  return t;
}
static float *around_one(run *r, int64_t n) {
  float *w = rnd(r, n, 0.2f);
  for (int64_t i = 0; i < n; i++) w[i] += 1.0f;
  return w;
}
static float *nans(int64_t n) {
  float *v = xmalloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = NAN;
  return v;
}

static void b_zero(run *r, const vl_gc_case *c) {
  tp *y = out(r, ten(r, DT(0), c->d[0], rnd(r, c->d[0], 1)), "y");
  EACH(s) *ARGS(vl_zero_args, s) = (vl_zero_args){.y = T(y, s)};
}

static void b_convert(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  float *xv = rnd(r, n, 3);
  xv[0] = 70000.0f; /* overflows fp16 */
  xv[1] = 1e-6f;    /* fp16 subnormal */
  tp *x = ten(r, DT(1), n, xv), *y = out(r, ten(r, DT(0), n, rnd(r, n, 1)), "y");
  EACH(s) *ARGS(vl_convert_args, s) = (vl_convert_args){.y = T(y, s), .x = T(x, s),
                                                        .n = n - 3}; /* tail kept */
}

static void b_axpby(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  bool b0 = HAS(GC_B0); /* b = 0 must ignore y's NaN garbage */
  tp *x = ten(r, DT(1), n, rnd(r, n, 1));
  tp *y = out(r, ten(r, DT(0), n, b0 ? nans(n) : rnd(r, n, 1)), "y");
  EACH(s) *ARGS(vl_axpby_args, s) =
      (vl_axpby_args){.y = T(y, s), .a = b0 ? 2.0f : 0.75f, .x = T(x, s), .b = b0 ? 0.0f : -1.25f,
                      .n = n};
}

static void b_embed_fwd(run *r, const vl_gc_case *c) {
  int64_t V = c->d[0], C = c->d[1], R = c->d[2];
  tp *wte = ten(r, DT(1), V * C, rnd(r, V * C, 1)), *tok = ten(r, VL_I32, R, ids(r, R, V, false));
  tp *o = out(r, ten(r, DT(0), R * C, NULL), "out");
  EACH(s) *ARGS(vl_embed_fwd_args, s) = (vl_embed_fwd_args){.out = T(o, s), .wte = T(wte, s),
                                                            .tok = T(tok, s), .R = R, .C = C};
}

static void b_embed_bwd(run *r, const vl_gc_case *c) {
  int64_t V = c->d[0], C = c->d[1], R = c->d[2];
  tp *dw = out(r, ten(r, DT(0), V * C, rnd(r, V * C, 1)), "dwte");
  tp *dout = ten(r, DT(1), R * C, rnd(r, R * C, 1)), *tok = ten(r, VL_I32, R, ids(r, R, V, false));
  EACH(s) *ARGS(vl_embed_bwd_args, s) = (vl_embed_bwd_args){.dwte = T(dw, s), .dout = T(dout, s),
                                                            .tok = T(tok, s), .R = R, .C = C};
}

static void b_rmsnorm_fwd(run *r, const vl_gc_case *c) {
  int64_t R = c->d[0], C = c->d[1];
  tp *x = ten(r, DT(0), R * C, rnd(r, R * C, 2)), *w = ten(r, DT(1), C, around_one(r, C));
  tp *o = out(r, ten(r, DT(0), R * C, NULL), "out"), *rs = out(r, ten(r, VL_F32, R, NULL), "rstd");
  EACH(s) *ARGS(vl_rmsnorm_fwd_args, s) =
      (vl_rmsnorm_fwd_args){.out = T(o, s), .rstd = T(rs, s), .x = T(x, s), .w = T(w, s), .R = R,
                            .C = C, .eps = 1e-5f};
}

static void b_rmsnorm_bwd(run *r, const vl_gc_case *c) {
  int64_t R = c->d[0], C = c->d[1];
  float *rv = rnd(r, R, 0.1f);
  for (int64_t i = 0; i < R; i++) rv[i] = 1.0f + fabsf(rv[i]);
  tp *x = ten(r, DT(0), R * C, rnd(r, R * C, 1)), *w = ten(r, DT(1), C, around_one(r, C));
  tp *dy = ten(r, DT(0), R * C, rnd(r, R * C, 1));
  tp *dx = out(r, ten(r, DT(0), R * C, rnd(r, R * C, 1)), "dx"); /* accumulated into */
  tp *dw = out(r, ten(r, VL_F32, C, rnd(r, C, 1)), "dw");         /* unchanged without dw */
  tp *rs = ten(r, VL_F32, R, rv);
  bool no_dw = HAS(GC_NO_DW);
  EACH(s) *ARGS(vl_rmsnorm_bwd_args, s) = (vl_rmsnorm_bwd_args){.dx = T(dx, s),
      .dw = no_dw ? NULL : T(dw, s), .dout = T(dy, s), .x = T(x, s), .w = T(w, s), .rstd = T(rs, s),
      .R = R, .C = C};
}

static void b_rope(run *r, const vl_gc_case *c) {
  int64_t B = c->d[0], Tn = c->d[1], H = c->d[2], D = c->d[3], n = B * Tn * H * D;
  tp *x = out(r, ten(r, DT(0), n, rnd(r, n, 1)), "x");
  EACH(s) *ARGS(vl_rope_args, s) = (vl_rope_args){.x = T(x, s), .B = B, .T = Tn, .H = H, .D = D,
                                                  .theta = 10000.0f, .inverse = HAS(GC_INVERSE)};
}

static void b_permute(run *r, const vl_gc_case *c) {
  int64_t B = c->d[0], Tn = c->d[1], H = c->d[2], D = c->d[3], n = B * Tn * H * D;
  tp *x = ten(r, DT(0), n, rnd(r, n, 1)), *y = out(r, ten(r, DT(0), n, NULL), "y");
  EACH(s) *ARGS(vl_permute_args, s) = (vl_permute_args){.y = T(y, s), .x = T(x, s), .B = B, .T = Tn,
                                                        .H = H, .D = D, .back = HAS(GC_BACK)};
}

static void b_softmax_fwd(run *r, const vl_gc_case *c) {
  int64_t rows = c->d[0], Tn = c->d[1], n = rows * Tn;
  bool inpl = HAS(GC_INPLACE);
  tp *S = ten(r, DT(0), n, rnd(r, n, 3)), *P = inpl ? S : ten(r, DT(1), n, NULL);
  out(r, P, "P");
  EACH(s) *ARGS(vl_softmax_fwd_args, s) =
      (vl_softmax_fwd_args){.P = T(P, s), .S = T(S, s), .rows = rows, .T = Tn, .scale = 0.35f,
                            .causal = !HAS(GC_FULL)};
}

static void b_softmax_bwd(run *r, const vl_gc_case *c) {
  int64_t rows = c->d[0], Tn = c->d[1], n = rows * Tn;
  float *pv = rnd(r, n, 1);
  for (int64_t i = 0; i < rows; i++) { /* a causal probability row */
    int64_t q = i % Tn;
    float sum = 0;
    for (int64_t k = 0; k < Tn; k++) {
      pv[i * Tn + k] = k <= q ? expf(pv[i * Tn + k]) : 0;
      sum += pv[i * Tn + k];
    }
    for (int64_t k = 0; k <= q; k++) pv[i * Tn + k] /= sum;
  }
  bool inpl = HAS(GC_INPLACE);
  tp *P = ten(r, DT(0), n, pv), *dP = ten(r, DT(0), n, rnd(r, n, 1));
  tp *dS = inpl ? dP : ten(r, DT(0), n, NULL);
  out(r, dS, "dS");
  EACH(s) *ARGS(vl_softmax_bwd_args, s) =
      (vl_softmax_bwd_args){.dS = T(dS, s), .dP = T(dP, s), .P = T(P, s), .rows = rows, .T = Tn,
                            .scale = 0.35f, .causal = !HAS(GC_FULL)};
}

static void b_swiglu_fwd(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  tp *g = ten(r, DT(0), n, rnd(r, n, 2)), *u = ten(r, DT(0), n, rnd(r, n, 1));
  tp *o = out(r, ten(r, DT(1), n, NULL), "out");
  EACH(s) *ARGS(vl_swiglu_fwd_args, s) = (vl_swiglu_fwd_args){.out = T(o, s), .g = T(g, s),
                                                              .u = T(u, s), .n = n};
}

static void b_swiglu_bwd(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  tp *g = ten(r, DT(0), n, rnd(r, n, 2)), *u = ten(r, DT(0), n, rnd(r, n, 1));
  tp *d = ten(r, DT(0), n, rnd(r, n, 1));
  tp *dg = out(r, ten(r, DT(1), n, NULL), "dg"), *du = out(r, ten(r, DT(1), n, NULL), "du");
  EACH(s) *ARGS(vl_swiglu_bwd_args, s) =
      (vl_swiglu_bwd_args){.dg = T(dg, s), .du = T(du, s), .dout = T(d, s), .g = T(g, s),
                           .u = T(u, s), .n = n};
}

static void b_xent_fused(run *r, const vl_gc_case *c) {
  int64_t R = c->d[0], V = c->d[1];
  tp *l = out(r, ten(r, DT(0), R * V, rnd(r, R * V, 2)), "dlogits");
  tp *loss = out(r, ten(r, VL_F32, R, NULL), "loss"), *tgt = ten(r, VL_I32, R, ids(r, R, V, true));
  EACH(s) *ARGS(vl_xent_fused_args, s) =
      (vl_xent_fused_args){.logits = T(l, s), .loss = T(loss, s), .tgt = T(tgt, s), .R = R, .V = V,
                           .dloss_scale = 1.0f / (float)R};
}

static void b_sumsq(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  float *xv = rnd(r, n, 1);
  if (HAS(GC_NONFINITE)) { xv[n / 3] = NAN; xv[n - 1] = INFINITY; }
  tp *x = out(r, ten(r, DT(0), n, xv), "x (unchanged)");
  r->scalar = true;
  EACH(s) *ARGS(vl_sumsq_args, s) = (vl_sumsq_args){.x = T(x, s), .n = n, .out = &r->sum[s],
                                                    .nonfinite = &r->nonfinite[s]};
}

static void hparams(run *r) {
  memset(&r->hp, 0, sizeof r->hp);
  r->hp.lr = 1e-2f; r->hp.beta1 = 0.9f; r->hp.beta2 = 0.999f; r->hp.eps = 1e-8f;
  r->hp.weight_decay = 0.01f; r->hp.t = 3; r->hp.eps2 = 1e-3f; r->hp.clip_thr = 1.0f;
  r->hp.decay_pow = 0.8f; r->hp.momentum = 0.9f; r->hp.grad_scale = 0.5f;
}

static void b_adamw(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  float *vv = rnd(r, n, 0.1f);
  for (int64_t i = 0; i < n; i++) vv[i] *= vv[i];
  tp *p = out(r, ten(r, VL_F32, n, rnd(r, n, 1)), "p"), *g = ten(r, VL_F32, n, rnd(r, n, 1));
  tp *m = out(r, ten(r, VL_F32, n, rnd(r, n, 0.1f)), "m"), *v = out(r, ten(r, VL_F32, n, vv), "v");
  hparams(r);
  EACH(s) *ARGS(vl_adamw_args, s) = (vl_adamw_args){.p = T(p, s), .g = T(g, s), .m = T(m, s),
                                                    .v = T(v, s), .n = n, .hp = &r->hp};
}

static void b_sgd(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  tp *p = out(r, ten(r, VL_F32, n, rnd(r, n, 1)), "p"), *g = ten(r, VL_F32, n, rnd(r, n, 1));
  tp *m = out(r, ten(r, VL_F32, n, rnd(r, n, 0.1f)), "momentum");
  hparams(r);
  EACH(s) *ARGS(vl_sgd_args, s) = (vl_sgd_args){.p = T(p, s), .g = T(g, s), .mom = T(m, s), .n = n,
                                                .hp = &r->hp};
}

static void b_adafactor(run *r, const vl_gc_case *c) {
  int64_t R = c->d[0], C = c->d[1], n = R * C;
  float *vrv = rnd(r, R, 0.1f), *vcv = rnd(r, C, 0.1f);
  for (int64_t i = 0; i < R; i++) vrv[i] = vrv[i] * vrv[i] + 1e-3f;
  for (int64_t i = 0; i < C; i++) vcv[i] = vcv[i] * vcv[i] + 1e-3f;
  bool with_m = !HAS(GC_NO_M);
  tp *p = out(r, ten(r, VL_F32, n, rnd(r, n, 1)), "p"), *g = ten(r, VL_F32, n, rnd(r, n, 1));
  tp *m = ten(r, VL_F32, n, rnd(r, n, 0.1f)), *vr = ten(r, VL_F32, R, vrv);
  tp *vc = out(r, ten(r, VL_F32, C, vcv), "vc");
  if (R > 1) out(r, vr, "vr");
  if (with_m) out(r, m, "m");
  hparams(r);
  if (!with_m) r->hp.beta1 = 0.0f;
  EACH(s) *ARGS(vl_adafactor_args, s) = (vl_adafactor_args){.p = T(p, s), .g = T(g, s),
      .vr = T(vr, s), .vc = T(vc, s), .m = with_m ? T(m, s) : NULL, .R = R, .C = C, .hp = &r->hp};
}

/* GEMM with A, B, C dtypes a, b, c; GC_BATCHED: 3 batches with padded leading dims, offsets
 * and strides (an NF4 B stays whole and shared). The workspace: vl_op_run, from each side's
 * arena, as the layers get it. */
static void b_gemm(run *r, const vl_gc_case *c) {
  bool ta = HAS(GC_TA), tb = HAS(GC_TB), big = HAS(GC_BATCHED), nf4 = DT(1) == VL_NF4;
  int64_t M = c->d[0], N = c->d[1], K = c->d[2], batch = big ? 3 : 1, pad = big ? 5 : 0;
  int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  vl_gemm g;
  memset(&g, 0, sizeof g);
  g.ta = ta; g.tb = tb; g.M = M; g.N = N; g.K = K; g.batch = batch;
  g.alpha = 0.8f; g.beta = big ? 0.5f : 0.0f;
  g.lda = ac + pad; g.a_off = pad; g.sa = ar * g.lda + pad;
  if (nf4) { g.ldb = bc; g.b_off = 0; g.sb = 0; }
  else { g.ldb = bc + pad; g.b_off = 2 * pad; g.sb = br * g.ldb + pad; }
  g.ldc = N + pad; g.c_off = 3 * pad; g.sc = M * g.ldc + pad;
  int64_t na = g.a_off + (batch - 1) * g.sa + ar * g.lda;
  int64_t nb = nf4 ? br * bc : g.b_off + (batch - 1) * g.sb + br * g.ldb;
  int64_t nc = g.c_off + (batch - 1) * g.sc + M * g.ldc;
  tp *A = ten(r, DT(0), na, rnd(r, na, 1)), *B = ten(r, DT(1), nb, rnd(r, nb, 1));
  tp *C = out(r, ten(r, DT(2), nc, rnd(r, nc, 1)), "C");
  EACH(s) {
    vl_gemm *gs = ARGS(vl_gemm, s);
    *gs = g;
    gs->A = T(A, s); gs->B = T(B, s); gs->C = T(C, s);
  }
}

/* x (N, C, HW) with channel c around 0.5 c, so the per-channel statistics differ */
static float *chan_offset(run *r, int64_t N, int64_t C, int64_t HW, float scale) {
  float *v = rnd(r, N * C * HW, scale);
  for (int64_t i = 0; i < N * C * HW; i++) v[i] += 0.5f * (float)((i / HW) % C);
  return v;
}

static void b_bn_fwd_train(run *r, const vl_gc_case *c) {
  int64_t N = c->d[0], C = c->d[1], HW = c->d[2], n = N * C * HW;
  tp *x = ten(r, DT(0), n, chan_offset(r, N, C, HW, 2)), *y = out(r, ten(r, DT(0), n, NULL), "y");
  tp *g = ten(r, DT(1), C, around_one(r, C)), *b = ten(r, DT(1), C, rnd(r, C, 1));
  tp *mean = out(r, ten(r, VL_F32, C, NULL), "mean"), *rstd = out(r, ten(r, VL_F32, C, NULL), "rstd");
  tp *rm = out(r, ten(r, VL_F32, C, rnd(r, C, 1)), "running mean"); /* kept without stats */
  tp *rv = out(r, ten(r, VL_F32, C, around_one(r, C)), "running var");
  bool st = !HAS(GC_NO_STATS);
  EACH(s) *ARGS(vl_bn_fwd_train_args, s) = (vl_bn_fwd_train_args){.y = T(y, s), .mean = T(mean, s),
      .rstd = T(rstd, s), .rmean = st ? T(rm, s) : NULL, .rvar = st ? T(rv, s) : NULL, .x = T(x, s),
      .gamma = T(g, s), .beta = T(b, s), .N = N, .C = C, .HW = HW, .eps = 1e-5f, .momentum = 0.1f};
}

static void b_bn_fwd_eval(run *r, const vl_gc_case *c) {
  int64_t N = c->d[0], C = c->d[1], HW = c->d[2], n = N * C * HW;
  tp *x = ten(r, DT(0), n, chan_offset(r, N, C, HW, 2));
  tp *y = HAS(GC_INPLACE) ? x : ten(r, DT(0), n, NULL);
  out(r, y, "y");
  tp *g = ten(r, DT(1), C, around_one(r, C)), *b = ten(r, DT(1), C, rnd(r, C, 1));
  tp *rm = ten(r, VL_F32, C, rnd(r, C, 1)), *rv = ten(r, VL_F32, C, around_one(r, C));
  EACH(s) *ARGS(vl_bn_fwd_eval_args, s) = (vl_bn_fwd_eval_args){.y = T(y, s), .x = T(x, s),
      .gamma = T(g, s), .beta = T(b, s), .rmean = T(rm, s), .rvar = T(rv, s), .N = N, .C = C,
      .HW = HW, .eps = 1e-5f};
}

/* mean/rstd are the statistics of x as stored; dgamma/dbeta (dtype c) accumulate into
 * random values */
static void b_bn_bwd(run *r, const vl_gc_case *c) {
  int64_t N = c->d[0], C = c->d[1], HW = c->d[2], n = N * C * HW, M = N * HW;
  float *xv = chan_offset(r, N, C, HW, 2), *mv = xmalloc(sizeof(float) * (size_t)C),
        *rsv = xmalloc(sizeof(float) * (size_t)C);
  for (int64_t k = 0; k < C; k++) {
    double s = 0, ss = 0;
    for (int64_t j = 0; j < M; j++) s += vl_elem_round(DT(0), xv[(j / HW * C + k) * HW + j % HW]);
    for (int64_t j = 0; j < M; j++) {
      double d = vl_elem_round(DT(0), xv[(j / HW * C + k) * HW + j % HW]) - s / (double)M;
      ss += d * d;
    }
    mv[k] = (float)(s / (double)M);
    rsv[k] = (float)(1.0 / sqrt(ss / (double)M + 1e-5));
  }
  tp *x = ten(r, DT(0), n, xv), *g = ten(r, DT(1), C, around_one(r, C));
  tp *dy = ten(r, DT(0), n, rnd(r, n, 1));
  tp *dx = HAS(GC_INPLACE) ? dy : ten(r, DT(0), n, NULL);
  out(r, dx, "dx");
  tp *dg = out(r, ten(r, DT(2), C, rnd(r, C, 1)), "dgamma");
  tp *db = out(r, ten(r, DT(2), C, rnd(r, C, 1)), "dbeta");
  tp *mean = ten(r, VL_F32, C, mv), *rstd = ten(r, VL_F32, C, rsv);
  bool gr = !HAS(GC_NO_GRADS);
  EACH(s) *ARGS(vl_bn_bwd_args, s) = (vl_bn_bwd_args){.dx = T(dx, s),
      .dgamma = gr ? T(dg, s) : NULL, .dbeta = gr ? T(db, s) : NULL, .dy = T(dy, s), .x = T(x, s),
      .gamma = T(g, s), .mean = T(mean, s), .rstd = T(rstd, s), .N = N, .C = C, .HW = HW};
}

static void b_relu_fwd(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  float *xv = rnd(r, n, 1);
  xv[3] = NAN; /* propagates, on both */
  tp *x = ten(r, DT(1), n, xv), *y = HAS(GC_INPLACE) ? x : ten(r, DT(0), n, NULL);
  out(r, y, "y");
  EACH(s) *ARGS(vl_relu_fwd_args, s) = (vl_relu_fwd_args){.y = T(y, s), .x = T(x, s), .n = n};
}

static void b_relu_bwd(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  float *yv = rnd(r, n, 1);
  for (int64_t i = 0; i < n; i++) yv[i] = yv[i] > 0 ? yv[i] : 0.0f; /* a ReLU output */
  tp *y = ten(r, DT(1), n, yv), *dy = ten(r, DT(0), n, rnd(r, n, 1));
  tp *dx = HAS(GC_INPLACE) ? dy : ten(r, DT(0), n, NULL);
  out(r, dx, "dx");
  EACH(s) *ARGS(vl_relu_bwd_args, s) = (vl_relu_bwd_args){.dx = T(dx, s), .dy = T(dy, s),
                                                          .y = T(y, s), .n = n};
}

/* Values on a grid of 0.25 so windows hold ties (the first maximum must win on both). */
static float *tied(run *r, int64_t n) {
  float *v = rnd(r, n, 1);
  for (int64_t i = 0; i < n; i++) v[i] = 0.25f * roundf(4.0f * v[i]) - 2.0f;
  return v;
}

static void b_maxpool_fwd(run *r, const vl_gc_case *c) {
  const int64_t *d = c->d; /* planes, H, W, k, stride, pad, P, Q */
  int64_t ni = d[0] * d[1] * d[2], no = d[0] * d[6] * d[7];
  tp *x = ten(r, DT(1), ni, tied(r, ni)), *y = out(r, ten(r, DT(0), no, NULL), "y");
  EACH(s) *ARGS(vl_maxpool_fwd_args, s) = (vl_maxpool_fwd_args){.y = T(y, s), .x = T(x, s),
      .planes = d[0], .H = d[1], .W = d[2], .k = (int)d[3], .stride = (int)d[4], .pad = (int)d[5],
      .P = d[6], .Q = d[7]};
}

static void b_maxpool_bwd(run *r, const vl_gc_case *c) {
  const int64_t *d = c->d;
  int64_t ni = d[0] * d[1] * d[2], no = d[0] * d[6] * d[7];
  tp *x = ten(r, DT(1), ni, tied(r, ni)), *dy = ten(r, DT(0), no, rnd(r, no, 1));
  tp *dx = out(r, ten(r, DT(0), ni, rnd(r, ni, 1)), "dx"); /* overwritten, garbage before */
  EACH(s) *ARGS(vl_maxpool_bwd_args, s) = (vl_maxpool_bwd_args){.dx = T(dx, s), .dy = T(dy, s),
      .x = T(x, s), .planes = d[0], .H = d[1], .W = d[2], .k = (int)d[3], .stride = (int)d[4],
      .pad = (int)d[5], .P = d[6], .Q = d[7]};
}

static void b_up2_fwd(run *r, const vl_gc_case *c) {
  int64_t P = c->d[0], H = c->d[1], W = c->d[2], lo = P * H * W;
  tp *x = ten(r, DT(1), lo, rnd(r, lo, 1)), *y = out(r, ten(r, DT(0), 4 * lo, NULL), "y");
  EACH(s) *ARGS(vl_upsample2x_fwd_args, s) = (vl_upsample2x_fwd_args){.y = T(y, s), .x = T(x, s),
      .planes = P, .H = H, .W = W, .nearest = HAS(GC_NEAREST)};
}

static void b_up2_bwd(run *r, const vl_gc_case *c) {
  int64_t P = c->d[0], H = c->d[1], W = c->d[2], lo = P * H * W;
  tp *dy = ten(r, DT(0), 4 * lo, rnd(r, 4 * lo, 1));
  tp *dx = out(r, ten(r, DT(1), lo, rnd(r, lo, 1)), "dx"); /* overwritten */
  EACH(s) *ARGS(vl_upsample2x_bwd_args, s) = (vl_upsample2x_bwd_args){.dx = T(dx, s),
      .dy = T(dy, s), .planes = P, .H = H, .W = W, .nearest = HAS(GC_NEAREST)};
}

static void b_chan_copy(run *r, const vl_gc_case *c) {
  const int64_t *d = c->d; /* N, yC, xC, HW, y_c0, x_c0, nc */
  int64_t ny = d[0] * d[1] * d[3], nx = d[0] * d[2] * d[3];
  tp *y = out(r, ten(r, DT(0), ny, rnd(r, ny, 1)), "y"), *x = ten(r, DT(1), nx, rnd(r, nx, 1));
  EACH(s) *ARGS(vl_chan_copy_args, s) = (vl_chan_copy_args){.y = T(y, s), .yC = d[1], .y_c0 = d[4],
      .x = T(x, s), .xC = d[2], .x_c0 = d[5], .nc = d[6], .N = d[0], .HW = d[3],
      .accumulate = HAS(GC_ACC)};
}

static void b_xent_pix(run *r, const vl_gc_case *c) {
  int64_t N = c->d[0], K = c->d[1], HW = c->d[2], nl = N * K * HW, np = N * HW;
  tp *l = out(r, ten(r, DT(0), nl, rnd(r, nl, 2)), "dlogits");
  tp *loss = out(r, ten(r, VL_F32, np, NULL), "loss"), *tgt = ten(r, VL_I32, np, ids(r, np, K, true));
  EACH(s) *ARGS(vl_xent_pix_args, s) =
      (vl_xent_pix_args){.logits = T(l, s), .loss = T(loss, s), .tgt = T(tgt, s), .N = N, .K = K,
                         .HW = HW, .dloss_scale = 1.0f / (float)np};
}

/* The convolution of a case (x/dx/y/dy in a, w in b, dw in c); false when refused. */
static bool conv_of(run *r, const vl_gc_case *c, vl_conv *cv, int64_t *nx, int64_t *nw, int64_t *ny) {
  const int64_t *d = c->d; /* N, C, H = W, K, R = S, stride, pad, dil */
  if (!vl_conv_init(cv, d[0], d[1], d[2], d[2], d[3], d[4], d[4], (int)d[5], (int)d[6], (int)d[7])) {
    fail(r, "vl_conv_init rejected the shape");
    return false;
  }
  cv->xdt = DT(0); cv->wdt = DT(1); cv->gdt = DT(2);
  *nx = cv->N * cv->C * cv->H * cv->W;
  *nw = cv->K * cv->C * cv->R * cv->S;
  *ny = cv->N * cv->K * cv->P * cv->Q;
  return true;
}

static void b_conv_fwd(run *r, const vl_gc_case *c) {
  vl_conv cv;
  int64_t nx, nw, ny;
  if (!conv_of(r, c, &cv, &nx, &nw, &ny)) return;
  tp *x = ten(r, DT(0), nx, rnd(r, nx, 1)), *w = ten(r, DT(1), nw, rnd(r, nw, 0.3f));
  tp *y = out(r, ten(r, DT(0), ny, NULL), "y");
  EACH(s) *ARGS(vl_conv_fwd_args, s) = (vl_conv_fwd_args){.cv = cv, .y = T(y, s), .x = T(x, s), .w = T(w, s)};
}

static void b_conv_bwd_data(run *r, const vl_gc_case *c) {
  vl_conv cv;
  int64_t nx, nw, ny;
  if (!conv_of(r, c, &cv, &nx, &nw, &ny)) return;
  tp *dy = ten(r, DT(0), ny, rnd(r, ny, 1)), *w = ten(r, DT(1), nw, rnd(r, nw, 0.3f));
  tp *dx = out(r, ten(r, DT(0), nx, rnd(r, nx, 1)), "dx"); /* overwritten */
  EACH(s) *ARGS(vl_conv_bwd_data_args, s) =
      (vl_conv_bwd_data_args){.cv = cv, .dx = T(dx, s), .dy = T(dy, s), .w = T(w, s)};
}

static void b_conv_bwd_weight(run *r, const vl_gc_case *c) {
  vl_conv cv;
  int64_t nx, nw, ny;
  if (!conv_of(r, c, &cv, &nx, &nw, &ny)) return;
  tp *x = ten(r, DT(0), nx, rnd(r, nx, 1)), *dy = ten(r, DT(0), ny, rnd(r, ny, 1));
  tp *dw = out(r, ten(r, DT(2), nw, rnd(r, nw, 1)), "dw"); /* kept when accumulating */
  EACH(s) *ARGS(vl_conv_bwd_weight_args, s) = (vl_conv_bwd_weight_args){
      .cv = cv, .dw = T(dw, s), .x = T(x, s), .dy = T(dy, s), .accumulate = HAS(GC_ACC)};
}

/* ---- Stable Diffusion's operations ------------------------------------------------------ */

/* Mean and rstd of S back-to-back segments of M elements of x as stored in dt: the
 * statistics a norm's forward saved (GroupNorm's groups (n, g) and LayerNorm's rows both
 * lie at s*M). */
static void seg_stats(const float *xv, vl_dtype dt, int64_t S, int64_t M, float **mean,
                      float **rstd) {
  *mean = xmalloc(sizeof(float) * (size_t)S);
  *rstd = xmalloc(sizeof(float) * (size_t)S);
  for (int64_t s = 0; s < S; s++) {
    double sum = 0, ss = 0;
    for (int64_t j = 0; j < M; j++) sum += vl_elem_round(dt, xv[s * M + j]);
    for (int64_t j = 0; j < M; j++) {
      double d = vl_elem_round(dt, xv[s * M + j]) - sum / (double)M;
      ss += d * d;
    }
    (*mean)[s] = (float)(sum / (double)M);
    (*rstd)[s] = (float)(1.0 / sqrt(ss / (double)M + 1e-5));
  }
}

/* GroupNorm {N, C, HW, G}: a = x/y/dx/dy, b = gamma/beta, c = dgamma/dbeta. */
static void b_groupnorm_fwd(run *r, const vl_gc_case *c) {
  int64_t N = c->d[0], C = c->d[1], HW = c->d[2], G = c->d[3], n = N * C * HW;
  tp *x = ten(r, DT(0), n, chan_offset(r, N, C, HW, 2)), *y = out(r, ten(r, DT(0), n, NULL), "y");
  tp *g = ten(r, DT(1), C, around_one(r, C)), *b = ten(r, DT(1), C, rnd(r, C, 1));
  tp *mean = out(r, ten(r, VL_F32, N * G, NULL), "mean");
  tp *rstd = out(r, ten(r, VL_F32, N * G, NULL), "rstd");
  EACH(s) *ARGS(vl_groupnorm_fwd_args, s) = (vl_groupnorm_fwd_args){.y = T(y, s),
      .mean = T(mean, s), .rstd = T(rstd, s), .x = T(x, s), .gamma = T(g, s), .beta = T(b, s),
      .N = N, .C = C, .HW = HW, .G = G, .eps = 1e-5f};
}

/* dx overwritten over garbage, or accumulated (GC_ACC); dgamma/dbeta accumulate into random
 * values, or are NULL (GC_NO_GRADS: frozen, then compared unchanged) */
static void b_groupnorm_bwd(run *r, const vl_gc_case *c) {
  int64_t N = c->d[0], C = c->d[1], HW = c->d[2], G = c->d[3], n = N * C * HW, S = N * G;
  float *xv = chan_offset(r, N, C, HW, 2), *mv, *rsv;
  seg_stats(xv, DT(0), S, n / S, &mv, &rsv);
  tp *x = ten(r, DT(0), n, xv), *g = ten(r, DT(1), C, around_one(r, C));
  tp *dy = ten(r, DT(0), n, rnd(r, n, 1)), *dx = out(r, ten(r, DT(0), n, rnd(r, n, 1)), "dx");
  tp *dg = out(r, ten(r, DT(2), C, rnd(r, C, 1)), "dgamma");
  tp *db = out(r, ten(r, DT(2), C, rnd(r, C, 1)), "dbeta");
  tp *mean = ten(r, VL_F32, S, mv), *rstd = ten(r, VL_F32, S, rsv);
  bool gr = !HAS(GC_NO_GRADS);
  EACH(s) *ARGS(vl_groupnorm_bwd_args, s) = (vl_groupnorm_bwd_args){.dx = T(dx, s),
      .dgamma = gr ? T(dg, s) : NULL, .dbeta = gr ? T(db, s) : NULL, .dy = T(dy, s), .x = T(x, s),
      .gamma = T(g, s), .mean = T(mean, s), .rstd = T(rstd, s), .N = N, .C = C, .HW = HW, .G = G,
      .accumulate = HAS(GC_ACC)};
}

/* LayerNorm {R, C}: a = x/y/dx/dy, b = gamma/beta, c = dgamma/dbeta; rows around 0.5 r. */
static float *row_offset(run *r, int64_t R, int64_t C) {
  float *v = rnd(r, R * C, 2);
  for (int64_t i = 0; i < R * C; i++) v[i] += 0.5f * (float)((i / C) % 7);
  return v;
}

static void b_layernorm_fwd(run *r, const vl_gc_case *c) {
  int64_t R = c->d[0], C = c->d[1], n = R * C;
  tp *x = ten(r, DT(0), n, row_offset(r, R, C)), *y = out(r, ten(r, DT(0), n, NULL), "y");
  tp *g = ten(r, DT(1), C, around_one(r, C)), *b = ten(r, DT(1), C, rnd(r, C, 1));
  tp *mean = out(r, ten(r, VL_F32, R, NULL), "mean");
  tp *rstd = out(r, ten(r, VL_F32, R, NULL), "rstd");
  EACH(s) *ARGS(vl_layernorm_fwd_args, s) = (vl_layernorm_fwd_args){.y = T(y, s),
      .mean = T(mean, s), .rstd = T(rstd, s), .x = T(x, s), .gamma = T(g, s), .beta = T(b, s),
      .R = R, .C = C, .eps = 1e-5f};
}

static void b_layernorm_bwd(run *r, const vl_gc_case *c) {
  int64_t R = c->d[0], C = c->d[1], n = R * C;
  float *xv = row_offset(r, R, C), *mv, *rsv;
  seg_stats(xv, DT(0), R, C, &mv, &rsv);
  tp *x = ten(r, DT(0), n, xv), *g = ten(r, DT(1), C, around_one(r, C));
  tp *dy = ten(r, DT(0), n, rnd(r, n, 1)), *dx = out(r, ten(r, DT(0), n, rnd(r, n, 1)), "dx");
  tp *dg = out(r, ten(r, DT(2), C, rnd(r, C, 1)), "dgamma");
  tp *db = out(r, ten(r, DT(2), C, rnd(r, C, 1)), "dbeta");
  tp *mean = ten(r, VL_F32, R, mv), *rstd = ten(r, VL_F32, R, rsv);
  bool gr = !HAS(GC_NO_GRADS);
  EACH(s) *ARGS(vl_layernorm_bwd_args, s) = (vl_layernorm_bwd_args){.dx = T(dx, s),
      .dgamma = gr ? T(dg, s) : NULL, .dbeta = gr ? T(db, s) : NULL, .dy = T(dy, s), .x = T(x, s),
      .gamma = T(g, s), .mean = T(mean, s), .rstd = T(rstd, s), .R = R, .C = C,
      .accumulate = HAS(GC_ACC)};
}

/* Activations {n, act}: a = y / dx and dy, b = x. Inputs over [-6, 6] and a tail at -20. */
static void b_act_fwd(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  float *xv = rnd(r, n, 2.5f);
  xv[1] = -20.0f;
  tp *x = ten(r, DT(1), n, xv), *y = HAS(GC_INPLACE) ? x : ten(r, DT(0), n, NULL);
  out(r, y, "y");
  EACH(s) *ARGS(vl_act_fwd_args, s) = (vl_act_fwd_args){.y = T(y, s), .x = T(x, s), .n = n,
                                                        .act = (vl_act)c->d[1]};
}

static void b_act_bwd(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  tp *x = ten(r, DT(1), n, rnd(r, n, 2.5f)), *dy = ten(r, DT(0), n, rnd(r, n, 1));
  tp *dx = HAS(GC_INPLACE) ? dy : ten(r, DT(0), n, rnd(r, n, 1));
  out(r, dx, "dx");
  EACH(s) *ARGS(vl_act_bwd_args, s) =
      (vl_act_bwd_args){.dx = T(dx, s), .dy = T(dy, s), .x = T(x, s), .n = n,
                        .act = (vl_act)c->d[1]};
}

/* GEGLU {R, F}: a = h (and dh, written over h with GC_INPLACE), b = out / dout. */
static void b_geglu_fwd(run *r, const vl_gc_case *c) {
  int64_t R = c->d[0], F = c->d[1];
  tp *h = ten(r, DT(0), 2 * R * F, rnd(r, 2 * R * F, 2));
  tp *o = out(r, ten(r, DT(1), R * F, NULL), "out");
  EACH(s) *ARGS(vl_geglu_fwd_args, s) = (vl_geglu_fwd_args){.out = T(o, s), .h = T(h, s), .R = R,
                                                            .F = F};
}

static void b_geglu_bwd(run *r, const vl_gc_case *c) {
  int64_t R = c->d[0], F = c->d[1];
  tp *h = ten(r, DT(0), 2 * R * F, rnd(r, 2 * R * F, 2));
  tp *d = ten(r, DT(1), R * F, rnd(r, R * F, 1));
  tp *dh = HAS(GC_INPLACE) ? h : ten(r, DT(0), 2 * R * F, rnd(r, 2 * R * F, 1));
  out(r, dh, "dh");
  EACH(s) *ARGS(vl_geglu_bwd_args, s) = (vl_geglu_bwd_args){.dh = T(dh, s), .dout = T(d, s),
                                                            .h = T(h, s), .R = R, .F = F};
}

/* Bias {outer, C, inner}: a = y / dy, b = b / db; GC_PER_OUTER: b (outer, C); GC_ACC: db
 * accumulated into random values. */
static void b_bias_fwd(run *r, const vl_gc_case *c) {
  int64_t O = c->d[0], C = c->d[1], I = c->d[2], nb = HAS(GC_PER_OUTER) ? O * C : C;
  tp *y = out(r, ten(r, DT(0), O * C * I, rnd(r, O * C * I, 1)), "y");
  tp *b = ten(r, DT(1), nb, rnd(r, nb, 1));
  EACH(s) *ARGS(vl_bias_fwd_args, s) =
      (vl_bias_fwd_args){.y = T(y, s), .b = T(b, s), .outer = O, .C = C, .inner = I,
                         .per_outer = HAS(GC_PER_OUTER)};
}

static void b_bias_bwd(run *r, const vl_gc_case *c) {
  int64_t O = c->d[0], C = c->d[1], I = c->d[2], nb = HAS(GC_PER_OUTER) ? O * C : C;
  tp *dy = ten(r, DT(0), O * C * I, rnd(r, O * C * I, 1));
  tp *db = out(r, ten(r, DT(1), nb, rnd(r, nb, 1)), "db");
  EACH(s) *ARGS(vl_bias_bwd_args, s) =
      (vl_bias_bwd_args){.db = T(db, s), .dy = T(dy, s), .outer = O, .C = C, .inner = I,
                         .per_outer = HAS(GC_PER_OUTER), .accumulate = HAS(GC_ACC)};
}

/* Padding {planes, H, W, top, bottom, left, right}: a = the padded side (y / dy), b = x / dx. */
static void b_pad2d_fwd(run *r, const vl_gc_case *c) {
  const int64_t *d = c->d;
  int64_t ni = d[0] * d[1] * d[2], no = d[0] * (d[1] + d[3] + d[4]) * (d[2] + d[5] + d[6]);
  tp *x = ten(r, DT(1), ni, rnd(r, ni, 1)), *y = out(r, ten(r, DT(0), no, rnd(r, no, 1)), "y");
  EACH(s) *ARGS(vl_pad2d_fwd_args, s) = (vl_pad2d_fwd_args){.y = T(y, s), .x = T(x, s),
      .planes = d[0], .H = d[1], .W = d[2], .top = (int)d[3], .bottom = (int)d[4],
      .left = (int)d[5], .right = (int)d[6]};
}

static void b_pad2d_bwd(run *r, const vl_gc_case *c) {
  const int64_t *d = c->d;
  int64_t ni = d[0] * d[1] * d[2], no = d[0] * (d[1] + d[3] + d[4]) * (d[2] + d[5] + d[6]);
  tp *dy = ten(r, DT(0), no, rnd(r, no, 1)), *dx = out(r, ten(r, DT(1), ni, rnd(r, ni, 1)), "dx");
  EACH(s) *ARGS(vl_pad2d_bwd_args, s) = (vl_pad2d_bwd_args){.dx = T(dx, s), .dy = T(dy, s),
      .planes = d[0], .H = d[1], .W = d[2], .top = (int)d[3], .bottom = (int)d[4],
      .left = (int)d[5], .right = (int)d[6]};
}

/* Timestep embedding {B, dim, shift}: a = emb; timesteps uniform in [0, 1000); GC_FLIP:
 * [cos, sin] (SD). */
static void b_timestep_embed(run *r, const vl_gc_case *c) {
  int64_t B = c->d[0], dim = c->d[1];
  tp *t = ten(r, VL_I32, B, ids(r, B, 1000, false));
  tp *e = out(r, ten(r, DT(0), B * dim, NULL), "emb");
  EACH(s) *ARGS(vl_timestep_embed_args, s) = (vl_timestep_embed_args){.emb = T(e, s), .t = T(t, s),
      .B = B, .dim = dim, .flip_sin_to_cos = HAS(GC_FLIP), .shift = (float)c->d[2],
      .max_period = 10000.0f};
}

/* Fused MSE {R, C}: a = pred (the gradient in place), b = target. */
static void b_mse_fused(run *r, const vl_gc_case *c) {
  int64_t R = c->d[0], C = c->d[1];
  tp *p = out(r, ten(r, DT(0), R * C, rnd(r, R * C, 1)), "dpred");
  tp *t = ten(r, DT(1), R * C, rnd(r, R * C, 1));
  tp *loss = out(r, ten(r, VL_F32, R, NULL), "loss");
  EACH(s) *ARGS(vl_mse_fused_args, s) =
      (vl_mse_fused_args){.pred = T(p, s), .loss = T(loss, s), .target = T(t, s), .R = R, .C = C,
                          .dloss_scale = 1.0f / (float)(R * C)};
}

/* Gaussian sample {N, C, HW}: a = z and noise (z over the noise with GC_INPLACE), b =
 * moments; a few log-variances beyond the clamp at either end. */
static void b_gauss_sample(run *r, const vl_gc_case *c) {
  int64_t N = c->d[0], C = c->d[1], HW = c->d[2], n = N * C * HW;
  float *mv = rnd(r, 2 * n, 1.5f);
  mv[C * HW] = -45.0f;               /* sample 0, channel 0's log-variance */
  mv[(2 * C - 1) * HW + HW - 1] = 24.0f;
  tp *m = ten(r, DT(1), 2 * n, mv), *noise = ten(r, DT(0), n, rnd(r, n, 1));
  tp *z = HAS(GC_INPLACE) ? noise : ten(r, DT(0), n, NULL);
  out(r, z, "z");
  EACH(s) *ARGS(vl_gauss_sample_args, s) =
      (vl_gauss_sample_args){.z = T(z, s), .moments = T(m, s), .noise = T(noise, s), .N = N, .C = C,
                             .HW = HW, .scale = 0.18215f};
}

/* ---- attention -------------------------------------------------------------------------- */

/* Attention shapes d = {B, H, Tq, Tk, D}; dtypes a = q, k, v; b = o, dout; c = dq, dk, dv.
 * lse is fp32. scale = 1/sqrt(D), as the layer's. */
typedef struct { int64_t B, H, Tq, Tk, D, nq, nk, nr; float scale; bool causal; } attn_shape;
static attn_shape attn_of(const vl_gc_case *c) {
  attn_shape a = {c->d[0], c->d[1], c->d[2], c->d[3], c->d[4], 0, 0, 0, 0, HAS(GC_CAUSAL)};
  a.nq = a.B * a.Tq * a.H * a.D;
  a.nk = a.B * a.Tk * a.H * a.D;
  a.nr = a.B * a.H * a.Tq;
  a.scale = 1.0f / sqrtf((float)a.D);
  return a;
}

static void b_attn_fwd(run *r, const vl_gc_case *c) {
  attn_shape a = attn_of(c);
  tp *q = ten(r, DT(0), a.nq, rnd(r, a.nq, 1.5f)), *k = ten(r, DT(0), a.nk, rnd(r, a.nk, 1.5f));
  tp *v = ten(r, DT(0), a.nk, rnd(r, a.nk, 1));
  tp *o = out(r, ten(r, DT(1), a.nq, rnd(r, a.nq, 1)), "o"); /* overwritten */
  tp *lse = out(r, ten(r, VL_F32, a.nr, NULL), "lse");
  EACH(s) *ARGS(vl_attn_fwd_args, s) = (vl_attn_fwd_args){.o = T(o, s), .lse = T(lse, s),
      .q = T(q, s), .k = T(k, s), .v = T(v, s), .B = a.B, .H = a.H, .Tq = a.Tq, .Tk = a.Tk,
      .D = a.D, .scale = a.scale, .causal = a.causal};
}

/* The backward's lse must be the forward's (else exp(s - lse) is not a probability): the
 * log-sum-exp of each score row, in double, from q and k as stored. */
static float *attn_lse(const attn_shape *a, const float *qv, const float *kv, vl_dtype dt) {
  float *lse = xmalloc(sizeof(float) * (size_t)a->nr);
  int64_t HD = a->H * a->D;
  double *sc = xmalloc(sizeof(double) * (size_t)a->Tk);
  for (int64_t r = 0; r < a->nr; r++) {
    int64_t i = r % a->Tq, h = (r / a->Tq) % a->H, b = r / (a->Tq * a->H);
    int64_t nk = a->causal ? i + 1 : a->Tk;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < nk; j++) {
      double dot = 0;
      for (int64_t d = 0; d < a->D; d++)
        dot += (double)vl_elem_round(dt, qv[(b * a->Tq + i) * HD + h * a->D + d]) *
               vl_elem_round(dt, kv[(b * a->Tk + j) * HD + h * a->D + d]);
      sc[j] = a->scale * dot;
      mx = fmax(mx, sc[j]);
    }
    for (int64_t j = 0; j < nk; j++) sum += exp(sc[j] - mx);
    lse[r] = (float)(mx + log(sum));
  }
  free(sc);
  return lse;
}

static void b_attn_bwd(run *r, const vl_gc_case *c) {
  attn_shape a = attn_of(c);
  float *qv = rnd(r, a.nq, 1.5f), *kv = rnd(r, a.nk, 1.5f);
  tp *lse = ten(r, VL_F32, a.nr, attn_lse(&a, qv, kv, DT(0)));
  tp *q = ten(r, DT(0), a.nq, qv), *k = ten(r, DT(0), a.nk, kv);
  tp *v = ten(r, DT(0), a.nk, rnd(r, a.nk, 1));
  tp *o = ten(r, DT(1), a.nq, rnd(r, a.nq, 0.5f)), *dout = ten(r, DT(1), a.nq, rnd(r, a.nq, 1));
  tp *dq = out(r, ten(r, DT(2), a.nq, rnd(r, a.nq, 1)), "dq"); /* all three overwritten */
  tp *dk = out(r, ten(r, DT(2), a.nk, rnd(r, a.nk, 1)), "dk");
  tp *dv = out(r, ten(r, DT(2), a.nk, rnd(r, a.nk, 1)), "dv");
  EACH(s) *ARGS(vl_attn_bwd_args, s) = (vl_attn_bwd_args){.dq = T(dq, s), .dk = T(dk, s),
      .dv = T(dv, s), .dout = T(dout, s), .o = T(o, s), .lse = T(lse, s), .q = T(q, s),
      .k = T(k, s), .v = T(v, s), .B = a.B, .H = a.H, .Tq = a.Tq, .Tk = a.Tk, .D = a.D,
      .scale = a.scale, .causal = a.causal, .ws = NULL,
      .ws_bytes = 0}; /* workspace: from vl_op_run */
}

typedef void (*builder)(run *, const vl_gc_case *);
static const builder BUILD[VL_OP_COUNT] = {
    [VL_OP_GEMM] = b_gemm,
    [VL_OP_CONV_FWD] = b_conv_fwd,
    [VL_OP_CONV_BWD_DATA] = b_conv_bwd_data,
    [VL_OP_CONV_BWD_WEIGHT] = b_conv_bwd_weight,
    [VL_OP_ZERO] = b_zero,
    [VL_OP_CONVERT] = b_convert,
    [VL_OP_AXPBY] = b_axpby,
    [VL_OP_EMBED_FWD] = b_embed_fwd,
    [VL_OP_EMBED_BWD] = b_embed_bwd,
    [VL_OP_RMSNORM_FWD] = b_rmsnorm_fwd,
    [VL_OP_RMSNORM_BWD] = b_rmsnorm_bwd,
    [VL_OP_ROPE] = b_rope,
    [VL_OP_PERMUTE] = b_permute,
    [VL_OP_SOFTMAX_FWD] = b_softmax_fwd,
    [VL_OP_SOFTMAX_BWD] = b_softmax_bwd,
    [VL_OP_SWIGLU_FWD] = b_swiglu_fwd,
    [VL_OP_SWIGLU_BWD] = b_swiglu_bwd,
    [VL_OP_XENT_FUSED] = b_xent_fused,
    [VL_OP_SUMSQ] = b_sumsq,
    [VL_OP_ADAMW] = b_adamw,
    [VL_OP_SGD] = b_sgd,
    [VL_OP_ADAFACTOR] = b_adafactor,
    [VL_OP_BN_FWD_TRAIN] = b_bn_fwd_train,
    [VL_OP_BN_FWD_EVAL] = b_bn_fwd_eval,
    [VL_OP_BN_BWD] = b_bn_bwd,
    [VL_OP_RELU_FWD] = b_relu_fwd,
    [VL_OP_RELU_BWD] = b_relu_bwd,
    [VL_OP_MAXPOOL_FWD] = b_maxpool_fwd,
    [VL_OP_MAXPOOL_BWD] = b_maxpool_bwd,
    [VL_OP_UPSAMPLE2X_FWD] = b_up2_fwd,
    [VL_OP_UPSAMPLE2X_BWD] = b_up2_bwd,
    [VL_OP_CHAN_COPY] = b_chan_copy,
    [VL_OP_XENT_PIX] = b_xent_pix,
    /* Stable Diffusion's operations */
    [VL_OP_GROUPNORM_FWD] = b_groupnorm_fwd,
    [VL_OP_GROUPNORM_BWD] = b_groupnorm_bwd,
    [VL_OP_LAYERNORM_FWD] = b_layernorm_fwd,
    [VL_OP_LAYERNORM_BWD] = b_layernorm_bwd,
    [VL_OP_ACT_FWD] = b_act_fwd,
    [VL_OP_ACT_BWD] = b_act_bwd,
    [VL_OP_GEGLU_FWD] = b_geglu_fwd,
    [VL_OP_GEGLU_BWD] = b_geglu_bwd,
    [VL_OP_BIAS_FWD] = b_bias_fwd,
    [VL_OP_BIAS_BWD] = b_bias_bwd,
    [VL_OP_PAD2D_FWD] = b_pad2d_fwd,
    [VL_OP_PAD2D_BWD] = b_pad2d_bwd,
    [VL_OP_TIMESTEP_EMBED] = b_timestep_embed,
    [VL_OP_MSE_FUSED] = b_mse_fused,
    [VL_OP_GAUSS_SAMPLE] = b_gauss_sample,
    /* attention */
    [VL_OP_ATTN_FWD] = b_attn_fwd,
    [VL_OP_ATTN_BWD] = b_attn_bwd,
};

/* ---- backend checks that are not operations ------------------------------------------- */

static void backend_check(run *r, const vl_gc_case *c) {
  int64_t n = c->d[0];
  if (c->kind == GC_SYNC) {
    EACH(s) status(r, s, r->ctx[s]->be->sync(r->ctx[s]), "sync");
  } else if (c->kind == GC_COPY) { /* upload in ten, download in cmp */
    out(r, ten(r, DT(0), n, DT(0) == VL_I32 ? ids(r, n, 1 << 20, true) : rnd(r, n, 1)), "tensor");
  } else { /* upload_async: from pinned (GC_PINNED) or pageable host memory */
    float *xv = rnd(r, n, 1);
    tp *y = out(r, ten(r, VL_F32, n, NULL), "y");
    bool pin = HAS(GC_PINNED);
    if (y->ok) EACH(s) {
      vl_ctx *cx = r->ctx[s];
      float *h = cx->be->host_alloc(cx, (size_t)n * sizeof(float), pin);
      if (!h) { fail(r, "host_alloc failed"); break; }
      memcpy(h, xv, (size_t)n * sizeof(float));
      status(r, s, cx->be->upload_async(cx, &y->t[s], 0, h, (size_t)n * sizeof(float)), "upload_async");
      status(r, s, cx->be->sync(cx), "sync");
      cx->be->host_free(cx, h, pin);
    }
    free(xv);
  }
}

/* ---- the runner ------------------------------------------------------------------------- */

static void run_case(run *r, const vl_gc_case *c) {
  if (c->kind < VL_OP_COUNT && !BUILD[c->kind]) {
    fail(r, "no builder for %s in gpu_check.c", vl_op_name((vl_op)c->kind));
  } else if (c->kind < VL_OP_COUNT) {
    BUILD[c->kind](r, c);
    if (!r->bad)
      EACH(s) status(r, s, vl_op_run(r->ctx[s], (vl_op)c->kind, r->args[s]), vl_op_name((vl_op)c->kind));
  } else {
    backend_check(r, c);
  }
  for (int i = 0; i < r->nout; i++) cmp(r, r->out[i], r->out_name[i]);
  if (r->scalar && !r->bad) { /* sumsq: the same value, the same verdict on NaN/Inf */
    if (r->nonfinite[CU] != r->nonfinite[CPU])
      fail(r, "nonfinite: cuda %d, cpu %d", r->nonfinite[CU], r->nonfinite[CPU]);
    if (HAS(GC_NONFINITE) && !r->nonfinite[CU]) fail(r, "cuda missed the NaN/Inf");
    double a = r->sum[CU], b = r->sum[CPU];
    if (isfinite(b) && !isfinite(a)) fail(r, "sum of squares: cuda %g where cpu is %g", a, b);
    double e = b != 0 ? (a - b) * (a - b) / (b * b) : a * a;
    if (e > r->nmse) r->nmse = e;
  }
  for (int i = r->nt - 1; i >= 0; i--) tp_free(r, &r->t[i]);
}

static void shape_str(const vl_gc_case *c, char *buf, size_t n) {
  int last = 7;
  while (last > 0 && c->d[last] == 0) last--;
  size_t o = 0;
  for (int i = 0; i <= last && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "x" : "", (long long)c->d[i]);
}

static bool selected(const vl_gc_case *c, int kind, const char *word) {
  return (kind < 0 || c->kind == kind) && (!word || strstr(c->name, word));
}

/* --require-gpu: nothing ran on a GPU is a failure (n cases were skipped). */
static int require_gpu_failed(int n) {
  printf("gpu-check: --require-gpu: no case ran on a GPU (%d skipped)\n", n);
  return 1;
}

/* --json FILE: every case's row as a JSON object, written whole or not at all when the tool
 * ends (the GPU first-light call brings it back; the text table stays on stdout). */
static cJSON *json_rows;

static void json_row(const vl_gc_case *c, const char *status, double nmse, double limit, const char *why) {
  if (!json_rows) return;
  char sh[96];
  shape_str(c, sh, sizeof sh);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "case", c->name);
  cJSON_AddStringToObject(o, "op", vl_gc_kind_name(c->kind));
  cJSON_AddStringToObject(o, "shape", sh);
  cJSON *dt = cJSON_AddArrayToObject(o, "dtypes");
  for (int k = 0; k < 3; k++) cJSON_AddItemToArray(dt, cJSON_CreateString(vl_dtype_name(c->dt[k])));
  cJSON_AddStringToObject(o, "status", status);
  if (isfinite(nmse)) cJSON_AddNumberToObject(o, "nmse", nmse);
  cJSON_AddNumberToObject(o, "limit", limit);
  if (why && *why) cJSON_AddStringToObject(o, "why", why);
  cJSON_AddItemToArray(json_rows, o);
}

/* Writes the rows with the run's summary; 0, or 1 with a message. */
static int json_write(const char *path, const char *device, int ran, int failed, int skipped) {
  if (!json_rows) return 0;
  cJSON *doc = cJSON_CreateObject();
  cJSON_AddStringToObject(doc, "device", device);
  cJSON_AddNumberToObject(doc, "ran", ran);
  cJSON_AddNumberToObject(doc, "failed", failed);
  cJSON_AddNumberToObject(doc, "skipped", skipped);
  cJSON_AddItemToObject(doc, "cases", json_rows);
  json_rows = NULL;
  char *text = cJSON_Print(doc);
  vl_err err = {""};
  int rc = text && vl_file_write_atomic(path, text, strlen(text), &err) == VL_OK ? 0 : 1;
  if (rc) fprintf(stderr, "gpu-check: --json %s: %s\n", path, err.msg[0] ? err.msg : "out of memory");
  free(text);
  cJSON_Delete(doc);
  return rc;
}

int main(int argc, char **argv) {
  bool self = false, list = false, require_gpu = false;
  const char *json = NULL;
  int kind = -1;
  const char *word = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--self-test")) self = true;
    else if (!strcmp(argv[i], "--list")) list = true;
    else if (!strcmp(argv[i], "--require-gpu")) require_gpu = true;
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!strcmp(argv[i], "--op") && i + 1 < argc) {
      kind = vl_gc_kind_parse(argv[++i]);
      if (kind < 0) {
        fprintf(stderr, "gpu-check: unknown operation '%s'; one of:", argv[i]);
        for (int k = 0; k < GC_KIND_COUNT; k++) fprintf(stderr, " %s", vl_gc_kind_name(k));
        fprintf(stderr, "\n");
        return 2;
      }
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "usage: vramlab-gpu-check [--list] [--self-test] [--require-gpu] [--op NAME]"
                      " [--json FILE] [WORD]\n");
      return 2;
    } else {
      word = argv[i];
    }
  }
  if (self && require_gpu) { /* the self-test is CPU against CPU: it never runs on a GPU */
    fprintf(stderr, "gpu-check: --require-gpu and --self-test exclude each other\n");
    return 2;
  }
  if (json) { /* a path that cannot be written is said before anything runs */
    vl_err err;
    if (vl_file_check_writable(json, &err)) {
      fprintf(stderr, "gpu-check: --json %s\n", err.msg);
      return 2;
    }
    json_rows = cJSON_CreateArray();
  }
  if (list) { /* runs nothing: --require-gpu has nothing to judge */
    int n = 0;
    for (size_t i = 0; i < VL_GC_NCASES; i++) {
      const vl_gc_case *c = &VL_GC_CASES[i];
      if (!selected(c, kind, word)) continue;
      char sh[96];
      shape_str(c, sh, sizeof sh);
      printf("%-40s op %-18s shape %-22s dtypes %s,%s,%s flags 0x%04x limit %.1e\n", c->name,
             vl_gc_kind_name(c->kind), sh, vl_dtype_name(c->dt[0]), vl_dtype_name(c->dt[1]),
             vl_dtype_name(c->dt[2]), c->flags, c->limit);
      n++;
    }
    printf("gpu-check: %d cases\n", n);
    return 0;
  }
  if (!self && !vl_cuda_available()) {
    int n = 0;
    for (size_t i = 0; i < VL_GC_NCASES; i++) {
      if (!selected(&VL_GC_CASES[i], kind, word)) continue;
      printf("%-40s SKIP (no GPU)\n", VL_GC_CASES[i].name);
      json_row(&VL_GC_CASES[i], "skip", NAN, VL_GC_CASES[i].limit, "no GPU");
      n++;
    }
    if (json && json_write(json, vl_backend_cuda() ? "no CUDA device visible" : "built without CUDA", 0, 0, n))
      return 1;
    printf("gpu-check: %d cases skipped, none run: %s\n", n,
           vl_backend_cuda() ? "no CUDA device visible" : "built without CUDA");
    return require_gpu ? require_gpu_failed(n) : 0;
  }
  /* --self-test: the CPU backend on both sides. Checks this tool (inputs, guards, NMSE) on a
   * machine without a GPU; every case must come out at nmse 0. Not a GPU result. */
  run r;
  memset(&r, 0, sizeof r);
  vl_status s = self ? vl_ctx_create(&r.ctx[CU], VL_DEV_CPU, VL_NO_CAP)
                     : vl_ctx_create(&r.ctx[CU], VL_DEV_CUDA, CUDA_CAP);
  if (s != VL_OK) {
    printf("gpu-check: FAIL: cannot create a CUDA context: %s\n", vl_status_name(s));
    return 1;
  }
  s = vl_ctx_create(&r.ctx[CPU], VL_DEV_CPU, VL_NO_CAP);
  if (s != VL_OK) {
    printf("gpu-check: FAIL: cannot create a CPU context: %s\n", vl_status_name(s));
    vl_ctx_destroy(r.ctx[CU]);
    return 1;
  }
  if (self) SIDE[CU] = "cpu (as device)";
  int ran = 0, failed = 0;
  for (size_t i = 0; i < VL_GC_NCASES; i++) {
    const vl_gc_case *c = &VL_GC_CASES[i];
    if (!selected(c, kind, word)) continue;
    vl_ctx *keep[2] = {r.ctx[0], r.ctx[1]};
    memset(&r, 0, sizeof r);
    r.ctx[0] = keep[0];
    r.ctx[1] = keep[1];
    r.cs = c;
    vl_rng_seed(&r.rng, 1000 + i); /* fixed per case: reruns see the same inputs */
    run_case(&r, c);
    double limit = self ? 0.0 : c->limit;
    bool ok = !r.bad && r.nmse <= limit;
    if (!r.bad && !ok) snprintf(r.why, sizeof r.why, "nmse above the limit %.1e", limit);
    printf("%-40s %s  nmse=%.3e  (limit %.1e)%s%s\n", c->name,
           ok ? (self ? "ok (self-test)" : "PASS") : "FAIL", r.nmse, limit, ok ? "" : "  ",
           ok ? "" : r.why);
    json_row(c, ok ? (self ? "agree" : "pass") : "fail", r.nmse, limit, ok ? NULL : r.why);
    ran++;
    failed += !ok;
  }
  int jrc = json_write(json, self ? "cpu against cpu (self-test)" : "cuda against cpu", ran, failed, 0);
  printf("gpu-check: %d cases, %d %s, %d failed (%s)\n", ran, ran - failed,
         self ? "agree" : "passed", failed,
         self ? "self-test: cpu against cpu, NOT a GPU result" : "device: cuda, reference: cpu");
  vl_ctx_destroy(r.ctx[CU]);
  vl_ctx_destroy(r.ctx[CPU]);
  if (require_gpu && ran == 0) return require_gpu_failed(0); /* WORD/--op matched nothing */
  return failed || jrc ? 1 : 0;
}
