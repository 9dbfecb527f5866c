/* sd-lora: Stable Diffusion 1.5 LoRA with latent caching (docs/cases.md §3). Memory, FLOPs, fit
 * and the largest batch on a 24 GB and a 48 GB card are planned at full scale (SD 1.5's
 * U-Net, VAE encoder and CLIP text encoder exactly, 512x512); the input pipeline (decode,
 * resize, crop and the encoders in every step, or cache files read each step, from disk or
 * RAM) runs for real at the run scale on a synthetic captioned set, feeding a modeled
 * accelerator or the real U-Net LoRA step (run.c). Knobs: config.c; data: data.c,
 * latents.c, feed.c; the case-wide measurements: losscmp.c. This file holds the plan, the
 * check and the case itself. */
#include "sdl.h"
#include "sdl_torch.h"

/* Peak memory of the step at batches 1..64 with the given attention (pairs [batch, bytes]). */
static cJSON *curve(const vl_sdl_rung *r, vl_attn_impl impl) {
  static const int64_t bs[VL_SDL_CURVE_N] = {1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64};
  vl_sdl_rung q = *r;
  q.model.unet.attn = q.model.vae.attn = q.model.clip.attn = impl;
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < VL_SDL_CURVE_N; i++) {
    vl_plan_result p;
    vl_step_spec s = vl_sdl_step_spec(&q, bs[i]);
    vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &p);
    if (p.status == VL_OK)
      cJSON_AddItemToArray(a, cJSON_CreateDoubleArray((double[2]){(double)bs[i], (double)p.mem.peak_total}, 2));
    vl_plan_result_free(&p);
  }
  return a;
}

static void plan_extra_json(vl_case_env *env, const vl_sdl_rung *r, int64_t B, int64_t mb48, cJSON *out) {
  cJSON_AddBoolToObject(out, "encoders_in_step", r->model.encoders_in_step);
  cJSON_AddNumberToObject(out, "card_48_bytes", (double)r->card48.card);
  cJSON_AddNumberToObject(out, "cap_48_bytes", (double)r->card48.cap);
  cJSON_AddNumberToObject(out, "max_batch_48", (double)mb48);
  cJSON_AddItemToObject(out, "batch_curve", curve(r, r->model.unet.attn));
  cJSON_AddItemToObject(out, "batch_curve_classic", curve(r, VL_ATTN_CLASSIC));
  cJSON_AddItemToObject(out, "batch_curve_efficient", curve(r, VL_ATTN_EFFICIENT));
  double f, ref;
  if (vl_sdl_step_flops(env, r, B, &f, &ref) == VL_OK) {
    /* the modeled accelerator at full scale: consumer_ms for the reference's 16 images */
    cJSON_AddNumberToObject(out, "modeled_step_s", r->consumer_ms / 1e3 * f / ref);
    cJSON_AddNumberToObject(out, "flops_per_image", f / (double)(B * r->accum));
  }
  if (r->cache == VL_SDL_CACHE_NONE) return;
  uint64_t lat, text;
  vl_sdl_cache_bytes_full(r->store, r->cache_dtype, 50000, &lat, &text);
  cJSON_AddNumberToObject(out, "cache_latent_bytes_50k", (double)lat);
  cJSON_AddNumberToObject(out, "cache_text_bytes_50k", (double)text);
  cJSON_AddNumberToObject(out, "cache_bytes_50k", (double)(lat + text));
}

/* the mimic of sd_lora_peer.py's step on CUDA (vl_case_pytorch_json's run) */
static vl_status mimic_cuda(const void *cfg, int64_t batch, uint64_t capacity, vl_mimic_result *m, char *why,
                            size_t whyn) {
  const vl_sdl_rung *r = cfg;
  vl_mimic_sd_unet_cfg c = vl_sdl_mimic_cfg(r, batch, VL_MIMIC_CUDA);
  c.capacity = capacity;
  return vl_mimic_sd_unet(&c, m, NULL, NULL, why, whyn);
}

static vl_status sdl_plan(vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out) {
  vl_sdl_rung r;
  VL_TRY(vl_sdl_parse_rung(env, scale, k, &r));
  double t0 = vl_now();
  int64_t mb = vl_sdl_max_batch(&r, r.card.cap);
  double t_search = vl_now() - t0;
  int64_t mb48 = vl_sdl_max_batch(&r, r.card48.cap);
  int64_t B = r.batch ? r.batch : mb > 0 ? mb : 1;
  vl_step_spec spec = vl_sdl_step_spec(&r, B);
  vl_plan_result p;
  double t1 = vl_now();
  vl_run_plan(&spec, VL_NO_CAP, VL_DEV_CUDA, false, &p);
  double t_plan = vl_now() - t1;
  if (p.status != VL_OK) {
    vl_status s = vl_case_fail(env, p.status, "planning failed: %s", p.err);
    vl_plan_result_free(&p);
    return s;
  }
  vl_case_plan_json(out, scale, &p, B, r.accum);
  cJSON *pm = cJSON_AddObjectToObject(out, "params_by_module");
  for (int i = 0; i < p.params.n_modules; i++)
    cJSON_AddNumberToObject(pm, p.params.module_name[i], (double)p.params.module_count[i]);
  cJSON_AddStringToObject(out, "attention", vl_attn_impl_name(r.model.unet.attn));
  cJSON_AddNumberToObject(out, "latent_side", (double)r.model.unet.sample);
  cJSON_AddNumberToObject(out, "image_side", (double)vl_sd_image_side(&r.model));
  cJSON_AddNumberToObject(out, "bytes_moved_per_step", p.bytes_moved);
  vl_case_fit_json(out, &r.card, vl_run_fits(&spec, r.card.cap), mb, t_plan, t_search);
  vl_plan_result_free(&p);
  vl_case_pytorch_json(out, mimic_cuda, &r, B, r.card.cap,
                       "diffusers UNet2DConditionModel + PEFT LoRA + torch.autocast + AdamW on CUDA (mimic)");
  plan_extra_json(env, &r, B, mb48, out);
  return VL_OK;
}

