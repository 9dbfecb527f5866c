/* sd-lora's report sections: the ladder at full scale (planned), the ladder at the run scale
 * (measured), the cache (build, payoff, sizes), the loss with and without the cache, and
 * plots: load time per batch per rung, cumulative wall time against epochs with and without
 * the cache, memory by category per rung, batch against peak memory with the 88% caps of 24
 * and 48 GB, classic against efficient attention. The harness writes the header, setting and
 * claims around them. Everything read here comes from a results file: numbers through
 * vl_rep_num (NaN when absent or not a number), strings through vl_rep_str / vl_rep_gp_str. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/rep.h"
#include "sdl.h"
#include "sdl_torch.h"

static const cJSON *last_rung(const cJSON *res) {
  const cJSON *r, *last = NULL;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) last = r;
  return last;
}
static double gb(double b) { return b / 1e9; }

/* ---- tables ------------------------------------------------------------------------------- */
static void planned_ladder(const cJSON *res, FILE *md) {
  fprintf(md, "## Ladder at full scale (planned, 512x512)\n\n"
              "| step | what changes | encoders in step | batch | peak GB | frozen GB | acts GB | temp GB | "
              "data GB | fits 24 GB | max batch 24 GB | max batch 48 GB | TFLOP/step | modeled step s |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *p = vl_rep_plan(r), *c = cJSON_GetObjectItem(p, "by_category");
    fprintf(md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", vl_rep_str(r, "name"),
            vl_rep_str(r, "label"), vl_rep_yes_no(cJSON_GetObjectItem(p, "encoders_in_step")),
            vl_rep_fmt("%g", vl_rep_num(p, "batch")), vl_rep_fmt("%.2f", gb(vl_rep_num(p, "peak_bytes"))),
            vl_rep_fmt("%.2f", gb(vl_rep_num(c, "frozen"))), vl_rep_fmt("%.2f", gb(vl_rep_num(c, "acts"))),
            vl_rep_fmt("%.2f", gb(vl_rep_num(c, "temp"))), vl_rep_fmt("%.3f", gb(vl_rep_num(c, "data"))),
            vl_rep_yes_no(cJSON_GetObjectItem(p, "fits")), vl_rep_fmt("%.0f", vl_rep_num(p, "max_batch")),
            vl_rep_fmt("%.0f", vl_rep_num(p, "max_batch_48")), vl_rep_fmt("%.1f", vl_rep_num(p, "flops_per_step") / 1e12),
            vl_rep_fmt("%.2f", vl_rep_num(p, "modeled_step_s")));
  }
  const cJSON *p0 = vl_rep_plan(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0)), *L = vl_rep_plan(last_rung(res));
  const cJSON *pm = cJSON_GetObjectItem(p0, "params_by_module");
  char a[24], b[24], c[24], d[24];
  fprintf(md, "\nParameters: U-Net %s, VAE encoder %s, text encoder %s (frozen), LoRA %s (trainable). Peak = the "
              "step's largest live set (categories at that moment); an uncached rung's step holds the VAE and text "
              "encoder weights and runs them before the U-Net. Max batch: bisection over planned steps under the "
              "rung's cap of the card (24 GB: %s GB, 48 GB: %s GB for the last rung), %s GB of CUDA context "
              "assumed outside it. Modeled step s: the modeled accelerator's step at full scale, `consumer_ms` "
              "for a cached batch of 16 scaled by planned FLOPs (recomputation included).\n\n",
          vl_rep_count(vl_rep_num(pm, "unet"), a, sizeof a), vl_rep_count(vl_rep_num(pm, "vae_encoder"), b, sizeof b),
          vl_rep_count(vl_rep_num(pm, "text_encoder"), c, sizeof c), vl_rep_count(vl_rep_num(pm, "lora"), d, sizeof d),
          vl_rep_fmt("%.2f", gb(vl_rep_num(L, "cap_bytes"))), vl_rep_fmt("%.2f", gb(vl_rep_num(L, "cap_48_bytes"))),
          vl_rep_fmt("%.2f", gb(vl_rep_num(p0, "cuda_context_bytes"))));
}

