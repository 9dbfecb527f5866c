/* reports/<case>.md: setting, claims with verdicts, ladder tables, plots (gnuplot PNG). */
#include "report.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *vl_verdict_name(vl_verdict v) {
  switch (v) {
    case VL_HOLDS: return "holds";
    case VL_DIRECTION_HOLDS: return "direction holds";
    case VL_DOES_NOT_HOLD: return "does not hold";
    default: return "not measurable here";
  }
}

static int sgn(double x) { return (x > 0) - (x < 0); }

vl_verdict vl_judge(const vl_claim *c, double before, double after) {
  if (!strcmp(c->kind, "ratio_range")) {
    /* the measured change after/before inside [lo, hi]; else the direction of the range */
    if (isnan(after) || isnan(before) || before == 0) return VL_NOT_MEASURABLE;
    double r = after / before, mid = 0.5 * (c->lo + c->hi);
    if (r >= c->lo && r <= c->hi) return VL_HOLDS;
    return sgn(r - 1) == sgn(mid - 1) ? VL_DIRECTION_HOLDS : VL_DOES_NOT_HOLD;
  }
  if (!strcmp(c->kind, "range")) {
    if (isnan(after)) return VL_NOT_MEASURABLE;
    return after >= c->lo && after <= c->hi ? VL_HOLDS : VL_DOES_NOT_HOLD;
  }
  if (isnan(after) || isnan(before)) return VL_NOT_MEASURABLE;
  double ab = c->article_before, aa = c->article_after;
  if (!strcmp(c->kind, "ratio")) {
    if (before == 0 || ab == 0) return VL_NOT_MEASURABLE;
    double mr = after / before, ar = aa / ab;
    if (fabs(mr - ar) <= c->tol * fabs(ar)) return VL_HOLDS;
    return sgn(mr - 1) == sgn(ar - 1) ? VL_DIRECTION_HOLDS : VL_DOES_NOT_HOLD;
  }
  /* value: both measured ends against the article's (a claim without an article "before"
   * is judged on its "after"); tolerance relative, absolute where the article says 0 */
  bool after_ok = fabs(after - aa) <= (aa != 0 ? c->tol * fabs(aa) : c->tol) + 1e-12;
  bool before_ok = isnan(ab) || fabs(before - ab) <= (ab != 0 ? c->tol * fabs(ab) : c->tol) + 1e-12;
  if (after_ok && before_ok) return VL_HOLDS;
  return sgn(after - before) == sgn(aa - ab) ? VL_DIRECTION_HOLDS : VL_DOES_NOT_HOLD;
}

/* ---- metric lookup ------------------------------------------------------------------------ */
static cJSON *find_rung(cJSON *res, const char *name) {
  cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs"))
    if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), name)) return r;
  return NULL;
}

double vl_rep_num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItem(o, k);
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* A run metric across repetitions: the mean of the repetitions' values. */
double vl_rep_run_metric(const cJSON *rung, const char *k) {
  double s = 0;
  int n = 0;
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(rung, "runs")) {
    double v = vl_rep_num(r, k);
    if (!isnan(v)) { s += v; n++; }
  }
  return n ? s / n : NAN;
}

static double metric(const vl_case *c, const vl_ladder *L, cJSON *res, const char *rung,
                     const char *set, const char *m) {
  if (!rung[0]) return NAN;
  if (set && set[0]) {
    /* a side plan: the rung varied by `set` */
    int i = vl_ladder_find(L, rung);
    if (i < 0) return NAN;
    vl_knobs k = L->rungs[i].knobs;
    char err[256];
    if (vl_knobs_apply_list(&k, set, err, sizeof err)) return NAN;
    vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L->setting, .quiet = 1};
    cJSON *o = cJSON_CreateObject();
    double v = c->plan(&env, "full", &k, o, err, sizeof err) ? NAN : vl_rep_num(o, m);
    cJSON_Delete(o);
    return v;
  }
  cJSON *r = find_rung(res, rung);
  if (!r) return NAN;
  double v = vl_rep_num(cJSON_GetObjectItem(r, "plan"), m);
  if (isnan(v)) v = vl_rep_run_metric(r, m);
  /* case-wide measurements (a sweep's best setting, a ceiling) stand for every rung */
  return isnan(v) ? vl_rep_num(cJSON_GetObjectItem(res, "case_metrics"), m) : v;
}

static const char *fmt_val(double v, const char *unit, char *b, size_t n) {
  if (isnan(v)) snprintf(b, n, "—");
  else if (!strcmp(unit, "bytes")) snprintf(b, n, "%.2f GB", v / 1e9);
  else if (!strcmp(unit, "share")) snprintf(b, n, "%.0f%%", 100 * v);
  else if (!strcmp(unit, "count")) snprintf(b, n, "%.0f", v);
  else snprintf(b, n, "%.3g", v);
  return b;
}

