/* Attention (vramlab/attention.h): the memory-efficient ops VL_OP_ATTN_FWD/BWD and the layer's
 * two implementations on the CPU backend, and what the planner sees of them.
 *
 *   - the ops against a double-precision reference computed here: self- and cross-attention
 *     (Tq != Tk), causal, several heads and batches, head dims off the kernels' 8/32-wide dot
 *     runs and 32-key tile, fp32/fp16/bf16 storage (the reference gets the inputs as stored);
 *   - finite-difference gradients of dq, dk, dv through the layer, both implementations,
 *     plain and causal (the objective and tolerance of test_ops.c);
 *   - classic and efficient give the same o, dq, dk, dv (fp32: normalised squared error
 *     below 1e-10, measured 4e-13; fp16/bf16: within their rounding);
 *   - results do not depend on the thread count (bit for bit);
 *   - planned peak = measured peak on the CPU, category by category, for both
 *     implementations, and at B=2, H=8, T=4096 (planned only) classic keeps exactly the
 *     2*8*4096*4096 fp16 probabilities where efficient keeps only the fp32 log-sum-exp;
 *   - bad arguments are refused with a message, by the ops and the layer, on plan contexts
 *     too, leaving nothing allocated;
 *   - the CUDA kernels' interleaved shared-memory scratch, emulated thread by thread with the
 *     launch's block size and bytes, gives the CPU backend's results bit for bit and stays
 *     inside the buffer; the launch geometry (a pure function) fits 48 KiB for every D. */
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/attn_args.h"
#include "vramlab/attention.h"
#include "vramlab/backend.h"

#define OK(expr) assert_int_equal((expr), VL_OK)
#define cx tu_cpu

typedef struct {
  int64_t B, H, Tq, Tk, D;
  bool causal;
} shp;

static int64_t nq_of(const shp *s) { return s->B * s->Tq * s->H * s->D; }
static int64_t nk_of(const shp *s) { return s->B * s->Tk * s->H * s->D; }
static int64_t nr_of(const shp *s) { return s->B * s->H * s->Tq; }
static float scale_of(const shp *s) { return 1.0f / sqrtf((float)s->D); } /* the layer's */

/* ---- the double-precision reference ------------------------------------------------------ */

/* o, lse and (when dout) dq, dk, dv of attention(q, k, v) in double. */
static void ref_attn(const shp *s, const float *q, const float *k, const float *v,
                     const float *dout, double *o, double *lse, double *dq, double *dk,
                     double *dv) {
  int64_t H = s->H, Tq = s->Tq, Tk = s->Tk, D = s->D, HD = H * D;
  double sc = scale_of(s);
  double *P = malloc(sizeof(double) * (size_t)(Tq * Tk)),
         *dS = malloc(sizeof(double) * (size_t)(Tq * Tk));
  if (dout) {
    memset(dq, 0, sizeof(double) * (size_t)nq_of(s));
    memset(dk, 0, sizeof(double) * (size_t)nk_of(s));
    memset(dv, 0, sizeof(double) * (size_t)nk_of(s));
  }
#define QI(t, i, d) ((t)[(b * Tq + (i)) * HD + h * D + (d)])
#define KJ(t, j, d) ((t)[(b * Tk + (j)) * HD + h * D + (d)])
  for (int64_t b = 0; b < s->B; b++)
    for (int64_t h = 0; h < H; h++) {
      for (int64_t i = 0; i < Tq; i++) {
        int64_t nk = s->causal ? i + 1 : Tk;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < nk; j++) {
          double x = 0;
          for (int64_t d = 0; d < D; d++) x += (double)QI(q, i, d) * KJ(k, j, d);
          P[i * Tk + j] = sc * x;
          mx = fmax(mx, sc * x);
        }
        for (int64_t j = 0; j < nk; j++) sum += exp(P[i * Tk + j] - mx);
        for (int64_t j = 0; j < Tk; j++) P[i * Tk + j] = j < nk ? exp(P[i * Tk + j] - mx) / sum : 0;
        lse[(b * H + h) * Tq + i] = mx + log(sum);
        for (int64_t d = 0; d < D; d++) {
          double acc = 0;
          for (int64_t j = 0; j < Tk; j++) acc += P[i * Tk + j] * KJ(v, j, d);
          QI(o, i, d) = acc;
        }
      }
      if (!dout) continue;
      for (int64_t i = 0; i < Tq; i++) { /* dS = P (dP - rowsum(P dP)), dP = dout v^T */
        double dot = 0;
        for (int64_t j = 0; j < Tk; j++) {
          double dp = 0;
          for (int64_t d = 0; d < D; d++) dp += (double)QI(dout, i, d) * KJ(v, j, d);
          dS[i * Tk + j] = dp;
          dot += dp * P[i * Tk + j];
        }
        for (int64_t j = 0; j < Tk; j++) dS[i * Tk + j] = P[i * Tk + j] * (dS[i * Tk + j] - dot);
      }
      for (int64_t i = 0; i < Tq; i++)
        for (int64_t j = 0; j < Tk; j++)
          for (int64_t d = 0; d < D; d++) {
            QI(dq, i, d) += sc * dS[i * Tk + j] * KJ(k, j, d);
            KJ(dk, j, d) += sc * dS[i * Tk + j] * QI(q, i, d);
            KJ(dv, j, d) += P[i * Tk + j] * QI(dout, i, d);
          }
    }
#undef QI
#undef KJ
  free(P);
  free(dS);
}

/* max |got - ref| / max |ref|: the worst element against the tensor's scale. */
static double max_err(const float *got, const double *ref, int64_t n) {
  double e = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    e = fmax(e, fabs(got[i] - ref[i]));
    m = fmax(m, fabs(ref[i]));
  }
  assert_true(m > 0);
  return e / m;
}

