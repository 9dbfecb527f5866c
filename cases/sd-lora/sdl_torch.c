/* sd-lora beside its PyTorch peer (tools/peers/sd_lora_peer.py: diffusers' UNet2DConditionModel
 * at the engine's scale with PEFT LoRA on to_q/to_k/to_v/to_out.0, the noise-prediction MSE
 * step of train_text_to_image_lora.py). The extra hook runs three rungs' steps, engine and
 * PyTorch in turn (kit/peers.c), each rung in a fresh peer process: before (no cache: the
 * frozen VAE encoder and CLIP text encoder run in every step on both sides, diffusers'
 * AutoencoderKL and transformers' CLIPTextModel at the scale: cheap at tiny and small),
 * disk_cache (the same batch on cached latents and text embeddings: the U-Net step alone)
 * and prefetch16 (batch 16). The other rungs differ from these in the data path only
 * (workers, batched collate, RAM or disk reads), which PyTorch's step has no part in: their
 * peer setups are the same (`vramlab peer-config` prints them, the MemTracker fixture marks
 * them same_config_as). Every rung's consumer here is the real U-Net step, whatever the
 * rung's `consumer` (the ladder's modeled accelerator has no PyTorch counterpart). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kit/peers.h"
#include "kit/rep.h"
#include "sdl.h"
#include "sdl_torch.h"

static const vl_peer_kind kind = {"sd_lora_peer.py", "pip install torch diffusers transformers peft", "images",
                                  true};
/* fewer rounds than llm-lora's and seg-ckpt's: a small-scale step takes seconds on each side */
static const vl_peer_rounds rounds = {1, 1, 4, 1};
static const char *const compared[] = {"before", "disk_cache", "prefetch16"};

/* A half-precision rung PyTorch has no fast CPU kernels for: fp32 on both sides (set in k),
 * and why; NULL when it runs as it is. */
static const char *half_variant(vl_case_env *env, vl_knobs *k, const cJSON *hello, vl_status *s) {
  const char *c = vl_knob_str(k, "precision", vl_sdl_knobs);
  bool f16 = !strcasecmp(c, "fp16"), b16 = !strcasecmp(c, "bf16");
  if ((!f16 && !b16) || cJSON_IsTrue(cJSON_GetObjectItem(hello, f16 ? "fp16_fast" : "bf16_fast"))) return NULL;
  *s = vl_knob_set_err(k, "precision", "fp32", &env->err);
  return f16 ? "frozen weights and activations in fp32 on both sides: PyTorch has no fast fp16 kernels on this "
               "CPU (oneDNN's need AVX512-FP16 or AMX-FP16), so its fp16 step would time reference loops"
             : "frozen weights and activations in fp32 on both sides: PyTorch has no fast bf16 kernels on this CPU";
}

static cJSON *int_array(const int64_t *v, int n) {
  double d[8];
  for (int i = 0; i < n && i < 8; i++) d[i] = (double)v[i];
  return cJSON_CreateDoubleArray(d, n < 8 ? n : 8);
}

static cJSON *bool_array(const bool *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateBool(v[i]));
  return a;
}

