/* The driver's markdown report with claims, ladder tables and gnuplot plots, from a results
 * JSON (report.c); the cases' sections use the kit's helpers (kit/rep.h). */
#ifndef VRAMLAB_REPORT_H
#define VRAMLAB_REPORT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "kit/rep.h"
#include "ladder.h"
#include "registry.h"

/* Verdicts, in the order docs/architecture.md "Results, reports and verdicts" lists them. */
typedef enum { VL_HOLDS = 0, VL_DIRECTION_HOLDS, VL_DOES_NOT_HOLD, VL_NOT_MEASURABLE } vl_verdict;
const char *vl_verdict_name(vl_verdict v);
/* Judge a claim from measured before/after (NaN = not measured). Pure, unit-tested. */
vl_verdict vl_judge(const vl_claim *c, double before, double after);

/* ---- reading a results file -------------------------------------------------------------- */
#define VL_RESULTS_SCHEMA_VERSION 1
#define VL_RESULTS_MAX_BYTES ((size_t)256 << 20) /* a full-scale results file is < 1 MiB */
/* Whether res is a results file of case c that the report can read: schema version, case,
 * rungs of c's ladder, the types of every field the report reads. VL_OK, or VL_ERR_INVALID
 * with the offending path in e ("rungs[2].name: expected a string"). */
vl_status vl_results_validate(const cJSON *res, const vl_case *c, const vl_ladder *L, vl_err *e);

/* Read, validate and report a results file: nothing is written (not even the report
 * folder's copy of the results) unless the file is valid. */
/* The verdict counts of c's claims judged from res (holds, direction only, does not hold,
 * not measurable), as vl_report_write judges them. */
void vl_report_verdicts(const vl_case *c, const vl_ladder *L, cJSON *res, int counts[4]);
vl_status vl_report_write(const vl_case *c, const vl_ladder *L, const char *results_path,
                          const char *md_path, vl_err *e);
#endif