/* sum (a - b)^2 / sum b^2 */
static double nmse(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  assert_true(den > 0);
  return num / den;
}

/* ---- running the ops and the layer on the CPU --------------------------------------------- */

typedef struct {
  float *q, *k, *v, *dout;       /* inputs (host) */
  float *o, *lse, *dq, *dk, *dv; /* outputs (host) */
} io;

static io io_new(const shp *s, uint64_t seed) {
  int64_t nq = nq_of(s), nk = nk_of(s);
  io x = {tu_randn_new(nq, 1.5f, seed),
          tu_randn_new(nk, 1.5f, seed + 1),
          tu_randn_new(nk, 1.0f, seed + 2),
          tu_randn_new(nq, 1.0f, seed + 3),
          tu_zeros(nq),
          tu_zeros(nr_of(s)),
          tu_zeros(nq),
          tu_zeros(nk),
          tu_zeros(nk)};
  return x;
}
static void io_free(io *x) {
  float *p[] = {x->q, x->k, x->v, x->dout, x->o, x->lse, x->dq, x->dk, x->dv};
  for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
}

/* VL_OP_ATTN_FWD (and VL_OP_ATTN_BWD when bwd) with q, k, v, o, dout, dq, dk, dv stored in dt. */
static void run_ops(const shp *s, vl_dtype dt, io *x, bool bwd) {
  int64_t nq = nq_of(s), nk = nk_of(s);
  vl_tensor tq = tu_tnew(cx, dt, nq, x->q), tk = tu_tnew(cx, dt, nk, x->k),
            tv = tu_tnew(cx, dt, nk, x->v), to = tu_tnew(cx, dt, nq, NULL),
            tl = tu_tnew(cx, VL_F32, nr_of(s), NULL);
  OK(vl_attn_fwd_run(cx, &(vl_attn_fwd_args){.o = &to, .lse = &tl, .q = &tq, .k = &tk, .v = &tv,
                                             .B = s->B, .H = s->H, .Tq = s->Tq, .Tk = s->Tk,
                                             .D = s->D, .scale = scale_of(s),
                                             .causal = s->causal}));
  tu_tget(&to, x->o);
  tu_tget(&tl, x->lse);
  if (bwd) {
    vl_tensor tdo = tu_tnew(cx, dt, nq, x->dout), tdq = tu_tnew(cx, dt, nq, NULL),
              tdk = tu_tnew(cx, dt, nk, NULL), tdv = tu_tnew(cx, dt, nk, NULL);
    OK(vl_attn_bwd_run(cx, &(vl_attn_bwd_args){.dq = &tdq, .dk = &tdk, .dv = &tdv, .dout = &tdo,
                                               .o = &to, .lse = &tl, .q = &tq, .k = &tk, .v = &tv,
                                               .B = s->B, .H = s->H, .Tq = s->Tq, .Tk = s->Tk,
                                               .D = s->D, .scale = scale_of(s), .causal = s->causal,
                                               .ws = NULL, .ws_bytes = 0}));
    tu_tget(&tdq, x->dq);
    tu_tget(&tdk, x->dk);
    tu_tget(&tdv, x->dv);
    TU_TFREE(cx, &tdo, &tdq, &tdk, &tdv);
  }
  TU_TFREE(cx, &tq, &tk, &tv, &to, &tl);
}

/* The layer forward (and backward when bwd, with dout) in implementation impl. */
static void run_layer(vl_attn_impl impl, const shp *s, vl_dtype dt, io *x, bool bwd) {
  int64_t nq = nq_of(s), nk = nk_of(s);
  vl_tensor tq = tu_tnew(cx, dt, nq, x->q), tk = tu_tnew(cx, dt, nk, x->k),
            tv = tu_tnew(cx, dt, nk, x->v), to = tu_tnew(cx, dt, nq, NULL);
  vl_attn_saved sv;
  OK(vl_attention_fwd(cx, impl, &to, &tq, &tk, &tv, s->B, s->H, s->Tq, s->Tk, s->D, s->causal, bwd,
                      &sv));
  tu_tget(&to, x->o);
  if (bwd) {
    assert_true(impl == VL_ATTN_CLASSIC ? sv.P.owned && !sv.lse.owned
                                        : sv.lse.owned && !sv.P.owned);
    vl_tensor tdo = tu_tnew(cx, dt, nq, x->dout), tdq = tu_tnew(cx, dt, nq, NULL),
              tdk = tu_tnew(cx, dt, nk, NULL), tdv = tu_tnew(cx, dt, nk, NULL);
    OK(vl_attention_bwd(cx, &sv, &tdq, &tdk, &tdv, &tdo, &to, &tq, &tk, &tv));
    assert_false(sv.P.owned || sv.lse.owned); /* the backward frees what was saved */
    tu_tget(&tdq, x->dq);
    tu_tget(&tdk, x->dk);
    tu_tget(&tdv, x->dv);
    TU_TFREE(cx, &tdo, &tdq, &tdk, &tdv);
  } else {
    assert_false(sv.P.owned || sv.lse.owned); /* keep = false keeps nothing */
  }
  TU_TFREE(cx, &tq, &tk, &tv, &to);
}

/* ---- (1) the ops against the reference ---------------------------------------------------- */

