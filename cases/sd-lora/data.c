/* sd-lora's data: the synthetic captioned set (made on first use at the run scale's image
 * side), captions as the scale's text encoder takes them, the per-sample random draws every
 * pipeline shares, the VAE's Gaussian sample on the host, and the loader's config. */
#include <stdio.h>
#include <string.h>

#include "sdl.h"

vl_status vl_sdl_open_set(vl_case_env *env, const vl_sdl_rung *r, vl_captions **out) {
  int64_t side = vl_sd_image_side(&r->model);
  char dir[VL_KNOB_VAL_LEN + 96]; /* data_dir + the set's folder name: cannot be cut */
  int dn = snprintf(dir, sizeof dir, "%s/s%lld-n%ld-seed%ld", r->data_dir, (long long)side, r->images, r->seed);
  if (dn < 0 || (size_t)dn >= sizeof dir)
    return vl_case_fail(env, VL_ERR_INVALID, "data_dir: path too long (limit %zu)", sizeof dir - 1);
  vl_captions_gen_cfg g;
  vl_captions_gen_cfg_default(&g);
  g.n = r->images;
  g.size = (int)side; /* short sides side*3/4 .. side*5/4: resize and crop are real work */
  g.seed = (uint64_t)r->seed;
  g.progress = vl_case_gen_progress;
  /* made only in a new or empty folder: a damaged or foreign one is refused, never
   * overwritten */
  vl_err m = {""};
  bool make = false;
  if (vl_captions_first_use(out, dir, &g, &make, &m) != VL_OK) return vl_case_fail(env, VL_ERR_IO, "%s", m.msg);
  if (!make) return VL_OK;
  vl_progress("generating %ld captioned images (short side %lld..%lld) in %s", r->images,
              (long long)(side * 3 / 4), (long long)(side * 5 / 4), dir);
  if (vl_captions_generate(dir, &g, &m) || vl_captions_open(out, dir, &m))
    return vl_case_fail(env, VL_ERR_IO, "%s", m.msg);
  return VL_OK;
}

void vl_sdl_tokens(const vl_captions *set, const vl_sd_cfg *m, int64_t i, int32_t *ids) {
  int32_t full[VL_CLIP_CONTEXT];
  vl_captions_tokens(set, i, full);
  int64_t L = m->clip.n_pos < VL_CLIP_CONTEXT ? m->clip.n_pos : VL_CLIP_CONTEXT;
  /* full scale: CLIP's ids as they are; reduced scales have a smaller vocabulary */
  for (int64_t j = 0; j < L; j++) ids[j] = (int32_t)(full[j] % (int32_t)m->clip.vocab);
}

void vl_sdl_draw(uint64_t seed, int64_t epoch, int64_t index, int64_t n_lat, float *vae_eps, float *noise,
                 int32_t *t) {
  vl_rng g;
  vl_rng_seed(&g, vl_mix64(seed * 0x9E3779B97F4A7C15ull ^ vl_mix64((uint64_t)epoch * 1000003u + (uint64_t)index)));
  *t = (int32_t)vl_rng_below(&g, VL_DDPM_STEPS);
  for (int64_t i = 0; i < n_lat; i++) noise[i] = vl_rng_normal(&g);
  /* the VAE's eps last, from its own stream: a pipeline that needs none draws the same
   * noise and timestep */
  if (!vae_eps) return;
  vl_rng_seed(&g, vl_mix64(seed ^ 0x56414545ull) ^ vl_mix64((uint64_t)epoch * 7919u + (uint64_t)index));
  for (int64_t i = 0; i < n_lat; i++) vae_eps[i] = vl_rng_normal(&g);
}

void vl_sdl_sample(const float *moments, const float *eps, int64_t C, int64_t hw, float scale, float *z) {
  vl_sd_vae_sample_host(z, moments, eps, C, hw, scale, C * hw);
}

void vl_sdl_loader_cfg(const vl_sdl_rung *r, vl_loader_cfg *lc, int64_t B, int workers, bool shuffle) {
  vl_loader_cfg_default(lc);
  lc->batch = B;
  lc->workers = workers;
  lc->prefetch = (int)r->prefetch;
  lc->persistent = true;
  lc->batched_collate = r->batched;
  lc->drop_last = r->drop_last;
  lc->shuffle = shuffle;
  lc->seed = (uint64_t)r->seed;
  lc->crop = (int)vl_sd_image_side(&r->model);
  lc->transform = VL_TF_SD;
  lc->sd_random_crop = false; /* center crop: the cache holds what every epoch sees */
  lc->sd_flip = false;        /* flip disabled: a cache of one variant per image */
}
