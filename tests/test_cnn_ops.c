/* CPU backend, CNN element/plane ops (engine/kernels/{norm,act,pool,loss}.h through
 * cpu_norm.c, cpu_act.c, cpu_pool.c, cpu_loss.c): batch norm
 * (training, evaluation, backward), ReLU, max pooling, bilinear 2x upsampling, channel copy
 * and per-pixel cross-entropy.
 *
 * Every backward is checked against central finite differences of a random projection
 * L = sum(r * out) (double accumulation, step 1e-3 on inputs of O(1)), tolerance
 * |fd - an| <= 1e-2 * max(1, |an|): the truncation error is ~eps^2/6 |L'''| ~ 1e-7, the fp32
 * rounding of L (<= 100 outputs of O(1), ~6e-8 each) over the step 2e-3 is <= 3e-3 at
 * worst, while a wrong term, sign, factor or index is off by O(0.1-1). Inputs of piecewise
 * ops (ReLU, max pooling) keep a margin of >10 steps from their kinks, so the differences
 * never cross one.
 * Forward values are checked against double-precision references written here from the
 * PyTorch definitions, and hand-computed cases (padding, ties, edge clamping).
 * Storage dtypes: each op computes in fp32 from the values it loads, so an fp16/bf16 run
 * must equal the fp32 op on the rounded inputs up to the rounding of its outputs:
 * |got - ref| <= u |ref| + 1e-7, u the unit roundoff (2^-11 fp16, 2^-8 bf16); fp32 outputs
 * (mean, rstd, fp32 gradients) within a few fp32 ulps (the fp32 fast path and the generic
 * path sum in different orders, in double).
 * The CUDA backend runs the strided forms of the per-channel sums and the gather forms of
 * the pooling backward; both are run here against the CPU forms. */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/loss.h"
#include "kernels/norm.h"
#include "kernels/pool.h"
#include "vramlab/backend.h"

#define FD_EPS 1e-3f
#define FD_TOL 1e-2
#define OK(expr) assert_int_equal((expr), VL_OK)
#define cx tu_cpu

/* ---- helpers (tensors, host arrays, the finite-difference and storage-dtype checks:
 * testutil.h) ------------------------------------------------------------------------- */

/* Keep |x| >= m away from a kink at 0 (ReLU) without changing the sign. */
static void away_from_zero(float *x, int64_t n, float m) {
  for (int64_t i = 0; i < n; i++) x[i] += x[i] < 0 ? -m : m;
}

static void same_bits(const float *a, const float *b, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      print_error("%s element %lld: %.9g vs %.9g\n", what, (long long)i, a[i], b[i]);
      fail();
    }
}

static const vl_dtype LOWP[2] = {VL_F16, VL_BF16};

/* ---- batch norm runners ------------------------------------------------------------- */

typedef struct { int64_t N, C, HW; } bn_dims;
static int64_t bn_n(bn_dims d) { return d.N * d.C * d.HW; }
#define BN_EPS 1e-5f
#define BN_MOM 0.1f

/* Training forward; rm/rv (C) are updated in place when given; gamma/beta stored in dt. */
static void run_bn_train(bn_dims d, vl_dtype dt, const float *x, const float *g, const float *b,
                         float *y, float *mean, float *rstd, float *rm, float *rv) {
  int64_t n = bn_n(d);
  vl_tensor tx = tu_tnew(cx, dt, n, x), ty = tu_tnew(cx, dt, n, NULL), tg = tu_tnew(cx, dt, d.C, g),
            tb = tu_tnew(cx, dt, d.C, b);
  vl_tensor tm = tu_tnew(cx, VL_F32, d.C, NULL), ts = tu_tnew(cx, VL_F32, d.C, NULL);
  vl_tensor trm = tu_tnew(cx, VL_F32, d.C, rm), trv = tu_tnew(cx, VL_F32, d.C, rv);
  OK(vl_bn_fwd_train_run(cx, &(vl_bn_fwd_train_args){.y = &ty, .mean = &tm, .rstd = &ts,
                          .rmean = rm ? &trm : NULL, .rvar = rv ? &trv : NULL, .x = &tx,
                          .gamma = &tg, .beta = &tb, .N = d.N, .C = d.C, .HW = d.HW, .eps = BN_EPS,
                          .momentum = BN_MOM}));
  if (y) tu_tget(&ty, y);
  if (mean) tu_tget(&tm, mean);
  if (rstd) tu_tget(&ts, rstd);
  if (rm) tu_tget(&trm, rm);
  if (rv) tu_tget(&trv, rv);
  TU_TFREE(cx, &tx, &ty, &tg, &tb, &tm, &ts, &trm, &trv);
}

/* Backward; dg/db (C, fp32) accumulate in place when given; alias: dx written over dy. */
static void run_bn_bwd(bn_dims d, vl_dtype dt, const float *x, const float *g, const float *dy,
                       const float *mean, const float *rstd, float *dx, float *dg, float *db,
                       bool alias) {
  int64_t n = bn_n(d);
  vl_tensor tx = tu_tnew(cx, dt, n, x), tg = tu_tnew(cx, dt, d.C, g), tdy = tu_tnew(cx, dt, n, dy);
  vl_tensor tdx = alias ? tdy : tu_tnew(cx, dt, n, NULL);
  vl_tensor tm = tu_tnew(cx, VL_F32, d.C, mean), ts = tu_tnew(cx, VL_F32, d.C, rstd);
  vl_tensor tdg = tu_tnew(cx, VL_F32, d.C, dg), tdb = tu_tnew(cx, VL_F32, d.C, db);
  OK(vl_bn_bwd_run(cx, &(vl_bn_bwd_args){.dx = &tdx, .dgamma = dg ? &tdg : NULL,
                    .dbeta = db ? &tdb : NULL, .dy = &tdy, .x = &tx, .gamma = &tg, .mean = &tm,
                    .rstd = &ts, .N = d.N, .C = d.C, .HW = d.HW}));
  tu_tget(&tdx, dx);
  if (dg) tu_tget(&tdg, dg);
  if (db) tu_tget(&tdb, db);
  if (!alias) vl_tensor_free(cx, &tdx);
  TU_TFREE(cx, &tx, &tg, &tdy, &tm, &ts, &tdg, &tdb);
}

/* x (N, C, HW) with channel c around offs[c] with spread sc[c] */
static float *bn_input(bn_dims d, const float *offs, const float *sc, uint64_t seed) {
  float *x = tu_randn_new(bn_n(d), 1.0f, seed);
  for (int64_t n = 0; n < d.N; n++)
    for (int64_t c = 0; c < d.C; c++)
      for (int64_t i = 0; i < d.HW; i++) {
        float *v = &x[(n * d.C + c) * d.HW + i];
        *v = offs[c] + sc[c] * *v;
      }
  return x;
}

/* ---- batch norm: training forward -------------------------------------------------- */

