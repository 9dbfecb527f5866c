/* llm-lora: Mistral-7B fine-tuning memory on a 24 GB card (docs/cases.md §1).
 * Memory, FLOPs, fit, largest batch and OOM rate come from the plan backend at the scale
 * asked (full = the article's 7B); step time, tokens/s and loss from a real run at the
 * scale this device can run (run.c). The scaffolding (plan, search, timed loop, OOM triage,
 * planned-equals-measured) is the engine's (vramlab/run.h); knobs map to a Mistral config
 * in config.c. This file holds the plan, the check and the case itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"
#include "llm_torch.h"
#include "datasets/dialogue.h"
#include "vramlab/mimic.h"

/* ---- planning ---------------------------------------------------------------------------- */
/* Longest padded length that fits for batch B (0 if none). */
static int64_t max_len(const vl_llm_rung *r, int64_t B) {
  int64_t lo = 1, hi = r->model.mc.seq;
  vl_step_spec s = vl_llm_step_spec(r, B, hi);
  if (vl_run_fits(&s, r->card.cap)) return hi;
  if (s = vl_llm_step_spec(r, B, 1), !vl_run_fits(&s, r->card.cap)) return 0;
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) / 2;
    s = vl_llm_step_spec(r, B, mid);
    if (vl_run_fits(&s, r->card.cap)) lo = mid; else hi = mid;
  }
  return lo;
}

/* OOM rate over variable-length batches: a step fails when its padded length exceeds the
 * longest that fits at this batch size. */
static void oom_rate_json(const vl_llm_rung *r, int64_t B, cJSON *out) {
  int64_t tmax = max_len(r, B);
  vl_dialogue_gen g;
  vl_dialogue_init(&g, r->model.mc.vocab, r->model.mc.seq, (uint64_t)r->seed + 17);
  long oom = 0;
  for (long i = 0; i < r->oom_batches; i++) {
    int64_t tb = 0;
    for (int64_t b = 0; b < B; b++) { int64_t l = vl_dialogue_len(&g); if (l > tb) tb = l; }
    oom += tb > tmax;
  }
  cJSON_AddNumberToObject(out, "oom_rate", (double)oom / (double)r->oom_batches);
  cJSON_AddNumberToObject(out, "max_len_fit", (double)tmax);
  cJSON_AddNumberToObject(out, "oom_batches", (double)r->oom_batches);
}

/* LLaMA-2-13B (000 §1.3's 48 GB row): Meta's config (40 layers, hidden 5120, SwiGLU 13824,
 * 40 heads without GQA, vocabulary 32000) at the rung's sequence length. */
static vl_mistral_cfg llama2_13b(int64_t seq) {
  return (vl_mistral_cfg){.vocab = 32000, .dim = 5120, .n_layers = 40, .n_heads = 40, .n_kv_heads = 40,
                          .head_dim = 128, .ffn = 13824, .seq = seq, .rope_theta = 10000.0f, .norm_eps = 1e-5f};
}

/* The largest batch of the rung's training setup on LLaMA-2-13B under 92% of a 48 GiB card
 * (RTX A6000; the same CUDA context outside the cap): 000 §1.3 and §2.1's 13B on 48 GB. */
static int64_t max_batch_13b_48gb(const vl_llm_rung *r) {
  vl_llm_rung q = *r;
  q.model.mc = llama2_13b(r->model.mc.seq);
  q.card.card = (size_t)48 << 30;
  q.card.cap_fraction = 0.92;
  q.card.cap = (size_t)((double)q.card.card * 0.92);
  if (q.card.cap > q.card.card - q.card.context) q.card.cap = q.card.card - q.card.context;
  return vl_llm_max_batch(&q);
}

/* the mimic of llm_lora_peer.py's step on CUDA (vl_case_pytorch_json's run) */
static vl_status mimic_cuda(const void *cfg, int64_t batch, uint64_t capacity, vl_mimic_result *r, char *why,
                            size_t whyn) {
  const vl_llm_rung *q = cfg;
  vl_mimic_llm_cfg c = vl_llm_mimic_cfg(q, batch, q->model.mc.seq, VL_MIMIC_CUDA);
  c.capacity = capacity;
  return vl_mimic_llm(&c, r, NULL, NULL, why, whyn);
}