/* "`small` scale: U-Net channels 64/128/256/256, ..." of a scale's preset, or "" */
static const char *scale_dims(const char *scale) {
  static char b[320];
  vl_sd_cfg c;
  if (!scale || vl_sd_preset(scale, &c)) return "";
  snprintf(b, sizeof b, "`%s` scale: SD 1.5's structure with U-Net channels %lld/%lld/%lld/%lld, %lldx%lld latents "
                        "(%lld px images), a text context of %lld tokens x %lld.", scale, (long long)c.unet.ch[0],
           (long long)c.unet.ch[1], (long long)c.unet.ch[2], (long long)c.unet.ch[3], (long long)c.unet.sample,
           (long long)c.unet.sample, (long long)vl_sd_image_side(&c), (long long)c.unet.ctx_len,
           (long long)c.unet.ctx_dim);
  return b;
}

static void measured_ladder(const cJSON *res, FILE *md) {
  fprintf(md, "## Ladder at `%s` scale (measured on %s)\n\n%s\n\n"
              "| step | consumer | cache | workers | batch | load s/batch | producer s/batch | inputs s/batch "
              "(this CPU) | step s | data wait | accel. util | images/s | epoch s | host MB | cache MB disk / RAM | "
              "payoff epochs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
          vl_rep_str(res, "run_scale"), vl_rep_str(cJSON_GetObjectItem(res, "env"), "device"),
          scale_dims(cJSON_GetStringValue(cJSON_GetObjectItem(res, "run_scale"))));
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *r0 = vl_rep_run0(r);
    if (!r0) continue;
    if (!cJSON_GetObjectItem(r0, "step_time")) {
      fprintf(md, "| %s | %s: %s |||||||||||||| \n", vl_rep_str(r, "name"),
              cJSON_IsTrue(cJSON_GetObjectItem(r0, "oom")) ? "out of memory" : "failed", vl_rep_str(r0, "error"));
      continue;
    }
    fprintf(md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s |\n",
            vl_rep_str(r, "name"), vl_rep_str(r0, "consumer"), vl_rep_str(r0, "cache"),
            vl_rep_fmt("%g", vl_rep_num(r0, "workers")), vl_rep_fmt("%g", vl_rep_num(r0, "batch")),
            vl_rep_fmt("%.4f", vl_rep_run_metric(r, "load_s_per_batch")),
            vl_rep_fmt("%.4f", vl_rep_run_metric(r, "producer_s_per_batch")),
            vl_rep_fmt("%.3f", vl_rep_run_metric(r, "inputs_s_per_batch")),
            vl_rep_fmt("%.3f", vl_rep_run_metric(r, "step_seconds")),
            vl_rep_fmt("%.1f%%", 100 * vl_rep_run_metric(r, "data_wait_share")),
            vl_rep_fmt("%.1f%%", 100 * vl_rep_run_metric(r, "accel_util")),
            vl_rep_fmt("%.1f", vl_rep_run_metric(r, "images_per_s")), vl_rep_fmt("%.2f", vl_rep_run_metric(r, "epoch_s")),
            vl_rep_fmt("%.1f", vl_rep_run_metric(r, "host_bytes_bound") / 1e6),
            vl_rep_fmt("%.2f", vl_rep_run_metric(r, "cache_disk_bytes") / 1e6),
            vl_rep_fmt("%.2f", vl_rep_run_metric(r, "cache_ram_bytes") / 1e6),
            vl_rep_fmt("%.2f", vl_rep_run_metric(r, "payoff_epochs")));
  }
  const cJSON *r0 = vl_rep_run0(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0));
  fprintf(md, "\n**Consumer** (the column says which each rung used; the ladder's default is the modeled "
              "accelerator for every rung, because a real U-Net step at the run scale takes seconds on a CPU and "
              "would hide the input pipeline entirely; `--set consumer=model` trains the real step, and then "
              "cached and uncached rungs see the same images, noise and timesteps, so their losses agree within the "
              "cache's rounding). `modeled accelerator`: a step that takes wall time and no CPU, `consumer_ms` = %s ms "
              "for a LoRA step on cached inputs at 512 px and batch 16 (a 4090's order of magnitude: the planned "
              "27.7 TFLOP step at ~28 TFLOP/s), scaled by the rung's planned FLOPs per image (an uncached step runs "
              "the VAE and text encoder on the accelerator too) and by the run scale's pixels (so the pipeline and "
              "the accelerator keep full scale's ratio); `model`: the real U-Net LoRA step at the run scale on "
              "this device. **Load s/batch**: the input pipeline alone (no consumer, one pass), wall seconds per "
              "batch: decode + SD resize + crop + collate, or cache reads (CRC per record) + sampling z from the "
              "moments. **Producer s/batch**: the work in it, summed over workers. **Inputs s/batch (this CPU)**: "
              "a batch of U-Net inputs (latents and text embeddings): for an uncached rung load + the VAE and text "
              "encoder for the batch as timed in the cache build on this CPU, for a cached rung its load. "
              "**Data wait** = share of the last epoch's wall time the consumer waited for its batch; accel. util "
              "= 1 − data wait (the article's \"GPU utilisation\"). Epoch s: the last epoch (projected from its "
              "steps when `steps` limits them). Host MB: the pipeline's buffer bound. Payoff: see the cache "
              "section. The disk cache is read through the page cache (the file was just written): what the "
              "`ram_cache` rung saves is the syscalls and CRC checks per read, not disk seeks.\n\n",
          vl_rep_fmt("%g", vl_rep_num(r0, "consumer_ms")));
}

