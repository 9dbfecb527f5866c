/* The engine's training scaffolding over vl_model (engine/run): the batch search, a planned
 * step through the interface equal to the model's own API, the timed loop's accounting and
 * planned-equals-measured, OOM as a status, and the batch checks of the adapters. */
#include <stdlib.h>
#include <string.h>

#include "datasets/dialogue.h"
#include "testutil.h"
#include "vramlab/mistral.h"
#include "vramlab/resunet.h"
#include "vramlab/run.h"

static bool below_37(void *user, int64_t b) { (void)user; return b <= 37; }
static bool never(void *user, int64_t b) { (void)user; (void)b; return false; }

static void test_max_true(void **state) {
  (void)state;
  assert_int_equal(vl_run_max_true(below_37, NULL, 1, 1024), 37);
  assert_int_equal(vl_run_max_true(below_37, NULL, 2, 1024), 37);
  assert_int_equal(vl_run_max_true(below_37, NULL, 1, 16), 16); /* "at least the limit" */
  assert_int_equal(vl_run_max_true(never, NULL, 1, 1024), 0);
}

static vl_mistral_model_cfg tiny_mistral(void) {
  vl_mistral_model_cfg k;
  assert_int_equal(vl_mistral_preset("tiny", &k.mc), 0);
  vl_train_cfg_default(&k.tc);
  return k;
}

/* Planning through vl_model plans what the model's own API plans, byte for byte. */
static void test_plan_equals_direct(void **state) {
  (void)state;
  vl_mistral_model_cfg k = tiny_mistral();
  vl_step_spec s = {.type = &vl_model_mistral, .cfg = &k, .seed = 1, .batch = {0}, .accum = 2};
  vl_step_spec_set_batch(&s, 3);
  vl_plan_result p;
  assert_int_equal(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, true, &p), VL_OK);
  assert_true(p.n_timeline > 0 && p.flops > 0);
  vl_ctx *c;
  assert_int_equal(vl_ctx_create_ex(&c, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CUDA), VL_OK);
  vl_mistral *m;
  assert_int_equal(vl_mistral_create(c, &k.mc, &k.tc, 1, &m), VL_OK);
  assert_int_equal(p.params.total, vl_mistral_n_params(m, false));
  vl_mistral_batch mb[2] = {{3, k.mc.seq, NULL, NULL}, {3, k.mc.seq, NULL, NULL}};
  vl_mistral_step_info info;
  c->flops = 0;
  assert_int_equal(vl_mistral_step(m, mb, 2, &info), VL_OK);
  vl_mem_stats ms;
  vl_arena_stats(c->arena, &ms);
  assert_int_equal(p.mem.peak_total, ms.peak_total);
  assert_true(p.flops == c->flops);
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
  vl_plan_result_free(&p);
  /* under a cap below the peak it does not fit, and the search agrees */
  assert_false(vl_run_fits(&s, ms.peak_total / 2));
  assert_true(vl_run_fits(&s, ms.peak_total * 2));
  size_t cap = ms.peak_total * 2;
  int64_t best = vl_run_max_batch(&s, cap, 1);
  assert_true(best >= 3 && best < VL_MAX_BATCH_SEARCH);
  vl_step_spec_set_batch(&s, best);
  assert_true(vl_run_fits(&s, cap));
  vl_step_spec_set_batch(&s, best + 1);
  assert_false(vl_run_fits(&s, cap));
}

typedef struct {
  vl_dialogue_gen g;
  int32_t tok[2 * 32], tgt[2 * 32];
  vl_batch b;
} feed;

static vl_status next_batch(void *user, long step, const vl_batch **mb, int *n, double *wait) {
  feed *f = user;
  int64_t T = vl_dialogue_batch(&f->g, 2, 0, f->tok, f->tgt), bt[2] = {2, T};
  f->b = (vl_batch){0};
  vl_batch_add(&f->b, "tokens", VL_I32, 2, bt, f->tok);
  vl_batch_add(&f->b, "targets", VL_I32, 2, bt, f->tgt);
  *mb = &f->b;
  *n = 1;
  return VL_OK;
}

/* Warm-up steps are not timed; the measured peak of fixed-length steps is the planned one. */
static void test_loop(void **state) {
  (void)state;
  vl_mistral_model_cfg k = tiny_mistral();
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_model *m;
  assert_int_equal(vl_model_create(c, &vl_model_mistral, &k, 1, &m), VL_OK);
  feed f;
  vl_dialogue_init(&f.g, k.mc.vocab, k.mc.seq, 5);
  vl_loop_cfg lc = {.warmup = 2, .total = 5, .reset_peaks_after_warmup = true, .next = next_batch, .user = &f};
  vl_loop_result r = {0};
  assert_int_equal(vl_run_loop(m, &lc, &r), VL_OK);
  assert_int_equal(r.steps, 5);
  assert_int_equal(r.timed, 3);
  assert_true(r.flops > 0 && r.targets > 0);
  for (long i = 0; i < r.steps; i++) assert_true(r.losses[i] > 0);
  lc.total = 6; /* appends */
  assert_int_equal(vl_run_loop(m, &lc, &r), VL_OK);
  assert_int_equal(r.timed, 4);
  assert_int_equal(vl_model_predict(m, &f.b, NULL), VL_ERR_UNSUPPORTED);
  vl_batch bad = {0};
  vl_batch_add(&bad, "tokens", VL_F32, 2, (int64_t[2]){2, 4}, f.tok);
  vl_step_info info;
  assert_int_equal(vl_model_step(m, &bad, 1, &info), VL_ERR_INVALID);
  vl_loop_result_free(&r);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  /* planned = measured for the longest step (all T = seq here: dialogue pads to seq at most) */
  vl_step_spec s = {.type = &vl_model_mistral, .cfg = &k, .seed = 1, .batch = {0}, .accum = 1};
  vl_step_spec_set_batch(&s, 2);
  size_t planned;
  bool match;
  vl_run_plan_check(&s, 0, &planned, &match);
  assert_true(planned > 0);
  assert_false(match);
}

