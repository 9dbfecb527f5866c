/* Optimizers through the parameter store (vl_param_update on the CPU backend) against the
 * PyTorch / paper formulas written out here in double precision: AdamW, SGD with momentum,
 * Adafactor (factored and vector), AMP master/working copies and gradient scaling.
 *
 * The hyperparameters reach the engine as floats, so the references use the same float
 * values widened to double (e.g. (double)0.999f), not the decimal literals.
 * Tolerance: parameters are O(1) and each step moves them by O(lr); fp32 arithmetic on the
 * engine side gives errors of a few 1e-7 relative, so |got - ref| <= 1e-6 + 1e-5 |ref| is
 * ~10x above the noise and far below a wrong formula (bias correction, decay order or a
 * missing factor changes the result by >= 1e-4). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kcommon.h"
#include "vramlab/nn.h"

#define OK(expr) assert_int_equal((expr), VL_OK)
#define ATOL 1e-6
#define RTOL 1e-5

#define cx tu_cpu /* the group's CPU context (tu_cpu_setup) */

/* A trainable parameter of (rows, cols) with optimizer state, loaded with p0. */
static void mk_param(vl_param *p, int64_t rows, int64_t cols, vl_dtype dt, const vl_optim_cfg *oc,
                     const float *p0) {
  OK(vl_param_alloc(cx, p, "p", rows, cols, dt, true));
  OK(vl_param_alloc_optim(cx, p, oc));
  OK(vl_param_load(cx, p, p0));
}
static void set_grad(vl_param *p, const float *g) {
  OK(cx->be->upload(cx, &p->grad, 0, g, (size_t)(p->rows * p->cols) * sizeof(float)));
}
static void assert_close_d(const float *got, const double *ref, int64_t n, const char *what) {
  float *r = malloc((size_t)n * sizeof *r);
  for (int64_t i = 0; i < n; i++) r[i] = (float)ref[i];
  tu_assert_close(got, r, n, ATOL, RTOL, what);
  free(r);
}

/* ---- AdamW ------------------------------------------------------------------------ */

/* torch.optim.AdamW, one step t (from 1) on element arrays in double. */
static void adamw_ref(double *p, double *m, double *v, const double *g, int64_t n,
                      const vl_optim_hp *h, int64_t t) {
  double lr = h->lr, b1 = h->beta1, b2 = h->beta2, eps = h->eps, wd = h->weight_decay;
  double bc1 = 1 - pow(b1, (double)t), bc2 = 1 - pow(b2, (double)t);
  for (int64_t i = 0; i < n; i++) {
    p[i] *= 1 - lr * wd;                          /* decoupled weight decay */
    m[i] = b1 * m[i] + (1 - b1) * g[i];           /* exp_avg.lerp_(grad, 1-beta1) */
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];    /* exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2) */
    double denom = sqrt(v[i]) / sqrt(bc2) + eps;  /* (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps) */
    p[i] -= lr / bc1 * m[i] / denom;              /* p.addcdiv_(exp_avg, denom, -lr/bc1) */
  }
}

