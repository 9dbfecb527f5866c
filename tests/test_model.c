/* Whole-model tests on the tiny Mistral: finite-difference gradients, checkpointing and
 * accumulation equivalence, merged LoRA, fp16 loss scaling, planner = measured, OOM. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/dialogue.h"
#include "testutil.h"
#include "vramlab/mistral.h"

/* A very small config so finite differences over many elements stay fast. */
static vl_mistral_cfg micro_cfg(void) {
  vl_mistral_cfg c = {48, 16, 2, 4, 2, 4, 24, 8, 10000.0f, 1e-5f, 0, 0};
  return c;
}

typedef struct { int32_t tok[4 * 8], tgt[4 * 8]; vl_mistral_batch b; } batch_buf;

static void make_batch(batch_buf *bb, int64_t B, int64_t vocab, int64_t seq, uint64_t seed) {
  vl_dialogue_gen g;
  vl_dialogue_init(&g, vocab, seq, seed);
  bb->b = (vl_mistral_batch){B, 0, bb->tok, bb->tgt};
  bb->b.T = vl_dialogue_batch(&g, B, seq, bb->tok, bb->tgt);
}

static vl_mistral *make(vl_ctx **c, const vl_mistral_cfg *mc, const vl_train_cfg *tc, size_t cap) {
  assert_int_equal(vl_ctx_create(c, VL_DEV_CPU, cap), VL_OK);
  vl_mistral *m = NULL;
  assert_int_equal(vl_mistral_create(*c, mc, tc, 11, &m), VL_OK);
  return m;
}

/* A right-padded batch of B dialogues from the tiny preset's distribution (buffers hold
 * B*32 tokens). */
static vl_mistral_batch tiny_batch(int32_t *tok, int32_t *tgt, int64_t B, uint64_t seed) {
  vl_dialogue_gen g;
  vl_dialogue_init(&g, 256, 32, seed);
  vl_mistral_batch b = {B, 0, tok, tgt};
  b.T = vl_dialogue_batch(&g, B, 0, tok, tgt);
  return b;
}

static double loss_of(vl_mistral *m, const vl_mistral_batch *b, int n) {
  vl_mistral_step_info info;
  assert_int_equal(vl_mistral_fwd_bwd(m, b, n, &info), VL_OK);
  assert_int_equal(vl_mistral_zero_grads(m), VL_OK);
  return info.loss;
}

/* Central differences on every parameter tensor (a strided sample of its elements). */
static void test_fd_whole_model(void **state) {
  (void)state;
  vl_mistral_cfg mc = micro_cfg();
  vl_train_cfg tc;
  vl_train_cfg_default(&tc);
  vl_ctx *c;
  vl_mistral *m = make(&c, &mc, &tc, VL_NO_CAP);
  batch_buf bb;
  make_batch(&bb, 2, mc.vocab, mc.seq, 5);
  vl_mistral_step_info info;
  assert_int_equal(vl_mistral_fwd_bwd(m, &bb.b, 1, &info), VL_OK);
  int np;
  vl_param *ps = vl_mistral_params(m, &np);
  int checked = 0;
  for (int i = 0; i < np; i++) {
    vl_param *p = &ps[i];
    if (!p->w.owned) continue;
    int64_t n = p->rows * p->cols;
    float *w = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
    assert_int_equal(vl_param_read(c, p, w), VL_OK);
    /* fresh analytic gradient: the evaluations below would otherwise accumulate into it */
    assert_int_equal(vl_mistral_zero_grads(m), VL_OK);
    assert_int_equal(vl_mistral_fwd_bwd(m, &bb.b, 1, &info), VL_OK);
    assert_int_equal(vl_param_read_grad(c, p, g), VL_OK);
    for (int64_t k = 0; k < n; k += n / 5 + 1) {
      /* Mean loss ~ 4; eps 1e-2 keeps fp32 cancellation (~1e-7 * 4 / 2e-2 = 2e-5) small
       * against gradients of 1e-4..1e-1; the O(eps^2) truncation is ~1e-5 here. */
      const float eps = 1e-2f;
      float w0 = w[k];
      w[k] = w0 + eps;
      assert_int_equal(vl_param_load(c, p, w), VL_OK);
      double lp = loss_of(m, &bb.b, 1);
      w[k] = w0 - eps;
      assert_int_equal(vl_param_load(c, p, w), VL_OK);
      double lm = loss_of(m, &bb.b, 1);
      w[k] = w0;
      assert_int_equal(vl_param_load(c, p, w), VL_OK);
      double fd = (lp - lm) / (2.0 * eps);
      double an = g[k];
      if (fabs(fd - an) > 2e-4 + 2e-2 * fabs(an)) {
        print_error("%s[%lld]: fd %.6g analytic %.6g\n", p->name, (long long)k, fd, an);
        fail();
      }
      checked++;
    }
    free(w);
    free(g);
  }
  assert_true(checked > 40);
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
}

