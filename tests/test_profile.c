/* --profile (issue #9, item 2): a model case's timed steps with every operation timed. The
 * profile accounts for the step (its seconds inside the step's, most of it; its FLOPs
 * exactly the model's plus the recomputed ones), a run without it carries none, the report
 * shows it, and the validator refuses a wrong-typed entry like any other field. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "testutil.h"

static int setup(void **state) {
  (void)state;
  return tu_tmpdir(tu_tmp, sizeof tu_tmp, "vl-test-profile-");
}

static const vl_case *load(vl_ladder *L) {
  const vl_case *c = vl_case_find("llm-lora");
  assert_non_null(c);
  vl_err err;
  assert_int_equal(vl_ladder_load(L, VRAMLAB_SOURCE_DIR, "llm-lora", &err), 0);
  /* seconds, not minutes: three timed steps after one warm-up */
  assert_int_equal(vl_knob_set(&L->setting, "steps", "3"), 0);
  assert_int_equal(vl_knob_set(&L->setting, "warmup", "1"), 0);
  return c;
}

/* One tiny run of rung `ckpt` (checkpointing: recomputed FLOPs to reconcile), as the
 * harness runs it; the run's JSON object (the caller deletes it). */
static cJSON *tiny_run(const vl_case *c, const vl_ladder *L, bool profile) {
  int i = vl_ladder_find(L, "ckpt");
  assert_true(i >= 0);
  vl_case_env env = {.scale = "tiny", .device = VL_DEV_CPU, .setting = &L->setting, .quiet = 1, .profile = profile};
  cJSON *ro = cJSON_CreateObject();
  if (c->run(&env, &L->rungs[i].knobs, 0, ro)) {
    print_error("run ckpt: %s\n", env.err.msg);
    fail();
  }
  return ro;
}

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItem(o, k);
  assert_true(cJSON_IsNumber(v));
  return v->valuedouble;
}

static void test_profile_accounts_for_the_step(void **state) {
  (void)state;
  vl_ladder L;
  const vl_case *c = load(&L);
  cJSON *ro = tiny_run(c, &L, true);
  const cJSON *prof = cJSON_GetObjectItem(ro, "profile");
  assert_true(cJSON_IsArray(prof) && cJSON_GetArraySize(prof) > 0);
  const cJSON *st = cJSON_GetObjectItem(ro, "step_time"), *e;
  double steps = num(st, "n"), step_s = 0;
  assert_true(steps == 3 && num(ro, "profile_steps") == 3);
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(st, "samples")) step_s += e->valuedouble;
  assert_true(fabs(num(ro, "profile_seconds") - step_s) <= 1e-12 * step_s);

  double sec = 0, flops = 0, prev = INFINITY;
  bool gemm = false;
  cJSON_ArrayForEach(e, prof) {
    const char *op = cJSON_GetStringValue(cJSON_GetObjectItem(e, "op"));
    assert_non_null(op);
    gemm |= !strcmp(op, "gemm");
    assert_true(num(e, "calls") > 0);
    double s = num(e, "seconds");
    assert_true(s >= 0 && s <= prev); /* slowest first */
    prev = s;
    assert_true(fabs(num(e, "share") - s / step_s) <= 1e-12);
    sec += s;
    flops += num(e, "flops");
  }
  assert_true(gemm);
  /* the operations' time lies inside the steps', and is most of it on a CPU */
  if (!(sec <= step_s && sec >= 0.5 * step_s)) {
    print_error("operations %.6f s of %.6f s of timed steps\n", sec, step_s);
    fail();
  }
  assert_true(fabs(num(ro, "profile_other_seconds") - (step_s - sec)) <= 1e-9 * step_s);
  /* every FLOP of the timed steps is an operation's: the model's plus the recomputed */
  double recompute = num(ro, "profile_recompute_flops");
  assert_true(recompute > 0);
  double model = num(ro, "model_flops_per_step") * steps + recompute;
  if (fabs(flops - model) > 1e-9 * model) {
    print_error("profile FLOPs %.17g, model + recompute %.17g\n", flops, model);
    fail();
  }
  cJSON_Delete(ro);

  /* without --profile: no profile and none of its keys */
  ro = tiny_run(c, &L, false);
  cJSON_ArrayForEach(e, ro) assert_true(strncmp(e->string, "profile", 7));
  cJSON_Delete(ro);
}

/* A results file of one rung run with a profile (the real run's keys). */
static cJSON *results_with_profile(const vl_case *c, const vl_ladder *L) {
  cJSON *res = cJSON_CreateObject();
  cJSON_AddNumberToObject(res, "schema_version", VL_RESULTS_SCHEMA_VERSION);
  cJSON_AddStringToObject(res, "case", c->id);
  cJSON *env = cJSON_AddObjectToObject(res, "env");
  cJSON_AddStringToObject(env, "device", "cpu");
  cJSON_AddStringToObject(res, "run_scale", "tiny");
  cJSON *rungs = cJSON_AddArrayToObject(res, "rungs");
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "name", "ckpt");
  cJSON_AddStringToObject(r, "label", L->rungs[vl_ladder_find(L, "ckpt")].label);
  cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "runs"), tiny_run(c, L, true));
  cJSON_AddItemToArray(rungs, r);
  return res;
}

