/* Report hardening (issue #8): a results file that users share can neither run a command
 * through the gnuplot scripts, crash or hang `vramlab report`, be judged as another case's,
 * nor leave half-written artifacts behind when the disk fills or gnuplot fails. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "testutil.h"

static const char *case_ids[] = {"llm-lora", "seg-ckpt", "dataloader"};
#define N_CASES 3

static int setup(void **state) {
  (void)state;
  return tu_tmpdir(tu_tmp, sizeof tu_tmp, "vl-test-report-");
}

static const vl_case *load(const char *id, vl_ladder *L) {
  const vl_case *c = vl_case_find(id);
  assert_non_null(c);
  vl_err err;
  assert_int_equal(vl_ladder_load(L, VRAMLAB_SOURCE_DIR, id, &err), 0);
  return c;
}

/* A fresh folder tu_tmp/name (removed first) into buf. */
static void fresh_dir(char *buf, size_t n, const char *name) {
  tu_join(buf, n, tu_tmp, name);
  tu_rmtree(buf);
  assert_int_equal(vl_mkdir_p(buf), 0);
}

static bool have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* (not inlined: gcc then takes the returned text for a pointer to the local) */
static __attribute__((noinline)) char *read_text(const char *path) {
  uint8_t *t;
  size_t n = tu_slurp(path, &t);
  t[n] = 0; /* tu_slurp leaves a spare byte */
  return (char *)t;
}

/* [[0, 0], [1, step], ...] */
static cJSON *pairs(int n, double step) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) {
    cJSON *p = cJSON_CreateArray();
    cJSON_AddItemToArray(p, cJSON_CreateNumber(i));
    cJSON_AddItemToArray(p, cJSON_CreateNumber(step * i));
    cJSON_AddItemToArray(a, p);
  }
  return a;
}

/* A results file of case c that the report accepts: every rung planned and run once, with
 * the fields the case's report reads. */
static cJSON *results_for(const vl_case *c, const vl_ladder *L) {
  cJSON *res = cJSON_CreateObject();
  cJSON_AddNumberToObject(res, "schema_version", 1);
  cJSON_AddStringToObject(res, "case", c->id);
  cJSON *env = cJSON_AddObjectToObject(res, "env");
  cJSON_AddStringToObject(env, "device", "cpu");
  cJSON_AddStringToObject(env, "cpu", "test cpu");
  cJSON_AddNumberToObject(env, "cores", 2);
  cJSON_AddStringToObject(env, "gpu", "none");
  cJSON_AddStringToObject(env, "git_commit", "abc1234");
  cJSON_AddStringToObject(env, "time", "2024-01-01T00:00:00Z");
  cJSON_AddStringToObject(res, "run_scale", "tiny");
  cJSON_AddNumberToObject(res, "sgemm_flops_per_s", 1e11);
  cJSON *rungs = cJSON_AddArrayToObject(res, "rungs");
  for (int i = 0; i < L->n_rungs; i++) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "name", L->rungs[i].name);
    cJSON_AddStringToObject(r, "label", L->rungs[i].label);
    cJSON *p = cJSON_AddObjectToObject(r, "plan");
    cJSON_AddNumberToObject(p, "batch", 2);
    cJSON_AddNumberToObject(p, "accum", 1);
    cJSON_AddNumberToObject(p, "seq", 512);
    cJSON_AddNumberToObject(p, "peak_bytes", 2e10 - 1e9 * i);
    cJSON_AddNumberToObject(p, "cap_bytes", 2.2e10);
    cJSON_AddNumberToObject(p, "acts_bytes", 1e9);
    cJSON_AddBoolToObject(p, "fits", 1);
    cJSON_AddNumberToObject(p, "max_batch", 4);
    cJSON *bc = cJSON_AddObjectToObject(p, "by_category");
    cJSON_AddNumberToObject(bc, "params", 1e10);
    cJSON_AddNumberToObject(bc, "acts", 1e9);
    cJSON_AddItemToObject(p, "timeline", pairs(20, 1e8));
    cJSON_AddItemToObject(p, "batch_curve", pairs(4, 2e9));
    cJSON *runs = cJSON_AddArrayToObject(r, "runs");
    cJSON *ro = cJSON_CreateObject();
    cJSON_AddNumberToObject(ro, "batch", 2);
    cJSON_AddNumberToObject(ro, "accum", 1);
    cJSON *st = cJSON_AddObjectToObject(ro, "step_time");
    cJSON_AddNumberToObject(st, "median", 0.1);
    cJSON_AddNumberToObject(st, "min", 0.09);
    cJSON_AddNumberToObject(st, "max", 0.12);
    double s[] = {0.1, 0.09, 0.12}, loss[] = {2.0, 1.5}, acc[] = {0.5, 0.6};
    cJSON_AddItemToObject(st, "samples", cJSON_CreateDoubleArray(s, 3));
    cJSON_AddItemToObject(ro, "loss", cJSON_CreateDoubleArray(loss, 2));
    cJSON_AddItemToObject(ro, "pixel_accuracy_per_epoch", cJSON_CreateDoubleArray(acc, 2));
    cJSON_AddNumberToObject(ro, "tokens_per_s", 1000);
    cJSON_AddNumberToObject(ro, "sec_per_token", 1e-3 * (i + 1));
    cJSON_AddNumberToObject(ro, "images_per_s", 100);
    cJSON_AddNumberToObject(ro, "data_wait_frac", 0.1);
    cJSON_AddNumberToObject(ro, "workers", 2);
    cJSON_AddNumberToObject(ro, "prefetch", 2);
    cJSON_AddNumberToObject(ro, "measured_peak_bytes", 1e8);
    cJSON_AddNumberToObject(ro, "planned_peak_bytes", 1e8);
    cJSON_AddBoolToObject(ro, "plan_matches_measured", 1);
    cJSON_AddItemToArray(runs, ro);
    cJSON_AddItemToArray(rungs, r);
  }
  cJSON *cm = cJSON_AddObjectToObject(res, "case_metrics");
  cJSON_AddNumberToObject(cm, "cores", 2);
  cJSON_AddNumberToObject(cm, "decode_images_per_s_per_core", 100);
  cJSON *sweep = cJSON_AddArrayToObject(res, "sweep");
  for (int w = 0; w < 3; w++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "workers", w);
    cJSON_AddNumberToObject(o, "prefetch", 2);
    cJSON_AddNumberToObject(o, "images_per_s", 100 * (w + 1));
    cJSON_AddNumberToObject(o, "cpu_util", 0.5);
    cJSON_AddItemToArray(sweep, o);
  }
  return res;
}