/* Read every gradient after one fwd_bwd into one flat array. */
static float *all_grads(vl_ctx *c, vl_mistral *m, int64_t *n_out) {
  int np;
  vl_param *ps = vl_mistral_params(m, &np);
  int64_t n = vl_mistral_n_params(m, true);
  float *out = malloc((size_t)n * 4), *q = out;
  for (int i = 0; i < np; i++) {
    if (!ps[i].trainable) continue;
    assert_int_equal(vl_param_read_grad(c, &ps[i], q), VL_OK);
    q += ps[i].rows * ps[i].cols;
  }
  *n_out = n;
  return out;
}

static void grads_for(vl_train_cfg tc, const vl_mistral_batch *b, int nb, double *loss, float **g, int64_t *n) {
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  vl_ctx *c;
  vl_mistral *m = make(&c, &mc, &tc, VL_NO_CAP);
  vl_mistral_step_info info;
  assert_int_equal(vl_mistral_fwd_bwd(m, b, nb, &info), VL_OK);
  *loss = info.loss;
  *g = all_grads(c, m, n);
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
}

static void test_checkpoint_equivalence(void **state) {
  (void)state;
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  int32_t tok[4 * 32], tgt[4 * 32];
  vl_mistral_batch b = tiny_batch(tok, tgt, 4, 3);
  for (int lora = 0; lora < 2; lora++) {
    vl_train_cfg tc;
    vl_train_cfg_default(&tc);
    tc.lora_rank = lora ? 4 : 0;
    tc.lora_targets = VL_LORA_ALL;
    double l1, l2;
    float *g1, *g2;
    int64_t n1, n2;
    grads_for(tc, &b, 1, &l1, &g1, &n1);
    tc.checkpoint = true;
    grads_for(tc, &b, 1, &l2, &g2, &n2);
    assert_int_equal(n1, n2);
    /* Recomputation repeats the same ops in the same order: bit-identical. */
    assert_true(l1 == l2);
    assert_memory_equal(g1, g2, (size_t)n1 * 4);
    free(g1);
    free(g2);
  }
}

/* 4 micro-batches of b rows == one batch of 4b rows (same T): the loss of every
 * micro-batch is normalised by the tokens of the whole step. */
static void test_accumulation_equivalence(void **state) {
  (void)state;
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  enum { b = 2, T = 24 };
  int32_t tok[4 * b * T], tgt[4 * b * T];
  vl_dialogue_gen g;
  vl_dialogue_init(&g, mc.vocab, T, 9);
  vl_dialogue_batch(&g, 4 * b, T, tok, tgt);
  for (int i = 0; i < 4 * b * T; i += 7) tgt[i] = -1; /* uneven valid counts per micro-batch */
  vl_mistral_batch big = {4 * b, T, tok, tgt}, mb[4];
  for (int i = 0; i < 4; i++) mb[i] = (vl_mistral_batch){b, T, tok + i * b * T, tgt + i * b * T};
  vl_train_cfg tc;
  vl_train_cfg_default(&tc);
  double l1, l2;
  float *g1, *g2;
  int64_t n1, n2;
  grads_for(tc, &big, 1, &l1, &g1, &n1);
  grads_for(tc, mb, 4, &l2, &g2, &n2);
  assert_true(fabs(l1 - l2) < 1e-6 * fabs(l1));
  /* Summation order differs (GEMM over 4b rows vs 4 GEMMs): fp32 rounding only. */
  tu_assert_close(g2, g1, n1, 1e-6, 1e-4, "accumulated gradient");
  free(g1);
  free(g2);
}

/* A LoRA model with non-zero B computes the same loss as a full model whose weights are
 * the merged W + alpha/r * B A. */
