/* multi-gpu's report sections after the claims: per-card memory at full scale for 1, 2, 4, 8
 * cards (planned, exact: plain data parallelism keeps a full copy, ZeRO-1 shards the
 * optimizer state), the ladder at full scale (planned per card, modeled times), the ladder
 * measured here (medians over the interleaved repetitions, per rank too), the bucket-cap
 * sweep, the collective benchmark's busbw table, the modeled section with its assumptions,
 * and the plots (speedup vs ranks, per-card memory vs cards, busbw vs size, loss, memory by
 * category). Everything read from the results file is untrusted: numbers through
 * vl_rep_num (NaN prints "—"), strings through vl_rep_str / vl_rep_gp_str. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mg.h"
#include "kit/rep.h"

#define G 1e9

static const cJSON *rungs_of(const cJSON *res) { return cJSON_GetObjectItem(res, "rungs"); }
static const char *name_of(const cJSON *r) { return vl_rep_str(r, "name"); }
static const char *mode_of(const cJSON *r) {
  const char *m = cJSON_GetStringValue(cJSON_GetObjectItem(vl_rep_plan(r), "mode"));
  return m ? m : "";
}

/* The median over a rung's undisturbed runs of key (all when none is; NaN when none has it). */
static double med_run(const cJSON *rung, const char *key) { return vl_mg_run_median(rung, key, NULL, NULL); }

/* Median, min and max over the undisturbed runs (all when none is) of the step-time median. */
static void step_range(const cJSON *rung, double *med, double *lo, double *hi) {
  double v[128];
  int n = 0, quiet = 0;
  *lo = *hi = NAN;
  const cJSON *run;
  cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs")) quiet += !cJSON_IsTrue(cJSON_GetObjectItem(run, "disturbed"));
  cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs")) {
    double x = vl_rep_num(cJSON_GetObjectItem(run, "step_time"), "median");
    if (quiet && cJSON_IsTrue(cJSON_GetObjectItem(run, "disturbed"))) continue;
    if (isnan(x) || n >= 128) continue;
    v[n++] = x;
    if (isnan(*lo) || x < *lo) *lo = x;
    if (isnan(*hi) || x > *hi) *hi = x;
  }
  *med = vl_mg_median(v, n);
}

/* The per_card entry of a rung's plan for n cards (NULL when absent). */
static const cJSON *card_entry(const cJSON *rung, int n) {
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(vl_rep_plan(rung), "per_card"))
    if (vl_rep_num(e, "cards") == n) return e;
  return NULL;
}

static double modeled(const cJSON *entry, const char *preset, const char *what) {
  return vl_rep_num(cJSON_GetObjectItem(cJSON_GetObjectItem(entry, "modeled"), preset), what);
}

/* The first rung of a mode (NULL when none). */
static const cJSON *first_of_mode(const cJSON *res, const char *mode) {
  const cJSON *r;
  cJSON_ArrayForEach(r, rungs_of(res))
    if (!strcmp(mode_of(r), mode)) return r;
  return NULL;
}

/* ---- per-card memory ------------------------------------------------------------------------- */
static void per_card(const cJSON *res, FILE *md) {
  const cJSON *single = first_of_mode(res, "single"), *ddp = first_of_mode(res, "ddp"),
              *zero = first_of_mode(res, "zero1"), *r;
  fprintf(md, "## Memory per card at full scale (planned, exact)\n\n"
              "Plain data parallelism (DataParallel and DDP) keeps **a full copy of the weights, the gradients "
              "and the optimizer state on every card**: adding cards adds throughput, not memory, and the "
              "memory per card does not fall with more cards (DDP adds its gradient buckets, category `comm`, "
              "unless `gradient_as_bucket_view` makes the gradients live in them). ZeRO stage 1 shards the "
              "optimizer state: each card keeps 1/N of it. Peak per card (GB), rank 0, 512×512, the "
              "per-card batch of the ladder; one card alone (`%s`): %s GB.\n\n| cards |",
          single ? name_of(single) : "—", vl_rep_fmt("%.3f", vl_rep_num(vl_rep_plan(single), "peak_bytes") / G));
  int nr = 0;
  cJSON_ArrayForEach(r, rungs_of(res)) if (card_entry(r, 2)) { fprintf(md, " `%s` (%s) |", name_of(r), mode_of(r)); nr++; }
  fprintf(md, "\n|---|");
  for (int i = 0; i < nr; i++) fprintf(md, "---|");
  fprintf(md, "\n");
  for (int i = 0; i < VL_MG_CARDS_N; i++) {
    fprintf(md, "| %d |", vl_mg_cards[i]);
    cJSON_ArrayForEach(r, rungs_of(res)) if (card_entry(r, 2))
      fprintf(md, " %s |", vl_rep_fmt("%.3f", vl_rep_num(card_entry(r, vl_mg_cards[i]), "peak_bytes") / G));
    fprintf(md, "\n");
  }
  if (!ddp || !zero) { fprintf(md, "\n"); return; }
  fprintf(md, "\nWhat ZeRO-1 (`%s`) saves against plain DDP (`%s`), per card (GB; model state = weights + "
              "gradients + optimizer state):\n\n"
              "| cards | DDP model state | DDP optimizer | DDP comm | ZeRO-1 model state | ZeRO-1 optimizer | ZeRO-1 comm | "
              "DDP peak | ZeRO-1 peak | saved |\n|---|---|---|---|---|---|---|---|---|---|\n",
          name_of(zero), name_of(ddp));
  for (int i = 0; i < VL_MG_CARDS_N; i++) {
    const cJSON *a = card_entry(ddp, vl_mg_cards[i]), *b = card_entry(zero, vl_mg_cards[i]);
    double pa = vl_rep_num(a, "peak_bytes"), pb = vl_rep_num(b, "peak_bytes");
    fprintf(md, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s (%s) |\n", vl_mg_cards[i],
            vl_rep_fmt("%.3f", vl_rep_num(a, "model_state_bytes") / G), vl_rep_fmt("%.3f", vl_rep_num(a, "optim_bytes") / G),
            vl_rep_fmt("%.3f", vl_rep_num(a, "comm_bytes") / G), vl_rep_fmt("%.3f", vl_rep_num(b, "model_state_bytes") / G),
            vl_rep_fmt("%.3f", vl_rep_num(b, "optim_bytes") / G), vl_rep_fmt("%.3f", vl_rep_num(b, "comm_bytes") / G),
            vl_rep_fmt("%.3f", pa / G), vl_rep_fmt("%.3f", pb / G), vl_rep_fmt("%.3f", (pa - pb) / G),
            vl_rep_fmt("%.1f%%", 100 * (pa - pb) / pa));
  }
  fprintf(md, "\nZeRO-1's gradients live in one flat padded buffer (category `comm`, reduce-scattered, then reused "
              "for the all-gathered parameters), so its gradient category is empty and its comm category is the "
              "gradients' size.\n\n");
}

