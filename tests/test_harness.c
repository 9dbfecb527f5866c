/* Harness tests: ladder/claims files and their errors, --set inheritance, knob parsing,
 * verdicts, statistics, atomic writes, the llm-lora case's planner output and CLI errors. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "kit/parse.h"
#include "harness/report.h"
#include "testutil.h"

/* gcc: the build turns -Wformat-truncation off; the tests here build long paths and
 * commands on purpose, so a buffer too small for one is an error, not a silently cut test. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic error "-Wformat-truncation"
#endif

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
    "[c1]\ntext = t\nmetric = peak_bytes\nbefore = a\nafter = c\narticle_before = 10\narticle_after = 5\ntol = 0.1\nbasis = planned\n";

static void test_ladder_inherits(void **state) {
  (void)state;
  write_file("cases/t1/ladder.ini", ladder_ok);
  write_file("cases/t1/claims.ini", claims_ok);
  vl_ladder L;
  vl_err err = {0};
  assert_int_equal(vl_ladder_load(&L, tmpdir, "t1", &err), 0);
  assert_int_equal(L.n_rungs, 3);
  assert_string_equal(L.rungs[0].label, "first");
  assert_string_equal(vl_knob_get(&L.rungs[2].knobs, "x"), "1"); /* inherited twice */
  assert_string_equal(vl_knob_get(&L.rungs[2].knobs, "y"), "3");
  assert_string_equal(vl_knob_get(&L.rungs[2].knobs, "z"), "4");
  assert_null(vl_knob_get(&L.rungs[1].knobs, "z"));
  assert_string_equal(vl_knob_get(&L.setting, "batch"), "2");
  /* --set rung.key flows down to the rungs that inherit it, not past one that sets it */
  assert_int_equal(vl_ladder_set(&L, "a.y=9", &err), 0);
  assert_string_equal(vl_knob_get(&L.rungs[0].knobs, "y"), "9");
  assert_string_equal(vl_knob_get(&L.rungs[1].knobs, "y"), "3");
  assert_int_equal(vl_ladder_set(&L, "a.x=7", &err), 0);
  assert_string_equal(vl_knob_get(&L.rungs[2].knobs, "x"), "7");
  assert_int_equal(vl_ladder_set(&L, "batch=5", &err), 0);
  assert_string_equal(vl_knob_get(&L.setting, "batch"), "5");
  assert_int_not_equal(vl_ladder_set(&L, "nosuch.x=1", &err), 0);
  assert_non_null(strstr(err.msg, "unknown rung"));
  assert_int_not_equal(vl_ladder_set(&L, "novalue", &err), 0);
}

static void test_ladder_errors(void **state) {
  (void)state;
  vl_ladder L;
  vl_err err = {0};
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "missing", &err), 0);
  assert_non_null(strstr(err.msg, "cannot open"));
  write_file("cases/t2/ladder.ini", "[a]\nthis line is malformed\n");
  write_file("cases/t2/claims.ini", claims_ok);
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t2", &err), 0);
  assert_non_null(strstr(err.msg, "ladder.ini:2"));
  write_file("cases/t3/ladder.ini", ladder_ok);
  write_file("cases/t3/claims.ini", "[c]\nmetric = m\nafter = nope\n");
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t3", &err), 0);
  assert_non_null(strstr(err.msg, "unknown rung 'nope'"));
  write_file("cases/t4/ladder.ini", ladder_ok);
  write_file("cases/t4/claims.ini", "[c]\nmetric = m\nafter = a\ntol = lots\n");
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t4", &err), 0);
  assert_non_null(strstr(err.msg, "not a number"));
  write_file("cases/t6/ladder.ini", ladder_ok);
  write_file("cases/t6/claims.ini", "[c]\nmetric = m\nafter = a\nkind = vibes\n");
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t6", &err), 0);
  assert_non_null(strstr(err.msg, "kind 'vibes'"));
  write_file("cases/t5/ladder.ini", ladder_ok);
  write_file("cases/t5/claims.ini", "[c]\nmetric = m\nafter = a\ncolour = red\n");
  assert_int_not_equal(vl_ladder_load(&L, tmpdir, "t5", &err), 0);
  assert_non_null(strstr(err.msg, "unknown key 'colour'"));
}

/* Defaults of the knobs the helper tests read (the helpers fall back to a declared one). */
static const vl_knob_decl test_decl[] = {
    {"n", "0", "an integer", VL_KNOB_RUNG},      {"absent", "7", "never set", VL_KNOB_RUNG},
    {"f", "0", "a number", VL_KNOB_RUNG},        {"b", "false", "a flag", VL_KNOB_RUNG},
    {"s", "1GB", "a size", VL_KNOB_RUNG},        {"sw", "1", "a list", VL_KNOB_RUNG},
    {"absent_list", "1,2,4", "never set", VL_KNOB_RUNG}, {NULL, NULL, NULL, 0},
};

static void test_knob_parsing(void **state) {
  (void)state;
  vl_knobs k = {0};
  vl_err err;
  long v;
  double d;
  int b;
  size_t sz;
  vl_knob_set(&k, "n", "12x");
  assert_int_not_equal(vl_knob_int(&k, "n", test_decl, 0, 100, &v, &err), 0);
  assert_non_null(strstr(err.msg, "n = '12x'"));
  vl_knob_set(&k, "n", "101");
  assert_int_not_equal(vl_knob_int(&k, "n", test_decl, 0, 100, &v, &err), 0);
  vl_knob_set(&k, "n", "42");
  assert_int_equal(vl_knob_int(&k, "n", test_decl, 0, 100, &v, &err), 0);
  assert_int_equal(v, 42);
  assert_int_equal(vl_knob_int(&k, "absent", test_decl, 0, 100, &v, &err), 0);
  assert_int_equal(v, 7);
  vl_knob_set(&k, "f", "1.5");
  assert_int_not_equal(vl_knob_double(&k, "f", test_decl, 0, 1, &d, &err), 0);
  vl_knob_set(&k, "f", "nan");
  assert_int_not_equal(vl_knob_double(&k, "f", test_decl, 0, 1, &d, &err), 0);
  vl_knob_set(&k, "b", "maybe");
  assert_int_not_equal(vl_knob_bool(&k, "b", test_decl, &b, &err), 0);
  vl_knob_set(&k, "b", "on");
  assert_int_equal(vl_knob_bool(&k, "b", test_decl, &b, &err), 0);
  assert_int_equal(b, 1);
  vl_knob_set(&k, "s", "24 furlongs");
  assert_int_not_equal(vl_knob_bytes(&k, "s", test_decl, &sz, &err), 0);
  vl_knob_set(&k, "s", "24GiB");
  assert_int_equal(vl_knob_bytes(&k, "s", test_decl, &sz, &err), 0);
  assert_true(sz == (size_t)24 << 30);
  assert_int_not_equal(vl_knobs_apply_list(&k, "a=1,broken", &err), 0);
}

static vl_claim claim_of(const char *kind, double ab, double aa, double tol, double lo, double hi) {
  vl_claim c = {0};
  snprintf(c.kind, sizeof c.kind, "%s", kind);
  c.article_before = ab;
  c.article_after = aa;
  c.tol = tol;
  c.lo = lo;
  c.hi = hi;
  c.basis = VL_BASIS_PLANNED;
  return c;
}

/* A measured pair with the spread of its runs: before in [blo, bhi], after in [alo, ahi]. */
static vl_verdict judge_spread(const vl_claim *c, double b, double blo, double bhi, double a, double alo, double ahi) {
  vl_evidence ev = {b, a, blo, bhi, alo, ahi};
  return vl_judge_ev(c, &ev).v;
}

static void test_verdicts(void **state) {
  (void)state;
  vl_claim c = claim_of("value", 28e9, 14e9, 0.15, NAN, NAN);
  assert_int_equal(vl_judge(&c, 29e9, 14.5e9), VL_HOLDS);
  assert_int_equal(vl_judge(&c, 40e9, 14.5e9), VL_DIRECTION_HOLDS); /* before is off, the change ×0.36 */
  assert_int_equal(vl_judge(&c, 29e9, 20e9), VL_DIRECTION_HOLDS);   /* ×0.69 against ×0.5: in the band */
  assert_int_equal(vl_judge(&c, 29e9, 43e9), VL_DOES_NOT_HOLD);
  assert_int_equal(vl_judge(&c, NAN, 14e9), VL_NOT_MEASURABLE);
  c = claim_of("ratio", 1, 0.7, 0.1, NAN, NAN);
  assert_int_equal(vl_judge(&c, 10, 7.2), VL_HOLDS);
  assert_int_equal(vl_judge(&c, 10, 11), VL_DOES_NOT_HOLD);
  c = claim_of("range", NAN, NAN, 0, 2, 4);
  assert_int_equal(vl_judge(&c, NAN, 3), VL_HOLDS);
  assert_int_equal(vl_judge(&c, NAN, 75), VL_DOES_NOT_HOLD);
  assert_int_equal(vl_judge(&c, NAN, NAN), VL_NOT_MEASURABLE);
  c = claim_of("ratio_range", NAN, NAN, 0, 0.3, 0.5);
  assert_int_equal(vl_judge(&c, 10, 4), VL_HOLDS);
  assert_int_equal(vl_judge(&c, 10, 6), VL_DIRECTION_HOLDS); /* ×0.6 against ×0.39 */
  assert_int_equal(vl_judge(&c, 10, 12), VL_DOES_NOT_HOLD);
  assert_int_equal(vl_judge(&c, 0, 12), VL_NOT_MEASURABLE);
  assert_string_equal(vl_verdict_name(VL_DIRECTION_HOLDS), "direction holds");
  assert_string_equal(vl_verdict_name(VL_INCONCLUSIVE), "inconclusive (within noise)");
}