static void cache_section(const cJSON *res, FILE *md) {
  const cJSON *cm = cJSON_GetObjectItem(res, "case_metrics"), *sz = cJSON_GetObjectItem(cm, "cache_sizes_50k");
  const cJSON *cr = vl_rep_rung(res, cJSON_GetStringValue(cJSON_GetObjectItem(cm, "payoff_rung")));
  const cJSON *ur = vl_rep_rung(res, cJSON_GetStringValue(cJSON_GetObjectItem(cm, "payoff_against")));
  double n = vl_rep_num(cm, "cache_build_images");
  fprintf(md, "## The cache\n\n"
              "**Build** (one-time, measured on this CPU at the run scale, %s images): %s s = decode + transform "
              "%s s + VAE encoder %s s + text encoder %s s + writing %s s (both stored forms, moments and one "
              "sample, are written by one VAE pass); %s ms per image. With the encoders on the modeled "
              "accelerator instead (their planned FLOPs at its rate, %s ms per image): %s s.\n\n",
          vl_rep_fmt("%.0f", n), vl_rep_fmt("%.2f", vl_rep_num(cm, "cache_build_s")),
          vl_rep_fmt("%.2f", vl_rep_num(cm, "cache_build_load_s")), vl_rep_fmt("%.2f", vl_rep_num(cm, "cache_build_vae_s")),
          vl_rep_fmt("%.2f", vl_rep_num(cm, "cache_build_clip_s")),
          vl_rep_fmt("%.3f", vl_rep_num(cm, "cache_build_write_s")),
          vl_rep_fmt("%.1f", 1e3 * vl_rep_num(cm, "cache_build_s_per_image")),
          vl_rep_fmt("%.2f", 1e3 * vl_rep_num(cm, "encode_modeled_s_per_image")),
          vl_rep_fmt("%.2f", vl_rep_num(cm, "cache_build_s_modeled")));
  fprintf(md, "**Payoff**: `%s` against `%s` (the same batch and workers, only the cache differs): one epoch "
              "%s s → %s s. The build with its encoders on the epochs' consumer (%s s) pays for itself after "
              "**%s epochs**; the build as measured on this CPU (%s s) after %s epochs. Every cached rung's payoff "
              "against `%s` is in the ladder table; the cumulative-time plot below shows the crossing.\n\n",
          vl_rep_str(cm, "payoff_rung"), vl_rep_str(cm, "payoff_against"),
          vl_rep_fmt("%.2f", vl_rep_run_metric(ur, "epoch_s")), vl_rep_fmt("%.2f", vl_rep_run_metric(cr, "epoch_s")),
          vl_rep_fmt("%.2f", vl_rep_num(cm, "cache_build_s_payoff")), vl_rep_fmt("%.2f", vl_rep_num(cm, "payoff_epochs")),
          vl_rep_fmt("%.2f", vl_rep_num(cm, "cache_build_s")),
          vl_rep_fmt("%.1f", vl_rep_num(cm, "payoff_epochs_cpu_build")), vl_rep_str(cm, "payoff_against"));
  const cJSON *c0 = vl_rep_run0(cr);
  fprintf(md, "**Files** (at the run scale; `%s` %s them%s%s%s): %s records, %s MB on disk (latents %s MB, text embeddings %s MB); "
              "size = the format's (256-byte header + records with a CRC-32 each): %s. In RAM (`ram_cache`): %s MB. "
              "Key: the encoders' weights as the device holds them, read back and hashed (with their activation "
              "dtype and attention), the set's items (sizes and byte counts in order, not their bytes), resolution, "
              "center crop, SD's normalisation, the stored form and its sample seed, the dtype; a differing key "
              "rebuilds (`cache_mismatch = error`: stops naming the field), a truncated or corrupt file is found "
              "(every record's CRC is checked before use) and rebuilt. **Flip augmentation is disabled** (one "
              "variant per image is cached, the crop is the center crop): a random flip or crop cannot come from "
              "a cache of one variant.\n\n",
          vl_rep_str(cr, "name"), strcmp(vl_rep_str(c0, "cache_state"), "built") ? "reused" : "built",
          cJSON_GetObjectItem(c0, "cache_found") ? " after finding `" : "",
          cJSON_GetObjectItem(c0, "cache_found") ? vl_rep_str(c0, "cache_found") : "",
          cJSON_GetObjectItem(c0, "cache_found") ? "`" : "", vl_rep_fmt("%.0f", vl_rep_num(c0, "cache_records")),
          vl_rep_fmt("%.2f", vl_rep_num(c0, "cache_disk_bytes") / 1e6),
          vl_rep_fmt("%.2f", vl_rep_num(c0, "cache_latent_disk_bytes") / 1e6),
          vl_rep_fmt("%.2f", vl_rep_num(c0, "cache_text_disk_bytes") / 1e6),
          cJSON_IsTrue(cJSON_GetObjectItem(c0, "cache_bytes_match_format")) ? "yes, byte for byte" : "**no**",
          vl_rep_fmt("%.2f", vl_rep_run_metric(vl_rep_rung(res, "ram_cache"), "cache_ram_bytes") / 1e6));
  fprintf(md, "**50k images at 512 px** (the format's sizes, checked above against the files):\n\n"
              "| what | fp16 GB | fp32 GB |\n|---|---|---|\n"
              "| latents, moments (8×64×64: mean and log-variance) | %s | %s |\n"
              "| latents, one sample (4×64×64, kohya) | %s | %s |\n"
              "| text embeddings (77×768) | %s | %s |\n"
              "| moments + text embeddings | %s | %s |\n\n"
              "The article's \"50k latents ≈ 20 GB\" is 6× the 4×64×64 latents in fp16 and 3× the moments; only "
              "the moments with the text embeddings, in fp32, come near it.\n\n",
          vl_rep_fmt("%.2f", gb(vl_rep_num(sz, "latents_moments_fp16"))),
          vl_rep_fmt("%.2f", gb(vl_rep_num(sz, "latents_moments_fp32"))),
          vl_rep_fmt("%.2f", gb(vl_rep_num(sz, "latents_sample_fp16"))),
          vl_rep_fmt("%.2f", gb(vl_rep_num(sz, "latents_sample_fp32"))), vl_rep_fmt("%.2f", gb(vl_rep_num(sz, "text_fp16"))),
          vl_rep_fmt("%.2f", gb(vl_rep_num(sz, "text_fp32"))),
          vl_rep_fmt("%.2f", gb(vl_rep_num(sz, "latents_moments_fp16") + vl_rep_num(sz, "text_fp16"))),
          vl_rep_fmt("%.2f", gb(vl_rep_num(sz, "latents_moments_fp32") + vl_rep_num(sz, "text_fp32"))));
}

