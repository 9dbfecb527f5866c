/* Convolutions on the CPU backend (oneDNN): forward, backward-data and backward-weight
 * against a direct double-precision reference of PyTorch's conv2d (cross-correlation,
 * zero padding, dilation, stride), finite-difference gradient checks, weight-gradient
 * accumulation, fp16/bf16 storage through the workspace conversions, workspace checks, and
 * the planner's workspace rule equal to what the backend asks for. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kcommon.h"
#include "vramlab/backend.h"

#define OK(expr) assert_int_equal((expr), VL_OK)
#define cx tu_cpu
/* Finite differences: L is linear in each input, so central differences are exact up to
 * rounding and the step can be large. */
#define FD_EPS 1e-2f
#define FD_TOL 1e-2

typedef struct { int64_t N, C, H, W, K, R, S; int stride, pad, dil; } shape;

/* the shapes a ResNet-101 U-Net uses, small: 3x3 s1/s2, 1x1 s1/s2, 7x7 s2 p3, dilation 2 */
static const shape SHAPES[] = {
    {2, 3, 9, 9, 4, 3, 3, 1, 1, 1}, {2, 4, 9, 8, 5, 3, 3, 2, 1, 1}, {1, 6, 8, 8, 3, 1, 1, 1, 0, 1},
    {2, 4, 8, 7, 6, 1, 1, 2, 0, 1}, {1, 3, 12, 12, 4, 7, 7, 2, 3, 1}, {2, 3, 9, 9, 2, 3, 3, 1, 2, 2},
    {2, 3, 32, 32, 4, 7, 7, 2, 3, 1}, {3, 16, 16, 16, 8, 3, 3, 1, 1, 1},
};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

static vl_conv mk(const shape *s) {
  vl_conv cv;
  assert_true(vl_conv_init(&cv, s->N, s->C, s->H, s->W, s->K, s->R, s->S, s->stride, s->pad, s->dil));
  return cv;
}
static int64_t nx(const vl_conv *c) { return c->N * c->C * c->H * c->W; }
static int64_t ny(const vl_conv *c) { return c->N * c->K * c->P * c->Q; }
static int64_t nw(const vl_conv *c) { return c->K * c->C * c->R * c->S; }

/* Direct reference: calls f(n, k, p, q, c, r, s, xi, wi) for every contributing term. */
#define FOR_TERMS(cv, BODY)                                                                    \
  for (int64_t n = 0; n < (cv)->N; n++)                                                        \
    for (int64_t k = 0; k < (cv)->K; k++)                                                      \
      for (int64_t p = 0; p < (cv)->P; p++)                                                    \
        for (int64_t q = 0; q < (cv)->Q; q++)                                                  \
          for (int64_t c = 0; c < (cv)->C; c++)                                                \
            for (int64_t r = 0; r < (cv)->R; r++)                                              \
              for (int64_t s = 0; s < (cv)->S; s++) {                                          \
                int64_t hh = p * (cv)->stride - (cv)->pad + r * (cv)->dil;                     \
                int64_t ww = q * (cv)->stride - (cv)->pad + s * (cv)->dil;                     \
                if (hh < 0 || hh >= (cv)->H || ww < 0 || ww >= (cv)->W) continue;              \
                int64_t xi = ((n * (cv)->C + c) * (cv)->H + hh) * (cv)->W + ww;                \
                int64_t wi = ((k * (cv)->C + c) * (cv)->R + r) * (cv)->S + s;                  \
                int64_t yi = ((n * (cv)->K + k) * (cv)->P + p) * (cv)->Q + q;                  \
                BODY;                                                                          \
              }

static void ref_fwd(const vl_conv *cv, const float *x, const float *w, double *y) {
  memset(y, 0, (size_t)ny(cv) * sizeof *y);
  FOR_TERMS(cv, y[yi] += (double)x[xi] * w[wi]);
}
static void ref_bwd_data(const vl_conv *cv, const float *dy, const float *w, double *dx) {
  memset(dx, 0, (size_t)nx(cv) * sizeof *dx);
  FOR_TERMS(cv, dx[xi] += (double)dy[yi] * w[wi]);
}
static void ref_bwd_weight(const vl_conv *cv, const float *x, const float *dy, double *dw) {
  memset(dw, 0, (size_t)nw(cv) * sizeof *dw);
  FOR_TERMS(cv, dw[wi] += (double)dy[yi] * x[xi]);
}

