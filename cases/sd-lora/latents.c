/* sd-lora's cache files (vramlab/cache.h): their keys, paths and sizes, and the one-time
 * build, timed by phase: decode + transform (the loader), VAE encoder (moments), text
 * encoder (embeddings) and writing. The encoders are the very ones the uncached step runs:
 * the model's seeds (vl_sd_vae_seed, vl_sd_clip_seed) and config at the run scale.
 *
 * Keys. model_hash is the encoder's weights as stored on the device, read back and hashed
 * in state_dict order with their names, then its activation dtype and attention (they
 * change the outputs too): a cache built by other weights, real ones loaded by name
 * included, is stale. data_hash is the set's header (n, size, seed, quality) and every
 * image's width, height, byte count and content (vl_cache_hash over the JPEG's bytes: an
 * image rewritten to the same size is another image) in order, or for text every caption's
 * ids as the text encoder takes them. Hashing the images reads the set once per open of the
 * caches: 90 ms for the default 192 images (35 MB, page-cached) on this 2-core machine, 20 ms
 * of it reading and the rest vl_cache_hash at about 0.5 GB/s; 50k such images (9 GB) would
 * take some 20 s, more from a cold disk, against about 0.1 s of encoding per image. Preprocessing: resolution, center crop, no flip (one variant),
 * SD's normalisation (mean 0.5, std 0.5), the stored form and its sample seed, the dtype. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/interrupt.h"
#include "sdl.h"
#include "vramlab/fileio.h"

#define BUILD_BATCH 8

typedef struct {
  vl_ctx *c;
  vl_sd_vae *vae;
  vl_sd_clip *clip;
  uint64_t vae_hash, clip_hash;
} encoders;

static void encoders_free(encoders *e) {
  vl_sd_clip_destroy(e->clip);
  vl_sd_vae_destroy(e->vae);
  vl_ctx_destroy(e->c);
  memset(e, 0, sizeof *e);
}

/* Hash of the parameters as the device holds them (downloaded), names included. */
static vl_status params_hash(vl_ctx *c, const vl_sd_params *t, uint64_t *h) {
  size_t cap = 0;
  void *buf = NULL;
  for (int i = 0; i < t->n; i++) {
    const vl_tensor *w = &t->p[i].w;
    if (w->bytes > cap) {
      free(buf);
      cap = w->bytes;
      if (!(buf = malloc(cap))) return vl_fail(c, VL_ERR_OOM, "host memory to hash %s", t->p[i].name);
    }
    vl_status s = c->be->download(c, buf, w, 0, w->bytes);
    if (s != VL_OK) { free(buf); return s; }
    *h = vl_cache_hash(*h, t->p[i].name, strlen(t->p[i].name));
    *h = vl_cache_hash(*h, buf, w->bytes);
  }
  free(buf);
  return VL_OK;
}

static vl_status encoders_make(vl_case_env *env, const vl_sdl_rung *r, encoders *e) {
  memset(e, 0, sizeof *e);
  vl_device dev = env->device == VL_DEV_PLAN ? VL_DEV_CPU : env->device;
  vl_status s = vl_ctx_create(&e->c, dev, VL_NO_CAP);
  if (s != VL_OK) return vl_case_fail(env, s, "cache: no %s context", vl_device_name(dev));
  vl_sd_clip_cfg cc = r->model.clip;
  cc.lora_rank = 0; /* a trained text encoder is never cached (text_lora_rank needs cache none) */
  s = vl_sd_vae_create(e->c, &r->model.vae, vl_sd_vae_seed((uint64_t)r->seed), &e->vae);
  if (s == VL_OK) s = vl_sd_clip_create(e->c, &cc, vl_sd_clip_seed((uint64_t)r->seed), &e->clip);
  if (s == VL_OK) s = params_hash(e->c, vl_sd_vae_params(e->vae), &e->vae_hash);
  if (s == VL_OK) s = params_hash(e->c, vl_sd_clip_params(e->clip), &e->clip_hash);
  if (s != VL_OK) {
    vl_case_fail(env, s, "cache: the encoders: %s", e->c->err);
    encoders_free(e);
    return s;
  }
  int32_t tail[2] = {(int32_t)r->model.vae.acts, (int32_t)r->model.vae.attn};
  e->vae_hash = vl_cache_hash(e->vae_hash, tail, sizeof tail);
  tail[0] = (int32_t)cc.acts;
  tail[1] = (int32_t)cc.attn;
  e->clip_hash = vl_cache_hash(e->clip_hash, tail, sizeof tail);
  return VL_OK;
}

