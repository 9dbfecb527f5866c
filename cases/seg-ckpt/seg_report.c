/* seg-ckpt's report sections: the full-scale ladder (planned), the linear memory model, the
 * measured ladder (time, throughput, data wait, accuracy), and plots (memory by category
 * per rung, memory vs batch with the cap and the fitted line, accuracy per epoch per rung), and
 * PyTorch side by side (seg_torch.c).
 * The harness writes the header, setting and claims around them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kit/case.h"
#include "seg_torch.h"
#include "kit/rep.h"

static const char *name_of(const cJSON *r) { return vl_rep_str(r, "name"); }

/* a number in a gnuplot script, or the fallback where it is missing */
static const char *gp_num(const char *fmt, double v, char *b, size_t n) {
  if (isfinite(v)) snprintf(b, n, fmt, v);
  else snprintf(b, n, "?");
  return b;
}

static void plots(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  char s[4096], name[VL_REP_GP_MAX + 1];
  vl_err why;
  if (vl_rep_mem_by_category(res, dir, "Peak memory by category per rung (planned, 512x512, batch as configured)",
                             s, sizeof s, &why))
    vl_rep_plot_missing(md, dir, "mem_by_category", why.msg);
  else
    vl_rep_plot(md, dir, case_id, gnuplot, "mem_by_category", "memory by category", s);
  const cJSON *last = NULL, *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) last = r;
  const cJSON *lp = vl_rep_plan(last), *bc = cJSON_GetObjectItem(lp, "batch_curve");
  vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(last, "name")), false, name, sizeof name);
  if (!cJSON_GetArraySize(bc)) {
    vl_rep_plot_missing(md, dir, "batch", "the results hold no batch curve for the last rung");
  } else if (vl_rep_write_pairs(dir, "batch.dat", bc, &why)) {
    vl_rep_plot_missing(md, dir, "batch", why.msg);
  } else {
    double a = vl_rep_num(lp, "fit_base_bytes") / 1e9, b = vl_rep_num(lp, "fit_per_sample_bytes") / 1e9,
           cap = vl_rep_num(lp, "cap_bytes") / 1e9;
    char fit[256] = "", capline[96] = "", t1[32], t2[32], t3[32];
    /* the fitted line and the cap only where the results have them: a missing number in a
     * plot command is a gnuplot error, not a missing line */
    if (isfinite(a) && isfinite(b))
      snprintf(fit, sizeof fit, ", %.6g + %.6g*x with lines lw 2 dt 2 title 'fit: %s GB + %s GB x batch (R^2 %s)'",
               a, b, gp_num("%.2f", a, t1, sizeof t1), gp_num("%.3f", b, t2, sizeof t2),
               gp_num("%.5f", vl_rep_num(lp, "fit_r2"), t3, sizeof t3));
    if (isfinite(cap)) snprintf(capline, sizeof capline, ", %g with lines lw 2 lc rgb 'red' title 'cap'", cap);
    snprintf(s, sizeof s,
             "set terminal png size 900,480 noenhanced\nset output vl_png\n"
             "set title 'Peak memory vs batch (rung %s, planned at 512x512)'\n"
             "set xlabel 'micro-batch'\nset ylabel 'GB'\nset grid\nset key left top\n"
             "plot 'batch.dat' using 1:2 with points pt 7 ps 1.2 title 'planned peak'%s%s\n",
             name, fit, capline);
    vl_rep_plot(md, dir, case_id, gnuplot, "batch", "memory vs batch", s);
  }
  /* accuracy per epoch, one line per rung that ran */
  vl_rep_dat d;
  if (vl_rep_dat_open(&d)) {
    vl_rep_plot_missing(md, dir, "accuracy", "out of memory");
    return;
  }
  int nr = 0;
  char plot[4096] = "plot ";
  const cJSON *rungs = cJSON_GetObjectItem(res, "rungs");
  cJSON_ArrayForEach(r, rungs) {
    const cJSON *acc = cJSON_GetObjectItem(vl_rep_run0(r), "pixel_accuracy_per_epoch"), *e;
    if (!cJSON_IsArray(acc)) continue;
    int valid = 0; /* a line without one point is a gnuplot error: leave such a rung out */
    cJSON_ArrayForEach(e, acc) valid += !isnan(vl_rep_numv(e));
    if (!valid) continue;
    /* rungs that trained the same numbers (before, ckpt and relu_off; amp and loader) would
     * hide each other: a line is as much wider as later rungs repeat it, and its key names
     * the earlier rung it repeats */
    int later = 0;
    const cJSON *same = NULL, *o;
    bool after = false;
    cJSON_ArrayForEach(o, rungs) {
      if (o == r) { after = true; continue; }
      const cJSON *oa = cJSON_GetObjectItem(vl_rep_run0(o), "pixel_accuracy_per_epoch");
      if (!cJSON_IsArray(oa) || !cJSON_Compare(oa, acc, true)) continue;
      if (after) later++;
      else if (!same) same = o;
    }
    vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), false, name, sizeof name);
    char title[2 * VL_REP_GP_MAX + 16], sn[VL_REP_GP_MAX + 1];
    if (same)
      snprintf(title, sizeof title, "%s (= %s)", name,
               vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(same, "name")), false, sn, sizeof sn));
    else snprintf(title, sizeof title, "%s", name);
    fprintf(d.f, "# %s\n", name);
    int ep = 0;
    cJSON_ArrayForEach(e, acc) {
      ep++;
      if (!isnan(vl_rep_numv(e))) fprintf(d.f, "%d %.5f\n", ep, vl_rep_numv(e));
    }
    fprintf(d.f, "\n\n");
    char one[400];
    snprintf(one, sizeof one,
             "%s'accuracy.dat' index %d using 1:2 with linespoints lw %d dt %d pt %d ps %.1f title '%s'",
             nr ? ", " : "", nr, 2 + 4 * later, nr % 5 + 1, nr % 12 + 4, 1.2 + 0.9 * later, title);
    strncat(plot, one, sizeof plot - strlen(plot) - 1);
    nr++;
  }
  if (vl_rep_dat_commit(&d, dir, "accuracy.dat", &why)) {
    vl_rep_plot_missing(md, dir, "accuracy", why.msg);
  } else if (nr) {
    snprintf(s, sizeof s,
             "set terminal png size 1000,480 noenhanced\nset output vl_png\n"
             "set title 'Held-out pixel accuracy per epoch (run scale, one seed)'\n"
             "set xlabel 'epoch'\nset ylabel 'pixel accuracy'\nset xtics 1\nset mxtics 1\nset grid\n"
             "set key outside right top\n%s\n", plot);
    vl_rep_plot(md, dir, case_id, gnuplot, "accuracy", "accuracy per epoch", s);
  }
}

