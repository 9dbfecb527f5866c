/* llm-lora's report sections: the full-scale ladder (planned), the measured ladder, plots
 * (memory by category per rung, memory timeline of one step, batch vs peak with the cap,
 * time per token), and PyTorch side by side (llm_torch.c). The harness writes the header, setting and
 * claims around them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kit/case.h"
#include "llm.h"
#include "llm_torch.h"
#include "kit/rep.h"

/* A number in a gnuplot script: "?" (an undefined value there) would be a script error, so
 * callers leave out what is not finite; this is only for titles. */
static const char *gp_num(double v, char *b, size_t n) {
  if (isfinite(v)) snprintf(b, n, "%g", v);
  else snprintf(b, n, "?");
  return b;
}

static void plots(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  char s[3072], name[VL_REP_GP_MAX + 1], nb[32];
  vl_err why;
  /* 1. memory by category at the peak, per rung (stacked bars) */
  if (vl_rep_mem_by_category(res, dir, "Peak memory by category per rung (planned, full scale, batch as configured)",
                             s, sizeof s, &why))
    vl_rep_plot_missing(md, dir, "mem_by_category", why.msg);
  else
    vl_rep_plot(md, dir, case_id, gnuplot, "mem_by_category", "memory by category", s);
  const cJSON *r, *last = NULL;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) last = r;
  const cJSON *lp = cJSON_GetObjectItem(last, "plan");
  vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(last, "name")), false, name, sizeof name);
  /* 2. memory timeline of one step (last rung) */
  const cJSON *tl = cJSON_GetObjectItem(lp, "timeline");
  if (!cJSON_GetArraySize(tl)) {
    vl_rep_plot_missing(md, dir, "timeline", "the results hold no memory timeline for the last rung");
  } else if (vl_rep_write_pairs(dir, "timeline.dat", tl, &why)) {
    vl_rep_plot_missing(md, dir, "timeline", why.msg);
  } else {
    snprintf(s, sizeof s,
             "set terminal png size 1000,480 noenhanced\nset output vl_png\n"
             "set title 'Live memory during one training step: rung %s (planned, full scale)'\n"
             "set xlabel 'allocator event'\nset ylabel 'GB'\nset grid\n"
             "plot 'timeline.dat' using 1:2 with lines lw 2 title 'live bytes'\n",
             name);
    vl_rep_plot(md, dir, case_id, gnuplot, "timeline", "memory timeline of one step", s);
  }
  /* 3. batch vs the fit test's quantity with the cap line and the largest batch (last rung) */
  const cJSON *bc = cJSON_GetObjectItem(lp, "batch_curve"), *bl = cJSON_GetObjectItem(lp, "batch_curve_live");
  double cap = vl_rep_num(lp, "cap_bytes"), mb = vl_rep_num(lp, "max_batch");
  bool have_live = cJSON_GetArraySize(bl) > 0;
  if (!cJSON_GetArraySize(bc)) {
    vl_rep_plot_missing(md, dir, "batch", "the results hold no batch curve for the last rung");
  } else if (vl_rep_write_pairs(dir, "batch.dat", bc, &why) ||
             (have_live && vl_rep_write_pairs(dir, "batch_live.dat", bl, &why))) {
    vl_rep_plot_missing(md, dir, "batch", why.msg);
  } else {
    char capline[96] = "", mbline[160] = "", liveline[128] = "";
    if (isfinite(cap)) snprintf(capline, sizeof capline, ", %g with lines lw 2 lc rgb 'red' title 'cap'", cap / 1e9);
    if (isfinite(mb) && mb > 0)
      snprintf(mbline, sizeof mbline, "set arrow from %g, graph 0 to %g, graph 1 nohead lc rgb 'black' dt 2\n"
                                      "set label 'max batch %g' at %g, graph 0.05 right offset -0.5,0\n",
               mb, mb, mb, mb);
    if (have_live)
      snprintf(liveline, sizeof liveline, ", 'batch_live.dat' using 1:2 with lines lw 1 dt 3 lc rgb '#777777' "
                                          "title 'live bytes at the peak'");
    snprintf(s, sizeof s,
             "set terminal png size 900,480 noenhanced\nset output vl_png\n"
             "set title 'Memory vs micro-batch at sequence %s (rung %s, planned, full scale)'\n"
             "set xlabel 'micro-batch'\nset ylabel 'GB'\nset grid\nset key below\n%s"
             "plot 'batch.dat' using 1:2 with linespoints lw 2 title 'reserved extent (live bytes and holes: what the cap bounds), uncapped'%s%s\n",
             gp_num(vl_rep_num(lp, "seq"), nb, sizeof nb), name, mbline, liveline, capline);
    vl_rep_plot(md, dir, case_id, gnuplot, "batch", "batch vs memory", s);
  }
  /* 4. step time per rung (measured) */
  vl_rep_dat d;
  if (vl_rep_dat_open(&d)) {
    vl_rep_plot_missing(md, dir, "step_time", "out of memory");
    return;
  }
  int any = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    double t = vl_rep_run_metric(r, "sec_per_token");
    if (isnan(t)) continue;
    /* one token: the xtic(1) column */
    const char *rn = cJSON_GetStringValue(cJSON_GetObjectItem(r, "name"));
    fprintf(d.f, "%s %.6g\n", vl_rep_gp_str(rn, true, name, sizeof name), t * 1e3);
    any = 1;
  }
  if (vl_rep_dat_commit(&d, dir, "step_time.dat", &why)) {
    vl_rep_plot_missing(md, dir, "step_time", why.msg);
  } else if (any) {
    char dev[VL_REP_GP_MAX + 1];
    vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "env"), "device")), false, dev,
                  sizeof dev);
    bool cpu = !strcmp(dev, "cpu");
    snprintf(s, sizeof s,
             "set terminal png size 900,480 noenhanced\nset output vl_png\n"
             "set title 'Time per target token (measured on %s at the %s scale%s)'\n"
             "set style data histograms\nset style fill solid 0.8 border -1\nset boxwidth 0.7\n"
             "set ylabel 'ms per token'\nset yrange [0:*]\nset xtics rotate by -30\nset grid y\n"
             "plot 'step_time.dat' using 2:xtic(1) notitle\n",
             dev, vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(res, "run_scale")), false, name, sizeof name),
             cpu ? "; fp16 and nf4 emulated: converted to fp32 per GEMM" : "");
    vl_rep_plot(md, dir, case_id, gnuplot, "step_time", "time per token", s);
  }
}