/* Every knob of a rung and the setting, without planning or running. */
static vl_status sdl_check(vl_case_env *env, const vl_knobs *k) {
  vl_sdl_rung r;
  return vl_sdl_parse_rung(env, env->scale, k, &r);
}

/* What plan, run and extra write (top level of a rung's plan or run, or case_metrics). */
static const char *const metrics[] = {
    "params_total", "params_trainable", "batch", "accum", "effective_batch", "peak_bytes", "reserved_bytes",
    "weight_bytes", "acts_bytes", "flops_per_step", "flops_recompute", "bytes_moved_per_step", "latent_side",
    "image_side", "card_bytes", "cap_bytes", "cuda_context_bytes", "fits", "max_batch", "max_batch_at_search_limit",
    "plan_seconds", "max_batch_search_seconds", "card_48_bytes", "cap_48_bytes", "max_batch_48", "modeled_step_s",
    "flops_per_image", "cache_latent_bytes_50k", "cache_text_bytes_50k", "cache_bytes_50k", "oom", "images_per_s",
    "model_flops_per_step", "flops_per_s", "measured_peak_bytes", "planned_peak_bytes", "plan_matches_measured",
    "load_s_per_batch", "producer_s_per_batch", "encode_s_per_batch", "inputs_s_per_batch", "step_seconds",
    "modeled_s_per_image", "epoch_s", "epoch_wall_s", "step_wall_s", "data_wait_share", "accel_util",
    "wait_s_per_batch", "host_bytes_bound", "cache_disk_bytes", "cache_ram_bytes", "cache_open_s", "payoff_epochs",
    "cache_build_s", "cache_build_s_modeled", "payoff_epochs_cpu_build", "loss_max_rel_diff_moments", "loss_max_rel_diff_sample",
    "latent_epoch_change_moments", "latent_epoch_change_sample", "encoders_in_step", "workers", "prefetch",
    "consumer_ms", "images", "batches_per_epoch", "steps_per_epoch", "cache_latent_disk_bytes",
    "cache_text_disk_bytes", "cache_records", "cache_bytes_match_format", "encode_modeled_s_per_image",
    /* the extra hook's PyTorch side by side (sdl_torch.c), on the compared rungs' first runs */
    "peer_step_seconds", "speedup_vs_torch", "peer_peak_bytes", NULL};

/* After the ladder: the cache's cost and the loss with and without it (losscmp.c), then the
 * compared rungs' steps beside PyTorch (sdl_torch.c). */
static vl_status sdl_extra(vl_case_env *env, cJSON *res) {
  VL_TRY(vl_sdl_extra(env, res));
  VL_TRY(vl_sdl_peers(env, res));
  return vl_sdl_full_scale(env, res, "full");
}

static const char *const scales[] = {"tiny", "small", "full", NULL};

const vl_case vl_case_sd_lora = {
    .id = "sd-lora",
    .summary = "Stable Diffusion 1.5 LoRA, 512x512 on 24 GB: per-sample preprocessing and encoders in the step -> "
               "batched workers -> latent + text caches on disk -> parallel reads, batch 16 -> cache in RAM -> "
               "largest batch",
    .knobs = vl_sdl_knobs,
    .scales = scales,
    .metrics = metrics,
    .check = sdl_check,
    .plan = sdl_plan,
    .run = vl_sdl_run,
    .extra = sdl_extra,
    .peer_config = vl_sdl_peer_config,
    .method = "Memory, FLOPs, fit and the largest batch on 24 GB and 48 GB cards are **planned at full scale** "
              "(SD 1.5's U-Net, VAE encoder and CLIP text encoder exactly, 512x512) by the plan backend, which "
              "runs the exact allocation sequence of a training step through the same arena algorithm as a real "
              "run, with a CUDA card's workspace rules; an uncached rung's step runs the VAE and text encoders "
              "too. The input pipeline runs **for real at the run scale** on a synthetic captioned JPEG set "
              "(decode, SD's resize and crop, or the cache files: every byte read, every record's CRC checked, "
              "the latents sampled from their moments per step). Its consumer is, per rung, the real U-Net LoRA "
              "step at the run scale or a **modeled accelerator** (a step of planned duration, no CPU).",
    .report = vl_sd_lora_report,
};
