/* The data-parallel wrapper on 2 ranks under mpirun (tests/mpirun.sh 2 mpi_ddp): Mistral
 * tiny (fixed sequence length, every target valid, fp32, AdamW with the default clip 1.0)
 * trained a few steps.
 *   - DDP on 2 ranks at batch b equals 1 rank at 2b (each rank runs that reference itself on
 *     its own context): losses and parameters within a tolerance, not bitwise: the 2b
 *     reference sums each weight gradient over 2b rows in one GEMM, DDP sums b rows per rank
 *     and adds the two halves (then halves the sum), another rounding order;
 *   - overlap on and off, and grad_as_bucket_view, give identical bits;
 *   - the ranks' parameters are identical bit for bit (rank 1 made with another seed: the
 *     broadcast at creation);
 *   - ZeRO-1 equals DDP after 5 steps (tolerance: the clip's global norm is summed shard by
 *     shard instead of parameter by parameter);
 *   - the DataParallel-style baseline equals DDP (rank 1 passes no data);
 *   - the U-Net with batch norm: each rank normalises with its own batch statistics (DDP
 *     without SyncBatchNorm), so 2 ranks at b are not 1 rank at 2b (the difference is
 *     printed); what holds: parameters identical on both ranks, BN running statistics
 *     broadcast from rank 0 before each forward (torch DDP's broadcast_buffers);
 *   - fp16 AMP with the loss scaler: an initial scale that overflows is skipped on both ranks
 *     alike, the scales follow the 1-rank reference, losses close to it.
 * Verdicts are agreed over MPI_Allreduce directly, so both ranks fail the same test. */
#include "testutil.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/ddp.h"
#include "vramlab/mistral.h"
#include "vramlab/resunet.h"

static vl_comm *cm;
static int rank, size;

#define MAXSTEPS 8
typedef struct {
  double loss[MAXSTEPS];
  float scale[MAXSTEPS];
  bool skipped[MAXSTEPS];
  float *p;    /* every trainable parameter, fp32 values, in order */
  int64_t n;
  float *bn;   /* the U-Net's BN running statistics (NULL for Mistral) */
  int64_t nbn;
  vl_dist_stats st;
} result;

static void result_free(result *r) {
  free(r->p);
  free(r->bn);
  memset(r, 0, sizeof *r);
}

