/* llm-lora's report sections: the full-scale ladder (planned), the measured ladder, plots
 * (memory by category per rung, memory timeline of one step, batch vs peak with the cap,
 * time per token). The harness writes the header, setting and claims around them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "case.h"
#include "report.h"

static void plots(cJSON *res, const char *dir, FILE *md, const char *case_id) {
  char path[1024];
  FILE *f;
  /* 1. memory by category at the peak, per rung (stacked bars) */
  char s1[2048];
  if (vl_rep_mem_by_category(res, dir, "Peak memory by category per rung (planned, full scale, batch as configured)", s1, sizeof s1))
    return;
  cJSON *r;
  /* 2. memory timeline of one step (after rung) */
  cJSON *last = NULL;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) last = r;
  if (vl_rep_write_pairs(dir, "timeline.dat", cJSON_GetObjectItem(cJSON_GetObjectItem(last, "plan"), "timeline")))
    return;
  char s2[1024];
  snprintf(s2, sizeof s2,
           "set terminal png size 1000,480\nset output 'timeline.png'\n"
           "set title 'Live memory during one training step: rung %s (planned, full scale)'\n"
           "set xlabel 'allocator event'\nset ylabel 'GB'\nset grid\n"
           "plot 'timeline.dat' using 1:2 with lines lw 2 title 'live bytes'\n",
           cJSON_GetStringValue(cJSON_GetObjectItem(last, "name")));
  /* 3. batch vs peak with the cap line (after rung) */
  if (vl_rep_write_pairs(dir, "batch.dat", cJSON_GetObjectItem(cJSON_GetObjectItem(last, "plan"), "batch_curve")))
    return;
  char s3[1024];
  snprintf(s3, sizeof s3,
           "set terminal png size 900,480\nset output 'batch.png'\n"
           "set title 'Peak memory vs batch at sequence %g (rung %s, planned)'\n"
           "set xlabel 'micro-batch'\nset ylabel 'GB'\nset grid\n"
           "plot 'batch.dat' using 1:2 with linespoints lw 2 title 'peak', %g with lines lw 2 lc rgb 'red' title 'cap'\n",
           vl_rep_num(cJSON_GetObjectItem(last, "plan"), "seq"), cJSON_GetStringValue(cJSON_GetObjectItem(last, "name")),
           vl_rep_num(cJSON_GetObjectItem(last, "plan"), "cap_bytes") / 1e9);
  /* 4. step time per rung (measured) */
  snprintf(path, sizeof path, "%s/step_time.dat", dir);
  f = fopen(path, "w");
  if (!f) return;
  int any = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    double t = vl_rep_run_metric(r, "sec_per_token");
    if (!isnan(t)) { fprintf(f, "%s %.6g\n", cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), t * 1e3); any = 1; }
  }
  fclose(f);
  const char *s4 =
      "set terminal png size 900,480\nset output 'step_time.png'\n"
      "set title 'Time per target token (measured at the run scale)'\n"
      "set style data histograms\nset style fill solid 0.8 border -1\nset boxwidth 0.7\n"
      "set ylabel 'ms per token'\nset xtics rotate by -30\nset grid y\n"
      "plot 'step_time.dat' using 2:xtic(1) notitle\n";
  int ok = vl_rep_gnuplot(dir, "mem_by_category", s1) == 0;
  ok &= vl_rep_gnuplot(dir, "timeline", s2) == 0;
  ok &= vl_rep_gnuplot(dir, "batch", s3) == 0;
  if (any) ok &= vl_rep_gnuplot(dir, "step_time", s4) == 0;
  if (!ok) {
    fprintf(md, "_gnuplot failed on some plots: see the *.gnuplot.log files in reports/%s/._\n\n", case_id);
  }
  fprintf(md, "![memory by category](%s/mem_by_category.png)\n\n", case_id);
  fprintf(md, "![memory timeline of one step](%s/timeline.png)\n\n", case_id);
  fprintf(md, "![batch vs peak memory](%s/batch.png)\n\n", case_id);
  if (any) fprintf(md, "![time per token](%s/step_time.png)\n\n", case_id);
}


