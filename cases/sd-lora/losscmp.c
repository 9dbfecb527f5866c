/* sd-lora's case-wide measurements after the ladder (the extra hook):
 *  - the cache build's cost: the build a rung made in this run, or else a timed build into a
 *    scratch folder (removed after), so every report has a measured build; and the same
 *    build with the encoders on the modeled accelerator (the build's decode, transform and
 *    writes as measured, plus the encoders' planned FLOPs at the accelerator's rate);
 *  - the epoch at which the cache pays off: build / (uncached epoch - cached epoch);
 *  - the time to make a batch of U-Net inputs without a cache on this CPU: the pipeline's
 *    load time plus the encoders' measured time for a batch;
 *  - cache sizes for 50k images at full scale, both stored forms and dtypes;
 *  - the latents of one image in two epochs (moments: fresh noise; a stored sample: frozen),
 *    and the loss of real U-Net LoRA steps over the same seeded samples without the cache,
 *    with cached moments and with a cached sample. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kit/interrupt.h"
#include "sdl.h"

static const char *name_of(const cJSON *r) { return cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")); }

/* Mean of a run metric over a rung's repetitions (NaN when none has it). */
static double run_mean(const cJSON *rung, const char *k) {
  double s = 0;
  int n = 0;
  const cJSON *run;
  cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs")) {
    const cJSON *v = cJSON_GetObjectItem(run, k);
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) { s += v->valuedouble; n++; }
  }
  return n ? s / n : NAN;
}

static void set_run_metric(cJSON *rung, const char *k, double v) {
  cJSON *run;
  cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs"))
    if (cJSON_GetObjectItem(run, "step_time")) cJSON_AddNumberToObject(run, k, v);
}

/* A rung's knobs with `set` ("k=v,k=v") on top, parsed at scale. */
static vl_status rung_with(vl_case_env *env, const cJSON *rung, const char *set, const char *scale, vl_knobs *k,
                           vl_sdl_rung *r) {
  VL_TRY(vl_case_knobs_of(env, rung, k));
  if (set) VL_TRY(vl_knobs_apply_list(k, set, &env->err));
  return vl_sdl_parse_rung(env, scale, k, r);
}

/* ---- the build ------------------------------------------------------------------------------ */
/* The build a run of this bench made, or a timed one into a scratch folder. */
static vl_status build_cost(vl_case_env *env, cJSON *res, const cJSON *cached, vl_sdl_build *b) {
  const cJSON *rung, *run;
  memset(b, 0, sizeof *b);
  cJSON_ArrayForEach(rung, cJSON_GetObjectItem(res, "rungs")) cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs")) {
    const cJSON *o = cJSON_GetObjectItem(run, "cache_build");
    if (!cJSON_IsObject(o) || b->built) continue;
    b->built = true;
    b->images = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "images"));
    b->wall = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "wall_s"));
    b->load = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "load_s"));
    b->vae = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "vae_s"));
    b->clip = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "clip_s"));
    b->write = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "write_s"));
  }
  if (b->built) return VL_OK;
  vl_knobs k;
  vl_sdl_rung r;
  VL_TRY(rung_with(env, cached, NULL, env->scale, &k, &r));
  char dir[sizeof r.cache_dir];
  int n = snprintf(dir, sizeof dir, "%s/timing-%d", r.cache_dir, (int)getpid());
  if (n < 0 || (size_t)n >= sizeof dir) return vl_case_fail(env, VL_ERR_INVALID, "cache_dir: path too long");
  memcpy(r.cache_dir, dir, sizeof dir);
  if (!env->quiet) vl_progress("timing a cache build (the caches were already there) in %s", dir);
  vl_captions *set = NULL;
  VL_TRY(vl_sdl_open_set(env, &r, &set));
  vl_sdl_caches cc;
  vl_status s = vl_sdl_caches_open(env, &r, set, r.store, false, &cc, b);
  vl_sdl_caches_close(&cc);
  vl_captions_close(set);
  char p[3][sizeof cc.lat_path], d2[sizeof cc.lat_path];
  if (vl_sdl_cache_paths(env, &r, VL_CACHE_MOMENTS, p[0], p[2], sizeof p[0]) == VL_OK &&
      vl_sdl_cache_paths(env, &r, VL_CACHE_SAMPLE, p[1], p[2], sizeof p[0]) == VL_OK) {
    for (int i = 0; i < 3; i++) unlink(p[i]);
    char *slash = strrchr(p[2], '/');
    if (slash) { *slash = 0; snprintf(d2, sizeof d2, "%s", p[2]); rmdir(d2); }
  }
  rmdir(dir);
  return s;
}