/* The workspace op `dir` needs on c's target (the descriptor's rule). */
static size_t conv_ws(vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, bool acc) {
  vl_conv_fwd_args f = {.cv = *cv};
  vl_conv_bwd_data_args d = {.cv = *cv};
  vl_conv_bwd_weight_args w = {.cv = *cv, .accumulate = acc};
  return dir == VL_CONV_FWD ? vl_op_ws_bytes(c, VL_OP_CONV_FWD, &f)
         : dir == VL_CONV_BWD_DATA ? vl_op_ws_bytes(c, VL_OP_CONV_BWD_DATA, &d)
                                   : vl_op_ws_bytes(c, VL_OP_CONV_BWD_WEIGHT, &w);
}

/* Runs one direction on the CPU backend with workspace from the arena. */
typedef struct { vl_conv cv; vl_dtype xdt, wdt, gdt; bool acc; } run_cfg;

static void run_dir(const run_cfg *rc, vl_conv_dir dir, const float *a, const float *b, float *out,
                    const float *out_init) {
  vl_conv cv = rc->cv;
  cv.xdt = rc->xdt; cv.wdt = rc->wdt; cv.gdt = rc->gdt;
  size_t wsb = conv_ws(cx, &cv, dir, rc->acc);
  vl_tensor ws = {0};
  if (wsb) {
    int64_t n = ((int64_t)wsb + 3) / 4;
    OK(vl_tensor_alloc(cx, &ws, VL_F32, VL_MEM_WORKSPACE, 1, &n));
  }
  vl_tensor ta, tb, to;
  if (dir == VL_CONV_FWD) {
    ta = tu_tnew(cx, cv.xdt, nx(&cv), a);
    tb = tu_tnew(cx, cv.wdt, nw(&cv), b);
    to = tu_tnew(cx, cv.xdt, ny(&cv), NULL);
    OK(vl_conv_fwd_run(cx, &(vl_conv_fwd_args){.cv = cv, .y = &to, .x = &ta, .w = &tb,
                                               .ws = ws.data, .ws_bytes = wsb}));
  } else if (dir == VL_CONV_BWD_DATA) {
    ta = tu_tnew(cx, cv.xdt, ny(&cv), a);
    tb = tu_tnew(cx, cv.wdt, nw(&cv), b);
    to = tu_tnew(cx, cv.xdt, nx(&cv), NULL);
    OK(vl_conv_bwd_data_run(cx, &(vl_conv_bwd_data_args){.cv = cv, .dx = &to, .dy = &ta, .w = &tb,
                                                         .ws = ws.data, .ws_bytes = wsb}));
  } else {
    ta = tu_tnew(cx, cv.xdt, nx(&cv), a);
    tb = tu_tnew(cx, cv.xdt, ny(&cv), b);
    to = tu_tnew(cx, cv.gdt, nw(&cv), out_init);
    OK(vl_conv_bwd_weight_run(cx, &(vl_conv_bwd_weight_args){.cv = cv, .dw = &to, .x = &ta,
                                                             .dy = &tb, .accumulate = rc->acc,
                                                             .ws = ws.data, .ws_bytes = wsb}));
  }
  tu_tget(&to, out);
  vl_tensor_free(cx, &to); vl_tensor_free(cx, &tb); vl_tensor_free(cx, &ta);
  if (wsb) vl_tensor_free(cx, &ws);
}

static void close_ref(const float *got, const double *ref, int64_t n, double rtol, const char *what) {
  double scale = 0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(got[i] - ref[i]) <= rtol * (fabs(ref[i]) + scale * 1e-2) + 1e-6)) {
      print_error("%s element %lld: got %.7g, want %.7g\n", what, (long long)i, got[i], ref[i]);
      fail();
    }
}