static void save(const char *path, const cJSON *res) {
  char *t = cJSON_Print(res);
  assert_non_null(t);
  tu_write_text(path, t);
  free(t);
}

/* Sets the value at a path like "rungs[2].plan.timeline[0]" to the JSON text v; NULL
 * deletes it. */
static void jset(cJSON *root, const char *path, const char *v) {
  cJSON *parent = NULL, *cur = root;
  char key[64] = "";
  int idx = -1;
  const char *p = path;
  while (*p) {
    parent = cur;
    if (*p == '[') {
      idx = atoi(p + 1);
      key[0] = 0;
      p = strchr(p, ']') + 1;
      cur = cJSON_GetArrayItem(parent, idx);
    } else {
      if (*p == '.') p++;
      size_t n = strcspn(p, ".[");
      assert_true(n < sizeof key);
      memcpy(key, p, n);
      key[n] = 0;
      p += n;
      cur = cJSON_GetObjectItem(parent, key);
    }
    if (*p) assert_non_null(cur);
  }
  cJSON *nv = v ? cJSON_Parse(v) : NULL;
  if (v) assert_non_null(nv);
  if (key[0]) {
    cJSON_DeleteItemFromObject(parent, key);
    if (nv) cJSON_AddItemToObject(parent, key, nv);
  } else if (nv) {
    cJSON_ReplaceItemInArray(parent, idx, nv);
  } else {
    cJSON_DeleteItemFromArray(parent, idx);
  }
}

/* Whether text holds tok as a word of its own ("nan" in "| nan |", not in "finance"). */
static bool has_word(const char *text, const char *tok) {
  size_t n = strlen(tok);
  for (const char *p = strstr(text, tok); p; p = strstr(p + 1, tok)) {
    bool left = p == text || !((p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= 'A' && p[-1] <= 'Z'));
    char r = p[n];
    bool right = !((r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'));
    if (left && right) return true;
  }
  return false;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

/* A PNG that gnuplot finished: the signature and the IEND chunk as its last 12 bytes. */
static bool png_complete(const char *path) {
  uint8_t *b;
  size_t n = tu_slurp(path, &b);
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  static const uint8_t iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
  bool ok = n >= 20 && !memcmp(b, sig, 8) && !memcmp(b + n - 12, iend, 12);
  free(b);
  return ok;
}

/* No gnuplot script in dir calls system() or holds a string broken over lines, no data file
 * holds a quote, every PNG is whole and no temp file is left behind. */
static void assert_artifacts_safe(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    char path[1024];
    tu_join(path, sizeof path, dir, e->d_name);
    if (strstr(e->d_name, ".tmp")) {
      print_error("temp file left behind: %s\n", path);
      fail();
    }
    if (ends_with(e->d_name, ".png") && !png_complete(path)) {
      print_error("truncated PNG: %s\n", path);
      fail();
    }
    bool gp = ends_with(e->d_name, ".gp"), dat = ends_with(e->d_name, ".dat");
    if (!gp && !dat) continue;
    char *t = read_text(path);
    if (strchr(t, '`') || strchr(t, '@') || (dat && (strchr(t, '\'') || strchr(t, '"')))) {
      print_error("%s holds a backquote, a macro or (data) a quote:\n%s\n", path, t);
      fail();
    }
    /* outside quoted strings (where a name may read "system(...)" harmlessly) no command;
     * no quoted string runs into the next line */
    int sq = 0, dq = 0;
    for (const char *p = t; *p; p++) {
      if (*p == '\'' && !dq) sq ^= 1;
      else if (*p == '"' && !sq) dq ^= 1;
      else if (*p == '\n' && (sq || dq)) {
        print_error("%s: a quoted string runs past a line end:\n%s\n", path, t);
        fail();
      } else if (gp && !sq && !dq && !strncmp(p, "system", 6)) {
        print_error("%s calls system:\n%s\n", path, t);
        fail();
      }
    }
    free(t);
  }
  closedir(d);
}

/* ---- 1. gnuplot injection ----------------------------------------------------------------- */

/* A rung name with a quote, newlines and system(...) in a results file runs nothing: the
 * report refuses the name (it is no rung of the ladder), and the case reports, even handed
 * such names directly, write them into scripts and data files only as inert tokens. */
static void test_rung_name_cannot_run_commands(void **state) {
  (void)state;
  char pwned[512], evil[700], dir[512], res_path[512], md[512];
  vl_err err = {0};
  tu_join(pwned, sizeof pwned, tu_tmp, "PWNED_xyz");
  snprintf(evil, sizeof evil, "x'\nsystem('touch %s')\n#", pwned);
  for (int k = 0; k < N_CASES; k++) {
    vl_ladder L;
    const vl_case *c = load(case_ids[k], &L);
    cJSON *res = results_for(c, &L);
    /* every rung's name is the attack (the last one titles llm-lora's timeline plot) */
    cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
      cJSON_ReplaceItemInObject(r, "name", cJSON_CreateString(evil));
      cJSON_ReplaceItemInObject(r, "label", cJSON_CreateString(evil));
    }
    fresh_dir(dir, sizeof dir, "inject");
    tu_join(res_path, sizeof res_path, dir, "results.json");
    tu_join(md, sizeof md, dir, "report.md");
    save(res_path, res);
    int rc = vl_report_write(c, &L, res_path, md, &err);
    assert_false(exists(pwned));
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(err.msg, "rungs[0].name"));
    /* the case's own report sections, bypassing the validation */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    char plots[600];
    tu_join(plots, sizeof plots, dir, c->id);
    assert_int_equal(vl_mkdir_p(plots), 0);
    c->report(res, f, f, plots, c->id, have_gnuplot());
    fclose(f);
    free(buf);
    assert_false(exists(pwned));
    assert_artifacts_safe(plots);
    cJSON_Delete(res);
  }
}

