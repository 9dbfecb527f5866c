/* dataloader's report sections: the ladder (measured), the workers x prefetch sweep with
 * its heatmap, throughput vs workers against the decode-only ceiling, and the reference
 * against PyTorch's DataLoader when it was available. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kit/case.h"
#include "kit/rep.h"

/* A value of a data file: NaN (gnuplot leaves the point out) where the results miss it. */
static void dat_num(FILE *f, const char *fmt, double v) {
  if (isfinite(v)) fprintf(f, fmt, v);
  else fputs("NaN", f);
}

static void plots(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  const cJSON *cm = cJSON_GetObjectItem(res, "case_metrics"), *sweep = cJSON_GetObjectItem(res, "sweep"), *o;
  char name[VL_REP_GP_MAX + 1];
  vl_err why;
  vl_rep_dat d;
  if (cJSON_IsArray(sweep) && cJSON_GetArraySize(sweep) > 0) {
    /* heatmap: rows = workers, columns = prefetch, cell = images/s */
    if (vl_rep_dat_open(&d)) {
      vl_rep_plot_missing(md, dir, "heatmap", "out of memory");
    } else {
      int rows = 0;
      cJSON_ArrayForEach(o, sweep) {
        double w = vl_rep_num(o, "workers"), p = vl_rep_num(o, "prefetch"), ips = vl_rep_num(o, "images_per_s");
        if (isnan(w) || isnan(p) || isnan(ips)) continue; /* a cell without its place or value */
        fprintf(d.f, "%g %g %.2f\n", w, p, ips);
        rows++;
      }
      if (vl_rep_dat_commit(&d, dir, "sweep.dat", &why))
        vl_rep_plot_missing(md, dir, "heatmap", why.msg);
      else if (!rows)
        vl_rep_plot_missing(md, dir, "heatmap", "no sweep entry has workers, prefetch and images/s");
      else
        vl_rep_plot(md, dir, case_id, gnuplot, "heatmap", "workers x prefetch heatmap",
                    "set terminal png size 800,520 noenhanced\nset output vl_png\n"
                    "set title 'Pipeline throughput (images/s), workers x prefetch, no consumer'\n"
                    "set xlabel 'num_workers'\nset ylabel 'prefetch_factor'\nset logscale y 2\n"
                    "set palette defined (0 '#f7fbff', 1 '#6baed6', 2 '#08306b')\nset cblabel 'images/s'\n"
                    "set offsets 0.5, 0.5, 0, 0\nset xtics 1\nset yrange [0.7:5.7]\n"
                    "plot 'sweep.dat' using 1:2:3 with points pt 5 ps 6 palette notitle, "
                    "'' using 1:2:(sprintf('%.0f', $3)) with labels tc rgb 'black' font ',9' offset 0,-1.6 notitle\n");
    }
    /* throughput vs workers at the best prefetch, with the decode ceiling per core count */
    double per_core = vl_rep_num(cm, "decode_images_per_s_per_core"), cores = vl_rep_num(cm, "cores");
    if (vl_rep_dat_open(&d)) {
      vl_rep_plot_missing(md, dir, "workers", "out of memory");
    } else {
      int rows = 0;
      for (int w = 0; w <= 64; w++) {
        double top = -1;
        cJSON_ArrayForEach(o, sweep) {
          /* compared as doubles: a cast of a huge or missing value to int is undefined */
          double wv = vl_rep_num(o, "workers"), ips = vl_rep_num(o, "images_per_s");
          if (wv >= w && wv < w + 1 && ips > top) top = ips;
        }
        if (top < 0) continue;
        double ceil_w = per_core * (w < 1 ? 1 : (w < cores ? w : cores));
        fprintf(d.f, "%d %.2f ", w, top);
        dat_num(d.f, "%.2f", ceil_w);
        fputc('\n', d.f);
        rows++;
      }
      if (vl_rep_dat_commit(&d, dir, "workers.dat", &why)) {
        vl_rep_plot_missing(md, dir, "workers", why.msg);
      } else if (!rows) {
        vl_rep_plot_missing(md, dir, "workers", "no sweep entry has images/s at 0 to 64 workers");
      } else {
        char s2[1024], c[32] = "?";
        if (isfinite(cores)) snprintf(c, sizeof c, "%g", cores);
        /* the ceiling line only where the results have it: an all-NaN column fails the plot */
        bool ceiling = isfinite(per_core) && isfinite(cores);
        snprintf(s2, sizeof s2,
                 "set terminal png size 800,480 noenhanced\nset output vl_png\n"
                 "set title 'Throughput vs workers (best prefetch) and the decode-only ceiling (%s cores)'\n"
                 "set xlabel 'num_workers'\nset ylabel 'images/s (measured on this CPU)'\nset xtics 1\nset mxtics 1\nset grid\n"
                 "set key bottom right\nset yrange [0:*]\n"
                 "plot 'workers.dat' using 1:2 with linespoints lw 2 pt 7 title 'pipeline'%s\n",
                 c, ceiling ? ", '' using 1:3 with lines lw 2 dt 2 lc rgb 'red' "
                              "title 'decode ceiling x min(workers, cores)'" : "");
        vl_rep_plot(md, dir, case_id, gnuplot, "workers", "throughput vs workers", s2);
      }
    }
  }
  /* data-wait share per rung */
  if (vl_rep_dat_open(&d)) {
    vl_rep_plot_missing(md, dir, "wait", "out of memory");
    return;
  }
  int any = 0;
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(res, "rungs")) {
    /* one token: the xtic(1) column */
    fprintf(d.f, "%s ", vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(o, "name")), true, name, sizeof name));
    dat_num(d.f, "%.4f", 100 * vl_rep_run_metric(o, "data_wait_frac"));
    fputc('\n', d.f);
    any |= !isnan(vl_rep_run_metric(o, "data_wait_frac"));
  }
  if (vl_rep_dat_commit(&d, dir, "wait.dat", &why))
    vl_rep_plot_missing(md, dir, "wait", why.msg);
  else if (!any)
    vl_rep_plot_missing(md, dir, "wait", "no rung measured its data wait");
  else
    vl_rep_plot(md, dir, case_id, gnuplot, "wait", "data wait per rung",
                "set terminal png size 800,440 noenhanced\nset output vl_png\n"
                "set title 'Accelerator idle waiting for data, per rung (modeled accelerator)'\n"
                "set style data histograms\nset style fill solid 0.8 border -1\nset boxwidth 0.7\n"
                "set ylabel '% of step time'\nset yrange [0:100]\nset xtics rotate by -30\nset grid y\n"
                "plot 'wait.dat' using 2:xtic(1) notitle\n");
}