static void test_geometry(void **state) {
  (void)state;
  vl_conv cv;
  assert_true(vl_conv_init(&cv, 1, 3, 224, 224, 64, 7, 7, 2, 3, 1));
  assert_int_equal(cv.P, 112); assert_int_equal(cv.Q, 112);
  assert_true(vl_conv_init(&cv, 1, 64, 56, 56, 64, 3, 3, 2, 1, 1));
  assert_int_equal(cv.P, 28);
  assert_true(vl_conv_init(&cv, 1, 8, 9, 9, 8, 3, 3, 1, 2, 2));
  assert_int_equal(cv.P, 9);
  assert_true(vl_conv_init(&cv, 1, 8, 63, 63, 8, 1, 1, 2, 0, 1));
  assert_int_equal(cv.P, 32);
  assert_true(vl_conv_flops(&cv) == 2.0 * 8 * 32 * 32 * 8);
  assert_false(vl_conv_init(&cv, 1, 8, 2, 2, 8, 5, 5, 1, 0, 1)); /* kernel exceeds input */
  assert_false(vl_conv_init(&cv, 0, 8, 8, 8, 8, 3, 3, 1, 1, 1));
  assert_false(vl_conv_init(&cv, 1, 8, 8, 8, 8, 3, 3, 0, 1, 1));
  assert_false(vl_conv_init(&cv, 1, 8, 8, 8, 8, 3, 3, 1, -1, 1));
}

/* Every direction of every shape against the double reference (fp32: summation-order
 * rounding only, ~1e-6 relative). */
static void test_reference(void **state) {
  (void)state;
  for (int i = 0; i < NSHAPES; i++) {
    run_cfg rc = {mk(&SHAPES[i]), VL_F32, VL_F32, VL_F32, false};
    const vl_conv *cv = &rc.cv;
    float *x = tu_randn_new(nx(cv), 1.0f, 10 + i), *w = tu_randn_new(nw(cv), 1.0f, 20 + i),
          *dy = tu_randn_new(ny(cv), 1.0f, 30 + i);
    float *y = malloc((size_t)ny(cv) * 4), *dx = malloc((size_t)nx(cv) * 4), *dw = malloc((size_t)nw(cv) * 4);
    double *ry = malloc((size_t)ny(cv) * 8), *rdx = malloc((size_t)nx(cv) * 8),
           *rdw = malloc((size_t)nw(cv) * 8);
    run_dir(&rc, VL_CONV_FWD, x, w, y, NULL);
    ref_fwd(cv, x, w, ry);
    close_ref(y, ry, ny(cv), 1e-4, "conv_fwd");
    run_dir(&rc, VL_CONV_BWD_DATA, dy, w, dx, NULL);
    ref_bwd_data(cv, dy, w, rdx);
    close_ref(dx, rdx, nx(cv), 1e-4, "conv_bwd_data");
    run_dir(&rc, VL_CONV_BWD_WEIGHT, x, dy, dw, NULL);
    ref_bwd_weight(cv, x, dy, rdw);
    close_ref(dw, rdw, nw(cv), 1e-4, "conv_bwd_weight");
    print_message("  shape %d: %s\n", i, vl_cpu_conv_impl(cv, VL_CONV_FWD));
    free(x); free(w); free(dy); free(y); free(dx); free(dw); free(ry); free(rdx); free(rdw);
  }
}

/* Finite differences of L = sum(r * conv(x, w)) against conv_bwd_data / conv_bwd_weight
 * applied to r (the gradient of L with respect to y is r). */
