/* llm-lora: Mistral-7B fine-tuning memory on a 24 GB card (CASES.md §1).
 * Memory, FLOPs, fit, largest batch and OOM rate come from the plan backend at the scale
 * asked (full = the article's 7B); step time, tokens/s and loss from a real run at the
 * scale this device can run. The scaffolding (plan, search, timed loop, OOM triage,
 * planned-equals-measured) is the engine's (vramlab/run.h); this file maps knobs to a
 * Mistral config and dialogue batches, and adds its own metrics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "case.h"
#include "interrupt.h"
#include "datasets/dialogue.h"
#include "vramlab/mistral.h"

static const vl_knob_decl knobs[] = {
    {"compute", "fp32", "compute dtype: fp32, fp16 or bf16 (AMP with fp32 master weights)", VL_KNOB_RUNG},
    {"frozen", "fp32", "storage of the frozen base weights: fp32, fp16, bf16 or nf4", VL_KNOB_RUNG},
    {"lora_rank", "0", "LoRA rank; 0 = full fine-tune", VL_KNOB_RUNG},
    {"lora_alpha", "16", "LoRA alpha (scale alpha / rank)", VL_KNOB_RUNG},
    {"lora_targets", "qkvo", "linears LoRA adapts: qkvo or all", VL_KNOB_RUNG},
    {"optimizer", "adamw", "adamw, adafactor or sgd", VL_KNOB_RUNG},
    {"adafactor_beta1", "false", "Adafactor keeps a first moment", VL_KNOB_RUNG},
    {"checkpoint", "false", "gradient checkpointing per layer", VL_KNOB_RUNG},
    {"lr", "1e-4", "learning rate", VL_KNOB_RUNG},
    {"batch", "2", "micro-batch rows, or max (the largest that fits the cap at full scale)",
     VL_KNOB_RUNG | VL_KNOB_SETTING},
    {"accum", "1", "gradient accumulation micro-batches per step", VL_KNOB_RUNG},
    {"clip", "1.0", "gradient clipping by global norm (0: off)", VL_KNOB_RUNG},
    {"weight_decay", "0", "decoupled weight decay", VL_KNOB_RUNG},
    VL_CASE_CARD_KNOBS,
    {"seq", "512", "sequence length at full scale (reduced scales keep their own)", VL_KNOB_SETTING},
    {"seed", "1", "seed of weights and data", VL_KNOB_SETTING},
    {"steps", "12", "timed steps per rung and repetition", VL_KNOB_SETTING},
    {"warmup", "2", "untimed steps before them", VL_KNOB_SETTING},
    {"oom_batches", "200", "variable-length batches sampled for the OOM rate", VL_KNOB_SETTING},
    {"run_cap", "none", "arena cap of the timed runs (a size, or none: uncapped)", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};
static const char *const scales[] = {"tiny", "small", "full", NULL};

typedef struct {
  vl_mistral_model_cfg model;
  long batch;       /* micro-batch rows; 0 = "max" */
  long accum;
  vl_case_card card;
  size_t run_cap;   /* arena cap of the timed runs (VL_NO_CAP: uncapped) */
  long seed, steps, warmup, oom_batches;
} rung_cfg;

#define FAIL(...) (snprintf(err, errn, __VA_ARGS__), -1)

static int parse_dtype(const vl_knobs *k, const char *key, vl_dtype *out, char *err, size_t errn) {
  const char *v = vl_knob_str(k, key, knobs);
  if (vl_dtype_parse(v, out)) return FAIL("%s = '%s': expected fp32, fp16, bf16 or nf4", key, v);
  return 0;
}