/* The strongest CPU peer: torchvision.io.decode_jpeg (libjpeg-turbo, as the engine's
 * TurboJPEG) on uint8 tensors, transforms.v2, a batch per worker call. A results file from
 * before this reference has neither key: it says so. */
static void torch_decode_jpeg_line(const cJSON *cm, FILE *md) {
  if (cJSON_GetStringValue(cJSON_GetObjectItem(cm, "torch_decode_jpeg_not_measured")))
    fprintf(md, "- PyTorch DataLoader with torchvision.io.decode_jpeg: not measured here: %s.\n",
            vl_rep_str(cm, "torch_decode_jpeg_not_measured"));
  else if (isnan(vl_rep_num(cm, "torch_decode_jpeg_images_per_s")))
    fprintf(md, "- PyTorch DataLoader with torchvision.io.decode_jpeg: not measured in this run.\n");
  else
    fprintf(md, "- PyTorch DataLoader with torchvision.io.decode_jpeg (libjpeg-turbo on uint8 tensors, "
                "transforms.v2, a whole batch per worker call, same files, workers = cores): %s images/s; "
                "vramlab is %s× it.\n",
            vl_rep_fmt("%.0f", vl_rep_num(cm, "torch_decode_jpeg_images_per_s")),
            vl_rep_fmt("%.2f", vl_rep_num(cm, "speedup_vs_torch_decode_jpeg")));
}

