/* The CPU backend's faster loops against the single-source kernels they are built from, and
 * the thread policy (engine/backend/cpu/cpu_par.c).
 *
 * 1. Same values as the kernels' own formulation (the one the CUDA backend runs), bit for
 *    bit: RoPE with each (t, d) angle computed once; the embedding's dwte summed by blocks
 *    of columns row by row; bilinear upsampling with tabled sources and weights; softmax,
 *    cross-entropy and per-pixel cross-entropy keeping each exp of an fp32 row in place
 *    instead of computing it twice (against the two-exp formula they had); RMSNorm's dx.
 *    RMSNorm's dw, summed by blocks of columns too, within the bound of a fused
 *    multiply-add per term (see test_rmsnorm_bwd).
 * 2. No result depends on the number of threads that ran it: every op above plus GEMM
 *    slices, sum of squares, AdamW and Adafactor give the same bytes on 1, 2 and 3 threads
 *    (vl_cpu_threads_force), so the measured fork policy changes only the speed.
 * 3. The policy: loops under the floor never fork; a measured wait at the join keeps
 *    loops whose saving is smaller serial and lets larger ones fork; the wait decays back;
 *    right after a library's own region (oneDNN) loops fork, for a short while only. */
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_internal.h"
#include "kernels/attn.h"
#include "kernels/embed.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/pool.h"

#define OK(expr) assert_int_equal((expr), VL_OK)
#define cx tu_cpu

/* Runs an op on fresh copies of its inputs and writes its outputs' bytes to out (*n). */
typedef void (*op_fn)(void *ctx, void *out, size_t *n);

/* Runs fn on 1, 2 and 3 threads and asserts identical output bytes; returns the 1-thread
 * output (malloc'd) for further checks. */
static void *same_on_any_threads(op_fn fn, void *ctx, const char *what) {
  int saved = omp_get_max_threads();
  omp_set_num_threads(3); /* the team: slices are fixed by it, forks take 1..3 of it */
  void *ref = NULL;
  size_t nref = 0;
  for (int t = 1; t <= 3; t++) {
    size_t n = 0;
    void *out = malloc(1 << 22);
    vl_cpu_threads_force(t);
    fn(ctx, out, &n);
    vl_cpu_threads_force(0);
    if (!ref) {
      ref = out;
      nref = n;
      continue;
    }
    assert_int_equal(n, nref);
    if (memcmp(ref, out, n)) {
      print_error("%s: %d threads differ from 1 thread\n", what, t);
      fail();
    }
    free(out);
  }
  omp_set_num_threads(saved);
  return ref;
}

static void assert_bits(const void *got, const void *want, size_t n, const char *what) {
  if (memcmp(got, want, n)) {
    const uint8_t *a = got, *b = want;
    size_t i = 0;
    while (a[i] == b[i]) i++;
    print_error("%s: byte %zu differs from the kernel's formulation\n", what, i);
    fail();
  }
}

/* ---- RoPE ---------------------------------------------------------------------------- */

enum { RB = 3, RT = 37, RH = 5, RD = 24 };
typedef struct { const float *x; vl_dtype dt; bool inverse; } rope_ctx;

static void rope_run(void *p, void *out, size_t *n) {
  const rope_ctx *k = p;
  vl_tensor t = tu_tnew(cx, k->dt, RB * RT * RH * RD, k->x);
  OK(vl_rope_run(cx, &(vl_rope_args){.x = &t, .B = RB, .T = RT, .H = RH, .D = RD, .theta = 10000.0f,
                                     .inverse = k->inverse}));
  memcpy(out, t.data, t.bytes);
  *n = t.bytes;
  TU_TFREE(cx, &t);
}

