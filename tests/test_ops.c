/* CPU backend ops: finite-difference gradient checks of every backward op in fp32, fp16 and
 * bf16 storage against the fp32 op on rounded inputs, GEMM in all its layouts and dtypes
 * (NF4 included), and sumsq's non-finite detection.
 *
 * Gradient checks use a random projection objective L = sum(r * out), accumulated in
 * double, and central differences with a step of 1e-3 on inputs of O(1).
 * Tolerance |fd - an| <= 1e-2 * max(1, |an|), because:
 *   - truncation error of the central difference is eps^2/6 * |L'''| ~ 2e-7;
 *   - each fp32 output carries ~6e-8 relative rounding error, so L has an error of at most
 *     ~ n_out * 6e-8 (here n_out <= 100 and |r*out| = O(1)), i.e. <= 6e-6, divided by the
 *     step 2e-3: <= 3e-3 in the worst case and ~3e-4 typically;
 *   - a wrong formula (missing term, sign, factor of 2, wrong index) is off by O(0.1-1).
 * Storage-dtype checks: the ops compute in fp32 from values loaded from storage, so a
 * bf16/fp16 run must equal the fp32 op on the rounded inputs up to the rounding of its
 * outputs: |got - ref| <= u*|ref| + 1e-7 with u the unit roundoff (2^-8 bf16, 2^-11 fp16). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kcommon.h"
#include "vramlab/nn.h"
#include "vramlab/quant.h"

#define FD_EPS 1e-3f
#define FD_TOL 1e-2
#define OK(expr) assert_int_equal((expr), VL_OK)

#define cx tu_cpu /* the group's CPU context (tu_cpu_setup) */

/* Tensors, host arrays, the finite-difference and storage-dtype checks: testutil.h. */

static const vl_dtype LOWP[2] = {VL_F16, VL_BF16};

/* Host int32 ids as a VL_I32 tensor (the CPU backend reads host memory). */
static vl_tensor ids_of(const int32_t *p, int64_t n) {
  vl_tensor t;
  memset(&t, 0, sizeof t);
  vl_tensor_set_shape(&t, VL_I32, 1, &n);
  t.device = VL_DEV_CPU;
  t.data = (void *)p;
  return t;
}


/* ---- RMSNorm ---------------------------------------------------------------------- */

enum { RN_R = 3, RN_C = 16 };
#define RN_EPS 1e-5f

static void run_rmsnorm(vl_dtype dt, const float *x, const float *w, const float *dy, float *out,
                        float *dx, float *dw) {
  const int64_t R = RN_R, C = RN_C;
  vl_tensor tx = tu_tnew(cx, dt, R * C, x), tw = tu_tnew(cx, dt, C, w), to = tu_tnew(cx, dt, R * C, NULL);
  vl_tensor rs = tu_tnew(cx, VL_F32, R, NULL);
  OK(vl_rmsnorm_fwd_run(cx, &(vl_rmsnorm_fwd_args){.out = &to, .rstd = &rs, .x = &tx, .w = &tw,
                                                   .R = R, .C = C, .eps = RN_EPS}));
  tu_tget(&to, out);
  if (dy) {
    vl_tensor tdy = tu_tnew(cx, dt, R * C, dy), tdx = tu_tnew(cx, dt, R * C, NULL),
              tdw = tu_tnew(cx, VL_F32, C, NULL);
    OK(vl_rmsnorm_bwd_run(cx, &(vl_rmsnorm_bwd_args){.dx = &tdx, .dw = &tdw, .dout = &tdy, .x = &tx,
                                                     .w = &tw, .rstd = &rs, .R = R, .C = C}));
    tu_tget(&tdx, dx);
    tu_tget(&tdw, dw);
    TU_TFREE(cx, &tdy, &tdx, &tdw);
  }
  TU_TFREE(cx, &tx, &tw, &to, &rs);
}

typedef struct { float *x, *w, *r, *out; } rn_ctx;
static double rn_loss(void *p) {
  rn_ctx *k = p;
  run_rmsnorm(VL_F32, k->x, k->w, NULL, k->out, NULL, NULL);
  return tu_dot(k->r, k->out, RN_R * RN_C);
}

static void test_rmsnorm(void **state) {
  (void)state;
  const int64_t R = RN_R, C = RN_C, n = R * C;
  float *x = tu_randn_new(n, 1.0f, 1), *w = tu_randn_new(C, 0.3f, 2), *r = tu_randn_new(n, 1.0f, 3);
  for (int64_t c = 0; c < C; c++) w[c] += 1.0f;
  float *out = tu_zeros(n), *dx = tu_zeros(n), *dw = tu_zeros(C);
  run_rmsnorm(VL_F32, x, w, r, out, dx, dw);
  /* forward against double: x / sqrt(mean(x^2) + eps) * w */
  for (int64_t i = 0; i < R; i++) {
    double ss = 0;
    for (int64_t c = 0; c < C; c++) ss += (double)x[i * C + c] * x[i * C + c];
    double rs = 1.0 / sqrt(ss / C + RN_EPS);
    for (int64_t c = 0; c < C; c++)
      assert_true(fabs(out[i * C + c] - x[i * C + c] * rs * w[c]) < 1e-5);
  }
  rn_ctx k = {x, w, r, tu_zeros(n)};
  tu_fd_check(rn_loss, &k, x, n, dx, FD_EPS, FD_TOL, "rmsnorm dx");
  tu_fd_check(rn_loss, &k, w, C, dw, FD_EPS, FD_TOL, "rmsnorm dw");

  /* backward accumulates (+=) into dx and dw; dw may be NULL (frozen norm weight) */
  vl_tensor tx = tu_tnew(cx, VL_F32, n, x), tw = tu_tnew(cx, VL_F32, C, w), to = tu_tnew(cx, VL_F32, n, NULL);
  vl_tensor rs = tu_tnew(cx, VL_F32, R, NULL), tr = tu_tnew(cx, VL_F32, n, r),
            tdx = tu_tnew(cx, VL_F32, n, dx);
  vl_tensor tdw = tu_tnew(cx, VL_F32, C, dw);
  OK(vl_rmsnorm_fwd_run(cx, &(vl_rmsnorm_fwd_args){.out = &to, .rstd = &rs, .x = &tx, .w = &tw,
                                                   .R = R, .C = C, .eps = RN_EPS}));
  OK(vl_rmsnorm_bwd_run(cx, &(vl_rmsnorm_bwd_args){.dx = &tdx, .dw = &tdw, .dout = &tr, .x = &tx,
                                                   .w = &tw, .rstd = &rs, .R = R, .C = C}));
  OK(vl_rmsnorm_bwd_run(cx, &(vl_rmsnorm_bwd_args){.dx = &tdx, .dw = NULL, .dout = &tr, .x = &tx,
                                                   .w = &tw, .rstd = &rs, .R = R, .C = C}));
  float *dx3 = tu_zeros(n), *dw2 = tu_zeros(C), *x3 = tu_zeros(n), *w2 = tu_zeros(C);
  tu_tget(&tdx, dx3);
  tu_tget(&tdw, dw2);
  for (int64_t i = 0; i < n; i++) x3[i] = 3 * dx[i];
  for (int64_t c = 0; c < C; c++) w2[c] = 2 * dw[c];
  tu_assert_close(dx3, x3, n, 1e-6, 1e-5, "rmsnorm dx accumulates");
  tu_assert_close(dw2, w2, C, 1e-6, 1e-5, "rmsnorm dw accumulates");
  TU_TFREE(cx, &tx, &tw, &to, &rs, &tr, &tdx, &tdw);

  /* storage dtypes: x, w, out, dy, dx low precision; dw (a weight grad) fp32 */
  for (int d = 0; d < 2; d++) {
    vl_dtype dt = LOWP[d];
    float *xr = tu_rounded(x, n, dt), *wr = tu_rounded(w, C, dt), *rr = tu_rounded(r, n, dt);
    float *o1 = tu_zeros(n), *dx1 = tu_zeros(n), *dw1 = tu_zeros(C), *o2 = tu_zeros(n),
          *dx2 = tu_zeros(n), *dw2b = tu_zeros(C);
    run_rmsnorm(VL_F32, xr, wr, rr, o1, dx1, dw1);
    run_rmsnorm(dt, x, w, r, o2, dx2, dw2b);
    tu_assert_close_dt(o2, o1, n, dt, "rmsnorm out");
    tu_assert_close_dt(dx2, dx1, n, dt, "rmsnorm dx");
    tu_assert_close_dt(dw2b, dw1, C, VL_F32, "rmsnorm dw");
    free(xr); free(wr); free(rr); free(o1); free(dx1); free(dw1); free(o2); free(dx2); free(dw2b);
  }
  free(x); free(w); free(r); free(out); free(dx); free(dw); free(k.out);
  free(dx3); free(dw2); free(x3); free(w2);
}