static double max_over_rungs(const cJSON *res, const char *k) {
  double m = NAN;
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    double v = vl_rep_num(vl_rep_plan(r), k);
    if (!isnan(v) && (isnan(m) || v > m)) m = v;
  }
  return m;
}

static void planned_ladder(const cJSON *res, FILE *md, FILE *ap) {
  const double G = 1e9;
  fprintf(md, "## Ladder at full scale (planned, 512x512)\n\n"
              "| step | what changes | batch×accum | model GB | acts GB | temp GB | workspace GB | peak GB | extent overhead | cap GB | fits | max batch | recompute FLOPs | TFLOP/step |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *p = vl_rep_plan(r), *pk = cJSON_GetObjectItem(p, "peak_by_category");
    fprintf(md, "| %s | %s | %s×%s | %s | %s | %s | %s | %s | %s | %s | %s | %s%s | %s | %s |\n",
            name_of(r), vl_rep_str(r, "label"), vl_rep_fmt("%g", vl_rep_num(p, "batch")),
            vl_rep_fmt("%g", vl_rep_num(p, "accum")), vl_rep_fmt("%.2f", vl_rep_num(p, "model_bytes") / G),
            vl_rep_fmt("%.2f", vl_rep_num(p, "acts_bytes") / G), vl_rep_fmt("%.2f", vl_rep_num(pk, "temp") / G),
            vl_rep_fmt("%.2f", vl_rep_num(pk, "workspace") / G), vl_rep_fmt("%.2f", vl_rep_num(p, "peak_bytes") / G),
            vl_rep_fmt("%.1f%%", 100 * vl_rep_num(p, "extent_overhead")),
            vl_rep_fmt("%.2f", vl_rep_num(p, "cap_bytes") / G), vl_rep_yes_no(cJSON_GetObjectItem(p, "fits")),
            cJSON_IsTrue(cJSON_GetObjectItem(p, "max_batch_at_search_limit")) ? "≥" : "",
            vl_rep_fmt("%.0f", vl_rep_num(p, "max_batch")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_num(p, "recompute_share")),
            vl_rep_fmt("%.2f", vl_rep_num(p, "flops_per_step") / 1e12));
  }
  const cJSON *p0 = vl_rep_plan(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0));
  const cJSON *pm = cJSON_GetObjectItem(p0, "params_by_module");
  char c1[24], c2[24], c3[24];
  fprintf(ap, "### seg-ckpt: the model against torchvision\n\nEncoder parameters: %s (torchvision's ResNet-101 "
              "without its classifier has 42500160).\n\n",
          vl_rep_fmt("%.0f", vl_rep_num(pm, "encoder")));
  fprintf(md, "\nParameters: encoder %s, decoder %s, head %s. Model GB = weights (with fp32 masters under AMP) "
              "+ gradients + AdamW state at the peak; acts = the activation category's own peak; "
              "extent overhead = arena extent beyond the live peak (what fragmentation costs); "
              "recompute FLOPs = re-run forward FLOPs as a share of model FLOPs. The cap is the rung's "
              "fraction of the card, never more than the card less %s GB of CUDA context (assumed, "
              "not measured here). Max batch: bisection over planned steps. Planning one full-scale step "
              "took at most %s s, the largest-batch search at most %s s (target: a rung plans in < 1 s).\n\n",
          vl_rep_count(vl_rep_num(pm, "encoder"), c1, sizeof c1), vl_rep_count(vl_rep_num(pm, "decoder"), c2, sizeof c2),
          vl_rep_count(vl_rep_num(pm, "head"), c3, sizeof c3),
          vl_rep_fmt("%.2f", vl_rep_num(p0, "cuda_context_bytes") / G),
          vl_rep_fmt("%.3f", max_over_rungs(res, "plan_seconds")),
          vl_rep_fmt("%.3f", max_over_rungs(res, "max_batch_search_seconds")));
}

