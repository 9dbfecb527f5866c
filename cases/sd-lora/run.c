/* sd-lora's timed run of one rung: the captioned set (and for a cached rung its cache files,
 * built or rebuilt first), then one pass through the input pipeline alone (the load time per
 * batch: the pipeline's own wall time, no consumer), then the setting's epochs of training
 * with the rung's consumer through the engine's timed loop: the real U-Net LoRA step at the
 * run scale (consumer = model), or the modeled accelerator (consumer = modeled), a vl_model
 * whose step sleeps its planned time and uses no CPU. The last epoch is reported. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kit/interrupt.h"
#include "sdl.h"

/* ---- the modeled accelerator ------------------------------------------------------------ */
static vl_status mod_create(vl_ctx *c, const void *cfg, const vl_model_opts *o, uint64_t seed,
                            void **state) {
  (void)o;
  (void)seed;
  double *s = malloc(sizeof *s);
  if (!s) return vl_fail(c, VL_ERR_OOM, "host memory");
  *s = *(const double *)cfg;
  *state = s;
  return VL_OK;
}
static void mod_destroy(void *state) { free(state); }
static void mod_params(const void *state, vl_param_counts *out) { (void)state; memset(out, 0, sizeof *out); }
static void mod_plan_batch(const void *cfg, int64_t B, vl_batch *out) { (void)cfg; (void)B; memset(out, 0, sizeof *out); }

static vl_status mod_fwd_bwd(void *state, const vl_batch *mb, int n, vl_step_info *info) {
  int64_t images = 0;
  for (int i = 0; i < n; i++) images += vl_batch_samples(&mb[i]);
  double s = *(const double *)state * (double)images;
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && !vl_interrupted) {}
  memset(info, 0, sizeof *info);
  info->loss = NAN; /* nothing is computed */
  info->n_targets = images;
  info->loss_scale = 1;
  return VL_OK;
}
static vl_status mod_apply(void *state, vl_step_info *info) { (void)state; (void)info; return VL_OK; }

const vl_model_type vl_sdl_modeled_model = {"modeled accelerator", mod_create, mod_destroy, mod_params,
                                            mod_plan_batch, mod_fwd_bwd, mod_apply, NULL, NULL, NULL};

/* ---- the loop's data ---------------------------------------------------------------------- */
typedef struct {
  vl_case_env *env;
  const vl_sdl_rung *r;
  vl_sdl_feed *f;
  vl_sdl_micro *mb; /* accum micro-batches */
  vl_batch *b;
  long limit;       /* steps this epoch at most */
  long steps, images;
  double wait, producer;
  long batches;
  bool feed_failed; /* the feed's message is in env->err */
} run_feed;

static vl_status feed_next(void *user, long step, const vl_batch **mb, int *n, double *wait) {
  run_feed *L = user;
  (void)step;
  *n = 0;
  if (L->steps >= L->limit) return VL_OK;
  double t0 = vl_now();
  int got = 0;
  for (long j = 0; j < L->r->accum; j++) {
    bool end;
    double prod;
    vl_status s = vl_sdl_feed_next(L->env, L->f, &L->mb[j], &end, &prod);
    if (s != VL_OK) {
      L->feed_failed = true;
      return s;
    }
    if (end) break;
    L->b[got++] = L->mb[j].batch;
    L->producer += prod;
    L->images += L->mb[j].n;
    L->batches++;
  }
  *wait = vl_now() - t0;
  *mb = L->b;
  *n = got;
  return VL_OK;
}

static void feed_after(void *user, long step, bool timed, const vl_step_info *info, double dt, double wait) {
  run_feed *L = user;
  (void)step; (void)timed; (void)info; (void)dt;
  L->wait += wait;
  L->steps++;
}

/* The input pipeline alone over (at most `limit` batches of) epoch 0: wall and producer
 * seconds per batch. */
static vl_status pipeline_pass(vl_case_env *env, run_feed *L, long limit, double *wall_pb, double *prod_pb) {
  VL_TRY(vl_sdl_feed_epoch(env, L->f, 0));
  long nb = 0;
  double prod = 0, t0 = vl_now();
  while (nb < limit && !vl_interrupted) {
    bool end;
    double p;
    VL_TRY(vl_sdl_feed_next(env, L->f, &L->mb[0], &end, &p));
    if (end) break;
    prod += p;
    nb++;
  }
  if (vl_interrupted) return vl_case_fail(env, VL_ERR_INTERRUPTED, "interrupted");
  *wall_pb = nb ? (vl_now() - t0) / (double)nb : NAN;
  *prod_pb = nb ? prod / (double)nb : NAN;
  return VL_OK;
}