static void test_bn_train_forward(void **state) {
  (void)state;
  const bn_dims d = {3, 4, 5};
  const int64_t n = bn_n(d), C = d.C, M = d.N * d.HW;
  /* channel 2 sits at 1000 with spread 1: E[x^2] - E[x]^2 in fp32 would lose it entirely */
  const float offs[4] = {0.5f, -2.0f, 1000.0f, 0.0f}, sc[4] = {1.0f, 3.0f, 1.0f, 0.5f};
  float *x = bn_input(d, offs, sc, 1), *g = tu_randn_new(C, 0.5f, 2), *b = tu_randn_new(C, 1.0f, 3);
  for (int64_t c = 0; c < C; c++) g[c] += 1.0f;
  float rm0[4] = {0.3f, -0.2f, 5.0f, 0.0f}, rv0[4] = {1.0f, 2.0f, 0.5f, 1.5f};
  float rm[4], rv[4], mean[4], rstd[4];
  memcpy(rm, rm0, sizeof rm);
  memcpy(rv, rv0, sizeof rv);
  float *y = tu_zeros(n), *y2 = tu_zeros(n);
  run_bn_train(d, VL_F32, x, g, b, y, mean, rstd, rm, rv);

  for (int64_t c = 0; c < C; c++) {
    double s = 0, ss = 0;
    for (int64_t k = 0; k < d.N; k++)
      for (int64_t i = 0; i < d.HW; i++) s += x[(k * C + c) * d.HW + i];
    double mu = s / M;
    for (int64_t k = 0; k < d.N; k++)
      for (int64_t i = 0; i < d.HW; i++) {
        double e = x[(k * C + c) * d.HW + i] - mu;
        ss += e * e;
      }
    double var = ss / M, rs = 1.0 / sqrt(var + BN_EPS);
    assert_true(fabs(mean[c] - mu) <= 1e-6 * fmax(1.0, fabs(mu)));
    assert_true(fabs(rstd[c] - rs) <= 1e-6 * rs); /* fp32 sums of x^2 would fail at 1000 */
    /* PyTorch: running mean with the batch mean, running var with the UNBIASED variance */
    double want_rm = (1 - BN_MOM) * rm0[c] + BN_MOM * mu;
    double want_rv = (1 - BN_MOM) * rv0[c] + BN_MOM * var * M / (M - 1);
    assert_true(fabs(rm[c] - want_rm) <= 1e-5 * fmax(1.0, fabs(want_rm)));
    assert_true(fabs(rv[c] - want_rv) <= 1e-5 * want_rv);
    assert_false(fabs(rv[c] - ((1 - BN_MOM) * rv0[c] + BN_MOM * var)) <= 1e-4 * want_rv);
    /* y = (x - mean) rstd gamma + beta; the fp32 mean near 1000 carries ~1 ulp (6e-5) */
    double tol = 1e-5 + 4 * FLT_EPSILON * fabs(mu) * rs * fabs(g[c]);
    for (int64_t k = 0; k < d.N; k++)
      for (int64_t i = 0; i < d.HW; i++) {
        int64_t o = (k * C + c) * d.HW + i;
        double want = (x[o] - mu) * rs * g[c] + b[c];
        if (!(fabs(y[o] - want) <= tol)) {
          print_error("bn y[%lld] = %.8g, want %.8g\n", (long long)o, y[o], want);
          fail();
        }
      }
  }

  /* gamma 1, beta 0: each channel of y has mean 0 and biased variance var/(var+eps) ~ 1 */
  float ones[4] = {1, 1, 1, 1}, nil[4] = {0, 0, 0, 0};
  run_bn_train(d, VL_F32, x, ones, nil, y2, NULL, NULL, NULL, NULL); /* no running stats */
  for (int64_t c = 0; c < C; c++) {
    double s = 0, ss = 0;
    for (int64_t k = 0; k < d.N; k++)
      for (int64_t i = 0; i < d.HW; i++) s += y2[(k * C + c) * d.HW + i];
    for (int64_t k = 0; k < d.N; k++)
      for (int64_t i = 0; i < d.HW; i++) {
        double e = y2[(k * C + c) * d.HW + i] - s / M;
        ss += e * e;
      }
    double tol = c == 2 ? 1e-3 : 1e-5; /* channel 2: fp32 x - mean near 1000 */
    assert_true(fabs(s / M) < tol);
    assert_true(fabs(ss / M - 1.0) < 1e-4 + tol);
  }

  /* a constant channel: variance 0, y = beta, no NaN */
  float xc[2 * 1 * 3] = {7, 7, 7, 7, 7, 7}, yc[6], mc, rc;
  float g1 = 2.0f, b1 = 0.25f;
  run_bn_train((bn_dims){2, 1, 3}, VL_F32, xc, &g1, &b1, yc, &mc, &rc, NULL, NULL);
  assert_true(mc == 7.0f && fabs(rc - 1.0 / sqrt(BN_EPS)) < 1e-3 * rc);
  for (int i = 0; i < 6; i++) assert_true(yc[i] == 0.25f);

  /* storage dtypes: x, y, gamma, beta in fp16/bf16; mean, rstd, running stats fp32 */
  for (int k = 0; k < 2; k++) {
    vl_dtype dt = LOWP[k];
    float *xr = tu_rounded(x, n, dt), *gr = tu_rounded(g, C, dt), *br = tu_rounded(b, C, dt);
    float *yref = tu_zeros(n), *ygot = tu_zeros(n), mref[4], mgot[4], sref[4], sgot[4];
    float rmr[4], rvr[4], rmg[4], rvg[4];
    memcpy(rmr, rm0, sizeof rmr); memcpy(rvr, rv0, sizeof rvr);
    memcpy(rmg, rm0, sizeof rmg); memcpy(rvg, rv0, sizeof rvg);
    run_bn_train(d, VL_F32, xr, gr, br, yref, mref, sref, rmr, rvr);
    run_bn_train(d, dt, x, g, b, ygot, mgot, sgot, rmg, rvg);
    /* channel 2 at 1000 rounds to a few distinct values in bf16: compare the others */
    for (int64_t c = 0; c < C; c++) {
      if (c == 2) continue;
      for (int64_t s = 0; s < d.N; s++)
        tu_assert_close_dt(ygot + (s * C + c) * d.HW, yref + (s * C + c) * d.HW, d.HW, dt, "bn y");
    }
    tu_assert_close_dt(mgot, mref, C, VL_F32, "bn mean");
    tu_assert_close_dt(sgot, sref, C, VL_F32, "bn rstd");
    tu_assert_close_dt(rmg, rmr, C, VL_F32, "bn running mean");
    tu_assert_close_dt(rvg, rvr, C, VL_F32, "bn running var");
    free(xr); free(gr); free(br); free(yref); free(ygot);
  }
  free(x); free(g); free(b); free(y); free(y2);
}

/* ---- batch norm: evaluation ---------------------------------------------------------- */

static void run_bn_eval(bn_dims d, vl_dtype dt, const float *x, const float *g, const float *b,
                        const float *rm, const float *rv, float *y, bool alias) {
  int64_t n = bn_n(d);
  vl_tensor tx = tu_tnew(cx, dt, n, x), ty = alias ? tx : tu_tnew(cx, dt, n, NULL);
  vl_tensor tg = tu_tnew(cx, dt, d.C, g), tb = tu_tnew(cx, dt, d.C, b);
  vl_tensor trm = tu_tnew(cx, VL_F32, d.C, rm), trv = tu_tnew(cx, VL_F32, d.C, rv);
  OK(vl_bn_fwd_eval_run(cx, &(vl_bn_fwd_eval_args){.y = &ty, .x = &tx, .gamma = &tg, .beta = &tb,
                                                   .rmean = &trm, .rvar = &trv, .N = d.N, .C = d.C,
                                                   .HW = d.HW, .eps = BN_EPS}));
  tu_tget(&ty, y);
  if (!alias) vl_tensor_free(cx, &ty);
  TU_TFREE(cx, &tx, &tg, &tb, &trm, &trv);
}

static void test_bn_eval(void **state) {
  (void)state;
  const bn_dims d = {2, 3, 7};
  const int64_t n = bn_n(d), C = d.C;
  float *x = tu_randn_new(n, 2.0f, 10), *g = tu_randn_new(C, 0.5f, 11), *b = tu_randn_new(C, 1.0f, 12);
  float rm[3] = {0.5f, -1.0f, 2.0f}, rv[3] = {0.25f, 4.0f, 1e-6f}; /* rv ~ eps: eps matters */
  float *y = tu_zeros(n), *y2 = tu_zeros(n);
  run_bn_eval(d, VL_F32, x, g, b, rm, rv, y, false);
  for (int64_t i = 0; i < n; i++) {
    int64_t c = (i / d.HW) % C;
    double want = (x[i] - rm[c]) / sqrt((double)rv[c] + BN_EPS) * g[c] + b[c];
    assert_true(fabs(y[i] - want) <= 1e-5 * fmax(1.0, fabs(want)));
  }
  run_bn_eval(d, VL_F32, x, g, b, rm, rv, y2, true); /* y may alias x */
  same_bits(y2, y, n, "bn eval in place");
  for (int k = 0; k < 2; k++) {
    vl_dtype dt = LOWP[k];
    float *xr = tu_rounded(x, n, dt), *gr = tu_rounded(g, C, dt), *br = tu_rounded(b, C, dt);
    float *yref = tu_zeros(n), *ygot = tu_zeros(n);
    run_bn_eval(d, VL_F32, xr, gr, br, rm, rv, yref, false);
    run_bn_eval(d, dt, x, g, b, rm, rv, ygot, true);
    tu_assert_close_dt(ygot, yref, n, dt, "bn eval y");
    free(xr); free(gr); free(br); free(yref); free(ygot);
  }
  free(x); free(g); free(b); free(y); free(y2);
}