static void linear_model(const cJSON *res, FILE *md) {
  const cJSON *last = NULL, *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) last = r;
  const cJSON *p = vl_rep_plan(last), *bc = cJSON_GetObjectItem(p, "batch_curve");
  if (!p) return;
  fprintf(md, "## Memory vs batch (rung `%s`)\n\n"
              "Least squares over %d planned peaks: **memory = %s GB + batch × %s GB** (R² = %s). "
              "Under the cap of %s GB the line predicts batch %s; the planner's exact answer is %s "
              "(exact / line = %s).\n\n",
          name_of(last), cJSON_IsArray(bc) ? cJSON_GetArraySize(bc) : 0,
          vl_rep_fmt("%.3f", vl_rep_num(p, "fit_base_bytes") / 1e9),
          vl_rep_fmt("%.4f", vl_rep_num(p, "fit_per_sample_bytes") / 1e9), vl_rep_fmt("%.6f", vl_rep_num(p, "fit_r2")),
          vl_rep_fmt("%.2f", vl_rep_num(p, "cap_bytes") / 1e9),
          vl_rep_fmt("%.0f", vl_rep_num(p, "fit_predicted_max_batch")),
          vl_rep_fmt("%.0f", vl_rep_num(p, "max_batch")), vl_rep_fmt("%.3f", vl_rep_num(p, "exact_vs_linear")));
}

/* The epochs a rung's first run trained (its per-epoch accuracy), NaN when it has none. */
static double epochs_ran(const cJSON *r) {
  const cJSON *acc = cJSON_GetObjectItem(vl_rep_run0(r), "pixel_accuracy_per_epoch");
  return cJSON_IsArray(acc) ? (double)cJSON_GetArraySize(acc) : NAN;
}

