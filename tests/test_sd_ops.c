/* CPU backend, Stable Diffusion's ops (engine/kernels/{norm,act,pool,embed,loss}.h through
 * cpu_norm.c, cpu_act.c, ...): GroupNorm, LayerNorm, SiLU / GELU / quick-GELU, GEGLU, bias,
 * zero padding, timestep embedding, fused MSE, the VAE's Gaussian sample, and the nearest
 * mode of 2x upsampling.
 *
 * Forward values are checked against double-precision references written here from the
 * PyTorch / diffusers definitions, with hand values chosen so that a convention slip fails
 * (GroupNorm's statistics per (sample, group) with the biased variance, GEGLU's value/gate
 * halves, the exact-erf GELU, quick-GELU's 1.702, the timestep embedding's frequencies and
 * halves, the log-variance clamp).
 * Every backward is checked against central finite differences of a random projection
 * L = sum(r * out) (double accumulation, step 1e-3 on inputs of O(1)), tolerance
 * |fd - an| <= 1e-2 max(1, |an|), as test_cnn_ops.c (the argument for those numbers is
 * there): a wrong term, sign, factor or index is off by O(0.1-1).
 * Storage dtypes: each op computes in fp32 from the values it loads, so an fp16/bf16 run
 * must equal the fp32 op on the rounded inputs up to the rounding of its outputs
 * (tu_assert_close_dt).
 * The CUDA backend runs other forms of the same bodies (strided sums added by a block's
 * tree, per-index element forms); they are run here against the CPU forms. */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/act.h"
#include "kernels/embed.h"
#include "kernels/loss.h"
#include "kernels/norm.h"
#include "kernels/pool.h"
#include "vramlab/backend.h"

#define FD_EPS 1e-3f
#define FD_TOL 1e-2
#define OK(expr) assert_int_equal((expr), VL_OK)
#define cx tu_cpu

static const vl_dtype LOWP[2] = {VL_F16, VL_BF16};

static void same_bits(const float *a, const float *b, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      print_error("%s element %lld: %.9g vs %.9g\n", what, (long long)i, a[i], b[i]);
      fail();
    }
}

/* |got - want| <= tol max(1, |want|) elementwise. */
static void near_d(const float *got, const double *want, int64_t n, double tol, const char *what) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= tol * fmax(1.0, fabs(want[i])))) {
      print_error("%s[%lld] = %.9g, want %.9g\n", what, (long long)i, got[i], want[i]);
      fail();
    }
}

static float *copy_of(const float *x, int64_t n) {
  float *y = malloc((size_t)n * sizeof *y);
  memcpy(y, x, (size_t)n * sizeof *y);
  return y;
}

/* Host int32 ids as a VL_I32 tensor (the CPU backend reads host memory). */
static vl_tensor ids_of(const int32_t *p, int64_t n) {
  vl_tensor t;
  memset(&t, 0, sizeof t);
  vl_tensor_set_shape(&t, VL_I32, 1, &n);
  t.device = VL_DEV_CPU;
  t.data = (void *)p;
  return t;
}

/* The CUDA block's tree over TREE partial sums (a power of two), run on the CPU. */
enum { TREE = 256 };
static void tree_sum(double *a, int n) {
  for (int k = n / 2; k > 0; k >>= 1)
    for (int t = 0; t < k; t++) a[t] += a[t + k];
}

/* ==== GroupNorm ========================================================================== */

typedef struct { int64_t N, C, HW, G; } gn_dims;
static int64_t gn_n(gn_dims d) { return d.N * d.C * d.HW; }
#define NORM_EPS 1e-5f

/* Forward; gamma/beta stored in pdt, x/y in dt. */
static void run_gn(gn_dims d, vl_dtype dt, vl_dtype pdt, const float *x, const float *g,
                   const float *b, float *y, float *mean, float *rstd) {
  int64_t n = gn_n(d), S = d.N * d.G;
  vl_tensor tx = tu_tnew(cx, dt, n, x), ty = tu_tnew(cx, dt, n, NULL);
  vl_tensor tg = tu_tnew(cx, pdt, d.C, g), tb = tu_tnew(cx, pdt, d.C, b);
  vl_tensor tm = tu_tnew(cx, VL_F32, S, NULL), ts = tu_tnew(cx, VL_F32, S, NULL);
  OK(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &ty, .mean = &tm, .rstd = &ts, .x = &tx,
                                                       .gamma = &tg, .beta = &tb, .N = d.N,
                                                       .C = d.C, .HW = d.HW, .G = d.G,
                                                       .eps = NORM_EPS}));
  if (y) tu_tget(&ty, y);
  if (mean) tu_tget(&tm, mean);
  if (rstd) tu_tget(&ts, rstd);
  TU_TFREE(cx, &tx, &ty, &tg, &tb, &tm, &ts);
}

/* Backward; dx holds the initial values when acc; dg/db (C, fp32) accumulate when given. */
static void run_gn_bwd(gn_dims d, vl_dtype dt, const float *x, const float *g, const float *dy,
                       const float *mean, const float *rstd, float *dx, float *dg, float *db,
                       bool acc) {
  int64_t n = gn_n(d), S = d.N * d.G;
  vl_tensor tx = tu_tnew(cx, dt, n, x), tg = tu_tnew(cx, dt, d.C, g), tdy = tu_tnew(cx, dt, n, dy);
  vl_tensor tdx = tu_tnew(cx, dt, n, acc ? dx : NULL);
  vl_tensor tm = tu_tnew(cx, VL_F32, S, mean), ts = tu_tnew(cx, VL_F32, S, rstd);
  vl_tensor tdg = tu_tnew(cx, VL_F32, d.C, dg), tdb = tu_tnew(cx, VL_F32, d.C, db);
  OK(vl_groupnorm_bwd_run(cx, &(vl_groupnorm_bwd_args){.dx = &tdx, .dgamma = dg ? &tdg : NULL,
                                                       .dbeta = db ? &tdb : NULL, .dy = &tdy,
                                                       .x = &tx, .gamma = &tg, .mean = &tm,
                                                       .rstd = &ts, .N = d.N, .C = d.C, .HW = d.HW,
                                                       .G = d.G, .accumulate = acc}));
  tu_tget(&tdx, dx);
  if (dg) tu_tget(&tdg, dg);
  if (db) tu_tget(&tdb, db);
  TU_TFREE(cx, &tx, &tg, &tdy, &tdx, &tm, &ts, &tdg, &tdb);
}

/* x (N, C, HW) with channel c around offs[c] with spread sc[c] */
static float *chan_input(int64_t N, int64_t C, int64_t HW, const float *offs, const float *sc,
                         uint64_t seed) {
  float *x = tu_randn_new(N * C * HW, 1.0f, seed);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t i = 0; i < HW; i++) {
        float *v = &x[(n * C + c) * HW + i];
        *v = offs[c] + sc[c] * *v;
      }
  return x;
}

/* nn.GroupNorm in double: statistics over the (C/G)*HW elements of each (n, g), biased. */
static void gn_ref(gn_dims d, const float *x, const float *g, const float *b, double *y,
                   double *mean, double *rstd) {
  int64_t cpg = d.C / d.G, M = cpg * d.HW;
  for (int64_t n = 0; n < d.N; n++)
    for (int64_t q = 0; q < d.G; q++) {
      const float *p = x + (n * d.C + q * cpg) * d.HW;
      double s = 0, ss = 0;
      for (int64_t j = 0; j < M; j++) s += p[j];
      double mu = s / M;
      for (int64_t j = 0; j < M; j++) ss += (p[j] - mu) * (p[j] - mu);
      double rs = 1.0 / sqrt(ss / M + NORM_EPS);
      mean[n * d.G + q] = mu;
      rstd[n * d.G + q] = rs;
      for (int64_t j = 0; j < M; j++) {
        int64_t c = q * cpg + j / d.HW;
        y[(n * d.C + q * cpg) * d.HW + j] = (p[j] - mu) * rs * g[c] + b[c];
      }
    }
}

static void test_groupnorm_fwd(void **state) {
  (void)state;
  /* 2 samples, 6 channels in 3 groups of 2, 5 pixels; group 1 (channels 2, 3) sits at 1000:
   * fp32 sums of x^2 would lose its variance entirely */
  const gn_dims d = {2, 6, 5, 3};
  const int64_t n = gn_n(d), C = d.C, S = d.N * d.G;
  const float offs[6] = {0.5f, -1.0f, 1000.0f, 1000.5f, 2.0f, 0.0f};
  const float sc[6] = {1.0f, 2.0f, 1.0f, 0.5f, 3.0f, 0.25f};
  float *x = chan_input(d.N, C, d.HW, offs, sc, 1), *g = tu_randn_new(C, 0.5f, 2),
        *b = tu_randn_new(C, 1.0f, 3);
  for (int64_t c = 0; c < C; c++) g[c] += 1.0f;
  float *y = tu_zeros(n), mean[6], rstd[6];
  double *yr = malloc((size_t)n * sizeof *yr), mr[6], rr[6];
  run_gn(d, VL_F32, VL_F32, x, g, b, y, mean, rstd);
  gn_ref(d, x, g, b, yr, mr, rr);
  for (int64_t s = 0; s < S; s++) {
    assert_true(fabs(mean[s] - mr[s]) <= 1e-6 * fmax(1.0, fabs(mr[s])));
    assert_true(fabs(rstd[s] - rr[s]) <= 1e-6 * rr[s]);
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t c = (i / d.HW) % C, s = (i / d.HW / C) * d.G + c / (C / d.G);
    double tol = 1e-5 + 4 * FLT_EPSILON * fabs(mr[s]) * rr[s] * fabs(g[c]);
    if (!(fabs(y[i] - yr[i]) <= tol)) {
      print_error("groupnorm y[%lld] = %.8g, want %.8g\n", (long long)i, y[i], yr[i]);
      fail();
    }
  }
  /* the variance is biased (divided by M = 10), and per (sample, group), not per channel:
   * rstd differs from the unbiased one by sqrt(10/9) and from channel 0's own */
  for (int64_t s = 0; s < S; s++) {
    double var = 1.0 / (rr[s] * rr[s]) - NORM_EPS, unb = var * 10 / 9;
    assert_false(fabs(rstd[s] - 1.0 / sqrt(unb + NORM_EPS)) <= 1e-3 * rr[s]);
  }
  {
    double s = 0, ss = 0;
    for (int i = 0; i < 5; i++) s += x[i];
    for (int i = 0; i < 5; i++) ss += (x[i] - s / 5) * (x[i] - s / 5);
    assert_false(fabs(rstd[0] - 1.0 / sqrt(ss / 5 + NORM_EPS)) <= 1e-2 * rstd[0]);
  }

  /* G = 1 (LayerNorm over C*HW) and G = C (instance norm) */
  const gn_dims d1 = {2, 6, 5, 1}, d6 = {2, 6, 5, 6};
  float *xs = chan_input(2, 6, 5, (float[6]){0, 1, 2, 3, 4, 5}, sc, 4);
  float m1[12], r1[12];
  double *y1 = malloc((size_t)n * sizeof *y1), mm[12], rrr[12];
  run_gn(d1, VL_F32, VL_F32, xs, g, b, y, m1, r1);
  gn_ref(d1, xs, g, b, y1, mm, rrr);
  near_d(y, y1, n, 1e-5, "groupnorm G=1");
  run_gn(d6, VL_F32, VL_F32, xs, g, b, y, m1, r1);
  gn_ref(d6, xs, g, b, y1, mm, rrr);
  near_d(y, y1, n, 1e-5, "groupnorm G=C");

  /* a constant group: variance 0, y = beta, no NaN */
  float xc[4] = {7, 7, 7, 7}, yc[4], g2[2] = {2, 3}, b2[2] = {0.25f, -1}, mc, rc;
  run_gn((gn_dims){1, 2, 2, 1}, VL_F32, VL_F32, xc, g2, b2, yc, &mc, &rc);
  assert_true(mc == 7.0f && fabs(rc - 1.0 / sqrt(NORM_EPS)) < 1e-3 * rc);
  assert_true(yc[0] == 0.25f && yc[1] == 0.25f && yc[2] == -1.0f && yc[3] == -1.0f);

  /* storage dtypes: x, y, gamma, beta in fp16/bf16 (and bf16 x with fp32 gamma/beta) */
  for (int k = 0; k < 3; k++) {
    vl_dtype dt = LOWP[k & 1], pdt = k == 2 ? VL_F32 : dt;
    float *xr = tu_rounded(xs, n, dt), *gr = tu_rounded(g, C, pdt), *br = tu_rounded(b, C, pdt);
    float *yref = tu_zeros(n), *ygot = tu_zeros(n), mref[6], mgot[6], sref[6], sgot[6];
    run_gn(d, VL_F32, VL_F32, xr, gr, br, yref, mref, sref);
    run_gn(d, dt, pdt, xs, g, b, ygot, mgot, sgot);
    tu_assert_close_dt(ygot, yref, n, dt, "groupnorm y");
    tu_assert_close_dt(mgot, mref, S, VL_F32, "groupnorm mean");
    tu_assert_close_dt(sgot, sref, S, VL_F32, "groupnorm rstd");
    free(xr); free(gr); free(br); free(yref); free(ygot);
  }
  free(x); free(g); free(b); free(y); free(yr); free(xs); free(y1);
}