static const shp SHAPES[] = {
    {2, 3, 37, 37, 40, false}, /* self-attention, SD's first level head dim */
    {2, 2, 37, 77, 64, false}, /* cross-attention to 77 text tokens */
    {1, 2, 45, 45, 24, true},  /* causal (CLIP) */
    {1, 3, 33, 65, 13, false}, /* odd: D = 13 off the dot's 8/32 runs, keys off the 32-key tile */
    {2, 1, 40, 40, 80, true},  /* causal, one head */
};
#define NSHAPES (sizeof SHAPES / sizeof *SHAPES)

static void test_ops_vs_reference(void **state) {
  (void)state;
  const vl_dtype dts[3] = {VL_F32, VL_F16, VL_BF16};
  /* max |err| / max |ref|, measured (worst over SHAPES): fp32 7e-7, fp16 9e-4, bf16 4.8e-3;
   * lse 1.3e-7. Bounds: 4 u of the storage dtype (fp32: 32 u, sums of up to 77 terms). */
  const double bound[3] = {2e-6, 2e-3, 1.6e-2};
  double worst[3] = {0, 0, 0}, worst_lse = 0;
  for (size_t si = 0; si < NSHAPES; si++) {
    const shp *s = &SHAPES[si];
    int64_t nq = nq_of(s), nk = nk_of(s), nr = nr_of(s);
    double *o = malloc(sizeof(double) * (size_t)nq), *lse = malloc(sizeof(double) * (size_t)nr);
    double *dq = malloc(sizeof(double) * (size_t)nq), *dk = malloc(sizeof(double) * (size_t)nk),
           *dv = malloc(sizeof(double) * (size_t)nk);
    for (int di = 0; di < 3; di++) {
      vl_dtype dt = dts[di];
      io x = io_new(s, 100 + si);
      run_ops(s, dt, &x, true);
      /* the reference sees the inputs as stored */
      float *qr = tu_rounded(x.q, nq, dt), *kr = tu_rounded(x.k, nk, dt),
            *vr = tu_rounded(x.v, nk, dt), *dor = tu_rounded(x.dout, nq, dt);
      ref_attn(s, qr, kr, vr, dor, o, lse, dq, dk, dv);
      double e[5] = {max_err(x.o, o, nq), max_err(x.lse, lse, nr), max_err(x.dq, dq, nq),
                     max_err(x.dk, dk, nk), max_err(x.dv, dv, nk)};
      const char *nm[5] = {"o", "lse", "dq", "dk", "dv"};
      for (int i = 0; i < 5; i++) {
        double b = i == 1 ? 1e-6 : bound[di]; /* lse is fp32 whatever the storage */
        if (i == 1)
          worst_lse = fmax(worst_lse, e[i]);
        else
          worst[di] = fmax(worst[di], e[i]);
        if (e[i] > b) {
          print_error("shape %zu %s: %s max error %.3e > %.1e\n", si, vl_dtype_name(dt), nm[i],
                      e[i], b);
          fail();
        }
      }
      free(qr);
      free(kr);
      free(vr);
      free(dor);
      io_free(&x);
    }
    free(o);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
  }
  print_message("ops vs double reference, worst max|err|/max|ref| over o, dq, dk, dv: fp32 %.2e, "
                "fp16 %.2e, bf16 %.2e; lse %.2e\n",
                worst[0], worst[1], worst[2], worst_lse);
}

/* Causal rows see only keys 0..i: changing key j (and its value) leaves o_i for i < j alone. */
static void test_causal_mask(void **state) {
  (void)state;
  shp s = {1, 2, 20, 20, 16, true};
  io a = io_new(&s, 7), b = io_new(&s, 7);
  int64_t HD = s.H * s.D, j = 12;
  for (int64_t d = 0; d < HD; d++) {
    b.k[j * HD + d] += 3.0f;
    b.v[j * HD + d] -= 2.0f;
  }
  run_ops(&s, VL_F32, &a, false);
  run_ops(&s, VL_F32, &b, false);
  assert_memory_equal(a.o, b.o, sizeof(float) * (size_t)(j * HD)); /* rows 0..j-1 */
  assert_true(a.o[j * HD] != b.o[j * HD]);
  io_free(&a);
  io_free(&b);
}

/* ---- (2) finite differences through the layer ----------------------------------------------- */

typedef struct {
  vl_attn_impl impl;
  const shp *s;
  io *x;
  float *o; /* scratch */
} fd_ctx;

static double fd_loss(void *p) { /* L = sum(dout * o): its gradient is the backward of dout */
  fd_ctx *f = p;
  io y = *f->x;
  y.o = f->o;
  run_layer(f->impl, f->s, VL_F32, &y, false);
  return tu_dot(f->x->dout, f->o, nq_of(f->s));
}

static void test_fd_gradients(void **state) {
  (void)state;
  const shp fs[2] = {{1, 2, 5, 7, 4, false}, {1, 2, 6, 6, 4, true}};
  for (int impl = 0; impl < VL_ATTN_IMPL_COUNT; impl++)
    for (int si = 0; si < 2; si++) {
      const shp *s = &fs[si];
      io x = io_new(s, 40 + si);
      run_layer((vl_attn_impl)impl, s, VL_F32, &x, true);
      fd_ctx f = {(vl_attn_impl)impl, s, &x, tu_zeros(nq_of(s))};
      char what[64];
      snprintf(what, sizeof what, "%s%s dq", vl_attn_impl_name(impl), s->causal ? " causal" : "");
      tu_fd_check(fd_loss, &f, x.q, nq_of(s), x.dq, 1e-3f, 1e-2, what);
      snprintf(what, sizeof what, "%s%s dk", vl_attn_impl_name(impl), s->causal ? " causal" : "");
      tu_fd_check(fd_loss, &f, x.k, nk_of(s), x.dk, 1e-3f, 1e-2, what);
      snprintf(what, sizeof what, "%s%s dv", vl_attn_impl_name(impl), s->causal ? " causal" : "");
      tu_fd_check(fd_loss, &f, x.v, nk_of(s), x.dv, 1e-3f, 1e-2, what);
      free(f.o);
      io_free(&x);
    }
}