static void measured_ladder(const cJSON *res, FILE *md) {
  double sg = vl_rep_num(res, "sgemm_flops_per_s");
  const cJSON *r, *first = NULL;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) if (!first && vl_rep_run0(r)) first = r;
  fprintf(md, "## Ladder at `%s` scale (measured on %s)\n\n"
              "Scales: `full` = the article's 512x512 images and ResNet-101 widths (stem 64, decoder "
              "256..16); `small` = 128x128 images, every width / 4 (stem 16, decoder 64..4), the same 101-layer "
              "depth; `tiny` = 32x32, widths / 16. Every rung trained %s epochs on the same %s training images "
              "(held out: %s), one seed.\n\n"
              "| step | batch×accum | step time median (min–max) s | images/s | data wait | data s/batch | pixel acc | mIoU | optimizer steps | model FLOP/s share of sgemm |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n",
          vl_rep_str(res, "run_scale"), vl_rep_str(cJSON_GetObjectItem(res, "env"), "device"),
          vl_rep_fmt("%.0f", epochs_ran(first)), vl_rep_str(cJSON_GetObjectItem(res, "setting"), "train_images"),
          vl_rep_str(cJSON_GetObjectItem(res, "setting"), "eval_images"));
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *r0 = vl_rep_run0(r);
    if (!r0) continue;
    if (cJSON_IsTrue(cJSON_GetObjectItem(r0, "oom"))) {
      fprintf(md, "| %s | out of memory: %s ||||||||| \n", name_of(r), vl_rep_str(r0, "error"));
      continue;
    }
    const cJSON *stt = cJSON_GetObjectItem(r0, "step_time");
    if (!stt) {
      fprintf(md, "| %s | failed: %s ||||||||| \n", name_of(r), vl_rep_str(r0, "error"));
      continue;
    }
    fprintf(md, "| %s | %s×%s | %s (%s–%s) | %s | %s | %s | %s | %s | %s | %s |\n",
            name_of(r), vl_rep_fmt("%g", vl_rep_num(r0, "batch")), vl_rep_fmt("%g", vl_rep_num(r0, "accum")),
            vl_rep_fmt("%.3f", vl_rep_num(stt, "median")), vl_rep_fmt("%.3f", vl_rep_num(stt, "min")),
            vl_rep_fmt("%.3f", vl_rep_num(stt, "max")), vl_rep_fmt("%.1f", vl_rep_run_metric(r, "images_per_s")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_run_metric(r, "data_wait_share")),
            vl_rep_fmt("%.4f", vl_rep_run_metric(r, "sec_per_batch_data")),
            vl_rep_fmt("%.4f", vl_rep_run_metric(r, "pixel_accuracy")),
            vl_rep_fmt("%.4f", vl_rep_run_metric(r, "miou")),
            vl_rep_fmt("%.0f", vl_rep_num(r0, "optimizer_steps")),
            vl_rep_fmt("%.0f%%", sg > 0 ? 100 * vl_rep_run_metric(r, "flops_per_s") / sg : NAN));
  }
  const cJSON *b = vl_rep_rung(res, "before"), *ck = vl_rep_rung(res, "ckpt"), *ro = vl_rep_rung(res, "relu_off");
  double tb = vl_rep_run_metric(b, "interleaved_step_seconds"),
         tc = vl_rep_run_metric(ck, "interleaved_step_seconds"),
         tr = vl_rep_run_metric(ro, "interleaved_step_seconds");
  const cJSON *sb = cJSON_GetObjectItem(vl_rep_run0(b), "step_time"), *sc = cJSON_GetObjectItem(vl_rep_run0(ck), "step_time");
  double lb = vl_rep_num(sb, "median"), lc = vl_rep_num(sc, "median");
  fprintf(md, "\n**Checkpointing's time cost, two numbers.** The table's medians give ckpt / before = %s: "
              "the rungs ran one after another, minutes apart, and this shared 2-core machine's load moves "
              "a whole rung (the ckpt rung's own steps span %s–%s s). The claim `ckpt_cost` uses the "
              "interleaved measurement, the models stepping in turn on one batch (median of %s rounds): "
              "before %s s, ckpt %s s (%s), ckpt + in-place ReLU off %s s (%s vs ckpt); planned recompute "
              "%s of model FLOPs.\n",
          vl_rep_fmt("%+.0f%%", 100 * (lc / lb - 1)), vl_rep_fmt("%.3f", vl_rep_num(sc, "min")),
          vl_rep_fmt("%.3f", vl_rep_num(sc, "max")),
          vl_rep_fmt("%g", vl_rep_num(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "case_metrics"),
                                                          "interleaved_steps"), "rounds")),
          vl_rep_fmt("%.3f", tb), vl_rep_fmt("%.3f", tc), vl_rep_fmt("%+.1f%%", 100 * (tc / tb - 1)),
          vl_rep_fmt("%.3f", tr), vl_rep_fmt("%+.1f%%", 100 * (tr / tc - 1)),
          vl_rep_fmt("%.0f%%", 100 * vl_rep_num(vl_rep_plan(ck), "recompute_share")));
  fprintf(md, "\nsgemm reference of this run: %s GFLOP/s (1024³, best of 5, the higher of the "
              "measurements before and after the ladder). Model FLOPs exclude recomputation (MLPerf "
              "rule). Data wait = share of the timed steps' wall time spent in the loader's `next` (on "
              "this CPU, where the loader and the model share the cores: the stand-in for GPU idle); "
              "data s/batch = that wait per micro-batch. Pixel accuracy and mIoU: held-out split, BN "
              "in evaluation mode, after the last epoch (every rung sees the same images; with "
              "accumulation it takes fewer optimizer steps). fp16 on the CPU is emulated (fp16 storage, "
              "fp32 arithmetic), so the amp rung is slower here. The first step of each rung is warm-up.\n\n",
          vl_rep_fmt("%.1f", sg / 1e9));
}