/* ---- keys, paths, sizes ------------------------------------------------------------------ */
static uint64_t sample_seed(const vl_sdl_rung *r) { return vl_mix64((uint64_t)r->seed ^ 0x4b6f687961ull) | 1u; }

static void key_latents(const vl_sd_cfg *m, vl_cache_form form, vl_dtype dt, uint64_t mh, uint64_t dh,
                        uint64_t sseed, vl_cache_key *k) {
  vl_cache_key_init(k, "latents");
  int64_t side = vl_sd_image_side(m), h = m->unet.sample, C = m->vae.latent_ch;
  k->model_hash = mh;
  k->data_hash = dh;
  k->width = k->height = (int32_t)side;
  k->crop = VL_CACHE_CROP_CENTER;
  k->flip_variants = 1;
  for (int i = 0; i < 3; i++) k->norm_mean[i] = k->norm_std[i] = 0.5f;
  k->form = form;
  /* moments are the raw encoder output; a sample is stored as the U-Net reads it */
  k->latent_scale = form == VL_CACHE_SAMPLE ? m->vae.scale : 1.0f;
  k->sample_seed = form == VL_CACHE_SAMPLE ? sseed : 0;
  k->dtype = dt;
  int64_t shape[3] = {form == VL_CACHE_MOMENTS ? 2 * C : C, h, h};
  vl_cache_key_shape(k, 3, shape);
}

static void key_text(const vl_sd_cfg *m, vl_dtype dt, uint64_t mh, uint64_t dh, vl_cache_key *k) {
  vl_cache_key_init(k, "text");
  k->model_hash = mh;
  k->data_hash = dh;
  k->dtype = dt;
  int64_t shape[2] = {m->unet.ctx_len, m->unet.ctx_dim};
  vl_cache_key_shape(k, 2, shape);
}

void vl_sdl_cache_bytes_full(vl_cache_form form, vl_dtype dt, int64_t n, uint64_t *lat, uint64_t *text) {
  vl_sd_cfg m;
  vl_sd_preset("full", &m);
  vl_cache_key kl, kt;
  key_latents(&m, form, dt, 0, 0, 1, &kl);
  key_text(&m, dt, 0, 0, &kt);
  *lat = vl_cache_file_bytes(&kl, n);
  *text = vl_cache_file_bytes(&kt, n);
}

/* The hash of image i's file (its bytes as they are now) into *h; buf grows as needed. */
static vl_status image_hash(vl_case_env *env, const vl_captions *set, int64_t i, int64_t max, uint8_t **buf,
                            size_t *cap, uint64_t *h) {
  char path[4096];
  vl_err m;
  size_t len = 0;
  if (!vl_captions_path(set, i, path, sizeof path))
    return vl_case_fail(env, VL_ERR_INVALID, "cache key: image %lld: path too long", (long long)i);
  if (vl_file_read(path, (uint64_t)max, "the largest image of the manifest", buf, cap, &len, &m))
    return vl_case_fail(env, VL_ERR_IO, "cache key: %s", m.msg);
  *h = vl_cache_hash(0, *buf, len);
  return VL_OK;
}

/* The set's identities: *img for the latents (every image's size and content), *txt for the
 * text embeddings (every caption's ids); both over the set's header. */