/* ---- (3) classic = efficient ---------------------------------------------------------------- */

static void test_classic_equals_efficient(void **state) {
  (void)state;
  const vl_dtype dts[3] = {VL_F32, VL_F16, VL_BF16};
  /* normalised squared error sum (a - b)^2 / sum b^2 over o, dq, dk, dv. Measured (worst over
   * SHAPES): fp32 4e-13, fp16 8e-7, bf16 6e-5 (classic rounds S, P, dP and dS to the storage
   * dtype, efficient only its outputs). A wrong term is O(1). */
  const double bound[3] = {1e-10, 1e-5, 1e-3};
  double worst[3] = {0, 0, 0};
  for (size_t si = 0; si < NSHAPES; si++)
    for (int di = 0; di < 3; di++) {
      const shp *s = &SHAPES[si];
      io a = io_new(s, 200 + si), b = io_new(s, 200 + si);
      run_layer(VL_ATTN_CLASSIC, s, dts[di], &a, true);
      run_layer(VL_ATTN_EFFICIENT, s, dts[di], &b, true);
      double e[4] = {nmse(a.o, b.o, nq_of(s)), nmse(a.dq, b.dq, nq_of(s)),
                     nmse(a.dk, b.dk, nk_of(s)), nmse(a.dv, b.dv, nk_of(s))};
      for (int i = 0; i < 4; i++) {
        worst[di] = fmax(worst[di], e[i]);
        if (!(e[i] < bound[di])) {
          print_error("shape %zu %s output %d: classic vs efficient nmse %.3e >= %.1e\n", si,
                      vl_dtype_name(dts[di]), i, e[i], bound[di]);
          fail();
        }
      }
      io_free(&a);
      io_free(&b);
    }
  print_message("classic vs efficient, worst nmse: fp32 %.2e, fp16 %.2e, bf16 %.2e\n", worst[0],
                worst[1], worst[2]);
}

/* The same bits with 1 and 2 threads (rows are independent, sums in a fixed order). */
static void test_thread_independent(void **state) {
  (void)state;
  const shp *s = &SHAPES[2];
  io a = io_new(s, 9), b = io_new(s, 9);
  int nt = omp_get_max_threads();
  omp_set_num_threads(1);
  run_ops(s, VL_F16, &a, true);
  omp_set_num_threads(nt > 1 ? nt : 2);
  run_ops(s, VL_F16, &b, true);
  omp_set_num_threads(nt);
  assert_memory_equal(a.o, b.o, sizeof(float) * (size_t)nq_of(s));
  assert_memory_equal(a.lse, b.lse, sizeof(float) * (size_t)nr_of(s));
  assert_memory_equal(a.dq, b.dq, sizeof(float) * (size_t)nq_of(s));
  assert_memory_equal(a.dk, b.dk, sizeof(float) * (size_t)nk_of(s));
  assert_memory_equal(a.dv, b.dv, sizeof(float) * (size_t)nk_of(s));
  io_free(&a);
  io_free(&b);
}

/* ---- (4) planned = measured ----------------------------------------------------------------- */

typedef struct {
  vl_mem_stats after_fwd, end;
  size_t base; /* bytes the context held before (a CUDA target: the cuBLAS workspace) */
  double flops;
} mem_trace;

/* One forward (keep) and backward on c: q, k, v, dout in VL_MEM_DATA, o and the gradients
 * in VL_MEM_TEMP, so VL_MEM_ACTS holds only what the layer keeps. Inputs get values on a
 * computing context. */
static void mem_run(vl_ctx *c, vl_attn_impl impl, const shp *s, vl_dtype dt, mem_trace *m) {
  int64_t nq = nq_of(s), nk = nk_of(s);
  vl_mem_stats z0, z;
  vl_arena_stats(c->arena, &z0);
  m->base = z0.cur_total;
  vl_tensor q, k, v, dout, o, dq, dk, dv;
  OK(vl_tensor_alloc(c, &q, dt, VL_MEM_DATA, 1, &nq));
  OK(vl_tensor_alloc(c, &k, dt, VL_MEM_DATA, 1, &nk));
  OK(vl_tensor_alloc(c, &v, dt, VL_MEM_DATA, 1, &nk));
  OK(vl_tensor_alloc(c, &dout, dt, VL_MEM_DATA, 1, &nq));
  if (!c->plan) {
    vl_tensor *in[4] = {&q, &k, &v, &dout};
    for (int i = 0; i < 4; i++) {
      float *h = tu_randn_new(in[i]->n, 1.0f, 300 + i);
      for (int64_t j = 0; j < in[i]->n; j++) vl_st(in[i]->data, (int)dt, j, h[j]);
      free(h);
    }
  }
  OK(vl_tensor_alloc(c, &o, dt, VL_MEM_TEMP, 1, &nq));
  c->flops = 0;
  vl_arena_reset_peaks(c->arena);
  vl_attn_saved sv;
  OK(vl_attention_fwd(c, impl, &o, &q, &k, &v, s->B, s->H, s->Tq, s->Tk, s->D, s->causal, true,
                      &sv));
  vl_arena_stats(c->arena, &m->after_fwd);
  OK(vl_tensor_alloc(c, &dq, dt, VL_MEM_TEMP, 1, &nq));
  OK(vl_tensor_alloc(c, &dk, dt, VL_MEM_TEMP, 1, &nk));
  OK(vl_tensor_alloc(c, &dv, dt, VL_MEM_TEMP, 1, &nk));
  OK(vl_attention_bwd(c, &sv, &dq, &dk, &dv, &dout, &o, &q, &k, &v));
  vl_arena_stats(c->arena, &m->end);
  m->flops = c->flops;
  TU_TFREE(c, &dv, &dk, &dq, &o, &dout, &v, &k, &q);
  vl_arena_stats(c->arena, &z);
  assert_int_equal(z.cur_total, z0.cur_total);
  assert_int_equal(z.n_bad_free, 0);
}