/* The peer's config: the engine's SD models and training config at this batch. */
static cJSON *setup_json(const vl_sdl_rung *r, vl_device dev, int threads, int64_t B) {
  const vl_sd_cfg *sd = &r->model;
  const vl_sd_unet_cfg *u = &sd->unet;
  cJSON *s = cJSON_CreateObject();
  cJSON_AddStringToObject(s, "device", dev == VL_DEV_CUDA ? "cuda" : "cpu");
  cJSON_AddNumberToObject(s, "threads", threads);
  cJSON_AddNumberToObject(s, "seed", (double)r->seed);
  cJSON_AddNumberToObject(s, "batch", (double)B);
  cJSON *m = cJSON_AddObjectToObject(s, "model");
  cJSON *un = cJSON_AddObjectToObject(m, "unet");
  cJSON_AddNumberToObject(un, "in_ch", (double)u->in_ch);
  cJSON_AddNumberToObject(un, "out_ch", (double)u->out_ch);
  cJSON_AddItemToObject(un, "block_out_channels", int_array(u->ch, u->n_blocks));
  cJSON_AddItemToObject(un, "down_attn", bool_array(u->down_attn, u->n_blocks));
  cJSON_AddItemToObject(un, "up_attn", bool_array(u->up_attn, u->n_blocks));
  cJSON_AddNumberToObject(un, "layers", u->layers);
  cJSON_AddNumberToObject(un, "heads", (double)u->heads);
  cJSON_AddNumberToObject(un, "groups", (double)u->groups);
  cJSON_AddNumberToObject(un, "norm_eps", u->norm_eps);
  cJSON_AddNumberToObject(un, "sample", (double)u->sample);
  cJSON_AddNumberToObject(un, "ctx_len", (double)u->ctx_len);
  cJSON_AddNumberToObject(un, "ctx_dim", (double)u->ctx_dim);
  cJSON_AddBoolToObject(m, "encoders_in_step", sd->encoders_in_step);
  if (sd->encoders_in_step) { /* the frozen encoders run in the step: their sizes */
    const vl_sd_vae_cfg *v = &sd->vae;
    cJSON *vo = cJSON_AddObjectToObject(m, "vae");
    cJSON_AddItemToObject(vo, "block_out_channels", int_array(v->ch, v->n_levels));
    cJSON_AddNumberToObject(vo, "layers_per_block", v->layers_per_block);
    cJSON_AddNumberToObject(vo, "groups", (double)v->groups);
    cJSON_AddNumberToObject(vo, "latent_ch", (double)v->latent_ch);
    cJSON_AddBoolToObject(vo, "mid_attn", v->mid_attn);
    cJSON_AddNumberToObject(vo, "eps", v->eps);
    cJSON_AddNumberToObject(vo, "scale", v->scale);
    cJSON_AddNumberToObject(vo, "image", (double)v->image);
    const vl_sd_clip_cfg *c = &sd->clip;
    cJSON *co = cJSON_AddObjectToObject(m, "clip");
    cJSON_AddNumberToObject(co, "vocab", (double)c->vocab);
    cJSON_AddNumberToObject(co, "dim", (double)c->dim);
    cJSON_AddNumberToObject(co, "layers", (double)c->n_layers);
    cJSON_AddNumberToObject(co, "heads", (double)c->n_heads);
    cJSON_AddNumberToObject(co, "ffn", (double)c->ffn);
    cJSON_AddNumberToObject(co, "n_pos", (double)c->n_pos);
    cJSON_AddNumberToObject(co, "eps", c->eps);
  }
  cJSON *t = vl_peer_train_json(&sd->optim, sd->clip_norm, r->accum, u->acts);
  cJSON_AddStringToObject(t, "frozen", vl_dtype_name(u->weights));
  cJSON_AddStringToObject(t, "attention", vl_attn_impl_name(u->attn));
  cJSON_AddNumberToObject(t, "lora_rank", u->lora_rank);
  cJSON_AddNumberToObject(t, "lora_alpha", u->lora_alpha);
  cJSON_AddBoolToObject(t, "checkpoint", u->checkpoint);
  cJSON_AddNumberToObject(t, "text_lora_rank", sd->clip.lora_rank);
  cJSON_AddItemToObject(s, "train", t);
  return s;
}

/* NULL, or why no peer runs the rung. */
static const char *skip_why(const vl_sdl_rung *r) {
  if (r->batch == 0) return "batch = max is compared only at a fixed batch";
  if (r->model.clip.lora_rank > 0) return "LoRA on the text encoder: the peer trains the U-Net's LoRA only";
  return NULL;
}