/* ---- the planned ladder ------------------------------------------------------------------------- */
static void planned_ladder(const cJSON *res, FILE *md) {
  fprintf(md, "## Ladder at full scale (planned per card, rank 0; times modeled)\n\n"
              "| step | what changes | mode | ranks | global batch | buckets | payload MB/step | model state GB | "
              "optimizer GB | comm GB | acts GB | peak GB | fits | max batch/card | speedup PCIe (modeled) | busy PCIe "
              "(modeled) | speedup NVLink (modeled) | busy NVLink (modeled) |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const cJSON *r;
  cJSON_ArrayForEach(r, rungs_of(res)) {
    const cJSON *p = vl_rep_plan(r);
    fprintf(md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s%s | %s | %s | %s | %s |\n",
            name_of(r), vl_rep_str(r, "label"), vl_rep_str(p, "mode"), vl_rep_fmt("%g", vl_rep_num(p, "ranks")),
            vl_rep_fmt("%g", vl_rep_num(p, "global_batch")), vl_rep_fmt("%g", vl_rep_num(p, "n_buckets")),
            vl_rep_fmt("%.1f", vl_rep_num(p, "comm_payload_bytes") / 1e6),
            vl_rep_fmt("%.3f", vl_rep_num(p, "model_state_bytes") / G), vl_rep_fmt("%.3f", vl_rep_num(p, "optim_bytes") / G),
            vl_rep_fmt("%.3f", vl_rep_num(p, "comm_bytes") / G), vl_rep_fmt("%.2f", vl_rep_num(p, "acts_bytes") / G),
            vl_rep_fmt("%.3f", vl_rep_num(p, "peak_bytes") / G), vl_rep_yes_no(cJSON_GetObjectItem(p, "fits")),
            cJSON_IsTrue(cJSON_GetObjectItem(p, "max_batch_at_search_limit")) ? "≥" : "",
            vl_rep_fmt("%.0f", vl_rep_num(p, "max_batch")), vl_rep_fmt("%.2f×", vl_rep_num(p, "modeled_speedup_pcie")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_num(p, "modeled_busy_pcie")),
            vl_rep_fmt("%.2f×", vl_rep_num(p, "modeled_speedup_nvlink")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_num(p, "modeled_busy_nvlink")));
  }
  const cJSON *p0 = vl_rep_plan(cJSON_GetArrayItem(rungs_of(res), 0));
  char c1[24];
  fprintf(md, "\nParameters: %s (trainable elements %s). Payload = bytes one rank hands to collectives per step "
              "(DDP: every gradient once; ZeRO-1: the padded gradients reduce-scattered and its shard of "
              "parameters all-gathered; DataParallel: rank 0's reduce and broadcast). Buckets follow PyTorch's "
              "assignment (`_compute_bucket_assignment_by_size`, reverse parameter order). The cap is the card "
              "less %s GB of CUDA context (assumed). Step FLOPs per card: %s TFLOP.\n\n",
          vl_rep_count(vl_rep_num(p0, "params_total"), c1, sizeof c1), vl_rep_fmt("%.0f", vl_rep_num(p0, "trainable_elems")),
          vl_rep_fmt("%.2f", vl_rep_num(p0, "cuda_context_bytes") / G),
          vl_rep_fmt("%.3f", vl_rep_num(p0, "step_flops_per_card") / 1e12));
}

/* ---- the measured ladder ------------------------------------------------------------------------- */
static bool any_run(const cJSON *res, const char *key) {
  const cJSON *r, *run;
  cJSON_ArrayForEach(r, rungs_of(res))
    cJSON_ArrayForEach(run, cJSON_GetObjectItem(r, "runs")) if (cJSON_GetObjectItem(run, key)) return true;
  return false;
}

static const char *first_str(const cJSON *rung, const char *key) {
  const cJSON *run;
  cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs"))
    if (cJSON_IsString(cJSON_GetObjectItem(run, key))) return vl_rep_str(run, key);
  return NULL;
}

static void loss_ends(const cJSON *rung, double *first, double *last) {
  const cJSON *l = cJSON_GetObjectItem(vl_rep_run0(rung), "loss");
  int n = cJSON_GetArraySize(l);
  *first = n ? vl_rep_numv(cJSON_GetArrayItem(l, 0)) : NAN;
  *last = n ? vl_rep_numv(cJSON_GetArrayItem(l, n - 1)) : NAN;
}

/* A setting as the results file records it, else its declared default. */
static const char *setting_str(const cJSON *res, const char *key) {
  const cJSON *st = cJSON_GetObjectItem(res, "setting");
  if (cJSON_IsString(cJSON_GetObjectItem(st, key))) return vl_rep_str(st, key);
  const vl_knob_decl *d = vl_knob_decl_find(vl_mg_knobs, key);
  return d && d->def ? d->def : "—";
}

/* " (N runs measured again)" when disturbed jobs were repeated, else "". */
static const char *reruns_of(const cJSON *rung) {
  static char b[96];
  double n = 0;
  const cJSON *run;
  cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs")) {
    double a = vl_rep_num(run, "attempts");
    if (a > 1) n += a - 1;
  }
  int used = 0, total = 0;
  vl_mg_run_median(rung, "samples_per_s", &used, &total);
  int o = 0;
  b[0] = 0;
  if (n > 0) o = snprintf(b, sizeof b, "; %.0f job%s run again", n, n == 1 ? "" : "s");
  if (used < total && o >= 0 && (size_t)o < sizeof b)
    snprintf(b + o, sizeof b - (size_t)o, "; %d of %d disturbed, left out", total - used, total);
  return b;
}