/* #19's found cases, each failing on the judge before it: a value claim without an article
 * "before" whose two rungs give the same number (seg-ckpt's recompute share 22% against 33%,
 * the fragmentation ratio 0.988 -> 0.988 against 0.771) was "direction holds". */
static void test_verdict_equal_ends(void **state) {
  (void)state;
  vl_claim c = claim_of("value", NAN, 0.33, 0.1, NAN, NAN);
  assert_int_equal(vl_judge(&c, 0.22, 0.22), VL_DOES_NOT_HOLD);
  assert_int_equal(vl_judge(&c, 0.0, 0.22), VL_DOES_NOT_HOLD);
  assert_int_equal(vl_judge(&c, 0.0, 0.32), VL_HOLDS);
  c = claim_of("value", NAN, 0.771, 0.05, NAN, NAN);
  assert_int_equal(vl_judge(&c, 0.988, 0.988), VL_DOES_NOT_HOLD);
  /* a value with no "before" rung is judged on its "after" alone */
  snprintf(c.before, sizeof c.before, "%s", "");
  assert_int_equal(vl_judge(&c, NAN, 0.77), VL_HOLDS);
  assert_int_equal(vl_judge(&c, NAN, 0.5), VL_DOES_NOT_HOLD);
  snprintf(c.before, sizeof c.before, "before");
  assert_int_equal(vl_judge(&c, NAN, 0.77), VL_NOT_MEASURABLE);
  c = claim_of("ratio", 1, 0.771, 0.05, NAN, NAN);
  assert_int_equal(vl_judge(&c, 0.988, 0.988), VL_DOES_NOT_HOLD);
}

/* The noise floor: a measured change inside the spread of the runs is inconclusive, never a
 * hold (prefetch's idle ×0.989 against -30-50%, first batch ×0.994). */
static void test_verdict_noise(void **state) {
  (void)state;
  vl_claim c = claim_of("ratio_range", NAN, NAN, 0, 0.5, 0.7);
  c.basis = VL_BASIS_MEASURED;
  assert_int_equal(judge_spread(&c, 1.0, 0.97, 1.02, 0.989, 0.96, 1.01), VL_INCONCLUSIVE);
  assert_int_equal(judge_spread(&c, 1.0, 0.99, 1.01, 0.6, 0.59, 0.61), VL_HOLDS);
  /* the same ×0.989 without a spread: far under a quarter of the claimed change */
  assert_int_equal(vl_judge(&c, 1.0, 0.989), VL_DOES_NOT_HOLD);
  /* a median outside the range whose spread reaches it */
  assert_int_equal(judge_spread(&c, 1.0, 0.99, 1.01, 0.75, 0.68, 0.8), VL_INCONCLUSIVE);
  /* a spread that holds the whole claimed range inside it (not only at its ends): a measured
   * 1.94x in 1.46-2.1 against "1.8-1.9x" */
  c = claim_of("range", NAN, NAN, 0, 1.8, 1.9);
  c.basis = VL_BASIS_MEASURED;
  assert_int_equal(judge_spread(&c, NAN, NAN, NAN, 1.94, 1.46, 2.1), VL_INCONCLUSIVE);
  assert_int_equal(judge_spread(&c, NAN, NAN, NAN, 1.94, 1.92, 1.96), VL_DOES_NOT_HOLD);
  c = claim_of("ratio_range", NAN, NAN, 0, 1.8, 1.9);
  assert_int_equal(judge_spread(&c, 1.0, 0.9, 1.1, 1.5, 1.45, 2.2), VL_INCONCLUSIVE);
  c = claim_of("ratio", 1, 0.5, 0.1, NAN, NAN);
  assert_int_equal(judge_spread(&c, 1.0, 0.9, 1.1, 0.994, 0.95, 1.05), VL_INCONCLUSIVE);
  vl_evidence ev = {1.0, 0.994, 0.9, 1.1, 0.95, 1.05};
  assert_non_null(strstr(vl_judge_ev(&c, &ev).why, "spread"));
}

/* The magnitude band: "direction holds" needs 1/4 to 4x the claimed change on a log scale. */
static void test_verdict_magnitude(void **state) {
  (void)state;
  vl_claim c = claim_of("ratio_range", NAN, NAN, 0, 0.2, 0.4); /* batched collate: -60-80% */
  assert_int_equal(vl_judge(&c, 1.0, 0.78), VL_DOES_NOT_HOLD);  /* -22%: log 0.25 of 1.04 < 1/4 */
  assert_int_equal(vl_judge(&c, 1.0, 0.55), VL_DIRECTION_HOLDS); /* -45% */
  c = claim_of("value", 10, 5, 0.1, NAN, NAN);                  /* a halving */
  assert_int_equal(vl_judge(&c, 10, 9.6), VL_DOES_NOT_HOLD);    /* -4% */
  vl_evidence ev = {10, 9.6, NAN, NAN, NAN, NAN};
  assert_non_null(strstr(vl_judge_ev(&c, &ev).why, "smaller"));
  assert_int_equal(vl_judge(&c, 10, 7), VL_DIRECTION_HOLDS);
  assert_int_equal(vl_judge(&c, 10, 10), VL_DOES_NOT_HOLD); /* no change */
}

/* One rule for "far beyond the claim", for values and ranges alike: batch 2 -> 75 against
 * "2 -> 6" and against "batch 2-4" reached from 2 get the same verdict. */
static void test_verdict_far_beyond(void **state) {
  (void)state;
  vl_claim v = claim_of("value", 2, 6, 0.1, NAN, NAN);
  vl_claim r = claim_of("range", NAN, NAN, 0, 5, 7);
  snprintf(r.before, sizeof r.before, "before");
  assert_int_equal(vl_judge(&v, 2, 75), vl_judge(&r, 2, 75));
  assert_int_equal(vl_judge(&v, 2, 75), VL_DOES_NOT_HOLD); /* log 37.5 / log 3 = 3.3 > 2 */
  assert_int_equal(vl_judge(&v, 2, 12), VL_DIRECTION_HOLDS);
  assert_int_equal(vl_judge(&r, 2, 12), VL_DIRECTION_HOLDS);
  vl_evidence ev = {2, 200, NAN, NAN, NAN, NAN};
  assert_non_null(strstr(vl_judge_ev(&v, &ev).why, "far beyond"));
}

/* Configured evidence holds only by construction; modeled holds are tallied apart. */
static void test_verdict_basis(void **state) {
  (void)state;
  vl_claim c = claim_of("value", NAN, 0.92, 0.01, NAN, NAN);
  c.basis = VL_BASIS_CONFIGURED;
  assert_int_equal(vl_judge(&c, 0.92, 0.92), VL_BY_CONSTRUCTION);
  assert_int_equal(vl_judge(&c, 0.5, 0.5), VL_DOES_NOT_HOLD);
  c = claim_of("none", NAN, NAN, 0, NAN, NAN);
  assert_int_equal(vl_judge(&c, 1, 1), VL_NOT_MEASURABLE);
  assert_string_equal(vl_basis_name(VL_BASIS_MODELED), "modeled");
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
  char path[512];
  vl_err err;
  snprintf(path, sizeof path, "%s/out.json", tmpdir);
  assert_int_equal(vl_write_atomic(path, "{\"a\":1}", &err), 0);
  char *t = vl_read_file(path, NULL);
  assert_non_null(t);
  assert_string_equal(t, "{\"a\":1}");
  free(t);
  snprintf(path, sizeof path, "%s/no/such/dir/out.json", tmpdir);
  assert_int_not_equal(vl_write_atomic(path, "x", &err), 0);
  assert_non_null(strstr(err.msg, "cannot create"));
}

/* The llm-lora case's plan output has every field the CLI promises, and knob errors. */
static void test_llm_plan_fields(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("llm-lora");
  assert_non_null(c);
  assert_null(vl_case_find("llm-lora-nope"));
  vl_ladder L;
  vl_err err;
  assert_int_equal(vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, "llm-lora", &err), 0);
  assert_true(vl_ladder_find(&L, "after") >= 0);
  assert_int_equal(vl_ladder_find(&L, "nosuch"), -1);
  vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L.setting, .quiet = 1};
  cJSON *o = cJSON_CreateObject();
  int q = vl_ladder_find(&L, "qlora");
  assert_int_equal(c->plan(&env, "full", &L.rungs[q].knobs, o), 0);
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
  assert_int_equal(c->plan(&env, "full", &bad, o), VL_ERR_INVALID);
  assert_non_null(strstr(env.err.msg, "optimizer = 'lion'"));
  assert_int_equal(c->plan(&env, "galactic", &L.rungs[q].knobs, o), VL_ERR_INVALID);
  assert_non_null(strstr(env.err.msg, "unknown scale"));
  cJSON_Delete(o);
  vl_knob_set(&bad, "colour", "red");
  assert_int_equal(vl_case_check_knobs(&env, c, "qlora", &bad), VL_ERR_INVALID);
  assert_non_null(strstr(env.err.msg, "unknown knob 'colour'"));
}

/* seg-ckpt's plan: encoder parameters equal torchvision's ResNet-101 without fc, the
 * fields the report reads, the linear fit, a full-scale rung in < 1 s; knob errors. */
