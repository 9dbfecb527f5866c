/* sd-lora's batch sources. Uncached: the engine's loader decodes and transforms the images
 * (workers, collate as the rung says), and the step gets the images, their captions' ids
 * and the VAE's sample noise, so the encoders run inside the step. Cached: numbered batches
 * of cache records filled by the engine's prefetching producer (vramlab/prefetch.h): the
 * latent records (a fresh z drawn from the moments with a seeded eps per epoch, or the
 * stored sample) and the text embeddings. Both draw the U-Net's noise and timestep per
 * (seed, epoch, image): the same image gets the same draws in every pipeline. */
#include <stdlib.h>
#include <string.h>

#include "sdl.h"
#include "vramlab/prefetch.h"

/* One filled batch buffer: this header, then the arrays at 64-byte aligned offsets. */
typedef struct {
  int64_t n;
  double seconds; /* the fill's time */
} fill_head;

typedef struct {
  vl_ctx *c;      /* for the cache reader's messages */
  float *rec;     /* one latent record (2C h w) */
  float *eps;     /* (C h w) */
} worker_scratch;

struct vl_sdl_feed {
  const vl_sdl_rung *r;
  vl_captions *set;
  const vl_sdl_caches *caches;
  int64_t B, n_items, batches, epoch;
  bool shuffle;
  vl_loader *loader;          /* uncached */
  vl_prefetch *pf;            /* cached */
  int64_t *order;             /* cached: the epoch's order */
  size_t off_lat, off_ctx, off_noise, off_t, off_idx, buf_bytes;
  worker_scratch *ws;
  int nws;
};

static size_t up64(size_t x) { return (x + 63) & ~(size_t)63; }

static int64_t lat_elems(const vl_sd_cfg *m) { return m->vae.latent_ch * m->unet.sample * m->unet.sample; }

/* ---- host micro-batches ------------------------------------------------------------------- */
vl_status vl_sdl_micro_alloc(const vl_sd_cfg *m, int64_t B, vl_sdl_micro *mb) {
  memset(mb, 0, sizeof *mb);
  int64_t side = vl_sd_image_side(m), nl = lat_elems(m), L = m->unet.ctx_len, D = m->unet.ctx_dim;
  if (m->encoders_in_step) {
    mb->images = malloc((size_t)(B * 3 * side * side) * sizeof(float));
    mb->tokens = malloc((size_t)(B * L) * sizeof(int32_t));
    mb->vae_eps = malloc((size_t)(B * nl) * sizeof(float));
    if (!mb->images || !mb->tokens || !mb->vae_eps) goto oom;
  } else {
    mb->latents = malloc((size_t)(B * nl) * sizeof(float));
    mb->context = malloc((size_t)(B * L * D) * sizeof(float));
    if (!mb->latents || !mb->context) goto oom;
  }
  mb->noise = malloc((size_t)(B * nl) * sizeof(float));
  mb->t = malloc((size_t)B * sizeof(int32_t));
  mb->index = malloc((size_t)B * sizeof(int64_t));
  if (mb->noise && mb->t && mb->index) return VL_OK;
oom:
  vl_sdl_micro_free(mb);
  return VL_ERR_OOM;
}

void vl_sdl_micro_free(vl_sdl_micro *mb) {
  free(mb->images); free(mb->tokens); free(mb->vae_eps); free(mb->latents); free(mb->context);
  free(mb->noise); free(mb->t); free(mb->index);
  memset(mb, 0, sizeof *mb);
}