/* The parameters of the run scale's model, from the measured per-rank memory (fp32 weights). */
static const char *run_params(const cJSON *res) {
  static char b[32];
  const cJSON *pr = cJSON_GetArrayItem(cJSON_GetObjectItem(vl_rep_run0(cJSON_GetArrayItem(rungs_of(res), 0)), "per_rank"), 0);
  return vl_rep_count(vl_rep_num(cJSON_GetObjectItem(pr, "measured_by_category"), "params") / 4, b, sizeof b);
}

static void measured_ladder(const cJSON *res, FILE *md) {
  const cJSON *r;
  char fp[32];
  int reps = 0;
  cJSON_ArrayForEach(r, rungs_of(res)) {
    int n = cJSON_GetArraySize(cJSON_GetObjectItem(r, "runs"));
    if (n > reps) reps = n;
  }
  fprintf(md, "## Ladder at `%s` scale (measured on %s, %d repetition%s, medians)\n\n"
              "Scales: `small` = 128×128 images, the ResNet-101 U-Net's 101 layers at a quarter of its widths "
              "(%s parameters); `tiny` = 32×32, widths / 16; `full` = 512×512, ResNet-101's widths (%s parameters, "
              "planned only). Batch 8 per rank. Each rank is one CPU process of one thread: a stand-in for a card.\n\n"
              "| step | ranks × threads | global batch | step s median (min–max of reps) | samples/s | speedup vs 1 rank "
              "| scaling efficiency | busy share min / mean | comm s/step | exposed s/step | comm hidden | idle s/step | "
              "loss first → last | other processes |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
          vl_rep_str(res, "run_scale"), vl_rep_str(cJSON_GetObjectItem(res, "env"), "device"), reps, reps == 1 ? "" : "s",
          run_params(res), vl_rep_count(vl_rep_num(vl_rep_plan(cJSON_GetArrayItem(rungs_of(res), 0)), "params_total"), fp,
                                        sizeof fp));
  bool over = false;
  double foreign_max = 0;
  cJSON_ArrayForEach(r, rungs_of(res)) {
    const cJSON *r0 = vl_rep_run0(r);
    if (!r0) continue;
    const char *why = first_str(r, "not_measured");
    if (why) {
      fprintf(md, "| %s | not measured here: %s |||||||||||||\n", name_of(r), why);
      continue;
    }
    if (!cJSON_GetObjectItem(r0, "step_time")) {
      fprintf(md, "| %s | failed: %s |||||||||||||\n", name_of(r), vl_rep_str(r0, "error"));
      continue;
    }
    bool ov = cJSON_IsTrue(cJSON_GetObjectItem(r0, "oversubscribed"));
    over |= ov;
    double med, lo, hi, l0, l1;
    step_range(r, &med, &lo, &hi);
    loss_ends(r, &l0, &l1);
    double fg = med_run(r, "foreign_cpu_share");
    if (!isnan(fg) && fg > foreign_max) foreign_max = fg;
    fprintf(md, "| %s | %s × %s%s | %s | %s (%s–%s) | %s | %s | %s | %s / %s | %s | %s | %s | %s | %s → %s | %s%s |\n",
            name_of(r), vl_rep_fmt("%g", vl_rep_num(r0, "ranks")), vl_rep_fmt("%g", vl_rep_num(r0, "threads")),
            ov ? " **oversubscribed**" : "", vl_rep_fmt("%g", vl_rep_num(r0, "global_batch")), vl_rep_fmt("%.3f", med),
            vl_rep_fmt("%.3f", lo), vl_rep_fmt("%.3f", hi), vl_rep_fmt("%.1f", med_run(r, "samples_per_s")),
            vl_rep_fmt("%.2f×", med_run(r, "speedup")), vl_rep_fmt("%.0f%%", 100 * med_run(r, "scaling_efficiency")),
            vl_rep_fmt("%.0f%%", 100 * med_run(r, "busy_share_min")), vl_rep_fmt("%.0f%%", 100 * med_run(r, "busy_share_mean")),
            vl_rep_fmt("%.4f", med_run(r, "comm_s_per_step")), vl_rep_fmt("%.4f", med_run(r, "exposed_s_per_step")),
            vl_rep_fmt("%.0f%%", 100 * med_run(r, "hidden_comm_share")), vl_rep_fmt("%.4f", med_run(r, "idle_s_per_step")),
            vl_rep_fmt("%.3f", l0), vl_rep_fmt("%.3f", l1),
            vl_rep_fmt("%.0f%%", 100 * fg), reruns_of(r));
  }
  fprintf(md, "\nEvery repetition of a rung is one `mpirun` job; repetitions ran in interleaved order across the "
              "rungs and each 2-rank run's speedup is taken against the 1-rank run of the same repetition. A "
              "step's time is the slowest rank's; samples/s = global batch × timed steps / the slowest rank's wall "
              "time (data loading included). Busy share = a rank's compute seconds (forward, backward, update) / its "
              "wall seconds: what the article calls utilisation. Comm = the wrapper's seconds from each collective's "
              "start to its completion, summed (buckets in flight together each count theirs); exposed = the time a "
              "rank was blocked waiting for collectives; comm hidden (DDP rungs) = 1 − exposed / the exposed time "
              "of the DDP rung without overlap in the same repetition, where every allreduce starts after backward "
              "and nothing is hidden. Other processes = the share of the machine's cores that processes other than "
              "the job used while it ran (median of the repetitions); a job during which they used more than the "
              "`disturbed_share` setting (%s) is measured again, at most `disturbed_retries` (%s) times; a "
              "repetition still disturbed after that is kept in the results file but left out of the medians "
              "(speedups, busy shares, step times) when the rung has undisturbed ones. "
              "Idle = DataParallel's replicas waiting for rank 0. Ranks are processes of one thread each on this "
              "machine's %s cores: they share its memory bandwidth and caches, which separate GPUs do not. Batch "
              "norm is per rank (no SyncBatchNorm): each rank normalises over its own per-rank batch, so 2 ranks "
              "× b images are not one batch of 2b. The loss is the mean over the ranks' shards; DDP and ZeRO-1 see the same "
              "images (DistributedSampler: rank r takes every world-th sample of the epoch's order) and follow the "
              "same trajectory; DataParallel's rank 0 cuts the global batch in halves instead, so its ranks "
              "normalise over other images and its loss differs a little.%s\n\n",
          setting_str(res, "disturbed_share"), setting_str(res, "disturbed_retries"),
          vl_rep_fmt("%g", vl_rep_num(cJSON_GetObjectItem(res, "env"), "cores")),
          over ? " **Oversubscribed** rungs ran more threads than cores (asked for with `oversubscribe=true`): "
                 "their times measure time-sharing, not scaling." : "");
  if (foreign_max > 0.1)
    fprintf(md, "**The machine was shared**: other processes used up to %s of its cores during the repetitions "
                "the medians keep. A 2-rank rung needs every core and a 1-rank rung one, so the speedups above are "
                "pessimistic.\n\n",
            vl_rep_fmt("%.0f%%", 100 * foreign_max));
}