static void test_rope(void **state) {
  (void)state;
  int64_t n = RB * RT * RH * RD;
  float *x = tu_randn_new(n, 1.0f, 10);
  for (int d = 0; d < 2; d++)
    for (int inv = 0; inv < 2; inv++) {
      rope_ctx k = {x, d ? VL_F16 : VL_F32, inv};
      void *got = same_on_any_threads(rope_run, &k, "rope");
      vl_tensor ref = tu_tnew(cx, k.dt, n, x);
      for (int64_t i = 0; i < n / 2; i++)
        vl_k_rope(ref.data, (int)k.dt, RT, RH, RD, 10000.0f, inv, i);
      assert_bits(got, ref.data, ref.bytes, "rope");
      TU_TFREE(cx, &ref);
      free(got);
    }
  free(x);
}

/* ---- RMSNorm backward (dx and dw), embedding backward ---------------------------------- */

enum { NR = 300, NC = 70, NV = 50 };
typedef struct { const float *x, *w, *dy, *rstd, *dx0, *dw0; vl_dtype dt; } rms_ctx;

static void rms_run(void *p, void *out, size_t *n) {
  const rms_ctx *k = p;
  vl_tensor x = tu_tnew(cx, k->dt, NR * NC, k->x), w = tu_tnew(cx, k->dt, NC, k->w),
            dy = tu_tnew(cx, k->dt, NR * NC, k->dy), rs = tu_tnew(cx, VL_F32, NR, k->rstd),
            dx = tu_tnew(cx, k->dt, NR * NC, k->dx0), dw = tu_tnew(cx, VL_F32, NC, k->dw0);
  OK(vl_rmsnorm_bwd_run(cx, &(vl_rmsnorm_bwd_args){.dx = &dx, .dw = &dw, .dout = &dy, .x = &x,
                                                   .w = &w, .rstd = &rs, .R = NR, .C = NC}));
  memcpy(out, dx.data, dx.bytes);
  memcpy((char *)out + dx.bytes, dw.data, dw.bytes);
  *n = dx.bytes + dw.bytes;
  TU_TFREE(cx, &x, &w, &dy, &rs, &dx, &dw);
}

static void test_rmsnorm_bwd(void **state) {
  (void)state;
  float *x = tu_randn_new(NR * NC, 1.0f, 20), *w = tu_randn_new(NC, 1.0f, 21),
        *dy = tu_randn_new(NR * NC, 1.0f, 22), *rstd = tu_randn_new(NR, 0.5f, 23),
        *dx0 = tu_randn_new(NR * NC, 1.0f, 24), *dw0 = tu_randn_new(NC, 1.0f, 25);
  for (int d = 0; d < 2; d++) {
    rms_ctx k = {x, w, dy, rstd, dx0, dw0, d ? VL_BF16 : VL_F32};
    void *got = same_on_any_threads(rms_run, &k, "rmsnorm_bwd");
    vl_tensor tx = tu_tnew(cx, k.dt, NR * NC, x), tw = tu_tnew(cx, k.dt, NC, w),
              tdy = tu_tnew(cx, k.dt, NR * NC, dy), rs = tu_tnew(cx, VL_F32, NR, rstd),
              dx = tu_tnew(cx, k.dt, NR * NC, dx0), dw = tu_tnew(cx, VL_F32, NC, dw0);
    /* the dtype as a constant for fp32, as the backend calls them (the same contractions) */
    if (k.dt == VL_F32) {
      for (int64_t r = 0; r < NR; r++)
        vl_k_rmsnorm_bwd_row(dx.data, VL_K_F32, tdy.data, VL_K_F32, tx.data, VL_K_F32, tw.data,
                             VL_K_F32, rs.data, NC, r);
      for (int64_t c = 0; c < NC; c++)
        vl_k_rmsnorm_dw_col(dw.data, VL_K_F32, tdy.data, VL_K_F32, tx.data, VL_K_F32, rs.data,
                            NR, NC, c);
    } else {
      int dt = (int)k.dt;
      for (int64_t r = 0; r < NR; r++)
        vl_k_rmsnorm_bwd_row(dx.data, dt, tdy.data, dt, tx.data, dt, tw.data, dt, rs.data, NC, r);
      for (int64_t c = 0; c < NC; c++)
        vl_k_rmsnorm_dw_col(dw.data, VL_K_F32, tdy.data, dt, tx.data, dt, rs.data, NR, NC, c);
    }
    assert_bits(got, dx.data, dx.bytes, "rmsnorm_bwd dx");
    /* dw: the same terms summed in the same order, but the compiler may fuse a term's last
     * multiply with the add (an FMA) in one place and not the other, which moves each step
     * by at most an ulp of its term: |got - want| <= 2 R 2^-24 sum|term| + 2^-24 |want|. */
    const float *gw = (const float *)((const char *)got + dx.bytes), *ww = dw.data;
    for (int64_t c = 0; c < NC; c++) {
      double mag = 0;
      for (int64_t r = 0; r < NR; r++)
        mag += fabs((double)vl_k_rmsnorm_dw_term(tdy.data, (int)k.dt, tx.data, (int)k.dt,
                                                 rs.data, NC, r, c));
      double tol = 2.0 * NR * 0x1p-24 * mag + 0x1p-24 * fabs(ww[c]);
      if (!(fabs((double)gw[c] - ww[c]) <= tol)) {
        print_error("rmsnorm_bwd dw[%lld] = %.9g, the column kernel %.9g (tolerance %.3g)\n",
                    (long long)c, gw[c], ww[c], tol);
        fail();
      }
    }
    TU_TFREE(cx, &tx, &tw, &tdy, &rs, &dx, &dw);
    free(got);
  }
  free(x); free(w); free(dy); free(rstd); free(dx0); free(dw0);
}