static vl_status data_hashes(vl_case_env *env, const vl_sdl_rung *r, const vl_captions *set, uint64_t *img,
                             uint64_t *txt) {
  vl_captions_info in;
  vl_captions_info_get(set, &in);
  int64_t head[4] = {in.n, in.size, (int64_t)in.seed, in.quality};
  *img = vl_cache_hash(0, head, sizeof head);
  *txt = vl_cache_hash(0, head, sizeof head);
  int32_t ids[VL_CLIP_CONTEXT];
  int64_t L = r->model.unet.ctx_len;
  uint8_t *buf = NULL;
  size_t cap = 0;
  vl_status s = VL_OK;
  for (int64_t i = 0; s == VL_OK && i < in.n; i++) {
    int w = 0, h = 0;
    int64_t bytes = 0;
    uint64_t content = 0;
    vl_captions_item(set, i, &w, &h, &bytes);
    s = image_hash(env, set, i, in.max_bytes, &buf, &cap, &content);
    int64_t item[4] = {w, h, bytes, (int64_t)content};
    *img = vl_cache_hash(*img, item, sizeof item);
    vl_sdl_tokens(set, &r->model, i, ids);
    *txt = vl_cache_hash(*txt, ids, (size_t)L * sizeof *ids);
  }
  free(buf);
  return s;
}

/* The two keys of a stored form, for the set's identities (data_hashes). */
static void keys_with(const vl_sdl_rung *r, uint64_t dimg, uint64_t dtxt, const encoders *e, vl_cache_form form,
                      vl_cache_key *lat, vl_cache_key *text) {
  key_latents(&r->model, form, r->cache_dtype, e->vae_hash, dimg, sample_seed(r), lat);
  key_text(&r->model, r->cache_dtype, e->clip_hash, dtxt, text);
}

vl_status vl_sdl_cache_keys(vl_case_env *env, const vl_sdl_rung *r, const vl_captions *set, vl_cache_form form,
                            vl_cache_key *lat, vl_cache_key *text) {
  uint64_t dimg, dtxt;
  VL_TRY(data_hashes(env, r, set, &dimg, &dtxt));
  encoders e;
  VL_TRY(encoders_make(env, r, &e));
  keys_with(r, dimg, dtxt, &e, form, lat, text);
  encoders_free(&e);
  return VL_OK;
}

vl_status vl_sdl_cache_paths(vl_case_env *env, const vl_sdl_rung *r, vl_cache_form form, char *lat, char *text,
                             size_t n) {
  const char *dt = vl_dtype_name(r->cache_dtype);
  char dir[VL_KNOB_VAL_LEN + 96];
  int a = snprintf(dir, sizeof dir, "%s/s%lld-n%ld-seed%ld", r->cache_dir, (long long)vl_sd_image_side(&r->model),
                   r->images, r->seed);
  int b = snprintf(lat, n, "%s/latents-%s-%s.vlc", dir, form == VL_CACHE_SAMPLE ? "sample" : "moments", dt);
  int c = snprintf(text, n, "%s/text-%s.vlc", dir, dt);
  if (a < 0 || (size_t)a >= sizeof dir || b < 0 || (size_t)b >= n || c < 0 || (size_t)c >= n)
    return vl_case_fail(env, VL_ERR_INVALID, "cache_dir: path too long (limit %zu)", n - 64);
  return VL_OK;
}


/* ---- the build ----------------------------------------------------------------------------- */
typedef struct {
  vl_case_env *env;
  const vl_sdl_rung *r;
  const vl_captions *set;
  encoders *e;
  uint64_t sseed;
  vl_cache_builder *mom, *smp, *txt; /* NULL: not rebuilt */
  float *host;  /* (BUILD_BATCH, max(2C h w, L D)) fp32 encoder outputs */
  float *eps;   /* (C h w) */
  float *z;     /* (C h w) */
  int32_t *ids; /* (BUILD_BATCH, L) */
  vl_sdl_build *b;
} build_ctx;

/* dev (any float dtype) -> fp32 host floats */
static vl_status download_f32(vl_ctx *c, const vl_tensor *dev, float *host) {
  vl_tensor f = {0};
  VL_TRY(vl_tensor_alloc(c, &f, VL_F32, VL_MEM_TEMP, dev->ndim, dev->shape));
  vl_status s = vl_convert_run(c, &(vl_convert_args){.y = &f, .x = dev, .n = dev->n});
  if (s == VL_OK) s = c->be->download(c, host, &f, 0, f.bytes);
  vl_tensor_free(c, &f);
  return s;
}

/* A batch's moments through the VAE encoder; each image's moments stored as they are and
 * as one sample (kohya's cache_latents: one draw, fixed by the key's sample seed). */