static void loss_section(const cJSON *res, FILE *md) {
  const cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
  const cJSON *lu = cJSON_GetObjectItem(cm, "loss_uncached"), *lm = cJSON_GetObjectItem(cm, "loss_cached_moments"),
              *ls = cJSON_GetObjectItem(cm, "loss_cached_sample");
  fprintf(md, "### sd-lora: the loss with and without the cache\n\n");
  if (!cJSON_IsArray(lu) || !cJSON_IsArray(lm) || !cJSON_IsArray(ls)) {
    fprintf(md, "Not measured in this run (`loss_steps = 0`, or no cached rung).\n\n");
    return;
  }
  fprintf(md, "Real U-Net LoRA steps at `%s` scale (`loss_scale`; batch %s), the same model seed, the same "
              "images in the same order, the same U-Net noise and timesteps; without the cache the VAE and text "
              "encoder run in the step with the same eps the cached moments are sampled with. %s\n\n"
              "| step | without cache | cached moments | cached sample |\n|---|---|---|---|\n",
          vl_rep_str(cm, "loss_scale"), vl_rep_fmt("%g", vl_rep_num(cm, "loss_batch")),
          scale_dims(cJSON_GetStringValue(cJSON_GetObjectItem(cm, "loss_scale"))));
  int n = cJSON_GetArraySize(lu);
  for (int i = 0; i < n && i < 64; i++)
    fprintf(md, "| %d | %s | %s | %s |\n", i + 1, vl_rep_fmt("%.6f", vl_rep_numv(cJSON_GetArrayItem(lu, i))),
            vl_rep_fmt("%.6f", vl_rep_numv(cJSON_GetArrayItem(lm, i))),
            vl_rep_fmt("%.6f", vl_rep_numv(cJSON_GetArrayItem(ls, i))));
  fprintf(md, "\nLargest relative difference from the uncached loss: cached moments %s (the cache's %s rounding), "
              "a cached sample %s (another noise draw). Across two epochs the same image's latent changes by %s "
              "(RMS, relative) when z is sampled from the moments each epoch, and by %s with a stored sample: "
              "kohya's cache freezes the VAE's noise for the whole training. (The weights are seeded, not "
              "trained: an untrained VAE's log-variance is near 0, so here the sample's noise is as large as its "
              "mean; a trained VAE's is far smaller.)\n\n",
          vl_rep_fmt("%.2e", vl_rep_num(cm, "loss_max_rel_diff_moments")),
          vl_rep_str(cJSON_GetObjectItem(vl_rep_rung(res, vl_rep_str(cm, "payoff_rung")), "knobs"), "cache_dtype"),
          vl_rep_fmt("%.2e", vl_rep_num(cm, "loss_max_rel_diff_sample")),
          vl_rep_fmt("%.3f", vl_rep_num(cm, "latent_epoch_change_moments")),
          vl_rep_fmt("%.3f", vl_rep_num(cm, "latent_epoch_change_sample")));
}

