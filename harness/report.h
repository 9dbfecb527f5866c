/* Markdown report with claims, ladder tables and gnuplot plots, from a results JSON. */
#ifndef VRAMLAB_REPORT_H
#define VRAMLAB_REPORT_H
#include <stddef.h>
#include "case.h"

/* Verdicts, in the order DESIGN.md lists them. */
typedef enum { VL_HOLDS = 0, VL_DIRECTION_HOLDS, VL_DOES_NOT_HOLD, VL_NOT_MEASURABLE } vl_verdict;
const char *vl_verdict_name(vl_verdict v);
/* Judge a claim from measured before/after (NaN = not measured). Pure, unit-tested. */
vl_verdict vl_judge(const vl_claim *c, double before, double after);

int vl_report_write(const vl_case *c, const vl_ladder *L, const char *results_path,
                    const char *md_path, char *err, size_t errn);
#endif