typedef struct {
  double wall, wait, producer;
  long steps, images, batches;
} epoch_m;

static cJSON *epoch_json(const epoch_m *e) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "epoch_s", e->wall);
  cJSON_AddNumberToObject(o, "wait_s", e->wait);
  cJSON_AddNumberToObject(o, "steps", (double)e->steps);
  cJSON_AddNumberToObject(o, "images", (double)e->images);
  return o;
}

/* The cache's sizes and state on the rung's run. */
static void cache_json(cJSON *out, const vl_sdl_caches *cc, const vl_sdl_build *b) {
  uint64_t disk = vl_cache_disk_bytes(cc->lat) + vl_cache_disk_bytes(cc->text);
  uint64_t fmt = vl_cache_file_bytes(vl_cache_key_of(cc->lat), vl_cache_count(cc->lat)) +
                 vl_cache_file_bytes(vl_cache_key_of(cc->text), vl_cache_count(cc->text));
  cJSON_AddNumberToObject(out, "cache_disk_bytes", (double)disk);
  cJSON_AddNumberToObject(out, "cache_latent_disk_bytes", (double)vl_cache_disk_bytes(cc->lat));
  cJSON_AddNumberToObject(out, "cache_text_disk_bytes", (double)vl_cache_disk_bytes(cc->text));
  cJSON_AddNumberToObject(out, "cache_ram_bytes", (double)(vl_cache_ram_bytes(cc->lat) + vl_cache_ram_bytes(cc->text)));
  cJSON_AddNumberToObject(out, "cache_records", (double)vl_cache_count(cc->lat));
  cJSON_AddBoolToObject(out, "cache_bytes_match_format", disk == fmt);
  cJSON_AddNumberToObject(out, "cache_open_s", b->open);
  cJSON_AddStringToObject(out, "cache_state", b->built ? "built" : "valid");
  if (b->why[0]) cJSON_AddStringToObject(out, "cache_found", b->why);
  if (!b->built) return;
  cJSON *o = cJSON_AddObjectToObject(out, "cache_build");
  cJSON_AddNumberToObject(o, "images", (double)b->images);
  cJSON_AddNumberToObject(o, "wall_s", b->wall);
  cJSON_AddNumberToObject(o, "load_s", b->load);
  cJSON_AddNumberToObject(o, "vae_s", b->vae);
  cJSON_AddNumberToObject(o, "clip_s", b->clip);
  cJSON_AddNumberToObject(o, "write_s", b->write);
}

typedef struct {
  vl_captions *set;
  vl_sdl_caches cc;
  vl_sdl_build build;
  vl_ctx *c;
  vl_model *m;
  run_feed L;
  vl_loop_result res;
} run_state;

static void run_free(run_state *s, long accum) {
  vl_sdl_feed_close(s->L.f);
  for (long j = 0; s->L.mb && j < accum; j++) vl_sdl_micro_free(&s->L.mb[j]);
  free(s->L.mb);
  free(s->L.b);
  vl_loop_result_free(&s->res);
  vl_model_destroy(s->m);
  vl_ctx_destroy(s->c);
  vl_sdl_caches_close(&s->cc);
  vl_captions_close(s->set);
}