/* ---- plots ------------------------------------------------------------------------------------ */
static void dat_num(FILE *f, const char *fmt, double v) {
  if (isfinite(v)) fprintf(f, fmt, v);
  else fputs(" NaN", f);
}

/* Load time per batch per rung (log scale), and for uncached rungs the inputs on this CPU. */
static void plot_load(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  vl_rep_dat d;
  char name[VL_REP_GP_MAX + 1];
  vl_err why;
  if (vl_rep_dat_open(&d)) { vl_rep_plot_missing(md, dir, "load", "out of memory"); return; }
  int any = 0, idx = 0;
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    double l = vl_rep_run_metric(r, "load_s_per_batch"), in = vl_rep_run_metric(r, "inputs_s_per_batch");
    fprintf(d.f, "%d %s", idx++, vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), true, name, sizeof name));
    dat_num(d.f, " %.6g", l > 0 ? 1e3 * l : NAN);
    dat_num(d.f, " %.6g", in > 0 ? 1e3 * in : NAN);
    fputc('\n', d.f);
    any |= l > 0;
  }
  if (vl_rep_dat_commit(&d, dir, "load.dat", &why)) vl_rep_plot_missing(md, dir, "load", why.msg);
  else if (!any) vl_rep_plot_missing(md, dir, "load", "no rung measured its load time");
  else
    vl_rep_plot(md, dir, case_id, gnuplot, "load", "load time per batch per rung",
                "set terminal png size 900,480 noenhanced\nset output vl_png\n"
                "set title 'Time per batch: the input pipeline alone, and U-Net inputs on this CPU (run scale)'\n"
                "set ylabel 'ms per batch (log scale)'\nset logscale y\nset grid y\nset xtics rotate by -30\n"
                "set boxwidth 0.35\nset style fill solid 0.8 border -1\nset key outside below\n"
                "plot 'load.dat' using ($1-0.18):3:xtic(2) with boxes lc rgb '#377eb8' title 'load (pipeline alone)', "
                "'' using ($1+0.18):4 with boxes lc rgb '#e41a1c' title 'U-Net inputs on this CPU (uncached: + the encoders)'\n");
}