static vl_status build_latents(build_ctx *x, const vl_batch_buf *bb) {
  vl_ctx *c = x->e->c;
  const vl_sd_cfg *m = &x->r->model;
  int64_t side = vl_sd_image_side(m), C = m->vae.latent_ch, hw = m->unet.sample * m->unet.sample;
  int64_t ish[4] = {bb->n, 3, side, side};
  vl_tensor img = {0}, mom = {0};
  double t0 = vl_now();
  vl_status s = vl_tensor_alloc(c, &img, VL_F32, VL_MEM_DATA, 4, ish);             // (n, 3, H, W)
  if (s == VL_OK) s = c->be->upload(c, &img, 0, bb->x, img.bytes);
  if (s == VL_OK) s = vl_sd_vae_encode(x->e->vae, &img, NULL, NULL, &mom, VL_MEM_TEMP); // (n, 2C, h, w)
  if (s == VL_OK) s = download_f32(c, &mom, x->host);
  vl_tensor_free(c, &mom);
  vl_tensor_free(c, &img);
  x->b->vae += vl_now() - t0;
  if (s != VL_OK) return vl_case_fail(x->env, s, "cache build: VAE encoder: %s", c->err);
  t0 = vl_now();
  for (int64_t j = 0; s == VL_OK && j < bb->n; j++) {
    const float *mj = x->host + j * 2 * C * hw;
    s = vl_cache_build_add(c, x->mom, mj);
    vl_rng g;
    vl_rng_seed(&g, vl_mix64(x->sseed ^ (uint64_t)bb->index[j]));
    for (int64_t i = 0; i < C * hw; i++) x->eps[i] = vl_rng_normal(&g);
    vl_sdl_sample(mj, x->eps, C, hw, m->vae.scale, x->z);
    if (s == VL_OK) s = vl_cache_build_add(c, x->smp, x->z);
  }
  x->b->write += vl_now() - t0;
  return s == VL_OK ? VL_OK : vl_case_fail(x->env, s, "cache build: %s", c->err);
}

/* A batch's captions through the text encoder, one record each. */
static vl_status build_text(build_ctx *x, const vl_batch_buf *bb) {
  vl_ctx *c = x->e->c;
  const vl_sd_cfg *m = &x->r->model;
  int64_t L = m->unet.ctx_len, D = m->unet.ctx_dim;
  for (int64_t j = 0; j < bb->n; j++) vl_sdl_tokens(x->set, m, bb->index[j], x->ids + j * L);
  int64_t tsh[2] = {bb->n, L};
  vl_tensor tok = {0}, hid = {0};
  double t0 = vl_now();
  vl_status s = vl_tensor_alloc(c, &tok, VL_I32, VL_MEM_DATA, 2, tsh);                 // (n, L)
  if (s == VL_OK) s = c->be->upload(c, &tok, 0, x->ids, tok.bytes);
  if (s == VL_OK) s = vl_sd_clip_encode(x->e->clip, &tok, &hid, VL_MEM_TEMP);          // (n, L, D)
  if (s == VL_OK) s = download_f32(c, &hid, x->host);
  vl_tensor_free(c, &hid);
  vl_tensor_free(c, &tok);
  x->b->clip += vl_now() - t0;
  if (s != VL_OK) return vl_case_fail(x->env, s, "cache build: text encoder: %s", c->err);
  t0 = vl_now();
  for (int64_t j = 0; s == VL_OK && j < bb->n; j++) s = vl_cache_build_add(c, x->txt, x->host + j * L * D);
  x->b->write += vl_now() - t0;
  return s == VL_OK ? VL_OK : vl_case_fail(x->env, s, "cache build: %s", c->err);
}

/* Every image once, in order, through the loader (decode + SD's transform) and the encoders
 * that are rebuilt. */