/* Seconds per image the encoders would take on the modeled accelerator: their planned FLOPs
 * (the uncached step's minus the cached step's) at its rate. */
static vl_status modeled_encode(vl_case_env *env, const cJSON *uncached, double *s_per_image) {
  vl_knobs k;
  vl_sdl_rung full, fc, run;
  VL_TRY(rung_with(env, uncached, "text_lora_rank=0", "full", &k, &full));
  VL_TRY(rung_with(env, uncached, "text_lora_rank=0,cache=disk", "full", &k, &fc));
  VL_TRY(rung_with(env, uncached, NULL, env->scale, &k, &run));
  int64_t B = full.batch ? full.batch : 1;
  double fu, fcached, ref;
  VL_TRY(vl_sdl_step_flops(env, &full, B, &fu, &ref));
  VL_TRY(vl_sdl_step_flops(env, &fc, B, &fcached, &ref));
  double px = (double)vl_sd_image_side(&run.model) / (double)vl_sd_image_side(&full.model);
  *s_per_image = full.consumer_ms / 1e3 * (fu - fcached) / (double)(B * full.accum) / ref * px * px;
  return VL_OK;
}

/* ---- the loss with and without the cache -------------------------------------------------- */
typedef struct {
  vl_sdl_rung r;
  vl_captions *set;
  vl_sdl_caches cc;
  bool cached;
} variant;

static vl_status variant_open(vl_case_env *env, const cJSON *base, const char *set, const char *scale, variant *v) {
  memset(v, 0, sizeof *v);
  vl_knobs k;
  VL_TRY(rung_with(env, base, set, scale, &k, &v->r));
  v->r.workers = 0;
  v->r.accum = 1;
  v->r.drop_last = 0;
  VL_TRY(vl_sdl_open_set(env, &v->r, &v->set));
  v->cached = v->r.cache != VL_SDL_CACHE_NONE;
  vl_sdl_build b;
  return v->cached ? vl_sdl_caches_open(env, &v->r, v->set, v->r.store, false, &v->cc, &b) : VL_OK;
}

static void variant_close(variant *v) {
  vl_sdl_caches_close(&v->cc);
  vl_captions_close(v->set);
}

/* K real steps of the rung's model over samples 0 .. K B - 1 in order (epoch 0's draws). */
static vl_status loss_curve(vl_case_env *env, variant *v, int64_t B, long K, double *loss) {
  vl_ctx *c = NULL;
  vl_model *m = NULL;
  vl_sdl_feed *f = NULL;
  vl_sdl_micro mb;
  vl_status s = vl_sdl_micro_alloc(&v->r.model, B, &mb);
  if (s != VL_OK) return vl_case_fail(env, s, "host memory for the loss comparison");
  if ((s = vl_ctx_create(&c, env->device, VL_NO_CAP)) != VL_OK) vl_case_fail(env, s, "no context");
  if (s == VL_OK && (s = vl_model_create(c, &vl_model_sd, &v->r.model, (uint64_t)v->r.seed, &m)) != VL_OK)
    vl_case_fail(env, s, "%s", c->err);
  if (s == VL_OK) s = vl_sdl_feed_open(env, &v->r, v->set, v->cached ? &v->cc : NULL, B, false, &f);
  if (s == VL_OK) s = vl_sdl_feed_epoch(env, f, 0);
  for (long i = 0; s == VL_OK && i < K; i++) {
    bool end;
    double prod;
    vl_step_info info;
    if (vl_interrupted) s = vl_case_fail(env, VL_ERR_INTERRUPTED, "interrupted");
    if (s == VL_OK) s = vl_sdl_feed_next(env, f, &mb, &end, &prod);
    if (s == VL_OK && end) { loss[i] = NAN; continue; }
    if (s == VL_OK && (s = vl_model_step(m, &mb.batch, 1, &info)) != VL_OK) vl_case_fail(env, s, "%s", c->err);
    if (s == VL_OK) loss[i] = info.loss;
  }
  vl_sdl_feed_close(f);
  vl_sdl_micro_free(&mb);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  return s;
}