static void per_rank(const cJSON *res, FILE *md) {
  fprintf(md, "### Per rank (first repetition, measured on CPU ranks)\n\n"
              "| step | rank | busy | compute s/step | comm s/step | exposed s/step | idle s/step |\n"
              "|---|---|---|---|---|---|---|\n");
  const cJSON *r, *pr;
  cJSON_ArrayForEach(r, rungs_of(res)) {
    cJSON_ArrayForEach(pr, cJSON_GetObjectItem(vl_rep_run0(r), "per_rank")) {
      fprintf(md, "| %s | %s | %s | %s | %s | %s | %s |\n", name_of(r),
              vl_rep_fmt("%g", vl_rep_num(pr, "rank")), vl_rep_fmt("%.0f%%", 100 * vl_rep_num(pr, "busy_share")),
              vl_rep_fmt("%.4f", vl_rep_num(pr, "compute_s_per_step")), vl_rep_fmt("%.4f", vl_rep_num(pr, "comm_s_per_step")),
              vl_rep_fmt("%.4f", vl_rep_num(pr, "exposed_s_per_step")), vl_rep_fmt("%.4f", vl_rep_num(pr, "idle_s_per_step")));
    }
  }
  fprintf(md, "\n");
}

/* The engine's own check, for the appendix: each rank's measured memory by category against its plan. */
static void per_rank_memory(const cJSON *res, FILE *md) {
  fprintf(md, "### Memory per rank: planned = measured (first repetition, MB, `%s` scale on the CPU backend)\n\n"
              "| step | rank | params | grads | optim | acts | comm | measured peak | planned peak | plan = measured |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n", vl_rep_str(res, "run_scale"));
  const cJSON *r, *pr;
  cJSON_ArrayForEach(r, rungs_of(res)) {
    cJSON_ArrayForEach(pr, cJSON_GetObjectItem(vl_rep_run0(r), "per_rank")) {
      const cJSON *mc = cJSON_GetObjectItem(pr, "measured_by_category");
      fprintf(md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name_of(r), vl_rep_fmt("%g", vl_rep_num(pr, "rank")),
              vl_rep_fmt("%.1f", vl_rep_num(mc, "params") / 1e6), vl_rep_fmt("%.1f", vl_rep_num(mc, "grads") / 1e6),
              vl_rep_fmt("%.1f", vl_rep_num(mc, "optim") / 1e6), vl_rep_fmt("%.1f", vl_rep_num(mc, "acts") / 1e6),
              vl_rep_fmt("%.1f", vl_rep_num(mc, "comm") / 1e6), vl_rep_fmt("%.1f", vl_rep_num(pr, "measured_peak_bytes") / 1e6),
              vl_rep_fmt("%.1f", vl_rep_num(pr, "planned_peak_bytes") / 1e6),
              vl_rep_yes_no(cJSON_GetObjectItem(pr, "plan_matches_measured")));
    }
  }
  fprintf(md, "\nCategories at the rank's peak; planned peak = the planner's for this rank of this world with "
              "this machine's workspace rules (the same allocation sequence through the same arena).\n\n");
}

/* ---- bucket sweep, collectives --------------------------------------------------------------- */
static void bucket_sweep(const cJSON *res, FILE *md) {
  const cJSON *o = cJSON_GetObjectItem(res, "bucket_sweep"), *p;
  if (!cJSON_IsObject(o)) return;
  fprintf(md, "## Bucket cap (one run per cap on rung `%s`, measured)\n\n"
              "| bucket cap | buckets | samples/s | step s | comm s/step | exposed s/step | comm hidden | busy min | "
              "other processes |\n|---|---|---|---|---|---|---|---|---|\n", vl_rep_str(o, "rung"));
  double best = NAN, best_cap = NAN;
  int quiet = 0;
  cJSON_ArrayForEach(p, cJSON_GetObjectItem(o, "points")) quiet += !cJSON_IsTrue(cJSON_GetObjectItem(p, "disturbed"));
  cJSON_ArrayForEach(p, cJSON_GetObjectItem(o, "points")) {
    double sps = vl_rep_num(p, "samples_per_s");
    bool counts = !quiet || !cJSON_IsTrue(cJSON_GetObjectItem(p, "disturbed"));
    if (counts && !isnan(sps) && (isnan(best) || sps > best)) { best = sps; best_cap = vl_rep_num(p, "bucket_cap"); }
    fprintf(md, "| %s MiB | %s | %s | %s | %s | %s | %s | %s | %s |\n", vl_rep_fmt("%g", vl_rep_num(p, "bucket_cap") / 1048576),
            vl_rep_fmt("%g", vl_rep_num(p, "n_buckets")), vl_rep_fmt("%.1f", sps),
            vl_rep_fmt("%.3f", vl_rep_num(p, "step_seconds")), vl_rep_fmt("%.4f", vl_rep_num(p, "comm_s_per_step")),
            vl_rep_fmt("%.4f", vl_rep_num(p, "exposed_s_per_step")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_num(p, "hidden_comm_share")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_num(p, "busy_share_min")),
            vl_rep_fmt("%.0f%%", 100 * vl_rep_num(p, "foreign_cpu_share")));
  }
  fprintf(md, "\nThe rung's bucket_cap is %s MiB; the fastest undisturbed cap of this sweep was %s MiB. At the run scale the "
              "U-Net's gradients are a few MB, so PyTorch's 25 MiB makes one bucket after the 1 MiB first one, "
              "ready only when backward ends: nothing can overlap. Smaller buckets start allreduces during "
              "backward; too small ones pay a latency each. The sweep is one run per cap (noisy on a shared "
              "machine); `bucket_cap` is a knob.\n\n",
          vl_rep_fmt("%g", vl_rep_num(o, "rung_bucket_cap") / 1048576), vl_rep_fmt("%g", best_cap / 1048576));
}

