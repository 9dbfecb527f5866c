/* dataloader's report sections: the ladder (measured), the workers x prefetch sweep with
 * its heatmap, throughput vs workers against the decode-only ceiling, and the reference
 * against PyTorch's DataLoader when it was available. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "case.h"
#include "report.h"

static const char *str(const cJSON *o, const char *k) {
  const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(o, k));
  return s ? s : "?";
}

static void plots(cJSON *res, const char *dir, FILE *md, const char *case_id) {
  cJSON *cm = cJSON_GetObjectItem(res, "case_metrics"), *sweep = cJSON_GetObjectItem(res, "sweep"), *o;
  char path[1024];
  int ok = 1;
  if (cJSON_GetArraySize(sweep) > 0) {
    /* heatmap: rows = workers, columns = prefetch, cell = images/s */
    snprintf(path, sizeof path, "%s/sweep.dat", dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    cJSON_ArrayForEach(o, sweep)
      fprintf(f, "%g %g %.2f\n", vl_rep_num(o, "workers"), vl_rep_num(o, "prefetch"), vl_rep_num(o, "images_per_s"));
    fclose(f);
    const char *hm =
        "set terminal png size 800,520\nset output 'heatmap.png'\nset termoption noenhanced\n"
        "set title 'Pipeline throughput (images/s), workers x prefetch, no consumer'\n"
        "set xlabel 'num_workers'\nset ylabel 'prefetch_factor'\nset logscale y 2\n"
        "set palette defined (0 '#f7fbff', 1 '#6baed6', 2 '#08306b')\nset cblabel 'images/s'\n"
        "set offsets 0.5, 0.5, 0, 0\nset xtics 1\nset yrange [0.7:5.7]\n"
        "plot 'sweep.dat' using 1:2:3 with points pt 5 ps 6 palette notitle, "
        "'' using 1:2:(sprintf('%.0f', $3)) with labels tc rgb 'black' font ',9' offset 0,-1.6 notitle\n";
    ok &= vl_rep_gnuplot(dir, "heatmap", hm) == 0;
    /* throughput vs workers at the best prefetch, with the decode ceiling per core count */
    snprintf(path, sizeof path, "%s/workers.dat", dir);
    f = fopen(path, "w");
    if (!f) return;
    double per_core = vl_rep_num(cm, "decode_images_per_s_per_core"), cores = vl_rep_num(cm, "cores");
    for (int w = 0; w <= 64; w++) {
      double top = -1;
      cJSON_ArrayForEach(o, sweep)
        if ((int)vl_rep_num(o, "workers") == w && vl_rep_num(o, "images_per_s") > top) top = vl_rep_num(o, "images_per_s");
      if (top < 0) continue;
      double ceil_w = per_core * (w < 1 ? 1 : (w < cores ? w : cores));
      fprintf(f, "%d %.2f %.2f\n", w, top, ceil_w);
    }
    fclose(f);
    char s2[1024];
    snprintf(s2, sizeof s2,
             "set terminal png size 800,480\nset output 'workers.png'\nset termoption noenhanced\n"
             "set title 'Throughput vs workers (best prefetch) and the decode-only ceiling (%g cores)'\n"
             "set xlabel 'num_workers'\nset ylabel 'images/s'\nset grid\nset key bottom right\nset yrange [0:*]\n"
             "plot 'workers.dat' using 1:2 with linespoints lw 2 pt 7 title 'pipeline', "
             "'' using 1:3 with lines lw 2 dt 2 lc rgb 'red' title 'decode ceiling x min(workers, cores)'\n",
             cores);
    ok &= vl_rep_gnuplot(dir, "workers", s2) == 0;
  }
  /* data-wait share per rung */
  snprintf(path, sizeof path, "%s/wait.dat", dir);
  FILE *f = fopen(path, "w");
  if (!f) return;
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(res, "rungs"))
    fprintf(f, "%s %.4f\n", str(o, "name"), 100 * vl_rep_run_metric(o, "data_wait_frac"));
  fclose(f);
  const char *s3 =
      "set terminal png size 800,440\nset output 'wait.png'\nset termoption noenhanced\n"
      "set title 'Accelerator idle waiting for data, per rung (modeled accelerator)'\n"
      "set style data histograms\nset style fill solid 0.8 border -1\nset boxwidth 0.7\n"
      "set ylabel '% of step time'\nset yrange [0:100]\nset xtics rotate by -30\nset grid y\n"
      "plot 'wait.dat' using 2:xtic(1) notitle\n";
  ok &= vl_rep_gnuplot(dir, "wait", s3) == 0;
  if (!ok) fprintf(md, "_gnuplot failed on some plots: see the *.gnuplot.log files in reports/%s/._\n\n", case_id);
  if (cJSON_GetArraySize(sweep) > 0) {
    fprintf(md, "![workers x prefetch heatmap](%s/heatmap.png)\n\n", case_id);
    fprintf(md, "![throughput vs workers](%s/workers.png)\n\n", case_id);
  }
  fprintf(md, "![data wait per rung](%s/wait.png)\n\n", case_id);
}