typedef struct { gn_dims d; float *x, *g, *b, *r, *y; } gn_ctx;
static double gn_loss(void *p) {
  gn_ctx *k = p;
  run_gn(k->d, VL_F32, VL_F32, k->x, k->g, k->b, k->y, NULL, NULL);
  return tu_dot(k->r, k->y, gn_n(k->d));
}

static void test_groupnorm_bwd(void **state) {
  (void)state;
  const gn_dims d = {2, 6, 4, 2}; /* groups of 3 channels */
  const int64_t n = gn_n(d), C = d.C;
  const float offs[6] = {0.5f, -1.0f, 3.0f, 0.0f, 1.0f, -2.0f};
  const float sc[6] = {1.0f, 0.7f, 1.5f, 1.0f, 2.0f, 0.5f};
  float *x = chan_input(d.N, C, d.HW, offs, sc, 20), *g = tu_randn_new(C, 0.5f, 21),
        *b = tu_randn_new(C, 1.0f, 22), *r = tu_randn_new(n, 1.0f, 23);
  for (int64_t c = 0; c < C; c++) g[c] += 1.0f;
  float mean[4], rstd[4], dg0[6] = {0.5f, -0.25f, 1.0f, 0, 2, -1}, db0[6] = {-1, 0, 2, 1, 0.5f, 0};
  float dg[6], db[6], dgan[6], dban[6];
  memcpy(dg, dg0, sizeof dg);
  memcpy(db, db0, sizeof db);
  float *dx = tu_zeros(n), *dx2 = tu_zeros(n);
  run_gn(d, VL_F32, VL_F32, x, g, b, NULL, mean, rstd);
  run_gn_bwd(d, VL_F32, x, g, r, mean, rstd, dx, dg, db, false);
  for (int64_t c = 0; c < C; c++) { dgan[c] = dg[c] - dg0[c]; dban[c] = db[c] - db0[c]; }

  gn_ctx k = {d, x, g, b, r, tu_zeros(n)};
  tu_fd_check(gn_loss, &k, x, n, dx, FD_EPS, FD_TOL, "groupnorm dx");
  tu_fd_check(gn_loss, &k, g, C, dgan, FD_EPS, FD_TOL, "groupnorm dgamma");
  tu_fd_check(gn_loss, &k, b, C, dban, FD_EPS, FD_TOL, "groupnorm dbeta");
  for (int64_t c = 0; c < C; c++) { /* dbeta = sum dy per channel, exactly as defined */
    double s = 0;
    for (int64_t m = 0; m < d.N; m++)
      for (int64_t i = 0; i < d.HW; i++) s += r[(m * C + c) * d.HW + i];
    assert_true(fabs(dban[c] - s) < 1e-5);
  }
  /* frozen (no dgamma/dbeta): the same dx; accumulate: dx0 + dx */
  run_gn_bwd(d, VL_F32, x, g, r, mean, rstd, dx2, NULL, NULL, false);
  same_bits(dx2, dx, n, "groupnorm dx without dgamma/dbeta");
  float *dx0 = tu_randn_new(n, 1.0f, 24), *dxa = copy_of(dx0, n);
  run_gn_bwd(d, VL_F32, x, g, r, mean, rstd, dxa, NULL, NULL, true);
  for (int64_t i = 0; i < n; i++) dx2[i] = dx0[i] + dx[i];
  tu_assert_close(dxa, dx2, n, 1e-6, 1e-6, "groupnorm dx accumulated"); /* FMA may fuse the add */

  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *xr = tu_rounded(x, n, dt), *gr = tu_rounded(g, C, dt), *rr = tu_rounded(r, n, dt);
    float *d0r = tu_rounded(dx0, n, dt);
    float *dref = copy_of(d0r, n), *dgot = copy_of(dx0, n), gref[6] = {0}, ggot[6] = {0},
          bref[6] = {0}, bgot[6] = {0};
    run_gn(d, VL_F32, VL_F32, xr, gr, b, NULL, mean, rstd);
    run_gn_bwd(d, VL_F32, xr, gr, rr, mean, rstd, dref, gref, bref, true);
    run_gn_bwd(d, dt, x, g, r, mean, rstd, dgot, ggot, bgot, true);
    tu_assert_close_dt(dgot, dref, n, dt, "groupnorm dx accumulated");
    tu_assert_close_dt(ggot, gref, C, VL_F32, "groupnorm dgamma (fp32)");
    tu_assert_close_dt(bgot, bref, C, VL_F32, "groupnorm dbeta (fp32)");
    free(xr); free(gr); free(rr); free(d0r); free(dref); free(dgot);
  }
  free(x); free(g); free(b); free(r); free(dx); free(dx2); free(dx0); free(dxa); free(k.y);
}

/* The CUDA kernels' composition on the CPU: one block of TREE threads per group (strided
 * sums, the tree, the same finish and apply bodies), one block per channel for dgamma and
 * dbeta. It must match the CPU backend (plane-by-plane sums) to rounding. */
static void gn_cuda_form(gn_dims d, uint64_t seed) {
  const int64_t n = gn_n(d), C = d.C, HW = d.HW, G = d.G, cpg = C / G, M = cpg * HW;
  const int64_t S = d.N * G;
  float *x = tu_randn_new(n, 1.5f, seed), *g = tu_randn_new(C, 0.5f, seed + 1),
        *b = tu_randn_new(C, 1.0f, seed + 2), *dy = tu_randn_new(n, 1.0f, seed + 3);
  for (int64_t i = 0; i < n; i++) x[i] += 3.0f;
  float *y = tu_zeros(n), *yk = tu_zeros(n), *dx = tu_zeros(n), *dxk = tu_zeros(n);
  float *mean = tu_zeros(S), *rstd = tu_zeros(S), *mk = tu_zeros(S), *rk = tu_zeros(S);
  float *dg = tu_zeros(C), *db = tu_zeros(C), *dgk = tu_zeros(C), *dbk = tu_zeros(C);
  run_gn(d, VL_F32, VL_F32, x, g, b, y, mean, rstd);
  run_gn_bwd(d, VL_F32, x, g, dy, mean, rstd, dx, dg, db, false);
  static double p1[TREE], p2[TREE];
  for (int64_t s = 0; s < S; s++) {
    int64_t nn = s / G, c0 = (s % G) * cpg, base = (nn * C + c0) * HW;
    float K = x[base];
    for (int t = 0; t < TREE; t++) {
      p1[t] = p2[t] = 0;
      vl_k_seg_sums_strided(x, VL_K_F32, base, M, K, t, TREE, &p1[t], &p2[t]);
    }
    tree_sum(p1, TREE); tree_sum(p2, TREE);
    vl_k_stat st = vl_k_seg_finish(mk, rk, s, p1[0], p2[0], K, M, NORM_EPS);
    for (int t = 0; t < TREE; t++)
      vl_k_norm_fwd_strided(yk, VL_K_F32, x, VL_K_F32, st, g, VL_K_F32, b, VL_K_F32, base, M, HW,
                            c0, t, TREE);
    for (int t = 0; t < TREE; t++) {
      p1[t] = p2[t] = 0;
      vl_k_norm_bwd_sums_strided(dy, VL_K_F32, x, VL_K_F32, g, VL_K_F32, base, M, HW, c0, mk[s],
                                 t, TREE, &p1[t], &p2[t]);
    }
    tree_sum(p1, TREE); tree_sum(p2, TREE);
    vl_k_norm_grad kg = vl_k_norm_bwd_finish(mk[s], rk[s], p1[0], p2[0], M);
    for (int t = 0; t < TREE; t++)
      vl_k_norm_bwd_strided(dxk, VL_K_F32, dy, VL_K_F32, x, VL_K_F32, g, VL_K_F32, kg, 0, base, M,
                            HW, c0, t, TREE);
  }
  for (int64_t c = 0; c < C; c++) {
    for (int t = 0; t < TREE; t++) {
      p1[t] = p2[t] = 0;
      vl_k_gn_dgb_strided(dy, VL_K_F32, x, VL_K_F32, mk, rk, C, HW, d.N * HW, G, cpg, c, t, TREE,
                          &p1[t], &p2[t]);
    }
    tree_sum(p1, TREE); tree_sum(p2, TREE);
    vl_k_norm_dgb_finish(dgk, VL_K_F32, dbk, VL_K_F32, c, p1[0], p2[0]);
  }
  tu_assert_close(mk, mean, S, 0, 1e-6, "gn mean (cuda form)");
  tu_assert_close(rk, rstd, S, 0, 1e-6, "gn rstd (cuda form)");
  tu_assert_close(yk, y, n, 1e-6, 1e-5, "gn y (cuda form)");
  tu_assert_close(dxk, dx, n, 1e-6, 1e-5, "gn dx (cuda form)");
  tu_assert_close(dgk, dg, C, 1e-6, 1e-5, "gn dgamma (cuda form)");
  tu_assert_close(dbk, db, C, 1e-6, 1e-5, "gn dbeta (cuda form)");
  free(x); free(g); free(b); free(dy); free(y); free(yk); free(dx); free(dxk);
  free(mean); free(rstd); free(mk); free(rk); free(dg); free(db); free(dgk); free(dbk);
}