/* RMS(z_epoch1 - z_epoch0) / RMS(z_epoch0) over the first batch of a cached variant. */
static vl_status latent_change(vl_case_env *env, variant *v, int64_t B, double *out) {
  vl_sdl_feed *f = NULL;
  vl_sdl_micro m[2] = {0};
  vl_status s = vl_sdl_feed_open(env, &v->r, v->set, &v->cc, B, false, &f);
  for (int e = 0; e < 2 && s == VL_OK; e++) {
    bool end;
    double p;
    if ((s = vl_sdl_micro_alloc(&v->r.model, B, &m[e])) != VL_OK) vl_case_fail(env, s, "host memory");
    if (s == VL_OK) s = vl_sdl_feed_epoch(env, f, e);
    if (s == VL_OK) s = vl_sdl_feed_next(env, f, &m[e], &end, &p);
  }
  if (s == VL_OK) {
    double d = 0, z = 0;
    int64_t n = m[0].n * v->r.model.vae.latent_ch * v->r.model.unet.sample * v->r.model.unet.sample;
    for (int64_t i = 0; i < n; i++) {
      double a = m[0].latents[i], b = m[1].latents[i];
      d += (b - a) * (b - a);
      z += a * a;
    }
    *out = z > 0 ? sqrt(d / z) : NAN;
  }
  vl_sdl_micro_free(&m[0]);
  vl_sdl_micro_free(&m[1]);
  vl_sdl_feed_close(f);
  return s;
}

static double max_rel(const double *a, const double *b, long n) {
  double m = 0;
  for (long i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]) / fmax(fabs(a[i]), 1e-12));
  return m;
}

static vl_status loss_compare(vl_case_env *env, const cJSON *cached, cJSON *cm) {
  vl_knobs k;
  vl_sdl_rung r;
  VL_TRY(rung_with(env, cached, NULL, env->scale, &k, &r));
  long K = r.loss_steps;
  int64_t B = r.loss_batch;
  if (K <= 0) return VL_OK;
  char scale[sizeof r.loss_scale];
  memcpy(scale, r.loss_scale, sizeof scale);
  if (!strcmp(scale, "full") && env->device == VL_DEV_CPU)
    return vl_case_fail(env, VL_ERR_UNSUPPORTED, "loss_scale = full: a full-scale SD step does not run on the CPU here");
  VL_TRY(rung_with(env, cached, NULL, scale, &k, &r)); /* the set's size at that scale */
  if (B * K > r.images) B = r.images / K > 0 ? r.images / K : 1;
  static const char *const sets[3] = {"cache=none,text_lora_rank=0", "cache=disk,cache_store=moments",
                                      "cache=disk,cache_store=sample"};
  static const char *const keys[3] = {"loss_uncached", "loss_cached_moments", "loss_cached_sample"};
  double *loss = calloc((size_t)(3 * K), sizeof *loss), change[3] = {NAN, NAN, NAN};
  if (!loss) return vl_case_fail(env, VL_ERR_OOM, "host memory");
  if (!env->quiet)
    vl_progress("loss over the same %lld samples: without the cache, cached moments, a cached sample "
                "(%ld real steps each, batch %lld, %s scale)", (long long)(B * K), K, (long long)B, scale);
  vl_status s = VL_OK;
  for (int i = 0; i < 3 && s == VL_OK; i++) {
    variant v;
    s = variant_open(env, cached, sets[i], scale, &v);
    if (s == VL_OK && v.cached) s = latent_change(env, &v, B, &change[i]);
    if (s == VL_OK) s = loss_curve(env, &v, B, K, loss + i * K);
    variant_close(&v);
  }
  if (s == VL_OK) {
    cJSON_AddStringToObject(cm, "loss_scale", scale);
    cJSON_AddNumberToObject(cm, "loss_steps", (double)K);
    cJSON_AddNumberToObject(cm, "loss_batch", (double)B);
    for (int i = 0; i < 3; i++) cJSON_AddItemToObject(cm, keys[i], cJSON_CreateDoubleArray(loss + i * K, (int)K));
    cJSON_AddNumberToObject(cm, "loss_max_rel_diff_moments", max_rel(loss, loss + K, K));
    cJSON_AddNumberToObject(cm, "loss_max_rel_diff_sample", max_rel(loss, loss + 2 * K, K));
    cJSON_AddNumberToObject(cm, "latent_epoch_change_moments", change[1]);
    cJSON_AddNumberToObject(cm, "latent_epoch_change_sample", change[2]);
  }
  free(loss);
  return s;
}

