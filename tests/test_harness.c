/* Harness tests: ladder/claims files and their errors, --set inheritance, knob parsing,
 * verdicts, statistics, atomic writes, the llm-lora case's planner output and CLI errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "case.h"
#include "report.h"
#include "testutil.h"

static char tmpdir[256];

static void write_file(const char *rel, const char *text) {
  char path[512], dir[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, rel);
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = 0;
  assert_int_equal(vl_mkdir_p(dir), 0);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/vramlab-test-harness-%d", (int)getpid());
  return vl_mkdir_p(tmpdir);
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *ladder_ok =
    "[case]\nbatch = 2\n[a]\nlabel = first\nx = 1\ny = 2\n[b]\ny = 3\n[c]\nz = 4\n";
static const char *claims_ok =
    "[c1]\ntext = t\nmetric = peak_bytes\nbefore = a\nafter = c\narticle_before = 10\narticle_after = 5\ntol = 0.1\n";

static void test_ladder_inherits(void **state) {
  (void)state;
  write_file("cases/t1/ladder.ini", ladder_ok);
  write_file("cases/t1/claims.ini", claims_ok);
  vl_ladder L;
  char err[256] = "";
  assert_int_equal(vl_ladder_load(&L, tmpdir, "t1", err, sizeof err), 0);
  assert_int_equal(L.n_rungs, 3);
  assert_string_equal(L.rungs[0].label, "first");
  assert_string_equal(vl_knob_get(&L.rungs[2].knobs, "x"), "1"); /* inherited twice */
  assert_string_equal(vl_knob_get(&L.rungs[2].knobs, "y"), "3");
  assert_string_equal(vl_knob_get(&L.rungs[2].knobs, "z"), "4");
  assert_null(vl_knob_get(&L.rungs[1].knobs, "z"));
  assert_string_equal(vl_knob_get(&L.setting, "batch"), "2");
  /* --set rung.key flows down to the rungs that inherit it, not past one that sets it */
  assert_int_equal(vl_ladder_set(&L, "a.y=9", err, sizeof err), 0);
  assert_string_equal(vl_knob_get(&L.rungs[0].knobs, "y"), "9");
  assert_string_equal(vl_knob_get(&L.rungs[1].knobs, "y"), "3");
  assert_int_equal(vl_ladder_set(&L, "a.x=7", err, sizeof err), 0);
  assert_string_equal(vl_knob_get(&L.rungs[2].knobs, "x"), "7");
  assert_int_equal(vl_ladder_set(&L, "batch=5", err, sizeof err), 0);
  assert_string_equal(vl_knob_get(&L.setting, "batch"), "5");
  assert_int_not_equal(vl_ladder_set(&L, "nosuch.x=1", err, sizeof err), 0);
  assert_non_null(strstr(err, "unknown rung"));
  assert_int_not_equal(vl_ladder_set(&L, "novalue", err, sizeof err), 0);
}

static void test_ladder_errors(void **state) {
  (void)state;
  vl_ladder L;
  char err[256] = "";
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "missing", err, sizeof err), 0);
  assert_non_null(strstr(err, "cannot open"));
  write_file("cases/t2/ladder.ini", "[a]\nthis line is malformed\n");
  write_file("cases/t2/claims.ini", claims_ok);
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t2", err, sizeof err), 0);
  assert_non_null(strstr(err, "ladder.ini:2"));
  write_file("cases/t3/ladder.ini", ladder_ok);
  write_file("cases/t3/claims.ini", "[c]\nmetric = m\nafter = nope\n");
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t3", err, sizeof err), 0);
  assert_non_null(strstr(err, "unknown rung 'nope'"));
  write_file("cases/t4/ladder.ini", ladder_ok);
  write_file("cases/t4/claims.ini", "[c]\nmetric = m\nafter = a\ntol = lots\n");
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t4", err, sizeof err), 0);
  assert_non_null(strstr(err, "not a number"));
  write_file("cases/t6/ladder.ini", ladder_ok);
  write_file("cases/t6/claims.ini", "[c]\nmetric = m\nafter = a\nkind = vibes\n");
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t6", err, sizeof err), 0);
  assert_non_null(strstr(err, "kind 'vibes'"));
  write_file("cases/t5/ladder.ini", ladder_ok);
  write_file("cases/t5/claims.ini", "[c]\nmetric = m\nafter = a\ncolour = red\n");
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t5", err, sizeof err), 0);
  assert_non_null(strstr(err, "unknown key 'colour'"));
}