static void test_groupnorm_cuda_form(void **state) {
  (void)state;
  gn_cuda_form((gn_dims){3, 8, 37, 2}, 30);  /* M = 148 < TREE, planes not a divisor */
  gn_cuda_form((gn_dims){2, 6, 300, 3}, 40); /* M = 600: strides cross channels */
  gn_cuda_form((gn_dims){2, 4, 1, 4}, 50);   /* 1 element per group: variance 0 */
}

/* ==== LayerNorm ============================================================================ */

static void run_ln(int64_t R, int64_t C, vl_dtype dt, vl_dtype pdt, const float *x,
                   const float *g, const float *b, float *y, float *mean, float *rstd) {
  int64_t n = R * C;
  vl_tensor tx = tu_tnew(cx, dt, n, x), ty = tu_tnew(cx, dt, n, NULL);
  vl_tensor tg = tu_tnew(cx, pdt, C, g), tb = tu_tnew(cx, pdt, C, b);
  vl_tensor tm = tu_tnew(cx, VL_F32, R, NULL), ts = tu_tnew(cx, VL_F32, R, NULL);
  OK(vl_layernorm_fwd_run(cx, &(vl_layernorm_fwd_args){.y = &ty, .mean = &tm, .rstd = &ts, .x = &tx,
                                                       .gamma = &tg, .beta = &tb, .R = R, .C = C,
                                                       .eps = NORM_EPS}));
  if (y) tu_tget(&ty, y);
  if (mean) tu_tget(&tm, mean);
  if (rstd) tu_tget(&ts, rstd);
  TU_TFREE(cx, &tx, &ty, &tg, &tb, &tm, &ts);
}

static void run_ln_bwd(int64_t R, int64_t C, vl_dtype dt, const float *x, const float *g,
                       const float *dy, const float *mean, const float *rstd, float *dx,
                       float *dg, float *db, bool acc) {
  int64_t n = R * C;
  vl_tensor tx = tu_tnew(cx, dt, n, x), tg = tu_tnew(cx, dt, C, g), tdy = tu_tnew(cx, dt, n, dy);
  vl_tensor tdx = tu_tnew(cx, dt, n, acc ? dx : NULL);
  vl_tensor tm = tu_tnew(cx, VL_F32, R, mean), ts = tu_tnew(cx, VL_F32, R, rstd);
  vl_tensor tdg = tu_tnew(cx, VL_F32, C, dg), tdb = tu_tnew(cx, VL_F32, C, db);
  OK(vl_layernorm_bwd_run(cx, &(vl_layernorm_bwd_args){.dx = &tdx, .dgamma = dg ? &tdg : NULL,
                                                       .dbeta = db ? &tdb : NULL, .dy = &tdy,
                                                       .x = &tx, .gamma = &tg, .mean = &tm,
                                                       .rstd = &ts, .R = R, .C = C,
                                                       .accumulate = acc}));
  tu_tget(&tdx, dx);
  if (dg) tu_tget(&tdg, dg);
  if (db) tu_tget(&tdb, db);
  TU_TFREE(cx, &tx, &tg, &tdy, &tdx, &tm, &ts, &tdg, &tdb);
}

static void test_layernorm_fwd(void **state) {
  (void)state;
  enum { R = 5, C = 37 }; /* C: not a multiple of the 16-column blocks */
  const int64_t n = R * C;
  float *x = tu_randn_new(n, 2.0f, 60), *g = tu_randn_new(C, 0.5f, 61), *b = tu_randn_new(C, 1.0f, 62);
  for (int64_t c = 0; c < C; c++) x[2 * C + c] += 1000.0f; /* row 2 at 1000 */
  float *y = tu_zeros(n), mean[R], rstd[R];
  run_ln(R, C, VL_F32, VL_F32, x, g, b, y, mean, rstd);
  for (int r = 0; r < R; r++) {
    double s = 0, ss = 0;
    for (int c = 0; c < C; c++) s += x[r * C + c];
    double mu = s / C;
    for (int c = 0; c < C; c++) ss += (x[r * C + c] - mu) * (x[r * C + c] - mu);
    double rs = 1.0 / sqrt(ss / C + NORM_EPS); /* biased, as nn.LayerNorm */
    assert_true(fabs(mean[r] - mu) <= 1e-6 * fmax(1.0, fabs(mu)));
    assert_true(fabs(rstd[r] - rs) <= 1e-6 * rs);
    assert_false(fabs(rstd[r] - 1.0 / sqrt(ss / (C - 1) + NORM_EPS)) <= 1e-4 * rs);
    for (int c = 0; c < C; c++) {
      double want = (x[r * C + c] - mu) * rs * g[c] + b[c];
      double tol = 1e-5 + 4 * FLT_EPSILON * fabs(mu) * rs * fabs(g[c]);
      if (!(fabs(y[r * C + c] - want) <= tol)) {
        print_error("layernorm y[%d, %d] = %.8g, want %.8g\n", r, c, y[r * C + c], want);
        fail();
      }
    }
  }
  for (int k = 0; k < 3; k++) {
    vl_dtype dt = LOWP[k & 1], pdt = k == 2 ? VL_F32 : dt;
    float *xs = tu_randn_new(n, 2.0f, 63 + k);
    float *xr = tu_rounded(xs, n, dt), *gr = tu_rounded(g, C, pdt), *br = tu_rounded(b, C, pdt);
    float *yref = tu_zeros(n), *ygot = tu_zeros(n), mref[R], mgot[R], sref[R], sgot[R];
    run_ln(R, C, VL_F32, VL_F32, xr, gr, br, yref, mref, sref);
    run_ln(R, C, dt, pdt, xs, g, b, ygot, mgot, sgot);
    tu_assert_close_dt(ygot, yref, n, dt, "layernorm y");
    tu_assert_close_dt(mgot, mref, R, VL_F32, "layernorm mean");
    tu_assert_close_dt(sgot, sref, R, VL_F32, "layernorm rstd");
    free(xs); free(xr); free(gr); free(br); free(yref); free(ygot);
  }
  free(x); free(g); free(b); free(y);
}

typedef struct { int64_t R, C; float *x, *g, *b, *r, *y; } ln_ctx;
static double ln_loss(void *p) {
  ln_ctx *k = p;
  run_ln(k->R, k->C, VL_F32, VL_F32, k->x, k->g, k->b, k->y, NULL, NULL);
  return tu_dot(k->r, k->y, k->R * k->C);
}

static void test_layernorm_bwd(void **state) {
  (void)state;
  enum { R = 4, C = 19 };
  const int64_t n = R * C;
  float *x = tu_randn_new(n, 1.0f, 70), *g = tu_randn_new(C, 0.5f, 71), *b = tu_randn_new(C, 1.0f, 72);
  float *r = tu_randn_new(n, 1.0f, 73);
  for (int c = 0; c < C; c++) g[c] += 1.0f;
  float mean[R], rstd[R], dg[C], db[C], dg0[C], db0[C], dgan[C], dban[C];
  tu_randn(dg0, C, 1.0f, 74);
  tu_randn(db0, C, 1.0f, 75);
  memcpy(dg, dg0, sizeof dg);
  memcpy(db, db0, sizeof db);
  float *dx = tu_zeros(n), *dx2 = tu_zeros(n);
  run_ln(R, C, VL_F32, VL_F32, x, g, b, NULL, mean, rstd);
  run_ln_bwd(R, C, VL_F32, x, g, r, mean, rstd, dx, dg, db, false);
  for (int c = 0; c < C; c++) { dgan[c] = dg[c] - dg0[c]; dban[c] = db[c] - db0[c]; }
  ln_ctx k = {R, C, x, g, b, r, tu_zeros(n)};
  tu_fd_check(ln_loss, &k, x, n, dx, FD_EPS, FD_TOL, "layernorm dx");
  tu_fd_check(ln_loss, &k, g, C, dgan, FD_EPS, FD_TOL, "layernorm dgamma");
  tu_fd_check(ln_loss, &k, b, C, dban, FD_EPS, FD_TOL, "layernorm dbeta");
  run_ln_bwd(R, C, VL_F32, x, g, r, mean, rstd, dx2, NULL, NULL, false);
  same_bits(dx2, dx, n, "layernorm dx without dgamma/dbeta");
  float *dx0 = tu_randn_new(n, 1.0f, 76), *dxa = copy_of(dx0, n);
  run_ln_bwd(R, C, VL_F32, x, g, r, mean, rstd, dxa, NULL, NULL, true);
  for (int64_t i = 0; i < n; i++) dx2[i] = dx0[i] + dx[i];
  tu_assert_close(dxa, dx2, n, 1e-6, 1e-6, "layernorm dx accumulated");
  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *xr = tu_rounded(x, n, dt), *gr = tu_rounded(g, C, dt), *rr = tu_rounded(r, n, dt);
    float *dref = tu_zeros(n), *dgot = tu_zeros(n), gref[C], ggot[C], bref[C], bgot[C];
    memset(gref, 0, sizeof gref); memset(ggot, 0, sizeof ggot);
    memset(bref, 0, sizeof bref); memset(bgot, 0, sizeof bgot);
    run_ln(R, C, VL_F32, VL_F32, xr, gr, b, NULL, mean, rstd);
    run_ln_bwd(R, C, VL_F32, xr, gr, rr, mean, rstd, dref, gref, bref, false);
    run_ln_bwd(R, C, dt, x, g, r, mean, rstd, dgot, ggot, bgot, false);
    tu_assert_close_dt(dgot, dref, n, dt, "layernorm dx");
    tu_assert_close_dt(ggot, gref, C, VL_F32, "layernorm dgamma (fp32)");
    tu_assert_close_dt(bgot, bref, C, VL_F32, "layernorm dbeta (fp32)");
    free(xr); free(gr); free(rr); free(dref); free(dgot);
  }
  free(x); free(g); free(b); free(r); free(dx); free(dx2); free(dx0); free(dxa); free(k.y);
}

/* CUDA form: a block per row (strided sums, tree; HW = 1 so element j is column j), and the
 * dgamma/dbeta kernel's 32 x 8 blocks: column per thread, 8 row lanes added by a tree. */