/* ---- RoPE ------------------------------------------------------------------------- */

enum { RP_B = 2, RP_T = 3, RP_H = 2, RP_D = 8 };
#define RP_N (RP_B * RP_T * RP_H * RP_D)
#define RP_THETA 10000.0f

static void run_rope(vl_dtype dt, const float *x, float *out, bool inverse) {
  vl_tensor t = tu_tnew(cx, dt, RP_N, x);
  OK(vl_rope_run(cx, &(vl_rope_args){.x = &t, .B = RP_B, .T = RP_T, .H = RP_H, .D = RP_D,
                                     .theta = RP_THETA, .inverse = inverse}));
  tu_tget(&t, out);
  vl_tensor_free(cx, &t);
}

typedef struct { float *x, *w, *out; } rp_ctx;
static double rp_loss(void *p) {
  rp_ctx *k = p;
  run_rope(VL_F32, k->x, k->out, false);
  return tu_dot(k->w, k->out, RP_N);
}

static void test_rope(void **state) {
  (void)state;
  float *x = tu_randn_new(RP_N, 1.0f, 10), *w = tu_randn_new(RP_N, 1.0f, 11);
  float *y = tu_zeros(RP_N), *z = tu_zeros(RP_N), *an = tu_zeros(RP_N);
  run_rope(VL_F32, x, y, false);
  /* forward against double, HF rotate_half: pairs (d, d + D/2) at angle t * theta^(-2d/D) */
  const int half = RP_D / 2;
  for (int b = 0; b < RP_B; b++)
    for (int t = 0; t < RP_T; t++)
      for (int h = 0; h < RP_H; h++)
        for (int d = 0; d < half; d++) {
          int64_t base = (((int64_t)b * RP_T + t) * RP_H + h) * RP_D;
          double ang = t * pow(RP_THETA, -2.0 * d / RP_D), c = cos(ang), s = sin(ang);
          double x1 = x[base + d], x2 = x[base + d + half];
          assert_true(fabs(y[base + d] - (x1 * c - x2 * s)) < 1e-5);
          assert_true(fabs(y[base + d + half] - (x2 * c + x1 * s)) < 1e-5);
          if (t == 0) assert_true(y[base + d] == x[base + d]); /* position 0: identity */
        }
  /* the inverse undoes the rotation */
  run_rope(VL_F32, y, z, true);
  tu_assert_close(z, x, RP_N, 1e-6, 1e-5, "rope inverse(rope(x))");
  /* backward = inverse: dL/dx of sum(w * rope(x)) is rope^T(w) = rope(w, inverse) */
  run_rope(VL_F32, w, an, true);
  rp_ctx k = {x, w, tu_zeros(RP_N)};
  tu_fd_check(rp_loss, &k, x, RP_N, an, FD_EPS, FD_TOL, "rope dx");
  for (int d = 0; d < 2; d++) {
    float *xr = tu_rounded(x, RP_N, LOWP[d]), *ref = tu_zeros(RP_N), *got = tu_zeros(RP_N);
    run_rope(VL_F32, xr, ref, false);
    run_rope(LOWP[d], x, got, false);
    tu_assert_close_dt(got, ref, RP_N, LOWP[d], "rope");
    free(xr); free(ref); free(got);
  }
  free(x); free(w); free(y); free(z); free(an); free(k.out);
}

/* ---- permute ---------------------------------------------------------------------- */

static void test_permute(void **state) {
  (void)state;
  enum { B = 2, T = 3, H = 4, D = 5, N = B * T * H * D };
  float *x = tu_randn_new(N, 1.0f, 20), *y = tu_zeros(N), *z = tu_zeros(N);
  for (int d = 0; d < 3; d++) {
    vl_dtype dt = d == 0 ? VL_F32 : LOWP[d - 1];
    float *xr = tu_rounded(x, N, dt);
    vl_tensor tx = tu_tnew(cx, dt, N, x), ty = tu_tnew(cx, dt, N, NULL), tz = tu_tnew(cx, dt, N, NULL);
    OK(vl_permute_run(cx, &(vl_permute_args){.y = &ty, .x = &tx, .B = B, .T = T, .H = H, .D = D,
                                             .back = false}));
    OK(vl_permute_run(cx, &(vl_permute_args){.y = &tz, .x = &ty, .B = B, .T = T, .H = H, .D = D,
                                             .back = true}));
    tu_tget(&ty, y);
    tu_tget(&tz, z);
    /* y is (B,H,T,D) with y[b,h,t,d] = x[b,t,h,d], bit for bit; back is its inverse */
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
          for (int e = 0; e < D; e++)
            assert_true(y[((b * H + h) * T + t) * D + e] == xr[((b * T + t) * H + h) * D + e]);
    assert_memory_equal(z, xr, sizeof(float) * N);
    TU_TFREE(cx, &tx, &ty, &tz);
    free(xr);
  }
  vl_tensor a = tu_tnew(cx, VL_F32, N, x), b = tu_tnew(cx, VL_BF16, N, NULL);
  assert_int_equal(vl_permute_run(cx, &(vl_permute_args){.y = &b, .x = &a, .B = B, .T = T, .H = H,
                                                         .D = D, .back = false}), VL_ERR_INVALID);
  TU_TFREE(cx, &a, &b);
  free(x); free(y); free(z);
}

/* ---- causal softmax --------------------------------------------------------------- */

enum { SM_T = 5, SM_ROWS = 2 * SM_T, SM_N = SM_ROWS * SM_T };
#define SM_SCALE 0.6f

static void run_softmax_fwd(vl_dtype dt, const float *S, float *P, bool alias) {
  vl_tensor ts = tu_tnew(cx, dt, SM_N, S), tp = alias ? ts : tu_tnew(cx, dt, SM_N, NULL);
  OK(vl_softmax_fwd_run(cx, &(vl_softmax_fwd_args){.P = &tp, .S = &ts, .rows = SM_ROWS, .T = SM_T,
                                                   .scale = SM_SCALE, .causal = true}));
  tu_tget(&tp, P);
  if (!alias) vl_tensor_free(cx, &tp);
  vl_tensor_free(cx, &ts);
}
static void run_softmax_bwd(vl_dtype dt, const float *P, const float *dP, float *dS, bool alias) {
  vl_tensor tp = tu_tnew(cx, dt, SM_N, P), tdp = tu_tnew(cx, dt, SM_N, dP),
            tds = alias ? tdp : tu_tnew(cx, dt, SM_N, NULL);
  OK(vl_softmax_bwd_run(cx, &(vl_softmax_bwd_args){.dS = &tds, .dP = &tdp, .P = &tp,
                                                   .rows = SM_ROWS, .T = SM_T, .scale = SM_SCALE,
                                                   .causal = true}));
  tu_tget(&tds, dS);
  if (!alias) vl_tensor_free(cx, &tds);
  TU_TFREE(cx, &tp, &tdp);
}

typedef struct { float *S, *r, *P; } sm_ctx;
static double sm_loss(void *p) {
  sm_ctx *k = p;
  run_softmax_fwd(VL_F32, k->S, k->P, false);
  return tu_dot(k->r, k->P, SM_N);
}