static void test_merged_lora(void **state) {
  (void)state;
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  vl_train_cfg tl;
  vl_train_cfg_default(&tl);
  tl.lora_rank = 4;
  tl.lora_alpha = 8;
  tl.lora_targets = VL_LORA_ALL;
  vl_ctx *c1, *c2;
  vl_mistral *ml = make(&c1, &mc, &tl, VL_NO_CAP);
  vl_train_cfg tf;
  vl_train_cfg_default(&tf);
  vl_mistral *mf = make(&c2, &mc, &tf, VL_NO_CAP);
  int nl, nf;
  vl_param *pl = vl_mistral_params(ml, &nl), *pf = vl_mistral_params(mf, &nf);
  assert_int_equal(nl, nf);
  uint64_t seed = 100;
  for (int i = 0; i < nl; i++)
    if (strstr(pl[i].name, "lora_B")) {
      int64_t n = pl[i].rows * pl[i].cols;
      float *v = malloc((size_t)n * 4);
      tu_randn(v, n, 0.05f, seed++);
      assert_int_equal(vl_param_load(c1, &pl[i], v), VL_OK);
      free(v);
    }
  int merged = 0;
  for (int i = 0; i < nl; i++) {
    if (!pf[i].w.owned) continue;
    int64_t n = pf[i].rows * pf[i].cols;
    float *v = malloc((size_t)n * 4);
    if (vl_mistral_merged_weight(ml, i, v) == VL_OK) merged++;
    else assert_int_equal(vl_param_read(c1, &pl[i], v), VL_OK);
    assert_int_equal(vl_param_load(c2, &pf[i], v), VL_OK);
    free(v);
  }
  assert_int_equal(merged, (int)mc.n_layers * 7);
  batch_buf bb;
  int32_t tok[2 * 32], tgt[2 * 32];
  bb.b = tiny_batch(tok, tgt, 2, 4);
  double a = loss_of(ml, &bb.b, 1), b = loss_of(mf, &bb.b, 1);
  assert_true(fabs(a - b) < 1e-5 * fabs(b));
  /* and the adapters matter: zeroing B changes the loss */
  for (int i = 0; i < nl; i++)
    if (strstr(pl[i].name, "lora_B")) assert_int_equal(vl_zero_run(c1, &(vl_zero_args){.y = &pl[i].w}), VL_OK);
  assert_true(fabs(loss_of(ml, &bb.b, 1) - b) > 1e-4);
  vl_mistral_destroy(ml);
  vl_mistral_destroy(mf);
  vl_ctx_destroy(c1);
  vl_ctx_destroy(c2);
}

/* fp16 AMP: a loss scale that overflows fp16 skips the step and halves the scale; the
 * weights do not change. Then training proceeds with finite steps. */
static void test_fp16_overflow_skips(void **state) {
  (void)state;
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  vl_train_cfg tc;
  vl_train_cfg_default(&tc);
  tc.compute = VL_F16;
  tc.loss_scale = 1e30f; /* dlogits * scale overflows fp16 at once */
  vl_ctx *c;
  vl_mistral *m = make(&c, &mc, &tc, VL_NO_CAP);
  int np;
  vl_param *ps = vl_mistral_params(m, &np);
  int64_t n = ps[0].rows * ps[0].cols;
  float *before = malloc((size_t)n * 4), *after = malloc((size_t)n * 4);
  assert_int_equal(vl_param_read(c, &ps[0], before), VL_OK);
  batch_buf bb;
  int32_t tok[2 * 32], tgt[2 * 32];
  bb.b = tiny_batch(tok, tgt, 2, 4);
  vl_mistral_step_info info;
  assert_int_equal(vl_mistral_step(m, &bb.b, 1, &info), VL_OK);
  assert_true(info.skipped);
  assert_true(info.loss_scale == 1e30f);
  assert_int_equal(vl_param_read(c, &ps[0], after), VL_OK);
  assert_memory_equal(before, after, (size_t)n * 4);
  assert_int_equal(vl_mistral_step(m, &bb.b, 1, &info), VL_OK);
  assert_true(info.loss_scale == 0.5e30f);
  /* keep halving until the scaled gradients fit fp16, then steps go through */
  int ok = 0;
  for (int i = 0; i < 120 && !ok; i++) {
    assert_int_equal(vl_mistral_step(m, &bb.b, 1, &info), VL_OK);
    ok = !info.skipped;
  }
  assert_true(ok);
  assert_true(info.loss_scale < 1e6f);
  assert_int_equal(vl_param_read(c, &ps[0], after), VL_OK);
  assert_true(memcmp(before, after, (size_t)n * 4) != 0);
  free(before);
  free(after);
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
}