static void assert_same_mem(const vl_mem_stats *a, const vl_mem_stats *b) {
  assert_int_equal(a->peak_total, b->peak_total);
  assert_int_equal(a->cur_total, b->cur_total);
  assert_memory_equal(a->peak, b->peak, sizeof a->peak);
  assert_memory_equal(a->at_peak, b->at_peak, sizeof a->at_peak);
  assert_memory_equal(a->cur, b->cur, sizeof a->cur);
}

static size_t aligned(size_t n) {
  return (n + VL_ARENA_ALIGN - 1) / VL_ARENA_ALIGN * VL_ARENA_ALIGN;
}

static void test_plan_equals_measured(void **state) {
  (void)state;
  const shp ps[2] = {{2, 2, 33, 77, 40, false}, {1, 3, 50, 50, 24, true}};
  const vl_dtype dts[2] = {VL_F32, VL_F16}; /* fp16: the CPU GEMMs' conversion workspace too */
  for (int impl = 0; impl < VL_ATTN_IMPL_COUNT; impl++)
    for (int si = 0; si < 2; si++)
      for (int di = 0; di < 2; di++) {
        const shp *s = &ps[si];
        vl_ctx *c, *p;
        OK(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP));
        OK(vl_ctx_create_ex(&p, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CPU));
        mem_trace mc, mp;
        mem_run(c, (vl_attn_impl)impl, s, dts[di], &mc);
        mem_run(p, (vl_attn_impl)impl, s, dts[di], &mp);
        assert_same_mem(&mc.after_fwd, &mp.after_fwd);
        assert_same_mem(&mc.end, &mp.end);
        assert_true(mc.flops == mp.flops && mc.flops > 0);
        /* what the forward kept: P (B, H, Tq, Tk) in the dtype, or lse (B, H, Tq) fp32 */
        size_t keep = impl == VL_ATTN_CLASSIC
                          ? aligned(vl_dtype_bytes(dts[di], s->B * s->H * s->Tq * s->Tk))
                          : aligned(sizeof(float) * (size_t)nr_of(s));
        assert_int_equal(mc.after_fwd.cur[VL_MEM_ACTS], keep);
        assert_int_equal(mc.end.cur[VL_MEM_ACTS], 0); /* the backward freed it */
        assert_int_equal(mc.end.cur[VL_MEM_WORKSPACE], 0);
        vl_ctx_destroy(c);
        vl_ctx_destroy(p);
      }
}

/* SD's 64x64 latents: 4096 tokens, 8 heads of 40, batch 2, fp16. Planned only. */
static void test_plan_sees_the_gigabytes(void **state) {
  (void)state;
  const shp s = {2, 8, 4096, 4096, 40, false};
  mem_trace m[VL_ATTN_IMPL_COUNT];
  for (int impl = 0; impl < VL_ATTN_IMPL_COUNT; impl++) {
    vl_ctx *p;
    OK(vl_ctx_create_ex(&p, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CUDA));
    double t0 = vl_now();
    mem_run(p, (vl_attn_impl)impl, &s, VL_F16, &m[impl]);
    assert_true(vl_now() - t0 < 1.0); /* nothing computed */
    vl_ctx_destroy(p);
  }
  const size_t P = (size_t)2 * 8 * 4096 * 4096 * 2; /* 512 MiB of fp16 probabilities */
  const size_t lse = (size_t)2 * 8 * 4096 * 4;      /* 256 KiB of fp32 log-sum-exp */
  size_t ca = m[VL_ATTN_CLASSIC].after_fwd.cur[VL_MEM_ACTS];
  size_t ea = m[VL_ATTN_EFFICIENT].after_fwd.cur[VL_MEM_ACTS];
  assert_int_equal(ca, P);
  assert_int_equal(ea, lse);
  assert_int_equal(m[VL_ATTN_CLASSIC].end.peak[VL_MEM_ACTS] -
                       m[VL_ATTN_EFFICIENT].end.peak[VL_MEM_ACTS],
                   P - lse);
  /* the classic backward holds P and dP at once: its peak is at least 2 P above the inputs */
  size_t data = m[0].end.peak[VL_MEM_DATA], base = m[0].base;
  assert_true(m[VL_ATTN_CLASSIC].end.peak_total >= base + data + 2 * P);
  assert_true(m[VL_ATTN_EFFICIENT].end.peak_total < base + data + P / 16);
  /* the same model FLOPs (non-causal): 4D + 5 a score forward, 8D + 5 backward */
  assert_true(m[0].flops == m[1].flops);
  assert_true(m[0].flops == (double)(2 * 8) * 4096.0 * 4096.0 * (12.0 * 40 + 10));
  char b1[32], b2[32];
  print_message("B=2 H=8 T=4096 D=40 fp16, planned: acts classic %s, efficient %s; peak %s vs %s\n",
                vl_fmt_bytes(ca, b1, sizeof b1), vl_fmt_bytes(ea, b2, sizeof b2),
                vl_fmt_bytes(m[0].end.peak_total, (char[32]){0}, 32),
                vl_fmt_bytes(m[1].end.peak_total, (char[32]){0}, 32));
}

