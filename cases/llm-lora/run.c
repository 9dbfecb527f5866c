/* llm-lora's timed run: a rung's Mistral model trained on dialogue batches by the engine's
 * timed loop on env->device at env->scale, with OOM triage, tokens/s and the planner's
 * peak for the longest step seen. Batches are variable-length (padded to their longest
 * dialogue) or, with run_seq = N, every one exactly N tokens, for like-for-like timings.
 * Checkpoints (--save-every, --resume) hold the dialogue generator's RNG beside the model's
 * state, so a resumed run draws the same batches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kit/interrupt.h"
#include "llm.h"
#include "datasets/dialogue.h"

typedef struct {
  const vl_case_env *env;
  const vl_llm_rung *r;
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
    int64_t Tj = vl_dialogue_batch(&L->gen, B, L->r->run_seq, tok, tgt);
    L->mb[j] = vl_llm_token_batch(B, Tj, tok, tgt);
  }
  *mb = L->mb;
  *n = (int)L->r->accum;
  return VL_OK;
}

/* ---- checkpoint state: what a resume needs beside the model ------------------------------ */
/* Words of the blob (host byte order): the settings that shape the data (a resume with others is refused),
 * then the generator's RNG. (The longest batch, maxT, is not kept: a resumed run measures
 * its peak from its own first timed step, so the planner's check covers those steps.) */
enum { W_VERSION, W_BATCH, W_ACCUM, W_RUN_SEQ, W_VOCAB, W_SEQ, W_RNG0, W_COUNT = W_RNG0 + 4 };
#define LLM_BLOB_VERSION 1
static const char *const llm_words[W_COUNT] = {"version", "batch", "accum", "run_seq", "vocab",
                                               "seq",     "rng[0]", "rng[1]", "rng[2]", "rng[3]"};

static void llm_words_of(const llm_loop *L, uint64_t *w) {
  w[W_VERSION] = LLM_BLOB_VERSION;
  w[W_BATCH] = (uint64_t)L->r->batch;
  w[W_ACCUM] = (uint64_t)L->r->accum;
  w[W_RUN_SEQ] = (uint64_t)L->r->run_seq;
  w[W_VOCAB] = (uint64_t)L->gen.vocab;
  w[W_SEQ] = (uint64_t)L->gen.max_len;
  for (int i = 0; i < 4; i++) w[W_RNG0 + i] = L->gen.rng.s[i];
}

static vl_status llm_save_state(void *user, long step, void **blob, size_t *len) {
  (void)step;
  llm_loop *L = user;
  uint64_t *w = malloc(W_COUNT * sizeof *w);
  if (!w) return VL_ERR_OOM;
  llm_words_of(L, w);
  *blob = w;
  *len = W_COUNT * sizeof *w;
  return VL_OK;
}

/* The blob of the checkpoint at path back into L: the settings must match this run's. */
static vl_status llm_restore(vl_ctx *c, llm_loop *L, const void *blob, size_t len, const char *path) {
  uint64_t now[W_COUNT], w[W_COUNT];
  if (len != sizeof w)
    return vl_fail(c, VL_ERR_INVALID, "checkpoint %s: section 'case' holds %zu bytes, llm-lora's state %zu", path, len,
                   sizeof w);
  memcpy(w, blob, sizeof w);
  llm_words_of(L, now);
  for (int i = W_VERSION; i < W_RNG0; i++)
    if (w[i] != now[i])
      return vl_fail(c, VL_ERR_INVALID, "checkpoint %s: case field '%s' is %llu, this run's %llu", path, llm_words[i],
                     (unsigned long long)w[i], (unsigned long long)now[i]);
  for (int i = 0; i < 4; i++) L->gen.rng.s[i] = w[W_RNG0 + i];
  return VL_OK;
}

/* The settings a checkpoint records and a resume must match (vl_ckpt_meta.settings): every
 * one that changes the loss trajectory or names the run in its results. The model: every
 * number of its config (the preset's, a --model-config file's, the size knobs'), so two
 * config files that differ only in rope_theta or rms_norm_eps differ here. Training: the
 * dtypes, LoRA, optimizer, lr, weight decay, clip; the data: batch, accum, run_seq, seed;
 * the device (its kernels round differently). Not recorded, as they leave the trajectory
 * alone: steps and warmup (how long the run goes and which steps are timed),
 * oom_batches, run_cap, card, cuda_context and cap_fraction (planning and the arena's cap),
 * model_config itself (a path: its numbers are recorded), checkpoint (recomputation is
 * bit-identical, test_model), and the harness's reps, --save-every, --keep-last, --out,
 * --quiet, --profile and the thread count. */
