/* sd-lora's knobs and what they mean: the knob table, a rung's knobs and the setting mapped
 * to an SD 1.5 LoRA step (vramlab/sd.h), its input pipeline and its consumer; the step a
 * rung plans and runs; the modeled accelerator's step time, from the planner's FLOPs. */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "sdl.h"

const vl_knob_decl vl_sdl_knobs[] = {
    {"cache", "none", "none (decode, transform and the encoders in every step), disk (cache files read each step) "
     "or ram (cache files loaded once)", VL_KNOB_RUNG},
    {"cache_store", "moments", "what a latent record holds: moments (mean, log-variance: z sampled per step) or "
     "sample (one z drawn at build time, kohya's cache_latents)", VL_KNOB_RUNG},
    {"cache_dtype", "fp16", "storage of the cache files: fp16 or fp32", VL_KNOB_RUNG},
    {"workers", "0", "loader / cache reader threads, or cores (one per core)", VL_KNOB_RUNG},
    {"prefetch", "2", "batches in flight per worker", VL_KNOB_RUNG},
    {"batched", "false", "batched collate (transform straight into the batch) instead of per-sample tensors",
     VL_KNOB_RUNG},
    {"batch", "8", "micro-batch images, or max (the largest under the cap at full scale)", VL_KNOB_RUNG},
    {"accum", "1", "gradient accumulation micro-batches per step", VL_KNOB_RUNG},
    {"drop_last", "false", "drop an epoch's last partial batch", VL_KNOB_RUNG},
    {"consumer", "modeled", "modeled (an accelerator whose step takes consumer_ms, no CPU) or model (the real "
     "U-Net LoRA step at the run scale)", VL_KNOB_RUNG},
    {"consumer_ms", "1000", "the modeled accelerator's LoRA step on cached inputs at 512 px, batch 16 (scaled by "
     "planned FLOPs and the run scale's pixels)", VL_KNOB_RUNG},
    {"precision", "fp16", "frozen weights and activations: fp32, fp16 or bf16 (LoRA masters fp32)", VL_KNOB_RUNG},
    {"attention", "efficient", "attention: classic (materialised scores) or efficient (tiled)", VL_KNOB_RUNG},
    {"checkpoint", "false", "activation checkpointing per resnet and transformer block", VL_KNOB_RUNG},
    {"lora_rank", "8", "LoRA rank on to_q, to_k, to_v, to_out.0", VL_KNOB_RUNG},
    {"lora_alpha", "8", "LoRA alpha (scale alpha / rank)", VL_KNOB_RUNG},
    {"text_lora_rank", "0", "LoRA rank on the text encoder (0: frozen; needs cache = none)", VL_KNOB_RUNG},
    {"lr", "1e-4", "AdamW learning rate", VL_KNOB_RUNG},
    VL_CASE_CARD_KNOBS,
    {"card_48", "48GiB", "the second card the largest batch is planned for (RTX A6000)", VL_KNOB_SETTING},
    {"seed", "1", "seed of weights, data, order and noise", VL_KNOB_SETTING},
    {"images", "192", "captioned images at the run scale (at most 32 at tiny scale; made on first use)",
     VL_KNOB_SETTING},
    {"epochs", "2", "training epochs per rung and repetition after the pipeline-only pass (the last is reported)",
     VL_KNOB_SETTING},
    {"steps", "0", "at most this many steps per epoch (0: the whole epoch; epoch times are then projected)",
     VL_KNOB_SETTING},
    {"warmup", "1", "untimed steps at the start of each run", VL_KNOB_SETTING},
    {"data_dir", "data/captions", "where the captioned set is made and read", VL_KNOB_SETTING},
    {"cache_dir", "data/sd-cache", "where the latent and text-embedding caches are written", VL_KNOB_SETTING},
    {"cache_mismatch", "rebuild", "a cache built for another key: rebuild it, or error (stop naming the field)",
     VL_KNOB_SETTING},
    {"cores", "auto", "CPU cores workers = cores stands for (auto: this machine's)", VL_KNOB_SETTING},
    {"loss_steps", "3", "real U-Net steps of the with/without-cache loss comparison (0: skip it)", VL_KNOB_SETTING},
    {"loss_batch", "1", "images per step of the loss comparison", VL_KNOB_SETTING},
    {"loss_scale", "tiny", "scale of the loss comparison's real steps: tiny, small, full or run (the run scale; a "
     "small step takes ~10 s on a 2-core CPU)", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};

const char *vl_sdl_cache_name(vl_sdl_cache c) {
  return c == VL_SDL_CACHE_DISK ? "disk" : c == VL_SDL_CACHE_RAM ? "ram" : "none";
}

static vl_status parse_path(vl_case_env *env, const char *key, char *dst, size_t n) {
  const char *v = vl_knob_str(env->setting, key, vl_sdl_knobs);
  if (strlen(v) >= n)
    return vl_case_fail(env, VL_ERR_INVALID, "%s: path too long: %zu characters (limit %zu)", key, strlen(v), n - 1);
  snprintf(dst, n, "%s", v);
  return VL_OK;
}

/* The setting: the same for every rung. */
static vl_status parse_setting(vl_case_env *env, const char *scale, vl_sdl_rung *r) {
  const vl_knobs *s = env->setting;
  VL_TRY(vl_knob_int(s, "seed", vl_sdl_knobs, 0, 1L << 40, &r->seed, &env->err));
  VL_TRY(vl_knob_int(s, "images", vl_sdl_knobs, 4, 1 << 24, &r->images, &env->err));
  if (!strcasecmp(scale, "tiny") && r->images > 32) r->images = 32; /* CI runs in seconds */
  VL_TRY(vl_knob_int(s, "epochs", vl_sdl_knobs, 1, 1000, &r->epochs, &env->err));
  VL_TRY(vl_knob_int(s, "steps", vl_sdl_knobs, 0, 1000000, &r->steps, &env->err));
  VL_TRY(vl_knob_int(s, "warmup", vl_sdl_knobs, 0, 1000, &r->warmup, &env->err));
  VL_TRY(vl_knob_int(s, "loss_steps", vl_sdl_knobs, 0, 1000, &r->loss_steps, &env->err));
  VL_TRY(vl_knob_int(s, "loss_batch", vl_sdl_knobs, 1, 64, &r->loss_batch, &env->err));
  const char *ls = vl_knob_str(s, "loss_scale", vl_sdl_knobs);
  vl_sd_cfg probe;
  if (strcasecmp(ls, "run") && vl_sd_preset(ls, &probe))
    return vl_case_fail(env, VL_ERR_INVALID, "loss_scale = '%s': expected tiny, small, full or run", ls);
  snprintf(r->loss_scale, sizeof r->loss_scale, "%s", strcasecmp(ls, "run") ? ls : scale);
  VL_TRY(parse_path(env, "data_dir", r->data_dir, sizeof r->data_dir));
  VL_TRY(parse_path(env, "cache_dir", r->cache_dir, sizeof r->cache_dir));
  const char *m = vl_knob_str(s, "cache_mismatch", vl_sdl_knobs);
  if (!strcasecmp(m, "rebuild")) r->on_mismatch = VL_CACHE_REBUILD;
  else if (!strcasecmp(m, "error")) r->on_mismatch = VL_CACHE_STRICT;
  else return vl_case_fail(env, VL_ERR_INVALID, "cache_mismatch = '%s': expected rebuild or error", m);
  const char *nc = vl_knob_str(s, "cores", vl_sdl_knobs);
  if (!strcasecmp(nc, "auto")) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    r->cores = n > 0 ? n : 1;
  } else {
    VL_TRY(vl_knob_int(s, "cores", vl_sdl_knobs, 1, 4096, &r->cores, &env->err));
  }
  /* the second card: its own size, the rung's cap fraction, the same context */
  size_t c48;
  VL_TRY(vl_knob_bytes(s, "card_48", vl_sdl_knobs, &c48, &env->err));
  if (c48 <= r->card.context) return vl_case_fail(env, VL_ERR_INVALID, "card_48 must be larger than cuda_context");
  r->card48 = r->card;
  r->card48.card = c48;
  r->card48.cap = (size_t)((double)c48 * r->card.cap_fraction);
  if (r->card48.cap > c48 - r->card.context) r->card48.cap = c48 - r->card.context;
  return VL_OK;
}