/* Cumulative wall time against epochs: uncached, and cached with the build first. */
static void plot_payoff(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  const cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
  const cJSON *u = vl_rep_rung(res, cJSON_GetStringValue(cJSON_GetObjectItem(cm, "payoff_against")));
  const cJSON *c = vl_rep_rung(res, cJSON_GetStringValue(cJSON_GetObjectItem(cm, "payoff_rung")));
  const cJSON *a = last_rung(res);
  double eu = vl_rep_run_metric(u, "epoch_s"), ec = vl_rep_run_metric(c, "epoch_s"), ea = vl_rep_run_metric(a, "epoch_s");
  double build = vl_rep_num(cm, "cache_build_s_payoff"), pay = vl_rep_num(cm, "payoff_epochs");
  double cpu = vl_rep_num(cm, "cache_build_s"), pay_cpu = vl_rep_num(cm, "payoff_epochs_cpu_build");
  if (isfinite(pay_cpu) && (!isfinite(pay) || pay_cpu > pay)) pay = pay_cpu;
  if (!(eu > 0) || !(ec > 0) || !(build >= 0)) {
    vl_rep_plot_missing(md, dir, "payoff", "the results hold no uncached and cached epoch times with a build");
    return;
  }
  int top = isfinite(pay) && pay * 2 + 2 > 10 ? (int)fmin(pay * 2 + 2, 1000) : 10;
  vl_rep_dat d;
  char s[2048], nu[VL_REP_GP_MAX + 1], nc[VL_REP_GP_MAX + 1], na[VL_REP_GP_MAX + 1];
  vl_err why;
  if (vl_rep_dat_open(&d)) { vl_rep_plot_missing(md, dir, "payoff", "out of memory"); return; }
  for (int e = 0; e <= top; e++) {
    fprintf(d.f, "%d %.6g %.6g", e, e * eu, build + e * ec);
    dat_num(d.f, " %.6g", ea > 0 ? build + e * ea : NAN);
    dat_num(d.f, " %.6g", cpu >= 0 ? cpu + e * ec : NAN);
    fputc('\n', d.f);
  }
  if (vl_rep_dat_commit(&d, dir, "payoff.dat", &why)) { vl_rep_plot_missing(md, dir, "payoff", why.msg); return; }
  /* the epochs the run measured: the lines past them are the same sums, extrapolated */
  const char *es = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "setting"), "epochs"));
  double run_epochs = es ? strtod(es, NULL) : NAN;
  char mark[192] = "";
  if (isfinite(run_epochs) && run_epochs > 0 && run_epochs < top)
    snprintf(mark, sizeof mark, "set arrow from %g, graph 0 to %g, graph 1 nohead lc rgb 'black' dt 3\n"
                                "set label ' extrapolated from here' at %g, graph 0.97 left\n",
             run_epochs, run_epochs, run_epochs);
  vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(u, "name")), false, nu, sizeof nu);
  vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(c, "name")), false, nc, sizeof nc);
  vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(a, "name")), false, na, sizeof na);
  snprintf(s, sizeof s,
           "set terminal png size 900,480 noenhanced\nset output vl_png\n"
           "set title 'Cumulative wall time: no cache vs the one-time build (its encoders on the consumer) + "
           "cached epochs'\n"
           "set xlabel 'epochs (lines: build + n x the measured epoch time, extrapolated past epoch %s)'\n"
           "set ylabel 'seconds'\nset grid\nset key below\nset xrange [0:*]\nset yrange [0:*]\n%s"
           "plot 'payoff.dat' using 1:2 with linespoints lw 2 pt 7 title '%s (no cache)', "
           "'' using 1:3 with linespoints lw 2 pt 5 title '%s (build + epochs)'%s%s%s%s%s%s\n",
           vl_rep_fmt("%g", run_epochs), mark, nu, nc, ea > 0 ? ", '' using 1:4 with linespoints lw 2 pt 9 title '" : "", ea > 0 ? na : "",
           ea > 0 ? " (build + epochs)'" : "", cpu >= 0 ? ", '' using 1:5 with lines lw 2 dt 2 title '" : "",
           cpu >= 0 ? nc : "", cpu >= 0 ? " (the build as timed on this CPU + epochs)'" : "");
  vl_rep_plot(md, dir, case_id, gnuplot, "payoff", "cumulative wall time against epochs", s);
}