/* ---- batch norm: backward ------------------------------------------------------------- */

typedef struct { bn_dims d; float *x, *g, *b, *r, *y; } bn_ctx;
static double bn_loss(void *p) {
  bn_ctx *k = p;
  run_bn_train(k->d, VL_F32, k->x, k->g, k->b, k->y, NULL, NULL, NULL, NULL);
  return tu_dot(k->r, k->y, bn_n(k->d));
}

static void test_bn_bwd(void **state) {
  (void)state;
  const bn_dims d = {2, 3, 4};
  const int64_t n = bn_n(d), C = d.C;
  const float offs[3] = {0.5f, -1.0f, 3.0f}, sc[3] = {1.0f, 0.7f, 1.5f};
  float *x = bn_input(d, offs, sc, 20), *g = tu_randn_new(C, 0.5f, 21), *b = tu_randn_new(C, 1.0f, 22);
  float *r = tu_randn_new(n, 1.0f, 23);
  for (int64_t c = 0; c < C; c++) g[c] += 1.0f;
  float mean[3], rstd[3], dg0[3] = {0.5f, -0.25f, 1.0f}, db0[3] = {-1.0f, 0.0f, 2.0f};
  float dg[3], db[3], dgan[3], dban[3];
  memcpy(dg, dg0, sizeof dg);
  memcpy(db, db0, sizeof db);
  float *dx = tu_zeros(n), *dx2 = tu_zeros(n), *dx3 = tu_zeros(n), *y = tu_zeros(n);
  run_bn_train(d, VL_F32, x, g, b, y, mean, rstd, NULL, NULL);
  run_bn_bwd(d, VL_F32, x, g, r, mean, rstd, dx, dg, db, false);
  for (int64_t c = 0; c < C; c++) { dgan[c] = dg[c] - dg0[c]; dban[c] = db[c] - db0[c]; }

  bn_ctx k = {d, x, g, b, r, tu_zeros(n)};
  tu_fd_check(bn_loss, &k, x, n, dx, FD_EPS, FD_TOL, "bn dx");
  tu_fd_check(bn_loss, &k, g, C, dgan, FD_EPS, FD_TOL, "bn dgamma");
  tu_fd_check(bn_loss, &k, b, C, dban, FD_EPS, FD_TOL, "bn dbeta");
  /* dbeta = sum dy per channel exactly as defined; accumulation kept the initial values */
  for (int64_t c = 0; c < C; c++) {
    double s = 0;
    for (int64_t m = 0; m < d.N; m++)
      for (int64_t i = 0; i < d.HW; i++) s += r[(m * C + c) * d.HW + i];
    assert_true(fabs(dban[c] - s) < 1e-5);
  }

  run_bn_bwd(d, VL_F32, x, g, r, mean, rstd, dx2, NULL, NULL, false); /* no dgamma/dbeta */
  same_bits(dx2, dx, n, "bn dx without dgamma/dbeta");
  run_bn_bwd(d, VL_F32, x, g, r, mean, rstd, dx3, NULL, NULL, true); /* dx aliases dy */
  same_bits(dx3, dx, n, "bn dx in place");

  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *xr = tu_rounded(x, n, dt), *gr = tu_rounded(g, C, dt), *rr = tu_rounded(r, n, dt);
    float *dref = tu_zeros(n), *dgot = tu_zeros(n), gref[3] = {0}, ggot[3] = {0}, bref[3] = {0},
          bgot[3] = {0};
    run_bn_train(d, VL_F32, xr, gr, b, NULL, mean, rstd, NULL, NULL);
    run_bn_bwd(d, VL_F32, xr, gr, rr, mean, rstd, dref, gref, bref, false);
    run_bn_bwd(d, dt, x, g, r, mean, rstd, dgot, ggot, bgot, true);
    tu_assert_close_dt(dgot, dref, n, dt, "bn dx");
    tu_assert_close_dt(ggot, gref, C, VL_F32, "bn dgamma (fp32)");
    tu_assert_close_dt(bgot, bref, C, VL_F32, "bn dbeta (fp32)");
    free(xr); free(gr); free(rr); free(dref); free(dgot);
  }
  free(x); free(g); free(b); free(r); free(dx); free(dx2); free(dx3); free(y); free(k.y);
}

/* The CUDA kernels' composition, run on the CPU: per channel, VL_THREADS strided partial
 * sums added by the same halving tree, the same finish and apply bodies. It must match the
 * CPU backend (plane-by-plane sums) to rounding: what gpu-check then sees on a device. */
enum { TREE = 256 };
static void tree_sum(double *a) {
  for (int k = TREE / 2; k > 0; k >>= 1)
    for (int t = 0; t < k; t++) a[t] += a[t + k];
}

static void bn_cuda_form(bn_dims d, uint64_t seed) {
  const int64_t n = bn_n(d), C = d.C, HW = d.HW, M = d.N * HW;
  const float offs[5] = {1, -3, 100, 0, 2}, sc[5] = {1, 2, 0.5f, 1, 3};
  float *x = bn_input(d, offs, sc, seed), *g = tu_randn_new(C, 0.5f, seed + 1),
        *b = tu_randn_new(C, 1.0f, seed + 2);
  float *dy = tu_randn_new(n, 1.0f, seed + 3);
  float *y = tu_zeros(n), *yk = tu_zeros(n), *dx = tu_zeros(n), *dxk = tu_zeros(n);
  float mean[5], rstd[5], mk[5], rk[5], dg[5] = {0}, db[5] = {0}, dgk[5] = {0}, dbk[5] = {0};
  run_bn_train(d, VL_F32, x, g, b, y, mean, rstd, NULL, NULL);
  run_bn_bwd(d, VL_F32, x, g, dy, mean, rstd, dx, dg, db, false);
  static double p1[TREE], p2[TREE];
  for (int64_t c = 0; c < C; c++) {
    float K = vl_k_bn_shift(x, VL_K_F32, HW, c);
    for (int t = 0; t < TREE; t++) {
      p1[t] = p2[t] = 0;
      vl_k_bn_sums_strided(x, VL_K_F32, C, HW, M, c, K, t, TREE, &p1[t], &p2[t]);
    }
    tree_sum(p1); tree_sum(p2);
    vl_k_bn_affine a = vl_k_bn_train_finish(mk, rk, NULL, NULL, g, VL_K_F32, b, VL_K_F32, c,
                                            p1[0], p2[0], K, M, BN_EPS, BN_MOM);
    int visited = 0;
    for (int t = 0; t < TREE; t++) {
      vl_k_cpos p = vl_k_cpos_at(HW, t, TREE);
      for (int64_t j = t; j < M; j += TREE, visited++) {
        int64_t o = vl_k_cpos_off(&p, C, HW, c);
        assert_int_equal(o, (j / HW * C + c) * HW + j % HW); /* the walk's offsets */
        vl_k_bn_apply(yk, VL_K_F32, x, VL_K_F32, a, o);
        vl_k_cpos_next(&p, HW);
      }
    }
    assert_int_equal(visited, M);
    for (int t = 0; t < TREE; t++) {
      p1[t] = p2[t] = 0;
      vl_k_bn_bwd_sums_strided(dy, VL_K_F32, x, VL_K_F32, C, HW, M, c, mk[c], t, TREE, &p1[t], &p2[t]);
    }
    tree_sum(p1); tree_sum(p2);
    vl_k_bn_grad gr = vl_k_bn_bwd_finish(dgk, VL_K_F32, dbk, VL_K_F32, g, VL_K_F32, mk, rk, c,
                                         p1[0], p2[0], M);
    for (int64_t m = 0; m < d.N; m++)
      for (int64_t i = 0; i < HW; i++)
        vl_k_bn_bwd_apply(dxk, VL_K_F32, dy, VL_K_F32, x, VL_K_F32, gr, (m * C + c) * HW + i);
  }
  tu_assert_close(mk, mean, C, 0, 1e-6, "mean (cuda form)");
  tu_assert_close(rk, rstd, C, 0, 1e-6, "rstd (cuda form)");
  tu_assert_close(yk, y, n, 1e-6, 1e-5, "y (cuda form)");
  tu_assert_close(dgk, dg, C, 1e-6, 1e-5, "dgamma (cuda form)");
  tu_assert_close(dbk, db, C, 1e-6, 1e-5, "dbeta (cuda form)");
  tu_assert_close(dxk, dx, n, 1e-6, 1e-5, "dx (cuda form)");
  /* evaluation, per-element form (CUDA) against the per-plane loop (CPU) */
  float rv[5] = {0.5f, 1, 2, 3, 4};
  run_bn_eval(d, VL_F32, x, g, b, mean, rv, y, false);
  for (int64_t i = 0; i < n; i++)
    vl_k_bn_eval_elem(yk, VL_K_F32, x, VL_K_F32, mean, rv, g, VL_K_F32, b, VL_K_F32, C, HW, BN_EPS, i);
  tu_assert_close(yk, y, n, 1e-6, 1e-6, "eval y (cuda form)");
  free(x); free(g); free(b); free(dy); free(y); free(yk); free(dx); free(dxk);
}