static void test_knob_parsing(void **state) {
  (void)state;
  vl_knobs k = {0};
  char err[256];
  long v;
  double d;
  int b;
  size_t sz;
  vl_knob_set(&k, "n", "12x");
  assert_int_not_equal(vl_knob_int(&k, "n", 0, 0, 100, &v, err, sizeof err), 0);
  assert_non_null(strstr(err, "n = '12x'"));
  vl_knob_set(&k, "n", "101");
  assert_int_not_equal(vl_knob_int(&k, "n", 0, 0, 100, &v, err, sizeof err), 0);
  vl_knob_set(&k, "n", "42");
  assert_int_equal(vl_knob_int(&k, "n", 0, 0, 100, &v, err, sizeof err), 0);
  assert_int_equal(v, 42);
  assert_int_equal(vl_knob_int(&k, "absent", 7, 0, 100, &v, err, sizeof err), 0);
  assert_int_equal(v, 7);
  vl_knob_set(&k, "f", "1.5");
  assert_int_not_equal(vl_knob_double(&k, "f", 0, 0, 1, &d, err, sizeof err), 0);
  vl_knob_set(&k, "f", "nan");
  assert_int_not_equal(vl_knob_double(&k, "f", 0, 0, 1, &d, err, sizeof err), 0);
  vl_knob_set(&k, "b", "maybe");
  assert_int_not_equal(vl_knob_bool(&k, "b", 0, &b, err, sizeof err), 0);
  vl_knob_set(&k, "b", "on");
  assert_int_equal(vl_knob_bool(&k, "b", 0, &b, err, sizeof err), 0);
  assert_int_equal(b, 1);
  vl_knob_set(&k, "s", "24 furlongs");
  assert_int_not_equal(vl_knob_bytes(&k, "s", "1GB", &sz, err, sizeof err), 0);
  vl_knob_set(&k, "s", "24GiB");
  assert_int_equal(vl_knob_bytes(&k, "s", "1GB", &sz, err, sizeof err), 0);
  assert_true(sz == (size_t)24 << 30);
  assert_int_not_equal(vl_knobs_apply_list(&k, "a=1,broken", err, sizeof err), 0);
}

static void test_verdicts(void **state) {
  (void)state;
  vl_claim c = {0};
  snprintf(c.kind, sizeof c.kind, "value");
  c.article_before = 28e9;
  c.article_after = 14e9;
  c.tol = 0.15;
  assert_int_equal(vl_judge(&c, 29e9, 14.5e9), VL_HOLDS);
  assert_int_equal(vl_judge(&c, 40e9, 14.5e9), VL_DIRECTION_HOLDS); /* before is off */
  assert_int_equal(vl_judge(&c, 29e9, 20e9), VL_DIRECTION_HOLDS);
  assert_int_equal(vl_judge(&c, 29e9, 43e9), VL_DOES_NOT_HOLD);
  assert_int_equal(vl_judge(&c, NAN, 14e9), VL_NOT_MEASURABLE);
  snprintf(c.kind, sizeof c.kind, "ratio");
  c.article_before = 1;
  c.article_after = 0.7;
  c.tol = 0.1;
  assert_int_equal(vl_judge(&c, 10, 7.2), VL_HOLDS);
  assert_int_equal(vl_judge(&c, 10, 9.9), VL_DIRECTION_HOLDS);
  assert_int_equal(vl_judge(&c, 10, 11), VL_DOES_NOT_HOLD);
  snprintf(c.kind, sizeof c.kind, "range");
  c.lo = 2;
  c.hi = 4;
  assert_int_equal(vl_judge(&c, NAN, 3), VL_HOLDS);
  assert_int_equal(vl_judge(&c, NAN, 75), VL_DOES_NOT_HOLD);
  assert_int_equal(vl_judge(&c, NAN, NAN), VL_NOT_MEASURABLE);
  snprintf(c.kind, sizeof c.kind, "ratio_range");
  c.lo = 0.3;
  c.hi = 0.5;
  assert_int_equal(vl_judge(&c, 10, 4), VL_HOLDS);
  assert_int_equal(vl_judge(&c, 10, 8), VL_DIRECTION_HOLDS);
  assert_int_equal(vl_judge(&c, 10, 12), VL_DOES_NOT_HOLD);
  assert_int_equal(vl_judge(&c, 0, 12), VL_NOT_MEASURABLE);
  assert_string_equal(vl_verdict_name(VL_DIRECTION_HOLDS), "direction holds");
}