typedef struct { const float *dout, *dw0; const int32_t *tok; } emb_ctx;

static vl_tensor ids(const int32_t *p, int64_t n) {
  vl_tensor t;
  memset(&t, 0, sizeof t);
  vl_tensor_set_shape(&t, VL_I32, 1, &n);
  t.device = VL_DEV_CPU;
  t.data = (void *)p;
  return t;
}

static void emb_run(void *p, void *out, size_t *n) {
  const emb_ctx *k = p;
  vl_tensor dw = tu_tnew(cx, VL_F32, NV * NC, k->dw0), dout = tu_tnew(cx, VL_F32, NR * NC, k->dout);
  vl_tensor tok = ids(k->tok, NR);
  OK(vl_embed_bwd_run(cx, &(vl_embed_bwd_args){.dwte = &dw, .dout = &dout, .tok = &tok, .R = NR,
                                               .C = NC}));
  memcpy(out, dw.data, dw.bytes);
  *n = dw.bytes;
  TU_TFREE(cx, &dw, &dout);
}

static void test_embed_bwd(void **state) {
  (void)state;
  float *dout = tu_randn_new(NR * NC, 1.0f, 30), *dw0 = tu_randn_new(NV * NC, 1.0f, 31);
  int32_t tok[NR];
  for (int i = 0; i < NR; i++) tok[i] = (i * 7 + i / 3) % NV; /* repeated ids: real sums */
  emb_ctx k = {dout, dw0, tok};
  float *got = same_on_any_threads(emb_run, &k, "embed_bwd");
  float *want = malloc(NV * NC * sizeof(float));
  memcpy(want, dw0, NV * NC * sizeof(float));
  for (int64_t c = 0; c < NC; c++)
    vl_k_embed_bwd_col(want, VL_K_F32, dout, VL_K_F32, tok, NR, NC, c);
  assert_bits(got, want, NV * NC * sizeof(float), "embed_bwd");
  free(got); free(want); free(dout); free(dw0);
}

/* ---- softmax and cross-entropies: one exp per element ------------------------------- */