/* ---- (5) bad arguments ---------------------------------------------------------------------- */

/* status VL_ERR_INVALID and a message containing `want`. */
static void assert_refused(vl_ctx *c, vl_status s, const char *want) {
  if (s != VL_ERR_INVALID || !strstr(c->err, want)) {
    print_error("expected VL_ERR_INVALID with \"%s\", got %s: \"%s\"\n", want, vl_status_name(s),
                c->err);
    fail();
  }
}

static void refusals_on(vl_ctx *c) {
  vl_mem_stats before, after;
  vl_arena_stats(c->arena, &before);
  const int64_t B = 1, H = 2, T = 6, Tk = 9, D = 8, n = B * T * H * D, nk = B * Tk * H * D;
  vl_tensor q, k, v, o, small;
  OK(vl_tensor_alloc(c, &q, VL_F32, VL_MEM_DATA, 1, &n));
  OK(vl_tensor_alloc(c, &k, VL_F32, VL_MEM_DATA, 1, &nk));
  OK(vl_tensor_alloc(c, &v, VL_F32, VL_MEM_DATA, 1, &nk));
  OK(vl_tensor_alloc(c, &o, VL_F32, VL_MEM_DATA, 1, &n));
  int64_t ns = n - 1;
  OK(vl_tensor_alloc(c, &small, VL_F32, VL_MEM_DATA, 1, &ns));
  vl_mem_stats mid;
  vl_arena_stats(c->arena, &mid);
  vl_attn_saved sv;
  for (int impl = 0; impl < VL_ATTN_IMPL_COUNT; impl++) {
    vl_attn_impl im = (vl_attn_impl)impl;
    /* causal with 6 queries and 9 keys */
    assert_refused(c, vl_attention_fwd(c, im, &o, &q, &k, &v, B, H, T, Tk, D, true, true, &sv),
                   "causal attention needs as many queries as keys (Tq 6, Tk 9)");
    assert_false(sv.P.owned || sv.lse.owned);
    /* q one element short */
    assert_refused(c, vl_attention_fwd(c, im, &o, &small, &k, &v, B, H, T, Tk, D, false, true, &sv),
                   "q holds 95 elements, the sizes need 96");
    /* k sized for fewer keys than Tk */
    assert_refused(c, vl_attention_fwd(c, im, &o, &q, &k, &v, B, H, T, Tk + 1, D, false, true, &sv),
                   "k holds 144 elements, the sizes need 160");
    assert_refused(c, vl_attention_fwd(c, im, &small, &q, &k, &v, B, H, T, Tk, D, false, true, &sv),
                   "o holds 95");
    assert_refused(c, vl_attention_fwd(c, im, &o, &q, &k, &v, B, H, T, Tk, 0, false, true, &sv),
                   "must all be >= 1");
    assert_refused(c, vl_attention_fwd(c, im, &o, &q, &k, &v, B, H, T, Tk, 600, false, true, &sv),
                   "head dim D 600 above the supported 512");
    assert_refused(c, vl_attention_fwd(c, im, &o, &q, &k, &v, B, H, T, Tk, D, false, true, NULL),
                   "keep without a place");
    /* a backward without a kept forward */
    OK(vl_attention_fwd(c, im, &o, &q, &k, &v, B, H, T, Tk, D, false, false, &sv));
    assert_refused(c, vl_attention_bwd(c, &sv, &o, &k, &v, &q, &o, &q, &k, &v), "kept nothing");
    /* gradients over the inputs (dk over k), refused, and the saved state still freed */
    OK(vl_attention_fwd(c, im, &o, &q, &k, &v, B, H, T, Tk, D, false, true, &sv));
    vl_tensor dq, dk, dv, dout;
    OK(vl_tensor_alloc(c, &dq, VL_F32, VL_MEM_TEMP, 1, &n));
    OK(vl_tensor_alloc(c, &dv, VL_F32, VL_MEM_TEMP, 1, &nk));
    OK(vl_tensor_alloc(c, &dout, VL_F32, VL_MEM_TEMP, 1, &n));
    dk = k;
    dk.owned = false;
    vl_status st = vl_attention_bwd(c, &sv, &dq, &dk, &dv, &dout, &o, &q, &k, &v);
    if (c->plan)
      OK(st); /* no storage on a plan context: nothing to overlap */
    else
      assert_refused(c, st, "dk overlaps k");
    assert_false(sv.P.owned || sv.lse.owned);
    TU_TFREE(c, &dout, &dv, &dq);
    vl_arena_stats(c->arena, &after);
    assert_int_equal(after.cur_total, mid.cur_total); /* nothing left behind */
  }
  assert_int_equal(vl_attn_impl_parse("flash", &(vl_attn_impl){0}), -1);
  assert_refused(
      c, vl_attention_fwd(c, (vl_attn_impl)7, &o, &q, &k, &v, B, H, T, Tk, D, false, false, NULL),
      "implementation 7");
  TU_TFREE(c, &small, &o, &v, &k, &q);
  vl_arena_stats(c->arena, &after);
  assert_int_equal(after.cur_total, before.cur_total);
}