static void test_bn_cuda_form(void **state) {
  (void)state;
  /* M = N*HW spans a few block strides: HW < 256 and not a divisor (a stride crosses
   * several planes), then HW > 256 (a stride stays within a plane or wraps to the next) */
  bn_cuda_form((bn_dims){16, 5, 37}, 30);
  bn_cuda_form((bn_dims){3, 2, 300}, 40);
}

/* ---- ReLU ----------------------------------------------------------------------------- */

enum { RL_N = 50 };

static void run_relu(vl_dtype dt, const float *x, const float *dy, float *y, float *dx, bool alias) {
  vl_tensor tx = tu_tnew(cx, dt, RL_N, x), ty = alias ? tx : tu_tnew(cx, dt, RL_N, NULL);
  OK(vl_relu_fwd_run(cx, &(vl_relu_fwd_args){.y = &ty, .x = &tx, .n = RL_N}));
  tu_tget(&ty, y);
  if (dy) {
    vl_tensor tdy = tu_tnew(cx, dt, RL_N, dy), tdx = alias ? tdy : tu_tnew(cx, dt, RL_N, NULL);
    OK(vl_relu_bwd_run(cx, &(vl_relu_bwd_args){.dx = &tdx, .dy = &tdy, .y = &ty, .n = RL_N}));
    tu_tget(&tdx, dx);
    if (!alias) vl_tensor_free(cx, &tdx);
    vl_tensor_free(cx, &tdy);
  }
  if (!alias) vl_tensor_free(cx, &ty);
  vl_tensor_free(cx, &tx);
}

typedef struct { float *x, *r, *y; } rl_ctx;
static double relu_loss(void *p) {
  rl_ctx *k = p;
  run_relu(VL_F32, k->x, NULL, k->y, NULL, false);
  return tu_dot(k->r, k->y, RL_N);
}

static void test_relu(void **state) {
  (void)state;
  float *x = tu_randn_new(RL_N, 1.0f, 40), *r = tu_randn_new(RL_N, 1.0f, 41);
  away_from_zero(x, RL_N, 0.02f);
  float *y = tu_zeros(RL_N), *dx = tu_zeros(RL_N), *y2 = tu_zeros(RL_N), *dx2 = tu_zeros(RL_N);
  run_relu(VL_F32, x, r, y, dx, false);
  for (int i = 0; i < RL_N; i++) {
    assert_true(y[i] == (x[i] > 0 ? x[i] : 0.0f));
    assert_true(dx[i] == (x[i] > 0 ? r[i] : 0.0f));
  }
  rl_ctx k = {x, r, tu_zeros(RL_N)};
  tu_fd_check(relu_loss, &k, x, RL_N, dx, FD_EPS, FD_TOL, "relu dx");
  run_relu(VL_F32, x, r, y2, dx2, true); /* y aliases x, dx aliases dy */
  same_bits(y2, y, RL_N, "relu in place");
  same_bits(dx2, dx, RL_N, "relu_bwd in place");

  /* NaN propagates forward as torch.relu; a NaN dy where the unit is off gives 0 */
  float xs[3] = {NAN, -1.0f, 2.0f}, dys[3] = {1.0f, NAN, 3.0f}, ys[3], dxs[3];
  vl_tensor tx = tu_tnew(cx, VL_F32, 3, xs), ty = tu_tnew(cx, VL_F32, 3, NULL),
            tdy = tu_tnew(cx, VL_F32, 3, dys);
  vl_tensor tdx = tu_tnew(cx, VL_F32, 3, NULL);
  OK(vl_relu_fwd_run(cx, &(vl_relu_fwd_args){.y = &ty, .x = &tx, .n = 3}));
  OK(vl_relu_bwd_run(cx, &(vl_relu_bwd_args){.dx = &tdx, .dy = &tdy, .y = &ty, .n = 3}));
  tu_tget(&ty, ys);
  tu_tget(&tdx, dxs);
  assert_true(isnan(ys[0]) && ys[1] == 0.0f && ys[2] == 2.0f);
  assert_true(dxs[0] == 0.0f && dxs[1] == 0.0f && dxs[2] == 3.0f);
  TU_TFREE(cx, &tx, &ty, &tdy, &tdx);

  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *xr = tu_rounded(x, RL_N, dt), *rr = tu_rounded(r, RL_N, dt);
    float *yref = tu_zeros(RL_N), *dref = tu_zeros(RL_N), *ygot = tu_zeros(RL_N), *dgot = tu_zeros(RL_N);
    run_relu(VL_F32, xr, rr, yref, dref, false);
    run_relu(dt, x, r, ygot, dgot, true);
    tu_assert_close_dt(ygot, yref, RL_N, dt, "relu y");
    tu_assert_close_dt(dgot, dref, RL_N, dt, "relu dx");
    free(xr); free(rr); free(yref); free(dref); free(ygot); free(dgot);
  }
  /* mixed dtypes: fp32 x into a bf16 y */
  vl_tensor a = tu_tnew(cx, VL_F32, RL_N, x), bb = tu_tnew(cx, VL_BF16, RL_N, NULL);
  OK(vl_relu_fwd_run(cx, &(vl_relu_fwd_args){.y = &bb, .x = &a, .n = RL_N}));
  tu_tget(&bb, y2);
  for (int i = 0; i < RL_N; i++) assert_true(y2[i] == vl_round_to(VL_K_BF16, y[i]));
  TU_TFREE(cx, &a, &bb);
  free(x); free(r); free(y); free(dx); free(y2); free(dx2); free(k.y);
}

/* ---- max pooling ------------------------------------------------------------------------ */

typedef struct { int64_t planes, H, W; int k, s, p; int64_t P, Q; } pool_geo;
static int64_t pin(pool_geo g) { return g.planes * g.H * g.W; }
static int64_t pout(pool_geo g) { return g.planes * g.P * g.Q; }

/* Reference: scan the window's in-image elements in row-major order; a later element wins
 * only when strictly greater (or NaN), as PyTorch's CPU kernel. arg: plane offset h*W + w. */
static void pool_ref(pool_geo g, const float *x, float *y, int64_t *arg) {
  for (int64_t pl = 0; pl < g.planes; pl++)
    for (int64_t oh = 0; oh < g.P; oh++)
      for (int64_t ow = 0; ow < g.Q; ow++) {
        double m = -INFINITY;
        int64_t a = -1;
        for (int64_t dh = 0; dh < g.k; dh++)
          for (int64_t dw = 0; dw < g.k; dw++) {
            int64_t h = oh * g.s - g.p + dh, w = ow * g.s - g.p + dw;
            if (h < 0 || h >= g.H || w < 0 || w >= g.W) continue; /* padding: never a candidate */
            double v = x[pl * g.H * g.W + h * g.W + w];
            if (a < 0 || v > m || isnan(v)) { m = v; a = h * g.W + w; }
          }
        int64_t o = (pl * g.P + oh) * g.Q + ow;
        y[o] = (float)m;
        if (arg) arg[o] = a;
      }
}

