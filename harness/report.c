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

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItem(o, k);
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* A run metric across repetitions: the mean of the repetitions' values. */
static double run_metric(const cJSON *rung, const char *k) {
  double s = 0;
  int n = 0;
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(rung, "runs")) {
    double v = num(r, k);
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
    double v = c->plan(&env, "full", &k, o, err, sizeof err) ? NAN : num(o, m);
    cJSON_Delete(o);
    return v;
  }
  cJSON *r = find_rung(res, rung);
  if (!r) return NAN;
  double v = num(cJSON_GetObjectItem(r, "plan"), m);
  return isnan(v) ? run_metric(r, m) : v;
}

static const char *fmt_val(double v, const char *unit, char *b, size_t n) {
  if (isnan(v)) snprintf(b, n, "—");
  else if (!strcmp(unit, "bytes")) snprintf(b, n, "%.2f GB", v / 1e9);
  else if (!strcmp(unit, "share")) snprintf(b, n, "%.0f%%", 100 * v);
  else if (!strcmp(unit, "count")) snprintf(b, n, "%.0f", v);
  else snprintf(b, n, "%.3g", v);
  return b;
}

static const char *fmt_count(double v, char *b, size_t n) {
  if (v >= 1e9) snprintf(b, n, "%.2fB", v / 1e9);
  else if (v >= 1e6) snprintf(b, n, "%.2fM", v / 1e6);
  else if (v >= 1e3) snprintf(b, n, "%.1fk", v / 1e3);
  else snprintf(b, n, "%.0f", v);
  return b;
}

/* ---- plots -------------------------------------------------------------------------------- */
static int have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

