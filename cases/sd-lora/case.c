/* sd-lora: Stable Diffusion 1.5 LoRA training (CASES.md §3). One rung for now: the LoRA
 * step on cached inputs, planned at full scale (SD 1.5 exactly, 512x512 -> 64x64 latents)
 * with its parameters by module, peak by category, fit and largest batch on the card, and
 * run at the scale this device can run on synthetic latents, text embeddings, noise and
 * timesteps (seeded). The model is the engine's (vramlab/sd.h); the scaffolding too. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "case.h"
#include "interrupt.h"
#include "vramlab/sd.h"

static const vl_knob_decl knobs[] = {
    {"precision", "fp16", "frozen weights and activations: fp32, fp16 or bf16 (LoRA masters fp32)", VL_KNOB_RUNG},
    {"attention", "efficient", "attention: classic (materialised scores) or efficient (tiled)", VL_KNOB_RUNG},
    {"checkpoint", "false", "activation checkpointing per resnet and transformer block", VL_KNOB_RUNG},
    {"lora_rank", "4", "LoRA rank on to_q, to_k, to_v, to_out.0", VL_KNOB_RUNG},
    {"lora_alpha", "4", "LoRA alpha (scale alpha / rank)", VL_KNOB_RUNG},
    {"batch", "1", "micro-batch images, or max (the largest that fits the cap at full scale)", VL_KNOB_RUNG},
    {"accum", "1", "gradient accumulation micro-batches per step", VL_KNOB_RUNG},
    {"text_lora_rank", "0", "LoRA rank on the text encoder's q/k/v/out_proj (0: frozen; needs cache = false)",
     VL_KNOB_RUNG},
    {"cache", "true", "latents and text embeddings given (true) or VAE and text encoder in the step", VL_KNOB_RUNG},
    {"lr", "1e-4", "AdamW learning rate", VL_KNOB_RUNG},
    VL_CASE_CARD_KNOBS,
    {"seed", "1", "seed of weights and data", VL_KNOB_SETTING},
    {"steps", "4", "timed steps per rung and repetition", VL_KNOB_SETTING},
    {"warmup", "1", "untimed steps before them", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};

typedef struct {
  vl_sd_cfg model;
  long batch, accum, seed, steps, warmup; /* batch 0: max */
  vl_case_card card;
} sd_rung;

static vl_status parse_rung(vl_case_env *env, const char *scale, const vl_knobs *k, sd_rung *r) {
  memset(r, 0, sizeof *r);
  if (vl_sd_preset(scale, &r->model))
    return vl_case_fail(env, VL_ERR_INVALID, "unknown scale '%s' (tiny, small, full)", scale);
  const char *p = vl_knob_str(k, "precision", knobs);
  vl_dtype dt;
  if (vl_dtype_parse(p, &dt) || (dt != VL_F32 && dt != VL_F16 && dt != VL_BF16))
    return vl_case_fail(env, VL_ERR_INVALID, "precision = '%s': expected fp32, fp16 or bf16", p);
  vl_sd_set_precision(&r->model, dt, dt);
  const char *a = vl_knob_str(k, "attention", knobs);
  vl_attn_impl impl;
  if (vl_attn_impl_parse(a, &impl))
    return vl_case_fail(env, VL_ERR_INVALID, "attention = '%s': expected classic or efficient", a);
  r->model.unet.attn = r->model.vae.attn = r->model.clip.attn = impl;
  int b;
  VL_TRY(vl_case_knob_bool(env, k, "checkpoint", knobs, &b));
  r->model.unet.checkpoint = b;
  VL_TRY(vl_case_knob_bool(env, k, "cache", knobs, &b));
  r->model.encoders_in_step = !b;
  long v;
  VL_TRY(vl_case_knob_int(env, k, "lora_rank", knobs, 1, 1024, &v));
  r->model.unet.lora_rank = (int)v;
  VL_TRY(vl_case_knob_int(env, k, "text_lora_rank", knobs, 0, 1024, &v));
  r->model.clip.lora_rank = (int)v;
  r->model.clip.lora_alpha = (float)v; /* alpha = rank, as the script's default */
  if (v > 0 && !r->model.encoders_in_step)
    return vl_case_fail(env, VL_ERR_INVALID, "text_lora_rank = %ld trains the text encoder in the step: set cache = false", v);
  double d;
  VL_TRY(vl_case_knob_double(env, k, "lora_alpha", knobs, 1e-6, 1e6, &d));
  r->model.unet.lora_alpha = (float)d;
  VL_TRY(vl_case_knob_double(env, k, "lr", knobs, 1e-12, 10, &d));
  r->model.optim.hp.lr = (float)d;
  const char *bs = vl_knob_str(k, "batch", knobs);
  if (!strcasecmp(bs, "max")) r->batch = 0;
  else VL_TRY(vl_case_knob_int(env, k, "batch", knobs, 1, 1 << 16, &r->batch));
  VL_TRY(vl_case_knob_int(env, k, "accum", knobs, 1, 4096, &r->accum));
  VL_TRY(vl_case_card_parse(env, k, &r->card));
  const vl_knobs *s = env->setting;
  VL_TRY(vl_case_knob_int(env, s, "seed", knobs, 0, 1L << 40, &r->seed));
  VL_TRY(vl_case_knob_int(env, s, "steps", knobs, 1, 100000, &r->steps));
  VL_TRY(vl_case_knob_int(env, s, "warmup", knobs, 0, 1000, &r->warmup));
  return VL_OK;
}

