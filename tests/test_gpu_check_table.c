/* The gpu-check case table (tools/gpu_check_cases.c): every operation of the enum has at
 * least one case, cases are well formed, and, where the CUDA build made the tool, its
 * --list, its no-GPU skip, --require-gpu (fails when nothing ran on a GPU) and its
 * --self-test (CPU against CPU) work. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tools/gpu_check_cases.c"
#include "vramlab/backend.h"

static void test_every_op_has_a_case(void **state) {
  (void)state;
  int per_kind[GC_KIND_COUNT] = {0};
  for (size_t i = 0; i < VL_GC_NCASES; i++) {
    const vl_gc_case *c = &VL_GC_CASES[i];
    assert_true(c->kind >= 0 && c->kind < GC_KIND_COUNT);
    per_kind[c->kind]++;
  }
  for (int k = 0; k < GC_KIND_COUNT; k++)
    if (per_kind[k] == 0) {
      print_error("no gpu-check case for %s\n", vl_gc_kind_name(k));
      fail();
    }
  /* at least the 146 checks of the hand-written tool this table replaced */
  assert_true(VL_GC_NCASES >= 146);
}

static void test_cases_well_formed(void **state) {
  (void)state;
  for (size_t i = 0; i < VL_GC_NCASES; i++) {
    const vl_gc_case *c = &VL_GC_CASES[i];
    assert_non_null(c->name);
    assert_true(c->limit >= 0 && c->limit < 1e-3); /* a wrong index is ~1 */
    for (int j = 0; j < 3; j++) assert_true((unsigned)c->dt[j] < VL_DTYPE_COUNT);
    if (c->kind != GC_SYNC) assert_true(c->d[0] > 0);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(c->name, VL_GC_CASES[j].name)) {
        print_error("two cases named \"%s\"\n", c->name);
        fail();
      }
    /* kinds round-trip through their names (--op NAME) */
    assert_int_equal(vl_gc_kind_parse(vl_gc_kind_name(c->kind)), c->kind);
  }
  assert_int_equal(vl_gc_kind_parse("no_such_op"), -1);
}

/* Runs the tool with `args`; its exit status, and its last output line in `last`. */
static int run_tool(const char *args, char *last, size_t n) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/vramlab-gpu-check %s 2>&1", VRAMLAB_BINARY_DIR, args);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  char line[512];
  last[0] = 0;
  while (fgets(line, sizeof line, f)) snprintf(last, n, "%s", line);
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool tool_built(void) {
#ifdef VRAMLAB_HAVE_CUDA
  char path[1024];
  snprintf(path, sizeof path, "%s/vramlab-gpu-check", VRAMLAB_BINARY_DIR);
  if (access(path, X_OK) == 0) return true;
  print_message("vramlab-gpu-check is not built (build all targets): skipped\n");
#else
  print_message("no CUDA build: vramlab-gpu-check is not built: skipped\n");
#endif
  return false;
}

static void test_tool(void **state) {
  (void)state;
  if (!tool_built()) { skip(); return; }
  char last[512], want[64];
  assert_int_equal(run_tool("--list", last, sizeof last), 0);
  snprintf(want, sizeof want, "gpu-check: %zu cases", VL_GC_NCASES);
  assert_non_null(strstr(last, want));
  assert_int_equal(run_tool("--list --op rmsnorm_bwd", last, sizeof last), 0);
  assert_non_null(strstr(last, "gpu-check: 4 cases"));
  assert_int_not_equal(run_tool("--op no_such_op", last, sizeof last), 0);
  /* the self-test: every case, CPU on both sides, must agree exactly */
  assert_int_equal(run_tool("--self-test", last, sizeof last), 0);
  snprintf(want, sizeof want, "gpu-check: %zu cases, %zu agree, 0 failed", VL_GC_NCASES,
           VL_GC_NCASES);
  if (!strstr(last, want)) {
    print_error("self-test: %s", last);
    fail();
  }
  /* --json: the same rows as a file, written whole; an unwritable path refused before running */
  char jpath[256], jarg[300];
  snprintf(jpath, sizeof jpath, "/tmp/vramlab-gpu-check-%d.json", (int)getpid());
  snprintf(jarg, sizeof jarg, "--self-test --op rmsnorm_bwd --json %s", jpath);
  assert_int_equal(run_tool(jarg, last, sizeof last), 0);
  FILE *jf = fopen(jpath, "r");
  assert_non_null(jf);
  char jtext[65536];
  size_t jn = fread(jtext, 1, sizeof jtext - 1, jf);
  jtext[jn] = 0;
  fclose(jf);
  unlink(jpath);
  cJSON *jd = cJSON_Parse(jtext);
  assert_non_null(jd);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(jd, "cases")), 4);
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(jd, "failed")) == 0);
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(jd, "cases"), 0),
                                                               "status")),
                      "agree");
  cJSON_Delete(jd);
  assert_int_equal(run_tool("--self-test --json /nonexistent-dir/x.json", last, sizeof last), 2);
  assert_non_null(strstr(last, "does not exist"));
  /* --require-gpu cannot be met by the self-test (CPU against CPU): a usage error */
  assert_int_equal(run_tool("--require-gpu --self-test", last, sizeof last), 2);
  assert_non_null(strstr(last, "exclude each other"));
  /* without a GPU nothing passes: every case is skipped, and that is not a failure... */
  if (!vl_cuda_available()) {
    assert_int_equal(run_tool("", last, sizeof last), 0);
    snprintf(want, sizeof want, "gpu-check: %zu cases skipped, none run", VL_GC_NCASES);
    assert_non_null(strstr(last, want));
    /* ...unless --require-gpu says a GPU runner must run them: then it is one */
    assert_int_equal(run_tool("--require-gpu", last, sizeof last), 1);
    snprintf(want, sizeof want, "gpu-check: --require-gpu: no case ran on a GPU (%zu skipped)",
             VL_GC_NCASES);
    if (!strstr(last, want)) {
      print_error("--require-gpu: %s", last);
      fail();
    }
    assert_int_equal(run_tool("--op rmsnorm_bwd --require-gpu", last, sizeof last), 1);
    assert_non_null(strstr(last, "no case ran on a GPU (4 skipped)"));
    /* --list runs nothing, so there is nothing for --require-gpu to judge */
    assert_int_equal(run_tool("--list --require-gpu", last, sizeof last), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_op_has_a_case),
      cmocka_unit_test(test_cases_well_formed),
      cmocka_unit_test(test_tool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