static vl_status llm_settings(vl_case_env *env, const vl_llm_rung *r, char *buf, size_t n) {
  const vl_mistral_cfg *mc = &r->model.mc;
  const vl_train_cfg *tc = &r->model.tc;
  buf[0] = 0;
  int e = vl_ckpt_setting(buf, n, "vocab", "%lld", (long long)mc->vocab);
  e |= vl_ckpt_setting(buf, n, "dim", "%lld", (long long)mc->dim);
  e |= vl_ckpt_setting(buf, n, "layers", "%lld", (long long)mc->n_layers);
  e |= vl_ckpt_setting(buf, n, "heads", "%lld", (long long)mc->n_heads);
  e |= vl_ckpt_setting(buf, n, "kv_heads", "%lld", (long long)mc->n_kv_heads);
  e |= vl_ckpt_setting(buf, n, "head_dim", "%lld", (long long)mc->head_dim);
  e |= vl_ckpt_setting(buf, n, "ffn", "%lld", (long long)mc->ffn);
  e |= vl_ckpt_setting(buf, n, "seq", "%lld", (long long)mc->seq);
  e |= vl_ckpt_setting_f32(buf, n, "rope_theta", mc->rope_theta);
  e |= vl_ckpt_setting_f32(buf, n, "rms_norm_eps", mc->norm_eps);
  /* recorded when set only: the checkpoints of the families before them stay readable */
  if (mc->tie_embed) e |= vl_ckpt_setting(buf, n, "tie_word_embeddings", "%s", "true");
  if (mc->qkv_bias) e |= vl_ckpt_setting(buf, n, "qkv_bias", "%s", "true");
  e |= vl_ckpt_setting(buf, n, "compute", "%s", vl_dtype_name(tc->compute));
  e |= vl_ckpt_setting(buf, n, "frozen", "%s", vl_dtype_name(tc->frozen));
  e |= vl_ckpt_setting(buf, n, "lora_rank", "%d", tc->lora_rank);
  e |= vl_ckpt_setting_f32(buf, n, "lora_alpha", tc->lora_alpha);
  e |= vl_ckpt_setting(buf, n, "lora_targets", "%s", tc->lora_targets == VL_LORA_ALL ? "all" : "qkvo");
  e |= vl_ckpt_setting(buf, n, "optimizer", "%s", vl_optimizer_name(tc->optim.opt));
  e |= vl_ckpt_setting(buf, n, "adafactor_beta1", "%s", tc->optim.adafactor_beta1 ? "true" : "false");
  e |= vl_ckpt_setting_f32(buf, n, "lr", tc->optim.hp.lr);
  e |= vl_ckpt_setting_f32(buf, n, "weight_decay", tc->optim.hp.weight_decay);
  e |= vl_ckpt_setting_f32(buf, n, "clip", tc->clip);
  e |= vl_ckpt_setting(buf, n, "batch", "%ld", r->batch);
  e |= vl_ckpt_setting(buf, n, "accum", "%ld", r->accum);
  e |= vl_ckpt_setting(buf, n, "run_seq", "%ld", r->run_seq);
  e |= vl_ckpt_setting(buf, n, "seed", "%ld", r->seed);
  e |= vl_ckpt_setting(buf, n, "device", "%s", vl_device_name(env->device));
  if (e) return vl_case_fail(env, VL_ERR_INVALID, "the run's settings do not fit a checkpoint's %zu bytes", n);
  return VL_OK;
}

/* The checkpoint keys of a run's results: where it resumed, what it saved. */
static void llm_ckpt_json(cJSON *out, const vl_loop_result *res) {
  if (res->resumed_from) cJSON_AddNumberToObject(out, "resumed_from_step", (double)res->resumed_from);
  if (!res->saves) return;
  cJSON_AddNumberToObject(out, "checkpoints_saved", (double)res->saves);
  cJSON_AddNumberToObject(out, "checkpoint_step", (double)res->saved_step);
  cJSON_AddStringToObject(out, "checkpoint", res->saved_path);
  cJSON_AddNumberToObject(out, "checkpoint_seconds", res->save_seconds);
}

static void llm_after(void *user, long step, bool timed, const vl_step_info *info, double dt, double wait) {
  llm_loop *L = user;
  for (int64_t j = 0; timed && j < L->r->accum; j++)
    if (L->mb[j].t[0].shape[1] > L->maxT) L->maxT = L->mb[j].t[0].shape[1];
  long total = L->r->warmup + L->r->steps;
  if (!L->env->quiet && (step + 1) % 5 == 0)
    vl_progress("  step %ld/%ld  loss %.4f  %.3f s", step + 1, total, info->loss, dt);
}

/* A step whose planned FLOPs take this machine's measured sgemm rate more than 30 s is said
 * before it starts (a 7B --model-config at tiny scale fits in RAM and takes minutes a step):
 * its FLOPs, a lower bound on its time, and how to stop it. Said even with --quiet. */
static void warn_long_step(const vl_case_env *env, const vl_llm_rung *r, double flops) {
  if (!(env->sgemm_flops > 0) || flops / env->sgemm_flops < 30) return;
  double s = flops / env->sgemm_flops, steps = (double)(r->warmup + r->steps);
  fprintf(stderr,
          "[vramlab] warning: one step of this rung is %.1f TFLOP (planned); at this machine's %.0f GFLOP/s sgemm "
          "(measured) it takes at least %.1f min, %.1f h for the run's %.0f steps. kill (SIGTERM) stops between "
          "operations, Ctrl-C at the next step edge.\n",
          flops / 1e12, env->sgemm_flops / 1e9, s / 60, s * steps / 3600, steps);
}

