/* libFuzzer target: arbitrary bytes as a regress baseline through the path `vramlab regress`
 * takes (parse, vl_regress_validate, then vl_regress_compare against a fixed run of every
 * metric kind and against itself). Checks what #22 found broken: a document the validator
 * accepts must compare without a crash, judge every metric of a document against itself as
 * ok (a metric that was not compared never reads "ok" by accident: against itself every
 * comparable metric is ok and none is missing), and count every metric exactly once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/regress.h"

static cJSON *fixed_now(void) {
  static const char *text =
      "{\"version\":2,\"device_class\":\"cpu-fuzz-2c\",\"reps\":5,"
      "\"calibration\":{\"sgemm_flops\":1e11,\"copy_bytes_per_s\":2e10},\"metrics\":{"
      "\"a/b/plan.peak_bytes\":{\"kind\":\"exact\",\"value\":4096},"
      "\"a/b/run.loss[0]\":{\"kind\":\"tol\",\"value\":1.5,\"tol\":1e-4,\"xtol\":1e-2,\"impl\":\"k\"},"
      "\"a/b/run.step_time\":{\"kind\":\"time\",\"median\":0.2,\"min\":0.1,\"calib\":\"sgemm\"}}}";
  return cJSON_Parse(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static cJSON *now;
  if (!now && !(now = fixed_now())) abort();
  cJSON *base = cJSON_ParseWithLength((const char *)data, size);
  if (!base) return 0;
  vl_err err;
  if (vl_regress_validate(base, &err) == 0) {
    int n = cJSON_GetArraySize(cJSON_GetObjectItem(base, "metrics"));
    vl_regress_counts k;
    vl_regress_compare(base, now, 0.07, VL_REGRESS_ROWS_ALL, NULL, &k);
    if (k.ok + k.regressed + k.improved + k.incomparable != n) abort(); /* every metric judged once */
    vl_regress_compare(base, base, 0.07, VL_REGRESS_ROWS_ALL, NULL, &k);
    if (k.regressed || k.missing || k.added || k.ok + k.incomparable != n) abort();
    vl_regress_compare(now, base, 0.07, VL_REGRESS_ROWS_ALL, NULL, &k);
  } else if (!err.msg[0]) {
    abort(); /* a refusal always says why */
  }
  cJSON_Delete(base);
  return 0;
}