/* The model: SD 1.5 at the scale, with the rung's precision, attention, LoRA and inputs. */
static vl_status parse_model(vl_case_env *env, const char *scale, const vl_knobs *k, vl_sdl_rung *r) {
  vl_sd_cfg *m = &r->model;
  if (vl_sd_preset(scale, m)) return vl_case_fail(env, VL_ERR_INVALID, "unknown scale '%s' (tiny, small, full)", scale);
  const char *p = vl_knob_str(k, "precision", vl_sdl_knobs);
  vl_dtype dt;
  if (vl_dtype_parse(p, &dt) || !vl_dtype_is_float(dt))
    return vl_case_fail(env, VL_ERR_INVALID, "precision = '%s': expected fp32, fp16 or bf16", p);
  vl_sd_set_precision(m, dt, dt);
  const char *a = vl_knob_str(k, "attention", vl_sdl_knobs);
  vl_attn_impl impl;
  if (vl_attn_impl_parse(a, &impl))
    return vl_case_fail(env, VL_ERR_INVALID, "attention = '%s': expected classic or efficient", a);
  m->unet.attn = m->vae.attn = m->clip.attn = impl;
  int b;
  VL_TRY(vl_knob_bool(k, "checkpoint", vl_sdl_knobs, &b, &env->err));
  m->unet.checkpoint = b;
  long v;
  VL_TRY(vl_knob_int(k, "lora_rank", vl_sdl_knobs, 1, 1024, &v, &env->err));
  m->unet.lora_rank = (int)v;
  double d;
  VL_TRY(vl_knob_double(k, "lora_alpha", vl_sdl_knobs, 1e-6, 1e6, &d, &env->err));
  m->unet.lora_alpha = (float)d;
  VL_TRY(vl_knob_double(k, "lr", vl_sdl_knobs, 1e-12, 10, &d, &env->err));
  m->optim.hp.lr = (float)d;
  m->encoders_in_step = r->cache == VL_SDL_CACHE_NONE;
  VL_TRY(vl_knob_int(k, "text_lora_rank", vl_sdl_knobs, 0, 1024, &v, &env->err));
  if (v > 0 && !m->encoders_in_step)
    return vl_case_fail(env, VL_ERR_INVALID,
                        "text_lora_rank = %ld trains the text encoder in the step: it needs cache = none "
                        "(cached text embeddings cannot be trained)", v);
  m->clip.lora_rank = (int)v;
  m->clip.lora_alpha = (float)v; /* alpha = rank, the scripts' default */
  return VL_OK;
}