static vl_status build_pass(build_ctx *x, vl_loader *l) {
  VL_TRY(vl_loader_start_epoch(l, 0));
  int64_t done = 0, next_note = 64;
  for (;;) {
    if (vl_interrupted) return vl_case_fail(x->env, VL_ERR_INTERRUPTED, "cache build interrupted");
    double t0 = vl_now();
    vl_batch_buf *bb = NULL;
    vl_status s = vl_loader_next(l, &bb);
    x->b->load += vl_now() - t0;
    if (s != VL_OK) {
      vl_loader_stats st;
      vl_loader_stats_get(l, &st);
      return vl_case_fail(x->env, s, "cache build: %s", st.last_error);
    }
    if (!bb) return VL_OK;
    if (x->mom) s = build_latents(x, bb);
    if (s == VL_OK && x->txt) s = build_text(x, bb);
    done += bb->n;
    vl_loader_release(l, bb);
    if (s != VL_OK) return s;
    if (!x->env->quiet && (done >= next_note || done == x->r->images)) {
      vl_progress("  cache build %lld/%ld images", (long long)done, x->r->images);
      next_note += 64;
    }
  }
}

typedef struct {
  const char *mom, *smp, *txt;           /* paths; NULL: not rebuilt */
  const vl_cache_key *kmom, *ksmp, *ktxt;
} build_plan;

static vl_status build(vl_case_env *env, const vl_sdl_rung *r, vl_captions *set, encoders *e, const build_plan *p,
                       vl_sdl_build *b) {
  vl_ctx *c = e->c;
  const vl_sd_cfg *m = &r->model;
  int64_t per = 2 * m->vae.latent_ch * m->unet.sample * m->unet.sample, lat = m->vae.latent_ch * m->unet.sample * m->unet.sample;
  int64_t td = m->unet.ctx_len * m->unet.ctx_dim;
  build_ctx x = {env, r, set, e, sample_seed(r), NULL, NULL, NULL,
                 malloc((size_t)(BUILD_BATCH * (per > td ? per : td)) * sizeof(float)),
                 malloc((size_t)lat * sizeof(float)), malloc((size_t)lat * sizeof(float)),
                 malloc((size_t)(BUILD_BATCH * m->unet.ctx_len) * sizeof(int32_t)), b};
  vl_status s = x.host && x.eps && x.z && x.ids ? VL_OK : vl_case_fail(env, VL_ERR_OOM, "cache build: host memory");
  if (s == VL_OK && p->mom) s = vl_cache_build_begin(c, p->mom, p->kmom, r->images, &x.mom);
  if (s == VL_OK && p->mom) s = vl_cache_build_begin(c, p->smp, p->ksmp, r->images, &x.smp);
  if (s == VL_OK && p->txt) s = vl_cache_build_begin(c, p->txt, p->ktxt, r->images, &x.txt);
  if (s != VL_OK && x.host && x.eps && x.z && x.ids) vl_case_fail(env, s, "cache build: %s", c->err);
  vl_loader_cfg lc;
  vl_sdl_loader_cfg(r, &lc, BUILD_BATCH, 0, false);
  lc.batched_collate = true;
  lc.drop_last = false;
  vl_dataset ds = vl_captions_dataset(set);
  vl_loader *l = NULL;
  vl_err lerr = {""};
  if (s == VL_OK && (s = vl_loader_create(&l, &lc, &ds, &lerr)) != VL_OK)
    vl_case_fail(env, s, "cache build: %s", lerr.msg);
  double t0 = vl_now();
  if (s == VL_OK) s = build_pass(&x, l);
  double t1 = vl_now();
  /* commits: flush, fsync, rename; a failed one leaves the old file (or none) */
  vl_cache_builder **all[3] = {&x.mom, &x.smp, &x.txt};
  for (int i = 0; i < 3; i++) {
    if (!*all[i]) continue;
    if (s != VL_OK) { vl_cache_build_abort(all[i]); continue; }
    if ((s = vl_cache_build_commit(c, all[i])) != VL_OK) vl_case_fail(env, s, "cache build: %s", c->err);
  }
  b->write += vl_now() - t1;
  b->wall = vl_now() - t0;
  b->images = r->images;
  if (l) vl_loader_destroy(l);
  free(x.host); free(x.eps); free(x.z); free(x.ids);
  return s;
}

/* ---- open, rebuilding what is not valid ----------------------------------------------------- */
/* Whether the file at path is a valid cache for key (every record's CRC checked); a progress
 * line and b->why say what was found otherwise. Under cache_mismatch = error a stale cache
 * is an error naming the field. */
