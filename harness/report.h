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

/* Verdicts, in the order docs/architecture.md "Verdicts" lists them. The rules (vl_judge):
 * - holds: the suite's number is inside the claim's tolerance or range.
 * - direction holds: outside it, but a change the same way as the claimed one and of a
 *   comparable size: between a quarter of and twice the claimed change on a log scale
 *   (linear where a value is <= 0). Beyond that band either way it is another result:
 *   does not hold, the note saying "much smaller" or "far beyond".
 * - inconclusive (within noise): the measured change is inside the spread of the
 *   repetitions (or the claim's range is reachable inside it); never a hold.
 * - does not hold: the opposite change, no change where one is claimed, or outside the band.
 * - by construction: the evidence only echoes a setting (basis configured); never a hold.
 * - not measurable here: no number (another device, a model the engine lacks: the reason). */
typedef enum {
  VL_HOLDS = 0,
  VL_DIRECTION_HOLDS,
  VL_INCONCLUSIVE,
  VL_DOES_NOT_HOLD,
  VL_BY_CONSTRUCTION,
  VL_NOT_MEASURABLE,
  VL_N_VERDICTS
} vl_verdict;
const char *vl_verdict_name(vl_verdict v);
/* The suite's two numbers of a claim with their spread: [lo, hi] each (NaN: exact). */
typedef struct {
  double before, after;
  double b_lo, b_hi, a_lo, a_hi;
} vl_evidence;
typedef struct {
  vl_verdict v;
  const char *why; /* a static phrase for the note ("far beyond the claim"), or "" */
} vl_judgement;
/* Judge a claim from the suite's numbers (NaN = not measured). Pure, unit-tested. */
vl_judgement vl_judge_ev(const vl_claim *c, const vl_evidence *ev);
/* The same for exact numbers (no spread). */
vl_verdict vl_judge(const vl_claim *c, double before, double after);
/* The verdict tallies of one report (vl_report_verdicts): article claims by verdict, holds
 * split by basis (planned and measured apart from modeled or a named stand-in), suite
 * checks apart. */
typedef struct {
  int article[VL_N_VERDICTS];
  int on_model[VL_N_VERDICTS]; /* of article[v]: resting on a model or a named stand-in */
  int suite[VL_N_VERDICTS];
} vl_tally;

/* ---- reading a results file -------------------------------------------------------------- */
#define VL_RESULTS_SCHEMA_VERSION 1
#define VL_RESULTS_MAX_BYTES ((size_t)256 << 20) /* a full-scale results file is < 1 MiB */
/* Whether res is a results file of case c that the report can read: schema version, case,
 * rungs of c's ladder, the types of every field the report reads. VL_OK, or VL_ERR_INVALID
 * with the offending path in e ("rungs[2].name: expected a string"). */
vl_status vl_results_validate(const cJSON *res, const vl_case *c, const vl_ladder *L, vl_err *e);

/* Read, validate and report a results file: nothing is written (not even the report
 * folder's copy of the results) unless the file is valid. */
/* The tallies of c's claims judged from res, as vl_report_write judges them. */
void vl_report_verdicts(const vl_case *c, const vl_ladder *L, cJSON *res, vl_tally *t);
vl_status vl_report_write(const vl_case *c, const vl_ladder *L, const char *results_path,
                          const char *md_path, vl_err *e);
#endif