void vl_sdl_micro_bind(const vl_sd_cfg *m, vl_sdl_micro *mb) {
  int64_t n = mb->n, side = vl_sd_image_side(m), C = m->vae.latent_ch, h = m->unet.sample;
  int64_t lat[4] = {n, C, h, h}, img[4] = {n, 3, side, side};         // (B, C, h, w), (B, 3, H, W)
  int64_t tok[2] = {n, m->unet.ctx_len}, ctx[3] = {n, m->unet.ctx_len, m->unet.ctx_dim}, ts[1] = {n};
  mb->batch = (vl_batch){0};
  if (m->encoders_in_step) {
    vl_batch_add(&mb->batch, "images", VL_F32, 4, img, mb->images);
    vl_batch_add(&mb->batch, "vae_noise", VL_F32, 4, lat, mb->vae_eps);
    vl_batch_add(&mb->batch, "tokens", VL_I32, 2, tok, mb->tokens);
  } else {
    vl_batch_add(&mb->batch, "latents", VL_F32, 4, lat, mb->latents);
    vl_batch_add(&mb->batch, "context", VL_F32, 3, ctx, mb->context);
  }
  vl_batch_add(&mb->batch, "noise", VL_F32, 4, lat, mb->noise);
  vl_batch_add(&mb->batch, "timesteps", VL_I32, 1, ts, mb->t);
}

/* ---- cached: the prefetching producer's fill ------------------------------------------------ */
static vl_status fill(void *user, int worker, int64_t k, void *buf, vl_err *err) {
  vl_sdl_feed *f = user;
  const vl_sd_cfg *m = &f->r->model;
  worker_scratch *w = &f->ws[worker];
  double t0 = vl_now();
  int64_t C = m->vae.latent_ch, hw = m->unet.sample * m->unet.sample, nl = C * hw;
  int64_t LD = m->unet.ctx_len * m->unet.ctx_dim, n = f->n_items - k * f->B;
  if (n > f->B) n = f->B;
  char *p = buf;
  float *lat = (float *)(p + f->off_lat), *ctx = (float *)(p + f->off_ctx), *noise = (float *)(p + f->off_noise);
  int32_t *t = (int32_t *)(p + f->off_t);
  int64_t *idx = (int64_t *)(p + f->off_idx);
  bool moments = f->r->store == VL_CACHE_MOMENTS;
  for (int64_t j = 0; j < n; j++) {
    int64_t i = f->order[k * f->B + j];
    idx[j] = i;
    vl_sdl_draw((uint64_t)f->r->seed, f->epoch, i, nl, moments ? w->eps : NULL, noise + j * nl, &t[j]);
    vl_status s = vl_cache_read(w->c, f->caches->lat, i, moments ? w->rec : lat + j * nl);
    if (s == VL_OK && moments) vl_sdl_sample(w->rec, w->eps, C, hw, m->vae.scale, lat + j * nl);
    if (s == VL_OK) s = vl_cache_read(w->c, f->caches->text, i, ctx + j * LD);
    if (s != VL_OK) return vl_err_set(err, s, "%s", w->c->err);
  }
  fill_head *h = buf;
  h->n = n;
  h->seconds = vl_now() - t0;
  return VL_OK;
}

static vl_status open_cached(vl_case_env *env, vl_sdl_feed *f) {
  const vl_sd_cfg *m = &f->r->model;
  int64_t B = f->B, nl = lat_elems(m), LD = m->unet.ctx_len * m->unet.ctx_dim;
  f->off_lat = up64(sizeof(fill_head));
  f->off_ctx = f->off_lat + up64((size_t)(B * nl) * sizeof(float));
  f->off_noise = f->off_ctx + up64((size_t)(B * LD) * sizeof(float));
  f->off_t = f->off_noise + up64((size_t)(B * nl) * sizeof(float));
  f->off_idx = f->off_t + up64((size_t)B * sizeof(int32_t));
  f->buf_bytes = f->off_idx + up64((size_t)B * sizeof(int64_t));
  f->order = malloc((size_t)f->n_items * sizeof *f->order);
  f->nws = f->r->workers > 0 ? (int)f->r->workers : 1;
  f->ws = calloc((size_t)f->nws, sizeof *f->ws);
  if (!f->order || !f->ws) return vl_case_fail(env, VL_ERR_OOM, "host memory for the cache reader");
  for (int i = 0; i < f->nws; i++) {
    worker_scratch *w = &f->ws[i];
    w->rec = malloc((size_t)(2 * nl) * sizeof(float));
    w->eps = malloc((size_t)nl * sizeof(float));
    if (!w->rec || !w->eps || vl_ctx_create(&w->c, VL_DEV_PLAN, VL_NO_CAP) != VL_OK)
      return vl_case_fail(env, VL_ERR_OOM, "host memory for the cache reader");
  }
  return VL_OK;
}