/* The planner (CPU workspace rules, virtual arena) gives exactly the measured CPU peak. */
static void test_plan_equals_measured(void **state) {
  (void)state;
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  struct { vl_dtype compute, frozen; int rank; vl_optimizer opt; bool ck; int accum; } rungs[] = {
      {VL_F32, VL_F32, 0, VL_OPT_ADAMW, false, 1}, {VL_F16, VL_F32, 0, VL_OPT_ADAMW, false, 2},
      {VL_F16, VL_F16, 8, VL_OPT_ADAMW, false, 1}, {VL_F16, VL_NF4, 8, VL_OPT_ADAMW, false, 1},
      {VL_BF16, VL_NF4, 8, VL_OPT_ADAFACTOR, true, 3}, {VL_F32, VL_F32, 0, VL_OPT_SGD, true, 1}};
  for (size_t r = 0; r < sizeof rungs / sizeof *rungs; r++) {
    vl_train_cfg tc;
    vl_train_cfg_default(&tc);
    tc.compute = rungs[r].compute;
    tc.frozen = rungs[r].frozen;
    tc.lora_rank = rungs[r].rank;
    tc.optim.opt = rungs[r].opt;
    tc.checkpoint = rungs[r].ck;
    int na = rungs[r].accum;
    int32_t tok[3 * 3 * 32], tgt[3 * 3 * 32];
    vl_mistral_batch mb[3];
    for (int i = 0; i < na; i++) {
      vl_dialogue_gen g;
      vl_dialogue_init(&g, mc.vocab, mc.seq, 20 + (uint64_t)i);
      mb[i] = (vl_mistral_batch){3, 0, tok + i * 96, tgt + i * 96};
      mb[i].T = vl_dialogue_batch(&g, 3, 20, tok + i * 96, tgt + i * 96);
    }
    vl_ctx *c, *p;
    vl_mistral *m = make(&c, &mc, &tc, VL_NO_CAP);
    vl_mistral_step_info info;
    assert_int_equal(vl_mistral_step(m, mb, na, &info), VL_OK);
    vl_mem_stats sm, sp;
    vl_arena_stats(c->arena, &sm);
    assert_int_equal(vl_ctx_create_ex(&p, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CPU), VL_OK);
    vl_mistral *pm = NULL;
    assert_int_equal(vl_mistral_create(p, &mc, &tc, 11, &pm), VL_OK);
    vl_mistral_batch pb[3];
    for (int i = 0; i < na; i++) pb[i] = (vl_mistral_batch){3, mb[i].T, NULL, NULL};
    assert_int_equal(vl_mistral_step(pm, pb, na, &info), VL_OK);
    vl_arena_stats(p->arena, &sp);
    assert_int_equal(sm.peak_total, sp.peak_total);
    assert_memory_equal(sm.at_peak, sp.at_peak, sizeof sm.at_peak);
    assert_int_equal(sm.reserved, sp.reserved);
    assert_int_equal(sm.n_bad_free, 0); /* every block freed exactly once */
    assert_int_equal(sp.n_bad_free, 0);
    assert_true(c->flops == p->flops && c->flops > 0);
    vl_mistral_destroy(m);
    vl_mistral_destroy(pm);
    vl_ctx_destroy(c);
    vl_ctx_destroy(p);
  }
}

/* A profiled step (bf16 AMP, full fine-tune, checkpointing): what ran, and that the profile
 * accounts for every FLOP counted (bf16: an fp16 step that overflows would skip its update,
 * which the plan cannot know). */