static const char *fmt_ratio(double r, char *b, size_t n) {
  if (isnan(r) || isinf(r)) snprintf(b, n, "—");
  else snprintf(b, n, "×%.3g", r);
  return b;
}

const char *vl_rep_count(double v, char *b, size_t n) {
  if (v >= 1e9) snprintf(b, n, "%.2fB", v / 1e9);
  else if (v >= 1e6) snprintf(b, n, "%.2fM", v / 1e6);
  else if (v >= 1e3) snprintf(b, n, "%.1fk", v / 1e3);
  else snprintf(b, n, "%.0f", v);
  return b;
}

/* ---- plots -------------------------------------------------------------------------------- */
bool vl_rep_have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

int vl_rep_gnuplot(const char *dir, const char *name, const char *script) {
  char path[1024], cmd[2200];
  snprintf(path, sizeof path, "%s/%s.gp", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(script, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "cd '%s' && gnuplot '%s.gp' 2>'%s.gnuplot.log'", dir, name, name);
  int rc = system(cmd) == 0 ? 0 : -1;
  if (rc == 0) { /* keep the log only when it explains a failure */
    snprintf(path, sizeof path, "%s/%s.gnuplot.log", dir, name);
    remove(path);
  }
  return rc;
}

/* ---- the report --------------------------------------------------------------------------- */
int vl_report_write(const vl_case *c, const vl_ladder *L, const char *results_path,
                    const char *md_path, char *err, size_t errn) {
  size_t n;
  char *text = vl_read_file(results_path, &n);
  if (!text) { snprintf(err, errn, "cannot read %s (run `vramlab run %s` first)", results_path, c->id); return -1; }
  cJSON *res = cJSON_Parse(text);
  if (!res || !cJSON_IsArray(cJSON_GetObjectItem(res, "rungs"))) {
    snprintf(err, errn, "%s is not a vramlab results file (truncated or corrupt?)", results_path);
    cJSON_Delete(res);
    free(text);
    return -1;
  }
  /* The report's own folder keeps the results it was made from, so it stands on its own. */
  char dir[1024], copy[1100];
  snprintf(dir, sizeof dir, "%.*s/%s", (int)(strrchr(md_path, '/') - md_path), md_path, c->id);
  snprintf(copy, sizeof copy, "%s/results.json", dir);
  int wrc = vl_mkdir_p(dir) ? -1 : vl_write_atomic(copy, text, err, errn);
  free(text);
  if (wrc) {
    if (!err[0]) snprintf(err, errn, "cannot create %s", dir);
    cJSON_Delete(res);
    return -1;
  }
  char *buf = NULL;
  size_t blen = 0;
  FILE *md = open_memstream(&buf, &blen);
  cJSON *env = cJSON_GetObjectItem(res, "env");
  const char *scale = cJSON_GetStringValue(cJSON_GetObjectItem(res, "run_scale"));
  fprintf(md, "# %s — %s\n\n", c->id, vl_knob_get(&L->setting, "title") ? vl_knob_get(&L->setting, "title") : c->summary);
  fprintf(md, "_Generated by `vramlab report %s` from `%s` (copied to `%s/results.json`). Device: %s; "
              "CPU: %s (%g cores); GPU: %s; commit %s; %s._\n\n",
          c->id, results_path, c->id, cJSON_GetStringValue(cJSON_GetObjectItem(env, "device")),
          cJSON_GetStringValue(cJSON_GetObjectItem(env, "cpu")), vl_rep_num(env, "cores"),
          cJSON_GetStringValue(cJSON_GetObjectItem(env, "gpu")),
          cJSON_GetStringValue(cJSON_GetObjectItem(env, "git_commit")),
          cJSON_GetStringValue(cJSON_GetObjectItem(env, "time")));
  if (cJSON_IsTrue(cJSON_GetObjectItem(res, "interrupted")))
    fprintf(md, "**This run was interrupted: the tables hold what finished.**\n\n");
  fprintf(md, "## Setting\n\n");
  if (c->method) fprintf(md, "%s\n\n", c->method);
  fprintf(md, "Runs were measured at the **`%s` scale on `%s`**; timings are compared only as ratios "
              "within this run.\n\n",
          scale ? scale : "?", cJSON_GetStringValue(cJSON_GetObjectItem(env, "device")));
  fprintf(md, "Case settings:");
  for (int i = 0; i < L->setting.n; i++) fprintf(md, " `%s=%s`", L->setting.k[i].key, L->setting.k[i].val);
  fprintf(md, "\n\n");

  fprintf(md, "## Claims\n\n| claim | source | article before → after | measured before → after | verdict | note |\n|---|---|---|---|---|---|\n");
  int counts[4] = {0};
  for (int i = 0; i < L->n_claims; i++) {
    const vl_claim *cl = &L->claims[i];
    double b = metric(c, L, res, cl->before, cl->before_set, cl->metric);
    double a = metric(c, L, res, cl->after, cl->after_set, cl->metric);
    vl_verdict v = vl_judge(cl, b, a);
    const char *dev = cJSON_GetStringValue(cJSON_GetObjectItem(env, "device"));
    if (cl->needs[0] && (!dev || strcmp(dev, cl->needs))) v = VL_NOT_MEASURABLE;
    counts[v]++;
    char x1[32], x2[32], y1[32], y2[32];
    if (!strcmp(cl->kind, "range"))
      fprintf(md, "| %s | %s | %g–%g | %s (rung %s) | **%s** | %s |\n", cl->text, cl->source, cl->lo,
              cl->hi, fmt_val(a, cl->unit, y2, sizeof y2), cl->after, vl_verdict_name(v), cl->note);
    else if (!strcmp(cl->kind, "ratio_range"))
      fprintf(md, "| %s | %s | ×%g–%g | %s (%s → %s) | **%s** | %s |\n", cl->text, cl->source, cl->lo,
              cl->hi, fmt_ratio(a / b, y1, sizeof y1), cl->before, cl->after, vl_verdict_name(v), cl->note);
    else if (!strcmp(cl->kind, "ratio"))
      fprintf(md, "| %s | %s | ×%.3g | %s (%s → %s) | **%s** | %s |\n", cl->text, cl->source,
              cl->article_after / cl->article_before, fmt_ratio(a / b, y1, sizeof y1), cl->before, cl->after, vl_verdict_name(v), cl->note);
    else
      fprintf(md, "| %s | %s | %s → %s | %s → %s | **%s** | %s |\n", cl->text, cl->source,
              fmt_val(cl->article_before, cl->unit, x1, sizeof x1), fmt_val(cl->article_after, cl->unit, x2, sizeof x2),
              fmt_val(b, cl->unit, y1, sizeof y1), fmt_val(a, cl->unit, y2, sizeof y2), vl_verdict_name(v), cl->note);
  }
  fprintf(md, "\n%d hold, %d hold in direction only, %d do not hold, %d not measurable here.\n\n",
          counts[0], counts[1], counts[2], counts[3]);

  bool gp = vl_rep_have_gnuplot();
  if (c->report) c->report(res, md, dir, c->id, gp);
  if (!gp) fprintf(md, "Plots are missing: gnuplot is not installed (`apt-get install gnuplot-nox`).\n\n");
  fclose(md);
  cJSON_Delete(res);
  int rc = vl_write_atomic(md_path, buf, err, errn);
  free(buf);
  return rc;
}

/* ---- shared plot data -------------------------------------------------------------------- */

int vl_rep_write_pairs(const char *dir, const char *name, const cJSON *pairs) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  const cJSON *pt;
  cJSON_ArrayForEach(pt, pairs)
    fprintf(f, "%g %.4f\n", cJSON_GetArrayItem(pt, 0)->valuedouble, cJSON_GetArrayItem(pt, 1)->valuedouble / 1e9);
  fclose(f);
  return 0;
}