static void test_softmax_causal(void **state) {
  (void)state;
  float *S = tu_randn_new(SM_N, 2.0f, 30), *r = tu_randn_new(SM_N, 1.0f, 31);
  float *P = tu_zeros(SM_N), *P2 = tu_zeros(SM_N), *dS = tu_zeros(SM_N), *dS2 = tu_zeros(SM_N);
  run_softmax_fwd(VL_F32, S, P, false);
  for (int64_t row = 0; row < SM_ROWS; row++) {
    int64_t q = row % SM_T; /* query position */
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c <= q; c++) mx = fmax(mx, SM_SCALE * (double)S[row * SM_T + c]);
    for (int64_t c = 0; c <= q; c++) sum += exp(SM_SCALE * (double)S[row * SM_T + c] - mx);
    for (int64_t c = 0; c < SM_T; c++) {
      double want = c <= q ? exp(SM_SCALE * (double)S[row * SM_T + c] - mx) / sum : 0.0;
      assert_true(fabs(P[row * SM_T + c] - want) < 1e-6);
      if (c > q) assert_true(P[row * SM_T + c] == 0.0f); /* masked exactly */
    }
  }
  run_softmax_fwd(VL_F32, S, P2, true); /* P may alias S */
  assert_memory_equal(P, P2, sizeof(float) * SM_N);

  run_softmax_bwd(VL_F32, P, r, dS, false);
  sm_ctx k = {S, r, tu_zeros(SM_N)};
  tu_fd_check(sm_loss, &k, S, SM_N, dS, FD_EPS, FD_TOL, "softmax dS"); /* masked entries: FD 0, analytic 0 */
  run_softmax_bwd(VL_F32, P, r, dS2, true); /* dS may alias dP */
  assert_memory_equal(dS, dS2, sizeof(float) * SM_N);

  for (int d = 0; d < 2; d++) {
    vl_dtype dt = LOWP[d];
    float *Sr = tu_rounded(S, SM_N, dt), *rr = tu_rounded(r, SM_N, dt);
    float *Pref = tu_zeros(SM_N), *Pgot = tu_zeros(SM_N), *dref = tu_zeros(SM_N), *dgot = tu_zeros(SM_N);
    run_softmax_fwd(VL_F32, Sr, Pref, false);
    run_softmax_fwd(dt, S, Pgot, false);
    tu_assert_close_dt(Pgot, Pref, SM_N, dt, "softmax P");
    /* backward reads P from storage: the reference gets the same stored P */
    run_softmax_bwd(VL_F32, Pgot, rr, dref, false);
    run_softmax_bwd(dt, Pgot, r, dgot, false);
    tu_assert_close_dt(dgot, dref, SM_N, dt, "softmax dS");
    free(Sr); free(rr); free(Pref); free(Pgot); free(dref); free(dgot);
  }
  free(S); free(r); free(P); free(P2); free(dS); free(dS2); free(k.P);
}

/* ---- full (non-causal) softmax ----------------------------------------------------- */

/* P = softmax(SM_SCALE * S) over every column; with dP, dS from the backward too. */
static void run_softmax_full(vl_dtype dt, const float *S, float *P, const float *dP, float *dS) {
  vl_tensor ts = tu_tnew(cx, dt, SM_N, S), tp = tu_tnew(cx, dt, SM_N, NULL);
  OK(vl_softmax_fwd_run(cx, &(vl_softmax_fwd_args){.P = &tp, .S = &ts, .rows = SM_ROWS, .T = SM_T,
                                                   .scale = SM_SCALE, .causal = false}));
  tu_tget(&tp, P);
  if (dP) {
    vl_tensor tdp = tu_tnew(cx, dt, SM_N, dP), tds = tu_tnew(cx, dt, SM_N, NULL);
    OK(vl_softmax_bwd_run(cx, &(vl_softmax_bwd_args){.dS = &tds, .dP = &tdp, .P = &tp,
                                                     .rows = SM_ROWS, .T = SM_T, .scale = SM_SCALE,
                                                     .causal = false}));
    tu_tget(&tds, dS);
    TU_TFREE(cx, &tdp, &tds);
  }
  TU_TFREE(cx, &ts, &tp);
}

static double sm_full_loss(void *p) {
  sm_ctx *k = p;
  run_softmax_full(VL_F32, k->S, k->P, NULL, NULL);
  return tu_dot(k->r, k->P, SM_N);
}

static void test_softmax_full(void **state) {
  (void)state;
  float *S = tu_randn_new(SM_N, 2.0f, 32), *r = tu_randn_new(SM_N, 1.0f, 33);
  float *P = tu_zeros(SM_N), *dS = tu_zeros(SM_N);
  run_softmax_full(VL_F32, S, P, r, dS);
  for (int64_t row = 0; row < SM_ROWS; row++) { /* every column of every row is seen */
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < SM_T; c++) mx = fmax(mx, SM_SCALE * (double)S[row * SM_T + c]);
    for (int64_t c = 0; c < SM_T; c++) sum += exp(SM_SCALE * (double)S[row * SM_T + c] - mx);
    for (int64_t c = 0; c < SM_T; c++) {
      double want = exp(SM_SCALE * (double)S[row * SM_T + c] - mx) / sum;
      assert_true(fabs(P[row * SM_T + c] - want) < 1e-6);
      assert_true(P[row * SM_T + c] > 0.0f); /* no column masked (row 0 would be causal's 1, 0...) */
    }
  }
  sm_ctx k = {S, r, tu_zeros(SM_N)};
  tu_fd_check(sm_full_loss, &k, S, SM_N, dS, FD_EPS, FD_TOL, "full softmax dS");
  for (int d = 0; d < 2; d++) {
    vl_dtype dt = LOWP[d];
    float *Sr = tu_rounded(S, SM_N, dt), *rr = tu_rounded(r, SM_N, dt);
    float *Pref = tu_zeros(SM_N), *Pgot = tu_zeros(SM_N), *dref = tu_zeros(SM_N), *dgot = tu_zeros(SM_N);
    run_softmax_full(VL_F32, Sr, Pref, NULL, NULL);
    run_softmax_full(dt, S, Pgot, r, dgot);
    tu_assert_close_dt(Pgot, Pref, SM_N, dt, "full softmax P");
    /* the backward reads P from storage: the reference gets the same stored P */
    vl_tensor tp = tu_tnew(cx, VL_F32, SM_N, Pgot), tdp = tu_tnew(cx, VL_F32, SM_N, rr),
              tds = tu_tnew(cx, VL_F32, SM_N, NULL);
    OK(vl_softmax_bwd_run(cx, &(vl_softmax_bwd_args){.dS = &tds, .dP = &tdp, .P = &tp,
                                                     .rows = SM_ROWS, .T = SM_T, .scale = SM_SCALE,
                                                     .causal = false}));
    tu_tget(&tds, dref);
    TU_TFREE(cx, &tp, &tdp, &tds);
    tu_assert_close_dt(dgot, dref, SM_N, dt, "full softmax dS");
    free(Sr); free(rr); free(Pref); free(Pgot); free(dref); free(dgot);
  }
  free(S); free(r); free(P); free(dS); free(k.P);
}

/* ---- SwiGLU ----------------------------------------------------------------------- */

enum { SW_N = 40 };

static void run_swiglu(vl_dtype dt, const float *g, const float *u, const float *dy, float *out,
                       float *dg, float *du) {
  vl_tensor tg = tu_tnew(cx, dt, SW_N, g), tu = tu_tnew(cx, dt, SW_N, u), to = tu_tnew(cx, dt, SW_N, NULL);
  OK(vl_swiglu_fwd_run(cx, &(vl_swiglu_fwd_args){.out = &to, .g = &tg, .u = &tu, .n = SW_N}));
  tu_tget(&to, out);
  if (dy) {
    vl_tensor tdy = tu_tnew(cx, dt, SW_N, dy), tdg = tu_tnew(cx, dt, SW_N, NULL),
              tdu = tu_tnew(cx, dt, SW_N, NULL);
    OK(vl_swiglu_bwd_run(cx, &(vl_swiglu_bwd_args){.dg = &tdg, .du = &tdu, .dout = &tdy, .g = &tg,
                                                   .u = &tu, .n = SW_N}));
    tu_tget(&tdg, dg);
    tu_tget(&tdu, du);
    TU_TFREE(cx, &tdy, &tdg, &tdu);
  }
  TU_TFREE(cx, &tg, &tu, &to);
}