static void test_seg_plan_fields(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("seg-ckpt");
  assert_non_null(c);
  vl_ladder L;
  vl_err err;
  assert_int_equal(vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, "seg-ckpt", &err), 0);
  vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L.setting, .quiet = 1};
  for (int i = 0; i < L.n_rungs; i++)
    assert_int_equal(vl_case_check_knobs(&env, c, L.rungs[i].name, &L.rungs[i].knobs), VL_OK);
  int b = vl_ladder_find(&L, "before"), k = vl_ladder_find(&L, "ckpt"), a = vl_ladder_find(&L, "after");
  assert_true(b >= 0 && k >= 0 && a >= 0);
  cJSON *ob = cJSON_CreateObject(), *ok = cJSON_CreateObject(), *oa = cJSON_CreateObject();
  assert_int_equal(c->plan(&env, "full", &L.rungs[b].knobs, ob), 0);
  assert_int_equal(c->plan(&env, "full", &L.rungs[k].knobs, ok), 0);
  assert_int_equal(c->plan(&env, "full", &L.rungs[a].knobs, oa), 0);
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
  assert_int_equal(c->plan(&env, "full", &bad, o), VL_ERR_INVALID);
  assert_non_null(strstr(env.err.msg, "compute = 'nf4'"));
  bad = L.rungs[b].knobs;
  vl_knob_set(&bad, "batch", "1");
  assert_int_equal(c->plan(&env, "full", &bad, o), VL_ERR_INVALID);
  assert_non_null(strstr(env.err.msg, "batch"));
  /* #19: the encoder knob (000 §1.1's ResNet-101 against ResNet-50): torchvision's ResNet-50
   * without fc, fewer activations, the same decoder; an unknown depth is refused */
  bad = L.rungs[b].knobs;
  vl_knob_set(&bad, "encoder", "resnet18");
  assert_int_equal(c->plan(&env, "full", &bad, o), VL_ERR_INVALID);
  assert_non_null(strstr(env.err.msg, "encoder = 'resnet18'"));
  cJSON_Delete(o);
  vl_knobs r50 = L.rungs[b].knobs;
  vl_knob_set(&r50, "encoder", "resnet50");
  cJSON *o50 = cJSON_CreateObject(), *o101 = cJSON_CreateObject();
  assert_int_equal(c->plan(&env, "full", &r50, o50), 0);
  assert_int_equal(c->plan(&env, "full", &L.rungs[b].knobs, o101), 0);
  const cJSON *pm50 = cJSON_GetObjectItem(o50, "params_by_module"), *pm101 = cJSON_GetObjectItem(o101, "params_by_module");
  assert_true(cJSON_GetObjectItem(pm50, "encoder")->valuedouble == 23508032.0);
  assert_true(cJSON_GetObjectItem(pm50, "decoder")->valuedouble == cJSON_GetObjectItem(pm101, "decoder")->valuedouble);
  double a50 = cJSON_GetObjectItem(o50, "acts_bytes")->valuedouble, a101 = cJSON_GetObjectItem(o101, "acts_bytes")->valuedouble;
  assert_true(a50 < a101);
  /* the activation share of the peak, a fraction (000 §2.2's "40%+") */
  double sh = cJSON_GetObjectItem(o101, "acts_share")->valuedouble;
  assert_true(sh > 0.4 && sh < 1.0);
  cJSON_Delete(o50);
  cJSON_Delete(o101);
}

/* #9 item 6, the cases' one error convention: vl_case_fail keeps the message in the env and
 * returns the status, so VL_TRY passes a case's failure up unchanged; OOM triage sorts a
 * run's status into ran, out of memory (a result) and failed (the status, with the message
 * in the env and the run's JSON). */
static vl_status fail_then_more(vl_case_env *env, int *reached) {
  VL_TRY(vl_case_fail(env, VL_ERR_IO, "first failure %d", 1));
  *reached = 1;
  return vl_case_fail(env, VL_ERR_INVALID, "second failure");
}

static void test_case_error_convention(void **state) {
  (void)state;
  vl_knobs setting = {0};
  vl_case_env env = {.scale = "tiny", .device = VL_DEV_CPU, .setting = &setting, .quiet = 1};
  int reached = 0;
  assert_int_equal(fail_then_more(&env, &reached), VL_ERR_IO);
  assert_int_equal(reached, 0);
  assert_string_equal(env.err.msg, "first failure 1");
  /* the knob reads: the kit's message, as it writes it into any caller's vl_err */
  long v;
  vl_err direct;
  vl_knob_set(&setting, "steps", "12x");
  assert_int_not_equal(vl_knob_int(&setting, "steps", NULL, 1, 9, &v, &direct), 0);
  assert_int_equal(vl_knob_int(&setting, "steps", NULL, 1, 9, &v, &env.err), VL_ERR_INVALID);
  assert_string_equal(env.err.msg, direct.msg);

  bool ran = false;
  cJSON *ok = cJSON_CreateObject(), *oom = cJSON_CreateObject(), *intr = cJSON_CreateObject(),
        *io = cJSON_CreateObject();
  assert_int_equal(vl_case_triage(&env, VL_OK, "", ok, &ran), VL_OK);
  assert_true(ran);
  assert_null(cJSON_GetObjectItem(ok, "error"));
  assert_int_equal(vl_case_triage(&env, VL_ERR_OOM, "out of memory: 8.00 KiB for optim", oom, &ran), VL_OK);
  assert_false(ran);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(oom, "oom")));
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(oom, "error")), "out of memory: 8.00 KiB for optim");
  ran = true;
  assert_int_equal(vl_case_triage(&env, VL_ERR_INTERRUPTED, "stopped at a step edge", intr, &ran),
                   VL_ERR_INTERRUPTED);
  assert_false(ran);
  char want[256];
  snprintf(want, sizeof want, "cpu at scale tiny: %s (stopped at a step edge)", vl_status_name(VL_ERR_INTERRUPTED));
  assert_string_equal(env.err.msg, want);
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(intr, "error")), want);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(intr, "interrupted")));
  /* a helper's message already in the env, passed on as the run's */
  vl_case_fail(&env, VL_ERR_IO, "evaluation data: img_3.jpg: truncated");
  assert_int_equal(vl_case_triage(&env, VL_ERR_IO, env.err.msg, io, &ran), VL_ERR_IO);
  snprintf(want, sizeof want, "cpu at scale tiny: %s (evaluation data: img_3.jpg: truncated)",
           vl_status_name(VL_ERR_IO));
  assert_string_equal(env.err.msg, want);
  assert_null(cJSON_GetObjectItem(io, "interrupted"));
  cJSON_Delete(ok); cJSON_Delete(oom); cJSON_Delete(intr); cJSON_Delete(io);
}

/* Every knob and setting a case declares, given a value no number, size, dtype or name
 * parser takes, is refused by its check hook with VL_ERR_INVALID and a fresh message in the
 * env naming it: the status of the failing read is passed up, never turned into another. */
static void test_case_hooks_return_status(void **state) {
  (void)state;
  int n, refused = 0;
  const vl_case *const *all = vl_case_all(&n);
  for (int i = 0; i < n; i++) {
    const vl_case *c = all[i];
    assert_non_null(c->check);
    for (int j = 0; c->knobs[j].name; j++) {
      const vl_knob_decl *d = &c->knobs[j];
      vl_knobs *setting = calloc(1, sizeof *setting), *rung = calloc(1, sizeof *rung);
      assert_true(setting && rung);
      assert_int_equal(vl_knob_set(d->where & VL_KNOB_RUNG ? rung : setting, d->name, "#bad"), 0);
      vl_case_env env = {.scale = "tiny", .device = VL_DEV_PLAN, .setting = setting, .quiet = 1};
      vl_status s = c->check(&env, rung);
      if (s != VL_OK) { /* a path (data_dir) takes any text */
        if (s != VL_ERR_INVALID || !strstr(env.err.msg, d->name))
          fail_msg("%s: %s=#bad: status %d, message '%s'", c->id, d->name, (int)s, env.err.msg);
        refused++;
        cJSON *o = cJSON_CreateObject();
        env.err.msg[0] = 0;
        assert_int_equal(c->plan(&env, "tiny", rung, o), VL_ERR_INVALID);
        assert_non_null(strstr(env.err.msg, d->name));
        cJSON_Delete(o);
      }
      free(setting);
      free(rung);
    }
  }
  assert_true(refused >= 40); /* all three cases' numeric, boolean, size and name knobs */
}

/* A truncated or corrupt results file gives a clear error and writes no report. */
static void test_report_rejects_corrupt_results(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("llm-lora");
  vl_ladder L;
  char res[512], md[512];
  vl_err err;
  assert_int_equal(vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, "llm-lora", &err), 0);
  write_file("res/trunc.json", "{\"schema_version\": 1, \"rungs\": [ {\"name\": \"base");
  snprintf(res, sizeof res, "%s/res/trunc.json", tmpdir);
  snprintf(md, sizeof md, "%s/res/out.md", tmpdir);
  assert_int_not_equal(vl_report_write(c, &L, res, md, &err), 0);
  assert_non_null(strstr(err.msg, "truncated or corrupt"));
  assert_int_not_equal(access(md, F_OK), 0);
  snprintf(res, sizeof res, "%s/res/missing.json", tmpdir);
  assert_int_not_equal(vl_report_write(c, &L, res, md, &err), 0);
  assert_non_null(strstr(err.msg, "cannot read"));
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
  assert_int_equal(atoi(rc), 130); /* interrupted: 128 + SIGINT, never success */
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