/* ---- the feed --------------------------------------------------------------------------------- */
vl_status vl_sdl_feed_open(vl_case_env *env, const vl_sdl_rung *r, vl_captions *set, const vl_sdl_caches *caches,
                           int64_t B, bool shuffle, vl_sdl_feed **out) {
  *out = NULL;
  vl_sdl_feed *f = calloc(1, sizeof *f);
  if (!f) return vl_case_fail(env, VL_ERR_OOM, "host memory for the feed");
  f->r = r;
  f->set = set;
  f->caches = caches;
  f->B = B;
  f->shuffle = shuffle;
  f->n_items = vl_captions_len(set);
  f->batches = r->drop_last ? f->n_items / B : (f->n_items + B - 1) / B;
  vl_status s;
  if (r->model.encoders_in_step) {
    vl_loader_cfg lc;
    vl_sdl_loader_cfg(r, &lc, B, (int)r->workers, shuffle);
    vl_dataset ds = vl_captions_dataset(set);
    vl_err lerr = {""};
    if ((s = vl_loader_create(&f->loader, &lc, &ds, &lerr)) != VL_OK) vl_case_fail(env, s, "%s", lerr.msg);
  } else {
    s = open_cached(env, f);
  }
  if (s != VL_OK) {
    vl_sdl_feed_close(f);
    return s;
  }
  *out = f;
  return VL_OK;
}

vl_status vl_sdl_feed_epoch(vl_case_env *env, vl_sdl_feed *f, int64_t epoch) {
  f->epoch = epoch;
  if (f->loader) return vl_loader_start_epoch(f->loader, epoch);
  vl_prefetch_destroy(f->pf); /* stops the workers of the epoch before, if any */
  f->pf = NULL;
  for (int64_t i = 0; i < f->n_items; i++) f->order[i] = i;
  if (f->shuffle) {
    /* the loader's sampler (engine/data/loader.c, build_order): Fisher-Yates seeded by (seed,
     * "SHUFF", epoch), so cached and uncached rungs see the same images in the same order
     * (tests/test_sd_lora_case.c checks that the two orders agree) */
    vl_rng g;
    uint64_t sd = vl_mix64(vl_mix64(vl_mix64((uint64_t)f->r->seed ^ 0x5348554646ull) ^ (uint64_t)epoch) ^ 0u);
    vl_rng_seed(&g, sd);
    for (int64_t i = f->n_items - 1; i > 0; i--) {
      int64_t j = (int64_t)vl_rng_below(&g, (uint64_t)i + 1), x = f->order[i];
      f->order[i] = f->order[j];
      f->order[j] = x;
    }
  }
  vl_prefetch_cfg pc = {(int)f->r->workers, (int)f->r->prefetch, f->buf_bytes, f->batches, fill, f};
  vl_err err = {""};
  vl_status s = vl_prefetch_create(&f->pf, &pc, &err);
  return s == VL_OK ? VL_OK : vl_case_fail(env, s, "cache reader: %s", err.msg);
}