static vl_step_spec step_spec(const sd_rung *r, int64_t B) {
  vl_step_spec s = {&vl_model_sd, &r->model, (uint64_t)r->seed, {0}, r->accum};
  vl_step_spec_set_batch(&s, B);
  return s;
}

static int64_t max_batch(const sd_rung *r) {
  vl_step_spec s = step_spec(r, 1);
  return vl_run_max_batch(&s, r->card.cap, 1);
}

static vl_status sd_plan(vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out) {
  sd_rung r;
  VL_TRY(parse_rung(env, scale, k, &r));
  double t0 = vl_now();
  int64_t mb = max_batch(&r);
  double t_search = vl_now() - t0;
  if (r.batch == 0) r.batch = mb > 0 ? mb : 1;
  vl_step_spec spec = step_spec(&r, r.batch);
  vl_plan_result p;
  double t1 = vl_now();
  vl_run_plan(&spec, VL_NO_CAP, VL_DEV_CUDA, false, &p);
  double t_plan = vl_now() - t1;
  if (p.status != VL_OK) {
    vl_status s = vl_case_fail(env, p.status, "planning failed: %s", p.err);
    vl_plan_result_free(&p);
    return s;
  }
  vl_case_plan_json(out, scale, &p, r.batch, r.accum);
  cJSON *pm = cJSON_AddObjectToObject(out, "params_by_module");
  for (int i = 0; i < p.params.n_modules; i++)
    cJSON_AddNumberToObject(pm, p.params.module_name[i], (double)p.params.module_count[i]);
  cJSON_AddStringToObject(out, "attention", vl_attn_impl_name(r.model.unet.attn));
  cJSON_AddNumberToObject(out, "latent_side", (double)r.model.unet.sample);
  cJSON_AddNumberToObject(out, "image_side", (double)vl_sd_image_side(&r.model));
  cJSON_AddNumberToObject(out, "bytes_moved_per_step", p.bytes_moved);
  vl_case_fit_json(out, &r.card, vl_run_fits(&spec, r.card.cap), mb, t_plan, t_search);
  vl_plan_result_free(&p);
  return VL_OK;
}

static vl_status sd_check(vl_case_env *env, const vl_knobs *k) {
  sd_rung r;
  return parse_rung(env, env->scale, k, &r);
}

/* ---- the timed run: synthetic inputs ------------------------------------------------------ */
typedef struct {
  const vl_case_env *env;
  const sd_rung *r;
  vl_rng rng;
  float *lat, *ctx, *noise; /* (accum, ...) host */
  int32_t *t;
  vl_batch *mb;
} sd_loop;

static void fill(vl_rng *g, float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = vl_rng_normal(g);
}

static vl_status sd_next(void *user, long step, const vl_batch **mb, int *n, double *wait) {
  sd_loop *L = user;
  (void)step;
  *wait = 0;
  for (long j = 0; j < L->r->accum; j++) {
    vl_batch *b = &L->mb[j]; /* the shapes of the planned batch, with data */
    for (int i = 0; i < b->n; i++) {
      vl_batch_tensor *bt = &b->t[i];
      int64_t e = 1;
      for (int d = 0; d < bt->ndim; d++) e *= bt->shape[d];
      if (bt->dtype == VL_I32) {
        int32_t *t = L->t + j * e;
        for (int64_t q = 0; q < e; q++) t[q] = (int32_t)vl_rng_below(&L->rng, VL_DDPM_STEPS);
        bt->data = t;
      } else {
        float *x = !strcmp(bt->name, "latents") ? L->lat : !strcmp(bt->name, "context") ? L->ctx : L->noise;
        x += j * e;
        fill(&L->rng, x, e);
        bt->data = x;
      }
    }
  }
  *mb = L->mb;
  *n = (int)L->r->accum;
  return VL_OK;
}

static void sd_after(void *user, long step, bool timed, const vl_step_info *info, double dt, double wait) {
  sd_loop *L = user;
  (void)timed; (void)wait;
  if (!L->env->quiet)
    vl_progress("  step %ld/%ld  loss %.4f  %.3f s", step + 1, L->r->warmup + L->r->steps, info->loss, dt);
}