/* Runs `vramlab ARGS` in tmpdir: its exit status; *out gets what it printed (malloc'd). */
static int run_cli(const char *args, char **out) {
  size_t n = strlen(args) + 1024;
  char *cmd = malloc(n), path[512];
  assert_non_null(cmd);
  snprintf(path, sizeof path, "%s/cli.txt", tmpdir);
  snprintf(cmd, n, "cd '%s' && %s/vramlab %s >%s 2>&1", tmpdir, VRAMLAB_BINARY_DIR, args, path);
  int st = system(cmd);
  free(cmd);
  *out = vl_read_file(path, NULL);
  assert_non_null(*out);
  return WEXITSTATUS(st);
}

/* Loads cases/<id>/ from tmpdir after writing the two texts; asserts it fails with an
 * error containing every one of the NULL-terminated strings in expect. */
static void expect_load_error(const char *id, const char *ladder, const char *claims, const char *const *expect) {
  char rel[256];
  snprintf(rel, sizeof rel, "cases/%s/ladder.ini", id);
  write_file(rel, ladder);
  snprintf(rel, sizeof rel, "cases/%s/claims.ini", id);
  write_file(rel, claims);
  vl_ladder L;
  vl_err err = {0};
  int rc = vl_ladder_load(&L, tmpdir, id, &err);
  for (int i = 0; expect[i]; i++)
    if (rc == 0 || !strstr(err.msg, expect[i])) {
      print_error("case %s: rc %d, error '%s', expected '%s'\n", id, rc, err.msg, expect[i]);
      fail();
    }
}

/* #8 (issue 8): a --set value of 96+ characters used to fail with an empty message, so a
 * long data_dir could not be given; now real paths fit and a longer value names the knob
 * and the limit. */
static void test_set_long_values(void **state) {
  (void)state;
  vl_ladder L;
  char a[1200], v[1100];
  vl_err err = {0};
  assert_int_equal(vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, "dataloader", &err), 0);
  memset(v, 'd', 300);
  v[0] = '/';
  v[300] = 0;
  snprintf(a, sizeof a, "data_dir=%s", v);
  if (vl_ladder_set(&L, a, &err)) { print_error("--set data_dir (300 chars): '%s'\n", err.msg); fail(); }
  assert_string_equal(vl_knob_get(&L.setting, "data_dir"), v);
  memset(v, 'd', 1050);
  v[1050] = 0;
  const char *forms[] = {"data_dir=%s", "before.collate=%s", "collate=%s"};
  const char *knob[] = {"data_dir", "collate", "collate"};
  for (int i = 0; i < 3; i++) {
    snprintf(a, sizeof a, forms[i], v);
    err.msg[0] = 0;
    assert_int_not_equal(vl_ladder_set(&L, a, &err), 0);
    if (!strstr(err.msg, knob[i]) || !strstr(err.msg, "1023")) { print_error("'%.20s...': '%s'\n", a, err.msg); fail(); }
  }
}

/* --out paths longer than main.c's fixed buffers were silently cut (results written to a
 * truncated folder); now they are written where asked, and past PATH_MAX refused. */
static void test_out_path_not_truncated(void **state) {
  (void)state;
  char rel[5000] = "long", args[5200], path[6000], *out;
  while (strlen(rel) < 1000) strcat(rel, "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
  snprintf(args, sizeof args, "run dataloader --device plan --quiet --out %s", rel);
  int rc = run_cli(args, &out);
  if (rc != 0) { print_error("%s\n", out); fail(); }
  free(out);
  snprintf(path, sizeof path, "%s/%s/dataloader/latest.json", tmpdir, rel);
  assert_int_equal(access(path, F_OK), 0);
  while (strlen(rel) < 4200) strcat(rel, "/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb");
  snprintf(args, sizeof args, "run dataloader --device plan --quiet --out %s", rel);
  rc = run_cli(args, &out);
  if (rc == 0 || !strstr(out, "path too long") || !strstr(out, "4095")) { print_error("rc %d: %s\n", rc, out); fail(); }
  free(out);
}

/* #8: an empty value (--set data_dir= wrote a data set under "/") is refused for every
 * knob, on the command line and in the INI files. */
static void test_empty_values_refused(void **state) {
  (void)state;
  vl_ladder L;
  vl_err err = {0};
  assert_int_equal(vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, "dataloader", &err), 0);
  const char *sets[] = {"data_dir=", "before.workers=", "workers="};
  const char *knob[] = {"data_dir", "workers", "workers"};
  for (int i = 0; i < 3; i++) {
    err.msg[0] = 0;
    assert_int_not_equal(vl_ladder_set(&L, sets[i], &err), 0);
    if (!strstr(err.msg, knob[i]) || !strstr(err.msg, "empty")) { print_error("--set %s: '%s'\n", sets[i], err.msg); fail(); }
  }
  expect_load_error("e1", "[case]\nbatch = 2\n[a]\nx =\n", "[c]\nmetric = m\nafter = a\n",
                    (const char *const[]){"ladder.ini:4:", "'x'", "empty", NULL});
  expect_load_error("e2", "[case]\ndata_dir = ; nothing\n[a]\nx = 1\n", "[c]\nmetric = m\nafter = a\n",
                    (const char *const[]){"ladder.ini:2:", "data_dir", "empty", NULL});
  expect_load_error("e3", ladder_ok, "[c]\nmetric = m\nafter = a\nnote =\n",
                    (const char *const[]){"claims.ini:4:", "note", "empty", NULL});
}

/* #9: every number of the command line and of --set is parsed strictly and refused up
 * front, naming the option or knob (atoi read "1e3" as 1 and "90abc" as 90; a bad
 * sweep_workers was found only after the whole ladder had run). */