typedef struct { float *g, *u, *r, *out; } sw_ctx;
static double sw_loss(void *p) {
  sw_ctx *k = p;
  run_swiglu(VL_F32, k->g, k->u, NULL, k->out, NULL, NULL);
  return tu_dot(k->r, k->out, SW_N);
}

static void test_swiglu(void **state) {
  (void)state;
  float *g = tu_randn_new(SW_N, 2.0f, 40), *u = tu_randn_new(SW_N, 1.0f, 41),
        *r = tu_randn_new(SW_N, 1.0f, 42);
  float *out = tu_zeros(SW_N), *dg = tu_zeros(SW_N), *du = tu_zeros(SW_N);
  run_swiglu(VL_F32, g, u, r, out, dg, du);
  for (int i = 0; i < SW_N; i++) /* silu(g) * u */
    assert_true(fabs(out[i] - g[i] / (1.0 + exp(-(double)g[i])) * u[i]) < 1e-5);
  sw_ctx k = {g, u, r, tu_zeros(SW_N)};
  tu_fd_check(sw_loss, &k, g, SW_N, dg, FD_EPS, FD_TOL, "swiglu dg");
  tu_fd_check(sw_loss, &k, u, SW_N, du, FD_EPS, FD_TOL, "swiglu du");
  for (int d = 0; d < 2; d++) {
    vl_dtype dt = LOWP[d];
    float *gr = tu_rounded(g, SW_N, dt), *ur = tu_rounded(u, SW_N, dt), *rr = tu_rounded(r, SW_N, dt);
    float *o1 = tu_zeros(SW_N), *g1 = tu_zeros(SW_N), *u1 = tu_zeros(SW_N);
    float *o2 = tu_zeros(SW_N), *g2 = tu_zeros(SW_N), *u2 = tu_zeros(SW_N);
    run_swiglu(VL_F32, gr, ur, rr, o1, g1, u1);
    run_swiglu(dt, g, u, r, o2, g2, u2);
    tu_assert_close_dt(o2, o1, SW_N, dt, "swiglu out");
    tu_assert_close_dt(g2, g1, SW_N, dt, "swiglu dg");
    tu_assert_close_dt(u2, u1, SW_N, dt, "swiglu du");
    /* low-precision g, u and dout with fp32 gradients (what gpu-check's "swiglu_bwd bf16
     * (grads f32)" runs): the gradients of the rounded inputs, unrounded */
    vl_tensor tg = tu_tnew(cx, dt, SW_N, g), tu = tu_tnew(cx, dt, SW_N, u), tdy = tu_tnew(cx, dt, SW_N, r),
              tdg = tu_tnew(cx, VL_F32, SW_N, NULL), tdu = tu_tnew(cx, VL_F32, SW_N, NULL);
    OK(vl_swiglu_bwd_run(cx, &(vl_swiglu_bwd_args){.dg = &tdg, .du = &tdu, .dout = &tdy, .g = &tg, .u = &tu,
                                                   .n = SW_N}));
    tu_tget(&tdg, g2);
    tu_tget(&tdu, u2);
    TU_TFREE(cx, &tg, &tu, &tdy, &tdg, &tdu);
    tu_assert_close_dt(g2, g1, SW_N, VL_F32, "swiglu dg (fp32 grads of low-precision inputs)");
    tu_assert_close_dt(u2, u1, SW_N, VL_F32, "swiglu du (fp32 grads of low-precision inputs)");
    free(gr); free(ur); free(rr); free(o1); free(g1); free(u1); free(o2); free(g2); free(u2);
  }
  free(g); free(u); free(r); free(out); free(dg); free(du); free(k.out);
}

/* ---- fused cross-entropy ------------------------------------------------------------ */

enum { XE_R = 5, XE_V = 7, XE_N = XE_R * XE_V, XE_VALID = 4 };
static const int32_t XE_TGT[XE_R] = {3, -1, 0, 6, 3}; /* row 1 ignored */

static void run_xent(vl_dtype dt, const float *logits, float *loss, float *dlogits) {
  vl_tensor tl = tu_tnew(cx, dt, XE_N, logits), tloss = tu_tnew(cx, VL_F32, XE_R, NULL);
  vl_tensor tgt = ids_of(XE_TGT, XE_R);
  OK(vl_xent_fused_run(cx, &(vl_xent_fused_args){.logits = &tl, .loss = &tloss, .tgt = &tgt,
                                                 .R = XE_R, .V = XE_V,
                                                 .dloss_scale = 1.0f / XE_VALID}));
  tu_tget(&tloss, loss);
  if (dlogits) tu_tget(&tl, dlogits);
  TU_TFREE(cx, &tl, &tloss);
}

typedef struct { float *l, *loss; } xe_ctx;
static double xe_loss(void *p) { /* mean over the non-ignored rows */
  xe_ctx *k = p;
  run_xent(VL_F32, k->l, k->loss, NULL);
  double s = 0;
  for (int r = 0; r < XE_R; r++) s += k->loss[r];
  return s / XE_VALID;
}

static void test_xent(void **state) {
  (void)state;
  float *l = tu_randn_new(XE_N, 2.0f, 50), *loss = tu_zeros(XE_R), *dl = tu_zeros(XE_N);
  run_xent(VL_F32, l, loss, dl);
  for (int r = 0; r < XE_R; r++) {
    if (XE_TGT[r] < 0) {
      assert_true(loss[r] == 0.0f);
      for (int c = 0; c < XE_V; c++) assert_true(dl[r * XE_V + c] == 0.0f);
      continue;
    }
    double mx = -INFINITY, s = 0;
    for (int c = 0; c < XE_V; c++) mx = fmax(mx, l[r * XE_V + c]);
    for (int c = 0; c < XE_V; c++) s += exp(l[r * XE_V + c] - mx);
    assert_true(fabs(loss[r] - (log(s) + mx - l[r * XE_V + XE_TGT[r]])) < 1e-5);
  }
  xe_ctx k = {l, tu_zeros(XE_R)};
  tu_fd_check(xe_loss, &k, l, XE_N, dl, FD_EPS, FD_TOL, "xent dlogits");
  for (int d = 0; d < 2; d++) {
    vl_dtype dt = LOWP[d];
    float *lr = tu_rounded(l, XE_N, dt), *loss1 = tu_zeros(XE_R), *loss2 = tu_zeros(XE_R);
    float *d1 = tu_zeros(XE_N), *d2 = tu_zeros(XE_N);
    run_xent(VL_F32, lr, loss1, d1);
    run_xent(dt, l, loss2, d2);
    tu_assert_close_dt(loss2, loss1, XE_R, VL_F32, "xent loss (fp32 out)");
    tu_assert_close_dt(d2, d1, XE_N, dt, "xent dlogits");
    free(lr); free(loss1); free(loss2); free(d1); free(d2);
  }
  free(l); free(loss); free(dl); free(k.loss);
}

/* ---- embedding -------------------------------------------------------------------- */

enum { EM_V = 5, EM_C = 4, EM_R = 7 };
static const int32_t EM_TOK[EM_R] = {1, 3, 1, 0, 3, 3, 4}; /* repeats; token 2 unused */

static void run_embed(vl_dtype dt, const float *wte, const float *dy, float *out, float *dwte) {
  vl_tensor tw = tu_tnew(cx, dt, EM_V * EM_C, wte), to = tu_tnew(cx, dt, EM_R * EM_C, NULL);
  vl_tensor tok = ids_of(EM_TOK, EM_R);
  OK(vl_embed_fwd_run(cx, &(vl_embed_fwd_args){.out = &to, .wte = &tw, .tok = &tok, .R = EM_R,
                                               .C = EM_C}));
  tu_tget(&to, out);
  if (dy) {
    vl_tensor tdy = tu_tnew(cx, dt, EM_R * EM_C, dy), tdw = tu_tnew(cx, VL_F32, EM_V * EM_C, NULL);
    OK(vl_embed_bwd_run(cx, &(vl_embed_bwd_args){.dwte = &tdw, .dout = &tdy, .tok = &tok, .R = EM_R,
                                                 .C = EM_C}));
    tu_tget(&tdw, dwte);
    TU_TFREE(cx, &tdy, &tdw);
  }
  TU_TFREE(cx, &tw, &to);
}