/* The input pipeline and the consumer. */
static vl_status parse_pipeline(vl_case_env *env, const vl_knobs *k, vl_sdl_rung *r) {
  const char *c = vl_knob_str(k, "cache", vl_sdl_knobs);
  if (!strcasecmp(c, "none")) r->cache = VL_SDL_CACHE_NONE;
  else if (!strcasecmp(c, "disk")) r->cache = VL_SDL_CACHE_DISK;
  else if (!strcasecmp(c, "ram")) r->cache = VL_SDL_CACHE_RAM;
  else return vl_case_fail(env, VL_ERR_INVALID, "cache = '%s': expected none, disk or ram", c);
  const char *st = vl_knob_str(k, "cache_store", vl_sdl_knobs);
  if (!strcasecmp(st, "moments")) r->store = VL_CACHE_MOMENTS;
  else if (!strcasecmp(st, "sample")) r->store = VL_CACHE_SAMPLE;
  else return vl_case_fail(env, VL_ERR_INVALID, "cache_store = '%s': expected moments or sample", st);
  const char *cd = vl_knob_str(k, "cache_dtype", vl_sdl_knobs);
  if (vl_dtype_parse(cd, &r->cache_dtype) || (r->cache_dtype != VL_F16 && r->cache_dtype != VL_F32))
    return vl_case_fail(env, VL_ERR_INVALID, "cache_dtype = '%s': expected fp16 or fp32", cd);
  const char *w = vl_knob_str(k, "workers", vl_sdl_knobs);
  if (!strcasecmp(w, "cores")) r->workers = r->cores; /* the article's 8 processes on its CPU */
  else VL_TRY(vl_knob_int(k, "workers", vl_sdl_knobs, 0, VL_LOADER_WORKERS_MAX, &r->workers, &env->err));
  VL_TRY(vl_knob_int(k, "prefetch", vl_sdl_knobs, 1, 64, &r->prefetch, &env->err));
  VL_TRY(vl_knob_bool(k, "batched", vl_sdl_knobs, &r->batched, &env->err));
  VL_TRY(vl_knob_bool(k, "drop_last", vl_sdl_knobs, &r->drop_last, &env->err));
  const char *bs = vl_knob_str(k, "batch", vl_sdl_knobs);
  if (!strcasecmp(bs, "max")) r->batch = 0;
  else VL_TRY(vl_knob_int(k, "batch", vl_sdl_knobs, 1, 1 << 16, &r->batch, &env->err));
  VL_TRY(vl_knob_int(k, "accum", vl_sdl_knobs, 1, 4096, &r->accum, &env->err));
  const char *cs = vl_knob_str(k, "consumer", vl_sdl_knobs);
  if (!strcasecmp(cs, "modeled")) r->consumer = VL_SDL_MODELED;
  else if (!strcasecmp(cs, "model")) r->consumer = VL_SDL_MODEL;
  else return vl_case_fail(env, VL_ERR_INVALID, "consumer = '%s': expected modeled or model", cs);
  VL_TRY(vl_knob_double(k, "consumer_ms", vl_sdl_knobs, 0, 1e7, &r->consumer_ms, &env->err));
  return VL_OK;
}