static int parse_rung(const vl_case_env *env, const char *scale, const vl_knobs *k, rung_cfg *r,
                      char *err, size_t errn) {
  memset(r, 0, sizeof *r);
  vl_mistral_cfg *mc = &r->model.mc;
  vl_train_cfg *tc = &r->model.tc;
  if (vl_mistral_preset(scale, mc)) return FAIL("unknown scale '%s' (tiny, small, full)", scale);
  vl_train_cfg_default(tc);
  const vl_knobs *s = env->setting;
  long seq;
  if (vl_knob_int(s, "seq", knobs, 1, 1 << 20, &seq, err, errn)) return -1;
  /* The article's sequence length applies at full scale; reduced scales keep their own. */
  if (!strcasecmp(scale, "full")) mc->seq = seq;
  if (vl_case_card_parse(env, k, &r->card, err, errn)) return -1;
  if (vl_knob_int(s, "seed", knobs, 0, 1L << 40, &r->seed, err, errn)) return -1;
  if (vl_knob_int(s, "steps", knobs, 1, 100000, &r->steps, err, errn)) return -1;
  if (vl_knob_int(s, "warmup", knobs, 0, 1000, &r->warmup, err, errn)) return -1;
  if (vl_knob_int(s, "oom_batches", knobs, 1, 1000000, &r->oom_batches, err, errn)) return -1;
  if (parse_dtype(k, "compute", &tc->compute, err, errn)) return -1;
  if (tc->compute == VL_NF4) return FAIL("compute = nf4: nf4 is a storage format for frozen weights");
  if (parse_dtype(k, "frozen", &tc->frozen, err, errn)) return -1;
  long v;
  if (vl_knob_int(k, "lora_rank", knobs, 0, 4096, &v, err, errn)) return -1;
  tc->lora_rank = (int)v;
  double d;
  if (vl_knob_double(k, "lora_alpha", knobs, 1e-6, 1e6, &d, err, errn)) return -1;
  tc->lora_alpha = (float)d;
  const char *t = vl_knob_str(k, "lora_targets", knobs);
  if (!strcasecmp(t, "all")) tc->lora_targets = VL_LORA_ALL;
  else if (!strcasecmp(t, "qkvo")) tc->lora_targets = VL_LORA_QKVO;
  else return FAIL("lora_targets = '%s': expected qkvo or all", t);
  const char *o = vl_knob_str(k, "optimizer", knobs);
  if (vl_optimizer_parse(o, &tc->optim.opt)) return FAIL("optimizer = '%s': expected adamw, adafactor or sgd", o);
  int b;
  if (vl_knob_bool(k, "adafactor_beta1", knobs, &b, err, errn)) return -1;
  tc->optim.adafactor_beta1 = b;
  if (vl_knob_bool(k, "checkpoint", knobs, &b, err, errn)) return -1;
  tc->checkpoint = b;
  if (vl_knob_double(k, "lr", knobs, 1e-12, 10, &d, err, errn)) return -1;
  tc->optim.hp.lr = (float)d;
  if (vl_knob_double(k, "clip", knobs, 0, 1e9, &d, err, errn)) return -1;
  tc->clip = (float)d;
  if (vl_knob_double(k, "weight_decay", knobs, 0, 10, &d, err, errn)) return -1;
  tc->optim.hp.weight_decay = (float)d;
  /* the rung's batch, else the setting's, else the declared default */
  const char *bs = vl_knob_get(k, "batch");
  if (!bs) bs = vl_knob_str(s, "batch", knobs);
  if (!strcasecmp(bs, "max")) r->batch = 0;
  else {
    vl_knobs tmp = {0};
    vl_knob_set(&tmp, "batch", bs);
    if (vl_knob_int(&tmp, "batch", knobs, 1, 1 << 20, &r->batch, err, errn)) return -1;
  }
  if (vl_knob_int(k, "accum", knobs, 1, 4096, &r->accum, err, errn)) return -1;
  /* Runs are uncapped unless run_cap says otherwise (to study OOM at the run scale); parsed
   * here with the rest so a bad value is refused before anything runs. */
  r->run_cap = VL_NO_CAP;
  const char *rc_s = vl_knob_str(s, "run_cap", knobs);
  if (strcasecmp(rc_s, "none") && vl_knob_bytes(s, "run_cap", knobs, &r->run_cap, err, errn)) return -1;
  return 0;
}

/* One micro-batch: tokens (B, T) and targets (B, T), i32; NULL data when planning. */
static vl_batch token_batch(int64_t B, int64_t T, const int32_t *tok, const int32_t *tgt) {
  vl_batch b = {0};
  int64_t bt[2] = {B, T};
  vl_batch_add(&b, "tokens", VL_I32, 2, bt, tok);
  vl_batch_add(&b, "targets", VL_I32, 2, bt, tgt);
  return b;
}

/* A step of accum micro-batches of B x T. */
static vl_step_spec step_spec(const rung_cfg *r, int64_t B, int64_t T) {
  return (vl_step_spec){&vl_model_mistral, &r->model, (uint64_t)r->seed, token_batch(B, T, NULL, NULL), r->accum};
}

/* ---- planning ---------------------------------------------------------------------------- */
/* Largest micro-batch whose worst-case step (T = seq) fits under the cap, the model's
 * planned batch (peak is monotone in B). */
static int64_t max_batch(const rung_cfg *r) {
  vl_step_spec s = step_spec(r, 1, r->model.mc.seq);
  return vl_run_max_batch(&s, r->card.cap, 1);
}

/* Longest padded length that fits for batch B (0 if none). */
static int64_t max_len(const rung_cfg *r, int64_t B) {
  int64_t lo = 1, hi = r->model.mc.seq;
  vl_step_spec s = step_spec(r, B, hi);
  if (vl_run_fits(&s, r->card.cap)) return hi;
  if (s = step_spec(r, B, 1), !vl_run_fits(&s, r->card.cap)) return 0;
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) / 2;
    s = step_spec(r, B, mid);
    if (vl_run_fits(&s, r->card.cap)) lo = mid; else hi = mid;
  }
  return lo;
}