static int run_gnuplot(const char *dir, const char *name, const char *script) {
  char path[1024], cmd[2200];
  snprintf(path, sizeof path, "%s/%s.gp", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(script, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "cd '%s' && gnuplot '%s.gp' 2>'%s.gnuplot.log'", dir, name, name);
  return system(cmd) == 0 ? 0 : -1;
}

static void plots(const vl_ladder *L, cJSON *res, const char *dir, FILE *md, const char *case_id) {
  static const char *cats[] = {"frozen", "params", "grads", "optim", "acts", "temp", "workspace", "data", "comm"};
  char path[1024];
  /* 1. memory by category at the peak, per rung (stacked bars) */
  snprintf(path, sizeof path, "%s/mem_by_category.dat", dir);
  FILE *f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "index rung");
  for (int i = 0; i < 9; i++) fprintf(f, " %s", cats[i]);
  fprintf(f, " cap\n");
  cJSON *r;
  int idx = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    cJSON *p = cJSON_GetObjectItem(r, "plan"), *bc = cJSON_GetObjectItem(p, "by_category");
    fprintf(f, "%d %s", idx++, cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")));
    for (int i = 0; i < 9; i++) fprintf(f, " %.4f", num(bc, cats[i]) / 1e9);
    fprintf(f, " %.4f\n", num(p, "cap_bytes") / 1e9);
  }
  fclose(f);
  const char *s1 =
      "set terminal png size 1000,560\nset output 'mem_by_category.png'\n"
      "set title 'Peak memory by category per rung (planned, full scale, batch as configured)'\n"
      "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.85 border -1\n"
      "set boxwidth 0.7\nset ylabel 'GB'\nset key outside right\nset xtics rotate by -30\nset yrange [0:*]\n"
      "array col[9] = ['#7b3294', '#1b9e77', '#80b1d3', '#e6ab02', '#f0e442', '#377eb8', '#e41a1c', '#333333', '#a65628']\n"
      "plot for [i=3:11] 'mem_by_category.dat' using i:xtic(2) title columnheader(i) lc rgb col[i-2], "
      "'' using 1:12 with linespoints lw 2 pt 7 lc rgb 'red' title 'cap'\n";
  /* 2. memory timeline of one step (after rung) */
  cJSON *last = NULL;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) last = r;
  snprintf(path, sizeof path, "%s/timeline.dat", dir);
  f = fopen(path, "w");
  if (!f) return;
  cJSON *pt;
  cJSON_ArrayForEach(pt, cJSON_GetObjectItem(cJSON_GetObjectItem(last, "plan"), "timeline"))
    fprintf(f, "%g %.4f\n", cJSON_GetArrayItem(pt, 0)->valuedouble, cJSON_GetArrayItem(pt, 1)->valuedouble / 1e9);
  fclose(f);
  char s2[1024];
  snprintf(s2, sizeof s2,
           "set terminal png size 1000,480\nset output 'timeline.png'\n"
           "set title 'Live memory during one training step: rung %s (planned, full scale)'\n"
           "set xlabel 'allocator event'\nset ylabel 'GB'\nset grid\n"
           "plot 'timeline.dat' using 1:2 with lines lw 2 title 'live bytes'\n",
           cJSON_GetStringValue(cJSON_GetObjectItem(last, "name")));
  /* 3. batch vs peak with the cap line (after rung) */
  snprintf(path, sizeof path, "%s/batch.dat", dir);
  f = fopen(path, "w");
  if (!f) return;
  cJSON_ArrayForEach(pt, cJSON_GetObjectItem(cJSON_GetObjectItem(last, "plan"), "batch_curve"))
    fprintf(f, "%g %.4f\n", cJSON_GetArrayItem(pt, 0)->valuedouble, cJSON_GetArrayItem(pt, 1)->valuedouble / 1e9);
  fclose(f);
  char s3[1024];
  snprintf(s3, sizeof s3,
           "set terminal png size 900,480\nset output 'batch.png'\n"
           "set title 'Peak memory vs batch at sequence %g (rung %s, planned)'\n"
           "set xlabel 'micro-batch'\nset ylabel 'GB'\nset grid\n"
           "plot 'batch.dat' using 1:2 with linespoints lw 2 title 'peak', %g with lines lw 2 lc rgb 'red' title 'cap'\n",
           num(cJSON_GetObjectItem(last, "plan"), "seq"), cJSON_GetStringValue(cJSON_GetObjectItem(last, "name")),
           num(cJSON_GetObjectItem(last, "plan"), "cap_bytes") / 1e9);
  /* 4. step time per rung (measured) */
  snprintf(path, sizeof path, "%s/step_time.dat", dir);
  f = fopen(path, "w");
  if (!f) return;
  int any = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    double t = run_metric(r, "sec_per_token");
    if (!isnan(t)) { fprintf(f, "%s %.6g\n", cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), t * 1e3); any = 1; }
  }
  fclose(f);
  const char *s4 =
      "set terminal png size 900,480\nset output 'step_time.png'\n"
      "set title 'Time per target token (measured at the run scale)'\n"
      "set style data histograms\nset style fill solid 0.8 border -1\nset boxwidth 0.7\n"
      "set ylabel 'ms per token'\nset xtics rotate by -30\nset grid y\n"
      "plot 'step_time.dat' using 2:xtic(1) notitle\n";
  int ok = run_gnuplot(dir, "mem_by_category", s1) == 0;
  ok &= run_gnuplot(dir, "timeline", s2) == 0;
  ok &= run_gnuplot(dir, "batch", s3) == 0;
  if (any) ok &= run_gnuplot(dir, "step_time", s4) == 0;
  if (!ok) {
    fprintf(md, "_gnuplot failed on some plots: see the *.gnuplot.log files in reports/%s/._\n\n", case_id);
  }
  fprintf(md, "![memory by category](%s/mem_by_category.png)\n\n", case_id);
  fprintf(md, "![memory timeline of one step](%s/timeline.png)\n\n", case_id);
  fprintf(md, "![batch vs peak memory](%s/batch.png)\n\n", case_id);
  if (any) fprintf(md, "![time per token](%s/step_time.png)\n\n", case_id);
  (void)L;
}

