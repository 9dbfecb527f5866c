/* Parameter tables of the Stable Diffusion models (sd_encoders.h): frozen vl_params named by
 * their PyTorch state_dict keys, with PyTorch shapes, lookup by name, counts and a seeded
 * initialisation. Shared by the VAE encoder (sd_vae.c) and the text encoder (sd_clip.c). */
#include "vramlab/sd_encoders.h"

#include <stdlib.h>
#include <string.h>

vl_status vl_sd_params_add(vl_ctx *c, vl_sd_params *t, const char *name, const vl_sd_pinfo *info,
                           vl_dtype dtype) {
  if (strlen(name) >= sizeof t->p[0].name)
    return vl_fail(c, VL_ERR_INVALID, "parameter name too long: %s", name);
  if (info->ndim < 1 || info->ndim > VL_MAX_DIMS)
    return vl_fail(c, VL_ERR_INVALID, "%s: %d dims", name, info->ndim);
  int64_t cols = 1;
  for (int i = 1; i < info->ndim; i++) cols *= info->d[i];
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 64;
    vl_param *np = realloc(t->p, (size_t)cap * sizeof *np);
    if (!np) return vl_fail(c, VL_ERR_OOM, "parameter table");
    t->p = np;
    vl_sd_pinfo *ni = realloc(t->info, (size_t)cap * sizeof *ni);
    if (!ni) return vl_fail(c, VL_ERR_OOM, "parameter table");
    t->info = ni;
    t->cap = cap;
  }
  t->info[t->n] = *info;
  /* a vector (n) is a (1, n) vl_param, as everywhere in the engine */
  int64_t rows = info->ndim == 1 ? 1 : info->d[0];
  if (info->ndim == 1) cols = info->d[0];
  vl_status s = vl_param_alloc(c, &t->p[t->n], name, rows, cols, dtype, false);
  t->n++; /* counted even on failure: free releases what was allocated */
  return s;
}

void vl_sd_params_free(vl_ctx *c, vl_sd_params *t) {
  for (int i = t->n - 1; i >= 0; i--) vl_param_free(c, &t->p[i]);
  free(t->p);
  free(t->info);
  memset(t, 0, sizeof *t);
}

int vl_sd_params_find(const vl_sd_params *t, const char *name) {
  for (int i = 0; i < t->n; i++)
    if (!strcmp(t->p[i].name, name)) return i;
  return -1;
}

int64_t vl_sd_params_count(const vl_sd_params *t) {
  int64_t n = 0;
  for (int i = 0; i < t->n; i++) n += t->p[i].rows * t->p[i].cols;
  return n;
}

vl_status vl_sd_params_init(vl_ctx *c, vl_sd_params *t, uint64_t seed) {
  if (c->plan) return VL_OK; /* no values on the plan device */
  int64_t maxn = 0;
  for (int i = 0; i < t->n; i++)
    if (t->p[i].rows * t->p[i].cols > maxn) maxn = t->p[i].rows * t->p[i].cols;
  float *h = malloc((size_t)(maxn > 0 ? maxn : 1) * sizeof *h);
  if (!h) return vl_fail(c, VL_ERR_OOM, "host init buffer");
  vl_rng rng;
  vl_rng_seed(&rng, seed);
  vl_status s = VL_OK;
  for (int i = 0; i < t->n && s == VL_OK; i++) {
    const vl_sd_pinfo *in = &t->info[i];
    int64_t n = t->p[i].rows * t->p[i].cols;
    if (in->init == VL_SD_INIT_NORMAL) { /* the same numbers as the loop below would draw */
      vl_rng_normal_fill(&rng, h, n, in->a);
      s = vl_param_load(c, &t->p[i], h);
      continue;
    }
    for (int64_t j = 0; j < n; j++) {
      switch (in->init) {
        case VL_SD_INIT_UNIFORM: h[j] = in->a * (2.0f * (float)vl_rng_uniform(&rng) - 1.0f); break;
        case VL_SD_INIT_NORMAL: h[j] = in->a * vl_rng_normal(&rng); break;
        case VL_SD_INIT_ONE: h[j] = 1.0f; break;
        default: h[j] = 0.0f; break;
      }
    }
    s = vl_param_load(c, &t->p[i], h);
  }
  free(h);
  return s;
}
