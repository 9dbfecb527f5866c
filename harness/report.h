/* Markdown report with claims, ladder tables and gnuplot plots, from a results JSON. */
#ifndef VRAMLAB_REPORT_H
#define VRAMLAB_REPORT_H
#include <stdbool.h>
#include <stddef.h>
#include "case.h"

/* Verdicts, in the order DESIGN.md lists them. */
typedef enum { VL_HOLDS = 0, VL_DIRECTION_HOLDS, VL_DOES_NOT_HOLD, VL_NOT_MEASURABLE } vl_verdict;
const char *vl_verdict_name(vl_verdict v);
/* Judge a claim from measured before/after (NaN = not measured). Pure, unit-tested. */
vl_verdict vl_judge(const vl_claim *c, double before, double after);

/* Helpers for the cases' report sections. */
double vl_rep_num(const cJSON *o, const char *k);            /* NaN when absent */
double vl_rep_run_metric(const cJSON *rung, const char *k);  /* mean over repetitions */
const char *vl_rep_count(double v, char *b, size_t n);      /* 7.24B, 6.82M, 12.3k */
bool vl_rep_have_gnuplot(void);
/* Write dir/name.gp and run gnuplot in dir (errors to name.gnuplot.log); 0 on success. */
int vl_rep_gnuplot(const char *dir, const char *name, const char *script);

/* [x, bytes] pairs of a JSON array as "x GB" lines in dir/name; 0 on success. */
int vl_rep_write_pairs(const char *dir, const char *name, const cJSON *pairs);
/* dir/mem_by_category.dat (each rung's plan by_category at the peak, GB, and its cap) and
 * the gnuplot script of a stacked bar chart of it into script; 0 on success. */
int vl_rep_mem_by_category(cJSON *res, const char *dir, const char *title, char *script, size_t n);

int vl_report_write(const vl_case *c, const vl_ladder *L, const char *results_path,
                    const char *md_path, char *err, size_t errn);
#endif