/* The formulas as they were: exp computed in the sum and again in the output pass. */
static void softmax_two_exp(float *P, const float *S, int64_t T, float scale, int causal,
                            int64_t r) {
  int64_t q = causal ? r % T : T - 1, base = r * T;
  float mx = -INFINITY;
  for (int64_t c = 0; c <= q; c++) { float v = scale * S[base + c]; mx = v > mx ? v : mx; }
  float sum = 0.0f;
  for (int64_t c = 0; c <= q; c++) sum += expf(scale * S[base + c] - mx);
  float inv = 1.0f / sum;
  for (int64_t c = 0; c <= q; c++) P[base + c] = expf(scale * S[base + c] - mx) * inv;
  for (int64_t c = q + 1; c < T; c++) P[base + c] = 0.0f;
}

static void xent_two_exp(float *l, float *loss, const int32_t *tgt, int64_t V, float s,
                         int64_t r, int64_t stride) {
  /* row r: elements l[base + c * stride] (stride 1: a row of V; HW: a pixel's classes) */
  int64_t base = stride == 1 ? r * V : (r / stride) * V * stride + r % stride;
  int32_t t = tgt[r];
  if (t < 0) {
    loss[r] = 0.0f;
    for (int64_t c = 0; c < V; c++) l[base + c * stride] = 0.0f;
    return;
  }
  float mx = -INFINITY;
  for (int64_t c = 0; c < V; c++) { float v = l[base + c * stride]; mx = v > mx ? v : mx; }
  float sum = 0.0f;
  for (int64_t c = 0; c < V; c++) sum += expf(l[base + c * stride] - mx);
  loss[r] = logf(sum) + mx - l[base + (int64_t)t * stride];
  float inv = 1.0f / sum;
  for (int64_t c = 0; c < V; c++) {
    float p = expf(l[base + c * stride] - mx) * inv;
    l[base + c * stride] = s * (p - (c == t ? 1.0f : 0.0f));
  }
}

enum { SR = 96, ST = 40, XV = 333, PK = 5, PHW = 150, PN = 2 };
typedef struct { const float *x; int causal; } sm_ctx;

static void sm_run(void *p, void *out, size_t *n) {
  const sm_ctx *k = p;
  vl_tensor t = tu_tnew(cx, VL_F32, SR * ST, k->x); /* in place, as the models call it */
  OK(vl_softmax_fwd_run(cx, &(vl_softmax_fwd_args){.P = &t, .S = &t, .rows = SR, .T = ST,
                                                   .scale = 0.3f, .causal = k->causal}));
  memcpy(out, t.data, t.bytes);
  *n = t.bytes;
  TU_TFREE(cx, &t);
}

typedef struct { const float *x; const int32_t *tgt; bool pix; } xe_ctx;

static void xe_run(void *p, void *out, size_t *n) {
  const xe_ctx *k = p;
  int64_t rows = k->pix ? PN * PHW : SR, nl = k->pix ? PN * PK * PHW : SR * XV;
  vl_tensor l = tu_tnew(cx, VL_F32, nl, k->x), loss = tu_tnew(cx, VL_F32, rows, NULL);
  vl_tensor tgt = ids(k->tgt, rows);
  if (k->pix)
    OK(vl_xent_pix_run(cx, &(vl_xent_pix_args){.logits = &l, .loss = &loss, .tgt = &tgt, .N = PN,
                                               .K = PK, .HW = PHW, .dloss_scale = 0.01f}));
  else
    OK(vl_xent_fused_run(cx, &(vl_xent_fused_args){.logits = &l, .loss = &loss, .tgt = &tgt,
                                                   .R = SR, .V = XV, .dloss_scale = 0.01f}));
  memcpy(out, l.data, l.bytes);
  memcpy((char *)out + l.bytes, loss.data, loss.bytes);
  *n = l.bytes + loss.bytes;
  TU_TFREE(cx, &l, &loss);
}