enum { LN_LANES = 8 };
static void test_layernorm_cuda_form(void **state) {
  (void)state;
  enum { R = 45, C = 300 };
  const int64_t n = R * C;
  float *x = tu_randn_new(n, 1.0f, 80), *g = tu_randn_new(C, 0.5f, 81), *b = tu_randn_new(C, 1.0f, 82);
  float *dy = tu_randn_new(n, 1.0f, 83);
  float *y = tu_zeros(n), *yk = tu_zeros(n), *dx = tu_zeros(n), *dxk = tu_zeros(n);
  float mean[R], rstd[R], mk[R], rk[R], dg[C], db[C], dgk[C], dbk[C];
  memset(dg, 0, sizeof dg); memset(db, 0, sizeof db);
  memset(dgk, 0, sizeof dgk); memset(dbk, 0, sizeof dbk);
  run_ln(R, C, VL_F32, VL_F32, x, g, b, y, mean, rstd);
  run_ln_bwd(R, C, VL_F32, x, g, dy, mean, rstd, dx, dg, db, false);
  static double p1[TREE], p2[TREE];
  for (int64_t r = 0; r < R; r++) {
    float K = x[r * C];
    for (int t = 0; t < TREE; t++) {
      p1[t] = p2[t] = 0;
      vl_k_seg_sums_strided(x, VL_K_F32, r * C, C, K, t, TREE, &p1[t], &p2[t]);
    }
    tree_sum(p1, TREE); tree_sum(p2, TREE);
    vl_k_stat st = vl_k_seg_finish(mk, rk, r, p1[0], p2[0], K, C, NORM_EPS);
    for (int t = 0; t < TREE; t++)
      vl_k_norm_fwd_strided(yk, VL_K_F32, x, VL_K_F32, st, g, VL_K_F32, b, VL_K_F32, r * C, C, 1,
                            0, t, TREE);
    for (int t = 0; t < TREE; t++) {
      p1[t] = p2[t] = 0;
      vl_k_norm_bwd_sums_strided(dy, VL_K_F32, x, VL_K_F32, g, VL_K_F32, r * C, C, 1, 0, mk[r], t,
                                 TREE, &p1[t], &p2[t]);
    }
    tree_sum(p1, TREE); tree_sum(p2, TREE);
    vl_k_norm_grad kg = vl_k_norm_bwd_finish(mk[r], rk[r], p1[0], p2[0], C);
    for (int t = 0; t < TREE; t++)
      vl_k_norm_bwd_strided(dxk, VL_K_F32, dy, VL_K_F32, x, VL_K_F32, g, VL_K_F32, kg, 0, r * C,
                            C, 1, 0, t, TREE);
  }
  for (int64_t c = 0; c < C; c++) {
    double sb[LN_LANES] = {0}, sg[LN_LANES] = {0};
    for (int t = 0; t < LN_LANES; t++)
      vl_k_ln_dgb_cols(dy, VL_K_F32, x, VL_K_F32, mk, rk, R, C, c, 1, t, LN_LANES, &sb[t], &sg[t]);
    tree_sum(sb, LN_LANES); tree_sum(sg, LN_LANES);
    vl_k_norm_dgb_finish(dgk, VL_K_F32, dbk, VL_K_F32, c, sb[0], sg[0]);
  }
  tu_assert_close(mk, mean, R, 1e-7, 1e-6, "ln mean (cuda form)");
  tu_assert_close(rk, rstd, R, 0, 1e-6, "ln rstd (cuda form)");
  tu_assert_close(yk, y, n, 1e-6, 1e-5, "ln y (cuda form)");
  tu_assert_close(dxk, dx, n, 1e-6, 1e-5, "ln dx (cuda form)");
  tu_assert_close(dgk, dg, C, 1e-6, 1e-5, "ln dgamma (cuda form)");
  tu_assert_close(dbk, db, C, 1e-6, 1e-5, "ln dbeta (cuda form)");
  free(x); free(g); free(b); free(dy); free(y); free(yk); free(dx); free(dxk);
}

/* ==== activations ============================================================================ */

/* The PyTorch definitions in double. */
static double act_ref(int act, double x) {
  if (act == VL_ACT_SILU) return x / (1.0 + exp(-x));
  if (act == VL_ACT_GELU) return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
  return x / (1.0 + exp(-1.702 * x));
}

enum { ACT_N = 41 };

static void run_act(vl_act act, vl_dtype dt, const float *x, const float *dy, float *y, float *dx,
                    bool alias) {
  vl_tensor tx = tu_tnew(cx, dt, ACT_N, x), ty = alias && !dy ? tx : tu_tnew(cx, dt, ACT_N, NULL);
  OK(vl_act_fwd_run(cx, &(vl_act_fwd_args){.y = &ty, .x = &tx, .n = ACT_N, .act = act}));
  if (y) tu_tget(&ty, y);
  if (dy) {
    vl_tensor tdy = tu_tnew(cx, dt, ACT_N, dy), tdx = alias ? tdy : tu_tnew(cx, dt, ACT_N, NULL);
    OK(vl_act_bwd_run(cx, &(vl_act_bwd_args){.dx = &tdx, .dy = &tdy, .x = &tx, .n = ACT_N,
                                             .act = act}));
    tu_tget(&tdx, dx);
    if (!alias) vl_tensor_free(cx, &tdx);
    vl_tensor_free(cx, &tdy);
  }
  if (!(alias && !dy)) vl_tensor_free(cx, &ty);
  vl_tensor_free(cx, &tx);
}

typedef struct { vl_act act; float *x, *r, *y; } act_ctx;
static double act_loss(void *p) {
  act_ctx *k = p;
  run_act(k->act, VL_F32, k->x, NULL, k->y, NULL, false);
  return tu_dot(k->r, k->y, ACT_N);
}

static void test_act(void **state) {
  (void)state;
  /* hand values at x = 1: silu 0.7310585786, exact GELU Phi(1) = 0.8413447461 (the tanh
   * approximation gives 0.8411919906), quick-GELU sigmoid(1.702) = 0.8457957659 (the logistic
   * 1.0 would be SiLU's 0.731) */
  const double at1[3] = {0.7310585786300049, 0.8413447460685429, 0.8457957659328212};
  float one = 1.0f;
  for (int a = 0; a < VL_ACT_COUNT; a++) {
    vl_tensor t1 = tu_tnew(cx, VL_F32, 1, &one), t2 = tu_tnew(cx, VL_F32, 1, NULL);
    float v;
    OK(vl_act_fwd_run(cx, &(vl_act_fwd_args){.y = &t2, .x = &t1, .n = 1, .act = (vl_act)a}));
    tu_tget(&t2, &v);
    assert_true(fabs(v - at1[a]) < 2e-7);
    TU_TFREE(cx, &t1, &t2);
  }
  float *x = tu_randn_new(ACT_N, 2.0f, 90), *r = tu_randn_new(ACT_N, 1.0f, 91);
  x[0] = -12.0f; x[1] = 12.0f; x[2] = 0.0f; x[3] = -40.0f; /* tails: no NaN, limits */
  for (int a = 0; a < VL_ACT_COUNT; a++) {
    vl_act act = (vl_act)a;
    float *y = tu_zeros(ACT_N), *dx = tu_zeros(ACT_N), *y2 = tu_zeros(ACT_N), *dx2 = tu_zeros(ACT_N);
    double want[ACT_N];
    run_act(act, VL_F32, x, r, y, dx, false);
    for (int i = 0; i < ACT_N; i++) want[i] = act_ref(a, x[i]);
    near_d(y, want, ACT_N, 1e-6, "act y");
    assert_true(y[3] == 0.0f || fabs(y[3]) < 1e-12); /* x*sigmoid(x) at -40 underflows to 0 */
    act_ctx k = {act, x, r, tu_zeros(ACT_N)};
    tu_fd_check(act_loss, &k, x, ACT_N, dx, FD_EPS, FD_TOL,
                a == 0 ? "silu dx" : a == 1 ? "gelu dx" : "quick_gelu dx");
    /* in place: y over x (forward only), dx over dy */
    run_act(act, VL_F32, x, NULL, y2, NULL, true);
    same_bits(y2, y, ACT_N, "act in place");
    run_act(act, VL_F32, x, r, y2, dx2, true);
    same_bits(dx2, dx, ACT_N, "act bwd in place");
    for (int q = 0; q < 2; q++) {
      vl_dtype dt = LOWP[q];
      float *xr = tu_rounded(x, ACT_N, dt), *rr = tu_rounded(r, ACT_N, dt);
      float *yref = tu_zeros(ACT_N), *dref = tu_zeros(ACT_N), *ygot = tu_zeros(ACT_N),
            *dgot = tu_zeros(ACT_N);
      run_act(act, VL_F32, xr, rr, yref, dref, false);
      run_act(act, dt, x, r, ygot, dgot, false);
      tu_assert_close_dt(ygot, yref, ACT_N, dt, "act y");
      tu_assert_close_dt(dgot, dref, ACT_N, dt, "act dx");
      free(xr); free(rr); free(yref); free(dref); free(ygot); free(dgot);
    }
    free(y); free(dx); free(y2); free(dx2); free(k.y);
  }
  free(x); free(r);
}

/* ==== GEGLU ================================================================================= */

static void run_geglu(int64_t R, int64_t F, vl_dtype dt, const float *h, const float *dout,
                      float *out, float *dh, bool alias) {
  vl_tensor th = tu_tnew(cx, dt, 2 * R * F, h), to = tu_tnew(cx, dt, R * F, NULL);
  OK(vl_geglu_fwd_run(cx, &(vl_geglu_fwd_args){.out = &to, .h = &th, .R = R, .F = F}));
  if (out) tu_tget(&to, out);
  if (dout) {
    vl_tensor td = tu_tnew(cx, dt, R * F, dout), tdh = alias ? th : tu_tnew(cx, dt, 2 * R * F, NULL);
    OK(vl_geglu_bwd_run(cx, &(vl_geglu_bwd_args){.dh = &tdh, .dout = &td, .h = &th, .R = R,
                                                 .F = F}));
    tu_tget(&tdh, dh);
    if (!alias) vl_tensor_free(cx, &tdh);
    vl_tensor_free(cx, &td);
  }
  TU_TFREE(cx, &th, &to);
}

typedef struct { int64_t R, F; float *h, *r, *o; } geglu_ctx;
static double geglu_loss(void *p) {
  geglu_ctx *k = p;
  run_geglu(k->R, k->F, VL_F32, k->h, NULL, k->o, NULL, false);
  return tu_dot(k->r, k->o, k->R * k->F);
}

static void test_geglu(void **state) {
  (void)state;
  /* h = [value 2, gate 0.5]: 2 gelu(0.5) = 0.6914624613; the halves swapped would give
   * 0.5 gelu(2) = 0.977 */
  float h1[2] = {2.0f, 0.5f}, o1;
  run_geglu(1, 1, VL_F32, h1, NULL, &o1, NULL, false);
  assert_true(fabs(o1 - 2.0 * act_ref(VL_ACT_GELU, 0.5)) < 1e-6);
  assert_true(fabs(o1 - 0.6914624612740131) < 1e-6);

  enum { R = 3, F = 7 };
  const int64_t n = R * F;
  float *h = tu_randn_new(2 * n, 1.5f, 100), *r = tu_randn_new(n, 1.0f, 101);
  float *out = tu_zeros(n), *dh = tu_zeros(2 * n), *dh2 = tu_zeros(2 * n);
  run_geglu(R, F, VL_F32, h, r, out, dh, false);
  for (int64_t i = 0; i < R; i++)
    for (int64_t f = 0; f < F; f++) {
      double want = h[i * 2 * F + f] * act_ref(VL_ACT_GELU, h[i * 2 * F + F + f]);
      assert_true(fabs(out[i * F + f] - want) <= 1e-6 * fmax(1.0, fabs(want)));
    }
  geglu_ctx k = {R, F, h, r, tu_zeros(n)};
  tu_fd_check(geglu_loss, &k, h, 2 * n, dh, FD_EPS, FD_TOL, "geglu dh");
  run_geglu(R, F, VL_F32, h, r, NULL, dh2, true); /* dh written over h */
  same_bits(dh2, dh, 2 * n, "geglu dh over h");
  /* the per-index forms (CUDA) */
  float *ok = tu_zeros(n), *dk = tu_zeros(2 * n);
  for (int64_t i = 0; i < n; i++) {
    vl_k_geglu_fwd(ok, VL_K_F32, h, VL_K_F32, F, i);
    vl_k_geglu_bwd(dk, VL_K_F32, r, VL_K_F32, h, VL_K_F32, F, i);
  }
  same_bits(ok, out, n, "geglu out (cuda form)");
  same_bits(dk, dh, 2 * n, "geglu dh (cuda form)");
  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *hr = tu_rounded(h, 2 * n, dt), *rr = tu_rounded(r, n, dt);
    float *oref = tu_zeros(n), *dref = tu_zeros(2 * n), *ogot = tu_zeros(n), *dgot = tu_zeros(2 * n);
    run_geglu(R, F, VL_F32, hr, rr, oref, dref, false);
    run_geglu(R, F, dt, h, r, ogot, dgot, true);
    tu_assert_close_dt(ogot, oref, n, dt, "geglu out");
    tu_assert_close_dt(dgot, dref, 2 * n, dt, "geglu dh");
    free(hr); free(rr); free(oref); free(dref); free(ogot); free(dgot);
  }
  free(h); free(r); free(out); free(dh); free(dh2); free(ok); free(dk); free(k.o);
}