static vl_optim_cfg adamw_cfg(void) {
  vl_optim_cfg oc = {.opt = VL_OPT_ADAMW};
  oc.hp = (vl_optim_hp){.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  return oc;
}

static void test_adamw(void **state) {
  (void)state;
  enum { R = 2, C = 3, N = R * C };
  vl_optim_cfg oc = adamw_cfg();
  float p0[N], g[3][N];
  tu_randn(p0, N, 1.0f, 1);
  for (int s = 0; s < 3; s++) tu_randn(g[s], N, 1.0f + s, 10 + s);
  g[0][4] = 0.0f; /* a zero gradient on the first step: m = v = 0, no Adam step */
  vl_param p;
  mk_param(&p, R, C, VL_F32, &oc, p0);
  assert_false(p.has_master);
  double pr[N], m[N] = {0}, v[N] = {0}, gd[N];
  for (int i = 0; i < N; i++) pr[i] = p0[i];
  float got[N];
  for (int t = 1; t <= 3; t++) {
    set_grad(&p, g[t - 1]);
    OK(vl_param_update(cx, &p, &oc, t, 1.0f));
    for (int i = 0; i < N; i++) gd[i] = g[t - 1][i];
    adamw_ref(pr, m, v, gd, N, &oc.hp, t);
    OK(vl_param_read(cx, &p, got));
    assert_close_d(got, pr, N, t == 1 ? "adamw p after 1 step" : "adamw p");
    assert_close_d(p.state[0].data, m, N, "adamw m");
    assert_close_d(p.state[1].data, v, N, "adamw v");
    if (t == 1) {
      /* step 1: the bias-corrected step is lr * sign(g) (up to eps), after decay */
      for (int i = 0; i < N; i++) {
        double decayed = p0[i] * (1 - (double)oc.hp.lr * oc.hp.weight_decay);
        double step = g[0][i] == 0 ? 0.0 : (g[0][i] > 0 ? oc.hp.lr : -oc.hp.lr);
        assert_true(fabs(got[i] - (decayed - step)) < 1e-6);
      }
    }
  }
  vl_param_free(cx, &p);
}

/* ---- SGD -------------------------------------------------------------------------- */

/* torch.optim.SGD(momentum=mu, dampening=0, weight_decay=wd, nesterov=False): the buffer
 * starts as d_p itself on the first step (the same as mu * 0 + d_p). */
static void sgd_ref(double *p, double *buf, const double *g, int64_t n, const vl_optim_hp *h, int64_t t) {
  double lr = h->lr, mu = h->momentum, wd = h->weight_decay;
  for (int64_t i = 0; i < n; i++) {
    double dp = g[i] + wd * p[i];
    buf[i] = t == 1 ? dp : mu * buf[i] + dp;
    p[i] -= lr * buf[i];
  }
}

static void test_sgd_momentum(void **state) {
  (void)state;
  enum { R = 3, C = 2, N = R * C };
  vl_optim_cfg oc = {.opt = VL_OPT_SGD};
  oc.hp = (vl_optim_hp){.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
  float p0[N], g[3][N], got[N];
  tu_randn(p0, N, 1.0f, 20);
  for (int s = 0; s < 3; s++) tu_randn(g[s], N, 1.0f, 21 + s);
  const float gs = 0.5f; /* grad_scale multiplies the gradient before anything else */
  vl_param p;
  mk_param(&p, R, C, VL_F32, &oc, p0);
  double pr[N], buf[N] = {0}, gd[N];
  for (int i = 0; i < N; i++) pr[i] = p0[i];
  for (int t = 1; t <= 3; t++) {
    set_grad(&p, g[t - 1]);
    OK(vl_param_update(cx, &p, &oc, t, gs));
    for (int i = 0; i < N; i++) gd[i] = (double)gs * g[t - 1][i];
    sgd_ref(pr, buf, gd, N, &oc.hp, t);
    OK(vl_param_read(cx, &p, got));
    assert_close_d(got, pr, N, "sgd p");
    assert_close_d(p.state[0].data, buf, N, "sgd momentum buffer");
  }
  vl_param_free(cx, &p);
}

/* ---- Adafactor -------------------------------------------------------------------- */

static vl_optim_cfg adafactor_cfg(bool beta1, float clip, float wd) {
  vl_optim_cfg oc = {.opt = VL_OPT_ADAFACTOR, .adafactor_beta1 = beta1};
  oc.hp = (vl_optim_hp){.lr = 1e-2f, .beta1 = 0.9f, .decay_pow = 0.8f, .clip_thr = clip,
                        .weight_decay = wd};
  return oc;
}

static void test_adafactor_state_size(void **state) {
  (void)state;
  const int64_t shapes[3][2] = {{3, 4}, {1, 5}, {16, 8}};
  for (int b1 = 0; b1 < 2; b1++)
    for (int s = 0; s < 3; s++) {
      int64_t R = shapes[s][0], C = shapes[s][1];
      vl_optim_cfg oc = adafactor_cfg(b1, 1.0f, 0.0f);
      /* matrix: a row and a column second moment (R + C floats); vector: the full v (C);
       * plus the first moment (R*C) when beta1 is on */
      size_t want = 4 * (size_t)(R > 1 ? R + C : C) + (b1 ? 4 * (size_t)(R * C) : 0);
      assert_int_equal(vl_optim_state_bytes(&oc, R, C), want);
      vl_param p;
      OK(vl_param_alloc(cx, &p, "p", R, C, VL_F32, true));
      vl_mem_stats s0, s1;
      vl_arena_stats(cx->arena, &s0);
      OK(vl_param_alloc_optim(cx, &p, &oc));
      vl_arena_stats(cx->arena, &s1);
      size_t sum = 0, aligned = 0;
      for (int k = 0; k < 3; k++)
        if (p.state[k].owned) {
          sum += p.state[k].bytes;
          aligned += (p.state[k].bytes + VL_ARENA_ALIGN - 1) / VL_ARENA_ALIGN * VL_ARENA_ALIGN;
          assert_int_equal(p.state[k].dtype, VL_F32);
          assert_int_equal(p.state[k].cat, VL_MEM_OPTIM);
        }
      assert_int_equal(sum, want);
      assert_int_equal(s1.cur[VL_MEM_OPTIM] - s0.cur[VL_MEM_OPTIM], aligned);
      if (R > 1) assert_int_equal(p.state[0].n, R);
      else assert_false(p.state[0].owned);
      assert_int_equal(p.state[1].n, C);
      assert_int_equal(p.state[2].owned, b1);
      if (b1) assert_int_equal(p.state[2].n, R * C);
      vl_param_free(cx, &p);
    }
  /* the other optimizers: AdamW m and v (8 bytes/weight), SGD momentum (4) */
  vl_optim_cfg a = {.opt = VL_OPT_ADAMW}, s = {.opt = VL_OPT_SGD};
  assert_int_equal(vl_optim_state_bytes(&a, 3, 4), 8 * 12);
  assert_int_equal(vl_optim_state_bytes(&s, 3, 4), 4 * 12);
}

/* Adafactor (Shazeer & Stern 2018, Alg. 4/5) with a fixed learning rate, in double:
 *   b2t = 1 - t^-0.8; G = g^2 + eps1 (eps1 = 1e-30)
 *   matrix: vr = b2t vr + (1-b2t) rowmean(G); vc = b2t vc + (1-b2t) colmean(G);
 *           v = vr[r] vc[c] / mean(vr)
 *   vector: v = b2t v + (1-b2t) G
 *   u = g / sqrt(v); u /= max(1, RMS(u) / clip_thr)
 *   with beta1: m = b1 m + (1-b1) u; u = m
 *   p -= lr (u + wd p)
 * vr is unused for vectors (R == 1). Returns RMS(u) before clipping. */
static double adafactor_ref(double *p, double *vr, double *vc, double *m, const double *g, int64_t R,
                            int64_t C, const vl_optim_cfg *oc, int64_t t) {
  const vl_optim_hp *h = &oc->hp;
  const double eps1 = 1e-30;
  double b2t = 1 - pow((double)t, -(double)h->decay_pow), vbar = 0;
  if (R > 1) {
    for (int64_t r = 0; r < R; r++) {
      double s = 0;
      for (int64_t c = 0; c < C; c++) s += g[r * C + c] * g[r * C + c] + eps1;
      vr[r] = b2t * vr[r] + (1 - b2t) * s / C;
      vbar += vr[r] / R;
    }
  }
  for (int64_t c = 0; c < C; c++) {
    double s = 0;
    for (int64_t r = 0; r < R; r++) s += g[r * C + c] * g[r * C + c] + eps1;
    vc[c] = b2t * vc[c] + (1 - b2t) * s / R;
  }
  int64_t n = R * C;
  double *u = malloc((size_t)n * sizeof *u), ss = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t r = i / C, c = i % C;
    double v = R > 1 ? vr[r] * vc[c] / vbar : vc[c];
    u[i] = g[i] / sqrt(v);
    ss += u[i] * u[i];
  }
  double rms = sqrt(ss / n), div = fmax(1.0, rms / h->clip_thr);
  for (int64_t i = 0; i < n; i++) {
    double ui = u[i] / div;
    if (oc->adafactor_beta1) { m[i] = h->beta1 * m[i] + (1 - h->beta1) * ui; ui = m[i]; }
    p[i] -= h->lr * (ui + h->weight_decay * p[i]);
  }
  free(u);
  return rms;
}

/* Two steps (t = 1: b2t = 0, the moments are this step's; t = 2: b2t = 1 - 2^-0.8 mixes)
 * on a (R, C) parameter, checking parameters and state after each. */
static void adafactor_case(int64_t R, int64_t C, bool beta1, float clip, float wd, uint64_t seed,
                           bool *clipped, bool *unclipped) {
  vl_optim_cfg oc = adafactor_cfg(beta1, clip, wd);
  int64_t n = R * C;
  float *p0 = malloc((size_t)n * sizeof *p0), *g = malloc((size_t)n * sizeof *g);
  float *got = malloc((size_t)n * sizeof *got);
  double *pr = malloc((size_t)n * sizeof *pr), *gd = malloc((size_t)n * sizeof *gd);
  double *m = calloc((size_t)n, sizeof *m), vr[64] = {0}, vc[64] = {0};
  tu_randn(p0, n, 1.0f, seed);
  for (int64_t i = 0; i < n; i++) pr[i] = p0[i];
  vl_param p;
  mk_param(&p, R, C, VL_F32, &oc, p0);
  for (int t = 1; t <= 2; t++) {
    tu_randn(g, n, 1.0f, seed + 10 * t);
    /* rows and columns of different scales: the factored moment has work to do */
    for (int64_t i = 0; i < n; i++) g[i] *= (float)(1 + i / C) * (0.5f + (float)(i % C) / C);
    for (int64_t i = 0; i < n; i++) gd[i] = g[i];
    set_grad(&p, g);
    OK(vl_param_update(cx, &p, &oc, t, 1.0f));
    double rms = adafactor_ref(pr, vr, vc, m, gd, R, C, &oc, t);
    if (rms > clip) *clipped = true;
    else *unclipped = true;
    OK(vl_param_read(cx, &p, got));
    assert_close_d(got, pr, n, R > 1 ? "adafactor matrix p" : "adafactor vector p");
    if (R > 1) assert_close_d(p.state[0].data, vr, R, "adafactor vr");
    assert_close_d(p.state[1].data, vc, C, R > 1 ? "adafactor vc" : "adafactor v");
    if (beta1) assert_close_d(p.state[2].data, m, n, "adafactor m");
  }
  vl_param_free(cx, &p);
  free(p0); free(g); free(got); free(pr); free(gd); free(m);
}

static void test_adafactor_matrix(void **state) {
  (void)state;
  bool clipped = false, unclipped = false;
  adafactor_case(3, 4, false, 1.0f, 0.0f, 30, &clipped, &unclipped);
  adafactor_case(3, 4, false, 100.0f, 0.01f, 31, &clipped, &unclipped);
  adafactor_case(3, 4, true, 1.0f, 0.0f, 32, &clipped, &unclipped);
  adafactor_case(3, 4, true, 0.5f, 0.1f, 33, &clipped, &unclipped);
  assert_true(clipped);   /* both branches of the RMS clip were exercised */
  assert_true(unclipped);
}

static void test_adafactor_vector(void **state) {
  (void)state;
  bool clipped = false, unclipped = false;
  adafactor_case(1, 6, false, 1.0f, 0.0f, 40, &clipped, &unclipped);
  adafactor_case(1, 6, true, 100.0f, 0.01f, 41, &clipped, &unclipped);
  adafactor_case(1, 6, false, 0.5f, 0.0f, 42, &clipped, &unclipped);
  assert_true(clipped);
  assert_true(unclipped);
}

/* ---- AMP ------------------------------------------------------------------------- */

/* A trainable fp16/bf16 parameter keeps an fp32 master that the optimizer updates; the
 * working copy is the master rounded to the storage dtype after every step. */
static void test_amp_master(void **state) {
  (void)state;
  enum { R = 4, C = 8, N = R * C };
  const vl_dtype dts[2] = {VL_F16, VL_BF16};
  for (int d = 0; d < 2; d++) {
    vl_dtype dt = dts[d];
    vl_optim_cfg oc = adamw_cfg();
    float p0[N], g[N], got[N];
    tu_randn(p0, N, 1.0f, 50 + d);
    vl_param p;
    mk_param(&p, R, C, dt, &oc, p0);
    assert_true(p.has_master);
    assert_int_equal(p.master.dtype, VL_F32);
    assert_int_equal(p.master.cat, VL_MEM_PARAMS);
    assert_int_equal(p.w.dtype, dt);
    assert_int_equal(p.grad.dtype, VL_F32);
    /* after load: master is exact, the working copy is rounded */
    OK(vl_param_read(cx, &p, got));
    assert_memory_equal(got, p0, sizeof p0);
    for (int i = 0; i < N; i++) assert_true(vl_ld(p.w.data, (int)dt, i) == vl_round_to((int)dt, p0[i]));
    double pr[N], m[N] = {0}, v[N] = {0}, gd[N];
    for (int i = 0; i < N; i++) pr[i] = p0[i];
    for (int t = 1; t <= 2; t++) {
      tu_randn(g, N, 1.0f, 60 + t);
      set_grad(&p, g);
      OK(vl_param_update(cx, &p, &oc, t, 1.0f));
      for (int i = 0; i < N; i++) gd[i] = g[i];
      adamw_ref(pr, m, v, gd, N, &oc.hp, t);
      OK(vl_param_read(cx, &p, got)); /* reads the master */
      assert_close_d(got, pr, N, "amp master");
      const float *master = p.master.data;
      int moved = 0;
      for (int i = 0; i < N; i++) {
        float wv = vl_ld(p.w.data, (int)dt, i);
        assert_true(wv == vl_round_to((int)dt, master[i]));
        moved += wv != vl_round_to((int)dt, p0[i]);
      }
      assert_true(moved > 0); /* the working copy was refreshed, not left at its load value */
    }
    vl_param_free(cx, &p);
  }
}

/* ---- gradient scaling ------------------------------------------------------------- */

/* grad_scale multiplies the gradients first: gradients 4g with scale 1/4 give bit for bit
 * the parameters and state of gradients g with scale 1 (powers of two are exact). The state
 * (m, v, vr, vc, momentum) is compared too, because Adam and Adafactor steps are nearly
 * invariant to the gradient's scale and the parameters alone would hide an ignored scale. */
static void test_grad_scale(void **state) {
  (void)state;
  enum { R = 3, C = 4, N = R * C };
  vl_optim_cfg cfgs[4] = {adamw_cfg(), {.opt = VL_OPT_SGD}, adafactor_cfg(true, 1.0f, 0.0f),
                          adafactor_cfg(false, 1.0f, 0.0f)};
  cfgs[1].hp = (vl_optim_hp){.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
  for (int k = 0; k < 4; k++) {
    float p0[N], g[N], g4[N];
    tu_randn(p0, N, 1.0f, 70);
    tu_randn(g, N, 1.0f, 71);
    for (int i = 0; i < N; i++) g4[i] = 4.0f * g[i];
    vl_param a, b;
    mk_param(&a, R, C, VL_F32, &cfgs[k], p0);
    mk_param(&b, R, C, VL_F32, &cfgs[k], p0);
    for (int t = 1; t <= 2; t++) {
      set_grad(&a, g);
      set_grad(&b, g4);
      OK(vl_param_update(cx, &a, &cfgs[k], t, 1.0f));
      OK(vl_param_update(cx, &b, &cfgs[k], t, 0.25f));
    }
    assert_memory_equal(a.w.data, b.w.data, sizeof(float) * N);
    for (int s = 0; s < 3; s++)
      if (a.state[s].owned) assert_memory_equal(a.state[s].data, b.state[s].data, a.state[s].bytes);
    /* and the scale is not a no-op: an unscaled update of 4g differs */
    vl_param c;
    mk_param(&c, R, C, VL_F32, &cfgs[k], p0);
    for (int t = 1; t <= 2; t++) {
      set_grad(&c, g4);
      OK(vl_param_update(cx, &c, &cfgs[k], t, 1.0f));
    }
    int differ = 0;
    for (int s = 0; s < 3; s++)
      if (c.state[s].owned) differ += memcmp(a.state[s].data, c.state[s].data, c.state[s].bytes) != 0;
    assert_true(differ > 0);
    vl_param_free(cx, &c);
    vl_param_free(cx, &b);
    vl_param_free(cx, &a);
  }
}

/* Frozen parameters are left alone by the update. */
static void test_frozen_untouched(void **state) {
  (void)state;
  float p0[64], got[64];
  tu_randn(p0, 64, 1.0f, 80);
  vl_optim_cfg oc = adamw_cfg();
  vl_param p;
  OK(vl_param_alloc(cx, &p, "frozen", 1, 64, VL_F32, false));
  OK(vl_param_alloc_optim(cx, &p, &oc));
  assert_false(p.state[0].owned); /* no optimizer state for frozen weights */
  assert_false(p.grad.owned);
  OK(vl_param_load(cx, &p, p0));
  OK(vl_param_update(cx, &p, &oc, 1, 1.0f));
  OK(vl_param_read(cx, &p, got));
  assert_memory_equal(got, p0, sizeof p0);
  assert_int_equal(vl_param_read_grad(cx, &p, got), VL_ERR_INVALID);
  vl_param_free(cx, &p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_sgd_momentum),
      cmocka_unit_test(test_adafactor_state_size),
      cmocka_unit_test(test_adafactor_matrix),
      cmocka_unit_test(test_adafactor_vector),
      cmocka_unit_test(test_amp_master),
      cmocka_unit_test(test_grad_scale),
      cmocka_unit_test(test_frozen_untouched),
  };
  return cmocka_run_group_tests(tests, tu_cpu_setup, tu_cpu_teardown);
}