static void test_cli_strict_numbers(void **state) {
  (void)state;
  struct { const char *args, *expect; } cases[] = {
      {"data gen --out d1 --n 1e3", "--n"},
      {"data gen --out d2 --n 4294967297", "--n"},
      {"data gen --out d3 --n 1 --quality 90abc", "--quality"},
      {"data gen --out d4 --n 1 --seed 99999999999999999999", "--seed"},
      {"data gen --kind seg --out d5 --n 1 --size 64x", "--size"},
      {"data gen --kind seg --out d6 --n 1 --classes ' 3'", "--classes"},
      {"bench gemm --n 64x", "--n"},
      {"plan dataloader --set sweep_workers=xyz", "sweep_workers"},
      {"plan dataloader --set sweep_workers=-1", "sweep_workers"},
      {"plan dataloader --set sweep_prefetch=1,,2", "sweep_prefetch"},
      {"plan llm-lora --set ckpt.accum=4x --step ckpt", "accum"},
      {"plan seg-ckpt --set 'lr= 0.1' --step ckpt", "lr"},
      /* (report, not run: were it accepted, it would read, not write, under "/") */
      {"report dataloader --out ''", "--out"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *out;
    int rc = run_cli(cases[i].args, &out);
    if (rc != 2 || !strstr(out, cases[i].expect)) {
      print_error("`vramlab %s` exited %d and printed:\n%s\nexpected exit 2 and '%s'\n", cases[i].args, rc, out,
                  cases[i].expect);
      fail();
    }
    free(out);
  }
}

/* #22.1: data gen kept no first-use rule: it wrote beside a user's files (and, as root, into
 * "/"), and a second --kind into a set's folder overwrote its manifest and mixed the sets.
 * Now it writes only into a new or empty folder (or one holding only an interrupted
 * generation's files), the cases' rule, and leaves any other folder exactly as it was. */
static void test_data_gen_first_use(void **state) {
  (void)state;
  char *out, path[600];
  write_file("dg-user/other.txt", "mine\n");
  int rc = run_cli("data gen --out dg-user --n 2", &out);
  if (rc != 1 || !strstr(out, "--out dg-user is not empty") || !strstr(out, "other.txt")) {
    print_error("data gen into a folder with other.txt: rc %d:\n%s\n", rc, out);
    fail();
  }
  free(out);
  snprintf(path, sizeof path, "%s/dg-user/manifest.tsv", tmpdir);
  assert_int_equal(access(path, F_OK), -1); /* nothing written beside other.txt */
  snprintf(path, sizeof path, "%s/dg-user/img_0000000.jpg", tmpdir);
  assert_int_equal(access(path, F_OK), -1);
  /* a set, then another kind into its folder: refused, the manifest untouched */
  rc = run_cli("data gen --kind seg --out dg-set --n 2 --size 32", &out);
  if (rc != 0) { print_error("%s\n", out); fail(); }
  free(out);
  snprintf(path, sizeof path, "%s/dg-set/manifest.tsv", tmpdir);
  char *before = vl_read_file(path, NULL);
  assert_non_null(before);
  rc = run_cli("data gen --out dg-set --n 3", &out);
  if (rc != 1 || !strstr(out, "--out dg-set holds a data set already")) {
    print_error("a second --kind into a set's folder: rc %d:\n%s\n", rc, out);
    fail();
  }
  free(out);
  char *after = vl_read_file(path, NULL);
  assert_non_null(after);
  assert_string_equal(before, after);
  free(before);
  free(after);
  /* what an interrupted generation leaves is still taken over */
  write_file("dg-part/img_0000000.jpg", "partial");
  rc = run_cli("data gen --out dg-part --n 2", &out);
  if (rc != 0) { print_error("%s\n", out); fail(); }
  free(out);
}

/* #22.13: options that change nothing were silently ignored: --size/--classes with a kind
 * that has no size or classes, --device with plan (even "gpu", no device name), and
 * --classes 256 though seg-ckpt trains on 255 at most. Each is refused, naming the option
 * and what it applies to, before anything is made. */
static void test_unread_options_refused(void **state) {
  (void)state;
  struct { const char *args, *expect; } cases[] = {
      {"data gen --out un1 --n 1 --size 64", "--size applies to data gen --kind seg only (--kind jpeg reads"},
      {"data gen --kind captions --out un2 --n 1 --classes 3", "--classes applies to data gen --kind seg only"},
      {"plan dataloader --size 64", "--size applies to data gen --kind seg only"},
      {"plan dataloader --device gpu", "--device applies to run and bench only"},
      {"plan dataloader --device cpu", "--device applies to run and bench only"},
      {"data gen --kind seg --out un3 --n 1 --classes 256", "--classes '256' is out of range: expected an integer in [2, 255]"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *out;
    int rc = run_cli(cases[i].args, &out);
    if (rc != 2 || !strstr(out, cases[i].expect)) {
      print_error("`vramlab %s` exited %d and printed:\n%s\nexpected exit 2 and '%s'\n", cases[i].args, rc, out,
                  cases[i].expect);
      fail();
    }
    free(out);
  }
  char path[600];
  for (int k = 1; k <= 3; k++) {
    snprintf(path, sizeof path, "%s/un%d", tmpdir, k);
    assert_int_equal(access(path, F_OK), -1); /* no set made */
  }
  /* the options where they apply still work */
  char *out;
  int rc = run_cli("data gen --kind seg --out un4 --n 1 --size 32 --classes 255", &out);
  if (rc != 0) { print_error("%s\n", out); fail(); }
  free(out);
}

/* #11a: accum=4096 made llm-lora's plan step through 4096 micro-batches for every probe of
 * the batch search (minutes); it now plans a bounded number and extrapolates, with the
 * same peak and the FLOPs scaled. */
static void test_accum_plan_is_fast(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("llm-lora");
  vl_ladder L;
  vl_err err;
  assert_int_equal(vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, "llm-lora", &err), 0);
  vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L.setting, .quiet = 1};
  int k = vl_ladder_find(&L, "ckpt");
  vl_knobs kn = L.rungs[k].knobs;
  assert_int_equal(vl_knob_set(&kn, "accum", "8"), 0);
  cJSON *o8 = cJSON_CreateObject(), *o = cJSON_CreateObject();
  /* A ratio of two timings in one run, not a wall-clock limit (a loaded machine or a
   * sanitizer build slows both alike): planning every micro-batch made 4096 cost about
   * 512 times 8; planning at most 64 and adding the rest's counters costs at most ~8x. */
  double t0 = vl_now();
  assert_int_equal(c->plan(&env, "full", &kn, o8), 0);
  double dt8 = vl_now() - t0;
  assert_int_equal(vl_knob_set(&kn, "accum", "4096"), 0);
  t0 = vl_now();
  assert_int_equal(c->plan(&env, "full", &kn, o), 0);
  double dt = vl_now() - t0;
  if (dt >= 32 * dt8) {
    print_error("plan with accum=4096 took %.2f s, %.0fx accum=8's %.3f s\n", dt, dt / dt8, dt8);
    cJSON_Delete(o8);
    cJSON_Delete(o);
    fail();
  }
  assert_true(vl_rep_num(o, "peak_bytes") == vl_rep_num(o8, "peak_bytes"));
  assert_true(vl_rep_num(o, "max_batch") == vl_rep_num(o8, "max_batch"));
  double f = vl_rep_num(o, "flops_per_step"), f8 = vl_rep_num(o8, "flops_per_step");
  assert_true(fabs(f - 512 * f8) <= 1e-9 * f);
  cJSON_Delete(o8);
  cJSON_Delete(o);
}

/* #12: the INI files are strict: duplicate keys, a reopened section, NaN or infinite
 * numbers, metrics no case writes, names longer than their buffers and more rungs, knobs
 * or claims than the limits are each refused with the file and line. */
static void test_ini_strict(void **state) {
  (void)state;
  const char *cl = "[c]\nmetric = m\nafter = a\n";
  expect_load_error("s1", "[case]\nbatch = 2\n[a]\nx = 1\nx = 2\n", cl,
                    (const char *const[]){"ladder.ini:5:", "duplicate", "'x'", "line 4", NULL});
  expect_load_error("s2", "[case]\nbatch = 2\nbatch = 3\n[a]\nx = 1\n", cl,
                    (const char *const[]){"ladder.ini:3:", "duplicate", NULL});
  expect_load_error("s3", ladder_ok, "[c]\nmetric = m\nafter = a\ntol = 0.1\ntol = 0.2\n",
                    (const char *const[]){"claims.ini:5:", "duplicate", "'tol'", NULL});
  expect_load_error("s4", "[a]\nx = 1\n[b]\ny = 2\n[a]\nz = 3\n", cl,
                    (const char *const[]){"ladder.ini:5:", "[a]", "reopened", "line 1", NULL});
  expect_load_error("s5", ladder_ok, "[c]\nmetric = m\nafter = a\n[d]\nmetric = m\nafter = a\n[c]\ntol = 1\n",
                    (const char *const[]){"claims.ini:7:", "[c]", "reopened", NULL});
  expect_load_error("s6", ladder_ok, "[c]\nmetric = m\nafter = a\ntol = nan\n",
                    (const char *const[]){"claims.ini:4:", "tol", "nan", NULL});
  expect_load_error("s7", ladder_ok, "[c]\nmetric = m\nafter = a\nkind = range\nlo = inf\nhi = 2\n",
                    (const char *const[]){"claims.ini:5:", "lo", "inf", NULL});
  expect_load_error("s8", ladder_ok, "[c]\nmetric = m\nafter = a\ntol = 0x10\n",
                    (const char *const[]){"claims.ini:4:", "tol", NULL});
  expect_load_error("s9", ladder_ok, "[c]\nmetric = m\nafter = a\narticle_after = 1e999\n",
                    (const char *const[]){"claims.ini:4:", "article_after", NULL});
  /* a registered case: the claim's metric must be one the case writes */
  expect_load_error("llm-lora", ladder_ok, "[c]\nmetric = colour_bytes\nafter = a\n",
                    (const char *const[]){"claims.ini:2:", "colour_bytes", "llm-lora", NULL});
  /* names longer than their buffers are refused, not cut */
  expect_load_error("s10", "[a_rung_name_that_is_far_too_long_for_it]\nx = 1\n", cl,
                    (const char *const[]){"ladder.ini:1:", "a_rung_name_that_is_far_too_long_for_it", "31", NULL});
  expect_load_error("s11", ladder_ok, "[a_claim_id_that_is_much_too_long_for_its_buffer]\nmetric = m\nafter = a\n",
                    (const char *const[]){"claims.ini:1:", "39", NULL});
  /* the limits, named */
  char big[8192] = "", line[64];
  for (int i = 0; i < VL_MAX_RUNGS + 1; i++) {
    snprintf(line, sizeof line, "[r%c%c]\nx = 1\n", 'a' + i / 26, 'a' + i % 26);
    strcat(big, line);
  }
  expect_load_error("s12", big, "[c]\nmetric = m\nafter = raa\n", (const char *const[]){"ladder.ini:33:", "16", NULL});
  snprintf(big, sizeof big, "[a]\n");
  for (int i = 0; i < VL_MAX_KNOBS + 1; i++) {
    snprintf(line, sizeof line, "k%c%c = 1\n", 'a' + i / 26, 'a' + i % 26);
    strcat(big, line);
  }
  expect_load_error("s13", big, cl, (const char *const[]){"ladder.ini:50:", "48", NULL});
  big[0] = 0;
  for (int i = 0; i < VL_MAX_CLAIMS + 1; i++) {
    snprintf(line, sizeof line, "[c%c%c]\nmetric = m\nafter = a\n", 'a' + i / 26, 'a' + i % 26);
    strcat(big, line);
  }
  char where[32], limit[8];
  snprintf(where, sizeof where, "claims.ini:%d:", 3 * VL_MAX_CLAIMS + 1);
  snprintf(limit, sizeof limit, "%d", VL_MAX_CLAIMS);
  expect_load_error("s14", ladder_ok, big, (const char *const[]){where, limit, NULL});
  /* a key before any section header */
  expect_load_error("s15", "x = 1\n[a]\ny = 2\n", cl, (const char *const[]){"ladder.ini:1:", "section", NULL});
}

/* The one strict number parser: whole string, no whitespace or junk, exact overflow, range,
 * NaN never and infinities only when the range asks for them. */
