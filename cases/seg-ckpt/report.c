/* seg-ckpt's report sections: the full-scale ladder (planned), the linear memory model, the
 * measured ladder (time, throughput, data wait, accuracy), and plots (memory by category
 * per rung, memory vs batch with the cap and the fitted line, accuracy per epoch per rung).
 * The harness writes the header, setting and claims around them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "case.h"
#include "report.h"

static const char *name_of(const cJSON *r) { return cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")); }
static cJSON *plan_of(const cJSON *r) { return cJSON_GetObjectItem(r, "plan"); }
static cJSON *run0_of(const cJSON *r) { return cJSON_GetArrayItem(cJSON_GetObjectItem(r, "runs"), 0); }

static cJSON *rung_named(cJSON *res, const char *name) {
  cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) if (!strcmp(name_of(r), name)) return r;
  return NULL;
}

static void plots(cJSON *res, const char *dir, FILE *md, const char *case_id) {
  char s1[2048], s2[2048], s3[4096], path[1024];
  if (vl_rep_mem_by_category(res, dir, "Peak memory by category per rung (planned, 512x512, batch as configured)", s1, sizeof s1))
    return;
  cJSON *last = NULL, *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) last = r;
  cJSON *lp = plan_of(last);
  if (vl_rep_write_pairs(dir, "batch.dat", cJSON_GetObjectItem(lp, "batch_curve"))) return;
  snprintf(s2, sizeof s2,
           "set terminal png size 900,480 noenhanced\nset output 'batch.png'\n"
           "set title 'Peak memory vs batch (rung %s, planned at 512x512)'\n"
           "set xlabel 'micro-batch'\nset ylabel 'GB'\nset grid\nset key left top\n"
           "plot 'batch.dat' using 1:2 with points pt 7 ps 1.2 title 'planned peak', "
           "%.6g + %.6g*x with lines lw 2 dt 2 title 'fit: %.2f GB + %.3f GB x batch (R^2 %.5f)', "
           "%g with lines lw 2 lc rgb 'red' title 'cap'\n",
           name_of(last), vl_rep_num(lp, "fit_base_bytes") / 1e9, vl_rep_num(lp, "fit_per_sample_bytes") / 1e9,
           vl_rep_num(lp, "fit_base_bytes") / 1e9, vl_rep_num(lp, "fit_per_sample_bytes") / 1e9,
           vl_rep_num(lp, "fit_r2"), vl_rep_num(lp, "cap_bytes") / 1e9);
  /* accuracy per epoch, one line per rung that ran */
  snprintf(path, sizeof path, "%s/accuracy.dat", dir);
  FILE *f = fopen(path, "w");
  if (!f) return;
  int nr = 0;
  char plot[2048] = "plot ";
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    cJSON *acc = cJSON_GetObjectItem(run0_of(r), "pixel_accuracy_per_epoch");
    if (!cJSON_GetArraySize(acc)) continue;
    fprintf(f, "# %s\n", name_of(r));
    for (int e = 0; e < cJSON_GetArraySize(acc); e++)
      fprintf(f, "%d %.5f\n", e + 1, cJSON_GetArrayItem(acc, e)->valuedouble);
    fprintf(f, "\n\n");
    char one[160];
    snprintf(one, sizeof one, "%s'accuracy.dat' index %d using 1:2 with linespoints lw 2 title '%s'",
             nr ? ", " : "", nr, name_of(r));
    strncat(plot, one, sizeof plot - strlen(plot) - 1);
    nr++;
  }
  fclose(f);
  snprintf(s3, sizeof s3,
           "set terminal png size 900,480 noenhanced\nset output 'accuracy.png'\n"
           "set title 'Held-out pixel accuracy per epoch (run scale, same images per rung; before, ckpt and relu_off coincide)'\n"
           "set xlabel 'epoch'\nset ylabel 'pixel accuracy'\nset grid\nset key right bottom\n%s\n", plot);
  int ok = vl_rep_gnuplot(dir, "mem_by_category", s1) == 0;
  ok &= vl_rep_gnuplot(dir, "batch", s2) == 0;
  if (nr) ok &= vl_rep_gnuplot(dir, "accuracy", s3) == 0;
  if (!ok) fprintf(md, "_gnuplot failed on some plots: see the *.gnuplot.log files in reports/%s/._\n\n", case_id);
  fprintf(md, "![memory by category](%s/mem_by_category.png)\n\n", case_id);
  fprintf(md, "![memory vs batch](%s/batch.png)\n\n", case_id);
  if (nr) fprintf(md, "![accuracy per epoch](%s/accuracy.png)\n\n", case_id);
}