static void test_one_exp(void **state) {
  (void)state;
  float *x = tu_randn_new(SR * XV, 3.0f, 40), *want = malloc(SR * XV * sizeof(float));
  for (int causal = 0; causal < 2; causal++) {
    sm_ctx k = {x, causal};
    float *got = same_on_any_threads(sm_run, &k, "softmax_fwd");
    for (int64_t r = 0; r < SR; r++) softmax_two_exp(want, x, ST, 0.3f, causal, r);
    assert_bits(got, want, SR * ST * sizeof(float), "softmax_fwd");
    free(got);
  }
  int32_t tgt[PN * PHW > SR ? PN * PHW : SR];
  for (int pix = 0; pix < 2; pix++) {
    int64_t rows = pix ? PN * PHW : SR, V = pix ? PK : XV, nl = rows * V;
    for (int64_t r = 0; r < rows; r++) tgt[r] = r % 11 == 3 ? -1 : (int32_t)((r * 13) % V);
    xe_ctx k = {x, tgt, pix};
    float *got = same_on_any_threads(xe_run, &k, pix ? "xent_pix" : "xent_fused");
    float loss[PN * PHW > SR ? PN * PHW : SR];
    memcpy(want, x, nl * sizeof(float));
    for (int64_t r = 0; r < rows; r++) xent_two_exp(want, loss, tgt, V, 0.01f, r, pix ? PHW : 1);
    assert_bits(got, want, nl * sizeof(float), "cross-entropy gradient");
    assert_bits(got + nl, loss, rows * sizeof(float), "cross-entropy loss");
    free(got);
  }
  free(x); free(want);
}

/* ---- bilinear upsampling ----------------------------------------------------------------- */

enum { UPL = 6, UH = 9, UW = 13 };
typedef struct { const float *x; bool bwd; } up_ctx;

static void up_run(void *p, void *out, size_t *n) {
  const up_ctx *k = p;
  int64_t lo = UPL * UH * UW, hi = 4 * lo;
  vl_tensor a = tu_tnew(cx, VL_F32, k->bwd ? hi : lo, k->x),
            b = tu_tnew(cx, VL_F32, k->bwd ? lo : hi, NULL);
  if (k->bwd)
    OK(vl_upsample2x_bwd_run(cx, &(vl_upsample2x_bwd_args){.dx = &b, .dy = &a, .planes = UPL,
                                                           .H = UH, .W = UW, .nearest = false}));
  else
    OK(vl_upsample2x_fwd_run(cx, &(vl_upsample2x_fwd_args){.y = &b, .x = &a, .planes = UPL, .H = UH,
                                                           .W = UW, .nearest = false}));
  memcpy(out, b.data, b.bytes);
  *n = b.bytes;
  TU_TFREE(cx, &a, &b);
}

static void test_upsample(void **state) {
  (void)state;
  int64_t lo = UPL * UH * UW, hi = 4 * lo;
  float *x = tu_randn_new(hi, 1.0f, 50), *want = malloc(hi * sizeof(float));
  for (int bwd = 0; bwd < 2; bwd++) {
    up_ctx k = {x, bwd};
    float *got = same_on_any_threads(up_run, &k, "upsample2x");
    for (int64_t i = 0; i < (bwd ? lo : hi); i++) {
      if (bwd) vl_k_up2_bwd(want, VL_K_F32, x, VL_K_F32, UH, UW, i);
      else vl_k_up2_fwd(want, VL_K_F32, x, VL_K_F32, UH, UW, i);
    }
    assert_bits(got, want, (bwd ? lo : hi) * sizeof(float),
                bwd ? "upsample2x_bwd" : "upsample2x_fwd");
    free(got);
  }
  free(x); free(want);
}

/* ---- sums and optimizers, GEMM: thread count only ------------------------------------------ */

enum { ON = 70000, AR = 120, AC = 90 };
typedef struct { const float *g, *p; int which; } opt_ctx;

