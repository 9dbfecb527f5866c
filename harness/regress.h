/* `vramlab regress`: a short fixed configuration of every case compared with
 * reports/baselines/<device-class>.json (DESIGN.md "Results, reports, regression").
 *
 * Metrics and how each is judged:
 *   exact  plan numbers (parameters, planned bytes by category, FLOPs, largest batch) and
 *          the measured peak on the CPU: any difference is a regression
 *   tol    seeded losses and accuracies: |now - base| <= tol * max(1, |base|)
 *   time   seconds (lower is better): medians of >= 5 repetitions interleaved across the
 *          cases; a regression when the median is slower than the baseline's by more than
 *          the threshold AND the fastest sample is slower than the baseline's fastest by
 *          more than the threshold too (one noisy sample cannot fail it, nor one lucky one
 *          hide a slowdown)
 * A metric in the baseline that is missing now is a regression; a new one is reported. */
#ifndef VRAMLAB_REGRESS_H
#define VRAMLAB_REGRESS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>

typedef struct {
  int ok, regressed, improved, added, missing;
} vl_regress_counts;

/* Which rows the table lists: all; the measured ones (runs) and every plan row that is not
 * ok (the default: a few hundred exact plan numbers that match add nothing to read); only
 * the rows whose value moved (regress-update's report). */
typedef enum { VL_REGRESS_ROWS_ALL = 0, VL_REGRESS_ROWS_DEFAULT, VL_REGRESS_ROWS_CHANGED } vl_regress_rows;

/* Compare now with base (both {"metrics": {name: {"kind", "value" | "median"+"min", "tol"}}})
 * and print the table (metric, baseline, now, change, verdict) to out (NULL: no table). */
void vl_regress_compare(const cJSON *base, const cJSON *now, double threshold, vl_regress_rows rows, FILE *out,
                        vl_regress_counts *counts);

/* "cpu-<model>-<cores>c" or "cuda-<gpu>": lower-case, [a-z0-9-] only. */
void vl_regress_device_class(const char *device, const char *cpu, int cores, const char *gpu, char *out,
                             size_t n);

/* argv[0] is "regress"; the process exit status (1 on a regression, 2 on bad usage). */
int vl_regress_main(int argc, char **argv);

#endif