/* ---- 2. schema ---------------------------------------------------------------------------- */

/* Every wrong-schema results file is refused before anything is written, with a message
 * naming the file and the offending path; the report folder's results.json is kept. */
static void test_schema_rejected_before_writing(void **state) {
  (void)state;
  static const struct { const char *path, *value, *expect; } bad[] = {
      {"rungs[1].name", NULL, "rungs[1].name: expected a string"},
      {"rungs[0].name", "5", "rungs[0].name: expected a string"},
      {"rungs[0].name", "\"nosuch\"", "rungs[0].name: 'nosuch' is not a rung of llm-lora"},
      {"rungs[2].plan.timeline[0]", "[1]", "rungs[2].plan.timeline[0]: expected an [x, y] pair of numbers"},
      {"rungs[2].plan.timeline[1]", "[1, \"a\"]", "rungs[2].plan.timeline[1]: expected an [x, y] pair"},
      {"rungs[7].plan.timeline[3]", "5", "rungs[7].plan.timeline[3]: expected an [x, y] pair"},
      {"rungs[7].plan.batch_curve[0]", "\"x\"", "rungs[7].plan.batch_curve[0]: expected an [x, y] pair"},
      {"rungs[7].plan.batch_curve[0]", "[1, 2, 3]", "rungs[7].plan.batch_curve[0]: expected an [x, y] pair"},
      {"rungs[2].plan.timeline", "{}", "rungs[2].plan.timeline: expected an array"},
      {"case", "\"seg-ckpt\"", "case: these are results of 'seg-ckpt', not of 'llm-lora'"},
      {"case", NULL, "case: expected a string"},
      {"schema_version", "2", "schema_version: 2 is not the version this vramlab reads (1)"},
      {"schema_version", "\"1\"", "schema_version: expected a number"},
      {"schema_version", NULL, "schema_version: expected a number"},
      {"rungs", "{}", "rungs: expected an array"},
      {"rungs", NULL, "rungs: expected an array"},
      {"rungs", "[]", "rungs: no rung"},
      {"rungs[0]", "3", "rungs[0]: expected an object"},
      {"rungs[0].plan", "[]", "rungs[0].plan: expected an object"},
      {"rungs[0].runs", "{}", "rungs[0].runs: expected an array"},
      {"rungs[0].runs[0]", "null", "rungs[0].runs[0]: expected an object"},
      {"rungs[0].runs[0].step_time.samples[1]", "\"fast\"", "rungs[0].runs[0].step_time.samples[1]: expected a number"},
      {"rungs[0].runs[0].step_time", "[]", "rungs[0].runs[0].step_time: expected an object"},
      {"rungs[0].runs[0].loss", "[1, {}]", "rungs[0].runs[0].loss[1]: expected a number"},
      {"rungs[0].runs[0].tokens_per_s", "\"many\"", "rungs[0].runs[0].tokens_per_s: expected a number"},
      {"rungs[0].runs[0].oom", "1", "rungs[0].runs[0].oom: expected true or false"},
      {"rungs[0].runs[0].error", "[]", "rungs[0].runs[0].error: expected a string"},
      {"rungs[0].plan.peak_bytes", "\"big\"", "rungs[0].plan.peak_bytes: expected a number"},
      {"rungs[0].plan.by_category", "{\"acts\": \"x\"}", "rungs[0].plan.by_category.acts: expected a number"},
      {"rungs[0].label", "7", "rungs[0].label: expected a string"},
      {"env", NULL, "env: expected an object"},
      {"env", "[]", "env: expected an object"},
      {"env.device", "5", "env.device: expected a string"},
      {"env.cores", "\"two\"", "env.cores: expected a number"},
      {"run_scale", "1", "run_scale: expected a string"},
      {"case_metrics", "[]", "case_metrics: expected an object"},
      {"sweep", "[1]", "sweep[0]: expected an object"},
      /* numbers out of their range: negative, zero batch, fractional or too large counts,
       * fractions above 1 */
      {"rungs[0].runs[0].batch", "-1", "rungs[0].runs[0].batch: expected a whole number >= 1 (at most 2^53), got -1"},
      {"rungs[1].plan.batch", "0", "rungs[1].plan.batch: expected a whole number >= 1 (at most 2^53), got 0"},
      {"rungs[0].plan.peak_bytes", "-1", "rungs[0].plan.peak_bytes: expected a whole number >= 0 (at most 2^53), got -1"},
      {"rungs[0].plan.peak_bytes", "1e-300", "rungs[0].plan.peak_bytes: expected a whole number >= 0"},
      {"rungs[0].plan.max_batch", "18446744073709551616",
       "rungs[0].plan.max_batch: expected a whole number >= 0 (at most 2^53), got 1.8446744073709552e+19"},
      {"rungs[0].plan.oom_rate", "1e308", "rungs[0].plan.oom_rate: expected a fraction in [0, 1], got 1e+308"},
      {"rungs[0].plan.by_category", "{\"acts\": -5}", "rungs[0].plan.by_category.acts: expected a whole number >= 0"},
      {"rungs[0].runs[0].tokens_per_s", "-1", "rungs[0].runs[0].tokens_per_s: expected a number >= 0, got -1"},
      {"rungs[0].runs[0].step_time.samples[1]", "-0.5", "rungs[0].runs[0].step_time.samples[1]: expected a number >= 0"},
      {"rungs[0].runs[0].miou", "1.5", "rungs[0].runs[0].miou: expected a fraction in [0, 1], got 1.5"},
      {"env.cores", "0", "env.cores: expected a whole number >= 1 (at most 2^53), got 0"},
      {"sgemm_flops_per_s", "-1e308", "sgemm_flops_per_s: expected a number >= 0"},
  };
  vl_ladder L;
  const vl_case *c = load("llm-lora", &L);
  char dir[512], res_path[512], md[512], keep[512];
  vl_err err;
  fresh_dir(dir, sizeof dir, "schema");
  tu_join(res_path, sizeof res_path, dir, "results.json");
  tu_join(md, sizeof md, dir, "report.md");
  snprintf(keep, sizeof keep, "%s/llm-lora/results.json", dir);
  assert_int_equal(vl_mkdir_p(strcat(strcpy(err.msg, dir), "/llm-lora")), 0);
  for (size_t i = 0; i < sizeof bad / sizeof *bad + 1; i++) {
    cJSON *res = results_for(c, &L);
    const char *expect;
    if (i < sizeof bad / sizeof *bad) {
      jset(res, bad[i].path, bad[i].value);
      expect = bad[i].expect;
    } else { /* the same rung twice */
      cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 3), "name",
                                cJSON_CreateString(L.rungs[1].name));
      expect = "rungs[3].name: 'cap' appears twice";
    }
    save(res_path, res);
    cJSON_Delete(res);
    tu_write_text(keep, "previous results");
    err.msg[0] = 0;
    int rc = vl_report_write(c, &L, res_path, md, &err);
    if (rc == 0 || !strstr(err.msg, expect) || !strstr(err.msg, res_path)) {
      print_error("case %zu: rc %d, err '%s', expected '%s' and the file name\n", i, rc, err.msg, expect);
      fail();
    }
    assert_false(exists(md));
    char *kept = read_text(keep);
    assert_string_equal(kept, "previous results");
    free(kept);
  }
}