/* Peak memory against batch: the last rung's curve with the caps of both cards; and classic
 * against efficient attention. */
static void plot_batch(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  const cJSON *a = last_rung(res), *p = vl_rep_plan(a);
  char s[2048], caps[256] = "", name[VL_REP_GP_MAX + 1];
  vl_err why;
  double c24 = gb(vl_rep_num(p, "cap_bytes")), c48 = gb(vl_rep_num(p, "cap_48_bytes"));
  if (isfinite(c24)) snprintf(caps, sizeof caps, ", %.4f with lines lw 2 lc rgb 'red' title 'cap, 24 GB card'", c24);
  if (isfinite(c48))
    snprintf(caps + strlen(caps), sizeof caps - strlen(caps), ", %.4f with lines lw 2 dt 2 lc rgb 'red' "
             "title 'cap, 48 GB card'", c48);
  vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(a, "name")), false, name, sizeof name);
  const cJSON *bc = cJSON_GetObjectItem(p, "batch_curve");
  if (!cJSON_GetArraySize(bc)) vl_rep_plot_missing(md, dir, "batch", "the results hold no batch curve");
  else if (vl_rep_write_pairs(dir, "batch.dat", bc, &why)) vl_rep_plot_missing(md, dir, "batch", why.msg);
  else {
    snprintf(s, sizeof s,
             "set terminal png size 900,480 noenhanced\nset output vl_png\n"
             "set title 'Peak memory vs batch (rung %s, planned at 512x512)'\n"
             "set xlabel 'micro-batch'\nset ylabel 'GB'\nset grid\nset key left top\n"
             "plot 'batch.dat' using 1:2 with linespoints lw 2 pt 7 title 'planned peak'%s\n", name, caps);
    vl_rep_plot(md, dir, case_id, gnuplot, "batch", "memory vs batch", s);
  }
  const cJSON *cc = cJSON_GetObjectItem(p, "batch_curve_classic"), *ce = cJSON_GetObjectItem(p, "batch_curve_efficient");
  if (!cJSON_GetArraySize(cc) || !cJSON_GetArraySize(ce))
    vl_rep_plot_missing(md, dir, "attention", "the results hold no classic and efficient curves");
  else if (vl_rep_write_pairs(dir, "attn_classic.dat", cc, &why) ||
           vl_rep_write_pairs(dir, "attn_efficient.dat", ce, &why))
    vl_rep_plot_missing(md, dir, "attention", why.msg);
  else {
    snprintf(s, sizeof s,
             "set terminal png size 900,480 noenhanced\nset output vl_png\n"
             "set title 'Classic vs efficient attention: peak memory vs batch (rung %s, planned)'\n"
             "set xlabel 'micro-batch'\nset ylabel 'GB'\nset grid\nset key left top\nset logscale y\n"
             "plot 'attn_classic.dat' using 1:2 with linespoints lw 2 pt 7 title 'classic (scores materialised)', "
             "'attn_efficient.dat' using 1:2 with linespoints lw 2 pt 5 title 'efficient (tiled)'%s\n", name, caps);
    vl_rep_plot(md, dir, case_id, gnuplot, "attention", "classic vs efficient attention", s);
  }
}