typedef struct { float *w, *r, *out; } em_ctx;
static double em_loss(void *p) {
  em_ctx *k = p;
  run_embed(VL_F32, k->w, NULL, k->out, NULL);
  return tu_dot(k->r, k->out, EM_R * EM_C);
}

static void test_embedding(void **state) {
  (void)state;
  const int64_t nw = EM_V * EM_C, no = EM_R * EM_C;
  float *w = tu_randn_new(nw, 1.0f, 60), *r = tu_randn_new(no, 1.0f, 61), *out = tu_zeros(no),
        *dw = tu_zeros(nw);
  run_embed(VL_F32, w, r, out, dw);
  for (int i = 0; i < EM_R; i++)
    assert_memory_equal(out + i * EM_C, w + EM_TOK[i] * EM_C, sizeof(float) * EM_C);
  for (int c = 0; c < EM_C; c++) assert_true(dw[2 * EM_C + c] == 0.0f); /* unused token */
  em_ctx k = {w, r, tu_zeros(no)};
  tu_fd_check(em_loss, &k, w, nw, dw, FD_EPS, FD_TOL, "embed dwte");
  for (int d = 0; d < 2; d++) {
    vl_dtype dt = LOWP[d];
    float *wr = tu_rounded(w, nw, dt), *rr = tu_rounded(r, no, dt);
    float *o1 = tu_zeros(no), *g1 = tu_zeros(nw), *o2 = tu_zeros(no), *g2 = tu_zeros(nw);
    run_embed(VL_F32, wr, rr, o1, g1);
    run_embed(dt, w, r, o2, g2); /* dwte stays fp32: accumulation is exact w.r.t. fp32 */
    tu_assert_close_dt(o2, o1, no, dt, "embed out");
    tu_assert_close_dt(g2, g1, nw, VL_F32, "embed dwte");
    free(wr); free(rr); free(o1); free(g1); free(o2); free(g2);
  }
  free(w); free(r); free(out); free(dw); free(k.out);
}

/* ---- linear (GEMM through nn.h) ---------------------------------------------------- */

enum { LN_R = 3, LN_K = 5, LN_N = 4 };

static void run_linear(const float *x, const float *W, const float *dy, float *y, float *dx, float *dW) {
  vl_tensor tx = tu_tnew(cx, VL_F32, LN_R * LN_K, x), tW = tu_tnew(cx, VL_F32, LN_N * LN_K, W);
  vl_tensor ty = tu_tnew(cx, VL_F32, LN_R * LN_N, NULL);
  OK(vl_linear_fwd(cx, &ty, &tx, &tW, LN_R, LN_K, LN_N, 0.0f));
  tu_tget(&ty, y);
  if (dy) {
    vl_tensor tdy = tu_tnew(cx, VL_F32, LN_R * LN_N, dy), tdx = tu_tnew(cx, VL_F32, LN_R * LN_K, NULL);
    vl_tensor tdW = tu_tnew(cx, VL_F32, LN_N * LN_K, NULL);
    OK(vl_linear_bwd_x(cx, &tdx, &tdy, &tW, LN_R, LN_K, LN_N, 0.0f));
    OK(vl_linear_bwd_w(cx, &tdW, &tdy, &tx, LN_R, LN_K, LN_N, 1.0f));
    tu_tget(&tdx, dx);
    tu_tget(&tdW, dW);
    /* beta = 1 accumulates into dx; scale multiplies and dW accumulates */
    OK(vl_linear_bwd_x(cx, &tdx, &tdy, &tW, LN_R, LN_K, LN_N, 1.0f));
    OK(vl_linear_bwd_w(cx, &tdW, &tdy, &tx, LN_R, LN_K, LN_N, 0.5f));
    float dx2[LN_R * LN_K], dW2[LN_N * LN_K];
    tu_tget(&tdx, dx2);
    tu_tget(&tdW, dW2);
    for (int i = 0; i < LN_R * LN_K; i++) assert_true(fabsf(dx2[i] - 2 * dx[i]) <= 1e-6f * (1 + fabsf(dx[i])));
    for (int i = 0; i < LN_N * LN_K; i++) assert_true(fabsf(dW2[i] - 1.5f * dW[i]) <= 1e-6f * (1 + fabsf(dW[i])));
    TU_TFREE(cx, &tdy, &tdx, &tdW);
  }
  TU_TFREE(cx, &tx, &tW, &ty);
}

typedef struct { float *x, *W, *r, *y; } ln_ctx;
static double ln_loss(void *p) {
  ln_ctx *k = p;
  run_linear(k->x, k->W, NULL, k->y, NULL, NULL);
  return tu_dot(k->r, k->y, LN_R * LN_N);
}

static void test_linear(void **state) {
  (void)state;
  float *x = tu_randn_new(LN_R * LN_K, 1.0f, 70), *W = tu_randn_new(LN_N * LN_K, 1.0f, 71);
  float *r = tu_randn_new(LN_R * LN_N, 1.0f, 72), *y = tu_zeros(LN_R * LN_N);
  float *dx = tu_zeros(LN_R * LN_K), *dW = tu_zeros(LN_N * LN_K);
  run_linear(x, W, r, y, dx, dW);
  for (int i = 0; i < LN_R; i++) /* y = x @ W^T as nn.Linear */
    for (int o = 0; o < LN_N; o++) {
      double s = 0;
      for (int k = 0; k < LN_K; k++) s += (double)x[i * LN_K + k] * W[o * LN_K + k];
      assert_true(fabs(y[i * LN_N + o] - s) < 1e-5);
    }
  ln_ctx k = {x, W, r, tu_zeros(LN_R * LN_N)};
  tu_fd_check(ln_loss, &k, x, LN_R * LN_K, dx, FD_EPS, FD_TOL, "linear dx");
  tu_fd_check(ln_loss, &k, W, LN_N * LN_K, dW, FD_EPS, FD_TOL, "linear dW");
  free(x); free(W); free(r); free(y); free(dx); free(dW); free(k.y);
}

/* ---- GEMM ------------------------------------------------------------------------- */

/* Reference C = alpha op(A) op(B) + beta C0 in double, reading operands as stored
 * (rounded to their dtype); mag gets sum |alpha a b| + |beta c0| for the error bound. */
static void gemm_ref(const vl_gemm *g, const float *A, const float *B, const float *C0, double *out,
                     double *mag) {
  for (int64_t b = 0; b < g->batch; b++)
    for (int64_t m = 0; m < g->M; m++)
      for (int64_t n = 0; n < g->N; n++) {
        double s = 0, a = 0;
        for (int64_t k = 0; k < g->K; k++) {
          int64_t ia = g->a_off + b * g->sa + (g->ta ? k * g->lda + m : m * g->lda + k);
          int64_t ib = g->b_off + b * g->sb + (g->tb ? n * g->ldb + k : k * g->ldb + n);
          double p = (double)A[ia] * (double)B[ib];
          s += p;
          a += fabs(p);
        }
        int64_t ic = g->c_off + b * g->sc + m * g->ldc + n;
        out[ic] = g->alpha * s + (g->beta != 0.0f ? g->beta * (double)C0[ic] : 0.0);
        mag[ic] = fabs(g->alpha) * a + (g->beta != 0.0f ? fabs(g->beta * (double)C0[ic]) : 0.0);
      }
}

/* Run one GEMM configuration with operands of the given dtypes through vl_gemm_run and
 * compare every element of C (including the untouched padding) with the reference. */