/* OOM under a run cap is a status the loop returns, never a crash. */
static void test_loop_oom(void **state) {
  (void)state;
  vl_mistral_model_cfg k = tiny_mistral();
  vl_step_spec s = {.type = &vl_model_mistral, .cfg = &k, .seed = 1, .batch = {0}, .accum = 1};
  vl_step_spec_set_batch(&s, 2);
  vl_plan_result p;
  assert_int_equal(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CPU, false, &p), VL_OK);
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, p.mem.at_peak[VL_MEM_PARAMS] + p.mem.at_peak[VL_MEM_OPTIM] +
                                                  p.mem.at_peak[VL_MEM_GRADS] + (1 << 16)), VL_OK);
  vl_model *m;
  assert_int_equal(vl_model_create(c, &vl_model_mistral, &k, 1, &m), VL_OK);
  feed f;
  vl_dialogue_init(&f.g, k.mc.vocab, k.mc.seq, 5);
  vl_loop_cfg lc = {.warmup = 0, .total = 2, .next = next_batch, .user = &f};
  vl_loop_result r = {0};
  assert_true(vl_run_is_oom(vl_run_loop(m, &lc, &r)));
  vl_loop_result_free(&r);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
}

/* The U-Net's parameters by module sum to its total; its predict checks the batch. */
static void test_resunet_model(void **state) {
  (void)state;
  vl_resunet_model_cfg k;
  assert_int_equal(vl_resunet_preset("tiny", &k.mc), 0);
  vl_resunet_train_cfg_default(&k.tc);
  vl_step_spec s = {.type = &vl_model_resunet, .cfg = &k, .seed = 1, .batch = {0}, .accum = 1};
  vl_step_spec_set_batch(&s, 2);
  assert_int_equal(s.batch.n, 2);
  vl_plan_result p;
  assert_int_equal(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &p), VL_OK);
  assert_int_equal(p.params.n_modules, 3);
  assert_int_equal(p.params.module_count[0] + p.params.module_count[1] + p.params.module_count[2], p.params.total);
  assert_true(p.mem.peak[VL_MEM_DATA] > 0);
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_model *m;
  assert_int_equal(vl_model_create(c, &vl_model_resunet, &k, 1, &m), VL_OK);
  vl_batch wrong = {0};
  float x[2 * 3 * 16 * 16] = {0};
  int32_t pred[2 * 16 * 16];
  vl_batch_add(&wrong, "images", VL_F32, 4, (int64_t[4]){2, 3, 16, 16}, x);
  assert_int_equal(vl_model_predict(m, &wrong, pred), VL_ERR_INVALID);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
}

/* Planning a few micro-batches and extrapolating the rest equals planning every one: the
 * same peak by category, FLOPs, recomputed FLOPs and bytes moved (Mistral with checkpointing;
 * the U-Net, whose batch norm keeps running statistics across micro-batches). */
static void expect_extrapolation_exact(vl_step_spec *s) {
  vl_plan_result all, few;
  s->accum = 9;
  s->plan_micro_max = 9;
  assert_int_equal(vl_run_plan(s, VL_NO_CAP, VL_DEV_CUDA, false, &all), VL_OK);
  s->plan_micro_max = 2;
  assert_int_equal(vl_run_plan(s, VL_NO_CAP, VL_DEV_CUDA, false, &few), VL_OK);
  assert_true(all.mem.peak_total == few.mem.peak_total);
  for (int k = 0; k < VL_MEM_NCAT; k++) assert_true(all.mem.peak[k] == few.mem.peak[k]);
  assert_true(all.flops == few.flops);
  assert_true(all.flops_recompute == few.flops_recompute);
  assert_true(all.bytes_moved == few.bytes_moved);
  assert_true(all.flops > 0);
}

static void test_plan_micro_extrapolation(void **state) {
  (void)state;
  vl_mistral_model_cfg k = tiny_mistral();
  k.tc.checkpoint = true;
  vl_step_spec s = {.type = &vl_model_mistral, .cfg = &k, .seed = 1, .batch = {0}, .accum = 1};
  vl_step_spec_set_batch(&s, 2);
  expect_extrapolation_exact(&s);
  vl_resunet_model_cfg r;
  assert_int_equal(vl_resunet_preset("tiny", &r.mc), 0);
  vl_resunet_train_cfg_default(&r.tc);
  vl_step_spec u = {.type = &vl_model_resunet, .cfg = &r, .seed = 1, .batch = {0}, .accum = 1};
  vl_step_spec_set_batch(&u, 2);
  expect_extrapolation_exact(&u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_max_true),  cmocka_unit_test(test_plan_equals_direct), cmocka_unit_test(test_loop),
      cmocka_unit_test(test_loop_oom), cmocka_unit_test(test_resunet_model),
      cmocka_unit_test(test_plan_micro_extrapolation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
