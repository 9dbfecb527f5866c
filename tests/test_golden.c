/* Golden plan snapshots: every rung of every case planned at full scale equals, field by
 * field, tests/golden/<case>.json (what `vramlab plan CASE --json` printed when it was made
 * with tools/make_golden.sh). Refactors of the engine keep every planned byte and FLOP. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "testutil.h"

/* Timings (plan_seconds, ...) are measurements, never part of a snapshot. */
static int is_timing(const char *key) {
  size_t n = strlen(key);
  return n > 8 && !strcmp(key + n - 8, "_seconds");
}

/* First difference between two JSON values, as a path into buf; 0 when equal. */
static int json_diff(const cJSON *want, const cJSON *got, const char *path, char *buf, size_t n) {
  if (!got) { snprintf(buf, n, "%s: missing (golden has it)", path); return 1; }
  if ((want->type & 0xff) != (got->type & 0xff)) { snprintf(buf, n, "%s: type differs", path); return 1; }
  if (cJSON_IsObject(want)) {
    const cJSON *w;
    cJSON_ArrayForEach(w, want) {
      if (is_timing(w->string)) continue;
      char p[512];
      snprintf(p, sizeof p, "%s.%s", path, w->string);
      if (json_diff(w, cJSON_GetObjectItemCaseSensitive(got, w->string), p, buf, n)) return 1;
    }
    const cJSON *g;
    cJSON_ArrayForEach(g, got)
      if (!is_timing(g->string) && !cJSON_GetObjectItemCaseSensitive(want, g->string)) {
        snprintf(buf, n, "%s.%s: new field (not in the golden file)", path, g->string);
        return 1;
      }
    return 0;
  }
  if (cJSON_IsArray(want)) {
    int nw = cJSON_GetArraySize(want), ng = cJSON_GetArraySize(got);
    if (nw != ng) { snprintf(buf, n, "%s: %d items, golden %d", path, ng, nw); return 1; }
    for (int i = 0; i < nw; i++) {
      char p[512];
      snprintf(p, sizeof p, "%s[%d]", path, i);
      if (json_diff(cJSON_GetArrayItem(want, i), cJSON_GetArrayItem(got, i), p, buf, n)) return 1;
    }
    return 0;
  }
  if (cJSON_IsNumber(want)) {
    /* Integers (bytes, counts, FLOPs) exactly. Fractions (a least-squares fit, a share)
     * to 1e-12 relative: cJSON prints 15 digits when they read back within an ulp, and a
     * Debug build without FMA contraction rounds a fit differently in the last bits. */
    double w = want->valuedouble, g = got->valuedouble;
    bool integral = w == floor(w) && fabs(w) < 9007199254740992.0;
    if (integral ? w != g : !(fabs(w - g) <= 1e-12 * fabs(w))) {
      snprintf(buf, n, "%s: %.17g, golden %.17g", path, got->valuedouble, want->valuedouble);
      return 1;
    }
    return 0;
  }
  if (cJSON_IsString(want) && strcmp(want->valuestring, got->valuestring)) {
    snprintf(buf, n, "%s: '%s', golden '%s'", path, got->valuestring, want->valuestring);
    return 1;
  }
  return 0;
}