static void gemm_case(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch, float alpha,
                      float beta, vl_dtype adt, vl_dtype bdt, vl_dtype cdt, uint64_t seed) {
  /* padded leading dimensions, offsets and batch strides */
  int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  int64_t lda = ac + 3, ldb = bc + 2, ldc = N + 1;
  int64_t sa = ar * lda + 5, sb = br * ldb + 7, sc = M * ldc + 2;
  int64_t a_off = 4, b_off = 6, c_off = 3;
  int64_t na = a_off + batch * sa, nb = b_off + batch * sb, nc = c_off + batch * sc;
  float *A = tu_randn_new(na, 1.0f, seed), *B = tu_randn_new(nb, 1.0f, seed + 1),
        *C0 = tu_randn_new(nc, 1.0f, seed + 2);
  if (beta == 0.0f) /* with beta = 0, C's old contents must be ignored, NaN included */
    for (int64_t i = 0; i < nc; i++) C0[i] = NAN;
  vl_tensor tA = tu_tnew(cx, adt, na, A), tB = tu_tnew(cx, bdt, nb, B), tC = tu_tnew(cx, cdt, nc, C0);
  float *Ar = tu_rounded(A, na, adt), *Br = tu_rounded(B, nb, bdt), *Cr = tu_rounded(C0, nc, cdt);
  vl_gemm g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta,
               .A = &tA, .a_off = a_off, .lda = lda, .sa = sa,
               .B = &tB, .b_off = b_off, .ldb = ldb, .sb = sb,
               .C = &tC, .c_off = c_off, .ldc = ldc, .sc = sc, .batch = batch};
  double *ref = calloc((size_t)nc, sizeof *ref), *mag = calloc((size_t)nc, sizeof *mag);
  gemm_ref(&g, Ar, Br, Cr, ref, mag);
  size_t live = vl_arena_live_blocks(cx->arena);
  vl_arena_reset_peaks(cx->arena);
  OK(vl_gemm_run(cx, &g));
  /* the workspace came from the arena for the call only */
  vl_mem_stats st;
  vl_arena_stats(cx->arena, &st);
  size_t ws = vl_gemm_ws_cpu(&g);
  assert_int_equal(st.peak[VL_MEM_WORKSPACE], (ws + VL_ARENA_ALIGN - 1) / VL_ARENA_ALIGN * VL_ARENA_ALIGN);
  assert_int_equal(st.cur[VL_MEM_WORKSPACE], 0);
  assert_int_equal(vl_arena_live_blocks(cx->arena), live);
  float *got = tu_zeros(nc);
  tu_tget(&tC, got);
  /* fp32 accumulation: error <= K * 2^-24 * mag (< 1e-5 * mag for K < 160); then the
   * rounding of C to its dtype */
  double u = tu_unit_roundoff(cdt);
  for (int64_t i = 0; i < nc; i++) {
    bool in_c = false; /* inside one of the batch's M x N blocks, not padding */
    for (int64_t b = 0; b < batch && !in_c; b++) {
      int64_t o = i - c_off - b * sc;
      in_c = o >= 0 && o < M * ldc && o % ldc < N;
    }
    if (!in_c) { /* padding and gaps between batches stay untouched */
      if (!(got[i] == Cr[i] || (isnan(got[i]) && isnan(Cr[i])))) {
        print_error("gemm wrote padding element %lld\n", (long long)i);
        fail();
      }
      continue;
    }
    double want = ref[i], tol = 1e-5 * mag[i] + u * fabs(want) + 1e-6;
    if (!(fabs(got[i] - want) <= tol)) {
      print_error("gemm ta=%d tb=%d %s/%s/%s batch %lld: C[%lld] = %.8g, want %.8g\n", ta, tb,
                  vl_dtype_name(adt), vl_dtype_name(bdt), vl_dtype_name(cdt), (long long)batch,
                  (long long)i, got[i], want);
      fail();
    }
  }
  TU_TFREE(cx, &tA, &tB, &tC);
  free(A); free(B); free(C0); free(Ar); free(Br); free(Cr); free(ref); free(mag); free(got);
}

static void test_gemm_layouts(void **state) {
  (void)state;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      gemm_case(ta, tb, 5, 6, 7, 1, 1.0f, 0.0f, VL_F32, VL_F32, VL_F32, 100);
      gemm_case(ta, tb, 5, 6, 7, 3, 1.5f, 0.5f, VL_F32, VL_F32, VL_F32, 110); /* batch, accumulate */
      gemm_case(ta, tb, 4, 3, 9, 2, -0.5f, 1.0f, VL_F32, VL_F32, VL_F32, 120);
    }
}

static void test_gemm_dtypes(void **state) {
  (void)state;
  const vl_dtype lp[3] = {VL_F32, VL_F16, VL_BF16};
  uint64_t seed = 200;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
          gemm_case(ta, tb, 5, 6, 7, 2, 1.0f, 0.0f, lp[a], lp[b], VL_F32, seed += 3);
          gemm_case(ta, tb, 5, 6, 7, 2, 1.0f, 1.0f, lp[a], lp[b], lp[(a + b) % 3], seed += 3);
        }
  /* large enough for the parallel conversion loops (rows * cols > 8192) */
  gemm_case(false, true, 96, 100, 128, 1, 1.0f, 0.0f, VL_BF16, VL_F16, VL_BF16, 300);
}

static void test_gemm_nf4(void **state) {
  (void)state;
  enum { R = 6, K = 128, N = 8 }; /* W (N,K): 1024 weights, 16 NF4 blocks */
  float *W = tu_randn_new(N * K, 0.05f, 400), *Wd = tu_zeros(N * K), *x = tu_randn_new(R * K, 1.0f, 401);
  float *dy = tu_randn_new(R * N, 1.0f, 402);
  vl_tensor tq;
  OK(vl_tensor_alloc2(cx, &tq, VL_NF4, VL_MEM_FROZEN, N, K));
  assert_int_equal(vl_nf4_quantize_host(tq.data, W, N * K), 0);
  vl_nf4_dequantize_host(Wd, tq.data, N * K);
  vl_tensor tW = tu_tnew(cx, VL_F32, N * K, Wd), tx = tu_tnew(cx, VL_F32, R * K, x),
            tdy = tu_tnew(cx, VL_F32, R * N, dy);
  vl_tensor y1 = tu_tnew(cx, VL_F32, R * N, NULL), y2 = tu_tnew(cx, VL_F32, R * N, NULL);
  vl_tensor d1 = tu_tnew(cx, VL_F32, R * K, NULL), d2 = tu_tnew(cx, VL_F32, R * K, NULL);
  /* forward (B transposed) and input gradient (B as is) through the frozen NF4 weight */
  OK(vl_linear_fwd(cx, &y1, &tx, &tq, R, K, N, 0.0f));
  OK(vl_linear_fwd(cx, &y2, &tx, &tW, R, K, N, 0.0f));
  OK(vl_linear_bwd_x(cx, &d1, &tdy, &tq, R, K, N, 0.0f));
  OK(vl_linear_bwd_x(cx, &d2, &tdy, &tW, R, K, N, 0.0f));
  float a[R * K], b[R * K];
  tu_tget(&y1, a);
  tu_tget(&y2, b);
  tu_assert_close(a, b, R * N, 1e-6, 1e-5, "nf4 linear fwd vs dequantised fp32");
  tu_tget(&d1, a);
  tu_tget(&d2, b);
  tu_assert_close(a, b, R * K, 1e-6, 1e-5, "nf4 linear bwd_x vs dequantised fp32");
  /* an NF4 operand is a whole contiguous matrix: a sub-matrix is refused */
  vl_gemm g = {.tb = true, .M = R, .N = N / 2, .K = K, .alpha = 1, .A = &tx, .lda = K,
               .B = &tq, .b_off = K * (N / 2), .ldb = K, .C = &y1, .ldc = N, .batch = 1};
  assert_int_equal(vl_gemm_run(cx, &g), VL_ERR_UNSUPPORTED);
  TU_TFREE(cx, &tq, &tW, &tx, &tdy, &y1, &y2, &d1, &d2);
  free(W); free(Wd); free(x); free(dy);
}

static void test_gemm_workspace_required(void **state) {
  (void)state;
  vl_tensor A = tu_tnew(cx, VL_F16, 16, NULL), B = tu_tnew(cx, VL_F32, 16, NULL),
            C = tu_tnew(cx, VL_F32, 16, NULL);
  vl_gemm g = {.M = 4, .N = 4, .K = 4, .alpha = 1, .A = &A, .lda = 4, .B = &B, .ldb = 4,
               .C = &C, .ldc = 4, .batch = 1};
  assert_int_equal(vl_gemm_ws_cpu(&g), 4 * 16); /* the fp16 A converted to fp32 */
  assert_int_equal(vl_op_ws_bytes(cx, VL_OP_GEMM, &g), 4 * 16);
  /* the kernel itself, without the dispatch that takes the workspace */
  assert_int_equal(cx->be->ops[VL_OP_GEMM](cx, &g), VL_ERR_INVALID); /* no workspace given */
  double f0 = cx->flops;
  OK(vl_gemm_run(cx, &g)); /* vl_op_run takes it from the arena */
  assert_true(cx->flops - f0 == 2.0 * 4 * 4 * 4); /* 2*M*N*K counted */
  TU_TFREE(cx, &A, &B, &C);
}