static void coll_rows(FILE *md, const cJSON *c) {
  const cJSON *row;
  fprintf(md, "| size (B) | count | type | redop | time (us) | algbw (GB/s) | busbw (GB/s) | #wrong | in-place time (us) "
              "| algbw | busbw | #wrong |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  cJSON_ArrayForEach(row, cJSON_GetObjectItem(c, "rows")) {
    const cJSON *o = cJSON_GetObjectItem(row, "oop"), *i = cJSON_GetObjectItem(row, "ip");
    fprintf(md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", vl_rep_fmt("%.0f", vl_rep_num(row, "bytes")),
            vl_rep_fmt("%.0f", vl_rep_num(row, "count")), vl_rep_str(row, "type"), vl_rep_str(row, "redop"),
            vl_rep_fmt("%.1f", vl_rep_num(o, "time_us")), vl_rep_fmt("%.2f", vl_rep_num(o, "algbw_gbs")),
            vl_rep_fmt("%.2f", vl_rep_num(o, "busbw_gbs")), vl_rep_fmt("%.0f", vl_rep_num(o, "wrong")),
            vl_rep_fmt("%.1f", vl_rep_num(i, "time_us")), vl_rep_fmt("%.2f", vl_rep_num(i, "algbw_gbs")),
            vl_rep_fmt("%.2f", vl_rep_num(i, "busbw_gbs")), vl_rep_fmt("%.0f", vl_rep_num(i, "wrong")));
  }
}

static void collectives(const cJSON *res, FILE *md) {
  const cJSON *arr = cJSON_GetObjectItem(res, "collectives"), *c;
  if (!cJSON_IsArray(arr)) return;
  fprintf(md, "### Collective bandwidth (measured here: MPI over shared memory)\n\n"
              "`vramlab bench allreduce|reduce_scatter|allgather --ranks N` under mpirun, the nccl-tests table: "
              "algbw = bytes / time, busbw = algbw × 2(n−1)/n (allreduce) or (n−1)/n (reduce-scatter, allgather); "
              "values chosen so the exact result is known (#wrong counts the elements that differ).\n\n");
  cJSON_ArrayForEach(c, arr) {
    fprintf(md, "#### %s on %s ranks (%s, %s)\n\n", vl_rep_str(c, "collective"), vl_rep_fmt("%g", vl_rep_num(c, "ranks")),
            vl_rep_str(c, "backend"), vl_rep_str(c, "dtype"));
    if (cJSON_GetObjectItem(c, "error")) {
      fprintf(md, "%s\n\n", vl_rep_str(c, "error"));
      continue;
    }
    coll_rows(md, c);
    fprintf(md, "\nAverage busbw: %s GB/s.\n\n", vl_rep_fmt("%.2f", vl_rep_num(c, "avg_busbw_gbs")));
  }
}