static void opt_run(void *q, void *out, size_t *n) {
  const opt_ctx *k = q;
  vl_optim_hp hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                    .weight_decay = 0.01f, .clip_thr = 1.0f, .decay_pow = 0.8f, .t = 3,
                    .grad_scale = 0.5f};
  if (k->which == 0) { /* sum of squares */
    vl_tensor g = tu_tnew(cx, VL_F32, ON, k->g);
    double s = -1;
    bool bad = true;
    OK(vl_sumsq_run(cx, &(vl_sumsq_args){.x = &g, .n = ON, .out = &s, .nonfinite = &bad}));
    assert_false(bad);
    memcpy(out, &s, sizeof s);
    *n = sizeof s;
    TU_TFREE(cx, &g);
  } else if (k->which == 1) { /* AdamW */
    vl_tensor p = tu_tnew(cx, VL_F32, ON, k->p), g = tu_tnew(cx, VL_F32, ON, k->g),
              m = tu_tnew(cx, VL_F32, ON, k->g), v = tu_tnew(cx, VL_F32, ON, k->p);
    for (int64_t i = 0; i < ON; i++) ((float *)v.data)[i] = fabsf(((float *)v.data)[i]);
    OK(vl_adamw_run(cx, &(vl_adamw_args){.p = &p, .g = &g, .m = &m, .v = &v, .n = ON, .hp = &hp}));
    memcpy(out, p.data, p.bytes);
    memcpy((char *)out + p.bytes, m.data, m.bytes);
    *n = p.bytes + m.bytes;
    TU_TFREE(cx, &p, &g, &m, &v);
  } else { /* Adafactor with its RMS clip sum */
    vl_tensor p = tu_tnew(cx, VL_F32, AR * AC, k->p), g = tu_tnew(cx, VL_F32, AR * AC, k->g),
              vr = tu_tnew(cx, VL_F32, AR, NULL), vc = tu_tnew(cx, VL_F32, AC, NULL);
    OK(vl_adafactor_run(cx, &(vl_adafactor_args){.p = &p, .g = &g, .vr = &vr, .vc = &vc, .m = NULL,
                                                 .R = AR, .C = AC, .hp = &hp}));
    memcpy(out, p.data, p.bytes);
    *n = p.bytes;
    TU_TFREE(cx, &p, &g, &vr, &vc);
  }
}

static void test_sums_and_optimizers(void **state) {
  (void)state;
  float *g = tu_randn_new(ON, 1.0f, 60), *p = tu_randn_new(ON, 1.0f, 61);
  for (int which = 0; which < 3; which++) {
    opt_ctx k = {g, p, which};
    const char *what = which == 0 ? "sumsq" : which == 1 ? "adamw" : "adafactor";
    void *got = same_on_any_threads(opt_run, &k, what);
    if (which == 0) { /* and it is the sum of squares */
      double want = 0, s;
      for (int64_t i = 0; i < ON; i++) want += (double)g[i] * g[i];
      memcpy(&s, got, sizeof s);
      assert_true(fabs(s - want) <= 1e-12 * want);
    }
    if (which == 1) { /* and AdamW's kernel, element by element */
      float *pp = malloc(ON * 4), *m = malloc(ON * 4), *v = malloc(ON * 4);
      memcpy(pp, p, ON * 4);
      memcpy(m, g, ON * 4);
      for (int64_t i = 0; i < ON; i++) v[i] = fabsf(p[i]);
      float bc1 = 1.0f - powf(0.9f, 3.0f), bc2 = 1.0f - powf(0.999f, 3.0f);
      for (int64_t i = 0; i < ON; i++)
        vl_k_adamw(pp, g, m, v, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, bc1, bc2, 0.5f, i);
      assert_bits(got, pp, ON * 4, "adamw");
      free(pp); free(m); free(v);
    }
    free(got);
  }
  free(g); free(p);
}

typedef struct { const float *a, *b; bool ta, tb; int64_t M, N, K, batch; vl_dtype dt; } gm_ctx;