static void planned_ladder(cJSON *res, FILE *md) {
  const double G = 1e9;
  fprintf(md, "## Ladder at full scale (planned, 512x512)\n\n"
              "| step | what changes | batch×accum | model GB | acts GB | temp GB | workspace GB | peak GB | extent overhead | cap GB | fits | max batch | recompute FLOPs | TFLOP/step |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  cJSON *r;
  double tp = 0, ts = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    cJSON *p = plan_of(r), *pk = cJSON_GetObjectItem(p, "peak_by_category");
    fprintf(md, "| %s | %s | %g×%g | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f%% | %.2f | %s | %s%.0f | %.0f%% | %.2f |\n",
            name_of(r), cJSON_GetStringValue(cJSON_GetObjectItem(r, "label")), vl_rep_num(p, "batch"),
            vl_rep_num(p, "accum"), vl_rep_num(p, "model_bytes") / G, vl_rep_num(p, "acts_bytes") / G,
            vl_rep_num(pk, "temp") / G, vl_rep_num(pk, "workspace") / G, vl_rep_num(p, "peak_bytes") / G,
            100 * vl_rep_num(p, "extent_overhead"), vl_rep_num(p, "cap_bytes") / G,
            cJSON_IsTrue(cJSON_GetObjectItem(p, "fits")) ? "yes" : "**no**",
            cJSON_IsTrue(cJSON_GetObjectItem(p, "max_batch_at_search_limit")) ? "≥" : "",
            vl_rep_num(p, "max_batch"), 100 * vl_rep_num(p, "recompute_share"),
            vl_rep_num(p, "flops_per_step") / 1e12);
    if (vl_rep_num(p, "plan_seconds") > tp) tp = vl_rep_num(p, "plan_seconds");
    if (vl_rep_num(p, "max_batch_search_seconds") > ts) ts = vl_rep_num(p, "max_batch_search_seconds");
  }
  cJSON *p0 = plan_of(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0));
  cJSON *pm = cJSON_GetObjectItem(p0, "params_by_module");
  char c1[24], c2[24], c3[24];
  fprintf(md, "\nParameters: encoder %s (torchvision's ResNet-101 without its classifier has 42,500,160; "
              "this one has %.0f), decoder %s, head %s. Model GB = weights (with fp32 masters under AMP) "
              "+ gradients + AdamW state at the peak; acts = the activation category's own peak; "
              "extent overhead = arena extent beyond the live peak (what fragmentation costs); "
              "recompute FLOPs = re-run forward FLOPs as a share of model FLOPs. The cap is the rung's "
              "fraction of the card, never more than the card less %.2f GB of CUDA context (assumed, "
              "not measured here). Max batch: bisection over planned steps. Planning one full-scale step "
              "took at most %.3f s, the largest-batch search at most %.3f s (target: a rung plans in < 1 s).\n\n",
          vl_rep_count(vl_rep_num(pm, "encoder"), c1, sizeof c1), vl_rep_num(pm, "encoder"),
          vl_rep_count(vl_rep_num(pm, "decoder"), c2, sizeof c2),
          vl_rep_count(vl_rep_num(pm, "head"), c3, sizeof c3), vl_rep_num(p0, "cuda_context_bytes") / G,
          tp, ts);
}

static void linear_model(cJSON *res, FILE *md) {
  cJSON *last = NULL, *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) last = r;
  cJSON *p = plan_of(last);
  if (!p) return;
  fprintf(md, "## Memory vs batch (rung `%s`)\n\n"
              "Least squares over %d planned peaks: **memory = %.3f GB + batch × %.4f GB** (R² = %.6f). "
              "Under the cap of %.2f GB the line predicts batch %.0f; the planner's exact answer is %.0f "
              "(exact / line = %.3f).\n\n",
          name_of(last), cJSON_GetArraySize(cJSON_GetObjectItem(p, "batch_curve")),
          vl_rep_num(p, "fit_base_bytes") / 1e9, vl_rep_num(p, "fit_per_sample_bytes") / 1e9,
          vl_rep_num(p, "fit_r2"), vl_rep_num(p, "cap_bytes") / 1e9,
          vl_rep_num(p, "fit_predicted_max_batch"), vl_rep_num(p, "max_batch"),
          vl_rep_num(p, "exact_vs_linear"));
}