static vl_status run_pool(pool_geo g, vl_dtype dt, const float *x, const float *dy, float *y, float *dx) {
  vl_tensor tx = tu_tnew(cx, dt, pin(g), x), ty = tu_tnew(cx, dt, pout(g), NULL);
  vl_status s = vl_maxpool_fwd_run(cx, &(vl_maxpool_fwd_args){.y = &ty, .x = &tx,
                                                              .planes = g.planes, .H = g.H,
                                                              .W = g.W, .k = g.k, .stride = g.s,
                                                              .pad = g.p, .P = g.P, .Q = g.Q});
  if (s == VL_OK) tu_tget(&ty, y);
  if (s == VL_OK && dy) {
    vl_tensor tdy = tu_tnew(cx, dt, pout(g), dy), tdx = tu_tnew(cx, dt, pin(g), NULL);
    s = vl_maxpool_bwd_run(cx, &(vl_maxpool_bwd_args){.dx = &tdx, .dy = &tdy, .x = &tx,
                                                      .planes = g.planes, .H = g.H, .W = g.W,
                                                      .k = g.k, .stride = g.s, .pad = g.p, .P = g.P,
                                                      .Q = g.Q});
    if (s == VL_OK) tu_tget(&tdx, dx);
    TU_TFREE(cx, &tdy, &tdx);
  }
  TU_TFREE(cx, &tx, &ty);
  return s;
}

typedef struct { pool_geo g; float *x, *r, *y; } pool_ctx;
static double pool_loss(void *p) {
  pool_ctx *k = p;
  OK(run_pool(k->g, VL_F32, k->x, NULL, k->y, NULL));
  return tu_dot(k->r, k->y, pout(k->g));
}

/* Distinct values spaced 0.05 apart in a random order: FD steps never change an argmax. */
static float *distinct(int64_t n, uint64_t seed) {
  float *x = malloc((size_t)n * sizeof *x);
  vl_rng r;
  vl_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++) x[i] = 0.05f * (float)(i - n / 2);
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)vl_rng_below(&r, (uint64_t)i + 1);
    float t = x[i]; x[i] = x[j]; x[j] = t;
  }
  return x;
}

static void test_maxpool(void **state) {
  (void)state;
  const pool_geo geos[3] = {
      {2, 5, 6, 3, 2, 1, 3, 3}, /* ResNet's stem pool shape, overlapping windows, padding */
      {2, 5, 6, 3, 2, 1, 3, 4}, /* ceil_mode width: the last window half outside */
      {3, 4, 4, 2, 2, 0, 2, 2}, /* U-Net's 2x2 */
  };
  for (int gi = 0; gi < 3; gi++) {
    pool_geo g = geos[gi];
    int64_t ni = pin(g), no = pout(g);
    float *x = distinct(ni, 50 + gi), *r = tu_randn_new(no, 1.0f, 60 + gi);
    for (int64_t i = 0; i < ni; i++) x[i] -= 10.0f; /* all negative: zero padding would win */
    float *y = tu_zeros(no), *yr = tu_zeros(no), *dx = tu_zeros(ni);
    int64_t *arg = malloc((size_t)no * sizeof *arg);
    OK(run_pool(g, VL_F32, x, r, y, dx));
    pool_ref(g, x, yr, arg);
    same_bits(y, yr, no, "maxpool y");
    for (int64_t i = 0; i < no; i++) assert_true(y[i] < 0); /* padding never won */
    pool_ctx k = {g, x, r, tu_zeros(no)};
    tu_fd_check(pool_loss, &k, x, ni, dx, FD_EPS, FD_TOL, "maxpool dx");
    for (int q = 0; q < 2; q++) {
      vl_dtype dt = LOWP[q];
      float *xr = tu_rounded(x, ni, dt), *rr = tu_rounded(r, no, dt);
      float *yref = tu_zeros(no), *dref = tu_zeros(ni), *ygot = tu_zeros(no), *dgot = tu_zeros(ni);
      OK(run_pool(g, VL_F32, xr, rr, yref, dref));
      OK(run_pool(g, dt, x, r, ygot, dgot)); /* fp16/bf16 dx: the gather form */
      tu_assert_close_dt(ygot, yref, no, dt, "maxpool y");
      tu_assert_close_dt(dgot, dref, ni, dt, "maxpool dx");
      free(xr); free(rr); free(yref); free(dref); free(ygot); free(dgot);
    }
    free(x); free(r); free(y); free(yr); free(dx); free(arg); free(k.y);
  }

  /* ties: a constant 3x3 plane, window 3, stride 1, pad 1. Output (oh, ow)'s first
   * in-image element is (max(oh-1,0), max(ow-1,0)), so with dy = 1 the gradient counts
   * how many windows start there: [[4,2,0],[2,1,0],[0,0,0]] */
  pool_geo t = {1, 3, 3, 3, 1, 1, 3, 3};
  float xc[9], dyc[9], yc[9], dxc[9];
  for (int i = 0; i < 9; i++) { xc[i] = 1.5f; dyc[i] = 1.0f; }
  OK(run_pool(t, VL_F32, xc, dyc, yc, dxc));
  const float want[9] = {4, 2, 0, 2, 1, 0, 0, 0, 0};
  same_bits(dxc, want, 9, "maxpool ties");
  /* a NaN in a window wins it, as in PyTorch */
  xc[4] = NAN;
  OK(run_pool(t, VL_F32, xc, NULL, yc, NULL));
  for (int i = 0; i < 9; i++) assert_true(isnan(yc[i])); /* every window holds the centre */
}

/* The CUDA gather form against the CPU scatter: the same adds in the same order, so bit for
 * bit with fp32 dx, on overlapping windows with many ties (values in {0, 0.5, 1}). */
static void test_maxpool_gather_scatter(void **state) {
  (void)state;
  const pool_geo g = {3, 9, 8, 3, 2, 1, 5, 4};
  int64_t ni = pin(g), no = pout(g);
  float *x = tu_randn_new(ni, 1.0f, 70), *dy = tu_randn_new(no, 1.0f, 71);
  for (int64_t i = 0; i < ni; i++) x[i] = 0.5f * (float)((int)fabsf(2.0f * x[i]) % 3);
  float *a = tu_zeros(ni), *b = tu_zeros(ni);
  for (int64_t p = 0; p < g.planes; p++)
    vl_k_maxpool_bwd_plane(a, VL_K_F32, dy, VL_K_F32, x, VL_K_F32, g.H, g.W, g.k, g.s, g.p, g.P, g.Q, p);
  for (int64_t i = 0; i < ni; i++)
    vl_k_maxpool_bwd_gather(b, VL_K_F32, dy, VL_K_F32, x, VL_K_F32, g.H, g.W, g.k, g.s, g.p, g.P, g.Q, i);
  same_bits(b, a, ni, "maxpool gather vs scatter");
  free(x); free(dy); free(a); free(b);
}

/* ---- bilinear 2x upsampling ------------------------------------------------------------- */

/* PyTorch's upsample_bilinear2d, align_corners=False, scale 2, in double: source
 * s = max(0, (d + 0.5)/2 - 0.5), i0 = floor(s), i1 = min(i0 + 1, n - 1), weight s - i0. */
static void up_ref(const float *x, int64_t planes, int64_t H, int64_t W, double *y) {
  for (int64_t p = 0; p < planes; p++)
    for (int64_t oh = 0; oh < 2 * H; oh++)
      for (int64_t ow = 0; ow < 2 * W; ow++) {
        double sh = fmax(0.0, (oh + 0.5) / 2 - 0.5), sw = fmax(0.0, (ow + 0.5) / 2 - 0.5);
        int64_t h0 = (int64_t)floor(sh), w0 = (int64_t)floor(sw);
        int64_t h1 = h0 + 1 < H ? h0 + 1 : H - 1, w1 = w0 + 1 < W ? w0 + 1 : W - 1;
        double lh = sh - h0, lw = sw - w0;
        const float *q = x + p * H * W;
        y[(p * 2 * H + oh) * 2 * W + ow] =
            (1 - lh) * ((1 - lw) * q[h0 * W + w0] + lw * q[h0 * W + w1]) +
            lh * ((1 - lw) * q[h1 * W + w0] + lw * q[h1 * W + w1]);
      }
}