/* Files that are no JSON results at all, or whose numbers JSON cannot carry. */
static void test_schema_rejects_raw_text(void **state) {
  (void)state;
  /* n: bytes of text to write (0: strlen) */
  static const struct { const char *text; size_t n; const char *expect; } bad[] = {
      {"", 0, "truncated or corrupt"},
      {"[1, 2]", 0, "expected an object"},
      {"{\"schema_version\": 1} trailing", 0, "truncated or corrupt"},
      {"{\"schema_version\": 1}\0{}", 24, "NUL byte"},
      {"{\"schema_version\": 1, \"case\": \"llm-lora\", \"env\": {}, \"rungs\": [{\"name\": \"cap\", "
       "\"plan\": {\"timeline\": [[1, 1e999]]}}]}", 0, "rungs[0].plan.timeline[0]: expected an [x, y] pair"},
      {"{\"schema_version\": 1, \"case\": \"llm-lora\", \"env\": {}, \"rungs\": [{\"name\": \"cap\", "
       "\"plan\": {\"peak_bytes\": -1e400}}]}", 0, "rungs[0].plan.peak_bytes: expected a number"},
  };
  vl_ladder L;
  const vl_case *c = load("llm-lora", &L);
  char dir[512], res_path[512], md[512];
  vl_err err;
  fresh_dir(dir, sizeof dir, "raw");
  tu_join(res_path, sizeof res_path, dir, "results.json");
  tu_join(md, sizeof md, dir, "report.md");
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tu_write_bytes(res_path, bad[i].text, bad[i].n ? bad[i].n : strlen(bad[i].text));
    err.msg[0] = 0;
    int rc = vl_report_write(c, &L, res_path, md, &err);
    if (rc == 0 || !strstr(err.msg, bad[i].expect)) {
      print_error("case %zu: rc %d, err '%s', expected '%s'\n", i, rc, err.msg, bad[i].expect);
      fail();
    }
    assert_false(exists(md));
  }
}

/* Results that are valid but miss fields (plans only, a failed run, a run without timings,
 * losses that overflowed to null) give a report: a missing value prints "—", never "nan",
 * "(null)" or a 0 standing in for null. */