static void test_strict_parsers(void **state) {
  (void)state;
  int64_t i;
  const char *bad_int[] = {"", " 1", "1 ", "+", "-", "1e3", "90abc", "0x10", "1.0", "4294967297x",
                           "99999999999999999999", "-9223372036854775809", "1,2", "１"};
  for (size_t k = 0; k < sizeof bad_int / sizeof *bad_int; k++)
    if (vl_parse_i64(bad_int[k], INT64_MIN, INT64_MAX, &i) == VL_PARSE_OK) { print_error("'%s' parsed\n", bad_int[k]); fail(); }
  assert_int_equal(vl_parse_i64("", 0, 9, &i), VL_PARSE_EMPTY);
  assert_int_equal(vl_parse_i64("99999999999999999999", INT64_MIN, INT64_MAX, &i), VL_PARSE_RANGE);
  assert_int_equal(vl_parse_i64("99999999999999999999x", INT64_MIN, INT64_MAX, &i), VL_PARSE_SYNTAX);
  assert_int_equal(vl_parse_i64("4294967297", 1, INT32_MAX, &i), VL_PARSE_RANGE);
  assert_int_equal(vl_parse_i64("-1", 0, 10, &i), VL_PARSE_RANGE);
  assert_int_equal(vl_parse_i64("9223372036854775807", INT64_MIN, INT64_MAX, &i), VL_PARSE_OK);
  assert_true(i == INT64_MAX);
  assert_int_equal(vl_parse_i64("-9223372036854775808", INT64_MIN, INT64_MAX, &i), VL_PARSE_OK);
  assert_true(i == INT64_MIN);
  assert_int_equal(vl_parse_i64("+007", 0, 10, &i), VL_PARSE_OK);
  assert_int_equal(i, 7);
  double d;
  const char *bad_dbl[] = {"", " 1", "1 ", ".", "e3", "1e", "1e+", "0x1p3", "nan", "NaN", "-nan", "inf", "-Infinity",
                           "1e999", "1e-400", "1.5x", "1,5"};
  for (size_t k = 0; k < sizeof bad_dbl / sizeof *bad_dbl; k++)
    if (vl_parse_f64(bad_dbl[k], -DBL_MAX, DBL_MAX, &d) == VL_PARSE_OK) { print_error("'%s' parsed\n", bad_dbl[k]); fail(); }
  assert_int_equal(vl_parse_f64("inf", -INFINITY, INFINITY, &d), VL_PARSE_OK); /* asked for */
  assert_true(isinf(d));
  assert_int_equal(vl_parse_f64("nan", -INFINITY, INFINITY, &d), VL_PARSE_RANGE); /* never */
  const char *good_dbl[] = {"3e-3", "-0.5", "12.", ".5", "1E+2", "+4", "0"};
  const double want[] = {3e-3, -0.5, 12, 0.5, 100, 4, 0};
  for (size_t k = 0; k < sizeof good_dbl / sizeof *good_dbl; k++) {
    assert_int_equal(vl_parse_f64(good_dbl[k], -DBL_MAX, DBL_MAX, &d), VL_PARSE_OK);
    assert_true(d == want[k]);
  }
  assert_int_equal(vl_parse_f64("1.5", 0, 1, &d), VL_PARSE_RANGE);
  int64_t l[4];
  int n = -1;
  assert_int_equal(vl_parse_i64_list("0,1,2,4", 0, 1024, l, 4, &n), VL_PARSE_OK);
  assert_int_equal(n, 4);
  assert_true(l[0] == 0 && l[3] == 4);
  assert_int_equal(vl_parse_i64_list("0,1,2,4,8", 0, 1024, l, 4, &n), VL_PARSE_TOO_MANY);
  assert_int_equal(vl_parse_i64_list("1,,2", 0, 9, l, 4, &n), VL_PARSE_EMPTY);
  assert_int_equal(vl_parse_i64_list("1,", 0, 9, l, 4, &n), VL_PARSE_EMPTY);
  assert_int_equal(vl_parse_i64_list("", 0, 9, l, 4, &n), VL_PARSE_EMPTY);
  assert_int_equal(vl_parse_i64_list("1, 2", 0, 9, l, 4, &n), VL_PARSE_SYNTAX);
  assert_int_equal(vl_parse_i64_list("xyz", 0, 9, l, 4, &n), VL_PARSE_SYNTAX);
  assert_int_equal(vl_parse_i64_list("-1", 0, 9, l, 4, &n), VL_PARSE_RANGE);
  /* through the knob helpers: leading blanks, hex and underflow no longer slip through */
  vl_knobs k = {0};
  vl_err err;
  long v, lv[16];
  size_t sz;
  assert_int_equal(vl_knob_set(&k, "n", " 42"), 0);
  assert_int_not_equal(vl_knob_int(&k, "n", test_decl, 0, 100, &v, &err), 0);
  assert_non_null(strstr(err.msg, "n = ' 42'"));
  assert_int_equal(vl_knob_set(&k, "f", "0x1p-1"), 0);
  assert_int_not_equal(vl_knob_double(&k, "f", test_decl, 0, 1, &d, &err), 0);
  assert_int_equal(vl_knob_set(&k, "f", "1e-400"), 0);
  assert_int_not_equal(vl_knob_double(&k, "f", test_decl, 0, 1, &d, &err), 0);
  const char *bad_bytes[] = {" 24GiB", "0x18GiB", "infGB", "-1GB", "GB", "1e999GB"};
  for (size_t j = 0; j < sizeof bad_bytes / sizeof *bad_bytes; j++) {
    assert_int_equal(vl_knob_set(&k, "s", bad_bytes[j]), 0);
    if (!vl_knob_bytes(&k, "s", test_decl, &sz, &err)) { print_error("'%s' parsed\n", bad_bytes[j]); fail(); }
  }
  assert_int_equal(vl_knob_set(&k, "s", "22.08GB"), 0);
  assert_int_equal(vl_knob_bytes(&k, "s", test_decl, &sz, &err), 0);
  assert_true(sz == 22080000000u);
  assert_int_equal(vl_knob_int_list(&k, "absent_list", test_decl, 1, 9, lv, 16, &n, &err), 0);
  assert_int_equal(n, 3);
  assert_int_equal(vl_knob_set(&k, "sw", "0,1,x"), 0);
  assert_int_not_equal(vl_knob_int_list(&k, "sw", test_decl, 0, 9, lv, 16, &n, &err), 0);
  assert_non_null(strstr(err.msg, "sw = '0,1,x'"));
}

/* vl_knob_set refuses what it cannot hold or what means nothing, with the limit. */
static void test_knob_set_limits(void **state) {
  (void)state;
  vl_knobs k = {0};
  char v[VL_KNOB_VAL_LEN + 1];
  vl_err err;
  memset(v, 'v', VL_KNOB_VAL_LEN - 1);
  v[VL_KNOB_VAL_LEN - 1] = 0;
  assert_int_equal(vl_knob_set_err(&k, "long", v, &err), 0); /* exactly the limit */
  assert_int_equal(strlen(vl_knob_get(&k, "long")), VL_KNOB_VAL_LEN - 1);
  v[VL_KNOB_VAL_LEN - 1] = 'v';
  v[VL_KNOB_VAL_LEN] = 0;
  assert_int_not_equal(vl_knob_set_err(&k, "long", v, &err), 0);
  assert_non_null(strstr(err.msg, "knob 'long'"));
  assert_non_null(strstr(err.msg, "1023"));
  assert_int_not_equal(vl_knob_set_err(&k, "a_knob_name_longer_than_the_forty_bytes_of_its_field", "1", &err), 0);
  assert_non_null(strstr(err.msg, "limit 39"));
  assert_int_not_equal(vl_knob_set_err(&k, "", "1", &err), 0);
  assert_int_not_equal(vl_knob_set_err(&k, "e", "", &err), 0);
  assert_non_null(strstr(err.msg, "empty"));
  vl_knobs full = {0};
  char name[16];
  for (int i = 0; i < VL_MAX_KNOBS; i++) {
    snprintf(name, sizeof name, "k%d", i);
    assert_int_equal(vl_knob_set(&full, name, "1"), 0);
  }
  assert_int_equal(vl_knob_set(&full, "k0", "2"), 0); /* replacing needs no room */
  assert_int_not_equal(vl_knob_set_err(&full, "one_more", "1", &err), 0);
  assert_non_null(strstr(err.msg, "limit 48"));
  /* side-plan lists: empty items and values refused */
  assert_int_not_equal(vl_knobs_apply_list(&k, "a=1,,b=2", &err), 0);
  assert_int_not_equal(vl_knobs_apply_list(&k, "a=", &err), 0);
  assert_int_equal(vl_knobs_apply_list(&k, "a=1,b=2", &err), 0);
  assert_string_equal(vl_knob_get(&k, "b"), "2");
}

/* The parse-from-memory entry point (what the fuzzer drives), its messages and the real
 * ladders and claims of every case, whose claims name only metrics the case declares. */