/* rungs[0].runs[0] */
static cJSON *first_run(const cJSON *res) {
  cJSON *r = cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0);
  return cJSON_GetArrayItem(cJSON_GetObjectItem(r, "runs"), 0);
}

static void save(const char *path, const cJSON *res) {
  char *t = cJSON_Print(res);
  assert_non_null(t);
  tu_write_text(path, t);
  free(t);
}

static void test_report_shows_profile(void **state) {
  (void)state;
  vl_ladder L;
  const vl_case *c = load(&L);
  cJSON *res = results_with_profile(c, &L);
  char res_path[512], md[512];
  vl_err err = {0};
  tu_join(res_path, sizeof res_path, tu_tmp, "results.json");
  tu_join(md, sizeof md, tu_tmp, "report.md");
  save(res_path, res);
  setenv("VRAMLAB_NO_GNUPLOT", "1", 1);
  if (vl_report_write(c, &L, res_path, md, &err)) {
    print_error("report: %s\n", err.msg);
    fail();
  }
  uint8_t *t;
  size_t n = tu_slurp(md, &t);
  t[n] = 0;
  const char *want[] = {"## Where the time goes (--profile)", "### `ckpt`",
                        "| operation | calls per step | ms per step | share of the step | GFLOP/s |", "| gemm | ",
                        "| other: inside no operation", "| **the whole step** |"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    if (!strstr((char *)t, want[i])) {
      print_error("the report lacks \"%s\":\n%s\n", want[i], (char *)t);
      fail();
    }
  free(t);

  /* without a profile in the results, no section */
  cJSON_DeleteItemFromObject(first_run(res), "profile");
  save(res_path, res);
  assert_int_equal(vl_report_write(c, &L, res_path, md, &err), 0);
  n = tu_slurp(md, &t);
  t[n] = 0;
  assert_null(strstr((char *)t, "Where the time goes"));
  free(t);
  cJSON_Delete(res);
}

/* A wrong-typed profile field from a user's file is refused with its path, before the report
 * reads it. */
static void test_validator_refuses_bad_profile(void **state) {
  (void)state;
  vl_ladder L;
  const vl_case *c = load(&L);
  cJSON *res = results_with_profile(c, &L);
  cJSON *run = first_run(res);
  vl_err err;
  assert_int_equal(vl_results_validate(res, c, &L, &err), 0);
  static const struct { const char *key, *json, *msg; } bad[] = {
      {"calls", "\"many\"", "rungs[0].runs[0].profile[0].calls: expected a number"},
      {"op", "42", "rungs[0].runs[0].profile[0].op: expected a string"},
      {"share", "[0.5]", "rungs[0].runs[0].profile[0].share: expected a number"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cJSON *e = cJSON_Duplicate(cJSON_GetArrayItem(cJSON_GetObjectItem(run, "profile"), 0), 1);
    cJSON_ReplaceItemInObject(e, bad[i].key, cJSON_Parse(bad[i].json));
    cJSON *copy = cJSON_Duplicate(res, 1);
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(first_run(copy), "profile"), 0, e);
    assert_int_not_equal(vl_results_validate(copy, c, &L, &err), 0);
    if (!strstr(err.msg, bad[i].msg)) {
      print_error("expected \"%s\", got \"%s\"\n", bad[i].msg, err.msg);
      fail();
    }
    cJSON_Delete(copy);
  }
  /* the table itself and its companion numbers */
  cJSON_ReplaceItemInObject(run, "profile_other_seconds", cJSON_CreateString("0.1"));
  assert_int_not_equal(vl_results_validate(res, c, &L, &err), 0);
  assert_non_null(strstr(err.msg, "rungs[0].runs[0].profile_other_seconds: expected a number"));
  cJSON_ReplaceItemInObject(run, "profile_other_seconds", cJSON_CreateNumber(0.1));
  cJSON_ReplaceItemInObject(run, "profile", cJSON_CreateObject());
  assert_int_not_equal(vl_results_validate(res, c, &L, &err), 0);
  assert_non_null(strstr(err.msg, "rungs[0].runs[0].profile: expected an array"));
  cJSON_Delete(res);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_profile_accounts_for_the_step),
      cmocka_unit_test(test_report_shows_profile),
      cmocka_unit_test(test_validator_refuses_bad_profile),
  };
  return cmocka_run_group_tests(tests, setup, tu_tmp_teardown);
}