/* Data, caches, context, consumer and feed of the rung. */
static vl_status run_setup(vl_case_env *env, const vl_knobs *k, const vl_sdl_rung *r, int64_t B, run_state *s,
                           double *modeled) {
  VL_TRY(vl_sdl_open_set(env, r, &s->set));
  if (r->cache != VL_SDL_CACHE_NONE)
    VL_TRY(vl_sdl_caches_open(env, r, s->set, r->store, r->cache == VL_SDL_CACHE_RAM, &s->cc, &s->build));
  vl_status st = vl_ctx_create(&s->c, env->device, VL_NO_CAP);
  if (st != VL_OK) return vl_case_fail(env, st, "no %s context", vl_device_name(env->device));
  *modeled = NAN;
  if (r->consumer == VL_SDL_MODELED) {
    VL_TRY(vl_sdl_modeled_s_per_image(env, k, env->scale, B, modeled));
    st = vl_model_create(s->c, &vl_sdl_modeled_model, modeled, (uint64_t)r->seed, &s->m);
  } else {
    st = vl_model_create(s->c, &vl_model_sd, &r->model, (uint64_t)r->seed, &s->m);
  }
  if (st != VL_OK) return vl_case_fail(env, st, "the consumer: %s", s->c->err);
  s->L.mb = calloc((size_t)r->accum, sizeof *s->L.mb);
  s->L.b = calloc((size_t)r->accum, sizeof *s->L.b);
  if (!s->L.mb || !s->L.b) return vl_case_fail(env, VL_ERR_OOM, "host memory for the batches");
  for (long j = 0; j < r->accum; j++)
    if (vl_sdl_micro_alloc(&r->model, B, &s->L.mb[j]) != VL_OK)
      return vl_case_fail(env, VL_ERR_OOM, "host memory for the batches");
  return vl_sdl_feed_open(env, r, s->set, r->cache != VL_SDL_CACHE_NONE ? &s->cc : NULL, B, true, &s->L.f);
}

/* The setting's epochs through the loop, epoch by epoch; the last one's numbers in *last. */
static vl_status run_epochs(vl_case_env *env, const vl_sdl_rung *r, run_state *s, long limit, cJSON *eps,
                            epoch_m *last) {
  vl_loop_cfg cfg = {.warmup = r->warmup, .total = -1, .reset_peaks_after_warmup = true, .profile = env->profile,
                     .next = feed_next, .after = feed_after, .user = &s->L, .stop = &vl_interrupted, .stop_now = &vl_terminated};
  for (long e = 1; e <= r->epochs; e++) {
    run_feed *L = &s->L;
    L->steps = L->images = L->batches = 0;
    L->wait = L->producer = 0;
    L->limit = limit;
    VL_TRY(vl_sdl_feed_epoch(env, L->f, e));
    double t0 = vl_now();
    vl_status st = vl_run_loop(s->m, &cfg, &s->res);
    if (st != VL_OK) return L->feed_failed ? st : vl_case_fail(env, st, "%s", s->c->err);
    epoch_m m = {vl_now() - t0, L->wait, L->producer, L->steps, L->images, L->batches};
    cJSON_AddItemToArray(eps, epoch_json(&m));
    *last = m;
    if (!env->quiet)
      vl_progress("  epoch %ld: %ld steps, %.2f s, data wait %.0f%%, %.1f images/s", e, m.steps, m.wall,
                  100 * m.wait / m.wall, (double)m.images / m.wall);
  }
  return VL_OK;
}

static void metrics_json(cJSON *out, const vl_sdl_rung *r, const run_state *s, const epoch_m *e, long steps_epoch) {
  double sw = e->wall / (double)(e->steps > 0 ? e->steps : 1);
  cJSON_AddNumberToObject(out, "images", (double)r->images);
  cJSON_AddNumberToObject(out, "batches_per_epoch", (double)vl_sdl_feed_batches(s->L.f));
  cJSON_AddNumberToObject(out, "steps_per_epoch", (double)steps_epoch);
  /* a steps-limited epoch is projected from its measured steps */
  cJSON_AddNumberToObject(out, "epoch_s", sw * (double)steps_epoch);
  cJSON_AddNumberToObject(out, "epoch_wall_s", e->wall);
  cJSON_AddNumberToObject(out, "step_wall_s", sw);
  cJSON_AddNumberToObject(out, "images_per_s", (double)e->images / e->wall);
  cJSON_AddNumberToObject(out, "data_wait_share", e->wait / e->wall);
  cJSON_AddNumberToObject(out, "accel_util", 1.0 - e->wait / e->wall);
  cJSON_AddNumberToObject(out, "wait_s_per_batch", e->wait / (double)(e->batches > 0 ? e->batches : 1));
  cJSON_AddNumberToObject(out, "host_bytes_bound", (double)vl_sdl_feed_host_bytes(s->L.f));
}