int vl_rep_mem_by_category(cJSON *res, const char *dir, const char *title, char *script, size_t n) {
  static const char *cats[] = {"frozen", "params", "grads", "optim", "acts", "temp", "workspace", "data", "comm"};
  char path[1024];
  snprintf(path, sizeof path, "%s/mem_by_category.dat", dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "index rung");
  for (int i = 0; i < 9; i++) fprintf(f, " %s", cats[i]);
  fprintf(f, " cap\n");
  cJSON *r;
  int idx = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    cJSON *p = cJSON_GetObjectItem(r, "plan"), *bc = cJSON_GetObjectItem(p, "by_category");
    fprintf(f, "%d %s", idx++, cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")));
    for (int i = 0; i < 9; i++) fprintf(f, " %.4f", vl_rep_num(bc, cats[i]) / 1e9);
    fprintf(f, " %.4f\n", vl_rep_num(p, "cap_bytes") / 1e9);
  }
  fclose(f);
  snprintf(script, n,
           "set terminal png size 1000,560 noenhanced\nset output 'mem_by_category.png'\n"
           "set title '%s'\n"
           "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.85 border -1\n"
           "set boxwidth 0.7\nset ylabel 'GB'\nset key outside right\nset xtics rotate by -30\nset yrange [0:*]\n"
           "array col[9] = ['#7b3294', '#1b9e77', '#80b1d3', '#e6ab02', '#f0e442', '#377eb8', '#e41a1c', '#333333', '#a65628']\n"
           "plot for [i=3:11] 'mem_by_category.dat' using i:xtic(2) title columnheader(i) lc rgb col[i-2], "
           "'' using 1:12 with linespoints lw 2 pt 7 lc rgb 'red' title 'cap'\n",
           title);
  return 0;
}