/* ---- elementwise conversion ops ------------------------------------------------------ */

static void test_convert_axpby(void **state) {
  (void)state;
  enum { N = 10000 }; /* above the parallel threshold */
  float *x = tu_randn_new(N, 3.0f, 500), *y = tu_randn_new(N, 1.0f, 501), *got = tu_zeros(N),
        *want = tu_zeros(N);
  for (int d = 0; d < 2; d++) {
    vl_dtype dt = LOWP[d], other = LOWP[1 - d];
    vl_tensor tx = tu_tnew(cx, VL_F32, N, x), tl = tu_tnew(cx, dt, N, NULL), to = tu_tnew(cx, other, N, NULL);
    OK(vl_convert_run(cx, &(vl_convert_args){.y = &tl, .x = &tx, .n = N}));
    tu_tget(&tl, got);
    for (int i = 0; i < N; i++) assert_true(got[i] == vl_round_to((int)dt, x[i]));
    OK(vl_convert_run(cx, &(vl_convert_args){.y = &to, .x = &tl,
                                             .n = N})); /* low -> other low: rounds the stored value */
    tu_tget(&to, got);
    for (int i = 0; i < N; i++) assert_true(got[i] == vl_round_to((int)other, vl_round_to((int)dt, x[i])));
    /* y = 0.5 x + 2 y in dt storage vs fp32 on rounded values */
    vl_tensor ty = tu_tnew(cx, dt, N, y), txl = tu_tnew(cx, dt, N, x);
    OK(vl_axpby_run(cx, &(vl_axpby_args){.y = &ty, .a = 0.5f, .x = &txl, .b = 2.0f, .n = N}));
    tu_tget(&ty, got);
    for (int i = 0; i < N; i++)
      want[i] = 0.5f * vl_round_to((int)dt, x[i]) + 2.0f * vl_round_to((int)dt, y[i]);
    tu_assert_close_dt(got, want, N, dt, "axpby");
    TU_TFREE(cx, &tx, &tl, &to, &ty, &txl);
  }
  /* b = 0 ignores whatever y held, NaN included */
  vl_tensor tx = tu_tnew(cx, VL_F32, N, x), ty = tu_tnew(cx, VL_F32, N, NULL);
  for (int i = 0; i < N; i++) ((float *)ty.data)[i] = NAN;
  OK(vl_axpby_run(cx, &(vl_axpby_args){.y = &ty, .a = 2.0f, .x = &tx, .b = 0.0f, .n = N}));
  tu_tget(&ty, got);
  for (int i = 0; i < N; i++) assert_true(got[i] == 2.0f * x[i]);
  TU_TFREE(cx, &tx, &ty);
  free(x); free(y); free(got); free(want);
}

/* ---- sumsq ------------------------------------------------------------------------ */

static void test_sumsq(void **state) {
  (void)state;
  enum { N = 10000 }; /* above the parallel threshold: the reduction runs threaded */
  float *x = tu_randn_new(N, 1.0f, 600);
  const vl_dtype dts[3] = {VL_F32, VL_F16, VL_BF16};
  for (int d = 0; d < 3; d++) {
    vl_dtype dt = dts[d];
    double want = 0;
    for (int i = 0; i < N; i++) { double v = vl_round_to((int)dt, x[i]); want += v * v; }
    vl_tensor t = tu_tnew(cx, dt, N, x);
    double s = -1;
    bool bad = true;
    OK(vl_sumsq_run(cx, &(vl_sumsq_args){.x = &t, .n = N, .out = &s, .nonfinite = &bad}));
    assert_false(bad);
    assert_true(fabs(s - want) <= 1e-12 * want);
    /* only the first n elements count */
    OK(vl_sumsq_run(cx, &(vl_sumsq_args){.x = &t, .n = 10, .out = &s, .nonfinite = &bad}));
    double w10 = 0;
    for (int i = 0; i < 10; i++) { double v = vl_round_to((int)dt, x[i]); w10 += v * v; }
    assert_true(fabs(s - w10) <= 1e-12 * w10);
    const float specials[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
      vl_st(t.data, (int)dt, 9000, specials[k]);
      s = -1;
      OK(vl_sumsq_run(cx, &(vl_sumsq_args){.x = &t, .n = N, .out = &s, .nonfinite = &bad}));
      assert_true(bad);
      assert_true(s == 0); /* no sum once a NaN/Inf is seen (every backend: vramlab/ops.h) */
      vl_st(t.data, (int)dt, 9000, x[9000]);
      OK(vl_sumsq_run(cx, &(vl_sumsq_args){.x = &t, .n = N, .out = &s, .nonfinite = &bad}));
      assert_false(bad);
    }
    vl_tensor_free(cx, &t);
  }
  /* a finite fp32 value past the fp16 range becomes inf once stored as fp16 */
  vl_tensor t = tu_tnew(cx, VL_F16, N, x);
  vl_st(t.data, VL_K_F16, 5, 1e5f);
  double s;
  bool bad = false;
  OK(vl_sumsq_run(cx, &(vl_sumsq_args){.x = &t, .n = N, .out = &s, .nonfinite = &bad}));
  assert_true(bad);
  vl_tensor_free(cx, &t);
  free(x);
}

/* ---- the dispatch point (vl_op_run) ------------------------------------------------- */

/* Every operation has a descriptor and a CPU kernel; names round-trip. */
static void test_op_table(void **state) {
  (void)state;
  for (int op = 0; op < VL_OP_COUNT; op++) {
    const vl_op_desc *d = vl_op_describe((vl_op)op);
    assert_non_null(d);
    assert_non_null(d->name);
    assert_non_null(d->cost);
    assert_true(d->args_size > 0);
    vl_op back;
    assert_int_equal(vl_op_parse(d->name, &back), 0);
    assert_int_equal(back, op);
    if (!vl_backend_cpu()->ops[op]) {
      print_error("the cpu backend lacks %s\n", d->name);
      fail();
    }
    assert_null(vl_backend_plan.ops[op]); /* plan never computes: a flag, not NULLs, says so */
  }
  assert_null(vl_op_describe(VL_OP_COUNT));
  assert_string_equal(vl_op_name(VL_OP_COUNT), "?");
}

/* A backend without a kernel for an op is an error naming both, never a silent skip; the
 * op is still counted (it was asked for). */
static void test_op_unsupported(void **state) {
  (void)state;
  vl_backend partial = *vl_backend_cpu();
  partial.name = "partial";
  partial.ops[VL_OP_ROPE] = NULL;
  const vl_backend *real = cx->be;
  vl_tensor x = tu_tnew(cx, VL_F32, 2 * 3 * 2 * 4, NULL);
  cx->be = &partial;
  double b0 = cx->bytes_moved;
  vl_status s = vl_rope_run(cx, &(vl_rope_args){.x = &x, .B = 2, .T = 3, .H = 2, .D = 4,
                                                .theta = 10000.0f, .inverse = false});
  cx->be = real;
  assert_int_equal(s, VL_ERR_UNSUPPORTED);
  assert_non_null(strstr(cx->err, "rope"));
  assert_non_null(strstr(cx->err, "partial"));
  assert_true(cx->bytes_moved > b0);
  OK(vl_rope_run(cx, &(vl_rope_args){.x = &x, .B = 2, .T = 3, .H = 2, .D = 4, .theta = 10000.0f,
                                     .inverse = false}));
  vl_tensor_free(cx, &x);
}

/* Plan contexts count and compute nothing (their tensors have no storage); FLOPs of a
 * checkpoint's re-run go to flops_recompute; the workspace of a planned GEMM is planned. */