vl_status vl_sdl_peer_config(vl_case_env *env, const vl_knobs *k, int threads, cJSON *out) {
  vl_sdl_rung r;
  VL_TRY(vl_sdl_parse_rung(env, env->scale, k, &r));
  cJSON_AddStringToObject(out, "script", kind.script);
  const char *skip = skip_why(&r);
  if (skip) cJSON_AddStringToObject(out, "not_measured", skip);
  else cJSON_AddItemToObject(out, "config", setup_json(&r, env->device, threads, r.batch));
  return VL_OK;
}

/* Random inputs of the rung's step (the peer draws its own of the same shapes). */
static void fill_micro(const vl_sd_cfg *m, int64_t B, uint64_t seed, vl_sdl_micro *mb) {
  vl_rng g;
  vl_rng_seed(&g, seed);
  int64_t nl = B * m->vae.latent_ch * m->unet.sample * m->unet.sample, side = vl_sd_image_side(m);
  if (m->encoders_in_step) {
    for (int64_t i = 0; i < B * 3 * side * side; i++) mb->images[i] = (float)(2 * vl_rng_uniform(&g) - 1);
    for (int64_t i = 0; i < nl; i++) mb->vae_eps[i] = vl_rng_normal(&g);
    for (int64_t i = 0; i < B * m->unet.ctx_len; i++) mb->tokens[i] = (int32_t)vl_rng_below(&g, (uint64_t)m->clip.vocab);
  } else {
    for (int64_t i = 0; i < nl; i++) mb->latents[i] = vl_rng_normal(&g);
    for (int64_t i = 0; i < B * m->unet.ctx_len * m->unet.ctx_dim; i++) mb->context[i] = vl_rng_normal(&g);
  }
  for (int64_t i = 0; i < nl; i++) mb->noise[i] = vl_rng_normal(&g);
  for (int64_t i = 0; i < B; i++) {
    mb->t[i] = (int32_t)vl_rng_below(&g, VL_DDPM_STEPS);
    mb->index[i] = i;
  }
  mb->n = B;
  vl_sdl_micro_bind(m, mb);
}

/* The mimic of the peer's own step (the code path of the real run on `dev`, vramlab/mimic.h)
 * at this batch: its prediction beside what the peer measures. */
static void mimic_json(const vl_sdl_rung *r, int64_t B, vl_device dev, const cJSON *hello, cJSON *o) {
  vl_mimic_sd_unet_cfg c = vl_sdl_mimic_cfg(r, B, dev == VL_DEV_CUDA ? VL_MIMIC_CUDA : VL_MIMIC_CPU);
  c.cuda_cc_major = vl_peer_cuda_cc_major(hello); /* sizes cuBLAS's workspaces */
  vl_mimic_result m;
  char why[200];
  vl_status s = vl_mimic_sd_unet(&c, &m, NULL, NULL, why, sizeof why);
  /* MemTracker's terms (CPU): on fake tensors F.mse_loss's output is a storage of its own */
  vl_mimic_result fake;
  c.traced = true;
  bool cpu = s == VL_OK && dev != VL_DEV_CUDA && vl_mimic_sd_unet(&c, &fake, NULL, NULL, why, sizeof why) == VL_OK;
  vl_case_peer_mimic_json(o, s, &m, cpu ? &fake : NULL, why, dev == VL_DEV_CUDA);
}