/* ---- the modeled section ------------------------------------------------------------------------ */
static void modeled_section(const cJSON *res, FILE *md) {
  const cJSON *r, *ml = cJSON_GetObjectItem(vl_rep_plan(cJSON_GetArrayItem(rungs_of(res), 0)), "modeled_links");
  const cJSON *pc = cJSON_GetObjectItem(ml, "pcie"), *nv = cJSON_GetObjectItem(ml, "nvlink");
  fprintf(md, "## Modeled time at full scale (labelled modeled: no GPU here)\n\n"
              "Step time on n cards = compute + exposed communication, per card at the same batch (so the "
              "speedup in samples/s is n × compute / step). Compute = the step's planned FLOPs (recomputed ones "
              "included) / (peak × efficiency). Ring allreduce of B bytes: 2(n−1)/n · B / busbw + 2(n−1) · latency "
              "per bucket; DDP with overlap hides every bucket but the last reduced one behind backward (%s of "
              "the compute) as long as they fit in it, without overlap none; ZeRO-1 reduce-scatters the padded "
              "gradients and all-gathers the parameters after backward, both exposed; DataParallel scatters the "
              "inputs from rank 0, reduces the gradients to it and broadcasts the parameters, all exposed (a lower "
              "bound: no output gather, no Python threads). Presets (settings in `ladder.ini`): **PCIe without "
              "peer-to-peer (RTX 4090 class)**: %s TFLOP/s peak (NVIDIA's Ada whitepaper: the 4090's FP32 and "
              "dense TF32 rate), busbw %s GB/s, %s us per ring step; **NVLink (H100 SXM class)**: %s TFLOP/s "
              "(dense TF32, H100 datasheet), busbw %s GB/s, %s us. The efficiency (share of the peak a step "
              "reaches, %s), the bus bandwidths and the latencies are assumptions, not measurements: set them from "
              "your own profile and all_reduce_perf. The step FLOPs are fp32 (TF32 on the tensor cores); an AMP "
              "step needs the fp16 rates.\n\n",
          vl_rep_fmt("%.2f", vl_rep_num(ml, "bwd_share")), vl_rep_fmt("%g", vl_rep_num(pc, "tflops")),
          vl_rep_fmt("%g", vl_rep_num(pc, "busbw_gbs")), vl_rep_fmt("%g", vl_rep_num(pc, "latency_us")),
          vl_rep_fmt("%g", vl_rep_num(nv, "tflops")), vl_rep_fmt("%g", vl_rep_num(nv, "busbw_gbs")),
          vl_rep_fmt("%g", vl_rep_num(nv, "latency_us")), vl_rep_fmt("%g", vl_rep_num(pc, "efficiency")));
  fprintf(md, "| step | cards | PCIe: step ms | compute ms | comm ms | exposed ms | speedup | busy | NVLink: step ms | "
              "exposed ms | speedup | busy |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  cJSON_ArrayForEach(r, rungs_of(res)) {
    for (int i = 0; i < VL_MG_CARDS_N; i++) {
      const cJSON *e = card_entry(r, vl_mg_cards[i]);
      if (!e || (vl_mg_cards[i] == 1 && strcmp(mode_of(r), "single"))) continue; /* one card: the single rung's */
      fprintf(md, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name_of(r), vl_mg_cards[i],
              vl_rep_fmt("%.1f", 1e3 * modeled(e, "pcie", "step_s")), vl_rep_fmt("%.1f", 1e3 * modeled(e, "pcie", "compute_s")),
              vl_rep_fmt("%.1f", 1e3 * modeled(e, "pcie", "comm_s")), vl_rep_fmt("%.1f", 1e3 * modeled(e, "pcie", "exposed_s")),
              vl_rep_fmt("%.2f×", modeled(e, "pcie", "speedup")), vl_rep_fmt("%.0f%%", 100 * modeled(e, "pcie", "busy")),
              vl_rep_fmt("%.1f", 1e3 * modeled(e, "nvlink", "step_s")),
              vl_rep_fmt("%.2f", 1e3 * modeled(e, "nvlink", "exposed_s")), vl_rep_fmt("%.2f×", modeled(e, "nvlink", "speedup")),
              vl_rep_fmt("%.0f%%", 100 * modeled(e, "nvlink", "busy")));
    }
  }
  fprintf(md, "\n");
}

/* ---- plots ------------------------------------------------------------------------------------- */
/* The min and max of a run key over a rung's runs (NaN when none has it). */
static void run_range(const cJSON *rung, const char *key, double *lo, double *hi) {
  const cJSON *run;
  *lo = *hi = NAN;
  cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs")) {
    double x = vl_rep_num(run, key);
    if (isnan(x)) continue;
    if (isnan(*lo) || x < *lo) *lo = x;
    if (isnan(*hi) || x > *hi) *hi = x;
  }
}

/* Two panels: left, what was measured here (2 CPU ranks, each rung's median with the min–max
 * of its repetitions); right, the time model's lines at full scale against cards. The ideal
 * is drawn first, wide and light, so a modeled line on it stays visible. */
static void plot_speedup(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  vl_rep_dat d;
  char s[8000], left[1500] = "", right[5000] = "", xt[1200] = "", nm[VL_REP_GP_MAX + 1];
  vl_err why;
  if (vl_rep_dat_open(&d)) { vl_rep_plot_missing(md, dir, "speedup", "out of memory"); return; }
  /* block 0: the article's table (004) */
  fprintf(d.f, "# article (004)\n1 1\n2 1.9\n4 3.8\n\n\n");
  int blocks = 1;
  /* block 1: the measured rungs, x = their position */
  const cJSON *r, *last_ddp = NULL;
  int k = 0;
  cJSON_ArrayForEach(r, rungs_of(res)) {
    double x = vl_rep_num(vl_rep_run0(r), "ranks"), y = med_run(r, "speedup"), lo, hi;
    if (isnan(x) || isnan(y) || x < 2) continue;
    run_range(r, "speedup", &lo, &hi);
    k++;
    fprintf(d.f, "%d %.4f %.4f %.4f\n", k, y, isnan(lo) ? y : lo, isnan(hi) ? y : hi);
    vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), false, nm, sizeof nm);
    char one[160];
    snprintf(one, sizeof one, "%s'%s' %d", k > 1 ? ", " : "", nm, k);
    strncat(xt, one, sizeof xt - strlen(xt) - 1);
  }
  fprintf(d.f, "\n\n");
  int measured_block = blocks++;
  if (k)
    snprintf(left, sizeof left,
             "'speedup.dat' index %d using 1:2:3:4 with yerrorbars pt 7 ps 1.5 lw 2 lc rgb '#1f77b4' title "
             "'measured: median, min-max of the repetitions'",
             measured_block);
  /* the modeled lines */
  cJSON_ArrayForEach(r, rungs_of(res)) if (!strcmp(mode_of(r), "ddp")) last_ddp = r;
  int line = 0;
  cJSON_ArrayForEach(r, rungs_of(res)) {
    if (!card_entry(r, 2)) continue;
    bool nvl = r == last_ddp;
    int pts = 0;
    double far = 0;
    for (int i = 0; i < VL_MG_CARDS_N; i++) {
      const cJSON *e = card_entry(r, vl_mg_cards[i]);
      double a = modeled(e, "pcie", "speedup"), b = modeled(e, "nvlink", "speedup");
      if (isnan(a) || isnan(b)) continue;
      fprintf(d.f, "%d %.4f %.4f\n", vl_mg_cards[i], a, b);
      if (fabs(a / vl_mg_cards[i] - 1) > far) far = fabs(a / vl_mg_cards[i] - 1);
      pts++;
    }
    fprintf(d.f, "\n\n");
    if (!pts) { blocks++; continue; }
    vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), false, nm, sizeof nm);
    static const char *const col[] = {"#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
    char one[600];
    snprintf(one, sizeof one, ", 'speedup.dat' index %d using 1:2 with linespoints lw 2 pt %d lc rgb '%s' title "
             "'modeled %s: PCIe, RTX 4090%s'",
             blocks, 5 + 2 * (line % 5), col[line % 5], nm, far < 0.01 ? " (on the ideal line)" : "");
    strncat(right, one, sizeof right - strlen(right) - 1);
    if (nvl) {
      snprintf(one, sizeof one, ", '' index %d using 1:3 with linespoints lw 2 dt 3 pt %d lc rgb '%s' title "
               "'modeled %s: NVLink, H100'", blocks, 4 + 2 * (line % 5), col[line % 5], nm);
      strncat(right, one, sizeof right - strlen(right) - 1);
    }
    line++;
    blocks++;
  }
  if (vl_rep_dat_commit(&d, dir, "speedup.dat", &why)) { vl_rep_plot_missing(md, dir, "speedup", why.msg); return; }
  int o = snprintf(s, sizeof s,
                   "set terminal png size 1400,620 noenhanced\nset output vl_png\n"
                   "set multiplot layout 1,2 title 'Speedup: samples/s against 1 card at the same per-card batch'\n"
                   "set grid\nset ylabel 'speedup'\n");
  if (k && o > 0 && (size_t)o < sizeof s)
    o += snprintf(s + o, sizeof s - (size_t)o,
                  "set title 'measured here: 2 CPU ranks of one thread (stand-ins for 2 cards), run scale'\n"
                  "set xlabel 'rung (2 ranks)'\nset xrange [0.5:%d.5]\nset xtics (%s)\nset yrange [1:2.1]\n"
                  "set key left bottom\n"
                  "plot 2 with lines lw 6 lc rgb '#dddddd' title 'ideal (2)', "
                  "1.9 with lines dt 2 lw 2 lc rgb 'black' title 'article (004): 1.9x', %s\n",
                  k, xt, left);
  else if (o > 0 && (size_t)o < sizeof s)
    o += snprintf(s + o, sizeof s - (size_t)o, "set title 'measured here: none'\nunset key\nplot [0:1] 0 notitle\n");
  if (o > 0 && (size_t)o < sizeof s)
    snprintf(s + o, sizeof s - (size_t)o,
             "set title 'modeled at full scale (assumed rates, see the modeled section)'\n"
             "set xlabel 'cards'\nset xrange [0.8:8.5]\nset yrange [0:8.5]\nset xtics (1, 2, 4, 8)\n"
             "set key right bottom\n"
             "plot x with lines lw 8 lc rgb '#dddddd' title 'ideal (= cards)', "
             "'speedup.dat' index 0 using 1:2 with points pt 9 ps 2 lc rgb 'black' title 'article (004): 1.9x, 3.8x'%s\n"
             "unset multiplot\n",
             right);
  vl_rep_plot(md, dir, case_id, gnuplot, "speedup", "speedup: measured on CPU ranks (left), modeled (right)", s);
}