static void test_missing_fields_print_dash(void **state) {
  (void)state;
  for (int k = 0; k < N_CASES; k++) {
    vl_ladder L;
    const vl_case *c = load(case_ids[k], &L);
    for (int variant = 0; variant < 3; variant++) {
      cJSON *res = cJSON_CreateObject();
      cJSON_AddNumberToObject(res, "schema_version", 1);
      cJSON_AddStringToObject(res, "case", c->id);
      cJSON_AddObjectToObject(res, "env");
      if (variant == 2) cJSON_AddObjectToObject(res, "case_metrics");
      if (variant == 2) cJSON_AddItemToObject(res, "sweep", cJSON_Parse("[{}, {\"workers\": 1}]"));
      cJSON *rungs = cJSON_AddArrayToObject(res, "rungs");
      for (int i = 0; i < L.n_rungs; i++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "name", L.rungs[i].name);
        if (variant >= 1) cJSON_AddObjectToObject(r, "plan");
        if (variant == 1)
          cJSON_AddItemToObject(r, "runs", cJSON_Parse(i % 2 ? "[{\"oom\": true}]" : "[{}]"));
        if (variant == 2)
          cJSON_AddItemToObject(r, "runs", cJSON_Parse("[{\"loss\": [null, 1.5], \"step_time\": {\"samples\": [null]},"
                                                       " \"pixel_accuracy_per_epoch\": [null, 0.5]}]"));
        cJSON_AddItemToArray(rungs, r);
      }
      char dir[512], res_path[512], md[512];
      vl_err err = {0};
      fresh_dir(dir, sizeof dir, "missing");
      tu_join(res_path, sizeof res_path, dir, "results.json");
      tu_join(md, sizeof md, dir, "report.md");
      save(res_path, res);
      cJSON_Delete(res);
      if (vl_report_write(c, &L, res_path, md, &err)) {
        print_error("%s variant %d: %s\n", c->id, variant, err.msg);
        fail();
      }
      char *t = read_text(md);
      if (has_word(t, "nan") || has_word(t, "inf") || strstr(t, "(null)") || strstr(t, "0.000 → 1.500")) {
        print_error("%s variant %d: report shows a missing value as a number:\n%s\n", c->id, variant, t);
        fail();
      }
      free(t);
      char plots[600];
      tu_join(plots, sizeof plots, dir, c->id);
      assert_artifacts_safe(plots);
    }
  }
}

/* ---- 3. reading the results file ------------------------------------------------------------ */

/* A directory, a FIFO and a device are refused at once with a clear message: no 2^63-byte
 * allocation, no read that waits forever for a writer. */
static void test_results_path_not_a_file(void **state) {
  (void)state;
  vl_ladder L;
  const vl_case *c = load("llm-lora", &L);
  char dir[512], md[512], fifo[512];
  vl_err err;
  fresh_dir(dir, sizeof dir, "notfile");
  tu_join(md, sizeof md, dir, "report.md");
  tu_join(fifo, sizeof fifo, dir, "fifo.json");
  assert_int_equal(mkfifo(fifo, 0644), 0);
  const char *paths[] = {dir, fifo, "/dev/null"};
  for (int i = 0; i < 3; i++) {
    /* in a child with an alarm, so that a read that blocks fails the test, not hangs it */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      alarm(10);
      err.msg[0] = 0;
      int rc = vl_report_write(c, &L, paths[i], md, &err);
      _exit(rc != 0 && strstr(err.msg, "not a regular file") && strstr(err.msg, paths[i]) ? 0 : 1);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
      print_error("report --results %s: %s\n", paths[i],
                  WIFSIGNALED(st) ? "killed (hung or crashed)" : "no clear 'not a regular file' error");
      fail();
    }
    assert_false(exists(md));
  }
}

/* ---- 4. artifacts written whole or not at all ------------------------------------------------ */

/* A "disk" that holds files of at most `limit` bytes (RLIMIT_FSIZE, also for gnuplot): every
 * report artifact is either absent or the same bytes as without the limit, every PNG whole,
 * no temp file left. */
static void test_artifacts_whole_under_full_disk(void **state) {
  (void)state;
  vl_ladder L;
  const vl_case *c = load("llm-lora", &L);
  /* lean results: a data file (mem_by_category.dat) and scripts are larger than them */
  cJSON *res = cJSON_CreateObject();
  cJSON_AddNumberToObject(res, "schema_version", 1);
  cJSON_AddStringToObject(res, "case", c->id);
  cJSON_AddObjectToObject(res, "env");
  cJSON *rungs = cJSON_AddArrayToObject(res, "rungs");
  for (int i = 0; i < 2; i++) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "name", L.rungs[i].name);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(r, "plan"), "by_category"), "acts", 1);
    cJSON_AddItemToArray(rungs, r);
  }
  char dir[512], res_path[512], ref[512], lim[512], md[600];
  vl_err err;
  fresh_dir(dir, sizeof dir, "fsize");
  tu_join(res_path, sizeof res_path, dir, "results.json");
  char *t = cJSON_PrintUnformatted(res);
  tu_write_text(res_path, t);
  size_t limit = strlen(t); /* the copy of the results just fits */
  free(t);
  cJSON_Delete(res);
  tu_join(ref, sizeof ref, dir, "ref");
  tu_join(lim, sizeof lim, dir, "lim");
  assert_int_equal(vl_mkdir_p(ref), 0);
  assert_int_equal(vl_mkdir_p(lim), 0);
  tu_join(md, sizeof md, ref, "report.md");
  assert_int_equal(vl_report_write(c, &L, res_path, md, &err), 0);
  tu_join(md, sizeof md, lim, "report.md");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    struct rlimit rl = {limit, limit};
    signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG, as on a full disk */
    if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(3);
    vl_report_write(c, &L, res_path, md, &err);
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char ldir[700], rdir[700];
  snprintf(ldir, sizeof ldir, "%s/%s", lim, c->id);
  snprintf(rdir, sizeof rdir, "%s/%s", ref, c->id);
  assert_artifacts_safe(ldir);
  DIR *d = opendir(ldir);
  assert_non_null(d);
  struct dirent *e;
  int bigger = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || ends_with(e->d_name, ".png") || ends_with(e->d_name, ".log")) continue;
    char a[1024], b[1024];
    tu_join(a, sizeof a, ldir, e->d_name);
    tu_join(b, sizeof b, rdir, e->d_name);
    if (!exists(b) || !tu_same_file(a, b)) {
      print_error("%s is not the file written without the limit\n", a);
      fail();
    }
  }
  closedir(d);
  /* the test means something: some artifacts are larger than the limit */
  d = opendir(rdir);
  while ((e = readdir(d))) {
    char b[1024];
    struct stat sb;
    tu_join(b, sizeof b, rdir, e->d_name);
    if (!stat(b, &sb) && S_ISREG(sb.st_mode) && (size_t)sb.st_size > limit && !ends_with(e->d_name, ".png"))
      bigger++;
  }
  closedir(d);
  if (bigger < 2) {
    print_error("only %d artifacts are larger than the %zu-byte limit: the test proves nothing\n", bigger, limit);
    fail();
  }
}