static void measured_ladder(cJSON *res, FILE *md, const char *scale) {
  double sg = vl_rep_num(res, "sgemm_flops_per_s");
  fprintf(md, "## Ladder at `%s` scale (measured on %s)\n\n"
              "| step | batch×accum | step time median (min–max) s | images/s | data wait | data s/batch | pixel acc | mIoU | optimizer steps | measured peak MB | planned peak MB | plan = measured | model FLOP/s share of sgemm |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
          scale, cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "env"), "device")));
  cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    cJSON *r0 = run0_of(r);
    if (!r0) continue;
    if (cJSON_IsTrue(cJSON_GetObjectItem(r0, "oom"))) {
      fprintf(md, "| %s | out of memory: %s |||||||||||| \n", name_of(r),
              cJSON_GetStringValue(cJSON_GetObjectItem(r0, "error")));
      continue;
    }
    cJSON *stt = cJSON_GetObjectItem(r0, "step_time");
    if (!stt) {
      fprintf(md, "| %s | failed: %s |||||||||||| \n", name_of(r),
              cJSON_GetStringValue(cJSON_GetObjectItem(r0, "error")));
      continue;
    }
    bool match = cJSON_IsTrue(cJSON_GetObjectItem(r0, "plan_matches_measured"));
    fprintf(md, "| %s | %g×%g | %.3f (%.3f–%.3f) | %.1f | %.0f%% | %.4f | %.4f | %.4f | %.0f | %.1f | %.1f | %s | %.0f%% |\n",
            name_of(r), vl_rep_num(r0, "batch"), vl_rep_num(r0, "accum"),
            vl_rep_num(stt, "median"), vl_rep_num(stt, "min"), vl_rep_num(stt, "max"),
            vl_rep_run_metric(r, "images_per_s"), 100 * vl_rep_run_metric(r, "data_wait_share"),
            vl_rep_run_metric(r, "sec_per_batch_data"), vl_rep_run_metric(r, "pixel_accuracy"),
            vl_rep_run_metric(r, "miou"), vl_rep_num(r0, "optimizer_steps"),
            vl_rep_num(r0, "measured_peak_bytes") / 1e6, vl_rep_num(r0, "planned_peak_bytes") / 1e6,
            cJSON_GetObjectItem(r0, "planned_peak_bytes") ? (match ? "yes" : "**no**") : "—",
            sg > 0 ? 100 * vl_rep_run_metric(r, "flops_per_s") / sg : NAN);
  }
  cJSON *b = rung_named(res, "before"), *ck = rung_named(res, "ckpt"), *ro = rung_named(res, "relu_off");
  double tb = vl_rep_run_metric(b, "interleaved_step_seconds"),
         tc = vl_rep_run_metric(ck, "interleaved_step_seconds"),
         tr = vl_rep_run_metric(ro, "interleaved_step_seconds");
  fprintf(md, "\nCheckpointing's time overhead, the models stepping in turn on one batch (median of "
              "%g rounds): before %.3f s, ckpt %.3f s (%+.1f%%), ckpt + in-place ReLU off %.3f s "
              "(%+.1f%% vs ckpt); planned recompute %.0f%% of model FLOPs. The ladder table's "
              "medians come from rungs run one after another and carry this machine's drift.\n",
          vl_rep_num(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "case_metrics"), "interleaved_steps"), "rounds"),
          tb, tc, 100 * (tc / tb - 1), tr, 100 * (tr / tc - 1),
          100 * vl_rep_num(plan_of(ck), "recompute_share"));
  fprintf(md, "\nsgemm reference of this run: %.1f GFLOP/s (1024³, best of 5, the higher of the "
              "measurements before and after the ladder). Model FLOPs exclude recomputation (MLPerf "
              "rule). Data wait = share of the timed steps' wall time spent in the loader's `next`; "
              "data s/batch = that wait per micro-batch. Pixel accuracy and mIoU: held-out split, BN "
              "in evaluation mode, after the last epoch (every rung sees the same images; with "
              "accumulation it takes fewer optimizer steps). The first step of each rung is warm-up. "
              "Planned peak follows the CPU backend's workspace rules.\n\n",
          sg / 1e9);
}

void vl_seg_ckpt_report(cJSON *res, FILE *md, const char *dir, const char *case_id, bool gnuplot) {
  const char *scale = cJSON_GetStringValue(cJSON_GetObjectItem(res, "run_scale"));
  planned_ladder(res, md);
  linear_model(res, md);
  bool ran = false;
  cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) ran |= run0_of(r) != NULL;
  if (ran) measured_ladder(res, md, scale ? scale : "?");
  else fprintf(md, "## Measured ladder\n\nNot measured here: this results file holds plans only.\n\n");
  fprintf(md, "## Plots\n\n");
  if (gnuplot) plots(res, dir, md, case_id);
}