/* Every rank agrees on a verdict (bad counts summed over ranks). */
static void agree(long bad, const char *what) {
  long total = 0;
  MPI_Allreduce(&bad, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (total) print_error("%s: failed on %ld rank(s)\n", what, total);
  assert_int_equal(total, 0);
}

/* ---- batches: one global batch per step, the same on every rank --------------------------- */

typedef struct {
  bool seg;
  int64_t B, T, H;      /* global rows; Mistral sequence; U-Net side */
  int32_t *tok, *tgt;   // (B, T) Mistral
  float *img;           // (B, 3, H, H) U-Net
  int32_t *mask;        // (B, H, H)
} gbatch;

static void gbatch_make(gbatch *g, bool seg, int64_t B, int step) {
  memset(g, 0, sizeof *g);
  g->seg = seg;
  g->B = B;
  vl_rng r;
  vl_rng_seed(&r, 1000 + (uint64_t)step);
  if (!seg) {
    g->T = 32;
    g->tok = malloc((size_t)(B * g->T) * 4);
    g->tgt = malloc((size_t)(B * g->T) * 4);
    for (int64_t i = 0; i < B * g->T; i++) {
      g->tok[i] = (int32_t)vl_rng_below(&r, 256);
      g->tgt[i] = (int32_t)vl_rng_below(&r, 256); /* every target valid */
    }
    return;
  }
  g->H = 32;
  int64_t hw = g->H * g->H;
  g->img = malloc((size_t)(B * 3 * hw) * 4);
  g->mask = malloc((size_t)(B * hw) * 4);
  for (int64_t i = 0; i < B * 3 * hw; i++) g->img[i] = vl_rng_normal(&r);
  for (int64_t i = 0; i < B * hw; i++) g->mask[i] = (int32_t)vl_rng_below(&r, 5);
}

static void gbatch_free(gbatch *g) {
  free(g->tok);
  free(g->tgt);
  free(g->img);
  free(g->mask);
}

/* Rows [r0, r0 + n) of the global batch (data NULL when nodata: a DP replica). */
static vl_batch rows(const gbatch *g, int64_t r0, int64_t n, bool nodata) {
  vl_batch b = {0};
  if (!g->seg) {
    int64_t bt[2] = {n, g->T};
    vl_batch_add(&b, "tokens", VL_I32, 2, bt, nodata ? NULL : g->tok + r0 * g->T);
    vl_batch_add(&b, "targets", VL_I32, 2, bt, nodata ? NULL : g->tgt + r0 * g->T);
  } else {
    int64_t hw = g->H * g->H, xs[4] = {n, 3, g->H, g->H}, ys[3] = {n, g->H, g->H};
    vl_batch_add(&b, "images", VL_F32, 4, xs, nodata ? NULL : g->img + r0 * 3 * hw);
    vl_batch_add(&b, "masks", VL_I32, 3, ys, nodata ? NULL : g->mask + r0 * hw);
  }
  return b;
}

/* ---- one training run ------------------------------------------------------------------------ */

typedef struct {
  const vl_model_type *inner;
  const void *inner_cfg;
  bool seg;
  int64_t b;          /* rows per rank */
  int steps;
  bool last_same;     /* the last step: every rank takes rank 0's rows */
} job;

/* d NULL: the model alone on the global batch of 2b rows (the reference). */
static void run(const job *j, const vl_dist_cfg *d, uint64_t seed, result *out) {
  memset(out, 0, sizeof *out);
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_model *m;
  vl_status s = d ? vl_model_create(c, &vl_model_dist, d, seed, &m)
                  : vl_model_create(c, j->inner, j->inner_cfg, seed, &m);
  if (s != VL_OK) print_error("rank %d: create: %s\n", rank, c->err);
  assert_int_equal(s, VL_OK);
  int world = d ? d->world : 1;
  for (int k = 0; k < j->steps; k++) {
    gbatch g;
    gbatch_make(&g, j->seg, 2 * j->b, k);
    vl_batch b;
    if (!d) b = rows(&g, 0, 2 * j->b, false);
    else if (d->mode == VL_DIST_DP) b = rows(&g, 0, world * j->b, rank != 0);
    else if (j->last_same && k == j->steps - 1) b = rows(&g, 0, j->b, false);
    else b = rows(&g, (int64_t)d->rank * j->b, j->b, false);
    vl_step_info info;
    s = vl_model_step(m, &b, 1, &info);
    if (s != VL_OK) print_error("rank %d step %d: %s\n", rank, k, c->err);
    assert_int_equal(s, VL_OK);
    out->loss[k] = info.loss;
    out->scale[k] = info.loss_scale;
    out->skipped[k] = info.skipped;
    gbatch_free(&g);
  }
  vl_model *inner = d ? vl_dist_inner(m) : m;
  vl_train_state ts;
  assert_int_equal(vl_model_train_state(inner, &ts), VL_OK);
  for (int i = 0; i < ts.n; i++) out->n += ts.p[i].trainable ? ts.p[i].rows * ts.p[i].cols : 0;
  out->p = malloc((size_t)out->n * 4);
  int64_t o = 0;
  for (int i = 0; i < ts.n; i++) {
    if (!ts.p[i].trainable) continue;
    assert_int_equal(vl_param_read(c, &ts.p[i], out->p + o), VL_OK);
    o += ts.p[i].rows * ts.p[i].cols;
  }
  for (int i = 0; i < ts.n_buffers; i++) out->nbn += ts.buffers[i]->n;
  if (out->nbn) {
    out->bn = malloc((size_t)out->nbn * 4);
    o = 0;
    for (int i = 0; i < ts.n_buffers; i++) {
      assert_int_equal(c->be->download(c, out->bn + o, ts.buffers[i], 0, ts.buffers[i]->bytes), VL_OK);
      o += ts.buffers[i]->n;
    }
  }
  if (d) assert_int_equal(vl_dist_stats_get(m, &out->st), VL_OK);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
}

static vl_mistral_model_cfg g_mis;

static job mistral_job(vl_dtype compute, float loss_scale, int steps) {
  assert_int_equal(vl_mistral_preset("tiny", &g_mis.mc), 0);
  vl_train_cfg_default(&g_mis.tc);
  g_mis.tc.compute = compute;
  g_mis.tc.loss_scale = loss_scale;
  g_mis.tc.optim.hp.lr = 1e-3f; /* steps that move the parameters well above rounding */
  return (job){&vl_model_mistral, &g_mis, false, 2, steps, false};
}

static vl_dist_cfg dist(const job *j, vl_dist_mode mode) {
  vl_dist_cfg d;
  memset(&d, 0, sizeof d);
  d.inner = j->inner;
  d.inner_cfg = j->inner_cfg;
  d.mode = mode;
  d.world = size;
  d.rank = rank;
  d.comm = cm;
  d.overlap = true;
  d.first_bucket_cap = 16 << 10; /* several buckets for a tiny model */
  d.bucket_cap = 64 << 10;
  return d;
}

/* Largest |a - b| / (atol + rtol |b|) over the parameters. */
static double worst(const result *a, const result *b, double atol, double rtol) {
  assert_int_equal(a->n, b->n);
  return tu_max_rel_err(a->p, b->p, a->n, atol, rtol);
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
  double w = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= w)) w = e;
  }
  return w;
}