static void test_ladder_parse_memory(void **state) {
  (void)state;
  vl_ladder L;
  vl_err err = {0};
  assert_int_equal(vl_ladder_parse(&L, "t", ladder_ok, claims_ok, "mem", &err), 0);
  assert_int_equal(L.n_rungs, 3);
  assert_int_equal(L.n_claims, 1);
  assert_true(L.claims[0].tol == 0.1);
  assert_int_equal(vl_ladder_parse(&L, "t", "\xEF\xBB\xBF[a]\r\nx = 1\r\n", NULL, "mem", &err), 0);
  assert_string_equal(vl_knob_get(&L.rungs[0].knobs, "x"), "1");
  assert_int_not_equal(vl_ladder_parse(&L, "t", "[a]\nx = 1\n  more\n", "", "mem", &err), 0);
  assert_non_null(strstr(err.msg, "mem/ladder.ini:3:"));
  assert_int_not_equal(vl_ladder_parse(&L, "t", "[a]\nx = 1\n[b]\n", "", "mem", &err), 0);
  assert_non_null(strstr(err.msg, "mem/ladder.ini:3: section [b] has no keys"));
  assert_int_not_equal(vl_ladder_parse(&L, "t", "[a.b]\nx = 1\n", "", "mem", &err), 0);
  assert_non_null(strstr(err.msg, "ladder.ini:1:"));
  assert_int_not_equal(vl_ladder_parse(&L, "t", "[a] junk\nx = 1\n", "", "mem", &err), 0);
  assert_non_null(strstr(err.msg, "ladder.ini:1:"));
  char longline[300];
  memset(longline, 'x', 250);
  memcpy(longline, "[a]\nk = ", 8);
  longline[250] = 0;
  assert_int_not_equal(vl_ladder_parse(&L, "t", longline, "", "mem", &err), 0);
  assert_non_null(strstr(err.msg, "ladder.ini:2: line is 246 characters long (limit 199)"));
  assert_int_not_equal(vl_ladder_parse(&L, "t", ladder_ok, "[c]\nmetric = m\nafter = a\nbefore_set = lr=\n", "mem", &err), 0);
  assert_non_null(strstr(err.msg, "claims.ini:4:"));
  assert_int_not_equal(vl_ladder_parse(&L, "t", ladder_ok, "[c]\nmetric = m\nafter = a\nkind = range\nlo = 2\nhi = 1\n", "mem", &err), 0);
  assert_non_null(strstr(err.msg, "lo <= hi"));
  assert_int_not_equal(vl_ladder_parse(&L, "t", ladder_ok, "[c]\nmetric = m\nafter = a\ntol = -1\n", "mem", &err), 0);
  assert_non_null(strstr(err.msg, "claims.ini:4:"));
  int n;
  const vl_case *const *all = vl_case_all(&n);
  for (int i = 0; i < n; i++) {
    const vl_case *c = all[i];
    if (vl_ladder_load(&L, VRAMLAB_SOURCE_DIR, c->id, &err)) { print_error("%s: %s\n", c->id, err.msg); fail(); }
    assert_non_null(c->metrics);
    assert_non_null(c->check);
    /* every number a rung's plan writes is a declared metric (claims may rely on it) */
    vl_case_env env = {.scale = "tiny", .device = VL_DEV_PLAN, .setting = &L.setting, .quiet = 1};
    for (int r = 0; r < L.n_rungs; r++) {
      assert_int_equal(c->check(&env, &L.rungs[r].knobs), 0);
      cJSON *o = cJSON_CreateObject(), *it;
      assert_int_equal(c->plan(&env, "tiny", &L.rungs[r].knobs, o), 0);
      cJSON_ArrayForEach(it, o) {
        if (!cJSON_IsNumber(it) && !cJSON_IsBool(it)) continue;
        bool found = false;
        for (int m = 0; c->metrics[m]; m++) found |= !strcmp(c->metrics[m], it->string);
        if (!found) { print_error("%s plans '%s', not in its metrics list\n", c->id, it->string); fail(); }
      }
      cJSON_Delete(o);
    }
  }
}

/* The command line: unknown case, unknown step and bad values exit non-zero with a message. */
static void test_cli_errors(void **state) {
  (void)state;
  struct { const char *args, *expect; int rc; } cases[] = {
      {"plan nosuch", "unknown case 'nosuch'", 2},
      {"plan llm-lora --step nosuch", "unknown step 'nosuch'", 2},
      /* knob values are checked for every rung before anything is planned or run: exit 2 */
      /* a case's message (vl_case_fail, in its env) as the harness prints it */
      {"plan llm-lora --set after.optimizer=lion --step after",
       "vramlab: rung 'after': optimizer = 'lion': expected adamw, adafactor or sgd\n", 2},
      {"plan llm-lora --set ckpt.colour=red", "vramlab: rung 'ckpt': unknown knob 'colour' (known: compute,", 2},
      {"plan llm-lora --set cuda_context=30GiB", "vramlab: cuda_context must be smaller than the card\n", 2},
      {"run llm-lora --device tpu", "unknown device 'tpu'", 2},
      {"plan llm-lora --scale huge", "unknown scale 'huge'", 2},
      {"plan seg-ckpt --set ckpt.workers=-1 --step ckpt", "workers", 2},
      {"run seg-ckpt --device cpu --scale full --step before",
       "vramlab: run before: a full-scale (512x512 ResNet-101) step is too slow for this CPU: use --scale small or "
       "tiny, or --device plan\n", 1},
      {"frobnicate", "unknown command", 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *t;
    int rc = run_cli(cases[i].args, &t);
    if (!strstr(t, cases[i].expect)) {
      print_error("`vramlab %s` printed:\n%s\nexpected '%s'\n", cases[i].args, t, cases[i].expect);
      fail();
    }
    assert_int_equal(rc, cases[i].rc);
    free(t);
  }
}

/* `vramlab list --json`: every registered case with its scales, every rung of its ladder
 * (resolved knobs), and every knob and setting with its declared default and help. */
static void test_list_json(void **state) {
  (void)state;
  char *t;
  assert_int_equal(run_cli("list --json", &t), 0);
  cJSON *o = cJSON_Parse(t);
  if (!o) { print_error("not JSON:\n%s\n", t); fail(); }
  free(t);
  cJSON *cases = cJSON_GetObjectItem(o, "cases");
  int n;
  const vl_case *const *all = vl_case_all(&n);
  assert_int_equal(cJSON_GetArraySize(cases), n);
  vl_ladder *L = malloc(sizeof *L);
  assert_non_null(L);
  vl_err err;
  for (int i = 0; i < n; i++) {
    cJSON *c = cJSON_GetArrayItem(cases, i);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(c, "id")), all[i]->id);
    assert_true(cJSON_GetArraySize(cJSON_GetObjectItem(c, "scales")) >= 1);
    assert_int_equal(vl_ladder_load(L, VRAMLAB_SOURCE_DIR, all[i]->id, &err), 0);
    cJSON *rungs = cJSON_GetObjectItem(c, "rungs");
    assert_int_equal(cJSON_GetArraySize(rungs), L->n_rungs);
    for (int j = 0; j < L->n_rungs; j++) {
      cJSON *r = cJSON_GetArrayItem(rungs, j);
      assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), L->rungs[j].name);
      assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(r, "label")), L->rungs[j].label);
      cJSON *kn = cJSON_GetObjectItem(r, "knobs");
      assert_int_equal(cJSON_GetArraySize(kn), L->rungs[j].knobs.n); /* inherited ones too */
      for (int k = 0; k < L->rungs[j].knobs.n; k++)
        assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(kn, L->rungs[j].knobs.k[k].key)),
                            L->rungs[j].knobs.k[k].val);
    }
    /* every declaration, with help; every setting of the ladder is one of them */
    cJSON *decl = cJSON_GetObjectItem(c, "knobs"), *d;
    int nd = 0;
    cJSON_ArrayForEach(d, decl) {
      assert_true(cJSON_IsString(cJSON_GetObjectItem(d, "help")));
      assert_true(cJSON_IsBool(cJSON_GetObjectItem(d, "rung")) && cJSON_IsBool(cJSON_GetObjectItem(d, "setting")));
      nd++;
    }
    int want = 0;
    for (int j = 0; all[i]->knobs[j].name; j++) want++;
    for (int j = 0; vl_harness_settings[j].name; j++) want++;
    assert_int_equal(nd, want);
    for (int k = 0; k < L->setting.n; k++) assert_non_null(vl_case_knob(all[i], L->setting.k[k].key, VL_KNOB_SETTING));
  }
  /* a known default: llm-lora's timed steps, a setting, and its LoRA alpha, a rung knob */
  cJSON *llm = cJSON_GetArrayItem(cases, 0), *d;
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(llm, "id")), "llm-lora");
  int seen = 0;
  cJSON_ArrayForEach(d, cJSON_GetObjectItem(llm, "knobs")) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(d, "name"));
    if (!strcmp(name, "steps")) {
      assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(d, "default")), "12");
      assert_true(cJSON_IsTrue(cJSON_GetObjectItem(d, "setting")) && cJSON_IsFalse(cJSON_GetObjectItem(d, "rung")));
      seen++;
    }
    if (!strcmp(name, "lora_alpha")) {
      assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(d, "default")), "16");
      assert_true(cJSON_IsTrue(cJSON_GetObjectItem(d, "rung")));
      seen++;
    }
  }
  assert_int_equal(seen, 2);
  cJSON_Delete(o);
  free(L);

  /* one case, as JSON and as text; an unknown one names the known ones, exit 2 */
  assert_int_equal(run_cli("list seg-ckpt --json", &t), 0);
  o = cJSON_Parse(t);
  assert_non_null(o);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "cases")), 1);
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "cases"), 0), "id")),
                      "seg-ckpt");
  cJSON_Delete(o);
  free(t);
  assert_int_equal(run_cli("list dataloader", &t), 0);
  assert_non_null(strstr(t, "dataloader"));
  assert_null(strstr(t, "llm-lora"));
  assert_non_null(strstr(t, "consumer_ms"));
  free(t);
  assert_int_equal(run_cli("list nosuch", &t), 2);
  assert_non_null(strstr(t, "unknown case 'nosuch'"));
  assert_non_null(strstr(t, "llm-lora"));
  free(t);
  assert_int_equal(run_cli("list nosuch --json", &t), 2);
  free(t);
}

/* Every declared default is a value its case accepts, and is the one its parse uses: a
 * plan with every default written out equals the plan with none (one definition). */