static void test_profile(void **state) {
  (void)state;
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  vl_train_cfg tc;
  vl_train_cfg_default(&tc);
  tc.compute = VL_BF16;
  tc.checkpoint = true;
  int32_t tok[2 * 32], tgt[2 * 32];
  vl_mistral_batch b = tiny_batch(tok, tgt, 2, 3), pb = {2, b.T, NULL, NULL};
  vl_ctx *c, *p;
  vl_mistral *m = make(&c, &mc, &tc, VL_NO_CAP), *pm = NULL;
  assert_int_equal(vl_ctx_create_ex(&p, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CPU), VL_OK);
  assert_int_equal(vl_mistral_create(p, &mc, &tc, 11, &pm), VL_OK);
  vl_ctx *both[2] = {c, p};
  for (int i = 0; i < 2; i++) {
    both[i]->flops = both[i]->flops_recompute = both[i]->bytes_moved = 0;
    vl_ctx_profile_reset(both[i]);
    both[i]->profile = true;
  }
  vl_mistral_step_info info;
  assert_int_equal(vl_mistral_step(m, &b, 1, &info), VL_OK);
  assert_int_equal(vl_mistral_step(pm, &pb, 1, &info), VL_OK);
  assert_true(c->flops_recompute > 0);
  const vl_op must[] = {VL_OP_GEMM, VL_OP_EMBED_FWD, VL_OP_EMBED_BWD, VL_OP_RMSNORM_FWD,
                        VL_OP_RMSNORM_BWD, VL_OP_ROPE, VL_OP_PERMUTE, VL_OP_SOFTMAX_FWD,
                        VL_OP_SOFTMAX_BWD, VL_OP_SWIGLU_FWD, VL_OP_SWIGLU_BWD,
                        VL_OP_XENT_FUSED, VL_OP_CONVERT, VL_OP_ZERO, VL_OP_SUMSQ, VL_OP_ADAMW};
  tu_check_profile(c, p, must, (int)(sizeof must / sizeof *must));
  assert_int_equal(vl_ctx_profile(c)[VL_OP_CONV_FWD].calls, 0);
  /* off: nothing more is recorded */
  c->profile = false;
  uint64_t n0 = vl_ctx_profile(c)[VL_OP_GEMM].calls;
  assert_int_equal(vl_mistral_step(m, &b, 1, &info), VL_OK);
  assert_int_equal(vl_ctx_profile(c)[VL_OP_GEMM].calls, n0);
  vl_mistral_destroy(m);
  vl_mistral_destroy(pm);
  vl_ctx_destroy(c);
  vl_ctx_destroy(p);
}

/* A backend with device timers (CUDA events): vl_op_run brackets each kernel with
 * op_timer_begin/end instead of syncing, and reading the profile collects the intervals.
 * The fake timer makes every kernel last exactly 0.25 s, so only that path gives
 * seconds == 0.25 * calls for every operation. */
static int fake_begun, fake_pending[4096], fake_n;
static vl_status fake_begin(vl_ctx *c) { (void)c; fake_begun++; return VL_OK; }
static vl_status fake_end(vl_ctx *c, vl_op op) {
  if (fake_n == 4096) return vl_fail(c, VL_ERR_INVALID, "fake timer pool full");
  fake_pending[fake_n++] = (int)op;
  return VL_OK;
}
static vl_status fake_collect(vl_ctx *c, vl_op_profile *prof) {
  (void)c;
  for (int i = 0; i < fake_n; i++) prof[fake_pending[i]].seconds += 0.25;
  fake_n = 0;
  return VL_OK;
}

static void test_profile_device_timers(void **state) {
  (void)state;
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  vl_train_cfg tc;
  vl_train_cfg_default(&tc);
  int32_t tok[2 * 32], tgt[2 * 32];
  vl_mistral_batch b = tiny_batch(tok, tgt, 2, 3);
  vl_ctx *c;
  vl_mistral *m = make(&c, &mc, &tc, VL_NO_CAP);
  vl_backend fake = *vl_backend_cpu();
  fake.op_timer_begin = fake_begin;
  fake.op_timer_end = fake_end;
  fake.op_timer_collect = fake_collect;
  const vl_backend *real = c->be;
  c->be = &fake;
  vl_ctx_profile_reset(c);
  c->profile = true;
  fake_begun = fake_n = 0;
  vl_mistral_step_info info;
  assert_int_equal(vl_mistral_step(m, &b, 1, &info), VL_OK);
  assert_true(fake_n > 0); /* recorded, not yet read */
  const vl_op_profile *pr = vl_ctx_profile(c);
  assert_int_equal(fake_n, 0);
  uint64_t calls = 0;
  for (int op = 0; op < VL_OP_COUNT; op++) {
    calls += pr[op].calls;
    assert_true(pr[op].seconds == 0.25 * (double)pr[op].calls);
  }
  assert_true(calls > 0);
  assert_int_equal((uint64_t)fake_begun, calls);
  c->be = real;
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
}

/* Under a cap too small for the step, the step returns VL_ERR_OOM, frees what it took, and
 * the same model then runs a smaller batch. */