static void test_op_counting(void **state) {
  (void)state;
  vl_ctx *p;
  OK(vl_ctx_create_ex(&p, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CPU));
  assert_true(p->plan);
  assert_false(cx->plan);
  vl_tensor a, b, y;
  OK(vl_tensor_alloc2(p, &a, VL_F16, VL_MEM_TEMP, 4, 8));
  OK(vl_tensor_alloc2(p, &b, VL_F32, VL_MEM_TEMP, 8, 5));
  OK(vl_tensor_alloc2(p, &y, VL_F32, VL_MEM_TEMP, 4, 5));
  assert_null(a.data);
  vl_gemm g = {.M = 4, .N = 5, .K = 8, .alpha = 1, .A = &a, .lda = 8, .B = &b, .ldb = 5,
               .C = &y, .ldc = 5, .batch = 1};
  vl_arena_reset_peaks(p->arena);
  OK(vl_gemm_run(p, &g));
  vl_mem_stats st;
  vl_arena_stats(p->arena, &st);
  assert_int_equal(st.peak[VL_MEM_WORKSPACE], VL_ARENA_ALIGN); /* the fp16 A as fp32: 128 B */
  assert_int_equal(st.cur[VL_MEM_WORKSPACE], 0);
  assert_true(p->flops == 2.0 * 4 * 5 * 8 && p->flops_recompute == 0);
  /* bytes: A (fp16) + C + B, as nn/linear.c counted them */
  assert_true(p->bytes_moved == 4 * 8 * 2 + 4 * 5 * 4 + 8 * 5 * 4);
  p->recomputing++;
  OK(vl_relu_fwd_run(p, &(vl_relu_fwd_args){.y = &y, .x = &y, .n = 20}));
  p->recomputing--;
  assert_true(p->flops == 2.0 * 4 * 5 * 8 && p->flops_recompute == 20);
  TU_TFREE(p, &a, &b, &y);
  vl_ctx_destroy(p);
}

/* ---- argument checks: a plan refuses what a run refuses ----------------------------------- */

/* One planted mismatch per function, on tensors of c (a CPU or a plan context). */
static vl_status planted_layernorm(vl_ctx *c) { /* x holds one row fewer than R */
  vl_tensor y, x, mean, rstd, g, b;
  OK(vl_tensor_alloc2(c, &y, VL_F32, VL_MEM_TEMP, 4, 8));
  OK(vl_tensor_alloc2(c, &x, VL_F32, VL_MEM_TEMP, 3, 8));
  OK(vl_tensor_alloc2(c, &mean, VL_F32, VL_MEM_TEMP, 1, 4));
  OK(vl_tensor_alloc2(c, &rstd, VL_F32, VL_MEM_TEMP, 1, 4));
  OK(vl_tensor_alloc2(c, &g, VL_F32, VL_MEM_TEMP, 1, 8));
  OK(vl_tensor_alloc2(c, &b, VL_F32, VL_MEM_TEMP, 1, 8));
  vl_layernorm_fwd_args a = {.y = &y, .mean = &mean, .rstd = &rstd, .x = &x, .gamma = &g,
                             .beta = &b, .R = 4, .C = 8, .eps = 1e-5f};
  vl_status s = vl_op_run(c, VL_OP_LAYERNORM_FWD, &a);
  TU_TFREE(c, &y, &x, &mean, &rstd, &g, &b);
  return s;
}
static vl_status planted_groupnorm(vl_ctx *c) { /* 3 groups of 8 channels */
  vl_tensor y, x, mean, rstd, g, b;
  OK(vl_tensor_alloc2(c, &y, VL_F32, VL_MEM_TEMP, 8, 4));
  OK(vl_tensor_alloc2(c, &x, VL_F32, VL_MEM_TEMP, 8, 4));
  OK(vl_tensor_alloc2(c, &mean, VL_F32, VL_MEM_TEMP, 1, 3));
  OK(vl_tensor_alloc2(c, &rstd, VL_F32, VL_MEM_TEMP, 1, 3));
  OK(vl_tensor_alloc2(c, &g, VL_F32, VL_MEM_TEMP, 1, 8));
  OK(vl_tensor_alloc2(c, &b, VL_F32, VL_MEM_TEMP, 1, 8));
  vl_groupnorm_fwd_args a = {.y = &y, .mean = &mean, .rstd = &rstd, .x = &x, .gamma = &g,
                             .beta = &b, .N = 1, .C = 8, .HW = 4, .G = 3, .eps = 1e-5f};
  vl_status s = vl_op_run(c, VL_OP_GROUPNORM_FWD, &a);
  TU_TFREE(c, &y, &x, &mean, &rstd, &g, &b);
  return s;
}
static vl_status planted_attention(vl_ctx *c) { /* causal with 4 queries and 6 keys */
  vl_tensor o, lse, q, k, v;
  OK(vl_tensor_alloc2(c, &o, VL_F32, VL_MEM_TEMP, 4, 8));
  OK(vl_tensor_alloc2(c, &lse, VL_F32, VL_MEM_TEMP, 1, 4));
  OK(vl_tensor_alloc2(c, &q, VL_F32, VL_MEM_TEMP, 4, 8));
  OK(vl_tensor_alloc2(c, &k, VL_F32, VL_MEM_TEMP, 6, 8));
  OK(vl_tensor_alloc2(c, &v, VL_F32, VL_MEM_TEMP, 6, 8));
  vl_attn_fwd_args a = {.o = &o, .lse = &lse, .q = &q, .k = &k, .v = &v, .B = 1, .H = 1,
                        .Tq = 4, .Tk = 6, .D = 8, .scale = 0.35f, .causal = true};
  vl_status s = vl_op_run(c, VL_OP_ATTN_FWD, &a);
  TU_TFREE(c, &o, &lse, &q, &k, &v);
  return s;
}
static vl_status planted_token_ids(vl_ctx *c) { /* ids stored as fp32 */
  vl_tensor out, wte, tok;
  OK(vl_tensor_alloc2(c, &out, VL_F32, VL_MEM_TEMP, 3, 4));
  OK(vl_tensor_alloc2(c, &wte, VL_F32, VL_MEM_TEMP, 10, 4));
  OK(vl_tensor_alloc2(c, &tok, VL_F32, VL_MEM_TEMP, 1, 3));
  vl_embed_fwd_args a = {.out = &out, .wte = &wte, .tok = &tok, .R = 3, .C = 4};
  vl_status s = vl_op_run(c, VL_OP_EMBED_FWD, &a);
  TU_TFREE(c, &out, &wte, &tok);
  return s;
}

/* The descriptors check arguments on every backend: each planted mismatch is refused by a
 * plan with the status and message of a CPU run, before anything is counted. */
static void test_op_check_plan_equals_run(void **state) {
  (void)state;
  vl_status (*const planted[])(vl_ctx *) = {planted_layernorm, planted_groupnorm,
                                            planted_attention, planted_token_ids};
  for (size_t i = 0; i < sizeof planted / sizeof *planted; i++) {
    vl_ctx *p;
    OK(vl_ctx_create_ex(&p, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CPU));
    double flops = cx->flops, bytes = cx->bytes_moved;
    assert_int_equal(planted[i](cx), VL_ERR_INVALID);
    assert_int_equal(planted[i](p), VL_ERR_INVALID);
    print_message("  %s\n", p->err);
    assert_string_equal(p->err, cx->err);
    assert_true(cx->flops == flops && cx->bytes_moved == bytes);
    assert_true(p->flops == 0 && p->bytes_moved == 0);
    vl_ctx_destroy(p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_op_table),
      cmocka_unit_test(test_op_unsupported),
      cmocka_unit_test(test_op_counting),
      cmocka_unit_test(test_op_check_plan_equals_run),
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_permute),
      cmocka_unit_test(test_softmax_causal),
      cmocka_unit_test(test_softmax_full),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_xent),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_gemm_layouts),
      cmocka_unit_test(test_gemm_dtypes),
      cmocka_unit_test(test_gemm_nf4),
      cmocka_unit_test(test_gemm_workspace_required),
      cmocka_unit_test(test_convert_axpby),
      cmocka_unit_test(test_sumsq),
  };
  return cmocka_run_group_tests(tests, tu_cpu_setup, tu_cpu_teardown);
}