void vl_llm_lora_report(cJSON *res, FILE *md, const char *dir, const char *case_id, bool gnuplot) {
  cJSON *env = cJSON_GetObjectItem(res, "env");
  const char *scale = cJSON_GetStringValue(cJSON_GetObjectItem(res, "run_scale"));
  double G = 1e9;
  fprintf(md, "## Ladder at full scale (planned)\n\n| step | what changes | batch | params | trainable | weights GB | grads GB | optim GB | acts GB | peak GB | cap GB | fits | max batch | OOM rate | TFLOP/step |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    cJSON *p = cJSON_GetObjectItem(r, "plan");
    char c1[24], c2[24];
    fprintf(md, "| %s | %s | %g | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s%.0f | %.0f%% | %.1f |\n",
            cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), cJSON_GetStringValue(cJSON_GetObjectItem(r, "label")),
            vl_rep_num(p, "batch"), vl_rep_count(vl_rep_num(p, "params_total"), c1, sizeof c1), vl_rep_count(vl_rep_num(p, "params_trainable"), c2, sizeof c2),
            vl_rep_num(p, "weight_bytes") / G,
            vl_rep_num(p, "grads_bytes") / G, vl_rep_num(p, "optim_bytes") / G, vl_rep_num(p, "acts_bytes") / G,
            vl_rep_num(p, "peak_bytes") / G, vl_rep_num(p, "cap_bytes") / G,
            cJSON_IsTrue(cJSON_GetObjectItem(p, "fits")) ? "yes" : "**no**",
            cJSON_IsTrue(cJSON_GetObjectItem(p, "max_batch_at_search_limit")) ? "≥" : "", vl_rep_num(p, "max_batch"),
            100 * vl_rep_num(p, "oom_rate"), vl_rep_num(p, "flops_per_step") / 1e12);
  }
  double tp = 0, ts = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    cJSON *p = cJSON_GetObjectItem(r, "plan");
    if (vl_rep_num(p, "plan_seconds") > tp) tp = vl_rep_num(p, "plan_seconds");
    if (vl_rep_num(p, "max_batch_search_seconds") > ts) ts = vl_rep_num(p, "max_batch_search_seconds");
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
          vl_rep_num(p0, "seq"), vl_rep_num(p0, "cuda_context_bytes") / 1e9, vl_rep_num(p0, "oom_batches"));

  int have_runs = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) have_runs |= cJSON_GetObjectItem(r, "runs") != NULL;
  if (have_runs) {
    fprintf(md, "## Ladder at `%s` scale (measured on %s)\n\n| step | batch×accum | step time median (min–max) s | tokens/s | loss first → last | measured peak MB | planned peak MB | plan = measured | model FLOP/s share of sgemm |\n|---|---|---|---|---|---|---|---|---|\n",
            scale, cJSON_GetStringValue(cJSON_GetObjectItem(env, "device")));
    double sg = vl_rep_num(res, "sgemm_flops_per_s");
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
      cJSON *runs = cJSON_GetObjectItem(r, "runs");
      if (!runs) continue;
      if (cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(runs, 0), "oom"))) {
        fprintf(md, "| %s | out of memory on this device: %s | | | | | | | |\n",
                cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")),
                cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(runs, 0), "error")));
        continue;
      }
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
              cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), vl_rep_num(r0, "batch"), vl_rep_num(r0, "accum"),
              st.median, st.min, st.max, vl_rep_run_metric(r, "tokens_per_s"),
              nl ? cJSON_GetArrayItem(loss, 0)->valuedouble : NAN,
              nl ? cJSON_GetArrayItem(loss, nl - 1)->valuedouble : NAN,
              vl_rep_num(r0, "measured_peak_bytes") / 1e6, vl_rep_num(r0, "planned_peak_bytes") / 1e6,
              cJSON_GetObjectItem(r0, "planned_peak_bytes") ? (match ? "yes" : "**no**") : "—",
              sg > 0 ? 100 * vl_rep_run_metric(r, "flops_per_s") / sg : NAN);
    }
    fprintf(md, "\nsgemm reference of this run: %.1f GFLOP/s (1024³, best of 5, the higher of the measurements before and after the ladder). Model FLOPs exclude "
                "recomputation (MLPerf rule). Loss is over the warm-up and timed steps of the first "
                "repetition. Runs are uncapped (the cap is a full-scale notion), so the `cap` row "
                "repeats `baseline`. Planned peak follows the CPU backend's workspace rules for the "
                "longest step of the run.\n\n", sg / 1e9);
  } else {
    fprintf(md, "## Measured ladder\n\nNot measured here: this results file holds plans only.\n\n");
  }

  fprintf(md, "## Plots\n\n");
  if (gnuplot) plots(res, dir, md, case_id);
}