/* ==== bias ==================================================================================== */

typedef struct { int64_t outer, C, inner; bool per_outer; } bias_dims;
static int64_t bias_n(bias_dims d) { return d.outer * d.C * d.inner; }
static int64_t bias_nb(bias_dims d) { return (d.per_outer ? d.outer : 1) * d.C; }

static void run_bias(bias_dims d, vl_dtype ydt, vl_dtype bdt, const float *y0, const float *b,
                     float *y) {
  vl_tensor ty = tu_tnew(cx, ydt, bias_n(d), y0), tb = tu_tnew(cx, bdt, bias_nb(d), b);
  OK(vl_bias_fwd_run(cx, &(vl_bias_fwd_args){.y = &ty, .b = &tb, .outer = d.outer, .C = d.C,
                                             .inner = d.inner, .per_outer = d.per_outer}));
  tu_tget(&ty, y);
  TU_TFREE(cx, &ty, &tb);
}

/* db holds the initial values when acc. */
static void run_bias_bwd(bias_dims d, vl_dtype dydt, vl_dtype dbdt, const float *dy, float *db,
                         bool acc) {
  vl_tensor tdy = tu_tnew(cx, dydt, bias_n(d), dy), tdb = tu_tnew(cx, dbdt, bias_nb(d), db);
  OK(vl_bias_bwd_run(cx, &(vl_bias_bwd_args){.db = &tdb, .dy = &tdy, .outer = d.outer, .C = d.C,
                                             .inner = d.inner, .per_outer = d.per_outer,
                                             .accumulate = acc}));
  tu_tget(&tdb, db);
  TU_TFREE(cx, &tdy, &tdb);
}

typedef struct { bias_dims d; float *y0, *b, *r, *y; } bias_ctx;
static double bias_loss(void *p) {
  bias_ctx *k = p;
  run_bias(k->d, VL_F32, VL_F32, k->y0, k->b, k->y);
  return tu_dot(k->r, k->y, bias_n(k->d));
}

static void bias_case(bias_dims d, uint64_t seed) {
  const int64_t n = bias_n(d), nb = bias_nb(d);
  float *y0 = tu_randn_new(n, 1.0f, seed), *b = tu_randn_new(nb, 1.0f, seed + 1);
  float *r = tu_randn_new(n, 1.0f, seed + 2), *y = tu_zeros(n);
  run_bias(d, VL_F32, VL_F32, y0, b, y);
  for (int64_t o = 0; o < d.outer; o++)
    for (int64_t c = 0; c < d.C; c++)
      for (int64_t i = 0; i < d.inner; i++) {
        int64_t e = (o * d.C + c) * d.inner + i;
        assert_true(y[e] == y0[e] + b[d.per_outer ? o * d.C + c : c]);
      }
  /* per-index form (CUDA) */
  float *yk = copy_of(y0, n);
  for (int64_t i = 0; i < n; i++) vl_k_bias_fwd(yk, VL_K_F32, b, VL_K_F32, d.C, d.inner, d.per_outer, i);
  same_bits(yk, y, n, "bias y (cuda form)");
  /* backward: db = sum of dy over everything but c (and o when per_outer); overwritten and
   * accumulated; its FD against the forward */
  float *db = tu_randn_new(nb, 1.0f, seed + 3), *db0 = copy_of(db, nb), *dba = copy_of(db, nb);
  run_bias_bwd(d, VL_F32, VL_F32, r, db, false);
  run_bias_bwd(d, VL_F32, VL_F32, r, dba, true);
  for (int64_t q = 0; q < nb; q++) {
    int64_t c = q % d.C, o = q / d.C;
    double s = 0;
    for (int64_t oo = 0; oo < d.outer; oo++)
      for (int64_t i = 0; i < d.inner; i++)
        if (!d.per_outer || oo == o) s += r[(oo * d.C + c) * d.inner + i];
    assert_true(fabs(db[q] - s) < 1e-5);
    assert_true(fabs(dba[q] - (db0[q] + s)) < 1e-5);
  }
  bias_ctx k = {d, y0, b, r, tu_zeros(n)};
  tu_fd_check(bias_loss, &k, b, nb, db, FD_EPS, FD_TOL, "bias db");
  /* the CUDA forms: per_outer a block per plane, else a block per channel; inner 1 the
   * column kernel (8 row lanes) */
  static double p[TREE];
  for (int64_t q = 0; q < nb; q++) {
    double s;
    if (!d.per_outer && d.inner == 1) {
      double lanes[LN_LANES] = {0};
      for (int t = 0; t < LN_LANES; t++) vl_k_colsum(r, VL_K_F32, d.outer, d.C, q, 1, t, LN_LANES, &lanes[t]);
      tree_sum(lanes, LN_LANES);
      s = lanes[0];
    } else {
      for (int t = 0; t < TREE; t++)
        p[t] = d.per_outer ? vl_k_bias_sum_strided(r, VL_K_F32, q * d.inner, 1, d.inner, d.inner, 0, t, TREE)
                           : vl_k_bias_sum_strided(r, VL_K_F32, 0, d.C, d.inner, d.outer * d.inner, q, t, TREE);
      tree_sum(p, TREE);
      s = p[0];
    }
    assert_true(fabs(s - db[q]) <= 1e-5 * fmax(1.0, fabs(db[q])));
  }
  /* storage: fp16/bf16 y with an fp32 bias (a trainable bias on a low-precision activation),
   * and bf16 db accumulated from fp16 dy */
  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *yr = tu_rounded(y0, n, dt), *ref = tu_zeros(n), *got = tu_zeros(n);
    run_bias(d, VL_F32, VL_F32, yr, b, ref);
    run_bias(d, dt, VL_F32, y0, b, got);
    tu_assert_close_dt(got, ref, n, dt, "bias y");
    float *rr = tu_rounded(r, n, VL_F16), *d0r = tu_rounded(db0, nb, dt);
    float *dref = copy_of(d0r, nb), *dgot = copy_of(db0, nb);
    run_bias_bwd(d, VL_F32, VL_F32, rr, dref, true);
    run_bias_bwd(d, VL_F16, dt, r, dgot, true);
    tu_assert_close_dt(dgot, dref, nb, dt, "bias db");
    free(yr); free(ref); free(got); free(rr); free(d0r); free(dref); free(dgot);
  }
  free(y0); free(b); free(r); free(y); free(yk); free(db); free(db0); free(dba); free(k.y);
}

static void test_bias(void **state) {
  (void)state;
  bias_case((bias_dims){3, 4, 70, false}, 110); /* convolution (N, K, PQ), planes path */
  bias_case((bias_dims){3, 4, 5, false}, 120);  /* short planes */
  bias_case((bias_dims){9, 37, 1, false}, 130); /* linear (R, N, 1): column blocks */
  bias_case((bias_dims){2, 5, 70, true}, 140);  /* time embedding per sample */
  bias_case((bias_dims){3, 5, 1, true}, 150);   /* per_outer rows */
}

/* ==== zero padding ============================================================================= */

typedef struct { int64_t P, H, W; int t, b, l, r; } pad_dims;
static int64_t pad_out(pad_dims d) { return d.P * (d.H + d.t + d.b) * (d.W + d.l + d.r); }

static void run_pad(pad_dims d, vl_dtype dt, const float *x, const float *dy, float *y, float *dx) {
  int64_t ni = d.P * d.H * d.W, no = pad_out(d);
  vl_tensor tx = tu_tnew(cx, dt, ni, x), ty = tu_tnew(cx, dt, no, NULL);
  OK(vl_pad2d_fwd_run(cx, &(vl_pad2d_fwd_args){.y = &ty, .x = &tx, .planes = d.P, .H = d.H,
                                               .W = d.W, .top = d.t, .bottom = d.b, .left = d.l,
                                               .right = d.r}));
  if (y) tu_tget(&ty, y);
  if (dy) {
    vl_tensor tdy = tu_tnew(cx, dt, no, dy), tdx = tu_tnew(cx, dt, ni, NULL);
    OK(vl_pad2d_bwd_run(cx, &(vl_pad2d_bwd_args){.dx = &tdx, .dy = &tdy, .planes = d.P, .H = d.H,
                                                 .W = d.W, .top = d.t, .bottom = d.b, .left = d.l,
                                                 .right = d.r}));
    tu_tget(&tdx, dx);
    TU_TFREE(cx, &tdy, &tdx);
  }
  TU_TFREE(cx, &tx, &ty);
}

typedef struct { pad_dims d; float *x, *r, *y; } pad_ctx;
static double pad_loss(void *p) {
  pad_ctx *k = p;
  run_pad(k->d, VL_F32, k->x, NULL, k->y, NULL);
  return tu_dot(k->r, k->y, pad_out(k->d));
}