/* A model config or size knobs can make a reduced scale any size: a step this machine's
 * memory cannot hold is refused before anything is allocated (the plan follows the CPU's
 * workspace rules, so it is the run's peak). */
static vl_status cpu_fits(vl_case_env *env, const vl_llm_rung *r) {
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || psz <= 0) return VL_OK;
  double mem = (double)pages * (double)psz;
  vl_step_spec spec = vl_llm_step_spec(r, r->batch, r->model.mc.seq);
  vl_plan_result p;
  vl_run_plan(&spec, VL_NO_CAP, VL_DEV_CPU, false, &p);
  vl_status s = VL_OK;
  if (p.status != VL_OK) s = vl_case_fail(env, p.status, "planning the run's step failed: %s", p.err);
  else if ((double)p.mem.peak_total > 0.9 * mem)
    s = vl_case_fail(env, VL_ERR_UNSUPPORTED,
                     "the step needs %.1f GB (planned), more than 90%% of this machine's %.1f GB: use a smaller model, "
                     "batch or seq, or --device plan", (double)p.mem.peak_total / 1e9, mem / 1e9);
  else warn_long_step(env, r, p.flops);
  vl_plan_result_free(&p);
  return s;
}

vl_status vl_llm_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out) {
  vl_llm_rung r;
  VL_TRY(vl_llm_parse_rung(env, env->scale, k, &r));
  if (env->device == VL_DEV_PLAN)
    return vl_case_fail(env, VL_ERR_INVALID, "run needs a compute device (cpu or cuda), not plan");
  if (r.batch == 0) { /* "max": the largest batch at the article's (full) scale, as planned */
    vl_llm_rung full;
    VL_TRY(vl_llm_parse_rung(env, "full", k, &full));
    int64_t mb = vl_llm_max_batch(&full);
    r.batch = mb > 0 ? mb : 1;
  }
  if (!strcasecmp(env->scale, "full") && env->device == VL_DEV_CPU)
    return vl_case_fail(env, VL_ERR_UNSUPPORTED,
                        "a full-scale (7B) step does not run on the CPU here: use --scale small or tiny, or --device plan");
  /* a fixed run length above the sequence limit raises the limit: the batch is what was asked */
  if (r.run_seq > r.model.mc.seq) r.model.mc.seq = r.run_seq;
  if (env->device == VL_DEV_CPU) VL_TRY(cpu_fits(env, &r));
  char settings[1024];
  VL_TRY(llm_settings(env, &r, settings, sizeof settings));
  vl_ctx *c;
  vl_status s = vl_ctx_create(&c, env->device, r.run_cap);
  if (s != VL_OK)
    return vl_case_fail(env, s, "cannot create a %s context: %s", vl_device_name(env->device), vl_status_name(s));
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
                    .next = llm_next, .after = llm_after, .user = &L, .stop = &vl_interrupted, .stop_now = &vl_terminated,
                    .save_every = env->save_every, .save_dir = env->ckpt_dir, .ckpt_tag = "llm-lora",
                    .ckpt_settings = settings, .keep_last = env->keep_last, .save_state = llm_save_state};
  vl_loop_result res = {0};
  if (s == VL_OK && env->resume) {
    vl_ckpt_meta meta;
    s = vl_run_resume(m, env->resume, "llm-lora", settings, &res, &meta);
    if (s == VL_OK) s = llm_restore(c, &L, meta.blob, meta.blob_len, env->resume);
    if (s == VL_OK && res.steps >= lc.total)
      s = vl_fail(c, VL_ERR_INVALID, "checkpoint %s is at step %ld and this run has %ld steps (warmup + steps): "
                  "nothing left to run", env->resume, res.steps, lc.total);
    if (s == VL_OK && !env->quiet) vl_progress("  resumed from %s at step %ld", env->resume, res.steps);
    vl_ckpt_meta_free(&meta);
  }
  if (s == VL_OK) s = vl_run_loop(m, &lc, &res);
  bool ran;
  s = vl_case_triage(env, s, c->err, out, &ran);
  llm_ckpt_json(out, &res);
  if (ran && res.timed < 1) {
    s = vl_case_fail(env, VL_ERR_INVALID, "no timed step: the run resumed at step %ld of %ld and its first step "
                     "after a resume is warm-up", res.resumed_from, lc.total);
  } else if (ran) {
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
    vl_step_spec spec = vl_llm_step_spec(&r, B, L.maxT);
    vl_case_plan_check_json(out, env, &spec, ms.peak_total);
  }
  vl_loop_result_free(&res);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  free(L.tok); free(L.tgt); free(L.mb);
  return s;
}