/* ---- the hook -------------------------------------------------------------------------------- */
static void sizes_50k(cJSON *cm) {
  cJSON *o = cJSON_AddObjectToObject(cm, "cache_sizes_50k");
  static const vl_dtype dts[2] = {VL_F16, VL_F32};
  for (int f = 0; f < 2; f++)
    for (int d = 0; d < 2; d++) {
      uint64_t lat, text;
      char key[48];
      vl_sdl_cache_bytes_full(f ? VL_CACHE_SAMPLE : VL_CACHE_MOMENTS, dts[d], 50000, &lat, &text);
      snprintf(key, sizeof key, "latents_%s_%s", f ? "sample" : "moments", vl_dtype_name(dts[d]));
      cJSON_AddNumberToObject(o, key, (double)lat);
      if (!f) {
        snprintf(key, sizeof key, "text_%s", vl_dtype_name(dts[d]));
        cJSON_AddNumberToObject(o, key, (double)text);
      }
    }
}

vl_status vl_sdl_extra(vl_case_env *env, cJSON *res) {
  cJSON *rungs = cJSON_GetObjectItem(res, "rungs"), *rung, *uncached = NULL, *cached = NULL;
  cJSON_ArrayForEach(rung, rungs) {
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(rung, "knobs"), "cache"));
    bool none = !c || !strcmp(c, "none");
    if (none && !uncached) uncached = rung;
    if (!none && !cached) cached = rung;
  }
  cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
  if (!cm) cm = cJSON_AddObjectToObject(res, "case_metrics");
  sizes_50k(cm);
  if (!cached) return VL_OK; /* a ladder without a cached rung: nothing to compare */
  vl_sdl_build b;
  VL_TRY(build_cost(env, res, cached, &b));
  double per_image = b.images > 0 ? b.wall / (double)b.images : NAN, enc = NAN;
  cJSON_AddNumberToObject(cm, "cache_build_s", b.wall);
  cJSON_AddNumberToObject(cm, "cache_build_images", (double)b.images);
  cJSON_AddNumberToObject(cm, "cache_build_load_s", b.load);
  cJSON_AddNumberToObject(cm, "cache_build_vae_s", b.vae);
  cJSON_AddNumberToObject(cm, "cache_build_clip_s", b.clip);
  cJSON_AddNumberToObject(cm, "cache_build_write_s", b.write);
  cJSON_AddNumberToObject(cm, "cache_build_s_per_image", per_image);
  double build_payoff = b.wall;
  if (uncached && modeled_encode(env, uncached, &enc) == VL_OK) {
    double modeled = b.load + b.write + enc * (double)b.images;
    cJSON_AddNumberToObject(cm, "encode_modeled_s_per_image", enc);
    cJSON_AddNumberToObject(cm, "cache_build_s_modeled", modeled);
    const char *cs = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cached, "knobs"), "consumer"));
    if (!cs || strcmp(cs, "model")) build_payoff = modeled; /* the epochs ran on the modeled accelerator */
  }
  cJSON_AddNumberToObject(cm, "cache_build_s_payoff", build_payoff);
  double enc_cpu = b.images > 0 ? (b.vae + b.clip) / (double)b.images : NAN, e0 = run_mean(uncached, "epoch_s");
  cJSON_ArrayForEach(rung, rungs) {
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(rung, "knobs"), "cache"));
    double bs = run_mean(rung, "batch");
    if (!c || !strcmp(c, "none")) {
      set_run_metric(rung, "encode_s_per_batch", enc_cpu * bs);
      set_run_metric(rung, "inputs_s_per_batch", run_mean(rung, "load_s_per_batch") + enc_cpu * bs);
    } else {
      double save = e0 - run_mean(rung, "epoch_s");
      set_run_metric(rung, "payoff_epochs", save > 0 ? build_payoff / save : NAN);
      if (rung != cached) continue;
      cJSON_AddNumberToObject(cm, "payoff_epochs", save > 0 ? build_payoff / save : NAN);
      cJSON_AddNumberToObject(cm, "payoff_epochs_cpu_build", save > 0 ? b.wall / save : NAN);
    }
  }
  if (uncached) cJSON_AddStringToObject(cm, "payoff_against", name_of(uncached));
  cJSON_AddStringToObject(cm, "payoff_rung", name_of(cached));
  return loss_compare(env, cached, cm);
}
