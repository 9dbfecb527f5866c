/* `vramlab regress` (issues #13, #22): the comparison against a baseline judges each kind of
 * metric as regress.h says (a planned byte count moved by one page fails; a timing fails only
 * when both its median and its fastest sample are slower than the threshold, after scaling by
 * the host's calibration; numbers that depend on another host's kernels are compared with the
 * stated tolerance or not at all), a malformed baseline is refused, a baseline made on
 * another host of the class travels, and the device class names a baseline file safely. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness/regress.h"
#include "testutil.h"

/* A baseline with one metric of every kind, as vramlab regress writes them. */
static cJSON *baseline(void) {
  const char *text =
      "{\"version\":2,\"device_class\":\"cpu-test-2c\",\"reps\":5,"
      "\"calibration\":{\"sgemm_flops\":1e11,\"copy_bytes_per_s\":2e10},\"metrics\":{"
      "\"seg-ckpt/ckpt/plan.peak_bytes\":{\"kind\":\"exact\",\"value\":1234567936},"
      "\"llm-lora/lora/run.loss[0]\":{\"kind\":\"tol\",\"value\":5.5,\"tol\":1e-4},"
      "\"llm-lora/lora/run.step_time\":{\"kind\":\"time\",\"median\":0.200,\"min\":0.190,\"calib\":\"sgemm\"}"
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

static double num_of(const cJSON *m, const char *key) { return cJSON_GetNumberValue(cJSON_GetObjectItem(m, key)); }

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

/* A seeded loss that moved by 1e-15 is ok, but never printed or counted as "exactly as in the
 * baseline": exact and within-tolerance are told apart, in the rows, the counts and the
 * summary row of the hidden plan numbers (issue #19). */
static void test_exact_apart_from_within_tolerance(void **state) {
  (void)state;
  cJSON *b = baseline(), *n = baseline();
  set_num(metric(n, "llm-lora/lora/run.loss[0]"), "value", 5.5 + 1.7763568394002505e-15);
  char buf[4096] = "";
  FILE *f = fmemopen(buf, sizeof buf, "w");
  vl_regress_counts k;
  vl_regress_compare(b, n, 0.07, VL_REGRESS_ROWS_DEFAULT, f, &k);
  fclose(f);
  assert_int_equal(k.regressed, 0);
  assert_int_equal(k.ok, 3);
  assert_int_equal(k.exact, 1);      /* the planned bytes */
  assert_int_equal(k.within_tol, 1); /* the loss */
  const char *row = strstr(buf, "run.loss[0]");
  assert_non_null(row);
  const char *eol = strchr(row, '\n');
  const char *v = strstr(row, "ok (within its tolerance, not exact)");
  assert_true(v && eol && v < eol);
  /* the hidden planned number is the one exactly as in the baseline, and says so */
  assert_non_null(strstr(buf, "(1 planned numbers, each exactly as in the baseline)"));
  cJSON_Delete(b);
  cJSON_Delete(n);
  b = baseline();
  n = baseline();
  k = compare(b, n, 0.07);
  assert_int_equal(k.exact, 2);
  assert_int_equal(k.within_tol, 0);
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

/* ---- issue #22: malformed baselines are refused, and a metric not compared is a failure ---- */
static void expect_invalid(const char *text, const char *want) {
  cJSON *d = cJSON_Parse(text);
  vl_err err = {0};
  if (!d) fail_msg("fixture is not JSON: %s", text);
  if (vl_regress_validate(d, &err) == 0) fail_msg("accepted: %s", text);
  if (!strstr(err.msg, want)) fail_msg("'%s': error '%s' does not say '%s'", text, err.msg, want);
  cJSON_Delete(d);
}

#define HEAD "\"version\":2,\"device_class\":\"c\",\"calibration\":{\"sgemm_flops\":1e11,\"copy_bytes_per_s\":2e10}"
#define T(m) "{" HEAD ",\"metrics\":{\"a/b/run.t\":" m "}}"

static void test_malformed_baselines_refused(void **state) {
  (void)state;
  cJSON *b = baseline();
  vl_err err;
  assert_int_equal(vl_regress_validate(b, &err), 0);
  cJSON_Delete(b);
  expect_invalid("{}", "version");
  expect_invalid("[1, 2]", "expected an object");
  expect_invalid("{" HEAD "}", "metrics: expected an object, got nothing");
  expect_invalid("{" HEAD ",\"metrics\":null}", "metrics: expected an object, got null");
  expect_invalid("{" HEAD ",\"metrics\":\"x\"}", "metrics: expected an object, got a string");
  expect_invalid("{" HEAD ",\"metrics\":{}}", "metrics: empty");
  expect_invalid("{" HEAD ",\"metrics\":{\"a\":{\"kind\":\"exact\",\"value\":1}},\"metrics\":{}}", "appears twice");
  expect_invalid("{" HEAD ",\"metrics\":{\"a\":{\"kind\":\"exact\",\"value\":1},\"a\":{\"kind\":\"exact\",\"value\":2}}}",
                 "\"a\" appears twice");
  expect_invalid(T("{\"kind\":\"time\",\"median\":null,\"min\":0.1,\"calib\":\"sgemm\"}"), ".median: expected a finite number, got null");
  expect_invalid(T("{\"kind\":\"time\",\"median\":\"0.2\",\"min\":0.1,\"calib\":\"sgemm\"}"), "got a string");
  expect_invalid(T("{\"kind\":\"time\",\"min\":0.1,\"calib\":\"sgemm\"}"), ".median: expected a finite number, got nothing");
  expect_invalid(T("{\"kind\":\"time\",\"median\":1e308,\"min\":0.1,\"calib\":\"sgemm\"}"), "outside");
  expect_invalid(T("{\"kind\":\"time\",\"median\":0.1,\"min\":0.2,\"calib\":\"sgemm\"}"), "above the median");
  expect_invalid(T("{\"kind\":\"time\",\"median\":0.2,\"min\":0.1}"), ".calib");
  expect_invalid(T("{\"kind\":\"tol\",\"value\":1,\"tol\":1e308}"), ".tol: 1e+308 is outside");
  expect_invalid(T("{\"kind\":\"exact\"}"), ".value: expected a finite number");
  expect_invalid(T("{\"kind\":\"fast\",\"value\":1}"), "is not \"exact\"");
  expect_invalid(T("7"), "expected an object, got a number");
  expect_invalid("{\"version\":2,\"device_class\":\"c\",\"metrics\":{\"a\":{\"kind\":\"exact\",\"value\":1}}}",
                 "calibration: expected an object");
  expect_invalid("{\"version\":1,\"device_class\":\"c\",\"metrics\":{}}", "version: expected 2");
}

/* A now metric that cannot be compared (null, wrong kind) is a regression, never "ok". */
static void test_uncomparable_now_metric_fails(void **state) {
  (void)state;
  cJSON *b = baseline(), *n = baseline();
  cJSON *t = metric(n, "llm-lora/lora/run.step_time");
  cJSON_ReplaceItemInObject(t, "median", cJSON_CreateNull());
  assert_int_equal(compare(b, n, 0.07).regressed, 1);
  cJSON_Delete(n);
  n = baseline();
  cJSON_ReplaceItemInObject(metric(n, "seg-ckpt/ckpt/plan.peak_bytes"), "kind", cJSON_CreateString("time"));
  assert_int_equal(compare(b, n, 0.07).regressed, 1);
  cJSON_Delete(b);
  cJSON_Delete(n);
}

static void set_calib(cJSON *doc, double sgemm, double copy) {
  cJSON *c = cJSON_GetObjectItem(doc, "calibration");
  set_num(c, "sgemm_flops", sgemm);
  set_num(c, "copy_bytes_per_s", copy);
}

/* Timings are scaled by the host's calibration: a host half as fast that takes twice as long
 * is ok; one that takes three times as long regressed; one 3x slower than the band allows
 * is "not judged", a warning that neither passes nor fails the timing. */
static void test_timing_scaled_by_calibration(void **state) {
  (void)state;
  cJSON *b = baseline(), *n = baseline();
  cJSON *t = metric(n, "llm-lora/lora/run.step_time");
  set_calib(n, 0.5e11, 1e10);
  set_num(t, "median", 0.400);
  set_num(t, "min", 0.380);
  vl_regress_counts k = compare(b, n, 0.07);
  assert_int_equal(k.regressed, 0);
  assert_int_equal(k.incomparable, 0);
  set_num(t, "median", 0.600);
  set_num(t, "min", 0.570);
  assert_int_equal(compare(b, n, 0.07).regressed, 1);
  /* unscaled, the same times on an equally fast host: slower */
  set_calib(n, 1e11, 2e10);
  set_num(t, "median", 0.400);
  set_num(t, "min", 0.380);
  assert_int_equal(compare(b, n, 0.07).regressed, 1);
  /* a calibration within 15% is noise: raw times (a 10% faster reading does not turn an
   * unchanged step into a 10% slowdown) */
  set_calib(n, 1.1e11, 2e10);
  set_num(t, "median", 0.200);
  set_num(t, "min", 0.190);
  k = compare(b, n, 0.07);
  assert_int_equal(k.regressed, 0);
  assert_int_equal(k.ok, 3);
  /* a host at 0.3x of the baseline's sgemm: the baseline cannot speak for it */
  set_calib(n, 0.3e11, 2e10);
  set_num(t, "median", 5.0);
  set_num(t, "min", 5.0);
  k = compare(b, n, 0.07);
  assert_int_equal(k.regressed, 0);
  assert_int_equal(k.incomparable, 1);
  cJSON_Delete(b);
  cJSON_Delete(n);
}

/* Measured exact and tol numbers depend on the kernels: with the baseline's kernels exact;
 * with others, exact ones are not compared and tol ones get the cross-kernel tolerance. */
static void test_other_kernels(void **state) {
  (void)state;
  const char *text = "{" HEAD ",\"metrics\":{"
                     "\"s/c/run.measured_peak_bytes\":{\"kind\":\"exact\",\"value\":6010368,\"impl\":\"conv-A\"},"
                     "\"s/c/run.loss[2]\":{\"kind\":\"tol\",\"value\":1.3385,\"tol\":1e-4,\"xtol\":1e-2,\"impl\":\"conv-A\"}}}";
  cJSON *b = cJSON_Parse(text), *n = cJSON_Parse(text);
  cJSON *peak = metric(n, "s/c/run.measured_peak_bytes"), *loss = metric(n, "s/c/run.loss[2]");
  set_num(peak, "value", 5479168);
  set_num(loss, "value", 1.3395);
  /* same kernels: both changed */
  assert_int_equal(compare(b, n, 0.07).regressed, 2);
  /* other kernels: the peak not compared, the loss within 1e-2 */
  cJSON_ReplaceItemInObject(peak, "impl", cJSON_CreateString("conv-B"));
  cJSON_ReplaceItemInObject(loss, "impl", cJSON_CreateString("conv-B"));
  vl_regress_counts k = compare(b, n, 0.07);
  assert_int_equal(k.regressed, 0);
  assert_int_equal(k.incomparable, 1);
  assert_int_equal(k.ok, 1);
  /* a loss 5% off is a changed model, whatever the kernels */
  set_num(loss, "value", 1.3385 * 1.05);
  assert_int_equal(compare(b, n, 0.07).regressed, 1);
  cJSON_Delete(b);
  cJSON_Delete(n);
}

/* On a GPU the kernels are picked at run time: the same impl string is no promise of the same
 * numbers, so a tol metric marked runtime_kernels (either side) gets the cross-kernel
 * tolerance, an exact one is not compared. */
static void test_runtime_kernels(void **state) {
  (void)state;
  const char *text = "{" HEAD ",\"metrics\":{"
                     "\"s/c/run.pixel_accuracy\":{\"kind\":\"tol\",\"value\":0.5061,\"tol\":1e-3,\"xtol\":2e-2,\"impl\":\"\"},"
                     "\"s/c/run.peak\":{\"kind\":\"exact\",\"value\":100,\"impl\":\"\"}}}";
  cJSON *b = cJSON_Parse(text), *n = cJSON_Parse(text);
  cJSON *acc = metric(n, "s/c/run.pixel_accuracy"), *peak = metric(n, "s/c/run.peak");
  set_num(acc, "value", 0.5079); /* +0.0018: the H200's two runs */
  set_num(peak, "value", 101);
  /* a baseline made before the mark, a run without it: the baseline's kernels, both changed */
  assert_int_equal(compare(b, n, 0.07).regressed, 2);
  /* the run marked: within 2e-2, the exact one not compared */
  cJSON_AddTrueToObject(acc, "runtime_kernels");
  cJSON_AddTrueToObject(peak, "runtime_kernels");
  vl_regress_counts k = compare(b, n, 0.07);
  assert_int_equal(k.regressed, 0);
  assert_int_equal(k.ok, 1);
  assert_int_equal(k.incomparable, 1);
  /* the baseline marked, the run not: the same */
  cJSON_AddTrueToObject(metric(b, "s/c/run.pixel_accuracy"), "runtime_kernels");
  cJSON_DeleteItemFromObject(acc, "runtime_kernels");
  k = compare(b, n, 0.07);
  assert_int_equal(k.regressed, 0);
  assert_int_equal(k.ok, 1);
  /* beyond the cross-kernel tolerance it is still a regression */
  set_num(acc, "value", 0.5061 + 0.03);
  assert_int_equal(compare(b, n, 0.07).regressed, 1);
  cJSON_Delete(b);
  cJSON_Delete(n);
}

/* ---- the committed baseline travels: another host of its class, simulated -------------- */
#define COMMITTED "reports/baselines/cpu-amd-epyc-2c.json"

static cJSON *load(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  cJSON *d = cJSON_Parse(buf);
  if (!d) fail_msg("%s is not JSON", path);
  return d;
}

static void write_json(const char *path, const cJSON *d) {
  char *t = cJSON_Print(d);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(t, f);
  fclose(f);
  free(t);
}

/* The baseline as a faster host with other convolutions would have made it: every time 1.8x
 * shorter with a calibration 1.8x higher (inside the band the baseline speaks for); the
 * numbers that depend on the convolutions moved as they did on the second host of this
 * class that #22 ran on (peak -531,200 bytes, accuracy -0.0029, losses ~7e-4). */
static cJSON *other_host(const cJSON *committed) {
  cJSON *b = cJSON_Duplicate(committed, 1);
  cJSON *cal = cJSON_GetObjectItem(b, "calibration");
  set_num(cal, "sgemm_flops", num_of(cal, "sgemm_flops") * 1.8);
  set_num(cal, "copy_bytes_per_s", num_of(cal, "copy_bytes_per_s") * 1.8);
  cJSON *m;
  cJSON_ArrayForEach(m, cJSON_GetObjectItem(b, "metrics")) {
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(m, "kind"));
    if (!strcmp(kind, "time")) {
      set_num(m, "median", num_of(m, "median") / 1.8);
      set_num(m, "min", num_of(m, "min") / 1.8);
      cJSON_DeleteItemFromObject(m, "samples");
      continue;
    }
    const char *impl = cJSON_GetStringValue(cJSON_GetObjectItem(m, "impl"));
    if (!impl || !strstr(impl, "onednn")) continue;
    cJSON_ReplaceItemInObject(m, "impl", cJSON_CreateString("openblas-Zen onednn-2.6-isa7-89prims-0123456789abcdef"));
    double v = num_of(m, "value");
    if (strstr(m->string, "measured_peak_bytes")) set_num(m, "value", v + 531200);
    else if (strstr(m->string, "pixel_accuracy")) set_num(m, "value", v + 0.0029);
    else set_num(m, "value", v * (1 - 7.3e-4));
  }
  return b;
}

static int regress_main(const char *now, const char *base) {
  char *argv[] = {"regress", "--now", (char *)now, "--baseline", (char *)base, "--threshold", "0.5", NULL};
  fflush(stdout);
  return vl_regress_main(7, argv);
}

static void test_committed_baseline_travels(void **state) {
  (void)state;
  cJSON *now = load(COMMITTED);
  vl_err err;
  if (vl_regress_validate(now, &err)) fail_msg(COMMITTED ": %s", err.msg);
  char dir[] = "/tmp/vramlab-test-regress-XXXXXX", np[128], bp[128];
  assert_non_null(mkdtemp(dir));
  snprintf(np, sizeof np, "%s/now.json", dir);
  snprintf(bp, sizeof bp, "%s/base.json", dir);
  write_json(np, now);
  cJSON *b = other_host(now);
  vl_regress_counts k;
  vl_regress_compare(b, now, 0.5, VL_REGRESS_ROWS_ALL, NULL, &k);
  assert_int_equal(k.regressed, 0);
  assert_true(k.incomparable >= 1); /* the measured peak: another convolution's scratchpad */
  write_json(bp, b);
  assert_int_equal(regress_main(np, bp), 0);
  /* a real planned change of one page still fails */
  cJSON *pk = cJSON_GetObjectItem(cJSON_GetObjectItem(b, "metrics"), "seg-ckpt/ckpt/plan.peak_bytes");
  assert_non_null(pk);
  set_num(pk, "value", num_of(pk, "value") - 4096);
  vl_regress_compare(b, now, 0.5, VL_REGRESS_ROWS_ALL, NULL, &k);
  assert_int_equal(k.regressed, 1);
  write_json(bp, b);
  assert_int_equal(regress_main(np, bp), 1);
  /* a damaged baseline fails, an absent one is "not compared" (exit 0) */
  FILE *f = fopen(bp, "w");
  fputs("{}", f);
  fclose(f);
  assert_int_equal(regress_main(np, bp), 1);
  unlink(bp);
  assert_int_equal(regress_main(np, bp), 0);
  unlink(np);
  rmdir(dir);
  cJSON_Delete(b);
  cJSON_Delete(now);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_identical_passes),
      cmocka_unit_test(test_planned_bytes_one_page_fails),
      cmocka_unit_test(test_loss_tolerance),
      cmocka_unit_test(test_exact_apart_from_within_tolerance),
      cmocka_unit_test(test_timing_needs_median_and_min_slower),
      cmocka_unit_test(test_missing_and_new_metrics),
      cmocka_unit_test(test_device_class),
      cmocka_unit_test(test_malformed_baselines_refused),
      cmocka_unit_test(test_uncomparable_now_metric_fails),
      cmocka_unit_test(test_timing_scaled_by_calibration),
      cmocka_unit_test(test_other_kernels),
      cmocka_unit_test(test_runtime_kernels),
      cmocka_unit_test(test_committed_baseline_travels),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