static void test_pad2d(void **state) {
  (void)state;
  /* the VAE's F.pad(x, (0, 1, 0, 1)): a zero column on the right, a zero row at the bottom */
  const float x22[4] = {1, 2, 3, 4}, want[9] = {1, 2, 0, 3, 4, 0, 0, 0, 0};
  float y33[9];
  run_pad((pad_dims){1, 2, 2, 0, 1, 0, 1}, VL_F32, x22, NULL, y33, NULL);
  same_bits(y33, want, 9, "pad (0, 1, 0, 1)");
  const pad_dims shapes[3] = {{3, 4, 5, 0, 1, 0, 1}, {2, 3, 2, 1, 2, 0, 3}, {1, 1, 1, 2, 0, 1, 0}};
  for (int si = 0; si < 3; si++) {
    pad_dims d = shapes[si];
    int64_t ni = d.P * d.H * d.W, no = pad_out(d), OH = d.H + d.t + d.b, OW = d.W + d.l + d.r;
    float *x = tu_randn_new(ni, 1.0f, 160 + si), *r = tu_randn_new(no, 1.0f, 170 + si);
    float *y = tu_zeros(no), *dx = tu_zeros(ni);
    run_pad(d, VL_F32, x, r, y, dx);
    for (int64_t p = 0; p < d.P; p++)
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          int64_t h = oh - d.t, w = ow - d.l;
          float v = h >= 0 && h < d.H && w >= 0 && w < d.W ? x[(p * d.H + h) * d.W + w] : 0.0f;
          assert_true(y[(p * OH + oh) * OW + ow] == v);
        }
    pad_ctx k = {d, x, r, tu_zeros(no)};
    tu_fd_check(pad_loss, &k, x, ni, dx, FD_EPS, FD_TOL, "pad2d dx");
    vl_k_pad g = {d.H, d.W, OH, OW, d.t, d.l};
    float *yk = tu_zeros(no), *dk = tu_zeros(ni);
    for (int64_t i = 0; i < no; i++) vl_k_pad_fwd(yk, VL_K_F32, x, VL_K_F32, g, i);
    for (int64_t i = 0; i < ni; i++) vl_k_pad_bwd(dk, VL_K_F32, r, VL_K_F32, g, i);
    same_bits(yk, y, no, "pad2d y (cuda form)");
    same_bits(dk, dx, ni, "pad2d dx (cuda form)");
    for (int q = 0; q < 2; q++) { /* data movement: exact after the dtype's rounding */
      vl_dtype dt = LOWP[q];
      float *ygot = tu_zeros(no), *dgot = tu_zeros(ni);
      run_pad(d, dt, x, r, ygot, dgot);
      for (int64_t i = 0; i < no; i++) assert_true(ygot[i] == vl_round_to((int)dt, y[i]));
      for (int64_t i = 0; i < ni; i++) assert_true(dgot[i] == vl_round_to((int)dt, dx[i]));
      free(ygot); free(dgot);
    }
    free(x); free(r); free(y); free(dx); free(k.y); free(yk); free(dk);
  }
}

/* ==== nearest 2x upsampling ========================================================== */

static void run_upn(vl_dtype dt, int64_t P, int64_t H, int64_t W, const float *x, const float *dy,
                    float *y, float *dx, bool nearest) {
  int64_t lo = P * H * W, hi = 4 * lo;
  vl_tensor tx = tu_tnew(cx, dt, lo, x), ty = tu_tnew(cx, dt, hi, NULL);
  OK(vl_upsample2x_fwd_run(cx, &(vl_upsample2x_fwd_args){.y = &ty, .x = &tx, .planes = P, .H = H,
                                                         .W = W, .nearest = nearest}));
  if (y) tu_tget(&ty, y);
  if (dy) {
    vl_tensor tdy = tu_tnew(cx, dt, hi, dy), tdx = tu_tnew(cx, dt, lo, NULL);
    OK(vl_upsample2x_bwd_run(cx, &(vl_upsample2x_bwd_args){.dx = &tdx, .dy = &tdy, .planes = P,
                                                           .H = H, .W = W, .nearest = nearest}));
    tu_tget(&tdx, dx);
    TU_TFREE(cx, &tdy, &tdx);
  }
  TU_TFREE(cx, &tx, &ty);
}

typedef struct { int64_t P, H, W; float *x, *r, *y; } upn_ctx;
static double upn_loss(void *p) {
  upn_ctx *k = p;
  run_upn(VL_F32, k->P, k->H, k->W, k->x, NULL, k->y, NULL, true);
  return tu_dot(k->r, k->y, 4 * k->P * k->H * k->W);
}

static void test_upsample_nearest(void **state) {
  (void)state;
  /* F.interpolate([[1,2],[3,4]], scale_factor=2, mode="nearest"); bilinear stays the default */
  const float x22[4] = {1, 2, 3, 4};
  const float want[16] = {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
  float y22[16], yb[16];
  run_upn(VL_F32, 1, 2, 2, x22, NULL, y22, NULL, true);
  same_bits(y22, want, 16, "nearest 2x2");
  run_upn(VL_F32, 1, 2, 2, x22, NULL, yb, NULL, false);
  assert_true(yb[1] == 1.25f); /* bilinear */
  /* backward: the sum of each 2x2 block */
  float dy16[16], dx4[4];
  for (int i = 0; i < 16; i++) dy16[i] = (float)(i + 1);
  run_upn(VL_F32, 1, 2, 2, x22, dy16, y22, dx4, true);
  const float dwant[4] = {1 + 2 + 5 + 6, 3 + 4 + 7 + 8, 9 + 10 + 13 + 14, 11 + 12 + 15 + 16};
  same_bits(dx4, dwant, 4, "nearest 2x2 backward");

  const int64_t shapes[3][3] = {{2, 3, 5}, {1, 1, 1}, {3, 4, 1}};
  for (int si = 0; si < 3; si++) {
    int64_t P = shapes[si][0], H = shapes[si][1], W = shapes[si][2], lo = P * H * W, hi = 4 * lo;
    float *x = tu_randn_new(lo, 1.0f, 180 + si), *r = tu_randn_new(hi, 1.0f, 190 + si);
    float *y = tu_zeros(hi), *dx = tu_zeros(lo), *yk = tu_zeros(hi), *dk = tu_zeros(lo);
    run_upn(VL_F32, P, H, W, x, r, y, dx, true);
    for (int64_t p = 0; p < P; p++)
      for (int64_t oh = 0; oh < 2 * H; oh++)
        for (int64_t ow = 0; ow < 2 * W; ow++)
          assert_true(y[(p * 2 * H + oh) * 2 * W + ow] == x[(p * H + oh / 2) * W + ow / 2]);
    upn_ctx k = {P, H, W, x, r, tu_zeros(hi)};
    tu_fd_check(upn_loss, &k, x, lo, dx, FD_EPS, FD_TOL, "upsample nearest dx");
    for (int64_t i = 0; i < hi; i++) vl_k_up2n_fwd(yk, VL_K_F32, x, VL_K_F32, H, W, i);
    for (int64_t i = 0; i < lo; i++) vl_k_up2n_bwd(dk, VL_K_F32, r, VL_K_F32, H, W, i);
    same_bits(yk, y, hi, "nearest y (cuda form)");
    same_bits(dk, dx, lo, "nearest dx (cuda form)");
    for (int q = 0; q < 2; q++) {
      vl_dtype dt = LOWP[q];
      float *xr = tu_rounded(x, lo, dt), *rr = tu_rounded(r, hi, dt);
      float *yref = tu_zeros(hi), *dref = tu_zeros(lo), *ygot = tu_zeros(hi), *dgot = tu_zeros(lo);
      run_upn(VL_F32, P, H, W, xr, rr, yref, dref, true);
      run_upn(dt, P, H, W, x, r, ygot, dgot, true);
      tu_assert_close_dt(ygot, yref, hi, dt, "nearest y");
      tu_assert_close_dt(dgot, dref, lo, dt, "nearest dx");
      free(xr); free(rr); free(yref); free(dref); free(ygot); free(dgot);
    }
    free(x); free(r); free(y); free(dx); free(yk); free(dk); free(k.y);
  }
}

/* ==== timestep embedding ======================================================================== */

static void run_temb(const int32_t *t, int64_t B, int64_t dim, bool flip, float shift,
                     vl_dtype dt, float *emb) {
  vl_tensor tt = ids_of(t, B), te = tu_tnew(cx, dt, B * dim, NULL);
  OK(vl_timestep_embed_run(cx, &(vl_timestep_embed_args){.emb = &te, .t = &tt, .B = B, .dim = dim,
                                                         .flip_sin_to_cos = flip, .shift = shift,
                                                         .max_period = 10000.0f}));
  tu_tget(&te, emb);
  vl_tensor_free(cx, &te);
}

/* diffusers' get_timestep_embedding in double. */
static double temb_ref(int32_t t, int64_t dim, bool flip, double shift, int64_t k) {
  int64_t half = dim / 2, j = k % half;
  bool second = k >= half;
  double e = t * exp(-log(10000.0) * (double)j / ((double)half - shift));
  return (second != flip) ? cos(e) : sin(e);
}

static void test_timestep_embed(void **state) {
  (void)state;
  /* SD: flip_sin_to_cos, shift 0, dim 4: half 2, frequencies 1 and exp(-ln(1e4)/2) = 0.01;
   * t = 1 gives [cos 1, cos 0.01, sin 1, sin 0.01] */
  const int32_t t1[1] = {1};
  float e[4];
  run_temb(t1, 1, 4, true, 0.0f, VL_F32, e);
  const double w1[4] = {0.5403023058681398, 0.9999500004166653, 0.8414709848078965,
                        0.009999833334166664};
  for (int k = 0; k < 4; k++) assert_true(fabs(e[k] - w1[k]) < 1e-6);
  /* diffusers' default shift 1: frequencies 1 and 1e-4; not flipped: [sin, cos] */
  run_temb(t1, 1, 4, false, 1.0f, VL_F32, e);
  const double w2[4] = {0.8414709848078965, 9.999999983333334e-05, 0.5403023058681398,
                        0.999999995};
  for (int k = 0; k < 4; k++) assert_true(fabs(e[k] - w2[k]) < 1e-6);

  /* general: B timesteps up to 999 (fp32 e = t * freq carries ~6e-5 rad at 999) */
  enum { B = 5, D = 16 };
  const int32_t ts[B] = {0, 1, 10, 500, 999};
  float emb[B * D];
  for (int f = 0; f < 2; f++)
    for (int s = 0; s < 2; s++) {
      run_temb(ts, B, D, f, (float)s, VL_F32, emb);
      for (int b = 0; b < B; b++)
        for (int k = 0; k < D; k++) {
          double want = temb_ref(ts[b], D, f, s, k);
          if (!(fabs(emb[b * D + k] - want) < 2e-4)) {
            print_error("temb t=%d k=%d flip=%d shift=%d: %.7g, want %.7g\n", ts[b], k, f, s,
                        emb[b * D + k], want);
            fail();
          }
        }
      for (int q = 0; q < 2; q++) {
        float got[B * D];
        run_temb(ts, B, D, f, (float)s, LOWP[q], got);
        tu_assert_close_dt(got, emb, B * D, LOWP[q], "temb storage");
      }
    }
}

/* ==== fused MSE ===================================================================================== */

enum { MSE_R = 3, MSE_C = 11, MSE_N = MSE_R * MSE_C };
#define MSE_S 0.125f

static void run_mse(vl_dtype pdt, vl_dtype tdt, const float *p, const float *t, float *loss,
                    float *grad) {
  vl_tensor tp = tu_tnew(cx, pdt, MSE_N, p), tt = tu_tnew(cx, tdt, MSE_N, t);
  vl_tensor tl = tu_tnew(cx, VL_F32, MSE_R, NULL);
  OK(vl_mse_fused_run(cx, &(vl_mse_fused_args){.pred = &tp, .loss = &tl, .target = &tt, .R = MSE_R,
                                               .C = MSE_C, .dloss_scale = MSE_S}));
  tu_tget(&tl, loss);
  if (grad) tu_tget(&tp, grad);
  TU_TFREE(cx, &tp, &tt, &tl);
}

typedef struct { float *p, *t; } mse_ctx;
static double mse_loss(void *q) {
  mse_ctx *k = q;
  float loss[MSE_R];
  run_mse(VL_F32, VL_F32, k->p, k->t, loss, NULL);
  return MSE_S * (loss[0] + (double)loss[1] + loss[2]); /* the scale the gradient carries */
}

static void test_mse(void **state) {
  (void)state;
  float *p = tu_randn_new(MSE_N, 1.0f, 200), *t = tu_randn_new(MSE_N, 1.0f, 201);
  float loss[MSE_R], *grad = tu_zeros(MSE_N);
  run_mse(VL_F32, VL_F32, p, t, loss, grad);
  for (int r = 0; r < MSE_R; r++) {
    double s = 0;
    for (int c = 0; c < MSE_C; c++) s += (p[r * MSE_C + c] - t[r * MSE_C + c]) * (double)(p[r * MSE_C + c] - t[r * MSE_C + c]);
    assert_true(fabs(loss[r] - s) < 1e-5 * fmax(1.0, s)); /* a sum: no mean folded in */
  }
  for (int i = 0; i < MSE_N; i++) /* 2 (pred - target) dloss_scale */
    assert_true(fabs(grad[i] - 2.0 * MSE_S * (p[i] - t[i])) < 1e-6);
  mse_ctx k = {p, t};
  tu_fd_check(mse_loss, &k, p, MSE_N, grad, FD_EPS, FD_TOL, "mse dpred");
  /* the element body (what a CUDA block strides over) */
  float *pk = copy_of(p, MSE_N);
  double s0 = 0;
  for (int c = 0; c < MSE_C; c++) s0 += vl_k_mse_elem(pk, VL_K_F32, t, VL_K_F32, MSE_S, c);
  same_bits(pk, grad, MSE_C, "mse grad (element form)");
  assert_true(fabs(s0 - loss[0]) < 1e-5 * fmax(1.0, s0));
  /* fp16/bf16 prediction, fp32 target (SD's noise) */
  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *pr = tu_rounded(p, MSE_N, dt), lref[MSE_R], lgot[MSE_R];
    float *gref = tu_zeros(MSE_N), *ggot = tu_zeros(MSE_N);
    run_mse(VL_F32, VL_F32, pr, t, lref, gref);
    run_mse(dt, VL_F32, p, t, lgot, ggot);
    tu_assert_close_dt(lgot, lref, MSE_R, VL_F32, "mse loss (fp32 out)");
    tu_assert_close_dt(ggot, gref, MSE_N, dt, "mse grad");
    free(pr); free(gref); free(ggot);
  }
  free(p); free(t); free(grad); free(pk);
}