static vl_status next_uncached(vl_case_env *env, vl_sdl_feed *f, vl_sdl_micro *m, bool *end, double *producer) {
  const vl_sd_cfg *cfg = &f->r->model;
  vl_batch_buf *b = NULL;
  vl_status s = vl_loader_next(f->loader, &b);
  if (s != VL_OK) {
    vl_loader_stats st;
    vl_loader_stats_get(f->loader, &st);
    return vl_case_fail(env, s, "%s", st.last_error);
  }
  if (!b) { *end = true; return VL_OK; }
  int64_t side = vl_sd_image_side(cfg), nl = lat_elems(cfg), L = cfg->unet.ctx_len;
  m->n = b->n;
  memcpy(m->images, b->x, (size_t)(b->n * 3 * side * side) * sizeof(float));
  for (int64_t j = 0; j < b->n; j++) {
    int64_t i = b->index[j];
    m->index[j] = i;
    vl_sdl_tokens(f->set, cfg, i, m->tokens + j * L);
    vl_sdl_draw((uint64_t)f->r->seed, f->epoch, i, nl, m->vae_eps + j * nl, m->noise + j * nl, &m->t[j]);
  }
  *producer = b->load_seconds;
  vl_loader_release(f->loader, b);
  return VL_OK;
}

static vl_status next_cached(vl_case_env *env, vl_sdl_feed *f, vl_sdl_micro *m, bool *end, double *producer) {
  const vl_sd_cfg *cfg = &f->r->model;
  void *buf = NULL;
  int64_t k;
  double wait;
  vl_err err = {""};
  vl_status s = vl_prefetch_next(f->pf, &buf, &k, &wait, &err);
  if (s != VL_OK) return vl_case_fail(env, s, "cache reader: %s", err.msg);
  if (!buf) { *end = true; return VL_OK; }
  const fill_head *h = buf;
  const char *p = buf;
  int64_t n = h->n, nl = lat_elems(cfg), LD = cfg->unet.ctx_len * cfg->unet.ctx_dim;
  m->n = n;
  memcpy(m->latents, p + f->off_lat, (size_t)(n * nl) * sizeof(float));
  memcpy(m->context, p + f->off_ctx, (size_t)(n * LD) * sizeof(float));
  memcpy(m->noise, p + f->off_noise, (size_t)(n * nl) * sizeof(float));
  memcpy(m->t, p + f->off_t, (size_t)n * sizeof(int32_t));
  memcpy(m->index, p + f->off_idx, (size_t)n * sizeof(int64_t));
  *producer = h->seconds;
  vl_prefetch_release(f->pf, buf);
  return VL_OK;
}

vl_status vl_sdl_feed_next(vl_case_env *env, vl_sdl_feed *f, vl_sdl_micro *m, bool *end, double *producer) {
  *end = false;
  *producer = 0;
  VL_TRY(f->loader ? next_uncached(env, f, m, end, producer) : next_cached(env, f, m, end, producer));
  if (!*end) vl_sdl_micro_bind(&f->r->model, m);
  return VL_OK;
}

int64_t vl_sdl_feed_batches(const vl_sdl_feed *f) { return f->batches; }

size_t vl_sdl_feed_host_bytes(const vl_sdl_feed *f) {
  if (f->loader) {
    vl_loader_stats st;
    vl_loader_stats_get(f->loader, &st);
    return st.host_bytes_bound;
  }
  vl_prefetch_cfg pc = {(int)f->r->workers, (int)f->r->prefetch, f->buf_bytes, f->batches, fill, NULL};
  size_t per = (size_t)(3 * lat_elems(&f->r->model)) * sizeof(float);
  return vl_prefetch_host_bytes(&pc) + (size_t)f->nws * per + (size_t)f->n_items * sizeof(int64_t);
}

void vl_sdl_feed_close(vl_sdl_feed *f) {
  if (!f) return;
  if (f->loader) vl_loader_destroy(f->loader);
  vl_prefetch_destroy(f->pf);
  for (int i = 0; f->ws && i < f->nws; i++) {
    vl_ctx_destroy(f->ws[i].c);
    free(f->ws[i].rec);
    free(f->ws[i].eps);
  }
  free(f->ws);
  free(f->order);
  free(f);
}