vl_status vl_sdl_parse_rung(vl_case_env *env, const char *scale, const vl_knobs *k, vl_sdl_rung *r) {
  memset(r, 0, sizeof *r);
  VL_TRY(vl_case_card_parse(env, k, &r->card));
  VL_TRY(parse_setting(env, scale, r));
  VL_TRY(parse_pipeline(env, k, r));
  return parse_model(env, scale, k, r);
}

vl_step_spec vl_sdl_step_spec(const vl_sdl_rung *r, int64_t B) {
  vl_step_spec s = {.type = &vl_model_sd, .cfg = &r->model, .seed = (uint64_t)r->seed, .batch = {0}, .accum = r->accum};
  vl_step_spec_set_batch(&s, B);
  return s;
}

int64_t vl_sdl_max_batch(const vl_sdl_rung *r, size_t cap) {
  vl_step_spec s = vl_sdl_step_spec(r, 1);
  return vl_run_max_batch(&s, cap, 1);
}

static vl_status plan_flops(vl_case_env *env, const vl_step_spec *s, double *flops) {
  vl_plan_result p;
  vl_run_plan(s, VL_NO_CAP, VL_DEV_CUDA, false, &p);
  vl_status st = p.status;
  if (st != VL_OK) vl_case_fail(env, st, "planning the step's FLOPs: %s", p.err);
  *flops = p.flops + p.flops_recompute;
  vl_plan_result_free(&p);
  return st;
}

vl_status vl_sdl_step_flops(vl_case_env *env, const vl_sdl_rung *full, int64_t B, double *flops, double *ref) {
  vl_step_spec s = vl_sdl_step_spec(full, B);
  VL_TRY(plan_flops(env, &s, flops));
  vl_sdl_rung r = *full;
  r.model.encoders_in_step = false;
  r.model.clip.lora_rank = 0;
  r.model.unet.checkpoint = false;
  r.accum = 1;
  vl_step_spec rs = vl_sdl_step_spec(&r, VL_SDL_REF_BATCH);
  return plan_flops(env, &rs, ref);
}

vl_status vl_sdl_modeled_s_per_image(vl_case_env *env, const vl_knobs *k, const char *scale, int64_t B,
                                     double *out) {
  vl_sdl_rung full, run;
  VL_TRY(vl_sdl_parse_rung(env, "full", k, &full));
  VL_TRY(vl_sdl_parse_rung(env, scale, k, &run));
  double f, ref;
  VL_TRY(vl_sdl_step_flops(env, &full, B, &f, &ref));
  double px = (double)vl_sd_image_side(&run.model) / (double)vl_sd_image_side(&full.model);
  /* per image: the rung's step over accum micro-batches of B, against the reference's 16 */
  double per_image = f / (double)(B * full.accum), ref_per_image = ref / VL_SDL_REF_BATCH;
  *out = full.consumer_ms / 1e3 / VL_SDL_REF_BATCH * (per_image / ref_per_image) * px * px;
  return VL_OK;
}

vl_status vl_sdl_run_batch(vl_case_env *env, const vl_knobs *k, const vl_sdl_rung *r, int64_t *B) {
  *B = r->batch;
  if (*B == 0) { /* "max": the planner's answer at full scale */
    vl_sdl_rung full;
    VL_TRY(vl_sdl_parse_rung(env, "full", k, &full));
    int64_t mb = vl_sdl_max_batch(&full, full.card.cap);
    *B = mb > 0 ? mb : 1;
  }
  long cap = r->images / (2 * r->accum); /* two steps an epoch at least */
  if (*B > cap) *B = cap > 0 ? cap : 1;
  return VL_OK;
}

vl_mimic_sd_unet_cfg vl_sdl_mimic_cfg(const vl_sdl_rung *r, int64_t batch, vl_mimic_device dev) {
  return (vl_mimic_sd_unet_cfg){.model = r->model.unet, .encoders_in_step = r->model.encoders_in_step,
                                .vae = r->model.vae, .text = r->model.clip, .optim = r->model.optim.opt,
                                .clip = r->model.clip_norm, .batch = batch, .accum = r->accum, .steps = 2,
                                .device = dev};
}