/* gnuplot writes a truncated PNG and says nothing (a full disk under it), or fails: the final
 * PNG is never a half file, and the report says which plot is missing instead of linking it. */
static void test_plot_failures_reported(void **state) {
  (void)state;
  char real[512] = "";
  FILE *p = popen("command -v gnuplot", "r");
  if (p) {
    if (fgets(real, sizeof real, p)) real[strcspn(real, "\n")] = 0;
    pclose(p);
  }
  char bin[512], gp[600], script[1200], path_env[4096];
  fresh_dir(bin, sizeof bin, "fakebin");
  tu_join(gp, sizeof gp, bin, "gnuplot");
  const char *old_path = getenv("PATH");
  snprintf(path_env, sizeof path_env, "%s:%s", bin, old_path ? old_path : "/usr/bin:/bin");
  char *saved = strdup(old_path ? old_path : "");
  for (int variant = 0; variant < 2; variant++) {
    if (variant == 0) {
      if (!real[0]) {
        print_message("skipped the truncated-PNG half: gnuplot is not installed\n");
        continue;
      }
      /* the real gnuplot on a 2 KiB "disk": it writes half a PNG and exits 0 */
      snprintf(script, sizeof script, "#!/bin/bash\ntrap '' XFSZ\nulimit -f 2\nexec '%s' \"$@\"\n", real);
    } else {
      snprintf(script, sizeof script, "#!/bin/sh\necho 'fake gnuplot: cannot render' >&2\nexit 3\n");
    }
    tu_write_text(gp, script);
    assert_int_equal(chmod(gp, 0755), 0);
    setenv("PATH", path_env, 1);
    vl_ladder L;
    const vl_case *c = load("llm-lora", &L);
    cJSON *res = results_for(c, &L);
    char dir[512], res_path[512], md[512], plots[600];
    vl_err err = {0};
    fresh_dir(dir, sizeof dir, "plotfail");
    tu_join(res_path, sizeof res_path, dir, "results.json");
    tu_join(md, sizeof md, dir, "report.md");
    tu_join(plots, sizeof plots, dir, c->id);
    save(res_path, res);
    cJSON_Delete(res);
    int rc = vl_report_write(c, &L, res_path, md, &err);
    setenv("PATH", saved, 1);
    assert_int_equal(rc, 0);
    assert_artifacts_safe(plots);
    char *t = read_text(md);
    /* every linked PNG is there and whole; the missing ones are named */
    for (char *l = strstr(t, "](llm-lora/"); l; l = strstr(l + 1, "](llm-lora/")) {
      char name[128], png[800];
      if (sscanf(l, "](llm-lora/%127[^)])", name) != 1) continue;
      tu_join(png, sizeof png, plots, name);
      if (!exists(png) || !png_complete(png)) {
        print_error("variant %d: the report links %s, which is %s\n", variant, png, exists(png) ? "truncated" : "missing");
        fail();
      }
    }
    if (!strstr(t, "`timeline` is missing") || !strstr(t, "`mem_by_category` is missing")) {
      print_error("variant %d: the report does not say which plots are missing:\n%s\n", variant, t);
      fail();
    }
    free(t);
  }
  free(saved);
}

/* No entry of dir is a leftover temporary file (".<name>.tmp.<pid>"). */
static void assert_no_tmp(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d));)
    if (strstr(e->d_name, ".tmp.")) fail_msg("%s: a temporary file is left: %s", dir, e->d_name);
  closedir(d);
}

/* A link planted at <dir>/timeline.gnuplot.log is never written through: gnuplot failing
 * leaves its stderr in a file of its own at that name (the link replaced), gnuplot succeeding
 * leaves no log (the link removed); the link's target keeps its bytes either way. */
static void test_gnuplot_log_link_not_followed(void **state) {
  (void)state;
  char dir[512], victim[512], link_path[600], bin[512], gp[600], path_env[4096];
  vl_err why;
  fresh_dir(dir, sizeof dir, "loglink");
  tu_join(victim, sizeof victim, tu_tmp, "precious.txt");
  tu_join(link_path, sizeof link_path, dir, "timeline.gnuplot.log");
  fresh_dir(bin, sizeof bin, "fakebin-log");
  tu_join(gp, sizeof gp, bin, "gnuplot");
  tu_write_text(gp, "#!/bin/sh\necho 'fake gnuplot: cannot render' >&2\nexit 3\n");
  assert_int_equal(chmod(gp, 0755), 0);
  const char *old_path = getenv("PATH");
  char *saved = strdup(old_path ? old_path : "/usr/bin:/bin");
  snprintf(path_env, sizeof path_env, "%s:%s", bin, saved);
  static const char script[] = "set terminal png size 64,48\nset output vl_png\nplot x\n";
  for (int variant = 0; variant < 2; variant++) {
    if (variant == 1 && !have_gnuplot()) {
      print_message("skipped the successful half: gnuplot is not installed\n");
      break;
    }
    tu_write_text(victim, "precious\n");
    unlink(link_path);
    assert_int_equal(symlink(victim, link_path), 0);
    if (variant == 0) setenv("PATH", path_env, 1); /* the fake gnuplot, which fails */
    int rc = vl_rep_gnuplot(dir, "timeline", script, &why);
    setenv("PATH", saved, 1);
    char *t = read_text(victim);
    assert_string_equal(t, "precious\n");
    free(t);
    struct stat st;
    if (variant == 0) {
      assert_int_equal(rc, VL_ERR_IO); /* the status of a plot that failed */
      assert_non_null(strstr(why.msg, "gnuplot failed with status 3"));
      assert_int_equal(lstat(link_path, &st), 0);
      assert_true(S_ISREG(st.st_mode));
      t = read_text(link_path);
      assert_non_null(strstr(t, "fake gnuplot: cannot render"));
      free(t);
    } else {
      if (rc) fail_msg("gnuplot: %s", why.msg);
      assert_int_equal(lstat(link_path, &st), -1);
    }
    assert_no_tmp(dir);
  }
  free(saved);
}