static void run_up(vl_dtype dt, int64_t planes, int64_t H, int64_t W, const float *x,
                   const float *dy, float *y, float *dx) {
  int64_t lo = planes * H * W, hi = 4 * lo;
  vl_tensor tx = tu_tnew(cx, dt, lo, x), ty = tu_tnew(cx, dt, hi, NULL);
  OK(vl_upsample2x_fwd_run(cx, &(vl_upsample2x_fwd_args){.y = &ty, .x = &tx, .planes = planes,
                                                         .H = H, .W = W, .nearest = false}));
  tu_tget(&ty, y);
  if (dy) {
    vl_tensor tdy = tu_tnew(cx, dt, hi, dy), tdx = tu_tnew(cx, dt, lo, NULL);
    OK(vl_upsample2x_bwd_run(cx, &(vl_upsample2x_bwd_args){.dx = &tdx, .dy = &tdy, .planes = planes,
                                                           .H = H, .W = W, .nearest = false}));
    tu_tget(&tdx, dx);
    TU_TFREE(cx, &tdy, &tdx);
  }
  TU_TFREE(cx, &tx, &ty);
}

typedef struct { int64_t planes, H, W; float *x, *r, *y; } up_ctx;
static double up_loss(void *p) {
  up_ctx *k = p;
  run_up(VL_F32, k->planes, k->H, k->W, k->x, NULL, k->y, NULL);
  return tu_dot(k->r, k->y, 4 * k->planes * k->H * k->W);
}

static void test_upsample(void **state) {
  (void)state;
  /* hand case, the well-known F.interpolate([[1,2],[3,4]], scale_factor=2, bilinear) */
  const float x22[4] = {1, 2, 3, 4};
  const float want[16] = {1.0f, 1.25f, 1.75f, 2.0f, 1.5f, 1.75f, 2.25f, 2.5f,
                          2.5f, 2.75f, 3.25f, 3.5f, 3.0f, 3.25f, 3.75f, 4.0f};
  float y22[16];
  run_up(VL_F32, 1, 2, 2, x22, NULL, y22, NULL);
  same_bits(y22, want, 16, "upsample 2x2");

  const int64_t shapes[3][3] = {{2, 3, 4}, {1, 1, 3}, {2, 5, 1}}; /* planes, H, W; 1 = edge */
  for (int si = 0; si < 3; si++) {
    int64_t P = shapes[si][0], H = shapes[si][1], W = shapes[si][2], lo = P * H * W, hi = 4 * lo;
    float *x = tu_randn_new(lo, 1.0f, 80 + si), *r = tu_randn_new(hi, 1.0f, 90 + si);
    float *y = tu_zeros(hi), *dx = tu_zeros(lo);
    double *yr = malloc((size_t)hi * sizeof *yr);
    run_up(VL_F32, P, H, W, x, r, y, dx);
    up_ref(x, P, H, W, yr);
    for (int64_t i = 0; i < hi; i++) assert_true(fabs(y[i] - yr[i]) <= 1e-6 * fmax(1.0, fabs(yr[i])));
    up_ctx k = {P, H, W, x, r, tu_zeros(hi)};
    tu_fd_check(up_loss, &k, x, lo, dx, FD_EPS, FD_TOL, "upsample dx");
    /* and the adjoint identity <up(x), r> = <x, up^T(r)> */
    assert_true(fabs(tu_dot(y, r, hi) - tu_dot(x, dx, lo)) < 1e-5 * (1 + fabs(tu_dot(y, r, hi))));
    for (int q = 0; q < 2; q++) {
      vl_dtype dt = LOWP[q];
      float *xr = tu_rounded(x, lo, dt), *rr = tu_rounded(r, hi, dt);
      float *yref = tu_zeros(hi), *dref = tu_zeros(lo), *ygot = tu_zeros(hi), *dgot = tu_zeros(lo);
      run_up(VL_F32, P, H, W, xr, rr, yref, dref);
      run_up(dt, P, H, W, x, r, ygot, dgot);
      tu_assert_close_dt(ygot, yref, hi, dt, "upsample y");
      tu_assert_close_dt(dgot, dref, lo, dt, "upsample dx");
      free(xr); free(rr); free(yref); free(dref); free(ygot); free(dgot);
    }
    free(x); free(r); free(y); free(dx); free(yr); free(k.y);
  }
}

/* ---- channel copy --------------------------------------------------------------------- */

enum { CC_N = 2, CC_YC = 5, CC_XC = 4, CC_HW = 3, CC_Y0 = 2, CC_X0 = 1, CC_NC = 2 };
#define CC_NY (CC_N * CC_YC * CC_HW)
#define CC_NX (CC_N * CC_XC * CC_HW)

static void run_cc(vl_dtype ydt, vl_dtype xdt, const float *y0, const float *x, float *y, bool acc) {
  vl_tensor ty = tu_tnew(cx, ydt, CC_NY, y0), tx = tu_tnew(cx, xdt, CC_NX, x);
  OK(vl_chan_copy_run(cx, &(vl_chan_copy_args){.y = &ty, .yC = CC_YC, .y_c0 = CC_Y0, .x = &tx,
                                               .xC = CC_XC, .x_c0 = CC_X0, .nc = CC_NC, .N = CC_N,
                                               .HW = CC_HW, .accumulate = acc}));
  tu_tget(&ty, y);
  TU_TFREE(cx, &ty, &tx);
}

typedef struct { float *x, *r, *y; } cc_ctx;
static double cc_loss(void *p) {
  cc_ctx *k = p;
  run_cc(VL_F32, VL_F32, NULL, k->x, k->y, false);
  return tu_dot(k->r, k->y, CC_NY);
}

static void test_chan_copy(void **state) {
  (void)state;
  float *x = tu_randn_new(CC_NX, 1.0f, 100), *y0 = tu_randn_new(CC_NY, 1.0f, 101),
        *r = tu_randn_new(CC_NY, 1.0f, 102);
  float *y = tu_zeros(CC_NY), *ya = tu_zeros(CC_NY);
  run_cc(VL_F32, VL_F32, y0, x, y, false);  /* memcpy path */
  run_cc(VL_F32, VL_F32, y0, x, ya, true);  /* element path, adding */
  for (int n = 0; n < CC_N; n++)
    for (int c = 0; c < CC_YC; c++)
      for (int s = 0; s < CC_HW; s++) {
        int yo = (n * CC_YC + c) * CC_HW + s;
        bool in = c >= CC_Y0 && c < CC_Y0 + CC_NC;
        float xv = in ? x[(n * CC_XC + c - CC_Y0 + CC_X0) * CC_HW + s] : 0.0f;
        assert_true(y[yo] == (in ? xv : y0[yo]));      /* other channels untouched */
        assert_true(ya[yo] == (in ? y0[yo] + xv : y0[yo]));
      }
  /* the per-element form (CUDA) over the copied block (N, nc, HW), both modes */
  for (int acc = 0; acc < 2; acc++) {
    float *ye = malloc(sizeof(float) * CC_NY);
    memcpy(ye, y0, sizeof(float) * CC_NY);
    for (int64_t i = 0; i < CC_N * CC_NC * CC_HW; i++)
      vl_k_chan_copy(ye, VL_K_F32, CC_YC, CC_Y0, x, VL_K_F32, CC_XC, CC_X0, CC_NC, CC_HW, acc, i);
    same_bits(ye, acc ? ya : y, CC_NY, "chan_copy (cuda form)");
    free(ye);
  }
  /* backward of a concat is the same op the other way, adding into dx: its adjoint */
  float *dx = tu_zeros(CC_NX);
  vl_tensor tr = tu_tnew(cx, VL_F32, CC_NY, r), tdx = tu_tnew(cx, VL_F32, CC_NX, NULL);
  OK(vl_chan_copy_run(cx, &(vl_chan_copy_args){.y = &tdx, .yC = CC_XC, .y_c0 = CC_X0, .x = &tr,
                                               .xC = CC_YC, .x_c0 = CC_Y0, .nc = CC_NC, .N = CC_N,
                                               .HW = CC_HW, .accumulate = true}));
  tu_tget(&tdx, dx);
  TU_TFREE(cx, &tr, &tdx);
  cc_ctx k = {x, r, tu_zeros(CC_NY)};
  tu_fd_check(cc_loss, &k, x, CC_NX, dx, FD_EPS, FD_TOL, "chan_copy dx");
  /* dtype conversions: fp32 into bf16 (element path), fp16 into fp16 adding */
  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *xr = tu_rounded(x, CC_NX, dt), *yr = tu_rounded(y0, CC_NY, dt);
    float *ref = tu_zeros(CC_NY), *got = tu_zeros(CC_NY);
    run_cc(VL_F32, VL_F32, yr, xr, ref, true);
    run_cc(dt, dt, y0, x, got, true);
    tu_assert_close_dt(got, ref, CC_NY, dt, "chan_copy accumulate");
    run_cc(VL_F32, VL_F32, yr, x, ref, false);
    run_cc(dt, VL_F32, y0, x, got, false);
    for (int i = 0; i < CC_NY; i++) assert_true(got[i] == vl_round_to((int)dt, ref[i]));
    free(xr); free(yr); free(ref); free(got);
  }
  free(x); free(y0); free(r); free(y); free(ya); free(dx); free(k.y);
}