/* ==== Gaussian sample =================================================================================== */

static void run_gauss(int64_t N, int64_t C, int64_t HW, vl_dtype dt, const float *mom,
                      const float *noise, float *z, bool alias) {
  int64_t n = N * C * HW;
  vl_tensor tm = tu_tnew(cx, dt, 2 * n, mom), tn = tu_tnew(cx, dt, n, noise);
  vl_tensor tz = alias ? tn : tu_tnew(cx, dt, n, NULL);
  OK(vl_gauss_sample_run(cx, &(vl_gauss_sample_args){.z = &tz, .moments = &tm, .noise = &tn, .N = N,
                                                     .C = C, .HW = HW, .scale = 0.18215f}));
  tu_tget(&tz, z);
  if (!alias) vl_tensor_free(cx, &tz);
  TU_TFREE(cx, &tm, &tn);
}

static void test_gauss_sample(void **state) {
  (void)state;
  enum { N = 2, C = 3, HW = 5, n = N * C * HW };
  float *mom = tu_randn_new(2 * n, 1.0f, 210), *noise = tu_randn_new(n, 1.0f, 211);
  /* log-variances outside [-30, 20] are clamped: -40 acts as -30, 25 as 20 */
  mom[(0 * 2 * C + C + 1) * HW + 2] = -40.0f;
  mom[(1 * 2 * C + C + 2) * HW + 4] = 25.0f;
  float z[n], z2[n];
  run_gauss(N, C, HW, VL_F32, mom, noise, z, false);
  for (int s = 0; s < N; s++)
    for (int c = 0; c < C; c++)
      for (int k = 0; k < HW; k++) {
        int i = (s * C + c) * HW + k;
        double mu = mom[(s * 2 * C + c) * HW + k], lv = mom[(s * 2 * C + C + c) * HW + k];
        lv = fmin(fmax(lv, -30.0), 20.0);
        double want = 0.18215 * (mu + exp(0.5 * lv) * noise[i]);
        assert_true(fabs(z[i] - want) <= 1e-5 * fmax(1.0, fabs(want)));
      }
  int hi = (1 * C + 2) * HW + 4; /* std exp(10) = 22026, not exp(12.5) */
  assert_true(fabs(z[hi] - 0.18215 * (mom[(1 * 2 * C + 2) * HW + 4] + exp(10.0) * noise[hi])) <
              1e-2);
  run_gauss(N, C, HW, VL_F32, mom, noise, z2, true); /* z written over the noise */
  same_bits(z2, z, n, "gauss sample in place");
  float zk[n];
  for (int i = 0; i < n; i++) vl_k_gauss_sample(zk, VL_K_F32, mom, VL_K_F32, noise, VL_K_F32, C, HW, 0.18215f, i);
  same_bits(zk, z, n, "gauss sample (kernel body)");
  for (int q = 0; q < 2; q++) {
    vl_dtype dt = LOWP[q];
    float *mr = tu_rounded(mom, 2 * n, dt), *nr = tu_rounded(noise, n, dt), ref[n], got[n];
    run_gauss(N, C, HW, VL_F32, mr, nr, ref, false);
    run_gauss(N, C, HW, dt, mom, noise, got, false);
    tu_assert_close_dt(got, ref, n, dt, "gauss sample");
    free(mr); free(nr);
  }
  free(mom); free(noise);
}

/* ==== argument checks ================================================================================== */

#define BAD(expr, word) TU_BAD(cx, expr, word)