vl_status vl_sdl_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out) {
  (void)rep;
  vl_sdl_rung r;
  VL_TRY(vl_sdl_parse_rung(env, env->scale, k, &r));
  if (env->device == VL_DEV_PLAN)
    return vl_case_fail(env, VL_ERR_INVALID, "run needs a compute device (cpu or cuda), not plan");
  if (r.consumer == VL_SDL_MODEL && !strcmp(env->scale, "full") && env->device == VL_DEV_CPU)
    return vl_case_fail(env, VL_ERR_UNSUPPORTED, "a full-scale SD step does not run on the CPU here: use --scale "
                        "small or tiny, or consumer = modeled");
  int64_t B;
  VL_TRY(vl_sdl_run_batch(env, k, &r, &B));
  run_state s = {0};
  s.L.env = env;
  s.L.r = &r;
  double modeled;
  vl_status st = run_setup(env, k, &r, B, &s, &modeled);
  long steps_epoch = s.L.f ? (long)(vl_sdl_feed_batches(s.L.f) / r.accum) : 0;
  long limit = r.steps > 0 && r.steps < steps_epoch ? r.steps : steps_epoch;
  double load_pb = NAN, prod_pb = NAN;
  if (st == VL_OK) st = pipeline_pass(env, &s.L, limit * r.accum, &load_pb, &prod_pb);
  cJSON *eps = cJSON_CreateArray();
  epoch_m last = {0};
  if (st == VL_OK) st = run_epochs(env, &r, &s, limit, eps, &last);
  bool ran = false;
  st = vl_case_triage(env, st, env->err.msg, out, &ran); /* every failure left its message in env */
  if (ran && s.res.timed < 1) {
    st = vl_case_fail(env, VL_ERR_INVALID, "no timed step: %ld images give %ld step(s) of %lld x %ld", r.images,
                      s.res.steps, (long long)B, r.accum);
  } else if (ran) {
    cJSON_AddStringToObject(out, "consumer", r.consumer == VL_SDL_MODELED ? "modeled accelerator" : "model");
    cJSON_AddStringToObject(out, "cache", vl_sdl_cache_name(r.cache));
    cJSON_AddStringToObject(out, "cache_store", r.store == VL_CACHE_SAMPLE ? "sample" : "moments");
    cJSON_AddNumberToObject(out, "workers", (double)r.workers);
    cJSON_AddNumberToObject(out, "prefetch", (double)r.prefetch);
    cJSON_AddNumberToObject(out, "consumer_ms", r.consumer_ms);
    cJSON_AddNumberToObject(out, "modeled_s_per_image", modeled);
    cJSON_AddNumberToObject(out, "load_s_per_batch", load_pb);
    cJSON_AddNumberToObject(out, "producer_s_per_batch", prod_pb);
    /* a cached rung's U-Net inputs are what its pipeline delivers; an uncached rung's need
     * the encoders too (the extra hook adds them from the build's measured time) */
    if (r.cache != VL_SDL_CACHE_NONE) cJSON_AddNumberToObject(out, "inputs_s_per_batch", load_pb);
    vl_stats sts;
    if (r.consumer == VL_SDL_MODEL) {
      vl_mem_stats ms;
      vl_arena_stats(s.c->arena, &ms);
      vl_case_run_json(out, env, &s.res, &ms, B, r.accum, &sts);
      vl_step_spec spec = vl_sdl_step_spec(&r, B);
      vl_case_plan_check_json(out, env, &spec, ms.peak_total);
    } else {
      vl_stats_compute(s.res.times, (int)s.res.timed, &sts);
      cJSON_AddStringToObject(out, "scale", env->scale);
      cJSON_AddStringToObject(out, "device", vl_device_name(env->device));
      cJSON_AddNumberToObject(out, "batch", (double)B);
      cJSON_AddNumberToObject(out, "accum", (double)r.accum);
      cJSON_AddItemToObject(out, "step_time", vl_stats_json(&sts, s.res.times, (int)s.res.timed));
    }
    cJSON_AddNumberToObject(out, "step_seconds", sts.median);
    metrics_json(out, &r, &s, &last, steps_epoch);
    cJSON_AddItemToObject(out, "epochs", eps);
    eps = NULL;
    if (r.cache != VL_SDL_CACHE_NONE) cache_json(out, &s.cc, &s.build);
  }
  cJSON_Delete(eps);
  run_free(&s, r.accum);
  return st;
}