static vl_status compare_rung(vl_case_env *env, vl_peer *p, const cJSON *hello, const cJSON *rung, int threads,
                              cJSON *o) {
  const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(rung, "name"));
  vl_knobs k;
  VL_TRY(vl_case_knobs_of(env, rung, &k));
  vl_status s = VL_OK;
  const char *variant = half_variant(env, &k, hello, &s);
  VL_TRY(s);
  vl_sdl_rung r;
  VL_TRY(vl_sdl_parse_rung(env, env->scale, &k, &r));
  const char *skip = skip_why(&r);
  if (skip) {
    cJSON_AddStringToObject(o, "rung", name);
    cJSON_AddStringToObject(o, "not_measured", skip);
    return VL_OK;
  }
  int64_t B = r.batch;
  vl_step_spec spec = vl_sdl_step_spec(&r, B);
  vl_sdl_micro mb;
  s = vl_sdl_micro_alloc(&r.model, B, &mb);
  if (s != VL_OK) {
    s = vl_peer_engine_failed(env, s, NULL, name, o);
  } else {
    fill_micro(&r.model, B, (uint64_t)r.seed + 1000, &mb);
    cJSON *setup = setup_json(&r, env->device, threads, B);
    vl_peer_cmp cmp = {name, variant, NULL, NULL, &mb.batch, r.accum, (double)(B * r.accum), &spec, setup};
    s = vl_peer_compare_model(env, p, &cmp, &rounds, &vl_model_sd, &r.model, (uint64_t)r.seed, o);
    if (s == VL_OK && !cJSON_GetObjectItem(o, "not_measured"))
      mimic_json(&r, B, env->device, hello, o);
    cJSON_AddNumberToObject(o, "batch", (double)B);
    cJSON_AddNumberToObject(o, "image", (double)vl_sd_image_side(&r.model));
    cJSON_AddBoolToObject(o, "encoders_in_step", r.model.encoders_in_step);
    cJSON_Delete(setup);
  }
  vl_sdl_micro_free(&mb);
  return s;
}

/* The rung's step on MemTracker's terms (vl_peer_fake_mimic_fn): PyTorch's CPU code path at the
 * rung's batch, F.mse_loss's output a storage of its own as on fake tensors. */
static vl_status fake_mimic(vl_case_env *env, const vl_knobs *k, vl_mimic_result *m, char *why, size_t n) {
  vl_sdl_rung r;
  vl_status s = vl_sdl_parse_rung(env, env->scale, k, &r);
  const char *skip = s == VL_OK ? skip_why(&r) : NULL;
  if (s != VL_OK || skip) {
    snprintf(why, n, "%s", s != VL_OK ? env->err.msg : skip);
    return s != VL_OK ? s : VL_ERR_INVALID;
  }
  vl_mimic_sd_unet_cfg c = vl_sdl_mimic_cfg(&r, r.batch, VL_MIMIC_CPU);
  c.traced = true;
  return vl_mimic_sd_unet(&c, m, NULL, NULL, why, n);
}

vl_status vl_sdl_full_scale(vl_case_env *env, cJSON *res, const char *scale) {
  return vl_peer_full_scale(env, res, scale, vl_sdl_peer_config, fake_mimic);
}

vl_status vl_sdl_peers(vl_case_env *env, cJSON *res) {
  return vl_peer_side_by_side(env, res, &kind, &rounds, compared, (int)(sizeof compared / sizeof *compared),
                              compare_rung);
}

void vl_sdl_peers_report(const cJSON *res, FILE *md) {
  vl_peer_report(res, md, &kind,
                 "What is compared: the training step of each rung on one fixed batch, whatever the rung's "
                 "consumer (the ladder's modeled accelerator has no PyTorch counterpart), so the rungs that differ "
                 "only in their data path (workers, collate, disk or RAM reads) are not compared again: their "
                 "step is before's or prefetch16's. In before the frozen VAE encoder and CLIP text encoder run in "
                 "every step on both sides (diffusers' AutoencoderKL, decoder removed, and transformers' "
                 "CLIPTextModel at the scale, under no_grad); disk_cache is the same batch on cached latents and "
                 "text embeddings. What differs by construction: the engine's U-Net keeps nothing for backward "
                 "before the first transformer with LoRA (conv_in and the first resnet run forward only) and "
                 "computes no input gradient of that transformer, which autograd also skips (no tensor before it "
                 "requires a gradient); the VAE's sample noise is the batch's on the "
                 "engine's side and drawn per step by `latent_dist.sample()` on PyTorch's; LoRA A is N(0, 1/r²) "
                 "on both sides (peft's \"gaussian\" init), B = 0.");
}