/* A data file that cannot be written: the plot is reported missing with the reason, and the
 * other plots are still made. */
static void test_dat_failure_reported(void **state) {
  (void)state;
  vl_ladder L;
  const vl_case *c = load("llm-lora", &L);
  cJSON *res = results_for(c, &L);
  char dir[512], res_path[512], md[512], block[700];
  vl_err err = {0};
  fresh_dir(dir, sizeof dir, "datfail");
  tu_join(res_path, sizeof res_path, dir, "results.json");
  tu_join(md, sizeof md, dir, "report.md");
  save(res_path, res);
  cJSON_Delete(res);
  snprintf(block, sizeof block, "%s/llm-lora/timeline.dat", dir); /* a folder: rename onto it fails */
  assert_int_equal(vl_mkdir_p(block), 0);
  snprintf(block, sizeof block, "%s/llm-lora/timeline.dat/x", dir);
  tu_write_text(block, "x");
  assert_int_equal(vl_report_write(c, &L, res_path, md, &err), 0);
  char *t = read_text(md);
  if (!strstr(t, "`timeline` is missing") || !strstr(t, "timeline.dat")) {
    print_error("the report does not say the timeline plot is missing and why:\n%s\n", t);
    fail();
  }
  if (have_gnuplot() && !strstr(t, "](llm-lora/step_time.png)")) {
    print_error("a failed data file stopped the later plots:\n%s\n", t);
    fail();
  }
  free(t);
}

/* A report folder whose name holds a quote and $(...) runs nothing, and gnuplot still
 * renders there. */
static void test_report_dir_with_quote(void **state) {
  (void)state;
  vl_ladder L;
  const vl_case *c = load("llm-lora", &L);
  char pwned[512], dir[1024], res_path[1100], md[1100];
  vl_err err = {0};
  tu_join(pwned, sizeof pwned, tu_tmp, "PWNED_dir");
  snprintf(dir, sizeof dir, "%s/q'$(touch %s)'x", tu_tmp, pwned);
  tu_rmtree(dir);
  assert_int_equal(vl_mkdir_p(dir), 0);
  tu_join(res_path, sizeof res_path, dir, "results.json");
  tu_join(md, sizeof md, dir, "report.md");
  cJSON *res = results_for(c, &L);
  save(res_path, res);
  cJSON_Delete(res);
  assert_int_equal(vl_report_write(c, &L, res_path, md, &err), 0);
  assert_false(exists(pwned));
  if (!have_gnuplot()) {
    print_message("skipped the rendering half: gnuplot is not installed\n");
    return;
  }
  char png[1200];
  snprintf(png, sizeof png, "%s/llm-lora/mem_by_category.png", dir);
  if (!exists(png) || !png_complete(png)) {
    char *t = read_text(md);
    print_error("no plot rendered in a folder with a quote:\n%s\n", strstr(t, "## Plots"));
    free(t);
    fail();
  }
}

/* ---- the pieces ------------------------------------------------------------------------- */

/* Every byte outside the whitelist becomes '_', the length is bounded, a token has no space
 * and is never empty. */