static vl_status check(vl_case_env *env, const vl_sdl_rung *r, vl_ctx *c, const char *path, const vl_cache_key *k,
                       bool *valid, vl_sdl_build *b) {
  vl_cache_opts o = {r->on_mismatch, false, true};
  vl_cache_state st;
  vl_cache *h = NULL;
  vl_status s = vl_cache_open(c, path, k, r->images, &o, &st, &h);
  if (s != VL_OK) return vl_case_fail(env, s, "%s", c->err);
  vl_cache_close(h);
  *valid = st == VL_CACHE_VALID;
  if (!*valid) {
    if (!b->why[0]) snprintf(b->why, sizeof b->why, "%s", c->err);
    if (!env->quiet) vl_progress("%s: rebuilding", c->err);
  }
  return VL_OK;
}

vl_status vl_sdl_caches_open(vl_case_env *env, const vl_sdl_rung *r, vl_captions *set, vl_cache_form form,
                             bool in_ram, vl_sdl_caches *out, vl_sdl_build *b) {
  memset(out, 0, sizeof *out);
  memset(b, 0, sizeof *b);
  char mp[sizeof out->lat_path], sp[sizeof out->lat_path], tp[sizeof out->text_path];
  VL_TRY(vl_sdl_cache_paths(env, r, VL_CACHE_MOMENTS, mp, tp, sizeof mp));
  VL_TRY(vl_sdl_cache_paths(env, r, VL_CACHE_SAMPLE, sp, tp, sizeof sp));
  uint64_t dimg, dtxt;
  VL_TRY(data_hashes(env, r, set, &dimg, &dtxt));
  encoders e;
  VL_TRY(encoders_make(env, r, &e));
  vl_cache_key km, ks, kt;
  keys_with(r, dimg, dtxt, &e, VL_CACHE_MOMENTS, &km, &kt);
  keys_with(r, dimg, dtxt, &e, VL_CACHE_SAMPLE, &ks, &kt);
  bool vm = false, vs = false, vt = false;
  vl_status s = check(env, r, e.c, mp, &km, &vm, b);
  if (s == VL_OK) s = check(env, r, e.c, sp, &ks, &vs, b);
  if (s == VL_OK) s = check(env, r, e.c, tp, &kt, &vt, b);
  if (s == VL_OK && (!vm || !vs || !vt)) {
    /* one VAE pass writes both stored forms: the loss comparison reads the other one */
    build_plan p = {vm && vs ? NULL : mp, sp, vt ? NULL : tp, &km, &ks, &kt};
    if (!env->quiet)
      vl_progress("building the %s cache of %ld images (%s%s%s) in %s", vl_dtype_name(r->cache_dtype), r->images,
                  p.mom ? "VAE moments and one sample" : "", p.mom && p.txt ? ", " : "",
                  p.txt ? "text embeddings" : "", r->cache_dir);
    b->built = true;
    s = build(env, r, set, &e, &p, b);
  }
  vl_cache_opts o = {r->on_mismatch, in_ram, false};
  vl_cache_state st[2] = {VL_CACHE_VALID, VL_CACHE_VALID};
  const char *lp = form == VL_CACHE_SAMPLE ? sp : mp;
  double t0 = vl_now();
  if (s == VL_OK) {
    /* after a build both are valid, unless another process wrote an other key's meanwhile */
    s = vl_cache_open(e.c, lp, form == VL_CACHE_SAMPLE ? &ks : &km, r->images, &o, &st[0], &out->lat);
    if (s == VL_OK) s = vl_cache_open(e.c, tp, &kt, r->images, &o, &st[1], &out->text);
    if (s == VL_OK && (st[0] != VL_CACHE_VALID || st[1] != VL_CACHE_VALID)) s = VL_ERR_IO;
    if (s != VL_OK) vl_case_fail(env, s, "cache: %s", e.c->err);
  }
  b->open = vl_now() - t0;
  snprintf(out->lat_path, sizeof out->lat_path, "%s", lp);
  snprintf(out->text_path, sizeof out->text_path, "%s", tp);
  encoders_free(&e);
  if (s != VL_OK) vl_sdl_caches_close(out);
  return s;
}

void vl_sdl_caches_close(vl_sdl_caches *c) {
  vl_cache_close(c->lat);
  vl_cache_close(c->text);
  c->lat = c->text = NULL;
}