/* ---- the report --------------------------------------------------------------------------- */
int vl_report_write(const vl_case *c, const vl_ladder *L, const char *results_path,
                    const char *md_path, char *err, size_t errn) {
  size_t n;
  char *text = vl_read_file(results_path, &n);
  if (!text) { snprintf(err, errn, "cannot read %s (run `vramlab run %s` first)", results_path, c->id); return -1; }
  cJSON *res = cJSON_Parse(text);
  free(text);
  if (!res || !cJSON_IsArray(cJSON_GetObjectItem(res, "rungs"))) {
    snprintf(err, errn, "%s is not a vramlab results file (truncated or corrupt?)", results_path);
    cJSON_Delete(res);
    return -1;
  }
  char *buf = NULL;
  size_t blen = 0;
  FILE *md = open_memstream(&buf, &blen);
  cJSON *env = cJSON_GetObjectItem(res, "env");
  const char *scale = cJSON_GetStringValue(cJSON_GetObjectItem(res, "run_scale"));
  fprintf(md, "# %s — %s\n\n", c->id, vl_knob_get(&L->setting, "title") ? vl_knob_get(&L->setting, "title") : c->summary);
  fprintf(md, "_Generated by `vramlab report %s` from `%s`. Device: %s; CPU: %s (%g cores); GPU: %s; "
              "commit %s; %s._\n\n",
          c->id, results_path, cJSON_GetStringValue(cJSON_GetObjectItem(env, "device")),
          cJSON_GetStringValue(cJSON_GetObjectItem(env, "cpu")), num(env, "cores"),
          cJSON_GetStringValue(cJSON_GetObjectItem(env, "gpu")),
          cJSON_GetStringValue(cJSON_GetObjectItem(env, "git_commit")),
          cJSON_GetStringValue(cJSON_GetObjectItem(env, "time")));
  if (cJSON_IsTrue(cJSON_GetObjectItem(res, "interrupted")))
    fprintf(md, "**This run was interrupted: the tables hold what finished.**\n\n");
  fprintf(md, "## Setting\n\n");
  fprintf(md, "Memory, FLOPs, fit, largest batch and OOM rate are **planned at full scale** (the "
              "article's model and sequence length) by the plan backend, which runs the exact "
              "allocation sequence of a training step through the same arena algorithm as a real "
              "run, with a CUDA card's workspace rules. Step times, tokens/s and loss are "
              "**measured at the `%s` scale on `%s`**; timings are compared only as ratios "
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
    else if (!strcmp(cl->kind, "ratio"))
      fprintf(md, "| %s | %s | ×%.3g | ×%.3g (%s → %s) | **%s** | %s |\n", cl->text, cl->source,
              cl->article_after / cl->article_before, a / b, cl->before, cl->after, vl_verdict_name(v), cl->note);
    else
      fprintf(md, "| %s | %s | %s → %s | %s → %s | **%s** | %s |\n", cl->text, cl->source,
              fmt_val(cl->article_before, cl->unit, x1, sizeof x1), fmt_val(cl->article_after, cl->unit, x2, sizeof x2),
              fmt_val(b, cl->unit, y1, sizeof y1), fmt_val(a, cl->unit, y2, sizeof y2), vl_verdict_name(v), cl->note);
  }
  fprintf(md, "\n%d hold, %d hold in direction only, %d do not hold, %d not measurable here.\n\n",
          counts[0], counts[1], counts[2], counts[3]);

  double G = 1e9;
  fprintf(md, "## Ladder at full scale (planned)\n\n| step | what changes | batch | params | trainable | weights GB | grads GB | optim GB | acts GB | peak GB | cap GB | fits | max batch | OOM rate | TFLOP/step |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    cJSON *p = cJSON_GetObjectItem(r, "plan");
    char c1[24], c2[24];
    fprintf(md, "| %s | %s | %g | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %.0f | %.0f%% | %.1f |\n",
            cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), cJSON_GetStringValue(cJSON_GetObjectItem(r, "label")),
            num(p, "batch"), fmt_count(num(p, "params_total"), c1, sizeof c1), fmt_count(num(p, "params_trainable"), c2, sizeof c2),
            num(p, "weight_bytes") / G,
            num(p, "grads_bytes") / G, num(p, "optim_bytes") / G, num(p, "acts_bytes") / G,
            num(p, "peak_bytes") / G, num(p, "cap_bytes") / G,
            cJSON_IsTrue(cJSON_GetObjectItem(p, "fits")) ? "yes" : "**no**", num(p, "max_batch"),
            100 * num(p, "oom_rate"), num(p, "flops_per_step") / 1e12);
  }
  double tp = 0, ts = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    cJSON *p = cJSON_GetObjectItem(r, "plan");
    if (num(p, "plan_seconds") > tp) tp = num(p, "plan_seconds");
    if (num(p, "max_batch_search_seconds") > ts) ts = num(p, "max_batch_search_seconds");
  }
  fprintf(md, "\nPlanning one full-scale step took at most %.3f s; the largest-batch search at most %.3f s (targets: < 0.5 s, < 2 s).\n", tp, ts);
  cJSON *p0 = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0), "plan");
  fprintf(md, "\nGB are decimal (10^9 bytes). Peak = all live bytes at the step's high-water mark at the "
              "rung's batch and sequence %g. `acts` is the activation category's own peak. The cap "
              "is the rung's fraction of the card, and never more than the card less %.2f GB for "
              "the CUDA context, which lives outside the allocator (an assumption: not measured "
              "here). Max batch is found by bisection over planned steps at the full sequence "
              "length; OOM rate is the share of %g variable-length batches whose padded length "
              "exceeds the longest that fits at the rung's batch (so a rung at its largest batch "
              "has 0%% by construction).\n\n",
          num(p0, "seq"), num(p0, "cuda_context_bytes") / 1e9, num(p0, "oom_batches"));

  int have_runs = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) have_runs |= cJSON_GetObjectItem(r, "runs") != NULL;
  if (have_runs) {
    fprintf(md, "## Ladder at `%s` scale (measured on %s)\n\n| step | batch×accum | step time median (min–max) s | tokens/s | loss first → last | measured peak MB | planned peak MB | plan = measured | model FLOP/s share of sgemm |\n|---|---|---|---|---|---|---|---|---|\n",
            scale, cJSON_GetStringValue(cJSON_GetObjectItem(env, "device")));
    double sg = num(res, "sgemm_flops_per_s");
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
      cJSON *runs = cJSON_GetObjectItem(r, "runs");
      if (!runs) continue;
      /* pool the step-time samples of all repetitions */
      double samples[4096];
      int ns = 0;
      cJSON *ro;
      cJSON_ArrayForEach(ro, runs) {
        cJSON *sm;
        cJSON_ArrayForEach(sm, cJSON_GetObjectItem(cJSON_GetObjectItem(ro, "step_time"), "samples"))
          if (ns < 4096) samples[ns++] = sm->valuedouble;
      }
      vl_stats st;
      vl_stats_compute(samples, ns, &st);
      cJSON *r0 = cJSON_GetArrayItem(runs, 0);
      cJSON *loss = cJSON_GetObjectItem(r0, "loss");
      int nl = cJSON_GetArraySize(loss);
      int match = 1;
      cJSON_ArrayForEach(ro, runs) match &= cJSON_IsTrue(cJSON_GetObjectItem(ro, "plan_matches_measured"));
      fprintf(md, "| %s | %g×%g | %.4f (%.4f–%.4f) | %.0f | %.3f → %.3f | %.2f | %.2f | %s | %.0f%% |\n",
              cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), num(r0, "batch"), num(r0, "accum"),
              st.median, st.min, st.max, run_metric(r, "tokens_per_s"),
              nl ? cJSON_GetArrayItem(loss, 0)->valuedouble : NAN,
              nl ? cJSON_GetArrayItem(loss, nl - 1)->valuedouble : NAN,
              num(r0, "measured_peak_bytes") / 1e6, num(r0, "planned_peak_bytes") / 1e6,
              cJSON_GetObjectItem(r0, "planned_peak_bytes") ? (match ? "yes" : "**no**") : "—",
              sg > 0 ? 100 * run_metric(r, "flops_per_s") / sg : NAN);
    }
    fprintf(md, "\nsgemm reference of this run: %.1f GFLOP/s (1024³, best of 5). Model FLOPs exclude "
                "recomputation (MLPerf rule). Loss is over the warm-up and timed steps of the first "
                "repetition. Runs are uncapped (the cap is a full-scale notion), so the `cap` row "
                "repeats `baseline`. Planned peak follows the CPU backend's workspace rules for the "
                "longest step of the run.\n\n", sg / 1e9);
  } else {
    fprintf(md, "## Measured ladder\n\nNot measured here: this results file holds plans only.\n\n");
  }

  fprintf(md, "## Plots\n\n");
  char dir[1024];
  snprintf(dir, sizeof dir, "%.*s/%s", (int)(strrchr(md_path, '/') - md_path), md_path, c->id);
  vl_mkdir_p(dir);
  if (have_gnuplot()) plots(L, res, dir, md, c->id);
  else fprintf(md, "Plots are missing: gnuplot is not installed (`apt-get install gnuplot-nox`).\n\n");
  fclose(md);
  cJSON_Delete(res);
  int rc = vl_write_atomic(md_path, buf, err, errn);
  free(buf);
  return rc;
}