typedef struct { run_cfg rc; float *x, *w, *r, *y; } fd_ctx;
static double fd_loss(void *p) {
  fd_ctx *k = p;
  run_dir(&k->rc, VL_CONV_FWD, k->x, k->w, k->y, NULL);
  return tu_dot(k->r, k->y, ny(&k->rc.cv));
}
static void test_fd(void **state) {
  (void)state;
  const int pick[3] = {1, 4, 5}; /* strided, 7x7 s2 p3, dilated */
  for (int j = 0; j < 3; j++) {
    shape s = SHAPES[pick[j]];
    s.N = 1;
    fd_ctx k = {{mk(&s), VL_F32, VL_F32, VL_F32, false}, 0, 0, 0, 0};
    const vl_conv *cv = &k.rc.cv;
    k.x = tu_randn_new(nx(cv), 1.0f, 40 + j);
    k.w = tu_randn_new(nw(cv), 1.0f, 50 + j);
    k.r = tu_randn_new(ny(cv), 1.0f, 60 + j);
    k.y = malloc((size_t)ny(cv) * 4);
    float *dx = malloc((size_t)nx(cv) * 4), *dw = malloc((size_t)nw(cv) * 4);
    run_dir(&k.rc, VL_CONV_BWD_DATA, k.r, k.w, dx, NULL);
    run_dir(&k.rc, VL_CONV_BWD_WEIGHT, k.x, k.r, dw, NULL);
    tu_fd_check(fd_loss, &k, k.x, nx(cv), dx, FD_EPS, FD_TOL, "dx");
    tu_fd_check(fd_loss, &k, k.w, nw(cv), dw, FD_EPS, FD_TOL, "dw");
    free(k.x); free(k.w); free(k.r); free(k.y); free(dx); free(dw);
  }
}

/* accumulate: dw = old + grad, in fp32 and through an fp16 gradient buffer */
static void test_accumulate(void **state) {
  (void)state;
  run_cfg rc = {mk(&SHAPES[1]), VL_F32, VL_F32, VL_F32, true};
  const vl_conv *cv = &rc.cv;
  float *x = tu_randn_new(nx(cv), 1.0f, 70), *dy = tu_randn_new(ny(cv), 1.0f, 71),
        *old = tu_randn_new(nw(cv), 1.0f, 72);
  float *dw = malloc((size_t)nw(cv) * 4), *g = malloc((size_t)nw(cv) * 4);
  run_cfg plain = rc;
  plain.acc = false;
  run_dir(&plain, VL_CONV_BWD_WEIGHT, x, dy, g, NULL);
  run_dir(&rc, VL_CONV_BWD_WEIGHT, x, dy, dw, old);
  for (int64_t i = 0; i < nw(cv); i++) assert_float_equal(dw[i], old[i] + g[i], 1e-5f * (1 + fabsf(g[i])));
  rc.gdt = VL_F16; /* the gradient kept in fp16: added in fp32, then rounded once */
  float *oldh = calloc((size_t)nw(cv), 4);
  for (int64_t i = 0; i < nw(cv); i++) oldh[i] = vl_round_to(VL_F16, old[i]);
  run_dir(&rc, VL_CONV_BWD_WEIGHT, x, dy, dw, oldh);
  for (int64_t i = 0; i < nw(cv); i++)
    assert_float_equal(dw[i], vl_round_to(VL_F16, oldh[i] + g[i]), 2e-3f * (1 + fabsf(g[i])));
  free(x); free(dy); free(old); free(dw); free(g); free(oldh);
}