/* Two panels: the peak per card on an axis around its values (the change ZeRO-1 makes is a
 * few percent of it), and weights + gradients + optimizer state per card from 0 (where
 * sharding shows whole). */
static void plot_memory(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  vl_rep_dat d;
  char s[6000], pk_plot[2500] = "", ms_plot[2500] = "", nm[VL_REP_GP_MAX + 1];
  vl_err why;
  if (vl_rep_dat_open(&d)) { vl_rep_plot_missing(md, dir, "mem_per_card", "out of memory"); return; }
  int blocks = 0;
  double lo = NAN, hi = NAN;
  const cJSON *r;
  cJSON_ArrayForEach(r, rungs_of(res)) {
    if (!card_entry(r, 2)) continue;
    vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), false, nm, sizeof nm);
    fprintf(d.f, "# %s\n", nm);
    for (int i = 0; i < VL_MG_CARDS_N; i++) {
      const cJSON *e = card_entry(r, vl_mg_cards[i]);
      double pk = vl_rep_num(e, "peak_bytes"), ms = vl_rep_num(e, "model_state_bytes");
      if (isnan(pk) || isnan(ms)) continue;
      fprintf(d.f, "%d %.4f %.4f\n", vl_mg_cards[i], pk / G, ms / G);
      if (isnan(lo) || pk / G < lo) lo = pk / G;
      if (isnan(hi) || pk / G > hi) hi = pk / G;
    }
    fprintf(d.f, "\n\n");
    char one[400];
    /* earlier lines wider: rungs with equal memory (dp and ddp) stay visible under each other */
    double lw = blocks < 3 ? 6 - 1.5 * blocks : 2;
    snprintf(one, sizeof one, "%s'mem_per_card.dat' index %d using 1:2 with linespoints lw %.1f pt %d title '%s (%s)'",
             blocks ? ", " : "", blocks, lw, 5 + 2 * (blocks % 5), nm, mode_of(r));
    strncat(pk_plot, one, sizeof pk_plot - strlen(pk_plot) - 1);
    snprintf(one, sizeof one, "%s'mem_per_card.dat' index %d using 1:3 with linespoints lw %.1f pt %d title '%s (%s)'",
             blocks ? ", " : "", blocks, lw, 5 + 2 * (blocks % 5), nm, mode_of(r));
    strncat(ms_plot, one, sizeof ms_plot - strlen(ms_plot) - 1);
    blocks++;
  }
  if (vl_rep_dat_commit(&d, dir, "mem_per_card.dat", &why)) {
    vl_rep_plot_missing(md, dir, "mem_per_card", why.msg);
    return;
  }
  if (!blocks) { vl_rep_plot_missing(md, dir, "mem_per_card", "the results hold no per-card plans"); return; }
  double pad = 0.1 * (hi - lo) + 0.05, y0 = floor(10 * (lo - pad)) / 10, y1 = ceil(10 * (hi + pad)) / 10;
  snprintf(s, sizeof s,
           "set terminal png size 1400,600 noenhanced\nset output vl_png\n"
           "set multiplot layout 1,2 title 'Memory per card vs cards (planned, 512x512, batch 8 per card): DDP keeps a "
           "full copy, ZeRO-1 shards the optimizer'\n"
           "set xlabel 'cards'\nset grid\nset logscale x 2\nset xrange [0.9:9]\nset xtics (1, 2, 4, 8)\n"
           "set title 'peak per card (axis from %.1f GB, not 0)'\nset ylabel 'GB per card'\nset yrange [%.1f:%.1f]\n"
           "set key left bottom\nplot %s\n"
           "set title 'weights + gradients + optimizer state per card (axis from 0)'\nset yrange [0:*]\n"
           "set key left bottom\nplot %s\nunset multiplot\n",
           y0, y0, y1, pk_plot, ms_plot);
  vl_rep_plot(md, dir, case_id, gnuplot, "mem_per_card", "memory per card vs cards", s);
}