static void test_stats_and_atomic_write(void **state) {
  (void)state;
  double x[] = {5, 1, 4, 2, 3};
  vl_stats s;
  vl_stats_compute(x, 5, &s);
  assert_true(s.median == 3 && s.min == 1 && s.max == 5 && s.mean == 3);
  double y[] = {4, 1, 3, 2};
  vl_stats_compute(y, 4, &s);
  assert_true(s.median == 2.5);
  char path[512], err[256];
  snprintf(path, sizeof path, "%s/out.json", tmpdir);
  assert_int_equal(vl_write_atomic(path, "{\"a\":1}", err, sizeof err), 0);
  char *t = vl_read_file(path, NULL);
  assert_non_null(t);
  assert_string_equal(t, "{\"a\":1}");
  free(t);
  snprintf(path, sizeof path, "%s/no/such/dir/out.json", tmpdir);
  assert_int_not_equal(vl_write_atomic(path, "x", err, sizeof err), 0);
  assert_non_null(strstr(err, "cannot create"));
}

/* The llm-lora case's plan output has every field the CLI promises, and knob errors. */
static void test_llm_plan_fields(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("llm-lora");
  assert_non_null(c);
  assert_null(vl_case_find("llm-lora-nope"));
  vl_ladder L;
  char err[512];
  assert_int_equal(vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, "llm-lora", err, sizeof err), 0);
  assert_true(vl_ladder_find(&L, "after") >= 0);
  assert_int_equal(vl_ladder_find(&L, "nosuch"), -1);
  vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L.setting, .quiet = 1};
  cJSON *o = cJSON_CreateObject();
  int q = vl_ladder_find(&L, "qlora");
  assert_int_equal(c->plan(&env, "full", &L.rungs[q].knobs, o, err, sizeof err), 0);
  const char *fields[] = {"params_total", "params_trainable", "peak_bytes", "flops_per_step",
                          "cap_bytes", "fits", "max_batch", "oom_rate"};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) assert_non_null(cJSON_GetObjectItem(o, fields[i]));
  cJSON *bc = cJSON_GetObjectItem(o, "by_category");
  for (int i = 0; i < VL_MEM_NCAT; i++) assert_non_null(cJSON_GetObjectItem(bc, vl_mem_cat_name((vl_mem_cat)i)));
  /* Mistral-7B-v0.1: 7,241,732,096 parameters; LoRA r=8 on q,k,v,o: 6,815,744 */
  assert_true(cJSON_GetObjectItem(o, "params_total")->valuedouble == 7241732096.0 + 6815744.0);
  assert_true(cJSON_GetObjectItem(o, "params_trainable")->valuedouble == 6815744.0);
  cJSON_Delete(o);
  vl_knobs bad = L.rungs[q].knobs;
  vl_knob_set(&bad, "optimizer", "lion");
  o = cJSON_CreateObject();
  assert_int_not_equal(c->plan(&env, "full", &bad, o, err, sizeof err), 0);
  assert_non_null(strstr(err, "optimizer = 'lion'"));
  assert_int_not_equal(c->plan(&env, "galactic", &L.rungs[q].knobs, o, err, sizeof err), 0);
  assert_non_null(strstr(err, "unknown scale"));
  cJSON_Delete(o);
  vl_knob_set(&bad, "colour", "red");
  assert_int_not_equal(vl_case_check_knobs(c, "qlora", &bad, err, sizeof err), 0);
  assert_non_null(strstr(err, "unknown knob 'colour'"));
}

/* seg-ckpt's plan: encoder parameters equal torchvision's ResNet-101 without fc, the
 * fields the report reads, the linear fit, a full-scale rung in < 1 s; knob errors. */