/* ---- per-pixel cross-entropy ------------------------------------------------------------ */

enum { XP_N = 2, XP_K = 5, XP_HW = 6, XP_PIX = XP_N * XP_HW, XP_NL = XP_N * XP_K * XP_HW };
static const int32_t XP_TGT[XP_PIX] = {0, 4, -1, 2, 1, 3, 4, -1, 0, 2, 2, 1};
#define XP_VALID 10

/* Host int32 ids as a VL_I32 tensor (the CPU backend reads host memory). */
static vl_tensor ids_of(const int32_t *p, int64_t n) {
  vl_tensor t;
  memset(&t, 0, sizeof t);
  vl_tensor_set_shape(&t, VL_I32, 1, &n);
  t.device = VL_DEV_CPU;
  t.data = (void *)p;
  return t;
}

static void run_xp(vl_dtype dt, const float *l, float *loss, float *dl) {
  vl_tensor tl = tu_tnew(cx, dt, XP_NL, l), tloss = tu_tnew(cx, VL_F32, XP_PIX, NULL);
  vl_tensor tgt = ids_of(XP_TGT, XP_PIX);
  OK(vl_xent_pix_run(cx, &(vl_xent_pix_args){.logits = &tl, .loss = &tloss, .tgt = &tgt, .N = XP_N,
                                             .K = XP_K, .HW = XP_HW,
                                             .dloss_scale = 1.0f / XP_VALID}));
  tu_tget(&tloss, loss);
  if (dl) tu_tget(&tl, dl);
  TU_TFREE(cx, &tl, &tloss);
}

typedef struct { float *l, *loss; } xp_ctx;
static double xp_loss(void *p) {
  xp_ctx *k = p;
  run_xp(VL_F32, k->l, k->loss, NULL);
  double s = 0;
  for (int i = 0; i < XP_PIX; i++) s += k->loss[i];
  return s / XP_VALID; /* the mean over valid pixels: the gradient's dloss_scale */
}

static void test_xent_pix(void **state) {
  (void)state;
  float *l = tu_randn_new(XP_NL, 2.0f, 110), loss[XP_PIX], *dl = tu_zeros(XP_NL);
  run_xp(VL_F32, l, loss, dl);
  for (int p = 0; p < XP_PIX; p++) {
    int n = p / XP_HW, s = p % XP_HW, t = XP_TGT[p];
    if (t < 0) {
      assert_true(loss[p] == 0.0f);
      for (int k = 0; k < XP_K; k++) assert_true(dl[(n * XP_K + k) * XP_HW + s] == 0.0f);
      continue;
    }
    double mx = -INFINITY, sum = 0;
    for (int k = 0; k < XP_K; k++) mx = fmax(mx, l[(n * XP_K + k) * XP_HW + s]);
    for (int k = 0; k < XP_K; k++) sum += exp(l[(n * XP_K + k) * XP_HW + s] - mx);
    double want = log(sum) + mx - l[(n * XP_K + t) * XP_HW + s];
    assert_true(fabs(loss[p] - want) < 1e-5 * fmax(1.0, want));
  }
  xp_ctx k = {l, tu_zeros(XP_PIX)};
  tu_fd_check(xp_loss, &k, l, XP_NL, dl, FD_EPS, FD_TOL, "xent_pix dlogits");
  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *lr = tu_rounded(l, XP_NL, dt), lref[XP_PIX], lgot[XP_PIX];
    float *dref = tu_zeros(XP_NL), *dgot = tu_zeros(XP_NL);
    run_xp(VL_F32, lr, lref, dref);
    run_xp(dt, l, lgot, dgot);
    tu_assert_close_dt(lgot, lref, XP_PIX, VL_F32, "xent_pix loss (fp32 out)");
    tu_assert_close_dt(dgot, dref, XP_NL, dt, "xent_pix dlogits");
    free(lr); free(dref); free(dgot);
  }
  /* a label >= K is an error on the CPU (host targets), nothing written */
  int32_t bad[XP_PIX];
  memcpy(bad, XP_TGT, sizeof bad);
  bad[7] = XP_K;
  vl_tensor tl = tu_tnew(cx, VL_F32, XP_NL, l), tloss = tu_tnew(cx, VL_F32, XP_PIX, NULL);
  vl_tensor tbad = ids_of(bad, XP_PIX);
  assert_int_equal(vl_xent_pix_run(cx, &(vl_xent_pix_args){.logits = &tl, .loss = &tloss,
                                                           .tgt = &tbad, .N = XP_N, .K = XP_K,
                                                           .HW = XP_HW,
                                                           .dloss_scale = 1.0f}), VL_ERR_INVALID);
  assert_non_null(strstr(cx->err, "target"));
  float *lafter = tu_zeros(XP_NL);
  tu_tget(&tl, lafter);
  same_bits(lafter, l, XP_NL, "logits after a rejected call");
  /* the kernel body itself (what CUDA runs) gives that pixel a NaN loss, zero gradient */
  float bl[XP_PIX];
  for (int p = 0; p < XP_PIX; p++) vl_k_xent_pix(lafter, VL_K_F32, bl, bad, XP_K, XP_HW, 1.0f, p);
  assert_true(isnan(bl[7]) && !isnan(bl[6]));
  TU_TFREE(cx, &tl, &tloss);
  free(l); free(dl); free(k.loss); free(lafter);
}

/* ---- argument checks --------------------------------------------------------------------- */

#define BAD(expr, word) TU_BAD(cx, expr, word)

