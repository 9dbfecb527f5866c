/* `vramlab regress`: a short fixed configuration of every case compared with
 * reports/baselines/<device-class>.json (docs/architecture.md "Regress and baselines").
 *
 * Metrics and how each is judged:
 *   exact  plan numbers (parameters, planned bytes by category, FLOPs, largest batch) and
 *          the measured peak on the CPU: any difference is a regression. A measured number
 *          carries "impl", the kernels it depends on (OpenBLAS's sgemm core, the oneDNN
 *          convolutions chosen for this host's ISA and caches: vl_cpu_*_key); where this
 *          host's differ from the baseline's it is "not compared (other kernels)".
 *   tol    seeded losses and accuracies: |now - base| <= tol * max(1, |base|); with other
 *          kernels, xtol instead (the trajectory drifts, a changed model moves it further)
 *   time   seconds (lower is better): medians of >= 5 repetitions interleaved across the
 *          cases, scaled to the baseline host's speed by the calibration measured in the
 *          same run ("calib": sgemm FLOP/s for compute-bound steps, memcpy bandwidth for
 *          the loaders; a speed within ±15% is the calibration's noise and not scaled;
 *          "none" on a GPU, whose device class already names the card); a regression when the scaled median is slower than the baseline's
 *          by more than the threshold AND the scaled fastest sample is slower than the
 *          baseline's fastest by more than the threshold too (one noisy sample cannot fail
 *          it, nor one lucky one hide a slowdown). A host faster or slower than the
 *          baseline's by more than VL_REGRESS_CALIB_BAND is one the baseline cannot speak
 *          for: its timings are "not judged", a warning, never a pass or a failure.
 * A metric in the baseline that is missing now, or that cannot be compared (wrong type,
 * null, out of range), is a regression; a new one is reported. A baseline is validated
 * before anything is compared (vl_regress_validate): a malformed one is an error. A host
 * whose device class has no baseline is "not compared": neither a pass nor a failure. */
#ifndef VRAMLAB_REGRESS_H
#define VRAMLAB_REGRESS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>

#include "vramlab/core.h" /* vl_status, vl_err */

#define VL_REGRESS_VERSION 2
#define VL_REGRESS_CALIB_BAND 2.0
#define VL_REGRESS_CALIB_NOISE 1.15

/* ok = exact + within_tol + the timings inside the threshold: a number exactly as in the baseline
 * is told apart from one that moved inside its tolerance (a seeded loss's 1e-15). */
typedef struct {
  int ok, regressed, improved, added, missing, incomparable;
  int exact, within_tol;
} vl_regress_counts;

/* 0 when doc is a metrics document this version can compare: {"version", "device_class",
 * "calibration": {"sgemm_flops", "copy_bytes_per_s"}, "metrics": {name: {"kind": "exact",
 * "value"} | {"kind": "tol", "value", "tol" <= 0.1, "xtol"?} | {"kind": "time", "median",
 * "min" <= median, "calib"}}}, every number finite and in range, no key twice; else
 * VL_ERR_INVALID with the offending path in e. */
vl_status vl_regress_validate(const cJSON *doc, vl_err *e);

/* Which rows the table lists: all; the measured ones (runs) and every plan row that is not
 * ok (the default: a few hundred exact plan numbers that match add nothing to read); only
 * the rows whose value moved (regress-update's report). */
typedef enum { VL_REGRESS_ROWS_ALL = 0, VL_REGRESS_ROWS_DEFAULT, VL_REGRESS_ROWS_CHANGED } vl_regress_rows;

/* Compare now with base (both validated documents, as above) and print the table (metric,
 * baseline, now, change, verdict) to out (NULL: no table). */
void vl_regress_compare(const cJSON *base, const cJSON *now, double threshold, vl_regress_rows rows, FILE *out,
                        vl_regress_counts *counts);

/* "cpu-<model>-<cores>c" or "cuda-<gpu>": lower-case, [a-z0-9-] only. */
void vl_regress_device_class(const char *device, const char *cpu, int cores, const char *gpu, char *out,
                             size_t n);

/* argv[0] is "regress"; the process exit status (1 on a regression, 2 on bad usage). */
int vl_regress_main(int argc, char **argv);

#endif