static vl_status llm_plan(vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out) {
  vl_llm_rung r;
  VL_TRY(vl_llm_parse_rung(env, scale, k, &r));
  double t0 = vl_now();
  int64_t mb = vl_llm_max_batch(&r);
  if (r.batch == 0) r.batch = mb > 0 ? mb : 1;
  double t_search = vl_now() - t0;
  int64_t B = r.batch, T = r.model.mc.seq;
  vl_step_spec spec = vl_llm_step_spec(&r, B, T);
  vl_plan_result p;
  double t1 = vl_now();
  vl_run_plan(&spec, VL_NO_CAP, VL_DEV_CUDA, true, &p);
  double t_plan = vl_now() - t1;
  if (p.status != VL_OK) {
    vl_status s = vl_case_fail(env, p.status, "planning failed: %s", p.err);
    vl_plan_result_free(&p);
    return s;
  }
  const size_t *at = p.mem.at_peak;
  vl_case_plan_json(out, scale, &p, B, r.accum);
  cJSON_AddNumberToObject(out, "seq", (double)T);
  cJSON_AddNumberToObject(out, "optim_bytes", (double)at[VL_MEM_OPTIM]);
  cJSON_AddNumberToObject(out, "grads_bytes", (double)at[VL_MEM_GRADS]);
  cJSON_AddNumberToObject(out, "optim_per_param",
                          p.params.trainable ? (double)at[VL_MEM_OPTIM] / (4.0 * (double)p.params.trainable) : 0);
  cJSON_AddNumberToObject(out, "bytes_moved_per_step", p.bytes_moved);
  cJSON_AddNumberToObject(out, "usable_fraction", (double)r.card.cap / (double)r.card.card);
  cJSON_AddNumberToObject(out, "frozen_fraction",
                          p.params.total ? 1.0 - (double)p.params.trainable / (double)p.params.total : 0);
  /* a full-size model at every scale: planned only where the plan is the article's */
  if (!strcmp(scale, "full")) cJSON_AddNumberToObject(out, "max_batch_13b_48gb", (double)max_batch_13b_48gb(&r));
  vl_case_fit_json(out, &r.card, vl_run_fits(&spec, r.card.cap), mb, t_plan, t_search);
  oom_rate_json(&r, B, out);
  vl_case_pytorch_json(out, mimic_cuda, &r, B, r.card.cap,
                       "transformers + PEFT + bitsandbytes + torch.autocast + AdamW/SGD/Adafactor on CUDA (mimic)");
  cJSON *timeline = cJSON_AddArrayToObject(out, "timeline");
  for (size_t i = 0; i < p.n_timeline; i++) {
    double pt[2] = {(double)p.timeline[i].seq, (double)p.timeline[i].bytes};
    cJSON_AddItemToArray(timeline, cJSON_CreateDoubleArray(pt, 2));
  }
  vl_plan_result_free(&p);
  /* The batch plot at the worst-case length, planned uncapped: batch_curve is the arena's
   * reserved extent (live bytes plus the holes below the high-water mark), what the cap
   * bounds; batch_curve_live the live bytes at the peak, which stay under the cap several
   * batches longer. Under the cap the best fit places blocks differently once the free tail
   * is smaller than the holes, so the fit test (max_batch, marked on the plot) can fail a
   * batch whose uncapped extent is still just under it. Every batch near max, else every few. */
  cJSON *curve = cJSON_AddArrayToObject(out, "batch_curve");
  cJSON *live = cJSON_AddArrayToObject(out, "batch_curve_live");
  int64_t top = mb + mb / 4 + 2 > 8 ? mb + mb / 4 + 2 : 8; /* past the cap crossing */
  for (int64_t b = 1; b <= top; b += (b + 1 >= mb - 2 && b < mb + 2) ? 1 : top / 64 + 1) {
    vl_plan_result q;
    vl_step_spec s = vl_llm_step_spec(&r, b, T);
    if (vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &q) != VL_OK) break; /* uncapped: a host failure */
    double pt[2] = {(double)b, (double)q.mem.reserved}, pl[2] = {(double)b, (double)q.mem.peak_total};
    cJSON_AddItemToArray(curve, cJSON_CreateDoubleArray(pt, 2));
    cJSON_AddItemToArray(live, cJSON_CreateDoubleArray(pl, 2));
  }
  return VL_OK;
}

/* Every knob of a rung and the setting (run_cap included), without planning. */
static vl_status llm_check(vl_case_env *env, const vl_knobs *k) {
  vl_llm_rung r;
  return vl_llm_parse_rung(env, env->scale, k, &r);
}

/* What plan and run write at the top level of a rung's plan or run. */
static const char *const metrics[] = {
    "params_total", "params_trainable", "batch", "accum", "effective_batch", "seq", "peak_bytes", "reserved_bytes",
    "weight_bytes", "optim_bytes", "grads_bytes", "acts_bytes", "optim_per_param", "flops_per_step",
    "flops_recompute", "bytes_moved_per_step", "card_bytes", "cap_bytes", "usable_fraction", "frozen_fraction", "fits", "max_batch", "max_batch_13b_48gb",
    "max_batch_at_search_limit", "cuda_context_bytes", "plan_seconds", "max_batch_search_seconds", "oom_rate",
    "max_len_fit", "oom_batches", "oom", "tokens_per_s", "sec_per_token", "model_flops_per_step", "flops_per_s",
    "skipped_steps", "loss_scale_end", "measured_peak_bytes", "planned_peak_bytes", "plan_matches_measured",
    /* the extra hook's PyTorch side by side (llm_torch.c), on the compared rungs' first runs */
    "peer_step_seconds", "speedup_vs_torch", "peer_peak_bytes", NULL};

static const char *const scales[] = {"tiny", "small", "full", NULL};

static vl_status llm_extra(vl_case_env *env, cJSON *res) {
  VL_TRY(vl_llm_peers(env, res));
  return vl_llm_full_scale(env, res, "full");
}

const vl_case vl_case_llm_lora = {
    .id = "llm-lora",
    .summary = "7B LLM fine-tuning memory on a 24 GB card: fp32 -> cap -> fp16 -> LoRA -> QLoRA -> Adafactor -> checkpointing",
    .knobs = vl_llm_knobs,
    .scales = scales,
    .metrics = metrics,
    .check = llm_check,
    .plan = llm_plan,
    .run = vl_llm_run,
    .resumable = true, /* --save-every / --resume (run.c) */
    .extra = llm_extra,
    .peer_config = vl_llm_peer_config,
    .method = "Memory, FLOPs, fit, largest batch and OOM rate are **planned at full scale** (the "
              "article's Mistral-7B and sequence length) by the plan backend, which runs the exact "
              "allocation sequence of a training step through the same arena algorithm as a real "
              "run, with a CUDA card's workspace rules. Step time, tokens/s and loss are measured "
              "by running each rung at the run scale; the baseline, lora and qlora rungs are then run side by "
              "side with the same step in PyTorch (Hugging Face Mistral, SDPA, PEFT; bitsandbytes for the NF4 "
              "base) when it is installed.",
    .report = vl_llm_lora_report,
};