static void test_bad_args(void **state) {
  (void)state;
  vl_tensor x = tu_tnew(cx, VL_F32, 60, NULL), y = tu_tnew(cx, VL_F32, 60, NULL),
            small = tu_tnew(cx, VL_F32, 10, NULL);
  vl_tensor c6 = tu_tnew(cx, VL_F32, 6, NULL), c6b = tu_tnew(cx, VL_F32, 6, NULL),
            h6 = tu_tnew(cx, VL_F16, 6, NULL), c4 = tu_tnew(cx, VL_F32, 4, NULL);
  vl_tensor h60 = x; /* x's storage seen as fp16 */
  h60.dtype = VL_F16;
  /* GroupNorm (N, C, HW, G) = (2, 6, 5, 3): statistics N*G = 6 */
  BAD(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c6b, .x = &x,
                                                        .gamma = &c6, .beta = &c6, .N = 2, .C = 6,
                                                        .HW = 5, .G = 4,
                                                        .eps = 1e-5f}), "4 groups do not divide 6");
  BAD(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c6b, .x = &x,
                                                        .gamma = &c6, .beta = &c6, .N = 2, .C = 6,
                                                        .HW = 5, .G = 0, .eps = 1e-5f}), "groups");
  BAD(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c6b,
                                                        .x = &small, .gamma = &c6, .beta = &c6,
                                                        .N = 2, .C = 6, .HW = 5, .G = 3,
                                                        .eps = 1e-5f}), "x holds 10");
  BAD(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &y, .mean = &h6, .rstd = &c6b, .x = &x,
                                                        .gamma = &c6, .beta = &c6, .N = 2, .C = 6,
                                                        .HW = 5, .G = 3,
                                                        .eps = 1e-5f}), "mean is fp16");
  BAD(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &y, .mean = &c4, .rstd = &c6b, .x = &x,
                                                        .gamma = &c6, .beta = &c6, .N = 2, .C = 6,
                                                        .HW = 5, .G = 3,
                                                        .eps = 1e-5f}), "mean holds 4");
  BAD(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &x, .mean = &c6, .rstd = &c6b, .x = &x,
                                                        .gamma = &c6, .beta = &c6, .N = 2, .C = 6,
                                                        .HW = 5, .G = 3, .eps = 1e-5f}), "y and x");
  BAD(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c6b, .x = &x,
                                                        .gamma = &c4, .beta = &c6, .N = 2, .C = 6,
                                                        .HW = 5, .G = 3,
                                                        .eps = 1e-5f}), "gamma holds 4");
  BAD(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c6b, .x = &x,
                                                        .gamma = &c6, .beta = &c6, .N = 2, .C = 6,
                                                        .HW = 5, .G = 3, .eps = -1.0f}), "eps");
  BAD(vl_groupnorm_bwd_run(cx, &(vl_groupnorm_bwd_args){.dx = &x, .dgamma = NULL, .dbeta = NULL,
                                                        .dy = &x, .x = &y, .gamma = &c6,
                                                        .mean = &c6, .rstd = &c6b, .N = 2, .C = 6,
                                                        .HW = 5, .G = 3,
                                                        .accumulate = false}), "dx and dy");
  BAD(vl_groupnorm_bwd_run(cx, &(vl_groupnorm_bwd_args){.dx = &x, .dgamma = NULL, .dbeta = NULL,
                                                        .dy = &y, .x = &x, .gamma = &c6,
                                                        .mean = &c6, .rstd = &c6b, .N = 2, .C = 6,
                                                        .HW = 5, .G = 3,
                                                        .accumulate = false}), "dx and x");
  BAD(vl_groupnorm_bwd_run(cx, &(vl_groupnorm_bwd_args){.dx = &h60, .dgamma = &c4, .dbeta = NULL,
                                                        .dy = &y, .x = &small, .gamma = &c6,
                                                        .mean = &c6, .rstd = &c6b, .N = 2, .C = 6,
                                                        .HW = 5, .G = 3,
                                                        .accumulate = false}), "x holds 10");
  BAD(vl_groupnorm_bwd_run(cx, &(vl_groupnorm_bwd_args){.dx = &small, .dgamma = NULL, .dbeta = NULL,
                                                        .dy = &y, .x = &x, .gamma = &c6,
                                                        .mean = &c6, .rstd = &c6b, .N = 2, .C = 6,
                                                        .HW = 5, .G = 3,
                                                        .accumulate = false}), "dx holds 10");
  {
    vl_tensor dx = tu_tnew(cx, VL_F32, 60, NULL);
    BAD(vl_groupnorm_bwd_run(cx, &(vl_groupnorm_bwd_args){.dx = &dx, .dgamma = &c4, .dbeta = NULL,
                                                          .dy = &y, .x = &x, .gamma = &c6,
                                                          .mean = &c6, .rstd = &c6b, .N = 2, .C = 6,
                                                          .HW = 5, .G = 3,
                                                          .accumulate = false}), "dgamma holds 4");
    BAD(vl_groupnorm_bwd_run(cx, &(vl_groupnorm_bwd_args){.dx = &dx, .dgamma = NULL, .dbeta = &h6,
                                                          .dy = &y, .x = &x, .gamma = &c6,
                                                          .mean = &h6, .rstd = &c6b, .N = 2, .C = 6,
                                                          .HW = 5, .G = 3,
                                                          .accumulate = false}), "mean is fp16");
    vl_tensor_free(cx, &dx);
  }
  OK(vl_groupnorm_fwd_run(cx, &(vl_groupnorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c6b, .x = &x,
                                                       .gamma = &c6, .beta = &c6, .N = 0, .C = 6,
                                                       .HW = 5, .G = 3, .eps = 1e-5f})); /* empty */
  /* LayerNorm (R, C) = (6, 10) */
  BAD(vl_layernorm_fwd_run(cx, &(vl_layernorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c4, .x = &x,
                                                        .gamma = &small, .beta = &small, .R = 6,
                                                        .C = 10, .eps = 1e-5f}), "rstd holds 4");
  BAD(vl_layernorm_fwd_run(cx, &(vl_layernorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c6b, .x = &x,
                                                        .gamma = &c6, .beta = &small, .R = 6,
                                                        .C = 10, .eps = 1e-5f}), "gamma holds 6");
  BAD(vl_layernorm_fwd_run(cx, &(vl_layernorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c6, .x = &x,
                                                        .gamma = &small, .beta = &small, .R = 6,
                                                        .C = 10, .eps = 1e-5f}), "mean and rstd");
  BAD(vl_layernorm_bwd_run(cx, &(vl_layernorm_bwd_args){.dx = &x, .dgamma = NULL, .dbeta = NULL,
                                                        .dy = &y, .x = &x, .gamma = &small,
                                                        .mean = &c6, .rstd = &c6b, .R = 6, .C = 10,
                                                        .accumulate = true}), "dx and x");
  BAD(vl_layernorm_bwd_run(cx, &(vl_layernorm_bwd_args){.dx = &small, .dgamma = NULL, .dbeta = NULL,
                                                        .dy = &y, .x = &x, .gamma = &small,
                                                        .mean = &c6, .rstd = &c6b, .R = 6, .C = 10,
                                                        .accumulate = true}), "dx holds 10");
  BAD(vl_layernorm_fwd_run(cx, &(vl_layernorm_fwd_args){.y = &y, .mean = &c6, .rstd = &c6b, .x = &x,
                                                        .gamma = &small, .beta = &small, .R = -6,
                                                        .C = 10, .eps = 1e-5f}), "negative");
  /* activations */
  BAD(vl_act_fwd_run(cx, &(vl_act_fwd_args){.y = &y, .x = &x, .n = 60,
                                            .act = (vl_act)7}), "unknown activation 7");
  BAD(vl_act_fwd_run(cx, &(vl_act_fwd_args){.y = &y, .x = &x, .n = -1,
                                            .act = VL_ACT_SILU}), "n = -1");
  BAD(vl_act_fwd_run(cx, &(vl_act_fwd_args){.y = &y, .x = &small, .n = 60,
                                            .act = VL_ACT_GELU}), "x holds 10");
  BAD(vl_act_fwd_run(cx, &(vl_act_fwd_args){.y = &h60, .x = &x, .n = 60,
                                            .act = VL_ACT_GELU}), "different dtypes");
  BAD(vl_act_bwd_run(cx, &(vl_act_bwd_args){.dx = &y, .dy = &x, .x = NULL, .n = 60,
                                            .act = VL_ACT_QUICK_GELU}), "x is NULL");
  /* GEGLU (R, F) = (3, 10): h (3, 20) = 60 */
  BAD(vl_geglu_fwd_run(cx, &(vl_geglu_fwd_args){.out = &y, .h = &small, .R = 3,
                                                .F = 10}), "h holds 10");
  BAD(vl_geglu_fwd_run(cx, &(vl_geglu_fwd_args){.out = &x, .h = &x, .R = 3, .F = 10}), "out and h");
  BAD(vl_geglu_bwd_run(cx, &(vl_geglu_bwd_args){.dh = &x, .dout = &x, .h = &y, .R = 3,
                                                .F = 10}), "dh and dout");
  BAD(vl_geglu_bwd_run(cx, &(vl_geglu_bwd_args){.dh = &small, .dout = &y, .h = &x, .R = 3,
                                                .F = 10}), "dh holds 10");
  /* bias (outer, C, inner) = (2, 6, 5) */
  BAD(vl_bias_fwd_run(cx, &(vl_bias_fwd_args){.y = &x, .b = &c6, .outer = 2, .C = 6, .inner = 5,
                                              .per_outer = true}), "b holds 6");
  BAD(vl_bias_fwd_run(cx, &(vl_bias_fwd_args){.y = &small, .b = &c6, .outer = 2, .C = 6, .inner = 5,
                                              .per_outer = false}), "y holds 10");
  BAD(vl_bias_bwd_run(cx, &(vl_bias_bwd_args){.db = &c4, .dy = &x, .outer = 2, .C = 6, .inner = 5,
                                              .per_outer = false,
                                              .accumulate = true}), "db holds 4");
  BAD(vl_bias_bwd_run(cx, &(vl_bias_bwd_args){.db = &x, .dy = &x, .outer = 1, .C = 6, .inner = 1,
                                              .per_outer = false,
                                              .accumulate = true}), "db and dy");
  /* padding (planes, H, W) = (3, 2, 4), (0, 1, 0, 1) -> 3 x 3 x 5 = 45 */
  BAD(vl_pad2d_fwd_run(cx, &(vl_pad2d_fwd_args){.y = &y, .x = &x, .planes = 3, .H = 2, .W = 4,
                                                .top = 0, .bottom = -1, .left = 0,
                                                .right = 1}), ">= 0");
  BAD(vl_pad2d_fwd_run(cx, &(vl_pad2d_fwd_args){.y = &small, .x = &x, .planes = 3, .H = 2, .W = 4,
                                                .top = 0, .bottom = 1, .left = 0,
                                                .right = 1}), "y holds 10");
  BAD(vl_pad2d_bwd_run(cx, &(vl_pad2d_bwd_args){.dx = &small, .dy = &x, .planes = 3, .H = 2, .W = 4,
                                                .top = 0, .bottom = 1, .left = 0,
                                                .right = 1}), "dx holds 10");
  BAD(vl_pad2d_bwd_run(cx, &(vl_pad2d_bwd_args){.dx = &x, .dy = &x, .planes = 3, .H = 2, .W = 4,
                                                .top = 0, .bottom = 1, .left = 0,
                                                .right = 1}), "dx and dy");
  /* timestep embedding */
  int32_t tv[4] = {1, 2, 3, 4};
  vl_tensor tt = ids_of(tv, 4), tf = tt;
  tf.dtype = VL_F32;
  BAD(vl_timestep_embed_run(cx, &(vl_timestep_embed_args){.emb = &x, .t = &tt, .B = 4, .dim = 5,
                                                          .flip_sin_to_cos = true, .shift = 0,
                                                          .max_period = 10000}), "even");
  BAD(vl_timestep_embed_run(cx, &(vl_timestep_embed_args){.emb = &x, .t = &tt, .B = 4, .dim = 4,
                                                          .flip_sin_to_cos = true, .shift = 2,
                                                          .max_period = 10000}), "shift");
  BAD(vl_timestep_embed_run(cx, &(vl_timestep_embed_args){.emb = &x, .t = &tt, .B = 4, .dim = 4,
                                                          .flip_sin_to_cos = true, .shift = 0,
                                                          .max_period = 0}), "max_period");
  BAD(vl_timestep_embed_run(cx, &(vl_timestep_embed_args){.emb = &x, .t = &tf, .B = 4, .dim = 4,
                                                          .flip_sin_to_cos = true, .shift = 0,
                                                          .max_period = 10000}), "i32 expected");
  BAD(vl_timestep_embed_run(cx, &(vl_timestep_embed_args){.emb = &small, .t = &tt, .B = 4, .dim = 4,
                                                          .flip_sin_to_cos = true, .shift = 0,
                                                          .max_period = 10000}), "emb holds 10");
  BAD(vl_timestep_embed_run(cx, &(vl_timestep_embed_args){.emb = &x, .t = &tt, .B = 5, .dim = 4,
                                                          .flip_sin_to_cos = true, .shift = 0,
                                                          .max_period = 10000}), "hold 4 ids");
  /* MSE (R, C) = (6, 10) */
  BAD(vl_mse_fused_run(cx, &(vl_mse_fused_args){.pred = &x, .loss = &h6, .target = &y, .R = 6,
                                                .C = 10, .dloss_scale = 1.0f}), "loss is fp16");
  BAD(vl_mse_fused_run(cx, &(vl_mse_fused_args){.pred = &x, .loss = &c6, .target = &x, .R = 6,
                                                .C = 10, .dloss_scale = 1.0f}), "pred and target");
  BAD(vl_mse_fused_run(cx, &(vl_mse_fused_args){.pred = &x, .loss = &c6, .target = &small, .R = 6,
                                                .C = 10, .dloss_scale = 1.0f}), "target holds 10");
  BAD(vl_mse_fused_run(cx, &(vl_mse_fused_args){.pred = &x, .loss = &c6, .target = &y, .R = 6,
                                                .C = 10, .dloss_scale = NAN}), "dloss_scale");
  /* Gaussian sample (N, C, HW) = (1, 3, 10): moments 60 */
  BAD(vl_gauss_sample_run(cx, &(vl_gauss_sample_args){.z = &small, .moments = &x, .noise = &y,
                                                      .N = 1, .C = 3, .HW = 10,
                                                      .scale = 0.18215f}), "z holds 10");
  BAD(vl_gauss_sample_run(cx, &(vl_gauss_sample_args){.z = &y, .moments = &small, .noise = &y,
                                                      .N = 1, .C = 3, .HW = 10,
                                                      .scale = 0.18215f}), "moments holds 10");
  BAD(vl_gauss_sample_run(cx, &(vl_gauss_sample_args){.z = &x, .moments = &x, .noise = &y, .N = 1,
                                                      .C = 3, .HW = 10,
                                                      .scale = 0.18215f}), "z and moments");
  BAD(vl_gauss_sample_run(cx, &(vl_gauss_sample_args){.z = &h60, .moments = &y, .noise = &x, .N = 1,
                                                      .C = 3, .HW = 10,
                                                      .scale = 0.18215f}), "different dtypes");
  /* nearest upsampling: the same checks as bilinear */
  BAD(vl_upsample2x_fwd_run(cx, &(vl_upsample2x_fwd_args){.y = &small, .x = &x, .planes = 1, .H = 2,
                                                          .W = 3, .nearest = true}), "y holds 10");
  BAD(vl_upsample2x_bwd_run(cx, &(vl_upsample2x_bwd_args){.dx = &x, .dy = &x, .planes = 1, .H = 1,
                                                          .W = 1, .nearest = true}), "alias");
  TU_TFREE(cx, &x, &y, &small, &c6, &c6b, &h6, &c4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_groupnorm_fwd),
      cmocka_unit_test(test_groupnorm_bwd),
      cmocka_unit_test(test_groupnorm_cuda_form),
      cmocka_unit_test(test_layernorm_fwd),
      cmocka_unit_test(test_layernorm_bwd),
      cmocka_unit_test(test_layernorm_cuda_form),
      cmocka_unit_test(test_act),
      cmocka_unit_test(test_geglu),
      cmocka_unit_test(test_bias),
      cmocka_unit_test(test_pad2d),
      cmocka_unit_test(test_upsample_nearest),
      cmocka_unit_test(test_timestep_embed),
      cmocka_unit_test(test_mse),
      cmocka_unit_test(test_gauss_sample),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, tu_cpu_setup, tu_cpu_teardown);
}