static void test_gp_str_whitelist(void **state) {
  (void)state;
  char b[VL_REP_GP_MAX + 8];
  assert_string_equal(vl_rep_gp_str("x'\nsystem('touch /tmp/a')\n#", false, b, sizeof b), "x__system(_touch /tmp/a_)__");
  assert_string_equal(vl_rep_gp_str("a b\"c\\d`e@f$g\th\r", false, b, sizeof b), "a b_c_d_e_f_g_h_");
  assert_string_equal(vl_rep_gp_str("rung one", true, b, sizeof b), "rung_one");
  assert_string_equal(vl_rep_gp_str("fp16 (x2), 50% <=> 1e-3; a:b/c+d", false, b, sizeof b),
                      "fp16 (x2), 50% <=> 1e-3; a:b/c+d");
  assert_string_equal(vl_rep_gp_str("", true, b, sizeof b), "_");
  assert_string_equal(vl_rep_gp_str("", false, b, sizeof b), "");
  assert_string_equal(vl_rep_gp_str(NULL, true, b, sizeof b), "?");
  assert_string_equal(vl_rep_gp_str("\xe2\x80\x94", false, b, sizeof b), "___"); /* UTF-8 "—" */
  char all[256];
  for (int i = 1; i < 256; i++) all[i - 1] = (char)i;
  all[255] = 0;
  for (int token = 0; token < 2; token++) {
    vl_rep_gp_str(all, token, b, sizeof b);
    assert_int_equal(strlen(b), VL_REP_GP_MAX);
    for (const char *p = b; *p; p++)
      assert_non_null(strchr(token ? "_.,:;+-/()%=<>" : " _.,:;+-/()%=<>", *p) ? p
                      : ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')) ? p : NULL);
  }
  assert_string_equal(vl_rep_gp_str("abcdef", false, b, 4), "abc");
}

/* vl_read_file_max: the file, or a clear refusal for what is not a regular file or is too
 * large; vl_read_file keeps its signature for the other callers. */
static void test_read_file_max(void **state) {
  (void)state;
  char dir[512], f[600], fifo[600];
  vl_err err;
  size_t n = 99;
  fresh_dir(dir, sizeof dir, "readfile");
  tu_join(f, sizeof f, dir, "a.json");
  tu_write_text(f, "{\"a\": 1}");
  char *t = vl_read_file_max(f, 100, &n, &err);
  assert_non_null(t);
  assert_string_equal(t, "{\"a\": 1}");
  assert_int_equal(n, 8);
  free(t);
  assert_null(vl_read_file_max(f, 7, &n, &err));
  assert_non_null(strstr(err.msg, "exceeds the limit (7)"));
  assert_int_equal(errno, EFBIG);
  t = vl_read_file_max(f, 8, &n, &err); /* exactly the limit */
  assert_non_null(t);
  free(t);
  t = vl_read_file_max(f, (size_t)-1, &n, &err); /* no limit at all */
  assert_non_null(t);
  assert_string_equal(t, "{\"a\": 1}");
  free(t);
  tu_write_text(f, "");
  t = vl_read_file_max(f, 8, &n, &err);
  assert_non_null(t);
  assert_int_equal(n, 0);
  assert_string_equal(t, "");
  free(t);
  assert_null(vl_read_file_max(dir, 100, &n, &err));
  assert_non_null(strstr(err.msg, "not a regular file (directory)"));
  assert_int_equal(errno, EISDIR);
  assert_null(vl_read_file(dir, &n));
  tu_join(fifo, sizeof fifo, dir, "fifo");
  assert_int_equal(mkfifo(fifo, 0644), 0);
  assert_null(vl_read_file_max(fifo, 100, &n, &err)); /* at once, no writer needed */
  assert_non_null(strstr(err.msg, "not a regular file (fifo)"));
  assert_null(vl_read_file_max("/dev/zero", 100, &n, &err));
  assert_non_null(strstr(err.msg, "not a regular file (character device)"));
  tu_join(f, sizeof f, dir, "nosuch.json");
  assert_null(vl_read_file_max(f, 100, &n, &err));
  assert_int_equal(errno, ENOENT);
  assert_null(vl_read_file_max(f, 100, NULL, NULL)); /* no message wanted */
}

/* Every number of the file (but schema_version) set to one impossible value at once, as a
 * hostile results file does: -1, 0, 1e-300, 1e308, 2^64. Each is refused with a path, never
 * reported ("-100% -> -100%", batch -1). */
static void set_every_number(cJSON *o, double x) {
  cJSON *e;
  cJSON_ArrayForEach(e, o) {
    if (cJSON_IsNumber(e) && !(e->string && !strcmp(e->string, "schema_version"))) cJSON_SetNumberValue(e, x);
    else if (cJSON_IsObject(e) || cJSON_IsArray(e)) set_every_number(e, x);
  }
}

static void test_schema_rejects_impossible_numbers(void **state) {
  (void)state;
  static const double bad[] = {-1, 0, 1e-300, 1e308, 18446744073709551616.0};
  vl_ladder L;
  const vl_case *c = load("llm-lora", &L);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cJSON *res = results_for(c, &L);
    assert_int_equal(vl_results_validate(res, c, &L, NULL), 0); /* sound before */
    set_every_number(res, bad[i]);
    vl_err err = {0};
    if (vl_results_validate(res, c, &L, &err) == 0) fail_msg("every number %g: accepted", bad[i]);
    print_message("  every number %g: %s\n", bad[i], err.msg);
    assert_non_null(strstr(err.msg, ": expected a "));
    cJSON_Delete(res);
  }
}

/* The results files the report folders keep (real runs) pass their own case's validation
 * and are refused by every other case. */
static void test_validate_real_results(void **state) {
  (void)state;
  for (int k = 0; k < N_CASES; k++) {
    char path[512];
    vl_err err;
    snprintf(path, sizeof path, "%s/reports/%s/results.json", VRAMLAB_SOURCE_DIR, case_ids[k]);
    if (!exists(path)) {
      print_message("skipped %s: no %s\n", case_ids[k], path);
      continue;
    }
    char *t = vl_read_file_max(path, VL_RESULTS_MAX_BYTES, NULL, &err);
    assert_non_null(t);
    cJSON *res = cJSON_Parse(t);
    free(t);
    assert_non_null(res);
    for (int j = 0; j < N_CASES; j++) {
      vl_ladder L;
      const vl_case *c = load(case_ids[j], &L);
      int rc = vl_results_validate(res, c, &L, &err);
      if (j == k && rc) {
        print_error("%s: %s\n", path, err.msg);
        fail();
      }
      if (j != k) {
        assert_int_not_equal(rc, 0);
        assert_non_null(strstr(err.msg, "case: these are results of"));
      }
    }
    cJSON_Delete(res);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rung_name_cannot_run_commands),
      cmocka_unit_test(test_schema_rejected_before_writing),
      cmocka_unit_test(test_schema_rejects_raw_text),
      cmocka_unit_test(test_schema_rejects_impossible_numbers),
      cmocka_unit_test(test_missing_fields_print_dash),
      cmocka_unit_test(test_results_path_not_a_file),
      cmocka_unit_test(test_artifacts_whole_under_full_disk),
      cmocka_unit_test(test_plot_failures_reported),
      cmocka_unit_test(test_dat_failure_reported),
      cmocka_unit_test(test_gnuplot_log_link_not_followed),
      cmocka_unit_test(test_report_dir_with_quote),
      cmocka_unit_test(test_gp_str_whitelist),
      cmocka_unit_test(test_read_file_max),
      cmocka_unit_test(test_validate_real_results),
  };
  return cmocka_run_group_tests(tests, setup, tu_tmp_teardown);
}