static void test_seg_plan_fields(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("seg-ckpt");
  assert_non_null(c);
  vl_ladder L;
  char err[512];
  assert_int_equal(vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, "seg-ckpt", err, sizeof err), 0);
  for (int i = 0; i < L.n_rungs; i++)
    assert_int_equal(vl_case_check_knobs(c, L.rungs[i].name, &L.rungs[i].knobs, err, sizeof err), 0);
  vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L.setting, .quiet = 1};
  int b = vl_ladder_find(&L, "before"), k = vl_ladder_find(&L, "ckpt"), a = vl_ladder_find(&L, "after");
  assert_true(b >= 0 && k >= 0 && a >= 0);
  cJSON *ob = cJSON_CreateObject(), *ok = cJSON_CreateObject(), *oa = cJSON_CreateObject();
  assert_int_equal(c->plan(&env, "full", &L.rungs[b].knobs, ob, err, sizeof err), 0);
  assert_int_equal(c->plan(&env, "full", &L.rungs[k].knobs, ok, err, sizeof err), 0);
  assert_int_equal(c->plan(&env, "full", &L.rungs[a].knobs, oa, err, sizeof err), 0);
  cJSON *pm = cJSON_GetObjectItem(ob, "params_by_module");
  assert_true(cJSON_GetObjectItem(pm, "encoder")->valuedouble == 42500160.0);
  const char *fields[] = {"peak_bytes", "acts_bytes", "model_bytes", "flops_per_step", "cap_bytes",
                          "fits", "max_batch", "fit_r2", "fit_base_bytes", "fit_per_sample_bytes",
                          "fit_predicted_max_batch", "recompute_share", "extent_overhead",
                          "batch_curve", "by_category"};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) assert_non_null(cJSON_GetObjectItem(oa, fields[i]));
  assert_true(cJSON_GetObjectItem(ob, "plan_seconds")->valuedouble < 1.0);
  /* checkpointing lowers the activation peak and recomputes a forward */
  assert_true(cJSON_GetObjectItem(ok, "acts_bytes")->valuedouble < cJSON_GetObjectItem(ob, "acts_bytes")->valuedouble);
  assert_true(cJSON_GetObjectItem(ok, "recompute_share")->valuedouble > 0.1);
  assert_true(cJSON_GetObjectItem(ob, "recompute_share")->valuedouble == 0);
  /* "max": the largest batch that fits, which the after rung then uses */
  assert_true(cJSON_GetObjectItem(oa, "batch")->valuedouble == cJSON_GetObjectItem(oa, "max_batch")->valuedouble);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(oa, "fits")));
  assert_true(cJSON_GetObjectItem(oa, "peak_bytes")->valuedouble <= cJSON_GetObjectItem(oa, "cap_bytes")->valuedouble);
  cJSON_Delete(ob); cJSON_Delete(ok); cJSON_Delete(oa);
  vl_knobs bad = L.rungs[b].knobs;
  vl_knob_set(&bad, "compute", "nf4");
  cJSON *o = cJSON_CreateObject();
  assert_int_not_equal(c->plan(&env, "full", &bad, o, err, sizeof err), 0);
  assert_non_null(strstr(err, "compute = 'nf4'"));
  bad = L.rungs[b].knobs;
  vl_knob_set(&bad, "batch", "1");
  assert_int_not_equal(c->plan(&env, "full", &bad, o, err, sizeof err), 0);
  assert_non_null(strstr(err, "batch"));
  cJSON_Delete(o);
}

/* A truncated or corrupt results file gives a clear error and writes no report. */
static void test_report_rejects_corrupt_results(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("llm-lora");
  vl_ladder L;
  char err[512], res[512], md[512];
  assert_int_equal(vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, "llm-lora", err, sizeof err), 0);
  write_file("res/trunc.json", "{\"schema_version\": 1, \"rungs\": [ {\"name\": \"base");
  snprintf(res, sizeof res, "%s/res/trunc.json", tmpdir);
  snprintf(md, sizeof md, "%s/res/out.md", tmpdir);
  assert_int_not_equal(vl_report_write(c, &L, res, md, err, sizeof err), 0);
  assert_non_null(strstr(err, "truncated or corrupt"));
  assert_int_not_equal(access(md, F_OK), 0);
  snprintf(res, sizeof res, "%s/res/missing.json", tmpdir);
  assert_int_not_equal(vl_report_write(c, &L, res, md, err, sizeof err), 0);
  assert_non_null(strstr(err, "cannot read"));
}

/* Ctrl-C during a run: the run stops at a step edge, the results written so far are kept
 * (atomically), marked interrupted, and the exit status says it failed. */