static void test_declared_defaults(void **state) {
  (void)state;
  int n;
  const vl_case *const *all = vl_case_all(&n);
  vl_err err;
  for (int i = 0; i < n; i++) {
    const vl_case *c = all[i];
    vl_knobs *setting = calloc(1, sizeof *setting), *rung = calloc(1, sizeof *rung), *none = calloc(1, sizeof *none);
    assert_true(setting && rung && none);
    for (int j = 0; c->knobs[j].name; j++) {
      const vl_knob_decl *d = &c->knobs[j];
      assert_true(d->help && *d->help && d->where);
      assert_ptr_equal(vl_knob_decl_find(c->knobs, d->name), d); /* declared once */
      if (!d->def) continue;
      if (d->where & VL_KNOB_SETTING) assert_int_equal(vl_knob_set(setting, d->name, d->def), 0);
      if (d->where & VL_KNOB_RUNG) assert_int_equal(vl_knob_set(rung, d->name, d->def), 0);
    }
    vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = setting, .quiet = 1};
    vl_case_env env0 = {.scale = "full", .device = VL_DEV_PLAN, .setting = none, .quiet = 1};
    if (c->check && c->check(&env, rung)) fail_msg("%s: a declared default is refused: %s", c->id, env.err.msg);
    assert_int_equal(vl_case_check_knobs(&env, c, "defaults", rung), 0);
    cJSON *a = cJSON_CreateObject(), *b = cJSON_CreateObject();
    assert_int_equal(c->plan(&env, "tiny", rung, a), 0);
    assert_int_equal(c->plan(&env0, "tiny", none, b), 0);
    tu_strip_timings(a);
    tu_strip_timings(b);
    char *sa = cJSON_PrintUnformatted(a), *sb = cJSON_PrintUnformatted(b);
    if (strcmp(sa, sb)) fail_msg("%s: defaults written out plan differently:\n%s\n%s", c->id, sa, sb);
    free(sa); free(sb);
    cJSON_Delete(a);
    cJSON_Delete(b);
    free(setting); free(rung); free(none);
  }
  /* a table without the key: absent is an error naming it, never a silent 0 */
  vl_knobs k = {0};
  long v;
  assert_int_not_equal(vl_knob_int(&k, "ghost", test_decl, 0, 9, &v, &err), 0);
  assert_non_null(strstr(err.msg, "ghost"));
}

/* [case] settings are declared: a typo in ladder.ini (with its line) or in --set is refused
 * like an unknown rung knob; a declared setting the ladder leaves out can be --set. */
static void test_unknown_setting_refused(void **state) {
  (void)state;
  vl_ladder *L = malloc(sizeof *L);
  assert_non_null(L);
  vl_err err;
  const char *claims = "";
  assert_int_not_equal(vl_ladder_parse(L, "llm-lora", "[case]\nsteps = 4\nstpes = 4\n[a]\nlr = 1e-3\n", claims,
                                       "x", &err), 0);
  assert_non_null(strstr(err.msg, "ladder.ini:3"));
  assert_non_null(strstr(err.msg, "unknown setting 'stpes'"));
  assert_non_null(strstr(err.msg, "steps")); /* the known ones */
  /* an unregistered case id reads anything (the harness tests' own ladders) */
  assert_int_equal(vl_ladder_parse(L, "t-any", "[case]\nstpes = 4\n[a]\nx = 1\n", claims, "x", &err), 0);
  assert_int_equal(vl_ladder_load(L, VRAMLAB_SOURCE_DIR, "llm-lora", &err), 0);
  assert_int_not_equal(vl_ladder_set(L, "stpes=4", &err), 0);
  assert_non_null(strstr(err.msg, "'stpes' is neither a knob nor a setting of llm-lora"));
  /* declared as a setting, not in the ladder: goes to the setting, not to the rungs */
  assert_null(vl_knob_get(&L->setting, "cuda_context"));
  assert_int_equal(vl_ladder_set(L, "cuda_context=1GiB", &err), 0);
  assert_string_equal(vl_knob_get(&L->setting, "cuda_context"), "1GiB");
  assert_null(vl_knob_get(&L->rungs[0].knobs, "cuda_context"));
  /* a rung knob still goes to every rung */
  assert_int_equal(vl_ladder_set(L, "clip=0.5", &err), 0);
  assert_string_equal(vl_knob_get(&L->rungs[L->n_rungs - 1].knobs, "clip"), "0.5");
  free(L);
  char *t;
  assert_int_equal(run_cli("plan llm-lora --set stpes=4", &t), 2);
  assert_non_null(strstr(t, "neither a knob nor a setting"));
  free(t);
  assert_int_equal(run_cli("plan dataloader --vram 24GiB", &t), 2);
  assert_non_null(strstr(t, "--vram"));
  free(t);
}

/* The dataloader's host_bytes_bound has one definition: the plan's number is the run's
 * (the loader's own stat) for several loader configurations. */
static void test_host_bytes_bound_plan_equals_run(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("dataloader");
  assert_non_null(c);
  char root[300];
  vl_err err;
  snprintf(root, sizeof root, "%s/bound-set", tmpdir);
  vl_knobs setting = {0};
  vl_knob_set(&setting, "data_dir", root);
  vl_knob_set(&setting, "images", "8");
  vl_knob_set(&setting, "data_seed", "3");
  vl_knob_set(&setting, "batch", "2");
  vl_knob_set(&setting, "crop", "16");
  vl_knob_set(&setting, "epochs", "1");
  vl_knob_set(&setting, "consumer_ms", "0");
  vl_case_env env = {.scale = "tiny", .device = VL_DEV_CPU, .setting = &setting, .quiet = 1};
  const char *cfgs[] = {"workers=0,prefetch=1", "workers=1,prefetch=3,collate=batched",
                        "workers=2,prefetch=2,corrupt=skip", "workers=3,prefetch=1,persistent=true"};
  double prev = 0;
  for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
    vl_knobs k = {0};
    assert_int_equal(vl_knobs_apply_list(&k, cfgs[i], &err), 0);
    cJSON *p = cJSON_CreateObject(), *r = cJSON_CreateObject();
    assert_int_equal(c->plan(&env, "tiny", &k, p), 0);
    if (c->run(&env, &k, 0, r)) fail_msg("run %s: %s", cfgs[i], env.err.msg);
    double planned = cJSON_GetNumberValue(cJSON_GetObjectItem(p, "host_bytes_bound"));
    double ran = cJSON_GetNumberValue(cJSON_GetObjectItem(r, "host_bytes_bound"));
    if (planned != ran) fail_msg("%s: planned %.0f, the run's loader %.0f", cfgs[i], planned, ran);
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(r, "host_bytes_peak")) <= ran);
    assert_true(planned != prev); /* the configurations differ in their bound */
    prev = planned;
    cJSON_Delete(p);
    cJSON_Delete(r);
  }
  /* #19: a rung's batch (a claim's side plan) wins over the setting's: the bound scales */
  vl_knobs k1 = {0}, k4 = {0};
  assert_int_equal(vl_knobs_apply_list(&k1, "workers=2,prefetch=2", &err), 0);
  assert_int_equal(vl_knobs_apply_list(&k4, "workers=2,prefetch=2,batch=8", &err), 0);
  cJSON *p1 = cJSON_CreateObject(), *p4 = cJSON_CreateObject();
  env.scale = "small";
  assert_int_equal(c->plan(&env, "small", &k1, p1), 0);
  assert_int_equal(c->plan(&env, "small", &k4, p4), 0);
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(p1, "batch")) == 2);
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(p4, "batch")) == 8);
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(p4, "batch_bytes")) ==
              4 * cJSON_GetNumberValue(cJSON_GetObjectItem(p1, "batch_bytes")));
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(p4, "host_bytes_bound")) >
              cJSON_GetNumberValue(cJSON_GetObjectItem(p1, "host_bytes_bound")));
  cJSON_Delete(p1);
  cJSON_Delete(p4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ladder_inherits),  cmocka_unit_test(test_ladder_errors),
      cmocka_unit_test(test_knob_parsing),     cmocka_unit_test(test_verdicts),
      cmocka_unit_test(test_verdict_equal_ends), cmocka_unit_test(test_verdict_noise),
      cmocka_unit_test(test_verdict_magnitude), cmocka_unit_test(test_verdict_far_beyond),
      cmocka_unit_test(test_verdict_basis),
      cmocka_unit_test(test_stats_and_atomic_write), cmocka_unit_test(test_llm_plan_fields),
      cmocka_unit_test(test_cli_errors), cmocka_unit_test(test_report_rejects_corrupt_results),
      cmocka_unit_test(test_interrupted_run_keeps_results),
      cmocka_unit_test(test_oom_rung_is_a_result), cmocka_unit_test(test_seg_plan_fields),
      cmocka_unit_test(test_set_long_values), cmocka_unit_test(test_out_path_not_truncated),
      cmocka_unit_test(test_empty_values_refused), cmocka_unit_test(test_cli_strict_numbers),
      cmocka_unit_test(test_data_gen_first_use), cmocka_unit_test(test_unread_options_refused),
      cmocka_unit_test(test_accum_plan_is_fast), cmocka_unit_test(test_ini_strict),
      cmocka_unit_test(test_strict_parsers), cmocka_unit_test(test_knob_set_limits),
      cmocka_unit_test(test_ladder_parse_memory),
      cmocka_unit_test(test_list_json), cmocka_unit_test(test_declared_defaults),
      cmocka_unit_test(test_unknown_setting_refused), cmocka_unit_test(test_host_bytes_bound_plan_equals_run),
      cmocka_unit_test(test_case_error_convention), cmocka_unit_test(test_case_hooks_return_status),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
