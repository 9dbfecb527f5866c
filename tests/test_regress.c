/* `vramlab regress` (issue #13): the comparison against a baseline judges each kind of metric
 * as regress.h says (a planned byte count moved by one page fails; a timing fails only when
 * both its median and its fastest sample are slower than the threshold), and the device
 * class names a baseline file safely. */
#include <stdio.h>
#include <string.h>

#include "regress.h"
#include "testutil.h"

/* A baseline with one metric of every kind, as vramlab regress writes them. */
static cJSON *baseline(void) {
  const char *text =
      "{\"metrics\":{"
      "\"seg-ckpt/ckpt/plan.peak_bytes\":{\"kind\":\"exact\",\"value\":1234567936},"
      "\"llm-lora/lora/run.loss[0]\":{\"kind\":\"tol\",\"value\":5.5,\"tol\":1e-4},"
      "\"llm-lora/lora/run.step_time\":{\"kind\":\"time\",\"median\":0.200,\"min\":0.190}"
      "}}";
  cJSON *b = cJSON_Parse(text);
  assert_non_null(b);
  return b;
}

static cJSON *metric(cJSON *root, const char *name) {
  return cJSON_GetObjectItem(cJSON_GetObjectItem(root, "metrics"), name);
}

static void set_num(cJSON *m, const char *key, double v) {
  cJSON_SetNumberHelper(cJSON_GetObjectItem(m, key), v);
}

static vl_regress_counts compare(const cJSON *base, const cJSON *now, double thr) {
  vl_regress_counts k;
  FILE *devnull = fopen("/dev/null", "w");
  vl_regress_compare(base, now, thr, VL_REGRESS_ROWS_ALL, devnull, &k);
  fclose(devnull);
  return k;
}

static void test_identical_passes(void **state) {
  (void)state;
  cJSON *b = baseline(), *n = baseline();
  vl_regress_counts k = compare(b, n, 0.07);
  assert_int_equal(k.regressed, 0);
  assert_int_equal(k.ok, 3);
  assert_int_equal(k.added, 0);
  cJSON_Delete(b);
  cJSON_Delete(n);
}

static void test_planned_bytes_one_page_fails(void **state) {
  (void)state;
  cJSON *b = baseline(), *n = baseline();
  set_num(metric(n, "seg-ckpt/ckpt/plan.peak_bytes"), "value", 1234567936.0 + 4096);
  vl_regress_counts k = compare(b, n, 0.07);
  assert_int_equal(k.regressed, 1);
  /* and the table says which metric and by how much */
  char buf[4096] = "";
  FILE *f = fmemopen(buf, sizeof buf, "w");
  vl_regress_compare(b, n, 0.07, VL_REGRESS_ROWS_CHANGED, f, &k);
  fclose(f);
  assert_non_null(strstr(buf, "seg-ckpt/ckpt/plan.peak_bytes"));
  assert_non_null(strstr(buf, "+4096"));
  assert_non_null(strstr(buf, "REGRESSION"));
  assert_null(strstr(buf, "run.step_time")); /* only_changed: the unchanged rows are left out */
  cJSON_Delete(b);
  cJSON_Delete(n);
}

static void test_loss_tolerance(void **state) {
  (void)state;
  cJSON *b = baseline(), *n = baseline();
  cJSON *m = metric(n, "llm-lora/lora/run.loss[0]");
  set_num(m, "value", 5.5 + 5.5 * 0.5e-4); /* inside 1e-4 relative */
  assert_int_equal(compare(b, n, 0.07).regressed, 0);
  set_num(m, "value", 5.5 + 5.5 * 2e-4); /* outside */
  assert_int_equal(compare(b, n, 0.07).regressed, 1);
  cJSON_Delete(b);
  cJSON_Delete(n);
}

static void test_timing_needs_median_and_min_slower(void **state) {
  (void)state;
  cJSON *b = baseline(), *n = baseline();
  cJSON *t = metric(n, "llm-lora/lora/run.step_time");
  /* 10% slower median, fastest sample as fast as before: noise, not a regression */
  set_num(t, "median", 0.220);
  assert_int_equal(compare(b, n, 0.07).regressed, 0);
  /* both slower by 10% > 7% */
  set_num(t, "min", 0.209);
  assert_int_equal(compare(b, n, 0.07).regressed, 1);
  /* the threshold is a knob: 15% lets it pass */
  assert_int_equal(compare(b, n, 0.15).regressed, 0);
  /* 5% slower: under the default threshold */
  set_num(t, "median", 0.210);
  set_num(t, "min", 0.1995);
  assert_int_equal(compare(b, n, 0.07).regressed, 0);
  /* much faster: reported, never a failure */
  set_num(t, "median", 0.100);
  set_num(t, "min", 0.095);
  vl_regress_counts k = compare(b, n, 0.07);
  assert_int_equal(k.regressed, 0);
  assert_int_equal(k.improved, 1);
  cJSON_Delete(b);
  cJSON_Delete(n);
}

static void test_missing_and_new_metrics(void **state) {
  (void)state;
  cJSON *b = baseline(), *n = baseline();
  cJSON_DeleteItemFromObject(cJSON_GetObjectItem(n, "metrics"), "seg-ckpt/ckpt/plan.peak_bytes");
  cJSON *extra = cJSON_AddObjectToObject(cJSON_GetObjectItem(n, "metrics"), "multi-gpu/ddp/plan.peak_bytes");
  cJSON_AddStringToObject(extra, "kind", "exact");
  cJSON_AddNumberToObject(extra, "value", 1);
  vl_regress_counts k = compare(b, n, 0.07);
  assert_int_equal(k.missing, 1);
  assert_int_equal(k.regressed, 1);
  assert_int_equal(k.added, 1);
  cJSON_Delete(b);
  cJSON_Delete(n);
}

static void test_device_class(void **state) {
  (void)state;
  char cls[128];
  vl_regress_device_class("cpu", "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", 2, "none", cls, sizeof cls);
  assert_string_equal(cls, "cpu-intel-r-xeon-r-platinum-8481c-cpu-2-70ghz-2c");
  vl_regress_device_class("cuda", "x", 16, "NVIDIA H100 80GB HBM3, 550.54.15", cls, sizeof cls);
  assert_string_equal(cls, "cuda-nvidia-h100-80gb-hbm3");
  /* nothing of a hostile name survives into the file name */
  vl_regress_device_class("cpu", "../../etc/passwd; rm -rf /", 4, NULL, cls, sizeof cls);
  assert_string_equal(cls, "cpu-etc-passwd-rm-rf-4c");
  vl_regress_device_class("cpu", "", 1, NULL, cls, sizeof cls);
  assert_string_equal(cls, "cpu-unknown-1c");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_identical_passes),
      cmocka_unit_test(test_planned_bytes_one_page_fails),
      cmocka_unit_test(test_loss_tolerance),
      cmocka_unit_test(test_timing_needs_median_and_min_slower),
      cmocka_unit_test(test_missing_and_new_metrics),
      cmocka_unit_test(test_device_class),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