static void test_bad_arguments(void **state) {
  (void)state;
  refusals_on(cx);
  vl_ctx *p;
  OK(vl_ctx_create_ex(&p, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CPU));
  refusals_on(p);
  vl_ctx_destroy(p);

  /* the ops themselves (what a backend checks, CUDA the same) */
  shp s = {1, 2, 5, 7, 8, false};
  int64_t nq = nq_of(&s), nk = nk_of(&s), nr = nr_of(&s);
  vl_tensor q = tu_tnew(cx, VL_F32, nq, NULL), k = tu_tnew(cx, VL_F32, nk, NULL),
            v = tu_tnew(cx, VL_F32, nk, NULL), o = tu_tnew(cx, VL_F32, nq, NULL),
            l16 = tu_tnew(cx, VL_F16, nr, NULL), l = tu_tnew(cx, VL_F32, nr, NULL),
            dq = tu_tnew(cx, VL_F32, nq, NULL), dk = tu_tnew(cx, VL_F32, nk, NULL),
            dv = tu_tnew(cx, VL_F32, nk, NULL), i32 = tu_tnew(cx, VL_F32, nk, NULL);
  i32.dtype = VL_I32;
  float sc = scale_of(&s);
  assert_refused(
      cx, vl_attn_fwd_run(cx, &(vl_attn_fwd_args){.o = &o, .lse = &l16, .q = &q, .k = &k, .v = &v,
                                                  .B = 1, .H = 2, .Tq = 5, .Tk = 7, .D = 8,
                                                  .scale = sc, .causal = false}),
      "attn_fwd: lse is fp16, fp32 expected");
  assert_refused(
      cx, vl_attn_fwd_run(cx, &(vl_attn_fwd_args){.o = &o, .lse = &l, .q = &q, .k = &i32, .v = &v,
                                                  .B = 1, .H = 2, .Tq = 5, .Tk = 7, .D = 8,
                                                  .scale = sc, .causal = false}),
      "attn_fwd: k is i32");
  assert_refused(
      cx, vl_attn_fwd_run(cx, &(vl_attn_fwd_args){.o = &o, .lse = &l, .q = &q, .k = &k, .v = &v,
                                                  .B = 1, .H = 2, .Tq = 5, .Tk = 7, .D = 8,
                                                  .scale = sc, .causal = true}),
      "attn_fwd: causal attention needs as many queries as keys (Tq 5, Tk 7)");
  assert_refused(
      cx, vl_attn_fwd_run(cx, &(vl_attn_fwd_args){.o = &q, .lse = &l, .q = &q, .k = &k, .v = &v,
                                                  .B = 1, .H = 2, .Tq = 5, .Tk = 7, .D = 8,
                                                  .scale = sc, .causal = false}),
      "attn_fwd: o overlaps q");
  assert_refused(
      cx, vl_attn_fwd_run(cx, &(vl_attn_fwd_args){.o = &o, .lse = &l, .q = &q, .k = &k, .v = &v,
                                                  .B = 1, .H = 2, .Tq = 5, .Tk = 7, .D = 8,
                                                  .scale = NAN, .causal = false}),
      "scale nan is not finite");
  assert_refused(cx,
                 vl_attn_bwd_run(cx, &(vl_attn_bwd_args){.dq = &o, .dk = &dk, .dv = &dv, .dout = &q,
                                                         .o = &o, .lse = &l, .q = &q, .k = &k,
                                                         .v = &v, .B = 1, .H = 2, .Tq = 5, .Tk = 7,
                                                         .D = 8, .scale = sc, .causal = false,
                                                         .ws = NULL, .ws_bytes = 0}),
                 "attn_bwd: dq overlaps o");
  assert_refused(cx,
                 vl_attn_bwd_run(cx, &(vl_attn_bwd_args){.dq = &dq, .dk = &dq, .dv = &dv,
                                                         .dout = &o, .o = &o, .lse = &l, .q = &q,
                                                         .k = &k, .v = &v, .B = 1, .H = 2, .Tq = 5,
                                                         .Tk = 7, .D = 8, .scale = sc,
                                                         .causal = false, .ws = NULL,
                                                         .ws_bytes = 0}),
                 "attn_bwd: dk holds 80 elements, the sizes need 112");
  float ws[4];
  assert_refused(cx,
                 vl_attn_bwd_run(cx, &(vl_attn_bwd_args){.dq = &dq, .dk = &dk, .dv = &dv,
                                                         .dout = &q, .o = &o, .lse = &l, .q = &q,
                                                         .k = &k, .v = &v, .B = 1, .H = 2, .Tq = 5,
                                                         .Tk = 7, .D = 8, .scale = sc,
                                                         .causal = false, .ws = ws,
                                                         .ws_bytes = sizeof ws}),
                 "attn_bwd: workspace 16 bytes");
  TU_TFREE(cx, &q, &k, &v, &o, &l16, &l, &dq, &dk, &dv, &i32);
}

/* ---- the CUDA kernels' scratch layout, emulated on the CPU ----------------------------------- */

/* cuda_attn.cu runs the same bodies with each thread's scratch interleaved in shared memory
 * (element x of thread t at sh[x * threads + t]) and the block size of vl_attn_cuda_threads.
 * Emulated here thread by thread (their scratch is disjoint) with a shared buffer of exactly
 * the bytes the launch asks for plus a canary: the results must be the CPU backend's, bit for
 * bit, and nothing may be written past the buffer. */
#define CANARY 64
static float *emu_smem(int64_t floats, int *threads) {
  *threads = vl_attn_cuda_threads(floats);
  size_t n = (size_t)*threads * (size_t)floats;
  float *sh = malloc(sizeof(float) * (n + CANARY));
  for (size_t i = 0; i < n + CANARY; i++) sh[i] = (float)i + 0.5f;
  return sh;
}
static void emu_check(float *sh, int threads, int64_t floats) {
  size_t n = (size_t)threads * (size_t)floats;
  for (size_t i = n; i < n + CANARY; i++) assert_true(sh[i] == (float)i + 0.5f);
  free(sh);
}