/* OOM rate over variable-length batches: a step fails when its padded length exceeds the
 * longest that fits at this batch size. */
static void oom_rate_json(const rung_cfg *r, int64_t B, cJSON *out) {
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

static int llm_plan(const vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out,
                    char *err, size_t errn) {
  rung_cfg r;
  if (parse_rung(env, scale, k, &r, err, errn)) return -1;
  double t0 = vl_now();
  int64_t mb = max_batch(&r);
  if (r.batch == 0) r.batch = mb > 0 ? mb : 1;
  double t_search = vl_now() - t0;
  int64_t B = r.batch, T = r.model.mc.seq;
  vl_step_spec spec = step_spec(&r, B, T);
  vl_plan_result p;
  double t1 = vl_now();
  vl_run_plan(&spec, VL_NO_CAP, VL_DEV_CUDA, true, &p);
  double t_plan = vl_now() - t1;
  if (p.status != VL_OK) {
    vl_plan_result_free(&p);
    return FAIL("planning failed: %s", p.err);
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
  vl_case_fit_json(out, &r.card, vl_run_fits(&spec, r.card.cap), mb, t_plan, t_search);
  oom_rate_json(&r, B, out);
  cJSON *timeline = cJSON_AddArrayToObject(out, "timeline");
  for (size_t i = 0; i < p.n_timeline; i++) {
    double pt[2] = {(double)p.timeline[i].seq, (double)p.timeline[i].bytes};
    cJSON_AddItemToArray(timeline, cJSON_CreateDoubleArray(pt, 2));
  }
  vl_plan_result_free(&p);
  /* peak vs batch at the worst-case length, for the batch plot */
  cJSON *curve = cJSON_AddArrayToObject(out, "batch_curve");
  int64_t top = mb + mb / 4 + 2 > 8 ? mb + mb / 4 + 2 : 8; /* past the cap crossing */
  for (int64_t b = 1; b <= top; b += top / 64 + 1) {
    vl_plan_result q;
    vl_step_spec s = step_spec(&r, b, T);
    if (vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &q) != VL_OK) break; /* uncapped: a host failure */
    double pt[2] = {(double)b, (double)q.mem.peak_total};
    cJSON_AddItemToArray(curve, cJSON_CreateDoubleArray(pt, 2));
  }
  return 0;
}

/* ---- running ---------------------------------------------------------------------------- */
typedef struct {
  const vl_case_env *env;
  const rung_cfg *r;
  vl_dialogue_gen gen;
  int32_t *tok, *tgt; /* (accum, B, T) host */
  vl_batch *mb;       /* accum micro-batches, each (B, T_j) of its padded length */
  int64_t maxT;       /* longest micro-batch of the timed steps */
} llm_loop;

static vl_status llm_next(void *user, long step, const vl_batch **mb, int *n, double *wait) {
  llm_loop *L = user;
  int64_t B = L->r->batch, T = L->r->model.mc.seq;
  for (int64_t j = 0; j < L->r->accum; j++) {
    int32_t *tok = L->tok + j * B * T, *tgt = L->tgt + j * B * T;
    int64_t Tj = vl_dialogue_batch(&L->gen, B, 0, tok, tgt);
    L->mb[j] = token_batch(B, Tj, tok, tgt);
  }
  *mb = L->mb;
  *n = (int)L->r->accum;
  return VL_OK;
}

static void llm_after(void *user, long step, bool timed, const vl_step_info *info, double dt, double wait) {
  llm_loop *L = user;
  for (int64_t j = 0; timed && j < L->r->accum; j++)
    if (L->mb[j].t[0].shape[1] > L->maxT) L->maxT = L->mb[j].t[0].shape[1];
  long total = L->r->warmup + L->r->steps;
  if (!L->env->quiet && (step + 1) % 5 == 0)
    vl_progress("  step %ld/%ld  loss %.4f  %.3f s", step + 1, total, info->loss, dt);
}

static int llm_run(const vl_case_env *env, const vl_knobs *k, int rep, cJSON *out, char *err,
                   size_t errn) {
  rung_cfg r;
  if (parse_rung(env, env->scale, k, &r, err, errn)) return -1;
  if (env->device == VL_DEV_PLAN) return FAIL("run needs a compute device (cpu or cuda), not plan");
  if (r.batch == 0) { /* "max": the largest batch at the article's (full) scale, as planned */
    rung_cfg full;
    if (parse_rung(env, "full", k, &full, err, errn)) return -1;
    int64_t mb = max_batch(&full);
    r.batch = mb > 0 ? mb : 1;
  }
  if (!strcasecmp(env->scale, "full") && env->device == VL_DEV_CPU)
    return FAIL("a full-scale (7B) step does not run on the CPU here: use --scale small or tiny, or --device plan");
  vl_ctx *c;
  vl_status s = vl_ctx_create(&c, env->device, r.run_cap);
  if (s != VL_OK) return FAIL("cannot create a %s context: %s", vl_device_name(env->device), vl_status_name(s));
  vl_model *m = NULL;
  s = vl_model_create(c, &vl_model_mistral, &r.model, (uint64_t)r.seed, &m);
  int64_t B = r.batch, T = r.model.mc.seq;
  llm_loop L = {env, &r, .tok = malloc((size_t)(B * T * r.accum) * sizeof(int32_t)),
                .tgt = malloc((size_t)(B * T * r.accum) * sizeof(int32_t)),
                .mb = calloc((size_t)r.accum, sizeof(vl_batch))};
  if (!L.tok || !L.tgt || !L.mb) s = VL_ERR_OOM;
  vl_dialogue_init(&L.gen, r.model.mc.vocab, T, (uint64_t)r.seed + 1000 + (uint64_t)rep);
  vl_loop_cfg lc = {.warmup = r.warmup, .total = r.warmup + r.steps, .reset_peaks_after_warmup = true,
                    .profile = env->profile,
                    .next = llm_next, .after = llm_after, .user = &L, .stop = &vl_interrupted};
  vl_loop_result res = {0};
  if (s == VL_OK) s = vl_run_loop(m, &lc, &res);
  int rc = vl_case_triage(env, s, c->err, out, err, errn);
  if (rc > 0) {
    rc = 0;
    vl_mem_stats ms;
    vl_arena_stats(c->arena, &ms);
    vl_stats st;
    vl_case_run_json(out, env, &res, &ms, B, r.accum, &st);
    double tps = (double)res.targets / (double)res.timed / st.median;
    cJSON_AddNumberToObject(out, "tokens_per_s", tps);
    cJSON_AddNumberToObject(out, "sec_per_token", 1.0 / tps);
    cJSON_AddNumberToObject(out, "skipped_steps", (double)res.skipped_timed);
    vl_param_counts pc;
    vl_model_params(m, &pc);
    cJSON_AddNumberToObject(out, "params_total", (double)pc.total);
    cJSON_AddNumberToObject(out, "params_trainable", (double)pc.trainable);
    /* The planner, following this device's workspace rules, for the longest step seen. */
    vl_step_spec spec = step_spec(&r, B, L.maxT);
    vl_case_plan_check_json(out, env, &spec, ms.peak_total);
  }
  vl_loop_result_free(&res);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  free(L.tok); free(L.tgt); free(L.mb);
  return rc;
}

/* Every knob of a rung and the setting (run_cap included), without planning. */
static int llm_check(const vl_case_env *env, const vl_knobs *k, char *err, size_t errn) {
  rung_cfg r;
  return parse_rung(env, env->scale, k, &r, err, errn);
}

/* What plan and run write at the top level of a rung's plan or run. */
static const char *const metrics[] = {
    "params_total", "params_trainable", "batch", "accum", "effective_batch", "seq", "peak_bytes", "reserved_bytes",
    "weight_bytes", "optim_bytes", "grads_bytes", "acts_bytes", "optim_per_param", "flops_per_step",
    "flops_recompute", "bytes_moved_per_step", "card_bytes", "cap_bytes", "usable_fraction", "fits", "max_batch",
    "max_batch_at_search_limit", "cuda_context_bytes", "plan_seconds", "max_batch_search_seconds", "oom_rate",
    "max_len_fit", "oom_batches", "oom", "tokens_per_s", "sec_per_token", "model_flops_per_step", "flops_per_s",
    "skipped_steps", "loss_scale_end", "measured_peak_bytes", "planned_peak_bytes", "plan_matches_measured", NULL};

const vl_case vl_case_llm_lora = {
    .id = "llm-lora",
    .summary = "7B LLM fine-tuning memory on a 24 GB card: fp32 -> cap -> fp16 -> LoRA -> QLoRA -> Adafactor -> checkpointing",
    .knobs = knobs,
    .scales = scales,
    .metrics = metrics,
    .check = llm_check,
    .plan = llm_plan,
    .run = llm_run,
    .method = "Memory, FLOPs, fit, largest batch and OOM rate are **planned at full scale** (the "
              "article's Mistral-7B and sequence length) by the plan backend, which runs the exact "
              "allocation sequence of a training step through the same arena algorithm as a real "
              "run, with a CUDA card's workspace rules. Step time, tokens/s and loss are measured "
              "by running each rung at the run scale.",
    .report = vl_llm_lora_report,
};