static void check_case(const char *id) {
  const vl_case *c = vl_case_find(id);
  assert_non_null(c);
  vl_ladder *L = malloc(sizeof *L); /* large: not on the stack */
  assert_non_null(L);
  char path[512];
  vl_err err = {0};
  if (vl_ladder_load(L, VRAMLAB_SOURCE_DIR, id, &err)) fail_msg("%s", err.msg);
  snprintf(path, sizeof path, "%s/tests/golden/%s.json", VRAMLAB_SOURCE_DIR, id);
  uint8_t *text;
  size_t n = tu_slurp(path, &text);
  cJSON *golden = cJSON_ParseWithLength((const char *)text, n);
  free(text);
  assert_non_null(golden);
  assert_int_equal(cJSON_GetArraySize(golden), L->n_rungs);
  /* a case that resolves workers=cores plans for 2 cores, the machine the snapshot was
   * made on, wherever the test runs */
  for (const vl_knob_decl *d = c->knobs; d->name; d++)
    if (!strcmp(d->name, "cores")) assert_int_equal(vl_knob_set(&L->setting, "cores", "2"), 0);
  vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L->setting, .quiet = 1};
  for (int i = 0; i < L->n_rungs; i++) {
    cJSON *o = cJSON_CreateObject();
    if (c->plan(&env, "full", &L->rungs[i].knobs, o)) fail_msg("%s %s: %s", id, L->rungs[i].name, env.err.msg);
    /* what `vramlab plan --json` leaves out */
    cJSON_DeleteItemFromObject(o, "timeline");
    cJSON_DeleteItemFromObject(o, "batch_curve");
    char where[128], diff[1024];
    snprintf(where, sizeof where, "%s.%s", id, L->rungs[i].name);
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(golden, L->rungs[i].name);
    if (!want) fail_msg("%s: rung not in %s", where, path);
    if (json_diff(want, o, where, diff, sizeof diff)) fail_msg("plan differs from the golden snapshot: %s", diff);
    cJSON_Delete(o);
  }
  cJSON_Delete(golden);
  free(L);
}

static void test_golden_llm_lora(void **state) {
  (void)state;
  check_case("llm-lora");
}
static void test_golden_seg_ckpt(void **state) {
  (void)state;
  check_case("seg-ckpt");
}
static void test_golden_sd_lora(void **state) {
  (void)state;
  check_case("sd-lora");
}
static void test_golden_dataloader(void **state) {
  (void)state;
  check_case("dataloader");
}

/* Every registered case has its snapshot (a new case comes with one: tools/make_golden.sh). */
static void test_golden_every_case_has_one(void **state) {
  (void)state;
  int n;
  const vl_case *const *all = vl_case_all(&n);
  for (int i = 0; i < n; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/%s.json", VRAMLAB_SOURCE_DIR, all[i]->id);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("case %s has no golden plan snapshot %s (tools/make_golden.sh)", all[i]->id, path);
    fclose(f);
  }
}

/* ...and every snapshot matches, the cases registered after the four above included
 * (multi-gpu: per-rank plans of the data-parallel wrapper). */
static void test_golden_every_case_matches(void **state) {
  (void)state;
  int n;
  const vl_case *const *all = vl_case_all(&n);
  for (int i = 0; i < n; i++) check_case(all[i]->id);
}

/* The comparison itself can fail: a changed byte count is found and named. */
static void test_golden_diff_finds_a_change(void **state) {
  (void)state;
  cJSON *a = cJSON_Parse("{\"x\":{\"peak_bytes\":100,\"by\":[1,2]},\"s\":\"a\"}");
  cJSON *b = cJSON_Parse("{\"x\":{\"peak_bytes\":101,\"by\":[1,2]},\"s\":\"a\"}");
  cJSON *c = cJSON_Parse("{\"x\":{\"peak_bytes\":100,\"by\":[1,2],\"new\":1},\"s\":\"a\"}");
  char d[256];
  assert_int_equal(json_diff(a, a, "r", d, sizeof d), 0);
  assert_int_equal(json_diff(a, b, "r", d, sizeof d), 1);
  assert_non_null(strstr(d, "r.x.peak_bytes"));
  assert_int_equal(json_diff(a, c, "r", d, sizeof d), 1);
  assert_non_null(strstr(d, "new"));
  cJSON_Delete(a);
  cJSON_Delete(b);
  cJSON_Delete(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_diff_finds_a_change),
      cmocka_unit_test(test_golden_llm_lora),
      cmocka_unit_test(test_golden_seg_ckpt),
      cmocka_unit_test(test_golden_sd_lora),
      cmocka_unit_test(test_golden_dataloader),
      cmocka_unit_test(test_golden_every_case_has_one),
      cmocka_unit_test(test_golden_every_case_matches),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