static void test_oom_recovers(void **state) {
  (void)state;
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  vl_train_cfg tc;
  vl_train_cfg_default(&tc);
  vl_ctx *c0;
  vl_mistral *m0 = make(&c0, &mc, &tc, VL_NO_CAP);
  vl_mem_stats s0;
  vl_arena_stats(c0->arena, &s0);
  size_t base = s0.cur_total;
  vl_mistral_destroy(m0);
  vl_ctx_destroy(c0);

  vl_ctx *c;
  vl_mistral *m = make(&c, &mc, &tc, base + (512 << 10)); /* room for a small step only */
  int32_t tok[16 * 32], tgt[16 * 32];
  vl_dialogue_gen g;
  vl_dialogue_init(&g, mc.vocab, mc.seq, 1);
  vl_mistral_batch big = {16, 32, tok, tgt};
  vl_dialogue_batch(&g, 16, 32, tok, tgt);
  vl_mistral_step_info info;
  size_t live = vl_arena_live_blocks(c->arena);
  assert_int_equal(vl_mistral_step(m, &big, 1, &info), VL_ERR_OOM);
  assert_non_null(strstr(c->err, "out of memory"));
  assert_int_equal(vl_arena_live_blocks(c->arena), live);
  vl_mistral_batch small = {1, 8, tok, tgt};
  vl_dialogue_batch(&g, 1, 8, tok, tgt);
  assert_int_equal(vl_mistral_step(m, &small, 1, &info), VL_OK);
  assert_true(isfinite(info.loss));
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
}

static void test_bad_config(void **state) {
  (void)state;
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_mistral_cfg mc;
  assert_int_not_equal(vl_mistral_preset("huge", &mc), 0);
  vl_mistral_preset("tiny", &mc);
  vl_train_cfg tc;
  vl_train_cfg_default(&tc);
  vl_mistral *m = NULL;
  mc.n_kv_heads = 3; /* 4 heads are not a multiple of 3 */
  assert_int_equal(vl_mistral_create(c, &mc, &tc, 1, &m), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "n_kv_heads"));
  vl_mistral_preset("tiny", &mc);
  tc.frozen = VL_NF4; /* nf4 without LoRA */
  assert_int_equal(vl_mistral_create(c, &mc, &tc, 1, &m), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "nf4"));
  vl_train_cfg_default(&tc);
  assert_int_equal(vl_mistral_create(c, &mc, &tc, 1, &m), VL_OK);
  int32_t tok[4] = {1, 2, 999, 3}, tgt[4] = {2, 3, 4, -1};
  vl_mistral_batch b = {1, 4, tok, tgt};
  vl_mistral_step_info info;
  assert_int_equal(vl_mistral_step(m, &b, 1, &info), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "vocabulary"));
  vl_mistral_batch toolong = {1, mc.seq + 1, tok, tgt};
  assert_int_equal(vl_mistral_step(m, &toolong, 1, &info), VL_ERR_INVALID);
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
}

/* Learnability: a few dozen AdamW steps on the synthetic dialogues lower the loss. */
static void test_loss_decreases(void **state) {
  (void)state;
  vl_mistral_cfg mc;
  vl_mistral_preset("tiny", &mc);
  vl_train_cfg tc;
  vl_train_cfg_default(&tc);
  tc.optim.hp.lr = 3e-3f;
  vl_ctx *c;
  vl_mistral *m = make(&c, &mc, &tc, VL_NO_CAP);
  int32_t tok[8 * 32], tgt[8 * 32];
  double first = 0, last = 0;
  for (int i = 0; i < 60; i++) {
    vl_mistral_batch b = tiny_batch(tok, tgt, 8, 2 + (uint64_t)i);
    vl_mistral_step_info info;
    assert_int_equal(vl_mistral_step(m, &b, 1, &info), VL_OK);
    if (i < 5) first += info.loss / 5;
    if (i >= 55) last += info.loss / 5;
  }
  assert_true(last < 0.7 * first);
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fd_whole_model),         cmocka_unit_test(test_checkpoint_equivalence),
      cmocka_unit_test(test_accumulation_equivalence), cmocka_unit_test(test_merged_lora),
      cmocka_unit_test(test_fp16_overflow_skips),    cmocka_unit_test(test_plan_equals_measured),
      cmocka_unit_test(test_oom_recovers),           cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_loss_decreases),         cmocka_unit_test(test_profile),
      cmocka_unit_test(test_profile_device_timers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