static vl_status sd_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out) {
  sd_rung r;
  VL_TRY(parse_rung(env, env->scale, k, &r));
  if (env->device == VL_DEV_PLAN)
    return vl_case_fail(env, VL_ERR_INVALID, "run needs a compute device (cpu or cuda), not plan");
  if (r.model.encoders_in_step)
    return vl_case_fail(env, VL_ERR_UNSUPPORTED, "cache = false runs with the data pipeline (issue #11); plan it instead");
  if (!strcasecmp(env->scale, "full") && env->device == VL_DEV_CPU)
    return vl_case_fail(env, VL_ERR_UNSUPPORTED, "a full-scale SD step does not run on the CPU here: use --scale small or tiny");
  if (r.batch == 0) r.batch = 1;
  vl_step_spec spec = step_spec(&r, r.batch);
  const vl_batch *pb = &spec.batch;
  int64_t nl = pb->t[0].shape[0] * pb->t[0].shape[1] * pb->t[0].shape[2] * pb->t[0].shape[3];
  int64_t nc = pb->t[1].shape[0] * pb->t[1].shape[1] * pb->t[1].shape[2];
  sd_loop L = {env, &r, .lat = malloc((size_t)(nl * r.accum) * sizeof(float)),
               .ctx = malloc((size_t)(nc * r.accum) * sizeof(float)),
               .noise = malloc((size_t)(nl * r.accum) * sizeof(float)),
               .t = malloc((size_t)(r.batch * r.accum) * sizeof(int32_t)),
               .mb = calloc((size_t)r.accum, sizeof(vl_batch))};
  vl_rng_seed(&L.rng, (uint64_t)r.seed * 7919u + (uint64_t)rep);
  vl_ctx *c = NULL;
  vl_status s = (!L.lat || !L.ctx || !L.noise || !L.t || !L.mb) ? vl_case_fail(env, VL_ERR_OOM, "host memory for the batches")
                                                                : vl_ctx_create(&c, env->device, VL_NO_CAP);
  for (long j = 0; L.mb && j < r.accum; j++) L.mb[j] = *pb;
  vl_model *m = NULL;
  vl_loop_result res = {0};
  if (s == VL_OK) s = vl_model_create(c, &vl_model_sd, &r.model, (uint64_t)r.seed, &m);
  vl_loop_cfg lc = {.warmup = r.warmup, .total = r.warmup + r.steps, .reset_peaks_after_warmup = true,
                    .profile = env->profile, .next = sd_next, .after = sd_after, .user = &L,
                    .stop = &vl_interrupted};
  if (s == VL_OK) s = vl_run_loop(m, &lc, &res);
  bool ran = false;
  if (c) s = vl_case_triage(env, s, c->err, out, &ran);
  if (ran) {
    vl_mem_stats ms;
    vl_arena_stats(c->arena, &ms);
    vl_stats st;
    vl_case_run_json(out, env, &res, &ms, r.batch, r.accum, &st);
    cJSON_AddNumberToObject(out, "images_per_s", (double)(r.batch * r.accum) / st.median);
    vl_case_plan_check_json(out, env, &spec, ms.peak_total);
  }
  vl_loop_result_free(&res);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  free(L.lat); free(L.ctx); free(L.noise); free(L.t); free(L.mb);
  return s;
}

static const char *const metrics[] = {
    "params_total", "params_trainable", "batch", "accum", "effective_batch", "peak_bytes", "reserved_bytes",
    "weight_bytes", "acts_bytes", "flops_per_step", "flops_recompute", "bytes_moved_per_step", "latent_side",
    "image_side", "card_bytes", "cap_bytes", "cuda_context_bytes", "fits", "max_batch", "max_batch_at_search_limit",
    "plan_seconds", "max_batch_search_seconds", "oom", "images_per_s", "model_flops_per_step", "flops_per_s",
    "measured_peak_bytes", "planned_peak_bytes", "plan_matches_measured", NULL};

static const char *const scales[] = {"tiny", "small", "full", NULL};

const vl_case vl_case_sd_lora = {
    .id = "sd-lora",
    .summary = "Stable Diffusion 1.5 LoRA: the U-Net's LoRA step (the caching ladder comes with the data pipeline)",
    .knobs = knobs,
    .scales = scales,
    .metrics = metrics,
    .check = sd_check,
    .plan = sd_plan,
    .run = sd_run,
    .method = "Memory, FLOPs, fit and largest batch are **planned at full scale** (SD 1.5's U-Net, "
              "VAE encoder and CLIP text encoder exactly, 512x512 images) by the plan backend, "
              "which runs the exact allocation sequence of a training step through the same "
              "arena algorithm as a real run, with a CUDA card's workspace rules. Step time and "
              "loss are measured by running the step at the run scale on synthetic inputs.",
    .report = NULL,
};
