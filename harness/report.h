/* Markdown report with claims, ladder tables and gnuplot plots, from a results JSON. */
#ifndef VRAMLAB_REPORT_H
#define VRAMLAB_REPORT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "case.h"

/* Verdicts, in the order docs/architecture.md "Results, reports and verdicts" lists them. */
typedef enum { VL_HOLDS = 0, VL_DIRECTION_HOLDS, VL_DOES_NOT_HOLD, VL_NOT_MEASURABLE } vl_verdict;
const char *vl_verdict_name(vl_verdict v);
/* Judge a claim from measured before/after (NaN = not measured). Pure, unit-tested. */
vl_verdict vl_judge(const vl_claim *c, double before, double after);

/* ---- reading a results file -------------------------------------------------------------- */
#define VL_RESULTS_SCHEMA_VERSION 1
#define VL_RESULTS_MAX_BYTES ((size_t)256 << 20) /* a full-scale results file is < 1 MiB */
/* Whether res is a results file of case c that the report can read: schema version, case,
 * rungs of c's ladder, the types of every field the report reads. 0, or -1 with the
 * offending path in err ("rungs[2].name: expected a string"). */
int vl_results_validate(const cJSON *res, const vl_case *c, const vl_ladder *L, char *err, size_t errn);

/* ---- helpers for the cases' report sections --------------------------------------------- */
double vl_rep_num(const cJSON *o, const char *k);            /* NaN when absent or not finite */
double vl_rep_numv(const cJSON *v);                          /* the same for a value itself */
double vl_rep_run_metric(const cJSON *rung, const char *k);  /* mean over repetitions */
const char *vl_rep_count(double v, char *b, size_t n);      /* 7.24B, 6.82M, 12.3k; NaN: — */
/* v printed with fmt (one double conversion, e.g. "%.2f", "%.0f%%"), or "—" when v is NaN or
 * infinite. The text lives in a ring of buffers: valid for the next 31 calls, enough for
 * one table row. */
const char *vl_rep_fmt(const char *fmt, double v);
/* The string member k of o for a markdown table cell (no '|', no line breaks or control
 * bytes, at most ~250 bytes), or "—" when absent; same ring of buffers as vl_rep_fmt. */
const char *vl_rep_str(const cJSON *o, const char *k);
/* A results file's pieces the case reports read: a rung's plan, its first run (NULL when
 * none), the rung called `name` (NULL when none), and a JSON boolean as "yes" / "**no**" /
 * "—" (missing). */
const cJSON *vl_rep_plan(const cJSON *rung);
const cJSON *vl_rep_run0(const cJSON *rung);
const cJSON *vl_rep_rung(const cJSON *res, const char *name);
const char *vl_rep_yes_no(const cJSON *b);

/* ---- plots -------------------------------------------------------------------------------- */
/* Any outside string (a rung name, a label, a title) made safe for a gnuplot script or data
 * file: bytes outside [A-Za-z0-9 _.,:;+-/()%=<>] become '_' (quotes, backslashes, line
 * breaks, control bytes, '@', '`', '$', '#', UTF-8), at most n - 1 bytes (and at most
 * VL_REP_GP_MAX). token: also spaces, so it is one column of a data file (xtic()); never
 * empty. NULL gives "?". Returns buf. */
#define VL_REP_GP_MAX 120
const char *vl_rep_gp_str(const char *s, bool token, char *buf, size_t n);
/* Whether plots are rendered: gnuplot is installed and VRAMLAB_NO_GNUPLOT is unset (or 0). */
bool vl_rep_have_gnuplot(void);
/* Write dir/name.gp (whole or not at all) and run gnuplot in dir (errors to
 * name.gnuplot.log) into a temp PNG that replaces dir/name.png only when gnuplot succeeded
 * and the PNG is whole. The script sets `set output vl_png` (the .gp defines vl_png as
 * 'name.png' when run by hand). name: [A-Za-z0-9_-]. 0, or -1 with the reason in why. */
int vl_rep_gnuplot(const char *dir, const char *name, const char *script, char *why, size_t whyn);
/* One plot of a report: writes the script, renders it when gnuplot is on, and writes into md
 * the image link, or a line saying that plot `name` is missing and why (a stale PNG of
 * another results file is removed). 0 when the PNG is there. */
int vl_rep_plot(FILE *md, const char *dir, const char *case_id, bool gnuplot, const char *name,
                const char *alt, const char *script);
/* A plot that could not be made (its data file failed): md says so; a stale PNG goes. */
void vl_rep_plot_missing(FILE *md, const char *dir, const char *name, const char *why);

/* A data file built in memory (fprintf into f) and then written whole or not at all. */
typedef struct { FILE *f; char *buf; size_t len; } vl_rep_dat;
int vl_rep_dat_open(vl_rep_dat *d); /* 0, or -1 (out of memory) */
/* Writes dir/name through a temp file and a rename, and frees d; 0, or -1 with why. */
int vl_rep_dat_commit(vl_rep_dat *d, const char *dir, const char *name, char *why, size_t whyn);

/* [x, bytes] pairs of a JSON array as "x GB" lines in dir/name (entries that are no pair of
 * numbers are skipped); 0, or -1 with why. */
int vl_rep_write_pairs(const char *dir, const char *name, const cJSON *pairs, char *why, size_t whyn);
/* dir/mem_by_category.dat (each rung's plan by_category at the peak, GB, and its cap) and
 * the gnuplot script of a stacked bar chart of it into script; 0, or -1 with why. */
int vl_rep_mem_by_category(const cJSON *res, const char *dir, const char *title, char *script, size_t n,
                           char *why, size_t whyn);

/* Read, validate and report a results file: nothing is written (not even the report
 * folder's copy of the results) unless the file is valid. */
/* The verdict counts of c's claims judged from res (holds, direction only, does not hold,
 * not measurable), as vl_report_write judges them. */
void vl_report_verdicts(const vl_case *c, const vl_ladder *L, cJSON *res, int counts[4]);
int vl_report_write(const vl_case *c, const vl_ladder *L, const char *results_path,
                    const char *md_path, char *err, size_t errn);
#endif