/* The engine's own validation: its planned peak against the peak it measured in each run. */
static void plan_vs_measured(const cJSON *res, FILE *ap) {
  fprintf(ap, "### seg-ckpt: planned peak = measured peak (`%s` scale)\n\n"
              "| step | measured peak MB | planned peak MB | plan = measured |\n|---|---|---|---|\n",
          vl_rep_str(res, "run_scale"));
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *r0 = vl_rep_run0(r);
    if (!r0 || !cJSON_GetObjectItem(r0, "step_time")) continue;
    bool match = cJSON_IsTrue(cJSON_GetObjectItem(r0, "plan_matches_measured"));
    fprintf(ap, "| %s | %s | %s | %s |\n", name_of(r), vl_rep_fmt("%.1f", vl_rep_num(r0, "measured_peak_bytes") / 1e6),
            vl_rep_fmt("%.1f", vl_rep_num(r0, "planned_peak_bytes") / 1e6),
            cJSON_GetObjectItem(r0, "planned_peak_bytes") ? (match ? "yes" : "**no**") : "—");
  }
  fprintf(ap, "\nPlanned peak here follows the CPU backend's workspace rules (the full-scale plans use a "
              "CUDA card's).\n\n");
}

void vl_segcase_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot) {
  planned_ladder(res, md, appendix);
  vl_case_pytorch_report(res, md, "tools/peers/seg_peer.py runs (the ResNet U-Net with torchvision's Bottleneck "
                         "blocks, torch.utils.checkpoint around each when the rung checkpoints, ReLU in place or "
                         "not, torch.autocast and GradScaler, AdamW, gradients set to None)",
                         VL_MIMIC_GPU_MEASURED);
  linear_model(res, md);
  bool ran = false;
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) ran |= vl_rep_run0(r) != NULL;
  if (ran) {
    measured_ladder(res, md);
    plan_vs_measured(res, appendix);
    vl_segcase_peers_report(res, appendix);
  } else fprintf(md, "## Measured ladder\n\nNot measured here: this results file holds plans only.\n\n");
  fprintf(md, "## Plots\n\n");
  plots(res, dir, md, case_id, gnuplot);
}