static void test_cuda_scratch_layout(void **state) {
  (void)state;
  const shp es[3] = {
      {2, 2, 37, 77, 40, false}, {1, 2, 45, 45, 24, true}, {1, 1, 20, 33, 160, false}};
  const vl_dtype dts[2] = {VL_F32, VL_F16};
  for (int si = 0; si < 3; si++)
    for (int di = 0; di < 2; di++) {
      const shp *s = &es[si];
      vl_dtype dt = dts[di];
      int d = (int)dt;
      int64_t nq = nq_of(s), nk = nk_of(s), nr = nr_of(s), krows = s->B * s->H * s->Tk;
      io ref = io_new(s, 60 + si);
      run_ops(s, dt, &ref, true);
      vl_k_attn_dims kd = {s->H, s->Tq, s->Tk, s->D, scale_of(s), s->causal};
      vl_tensor q = tu_tnew(cx, dt, nq, ref.q), k = tu_tnew(cx, dt, nk, ref.k),
                v = tu_tnew(cx, dt, nk, ref.v), dout = tu_tnew(cx, dt, nq, ref.dout),
                o = tu_tnew(cx, dt, nq, NULL), dq = tu_tnew(cx, dt, nq, NULL),
                dk = tu_tnew(cx, dt, nk, NULL), dv = tu_tnew(cx, dt, nk, NULL);
      float *lse = tu_zeros(nr), *delta = tu_zeros(nr), *got = tu_zeros(nq > nk ? nq : nk);
      int T;
      int64_t f = VL_K_ATTN_WS_FWD(s->D);
      float *sh = emu_smem(f, &T);
      for (int t = 0; t < T; t++)
        for (int64_t r = t; r < nr; r += T)
          vl_k_attn_fwd_row(o.data, d, lse, q.data, d, k.data, d, v.data, d, kd, sh + t, T, r);
      emu_check(sh, T, f);
      tu_tget(&o, got);
      assert_memory_equal(got, ref.o, sizeof(float) * (size_t)nq);
      assert_memory_equal(lse, ref.lse, sizeof(float) * (size_t)nr);
      for (int64_t r = 0; r < nr; r++) vl_k_attn_delta_row(delta, dout.data, d, o.data, d, kd, r);
      f = VL_K_ATTN_WS_DQ(s->D);
      sh = emu_smem(f, &T);
      for (int t = 0; t < T; t++)
        for (int64_t r = t; r < nr; r += T)
          vl_k_attn_dq_row(dq.data, d, dout.data, d, lse, delta, q.data, d, k.data, d, v.data, d,
                           kd, sh + t, T, r);
      emu_check(sh, T, f);
      f = VL_K_ATTN_WS_DKDV(s->D);
      sh = emu_smem(f, &T);
      for (int t = 0; t < T; t++)
        for (int64_t r = t; r < krows; r += T)
          vl_k_attn_dkdv_row(dk.data, d, dv.data, d, dout.data, d, lse, delta, q.data, d, k.data, d,
                             v.data, d, kd, sh + t, T, r);
      emu_check(sh, T, f);
      tu_tget(&dq, got);
      assert_memory_equal(got, ref.dq, sizeof(float) * (size_t)nq);
      tu_tget(&dk, got);
      assert_memory_equal(got, ref.dk, sizeof(float) * (size_t)nk);
      tu_tget(&dv, got);
      assert_memory_equal(got, ref.dv, sizeof(float) * (size_t)nk);
      TU_TFREE(cx, &q, &k, &v, &dout, &o, &dq, &dk, &dv);
      free(lse);
      free(delta);
      free(got);
      io_free(&ref);
    }
}

/* ---- names and the CUDA launch geometry ------------------------------------------------------ */

static void test_names_and_geometry(void **state) {
  (void)state;
  for (int i = 0; i < VL_ATTN_IMPL_COUNT; i++) {
    vl_attn_impl got;
    assert_int_equal(vl_attn_impl_parse(vl_attn_impl_name((vl_attn_impl)i), &got), 0);
    assert_int_equal(got, i);
  }
  assert_string_equal(vl_attn_impl_name(VL_ATTN_EFFICIENT), "efficient");
  assert_string_equal(vl_attn_impl_name(VL_ATTN_IMPL_COUNT), "?");
  for (int64_t D = 1; D <= VL_K_ATTN_DMAX; D++) {
    int64_t need[3] = {VL_K_ATTN_WS_FWD(D), VL_K_ATTN_WS_DQ(D), VL_K_ATTN_WS_DKDV(D)};
    for (int i = 0; i < 3; i++) {
      assert_true(need[i] <= VL_K_ATTN_WS(D));
      int t = vl_attn_cuda_threads(need[i]);
      assert_true(t >= 1 && t <= VL_ATTN_MAX_THREADS);
      assert_true(t < 32 || t % 32 == 0);
      assert_true((size_t)t * (size_t)need[i] * sizeof(float) <= VL_ATTN_SMEM);
    }
  }
  assert_int_equal(vl_attn_cuda_threads(VL_K_ATTN_WS_FWD(40)), 96); /* 112 floats: 109 fit */
  assert_int_equal(vl_attn_cuda_threads(VL_K_ATTN_WS_DKDV(512)), 6);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ops_vs_reference),
      cmocka_unit_test(test_causal_mask),
      cmocka_unit_test(test_fd_gradients),
      cmocka_unit_test(test_classic_equals_efficient),
      cmocka_unit_test(test_thread_independent),
      cmocka_unit_test(test_plan_equals_measured),
      cmocka_unit_test(test_plan_sees_the_gigabytes),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_cuda_scratch_layout),
      cmocka_unit_test(test_names_and_geometry),
  };
  return cmocka_run_group_tests(tests, tu_cpu_setup, tu_cpu_teardown);
}