/* ||a - b|| / ||b - init||: how far apart two runs ended, as a share of how far training
 * moved the parameters */
static double apart(const result *a, const result *b, const result *init) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b->n; i++) {
    double x = (double)a->p[i] - b->p[i], y = (double)b->p[i] - init->p[i];
    num += x * x;
    den += y * y;
  }
  return den > 0 ? sqrt(num / den) : INFINITY;
}

/* rank 0's n floats against this rank's: 0 when equal bit for bit */
static long differs_from_rank0(const float *x, int64_t n) {
  float *r0 = malloc((size_t)n * 4);
  memcpy(r0, x, (size_t)n * 4);
  MPI_Bcast(r0, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
  long bad = memcmp(r0, x, (size_t)n * 4) != 0;
  free(r0);
  return bad;
}

/* ---- the tests ----------------------------------------------------------------------------- */

/* fp32, AdamW at lr 1e-3: the gradients differ in their last bits (summation order); AdamW
 * divides by sqrt(v), so an element whose gradient is near zero can move by up to lr per
 * step differently: elementwise 5e-5 (5% of one step) and, over all, 1e-3 of the distance
 * training moved the parameters */
#define LOSS_TOL 1e-5   /* relative, per step */
#define P_ATOL 5e-5     /* parameters: |a - b| <= P_ATOL + P_RTOL |b| */
#define P_RTOL 1e-4
#define P_APART 1e-3
/* fp16: activations and their gradients rounded to 11 bits, in other row groupings */
#define FP16_SCALE0 524288.0f
#define FP16_LOSS_TOL 1e-3
#define FP16_APART 0.05

static void test_ddp_equals_one_rank(void **state) {
  job j = mistral_job(VL_F32, 65536.0f, 5);
  result ref, ddp;
  run(&j, NULL, 7, &ref);
  vl_dist_cfg d = dist(&j, VL_DIST_DDP);
  run(&j, &d, 7 + (uint64_t)rank, &ddp); /* rank 1 seeded otherwise: the broadcast fixes it */
  long bad = 0;
  double lw = 0;
  for (int k = 0; k < j.steps; k++) {
    double e = fabs(ddp.loss[k] - ref.loss[k]) / fabs(ref.loss[k]);
    if (e > lw) lw = e;
  }
  result init;
  job j0 = j;
  j0.steps = 0;
  run(&j0, NULL, 7, &init);
  double pw = worst(&ddp, &ref, P_ATOL, P_RTOL), pmax = max_abs_diff(ddp.p, ref.p, ref.n);
  double ap = apart(&ddp, &ref, &init);
  if (rank == 0)
    printf("ddp 2x%lld vs 1x%lld, %d steps: max loss rel diff %.3g, max param |diff| %.3g "
           "(tolerance ratio %.3g), |ddp - 1 rank| / |1 rank - init| = %.3g; %d buckets, "
           "comm %.3f s, exposed %.3f s\n", (long long)j.b, (long long)(2 * j.b), j.steps, lw,
           pmax, pw, ap, ddp.st.n_buckets, ddp.st.comm_s, ddp.st.exposed_s);
  bad += lw > LOSS_TOL || pw > 1.0 || ap > P_APART;
  bad += ddp.st.n_buckets < 3 || ddp.st.steps != j.steps || !(ddp.st.comm_s > 0);
  agree(bad, "2 ranks at b == 1 rank at 2b");
  /* the ranks hold the same parameters, bit for bit */
  agree(differs_from_rank0(ddp.p, ddp.n), "DDP parameters identical on every rank");
  /* and training moved them (a no-op wrapper would pass the comparisons above) */
  agree(max_abs_diff(init.p, ddp.p, ddp.n) < 1e-3, "training moved the parameters");
  result_free(&init);
  result_free(&ref);
  result_free(&ddp);
}

/* overlap on/off and grad_as_bucket_view: the same reductions of the same buckets */
static void test_overlap_and_views_same_bits(void **state) {
  job j = mistral_job(VL_F32, 65536.0f, 3);
  vl_dist_cfg d = dist(&j, VL_DIST_DDP);
  result on, off, view;
  run(&j, &d, 7, &on);
  d.overlap = false;
  run(&j, &d, 7, &off);
  d.overlap = true;
  d.grad_as_bucket_view = true;
  run(&j, &d, 7, &view);
  long bad = memcmp(on.p, off.p, (size_t)on.n * 4) != 0 || memcmp(on.loss, off.loss, sizeof on.loss);
  agree(bad, "overlap on == off, bitwise");
  bad = memcmp(on.p, view.p, (size_t)on.n * 4) != 0 || memcmp(on.loss, view.loss, sizeof on.loss);
  agree(bad, "grad_as_bucket_view == copies, bitwise");
  result_free(&on);
  result_free(&off);
  result_free(&view);
}

static void test_zero1_equals_ddp(void **state) {
  job j = mistral_job(VL_F32, 65536.0f, 5);
  vl_dist_cfg d = dist(&j, VL_DIST_DDP);
  result ddp, zero;
  run(&j, &d, 7, &ddp);
  d.mode = VL_DIST_ZERO1;
  run(&j, &d, 7, &zero);
  double pw = worst(&zero, &ddp, P_ATOL, P_RTOL), pmax = max_abs_diff(zero.p, ddp.p, ddp.n);
  double lw = 0;
  for (int k = 0; k < j.steps; k++) lw = fmax(lw, fabs(zero.loss[k] - ddp.loss[k]) / ddp.loss[k]);
  if (rank == 0)
    printf("zero1 vs ddp, %d steps: max loss rel diff %.3g, max param |diff| %.3g (%s)\n", j.steps,
           lw, pmax, memcmp(zero.p, ddp.p, (size_t)ddp.n * 4) ? "not bitwise" : "bitwise");
  agree(pw > 1.0 || lw > LOSS_TOL, "ZeRO-1 == DDP after 5 steps");
  agree(differs_from_rank0(zero.p, zero.n), "ZeRO-1 parameters identical on every rank");
  result_free(&ddp);
  result_free(&zero);
}

static void test_dp_equals_ddp(void **state) {
  job j = mistral_job(VL_F32, 65536.0f, 4);
  vl_dist_cfg d = dist(&j, VL_DIST_DDP);
  result ddp, dp;
  run(&j, &d, 7, &ddp);
  d.mode = VL_DIST_DP;
  run(&j, &d, 7 + (uint64_t)rank, &dp);
  double pw = worst(&dp, &ddp, P_ATOL, P_RTOL), pmax = max_abs_diff(dp.p, ddp.p, ddp.n);
  double lw = 0;
  for (int k = 0; k < j.steps; k++) lw = fmax(lw, fabs(dp.loss[k] - ddp.loss[k]) / ddp.loss[k]);
  if (rank == 0)
    printf("dp vs ddp, %d steps: max loss rel diff %.3g, max param |diff| %.3g (%s)\n", j.steps,
           lw, pmax, memcmp(dp.p, ddp.p, (size_t)ddp.n * 4) ? "not bitwise" : "bitwise");
  printf("rank %d dp: compute %.3f s, idle %.3f s, exposed %.3f s of %.3f s\n", rank,
         dp.st.compute_s, dp.st.idle_s, dp.st.exposed_s, dp.st.step_s);
  long bad = pw > 1.0 || lw > LOSS_TOL;
  bad += rank != 0 && !(dp.st.idle_s > 0); /* replicas wait for rank 0 */
  agree(bad, "DP == DDP");
  agree(differs_from_rank0(dp.p, dp.n), "DP parameters identical on every rank");
  result_free(&ddp);
  result_free(&dp);
}

static void test_unet_batch_norm(void **state) {
  vl_resunet_model_cfg k;
  assert_int_equal(vl_resunet_preset("tiny", &k.mc), 0);
  vl_resunet_train_cfg_default(&k.tc);
  job j = {&vl_model_resunet, &k, true, 2, 3, true};
  result ref, ddp;
  run(&j, NULL, 3, &ref);
  vl_dist_cfg d = dist(&j, VL_DIST_DDP);
  run(&j, &d, 3 + (uint64_t)rank, &ddp);
  if (rank == 0)
    printf("resunet-tiny ddp 2x2 vs 1x4 (per-rank batch norm): losses %.6f %.6f vs %.6f %.6f, "
           "max param |diff| %.3g after %d steps\n", ddp.loss[0], ddp.loss[1], ref.loss[0],
           ref.loss[1], max_abs_diff(ddp.p, ref.p, ref.n), j.steps);
  /* the first loss is the same forward on the same weights but with per-rank BN
   * statistics: it is not the 1-rank loss (the batch-norm difference) */
  agree(fabs(ddp.loss[0] - ref.loss[0]) < 1e-6, "BN statistics are per rank");
  agree(differs_from_rank0(ddp.p, ddp.n), "U-Net parameters identical on every rank");
  /* rank 0's running statistics reach every rank before each forward (broadcast_buffers):
   * with the same rows on both ranks in the last step, both end with the same statistics
   * (without the broadcast they would carry each rank's own history) */
  assert_true(ddp.nbn > 0);
  agree(differs_from_rank0(ddp.bn, ddp.nbn), "BN running statistics synchronised from rank 0");
  result_free(&ref);
  result_free(&ddp);
}

/* fp16 AMP with the loss scaler. Each rank's loss is the mean over its own tokens, so its
 * scaled gradients are world x those of one rank at world x b under the same scale: the
 * reference runs at twice the initial scale and then sees the same overflows (the same
 * scaled gradient per token). A first scale that overflows: steps are skipped and the
 * scale halves, on both ranks alike and as on the reference. */
static void test_fp16_loss_scaler(void **state) {
  const float s0 = FP16_SCALE0;
  job j = mistral_job(VL_F16, 2 * s0, 8);
  result ref, ddp;
  run(&j, NULL, 7, &ref);
  j = mistral_job(VL_F16, s0, 8);
  vl_dist_cfg d = dist(&j, VL_DIST_DDP);
  run(&j, &d, 7, &ddp);
  long bad = 0;
  int skips = 0;
  double lw = 0;
  for (int k = 0; k < j.steps; k++) {
    if (rank == 0)
      printf("  fp16 step %d: ddp skip %d scale %g loss %.6f | 1 rank skip %d scale %g loss %.6f\n",
             k, ddp.skipped[k], ddp.scale[k], ddp.loss[k], ref.skipped[k], ref.scale[k], ref.loss[k]);
    skips += ddp.skipped[k];
    bad += ddp.skipped[k] != ref.skipped[k] || 2 * ddp.scale[k] != ref.scale[k];
    lw = fmax(lw, fabs(ddp.loss[k] - ref.loss[k]) / fabs(ref.loss[k]));
  }
  result init;
  j.steps = 0;
  run(&j, NULL, 7, &init);
  j.steps = 8;
  double pw = apart(&ddp, &ref, &init);
  if (rank == 0)
    printf("fp16 ddp: %d of %d steps skipped, max loss rel diff %.3g, max param |diff| %.3g, "
           "|ddp - 1 rank| / |1 rank - init| = %.3g\n", skips, j.steps, lw,
           max_abs_diff(ddp.p, ref.p, ref.n), pw);
  bad += skips < 1 || skips > j.steps - 3 || lw > FP16_LOSS_TOL || pw > FP16_APART;
  result_free(&init);
  agree(bad, "fp16 loss scaling follows one rank");
  agree(differs_from_rank0(ddp.p, ddp.n), "fp16 parameters identical on every rank");
  float sc[MAXSTEPS];
  memcpy(sc, ddp.scale, sizeof sc);
  agree(differs_from_rank0(sc, j.steps), "loss scales identical on every rank");
  result_free(&ref);
  result_free(&ddp);
}

static int setup(void **state) {
  vl_err err;
  if (vl_comm_create_mpi(&cm, &err) != VL_OK) {
    fprintf(stderr, "mpi_ddp: %s\n", err.msg);
    return -1;
  }
  rank = vl_comm_rank(cm);
  size = vl_comm_size(cm);
  vl_comm_set_timeout(cm, 60);
  return size >= 2 ? 0 : -1;
}

static int teardown(void **state) {
  vl_comm_destroy(cm);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ddp_equals_one_rank),
      cmocka_unit_test(test_overlap_and_views_same_bits),
      cmocka_unit_test(test_zero1_equals_ddp),
      cmocka_unit_test(test_dp_equals_ddp),
      cmocka_unit_test(test_unet_batch_norm),
      cmocka_unit_test(test_fp16_loss_scaler),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