static void gm_run(void *q, void *out, size_t *n) {
  const gm_ctx *k = q;
  int64_t na = k->M * k->K * k->batch, nb = k->K * k->N * k->batch, nc = k->M * k->N * k->batch;
  vl_tensor a = tu_tnew(cx, k->dt, na, k->a), b = tu_tnew(cx, k->dt, nb, k->b),
            c = tu_tnew(cx, VL_F32, nc, NULL);
  vl_gemm g = {.ta = k->ta, .tb = k->tb, .M = k->M, .N = k->N, .K = k->K, .alpha = 1, .beta = 0,
               .A = &a, .lda = k->ta ? k->M : k->K, .sa = k->M * k->K,
               .B = &b, .ldb = k->tb ? k->K : k->N, .sb = k->K * k->N,
               .C = &c, .ldc = k->N, .sc = k->M * k->N, .batch = k->batch};
  OK(vl_gemm_run(cx, &g));
  memcpy(out, c.data, c.bytes);
  *n = c.bytes;
  TU_TFREE(cx, &a, &b, &c);
}

static void test_gemm_threads(void **state) {
  (void)state;
  float *a = tu_randn_new(200 * 150 * 3, 1.0f, 70), *b = tu_randn_new(150 * 120 * 3, 1.0f, 71);
  const gm_ctx cases[] = {
      {a, b, false, true, 200, 120, 150, 1, VL_F32},  /* rows of C sliced */
      {a, b, true, false, 60, 200, 150, 1, VL_F32},   /* columns of C sliced */
      {a, b, false, false, 100, 120, 150, 3, VL_F32}, /* whole batches per thread */
      {a, b, false, true, 200, 120, 150, 2, VL_F16},  /* both operands converted, shared */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    free(same_on_any_threads(gm_run, (void *)&cases[i], "gemm"));
  free(a); free(b);
}

/* ---- the policy ---------------------------------------------------------------------------- */

static void test_policy(void **state) {
  (void)state;
  int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  vl_cpu_threads_force(0);
  for (int i = 0; i < 60; i++) vl_cpu_par_observe(1e-6, 0); /* an idle machine: 1 us waits */
  assert_int_equal(vl_cpu_threads(VL_CPU_PAR_NS / 2), 1); /* under the floor */
  assert_int_equal(vl_cpu_threads(1e6), 2);               /* 1 ms of work forks */
  for (int i = 0; i < 60; i++) vl_cpu_par_observe(10.0, 0); /* 10 s waits: probes are 200 s apart */
  assert_int_equal(vl_cpu_threads(1e6), 1);                 /* saving 0.5 ms < 10 s wait */
  assert_int_equal(vl_cpu_threads(1e11), 2);                /* saving 50 s > 10 s */
  vl_cpu_par_warm(); /* a library's region just ended: its workers are awake */
  assert_int_equal(vl_cpu_threads(1e6), 2);
  assert_int_equal(vl_cpu_threads(1e5), 2); /* following closely: still awake */
  assert_int_equal(vl_cpu_threads(VL_CPU_PAR_NS / 2), 1); /* the floor still holds */
  struct timespec nap = {0, 20000000}; /* 20 ms: they went back to sleep */
  nanosleep(&nap, NULL);
  assert_int_equal(vl_cpu_threads(1e6), 1);
  for (int i = 0; i < 60; i++) vl_cpu_par_observe(1e-6, 0); /* the load went away */
  assert_int_equal(vl_cpu_threads(1e6), 2);
  vl_cpu_threads_force(1);
  assert_int_equal(vl_cpu_threads(1e11), 1);
  vl_cpu_threads_force(5);
  assert_int_equal(vl_cpu_threads(1.0), 2); /* forced counts are clamped to the team */
  vl_cpu_threads_force(0);
  omp_set_num_threads(saved);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_rmsnorm_bwd),
      cmocka_unit_test(test_embed_bwd),
      cmocka_unit_test(test_one_exp),
      cmocka_unit_test(test_upsample),
      cmocka_unit_test(test_sums_and_optimizers),
      cmocka_unit_test(test_gemm_threads),
      cmocka_unit_test(test_policy),
  };
  return cmocka_run_group_tests(tests, tu_cpu_setup, tu_cpu_teardown);
}