void vl_dataloader_report(cJSON *res, FILE *md, const char *dir, const char *case_id, bool gnuplot) {
  cJSON *r, *cm = cJSON_GetObjectItem(res, "case_metrics");
  fprintf(md, "## Ladder (measured; last epoch of each run, mean over repetitions)\n\n"
              "| step | what changes | workers | prefetch | images/s | epoch s | data wait | accel. util | "
              "wait ms/batch | load ms/batch | transform ms/batch | CPU util | host MB bound / peak | first batch s |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    if (!cJSON_GetObjectItem(r, "runs")) continue;
    cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "runs"), 0);
    fprintf(md, "| %s | %s | %g | %g | %.0f | %.2f | %.0f%% | %.0f%% | %.1f | %.1f | %.1f | %.0f%% | %.1f / %.1f | %.3f |\n",
            str(r, "name"), str(r, "label"), vl_rep_num(r0, "workers"), vl_rep_num(r0, "prefetch"),
            vl_rep_run_metric(r, "images_per_s"), vl_rep_run_metric(r, "epoch_s"),
            100 * vl_rep_run_metric(r, "data_wait_frac"), 100 * vl_rep_run_metric(r, "accel_util"),
            1e3 * vl_rep_run_metric(r, "wait_s_per_batch"), 1e3 * vl_rep_run_metric(r, "load_s_per_batch"),
            1e3 * vl_rep_run_metric(r, "transform_s_per_batch"), 100 * vl_rep_run_metric(r, "cpu_util"),
            vl_rep_run_metric(r, "host_bytes_bound") / 1e6, vl_rep_run_metric(r, "host_bytes_peak") / 1e6,
            vl_rep_run_metric(r, "first_batch_s"));
  }
  cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0), "runs"), 0);
  fprintf(md, "\nConsumer: modeled accelerator, %g ms per batch of %g (wall time, no CPU). Load = a "
              "worker's time to read, decode, transform and collate one batch; transform = the "
              "crop/flip/normalise/collate part of it. CPU util = process CPU time / (wall × "
              "cores). `pin` does nothing on the CPU backend (no host-to-device copy), so that "
              "rung measures noise.\n\n",
          vl_rep_num(r0, "consumer_ms"), vl_rep_num(r0, "batch"));
  if (cm) {
    fprintf(md, "## Decode ceiling, sweep and reference\n\n");
    fprintf(md, "- Decode-only ceiling: %.0f images/s per core (TurboJPEG, files in memory), %.0f with %g cores.\n",
            vl_rep_num(cm, "decode_images_per_s_per_core"), vl_rep_num(cm, "decode_ceiling_images_per_s"),
            vl_rep_num(cm, "cores"));
    fprintf(md, "- Pipeline at workers = cores: %.0f images/s = %.0f%% of the ceiling (target ≥ 85%%).\n",
            vl_rep_num(cm, "images_per_s_at_cores"), 100 * vl_rep_num(cm, "share_of_decode_ceiling"));
    fprintf(md, "- Best sweep setting (fewest workers, then smallest prefetch, within 2%% of the top): "
                "workers %g, prefetch %g, %.0f images/s.\n",
            vl_rep_num(cm, "best_workers"), vl_rep_num(cm, "best_prefetch"), vl_rep_num(cm, "best_images_per_s"));
    const char *why = cJSON_GetStringValue(cJSON_GetObjectItem(cm, "torch_not_measured"));
    if (why) fprintf(md, "- PyTorch DataLoader reference: not measured here: %s.\n", why);
    else
      fprintf(md, "- PyTorch DataLoader (torchvision/PIL, same files, workers = cores): %.0f images/s; "
                  "vramlab is %.2f× it (target ≥ 2×).\n",
              vl_rep_num(cm, "torch_images_per_s"), vl_rep_num(cm, "speedup_vs_torch"));
    fprintf(md, "\n| workers | prefetch | images/s | CPU util |\n|---|---|---|---|\n");
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "sweep"))
      fprintf(md, "| %g | %g | %.0f | %.0f%% |\n", vl_rep_num(r, "workers"), vl_rep_num(r, "prefetch"),
              vl_rep_num(r, "images_per_s"), 100 * vl_rep_num(r, "cpu_util"));
    fprintf(md, "\n");
  }
  fprintf(md, "## Plots\n\n");
  if (gnuplot) plots(res, dir, md, case_id);
}