/* the largest finite value of plan key k over the rungs; NaN when none has it */
static double max_over_rungs(const cJSON *res, const char *k) {
  double m = NAN;
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    double v = vl_rep_num(cJSON_GetObjectItem(r, "plan"), k);
    if (!isnan(v) && (isnan(m) || v > m)) m = v;
  }
  return m;
}

/* "4096 vocab, 4 layers, dim 256, ..." of a scale's preset model, or "" */
static const char *scale_dims(const char *scale, char *b, size_t n) {
  vl_mistral_cfg mc;
  if (!scale || vl_mistral_preset(scale, &mc)) {
    snprintf(b, n, "(an unknown scale)");
    return b;
  }
  snprintf(b, n, "%lld layers, hidden %lld, SwiGLU %lld, %lld heads (%lld key/value), vocabulary %lld, sequences up to %lld "
                 "tokens", (long long)mc.n_layers, (long long)mc.dim, (long long)mc.ffn, (long long)mc.n_heads,
           (long long)mc.n_kv_heads, (long long)mc.vocab, (long long)mc.seq);
  return b;
}

/* A largest batch: "none fits" for 0, "≥N" at the search's limit. */

void vl_llm_lora_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot) {
  const cJSON *env = cJSON_GetObjectItem(res, "env");
  double G = 1e9;
  char dims[256];
  fprintf(md, "## Ladder at full scale (planned)\n\n| step | what changes | batch | params | trainable | weights GB | grads GB | optim GB | acts GB | peak GB | cap GB | fits | max batch | OOM rate | TFLOP/step | 13B on 48 GB: max batch |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *p = cJSON_GetObjectItem(r, "plan");
    char c1[24], c2[24], m1[32], m2[32];
    fprintf(md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
            vl_rep_str(r, "name"), vl_rep_str(r, "label"), vl_rep_fmt("%g", vl_rep_num(p, "batch")),
            vl_rep_count(vl_rep_num(p, "params_total"), c1, sizeof c1),
            vl_rep_count(vl_rep_num(p, "params_trainable"), c2, sizeof c2),
            vl_rep_fmt("%.2f", vl_rep_num(p, "weight_bytes") / G), vl_rep_fmt("%.2f", vl_rep_num(p, "grads_bytes") / G),
            vl_rep_fmt("%.2f", vl_rep_num(p, "optim_bytes") / G), vl_rep_fmt("%.2f", vl_rep_num(p, "acts_bytes") / G),
            vl_rep_fmt("%.2f", vl_rep_num(p, "peak_bytes") / G), vl_rep_fmt("%.2f", vl_rep_num(p, "cap_bytes") / G),
            vl_rep_yes_no(cJSON_GetObjectItem(p, "fits")), vl_case_batch_cell(p, "max_batch", m1, sizeof m1),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_num(p, "oom_rate")),
            vl_rep_fmt("%.1f", vl_rep_num(p, "flops_per_step") / 1e12), vl_case_batch_cell(p, "max_batch_13b_48gb", m2, sizeof m2));
  }
  const cJSON *p0 = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0), "plan");
  fprintf(md, "\nFull scale is the article's model: Mistral-7B-v0.1 (%s). "
              "GB are decimal (10^9 bytes). Peak = all live bytes at the step's high-water mark at the "
              "rung's batch and sequence %s. `acts` is the activation category's own peak. The cap "
              "is the rung's fraction of the card, and never more than the card less %s GB for "
              "the CUDA context, which lives outside the allocator (an assumption: not measured "
              "here). Max batch is found by bisection over planned steps at the full sequence "
              "length (\"none fits\": not even batch 1), each planned under the cap. The batch plot draws the "
              "arena's reserved extent (live bytes and the holes between them, what the cap bounds), planned "
              "uncapped, with the live peak under it and the max batch marked: under a cap the allocator's best "
              "fit places blocks differently once the free tail is smaller than the holes, so a batch or two past "
              "the max can show an uncapped extent just under the cap; the live peak alone crosses it only "
              "several batches later. "
              "OOM rate is the share of %s variable-length batches whose padded length "
              "exceeds the longest that fits at the rung's batch (so a rung at its largest batch "
              "has 0%% by construction). The last column plans the rung's training setup on LLaMA-2-13B "
              "(40 layers, hidden 5120, SwiGLU 13824, 40 heads, vocabulary 32000) under 92%% of a 48 GiB "
              "card, the article's RTX A6000 row.\n\n",
          scale_dims("full", dims, sizeof dims), vl_rep_fmt("%g", vl_rep_num(p0, "seq")),
          vl_rep_fmt("%.2f", vl_rep_num(p0, "cuda_context_bytes") / 1e9), vl_rep_fmt("%g", vl_rep_num(p0, "oom_batches")));
  vl_case_pytorch_report(res, md, "tools/peers/llm_lora_peer.py runs (Hugging Face's MistralForCausalLM with SDPA, "
                         "PEFT LoRA, bitsandbytes' NF4 Linear4bit, torch.autocast and GradScaler, clip_grad_norm_, AdamW or "
                         "transformers' Adafactor, gradients set to None)",
                         "An NF4 base is bitsandbytes' Linear4bit (0.50: NF4, double quantisation, the weight dequantised "
                         "in each forward and backward), held to real CPU traces; on CUDA bitsandbytes fuses the forward's "
                         "dequantisation into its own 4-bit matmul for some shapes, which the mimic plans unfused: at most one "
                         "weight's transient copy too much in the forward. It never does past 1536 rows (batch × "
                         "sequence), nor past 512 for a weight of 4 Mi elements or more, as every 7B weight is "
                         "(bitsandbytes 0.50's _gemm_4bit_use_custom_cuda), so the full-scale rungs above, 1024 rows "
                         "and more, take the unfused path the mimic plans. MemTracker cannot trace it "
                         "(Params4bit cannot wrap a fake tensor). On CUDA an fp32 step with grouped KV heads runs "
                         "SDPA's math kernel in PyTorch 2.11 (flash takes fp16/bf16 only, the memory-efficient kernel no "
                         "grouped heads), which keeps each layer's (B, H, T, T) attention: the mimic plans that kernel, held "
                         "to a trace of it on this CPU (sdpa_kernel(MATH)); flash attention's backward buffers (softmax_d, "
                         "dq_accum, the expanded dK and dV) are read from PyTorch's source, not yet measured on a GPU. "
                         VL_MIMIC_GPU_MEASURED);
  fprintf(appendix, "### llm-lora: the planner's speed\n\nPlanning one full-scale step took at most %s s; the "
                    "largest-batch search at most %s s (targets: < 0.5 s, < 2 s).\n\n",
          vl_rep_fmt("%.3f", max_over_rungs(res, "plan_seconds")),
          vl_rep_fmt("%.3f", max_over_rungs(res, "max_batch_search_seconds")));

  int have_runs = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) have_runs |= cJSON_IsArray(cJSON_GetObjectItem(r, "runs"));
  if (have_runs) {
    const char *scale = vl_rep_str(res, "run_scale");
    vl_mistral_cfg mc;
    bool known = !vl_mistral_preset(scale, &mc);
    fprintf(md, "## Ladder at `%s` scale (measured on %s)\n\n`%s` scale: the same model shape at %s.\n\n"
                "| step | batch×accum | step time median (min–max) s | tokens/s | loss first → last | model FLOP/s share of sgemm |\n|---|---|---|---|---|---|\n",
            scale, vl_rep_str(env, "device"), scale, scale_dims(scale, dims, sizeof dims));
    fprintf(appendix, "### llm-lora: planned = measured memory at the `%s` scale\n\n"
                      "| step | measured peak MB | planned peak MB | plan = measured |\n|---|---|---|---|\n", scale);
    double sg = vl_rep_num(res, "sgemm_flops_per_s");
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
      const cJSON *runs = cJSON_GetObjectItem(r, "runs");
      if (!cJSON_IsArray(runs)) continue;
      const cJSON *r0 = cJSON_GetArrayItem(runs, 0);
      if (cJSON_IsTrue(cJSON_GetObjectItem(r0, "oom"))) {
        fprintf(md, "| %s | out of memory on this device: %s | | | | |\n", vl_rep_str(r, "name"),
                vl_rep_str(r0, "error"));
        continue;
      }
      /* pool the step-time samples of all repetitions */
      double samples[4096];
      int ns = 0;
      const cJSON *ro;
      cJSON_ArrayForEach(ro, runs) {
        const cJSON *sm, *sa = cJSON_GetObjectItem(cJSON_GetObjectItem(ro, "step_time"), "samples");
        if (cJSON_IsArray(sa))
          cJSON_ArrayForEach(sm, sa) if (ns < 4096 && !isnan(vl_rep_numv(sm))) samples[ns++] = vl_rep_numv(sm);
      }
      vl_stats st;
      vl_stats_compute(samples, ns, &st);
      const cJSON *loss = cJSON_GetObjectItem(r0, "loss");
      int nl = cJSON_IsArray(loss) ? cJSON_GetArraySize(loss) : 0;
      int match = 1;
      cJSON_ArrayForEach(ro, runs) match &= cJSON_IsTrue(cJSON_GetObjectItem(ro, "plan_matches_measured"));
      fprintf(md, "| %s | %s×%s | %s (%s–%s) | %s | %s → %s | %s |\n",
              vl_rep_str(r, "name"), vl_rep_fmt("%g", vl_rep_num(r0, "batch")),
              vl_rep_fmt("%g", vl_rep_num(r0, "accum")),
              vl_rep_fmt("%.4f", st.median), vl_rep_fmt("%.4f", st.min), vl_rep_fmt("%.4f", st.max),
              vl_rep_fmt("%.0f", vl_rep_run_metric(r, "tokens_per_s")),
              vl_rep_fmt("%.3f", nl ? vl_rep_numv(cJSON_GetArrayItem(loss, 0)) : NAN),
              vl_rep_fmt("%.3f", nl ? vl_rep_numv(cJSON_GetArrayItem(loss, nl - 1)) : NAN),
              vl_rep_fmt("%.0f%%", sg > 0 ? 100 * vl_rep_run_metric(r, "flops_per_s") / sg : NAN));
      fprintf(appendix, "| %s | %s | %s | %s |\n", vl_rep_str(r, "name"),
              vl_rep_fmt("%.2f", vl_rep_num(r0, "measured_peak_bytes") / 1e6),
              vl_rep_fmt("%.2f", vl_rep_num(r0, "planned_peak_bytes") / 1e6),
              cJSON_GetObjectItem(r0, "planned_peak_bytes") ? (match ? "yes" : "**no**") : "—");
    }
    fprintf(md, "\nsgemm reference of this run: %s GFLOP/s (1024³, best of 5, the higher of the measurements before and after the ladder). Model FLOPs exclude "
                "recomputation (MLPerf rule). Runs are uncapped (the cap is a full-scale notion), so the `cap` row "
                "repeats `baseline`. On a CPU the fp16 and nf4 rungs are emulated (operands converted to fp32 "
                "per GEMM), so they are slower here than they would be on a GPU; the epoch-time claim waits for one.\n\n"
                "**Loss** is over the warm-up and timed steps of the first repetition, from seeded "
                "random weights: it starts near ln(vocabulary) = %s, the loss of uniform guessing. The data "
                "follow a token recurrence with 10%% random tokens that a model learns in a few hundred steps, "
                "so this short a run learns none of it: first → last moves by the step-to-step noise of batches "
                "of different lengths and tokens (a few hundredths, up or down) and says nothing about training "
                "quality; a loss that rises here is that noise, not divergence.\n\n",
            vl_rep_fmt("%.1f", sg / 1e9),
            known ? vl_rep_fmt("%.3f", log((double)mc.vocab)) : "—");
    fprintf(appendix, "\nPlanned peak follows the CPU backend's workspace rules for the longest step of the run.\n\n");
    vl_llm_peers_report(res, appendix);
  } else {
    fprintf(md, "## Measured ladder\n\nNot measured here: this results file holds plans only.\n\n");
  }

  fprintf(md, "## Plots\n\n");
  plots(res, dir, md, case_id, gnuplot);
}