static void plots(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  char s[4096];
  vl_err why;
  plot_load(res, dir, md, case_id, gnuplot);
  plot_payoff(res, dir, md, case_id, gnuplot);
  if (vl_rep_mem_by_category(res, dir, "Peak memory by category per rung (planned, 512x512; uncached rungs hold "
                             "the VAE and text encoder)", s, sizeof s, &why))
    vl_rep_plot_missing(md, dir, "mem_by_category", why.msg);
  else
    vl_rep_plot(md, dir, case_id, gnuplot, "mem_by_category", "memory by category", s);
  plot_batch(res, dir, md, case_id, gnuplot);
}

void vl_sd_lora_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot) {
  planned_ladder(res, md);
  vl_case_pytorch_report(res, md, "tools/peers/sd_lora_peer.py runs (diffusers' UNet2DConditionModel with PEFT LoRA "
                         "on to_q/to_k/to_v/to_out.0, the factors in fp32, torch.autocast and GradScaler, "
                         "per-resnet and per-transformer checkpointing when the rung checkpoints, AdamW, "
                         "gradients set to None)",
                         "Its CUDA code path has not been measured on a GPU: it takes CUDA autocast to run "
                         "GroupNorm and LayerNorm in fp32 and SDPA's flash kernel in the 16-bit dtype, where the "
                         "CPU path (held to the traces) differs. The rungs that run the frozen VAE encoder and CLIP "
                         "text encoder in the step run them under no_grad before the U-Net (diffusers' AutoencoderKL "
                         "encoder and transformers' CLIPTextModel), on the CPU held to their own traces; on CUDA "
                         "autocast also takes their norms and exp to fp32, unmeasured on a GPU as well.");
  bool ran = false;
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) ran |= vl_rep_run0(r) != NULL;
  if (ran) measured_ladder(res, md);
  else fprintf(md, "## Measured ladder\n\nNot measured here: this results file holds plans only.\n\n");
  if (cJSON_IsObject(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "case_metrics"), "cache_sizes_50k")))
    cache_section(res, md);
  if (ran) {
    loss_section(res, appendix);
    vl_sdl_peers_report(res, appendix);
  }
  fprintf(md, "## Plots\n\n");
  plots(res, dir, md, case_id, gnuplot);
}