/* fp16/bf16 storage: the fp32 convolution of the rounded operands, rounded once. */
static void test_lowp(void **state) {
  (void)state;
  const vl_dtype dts[2] = {VL_F16, VL_BF16};
  for (int d = 0; d < 2; d++) {
    vl_dtype dt = dts[d];
    run_cfg lo = {mk(&SHAPES[0]), dt, dt, VL_F32, false}, f32 = lo;
    f32.xdt = f32.wdt = VL_F32;
    const vl_conv *cv = &lo.cv;
    float *x = tu_randn_new(nx(cv), 1.0f, 80), *w = tu_randn_new(nw(cv), 1.0f, 81),
          *dy = tu_randn_new(ny(cv), 1.0f, 82);
    for (int64_t i = 0; i < nx(cv); i++) x[i] = vl_round_to((int)dt, x[i]);
    for (int64_t i = 0; i < nw(cv); i++) w[i] = vl_round_to((int)dt, w[i]);
    for (int64_t i = 0; i < ny(cv); i++) dy[i] = vl_round_to((int)dt, dy[i]);
    float *a = malloc((size_t)ny(cv) * 4), *b = malloc((size_t)ny(cv) * 4);
    float *c1 = malloc((size_t)nx(cv) * 4), *c2 = malloc((size_t)nx(cv) * 4);
    float *g1 = malloc((size_t)nw(cv) * 4), *g2 = malloc((size_t)nw(cv) * 4);
    double u = dt == VL_F16 ? 0x1p-11 : 0x1p-8;
    run_dir(&lo, VL_CONV_FWD, x, w, a, NULL);
    run_dir(&f32, VL_CONV_FWD, x, w, b, NULL);
    for (int64_t i = 0; i < ny(cv); i++) assert_true(fabs(a[i] - b[i]) <= u * 1.0001 * fabs(b[i]) + 1e-6);
    run_dir(&lo, VL_CONV_BWD_DATA, dy, w, c1, NULL);
    run_dir(&f32, VL_CONV_BWD_DATA, dy, w, c2, NULL);
    for (int64_t i = 0; i < nx(cv); i++) assert_true(fabs(c1[i] - c2[i]) <= u * 1.0001 * fabs(c2[i]) + 1e-6);
    run_dir(&lo, VL_CONV_BWD_WEIGHT, x, dy, g1, NULL); /* fp32 gradient of fp16 activations */
    run_dir(&f32, VL_CONV_BWD_WEIGHT, x, dy, g2, NULL);
    for (int64_t i = 0; i < nw(cv); i++) assert_float_equal(g1[i], g2[i], 1e-5f * (1 + fabsf(g2[i])));
    free(x); free(w); free(dy); free(a); free(b); free(c1); free(c2); free(g1); free(g2);
  }
}

/* The planner's CPU rule is the backend's, and a short workspace is an error, not a crash. */
static void test_workspace(void **state) {
  (void)state;
  vl_ctx *plan;
  OK(vl_ctx_create(&plan, VL_DEV_PLAN, VL_NO_CAP));
  plan->plan_target = VL_DEV_CPU;
  for (int i = 0; i < NSHAPES; i++)
    for (int dir = 0; dir < 3; dir++)
      for (int acc = 0; acc < 2; acc++) {
        vl_conv cv = mk(&SHAPES[i]);
        cv.xdt = acc ? VL_F16 : VL_F32;
        assert_int_equal(conv_ws(plan, &cv, (vl_conv_dir)dir, acc),
                         conv_ws(cx, &cv, (vl_conv_dir)dir, acc));
      }
  vl_ctx_destroy(plan);
  vl_conv cv = mk(&SHAPES[0]);
  cv.xdt = VL_F16; /* needs conversion buffers, so the workspace is never 0 */
  size_t need = conv_ws(cx, &cv, VL_CONV_FWD, false);
  assert_true(need > 0);
  vl_tensor x = tu_tnew(cx, VL_F16, nx(&cv), NULL), w = tu_tnew(cx, VL_F32, nw(&cv), NULL),
            y = tu_tnew(cx, VL_F16, ny(&cv), NULL);
  char buf[64];
  assert_int_equal(vl_conv_fwd_run(cx, &(vl_conv_fwd_args){.cv = cv, .y = &y, .x = &x, .w = &w,
                                                           .ws = buf,
                                                           .ws_bytes = sizeof buf}), VL_ERR_INVALID);
  assert_non_null(strstr(cx->err, "workspace"));
  vl_tensor small = tu_tnew(cx, VL_F16, ny(&cv) - 1, NULL);
  assert_int_equal(vl_conv_fwd_run(cx, &(vl_conv_fwd_args){.cv = cv, .y = &small, .x = &x, .w = &w,
                                                           .ws = NULL,
                                                           .ws_bytes = 0}), VL_ERR_INVALID);
  vl_tensor_free(cx, &small); vl_tensor_free(cx, &y); vl_tensor_free(cx, &w); vl_tensor_free(cx, &x);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(test_geometry), cmocka_unit_test(test_reference),
      cmocka_unit_test(test_fd), cmocka_unit_test(test_accumulate),
      cmocka_unit_test(test_lowp), cmocka_unit_test(test_workspace),
  };
  return cmocka_run_group_tests(t, tu_cpu_setup, tu_cpu_teardown);
}