static void test_bad_args(void **state) {
  (void)state;
  vl_tensor x = tu_tnew(cx, VL_F32, 24, NULL), y = tu_tnew(cx, VL_F32, 24, NULL),
            small = tu_tnew(cx, VL_F32, 10, NULL);
  vl_tensor c3 = tu_tnew(cx, VL_F32, 3, NULL), c3b = tu_tnew(cx, VL_F32, 3, NULL),
            h3 = tu_tnew(cx, VL_F16, 3, NULL);
  vl_tensor c2 = tu_tnew(cx, VL_F32, 2, NULL);
  vl_tensor h24 = x; /* x's storage seen as fp16: an alias with another dtype */
  h24.dtype = VL_F16;
  /* batch norm (N, C, HW) = (2, 3, 4) */
  BAD(vl_bn_fwd_train_run(cx, &(vl_bn_fwd_train_args){.y = NULL, .mean = &c3, .rstd = &c3b,
                                                      .rmean = NULL, .rvar = NULL, .x = &x,
                                                      .gamma = &c3, .beta = &c3, .N = 2, .C = 3,
                                                      .HW = 4, .eps = BN_EPS,
                                                      .momentum = BN_MOM}), "y is NULL");
  BAD(vl_bn_fwd_train_run(cx, &(vl_bn_fwd_train_args){.y = &y, .mean = &c3, .rstd = &c3b,
                                                      .rmean = NULL, .rvar = NULL, .x = &small,
                                                      .gamma = &c3, .beta = &c3, .N = 2, .C = 3,
                                                      .HW = 4, .eps = BN_EPS,
                                                      .momentum = BN_MOM}), "x holds 10");
  BAD(vl_bn_fwd_train_run(cx, &(vl_bn_fwd_train_args){.y = &y, .mean = &h3, .rstd = &c3b,
                                                      .rmean = NULL, .rvar = NULL, .x = &x,
                                                      .gamma = &c3, .beta = &c3, .N = 2, .C = 3,
                                                      .HW = 4, .eps = BN_EPS,
                                                      .momentum = BN_MOM}), "mean is fp16");
  BAD(vl_bn_fwd_train_run(cx, &(vl_bn_fwd_train_args){.y = &x, .mean = &c3, .rstd = &c3b,
                                                      .rmean = NULL, .rvar = NULL, .x = &x,
                                                      .gamma = &c3, .beta = &c3, .N = 2, .C = 3,
                                                      .HW = 4, .eps = BN_EPS,
                                                      .momentum = BN_MOM}), "alias");
  BAD(vl_bn_fwd_train_run(cx, &(vl_bn_fwd_train_args){.y = &y, .mean = &c3, .rstd = &c3b,
                                                      .rmean = NULL, .rvar = NULL, .x = &x,
                                                      .gamma = &c3, .beta = &c3, .N = 1, .C = 3,
                                                      .HW = 1, .eps = BN_EPS,
                                                      .momentum = BN_MOM}), "more than 1");
  BAD(vl_bn_fwd_train_run(cx, &(vl_bn_fwd_train_args){.y = &y, .mean = &c3, .rstd = &c3b,
                                                      .rmean = NULL, .rvar = NULL, .x = &x,
                                                      .gamma = &c3, .beta = &c3, .N = 2, .C = -3,
                                                      .HW = 4, .eps = BN_EPS,
                                                      .momentum = BN_MOM}), "negative");
  BAD(vl_bn_fwd_train_run(cx, &(vl_bn_fwd_train_args){.y = &y, .mean = &c3, .rstd = &c3b,
                                                      .rmean = NULL, .rvar = NULL, .x = &x,
                                                      .gamma = &c3, .beta = &c3, .N = 2, .C = 3,
                                                      .HW = 4, .eps = BN_EPS,
                                                      .momentum = 1.5f}), "momentum");
  BAD(vl_bn_fwd_eval_run(cx, &(vl_bn_fwd_eval_args){.y = &h24, .x = &x, .gamma = &c3, .beta = &c3,
                                                    .rmean = &c3, .rvar = &c3b, .N = 2, .C = 3,
                                                    .HW = 4, .eps = BN_EPS}), "different dtypes");
  BAD(vl_bn_fwd_eval_run(cx, &(vl_bn_fwd_eval_args){.y = &y, .x = &x, .gamma = &c3, .beta = &c3,
                                                    .rmean = &h3, .rvar = &c3b, .N = 2, .C = 3,
                                                    .HW = 4,
                                                    .eps = BN_EPS}), "running mean is fp16");
  BAD(vl_bn_bwd_run(cx, &(vl_bn_bwd_args){.dx = &y, .dgamma = NULL, .dbeta = &c2, .dy = &x, .x = &x,
                                          .gamma = &c3, .mean = &c3, .rstd = &c3b, .N = 2, .C = 3,
                                          .HW = 4}), "dbeta holds 2");
  BAD(vl_bn_bwd_run(cx, &(vl_bn_bwd_args){.dx = &x, .dgamma = NULL, .dbeta = NULL, .dy = &y,
                                          .x = &x, .gamma = &c3, .mean = &c3, .rstd = &c3b, .N = 2,
                                          .C = 3, .HW = 4}), "dx and x");
  OK(vl_bn_fwd_train_run(cx, &(vl_bn_fwd_train_args){.y = &y, .mean = &c3, .rstd = &c3b,
                                                     .rmean = NULL, .rvar = NULL, .x = &x,
                                                     .gamma = &c3, .beta = &c3, .N = 0, .C = 3,
                                                     .HW = 4, .eps = BN_EPS,
                                                     .momentum = BN_MOM})); /* empty */
  /* ReLU */
  BAD(vl_relu_fwd_run(cx, &(vl_relu_fwd_args){.y = &y, .x = &x, .n = -1}), "n = -1");
  BAD(vl_relu_fwd_run(cx, &(vl_relu_fwd_args){.y = &y, .x = &small, .n = 24}), "x holds 10");
  BAD(vl_relu_bwd_run(cx, &(vl_relu_bwd_args){.dx = &y, .dy = &x, .y = NULL,
                                              .n = 24}), "y is NULL");
  BAD(vl_relu_fwd_run(cx, &(vl_relu_fwd_args){.y = &h24, .x = &x, .n = 24}), "different dtypes");
  /* pooling */
  BAD(vl_maxpool_fwd_run(cx, &(vl_maxpool_fwd_args){.y = &y, .x = &x, .planes = 1, .H = 4, .W = 6,
                                                    .k = 2, .stride = 2, .pad = 2, .P = 3,
                                                    .Q = 4}), "pad");               /* pad > k/2 */
  BAD(vl_maxpool_fwd_run(cx, &(vl_maxpool_fwd_args){.y = &y, .x = &x, .planes = 1, .H = 4, .W = 6,
                                                    .k = 2, .stride = 2, .pad = 0, .P = 3,
                                                    .Q = 3}), "does not fit");      /* window 3 starts at 4 */
  BAD(vl_maxpool_fwd_run(cx, &(vl_maxpool_fwd_args){.y = &small, .x = &x, .planes = 1, .H = 4,
                                                    .W = 6, .k = 1, .stride = 1, .pad = 0, .P = 4,
                                                    .Q = 6}), "y holds 10");
  BAD(vl_maxpool_bwd_run(cx, &(vl_maxpool_bwd_args){.dx = &x, .dy = &y, .x = &x, .planes = 1,
                                                    .H = 4, .W = 6, .k = 2, .stride = 2, .pad = 0,
                                                    .P = 2, .Q = 3}), "dx and x");
  /* upsampling: (2, 2, 3) -> (2, 4, 6) needs 48 */
  BAD(vl_upsample2x_fwd_run(cx, &(vl_upsample2x_fwd_args){.y = &y, .x = &x, .planes = 2, .H = 2,
                                                          .W = 3, .nearest = false}), "y holds 24");
  BAD(vl_upsample2x_bwd_run(cx, &(vl_upsample2x_bwd_args){.dx = &x, .dy = &x, .planes = 1, .H = 1,
                                                          .W = 1, .nearest = false}), "alias");
  /* channel copy */
  BAD(vl_chan_copy_run(cx, &(vl_chan_copy_args){.y = &y, .yC = 3, .y_c0 = 2, .x = &x, .xC = 3,
                                                .x_c0 = 0, .nc = 2, .N = 2, .HW = 4,
                                                .accumulate = false}), "out of range");
  BAD(vl_chan_copy_run(cx, &(vl_chan_copy_args){.y = &y, .yC = 3, .y_c0 = 0, .x = &x, .xC = 4,
                                                .x_c0 = 0, .nc = 2, .N = 2, .HW = 4,
                                                .accumulate = false}), "x holds 24");
  /* cross-entropy */
  int32_t tg[8] = {0};
  vl_tensor ttg = ids_of(tg, 8), tf = ttg;
  tf.dtype = VL_F32; /* ids stored as floats: refused */
  BAD(vl_xent_pix_run(cx, &(vl_xent_pix_args){.logits = &x, .loss = &h3, .tgt = &ttg, .N = 2,
                                              .K = 1, .HW = 1,
                                              .dloss_scale = 1.0f}), "loss is fp16");
  BAD(vl_xent_pix_run(cx, &(vl_xent_pix_args){.logits = &x, .loss = &c3, .tgt = &tf, .N = 1, .K = 3,
                                              .HW = 1, .dloss_scale = 1.0f}), "i32 expected");
  BAD(vl_xent_pix_run(cx, &(vl_xent_pix_args){.logits = &x, .loss = &small, .tgt = NULL, .N = 2,
                                              .K = 3, .HW = 4, .dloss_scale = 1.0f}), "NULL");
  TU_TFREE(cx, &x, &y, &small, &c3, &c3b, &h3, &c2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bn_train_forward),
      cmocka_unit_test(test_bn_eval),
      cmocka_unit_test(test_bn_bwd),
      cmocka_unit_test(test_bn_cuda_form),
      cmocka_unit_test(test_relu),
      cmocka_unit_test(test_maxpool),
      cmocka_unit_test(test_maxpool_gather_scatter),
      cmocka_unit_test(test_upsample),
      cmocka_unit_test(test_chan_copy),
      cmocka_unit_test(test_xent_pix),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, tu_cpu_setup, tu_cpu_teardown);
}