static void test_interrupted_run_keeps_results(void **state) {
  (void)state;
  char cmd[1024], path[512];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && (%s/vramlab run llm-lora --device cpu --scale tiny --step baseline "
           "--set steps=100000 --set reps=1 --out res-int --quiet >int.log 2>&1 & pid=$!; "
           "sleep 3; kill -INT $pid; wait $pid; echo $? > int.rc)",
           tmpdir, VRAMLAB_BINARY_DIR);
  assert_int_equal(system(cmd), 0);
  snprintf(path, sizeof path, "%s/int.rc", tmpdir);
  char *rc = vl_read_file(path, NULL);
  assert_non_null(rc);
  assert_int_equal(atoi(rc), 1);
  free(rc);
  snprintf(path, sizeof path, "%s/res-int/llm-lora/latest.json", tmpdir);
  char *text = vl_read_file(path, NULL);
  assert_non_null(text);
  cJSON *res = cJSON_Parse(text);
  free(text);
  assert_non_null(res);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(res, "interrupted")));
  /* the plan part of the rung survived */
  cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0);
  assert_non_null(cJSON_GetObjectItem(cJSON_GetObjectItem(r0, "plan"), "peak_bytes"));
  cJSON_Delete(res);
}

/* A rung that does not fit the device is recorded as out of memory and the ladder goes
 * on (the 7B fp32 baseline on a GPU runner); the run still succeeds. */
static void test_oom_rung_is_a_result(void **state) {
  (void)state;
  char cmd[1024], path[512];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && %s/vramlab run llm-lora --device cpu --scale tiny --set steps=2 --set warmup=0 "
           "--set reps=1 --set run_cap=64KiB --out res-oom --quiet >oom.log 2>&1",
           tmpdir, VRAMLAB_BINARY_DIR);
  assert_int_equal(WEXITSTATUS(system(cmd)), 0);
  snprintf(path, sizeof path, "%s/res-oom/llm-lora/latest.json", tmpdir);
  char *text = vl_read_file(path, NULL);
  assert_non_null(text);
  cJSON *res = cJSON_Parse(text);
  free(text);
  int n = 0, oom = 0;
  cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    n++;
    oom += cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "runs"), 0), "oom"));
  }
  assert_true(n >= 8);
  assert_int_equal(oom, n); /* 64 KiB holds no model: every rung ran and recorded it */
  cJSON_Delete(res);
}

/* The command line: unknown case, unknown step and bad values exit non-zero with a message. */
static void test_cli_errors(void **state) {
  (void)state;
  struct { const char *args, *expect; int rc; } cases[] = {
      {"plan nosuch", "unknown case 'nosuch'", 2},
      {"plan llm-lora --step nosuch", "unknown step 'nosuch'", 2},
      {"plan llm-lora --set after.optimizer=lion --step after", "optimizer = 'lion'", 1},
      {"plan llm-lora --set ckpt.colour=red", "unknown knob 'colour'", 2},
      {"run llm-lora --device tpu", "unknown device 'tpu'", 2},
      {"plan llm-lora --scale huge", "unknown scale 'huge'", 2},
      {"plan seg-ckpt --set ckpt.workers=-1 --step ckpt", "workers", 1},
      {"run seg-ckpt --device cpu --scale full --step before", "too slow for this CPU", 1},
      {"frobnicate", "unknown command", 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char cmd[512], out[512];
    snprintf(out, sizeof out, "%s/cli.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "%s/vramlab %s >%s 2>&1", VRAMLAB_BINARY_DIR, cases[i].args, out);
    int st = system(cmd);
    char *t = vl_read_file(out, NULL);
    assert_non_null(t);
    if (!strstr(t, cases[i].expect)) {
      print_error("`vramlab %s` printed:\n%s\nexpected '%s'\n", cases[i].args, t, cases[i].expect);
      fail();
    }
    assert_int_equal(WEXITSTATUS(st), cases[i].rc);
    free(t);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ladder_inherits),  cmocka_unit_test(test_ladder_errors),
      cmocka_unit_test(test_knob_parsing),     cmocka_unit_test(test_verdicts),
      cmocka_unit_test(test_stats_and_atomic_write), cmocka_unit_test(test_llm_plan_fields),
      cmocka_unit_test(test_cli_errors), cmocka_unit_test(test_report_rejects_corrupt_results),
      cmocka_unit_test(test_interrupted_run_keeps_results),
      cmocka_unit_test(test_oom_rung_is_a_result), cmocka_unit_test(test_seg_plan_fields),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