static void plot_busbw(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  const cJSON *arr = cJSON_GetObjectItem(res, "collectives"), *c, *row;
  if (!cJSON_IsArray(arr)) return;
  vl_rep_dat d;
  char s[4096], plot[2000] = "", nm[VL_REP_GP_MAX + 1];
  vl_err why;
  if (vl_rep_dat_open(&d)) { vl_rep_plot_missing(md, dir, "busbw", "out of memory"); return; }
  int blocks = 0;
  cJSON_ArrayForEach(c, arr) {
    int pts = 0;
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(c, "rows")) {
      double b = vl_rep_num(row, "bytes"), bw = vl_rep_num(cJSON_GetObjectItem(row, "oop"), "busbw_gbs");
      if (isnan(b) || isnan(bw) || b <= 0) continue;
      fprintf(d.f, "%.0f %.4f\n", b, bw);
      pts++;
    }
    if (!pts) continue;
    fprintf(d.f, "\n\n");
    vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(c, "collective")), false, nm, sizeof nm);
    char one[300];
    snprintf(one, sizeof one, "%s'busbw.dat' index %d using 1:2 with linespoints lw 2 title '%s'", blocks ? ", " : "",
             blocks, nm);
    strncat(plot, one, sizeof plot - strlen(plot) - 1);
    blocks++;
  }
  if (vl_rep_dat_commit(&d, dir, "busbw.dat", &why)) { vl_rep_plot_missing(md, dir, "busbw", why.msg); return; }
  if (!blocks) { vl_rep_plot_missing(md, dir, "busbw", "the collective benchmark gave no rows"); return; }
  snprintf(s, sizeof s,
           "set terminal png size 900,480 noenhanced\nset output vl_png\n"
           "set title 'Bus bandwidth vs size (out of place, measured here over MPI)'\n"
           "set xlabel 'bytes'\nset ylabel 'busbw GB/s'\nset logscale x 2\nset format x '%%.0s%%cB'\nset grid\nset key left top\nplot %s\n", plot);
  vl_rep_plot(md, dir, case_id, gnuplot, "busbw", "busbw vs size", s);
}

static void plot_loss(const cJSON *res, const char *dir, FILE *md, const char *case_id, bool gnuplot) {
  vl_rep_dat d;
  char s[4096], plot[3000] = "", nm[VL_REP_GP_MAX + 1];
  vl_err why;
  if (vl_rep_dat_open(&d)) { vl_rep_plot_missing(md, dir, "loss", "out of memory"); return; }
  int blocks = 0;
  const cJSON *r, *e;
  cJSON_ArrayForEach(r, rungs_of(res)) {
    const cJSON *l = cJSON_GetObjectItem(vl_rep_run0(r), "loss");
    int valid = 0;
    cJSON_ArrayForEach(e, l) valid += !isnan(vl_rep_numv(e));
    if (!valid) continue;
    int i = 0;
    cJSON_ArrayForEach(e, l) {
      i++;
      if (!isnan(vl_rep_numv(e))) fprintf(d.f, "%d %.5f\n", i, vl_rep_numv(e));
    }
    fprintf(d.f, "\n\n");
    vl_rep_gp_str(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), false, nm, sizeof nm);
    char one[300];
    snprintf(one, sizeof one, "%s'loss.dat' index %d using 1:2 with lines lw 2 title '%s'", blocks ? ", " : "", blocks, nm);
    strncat(plot, one, sizeof plot - strlen(plot) - 1);
    blocks++;
  }
  if (vl_rep_dat_commit(&d, dir, "loss.dat", &why)) { vl_rep_plot_missing(md, dir, "loss", why.msg); return; }
  if (!blocks) return;
  snprintf(s, sizeof s,
           "set terminal png size 900,480 noenhanced\nset output vl_png\n"
           "set title 'Training loss per step (first repetition; the mean over ranks of each rank''s shard)'\n"
           "set xlabel 'step (warm-up included)'\nset ylabel 'loss'\nset grid\nset key right top\nplot %s\n", plot);
  vl_rep_plot(md, dir, case_id, gnuplot, "loss", "loss per step", s);
}

void vl_mg_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot) {
  per_card(res, md);
  planned_ladder(res, md);
  if (any_run(res, "step_time")) {
    measured_ladder(res, md);
    per_rank(res, md);
  } else if (any_run(res, "not_measured")) {
    measured_ladder(res, md);
  } else {
    fprintf(md, "## Measured ladder\n\nNot measured here: this results file holds plans only.\n\n");
  }
  bucket_sweep(res, md);
  modeled_section(res, md);
  fprintf(md, "## Plots\n\n");
  plot_speedup(res, dir, md, case_id, gnuplot);
  plot_memory(res, dir, md, case_id, gnuplot);
  plot_loss(res, dir, md, case_id, gnuplot);
  char s[4096];
  vl_err why;
  if (vl_rep_mem_by_category(res, dir, "Peak memory by category per rung (planned per card, 512x512, rank 0)", s,
                             sizeof s, &why))
    vl_rep_plot_missing(md, dir, "mem_by_category", why.msg);
  else
    vl_rep_plot(md, dir, case_id, gnuplot, "mem_by_category", "memory by category", s);
  /* the engine's own validation: planned = measured per rank, the collectives' bandwidth */
  if (any_run(res, "step_time")) per_rank_memory(res, appendix);
  collectives(res, appendix);
  plot_busbw(res, dir, appendix, case_id, gnuplot);
}