void vl_dataloader_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot) {
  const cJSON *r, *cm = cJSON_GetObjectItem(res, "case_metrics");
  fprintf(md, "## Ladder (last epoch of each run, mean over repetitions)\n\n"
              "Scales: `small` = the setting's %s JPEGs (~500x375), batches of %s random-resized 224x224 crops; "
              "`tiny` = at most 48 JPEGs and batches of 8 (CI); `full` = as `small`. Columns marked "
              "*(modeled)* depend on the modeled accelerator's %s ms per batch (wall time, no CPU); the "
              "others are this CPU's loader, measured.\n\n"
              "| step | what changes | workers | prefetch | images/s *(modeled)* | epoch s *(modeled)* | data wait *(modeled)* | accel. util *(modeled)* | "
              "wait ms/batch *(modeled)* | load ms/batch | transform ms/batch | CPU util *(modeled)* | host MB bound / peak | first batch s |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
          vl_rep_str(cJSON_GetObjectItem(res, "setting"), "images"), vl_rep_str(cJSON_GetObjectItem(res, "setting"), "batch"),
          vl_rep_str(cJSON_GetObjectItem(res, "setting"), "consumer_ms"));
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *runs = cJSON_GetObjectItem(r, "runs");
    if (!cJSON_IsArray(runs)) continue;
    const cJSON *r0 = cJSON_GetArrayItem(runs, 0);
    fprintf(md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s |\n",
            vl_rep_str(r, "name"), vl_rep_str(r, "label"), vl_rep_fmt("%g", vl_rep_num(r0, "workers")),
            vl_rep_fmt("%g", vl_rep_num(r0, "prefetch")), vl_rep_fmt("%.0f", vl_rep_run_metric(r, "images_per_s")),
            vl_rep_fmt("%.2f", vl_rep_run_metric(r, "epoch_s")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_run_metric(r, "data_wait_frac")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_run_metric(r, "accel_util")),
            vl_rep_fmt("%.1f", 1e3 * vl_rep_run_metric(r, "wait_s_per_batch")),
            vl_rep_fmt("%.1f", 1e3 * vl_rep_run_metric(r, "load_s_per_batch")),
            vl_rep_fmt("%.1f", 1e3 * vl_rep_run_metric(r, "transform_s_per_batch")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_run_metric(r, "cpu_util")),
            vl_rep_fmt("%.1f", vl_rep_run_metric(r, "host_bytes_bound") / 1e6),
            vl_rep_fmt("%.1f", vl_rep_run_metric(r, "host_bytes_peak") / 1e6),
            vl_rep_fmt("%.3f", vl_rep_run_metric(r, "first_batch_s")));
  }
  const cJSON *runs0 = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0), "runs");
  const cJSON *r0 = cJSON_IsArray(runs0) ? cJSON_GetArrayItem(runs0, 0) : NULL;
  fprintf(md, "\nConsumer: modeled accelerator, %s ms per batch of %s (wall time, no CPU). Load = a "
              "worker's time to read, decode, transform and collate one batch; transform = the "
              "crop/flip/normalise/collate part of it. CPU util = process CPU time / (wall × "
              "cores). `pin` does nothing on the CPU backend (no host-to-device copy), so that "
              "rung measures noise.\n\n",
          vl_rep_fmt("%g", vl_rep_num(r0, "consumer_ms")), vl_rep_fmt("%g", vl_rep_num(r0, "batch")));
  if (cJSON_IsObject(cm)) {
    fprintf(md, "## Decode ceiling and the workers x prefetch sweep (measured, no consumer)\n\n");
    fprintf(md, "- Decode-only ceiling: %s images/s per core (TurboJPEG, files in memory), %s with %s cores.\n",
            vl_rep_fmt("%.0f", vl_rep_num(cm, "decode_images_per_s_per_core")),
            vl_rep_fmt("%.0f", vl_rep_num(cm, "decode_ceiling_images_per_s")),
            vl_rep_fmt("%g", vl_rep_num(cm, "cores")));
    fprintf(appendix, "### dataloader: the engine's loader against its ceiling and PyTorch\n\n");
    fprintf(appendix, "- Pipeline at workers = cores: %s images/s = %s of the decode-only ceiling (target ≥ 85%%).\n",
            vl_rep_fmt("%.0f", vl_rep_num(cm, "images_per_s_at_cores")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_num(cm, "share_of_decode_ceiling")));
    char tied[64] = "";
    const cJSON *tv;
    size_t tn = 0;
    cJSON_ArrayForEach(tv, cJSON_GetObjectItem(cm, "best_prefetch_tied"))
      tn += (size_t)snprintf(tied + tn, tn < sizeof tied ? sizeof tied - tn : 0, "%s%g", tn ? ", " : "",
                             cJSON_GetNumberValue(tv));
    fprintf(md, "- Best sweep setting (fewest workers, then smallest prefetch, within 2%% of the top): "
                "workers %s, prefetch %s, %s images/s.\n",
            vl_rep_fmt("%g", vl_rep_num(cm, "best_workers")),
            tied[0] ? "not measurable (tied within one run's 5% noise)" : vl_rep_fmt("%g", vl_rep_num(cm, "best_prefetch")),
            vl_rep_fmt("%.0f", vl_rep_num(cm, "best_images_per_s")));
    if (tied[0]) fprintf(md, "  Prefetch %s at that worker count are within 5%% of each other.\n", tied);
    if (cJSON_GetStringValue(cJSON_GetObjectItem(cm, "torch_not_measured")))
      fprintf(appendix, "- PyTorch DataLoader reference: not measured here: %s.\n", vl_rep_str(cm, "torch_not_measured"));
    else
      fprintf(appendix, "- PyTorch DataLoader (torchvision/PIL, same files, workers = cores): %s images/s; "
                  "vramlab is %s× it (target ≥ 2×).\n",
              vl_rep_fmt("%.0f", vl_rep_num(cm, "torch_images_per_s")),
              vl_rep_fmt("%.2f", vl_rep_num(cm, "speedup_vs_torch")));
    torch_decode_jpeg_line(cm, appendix);
    fprintf(appendix, "\n");
    fprintf(md, "\n| workers | prefetch | images/s | CPU util |\n|---|---|---|---|\n");
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "sweep"))
      fprintf(md, "| %s | %s | %s | %s |\n", vl_rep_fmt("%g", vl_rep_num(r, "workers")),
              vl_rep_fmt("%g", vl_rep_num(r, "prefetch")), vl_rep_fmt("%.0f", vl_rep_num(r, "images_per_s")),
              vl_rep_fmt("%.0f%%", 100 * vl_rep_num(r, "cpu_util")));
    fprintf(md, "\n");
  }
  fprintf(md, "## Plots\n\n");
  plots(res, dir, md, case_id, gnuplot);
}
