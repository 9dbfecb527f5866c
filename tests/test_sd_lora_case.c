/* The sd-lora case: every rung plans at full scale and an uncached step plans more memory than
 * a cached one; bad knobs are refused naming the knob; a tiny cached run builds its caches,
 * a second run reuses them, a corrupted file is rebuilt; the cached and uncached pipelines
 * give the same latent distribution (and, with the same eps, the same latent) for an image;
 * the cache reader delivers every sample once per epoch; a tiny ladder's results make the
 * report without gnuplot. Everything runs at tiny scale in a temporary folder. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cases/sd-lora/sdl.h"
#include "harness/report.h"
#include "testutil.h"

static vl_ladder *ladder; /* large: not on the stack */

static int setup(void **state) {
  (void)state;
  ladder = malloc(sizeof *ladder);
  vl_err err;
  if (!ladder || vl_ladder_load(ladder, VRAMLAB_SOURCE_DIR, "sd-lora", &err)) return -1;
  if (tu_tmpdir(tu_tmp, sizeof tu_tmp, "vramlab-sdl-")) return -1;
  /* tiny and quick: a few images, one epoch, no loss comparison unless a test asks */
  char data[300], cache[300];
  tu_join(data, sizeof data, tu_tmp, "data");
  tu_join(cache, sizeof cache, tu_tmp, "cache");
  const char *set[][2] = {{"images", "8"}, {"epochs", "1"}, {"steps", "0"}, {"loss_steps", "0"}, {"data_dir", data},
                          {"cache_dir", cache}, {"cores", "2"}};
  for (size_t i = 0; i < sizeof set / sizeof *set; i++)
    if (vl_knob_set(&ladder->setting, set[i][0], set[i][1])) return -1;
  return 0;
}

static int teardown(void **state) {
  free(ladder);
  return tu_tmp_teardown(state);
}

static const vl_knobs *rung(const char *name) {
  int i = vl_ladder_find(ladder, name);
  assert_true(i >= 0);
  return &ladder->rungs[i].knobs;
}

static vl_case_env env_at(const char *scale, vl_device dev) {
  return (vl_case_env){.scale = scale, .device = dev, .setting = &ladder->setting, .quiet = 1};
}

/* ---- plans and checks ------------------------------------------------------------------------ */
static void test_plan_every_rung(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("sd-lora");
  vl_case_env env = env_at("full", VL_DEV_PLAN);
  double peak[VL_MAX_RUNGS], batch[VL_MAX_RUNGS], frozen[VL_MAX_RUNGS];
  for (int i = 0; i < ladder->n_rungs; i++) {
    cJSON *o = cJSON_CreateObject();
    if (c->plan(&env, "full", &ladder->rungs[i].knobs, o)) fail_msg("%s: %s", ladder->rungs[i].name, env.err.msg);
    peak[i] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "peak_bytes"));
    batch[i] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "batch"));
    frozen[i] = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "by_category"), "frozen"));
    assert_true(peak[i] > 1e9 && cJSON_IsTrue(cJSON_GetObjectItem(o, "fits")));
    assert_true(cJSON_GetArraySize(cJSON_GetObjectItem(o, "batch_curve_classic")) == VL_SDL_CURVE_N);
    bool uncached = cJSON_IsTrue(cJSON_GetObjectItem(o, "encoders_in_step"));
    assert_int_equal(uncached, i < 2); /* before, batched_workers */
    assert_int_equal(cJSON_GetObjectItem(o, "cache_latent_bytes_50k") != NULL, !uncached);
    cJSON_Delete(o);
  }
  /* before and disk_cache differ only in the cache: the uncached step holds the VAE and
   * text encoder (frozen weights) and their activations */
  assert_true(batch[0] == batch[2]);
  assert_true(peak[0] > peak[2]);
  assert_true(frozen[0] > frozen[2] + 0.2e9); /* 157M params in fp16 */
  /* after: the largest batch under 88% of 24 GiB, above the fixed 16 */
  assert_true(batch[5] > 16 && peak[5] <= 0.88 * 24.0 * (1 << 30));
}

static void expect_refused(const vl_knobs *base, const char *set, const char *names) {
  const vl_case *c = vl_case_find("sd-lora");
  vl_knobs k = *base;
  vl_err err;
  assert_int_equal(vl_knobs_apply_list(&k, set, &err), 0);
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  if (c->check(&env, &k) != VL_ERR_INVALID) fail_msg("%s was accepted", set);
  if (!strstr(env.err.msg, names)) fail_msg("%s: the message does not name '%s': %s", set, names, env.err.msg);
}

static void test_check_refuses_bad_knobs(void **state) {
  (void)state;
  const vl_knobs *b = rung("before");
  expect_refused(b, "cache=foo", "cache");
  expect_refused(b, "cache_store=latent", "cache_store");
  expect_refused(b, "cache_dtype=bf16", "cache_dtype");
  expect_refused(b, "consumer=gpu", "consumer");
  expect_refused(b, "precision=nf4", "precision");
  expect_refused(b, "attention=flash", "attention");
  expect_refused(b, "workers=-1", "workers");
  expect_refused(b, "batch=0", "batch");
  expect_refused(b, "consumer_ms=-5", "consumer_ms");
  expect_refused(rung("disk_cache"), "text_lora_rank=4", "text_lora_rank");
  expect_refused(b, "cache=ram,text_lora_rank=8", "cache = none");
  /* the text encoder trains in the step without a cache */
  const vl_case *c = vl_case_find("sd-lora");
  vl_knobs k = *b;
  vl_err err;
  assert_int_equal(vl_knobs_apply_list(&k, "text_lora_rank=4", &err), 0);
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  assert_int_equal(c->check(&env, &k), VL_OK);
  /* a bad setting is refused too */
  vl_ladder *L = malloc(sizeof *L);
  assert_non_null(L);
  *L = *ladder;
  assert_int_equal(vl_knob_set(&L->setting, "cache_mismatch", "maybe"), 0);
  env.setting = &L->setting;
  assert_int_equal(c->check(&env, b), VL_ERR_INVALID);
  assert_non_null(strstr(env.err.msg, "cache_mismatch"));
  free(L);
}

/* ---- a tiny cached run ------------------------------------------------------------------------- */
static cJSON *run_rung(const char *name, const char *set) {
  const vl_case *c = vl_case_find("sd-lora");
  vl_knobs k = *rung(name);
  vl_err err;
  if (set) assert_int_equal(vl_knobs_apply_list(&k, set, &err), 0);
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  cJSON *o = cJSON_CreateObject();
  if (c->run(&env, &k, 0, o)) fail_msg("run %s: %s", name, env.err.msg);
  return o;
}

static const char *str_of(const cJSON *o, const char *k) {
  const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(o, k));
  return s ? s : "";
}

static void flip_byte(const char *path, long off) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  int ch = fgetc(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  fputc(ch ^ 0x5a, f);
  fclose(f);
}

static void test_cached_run_builds_reuses_rebuilds(void **state) {
  (void)state;
  cJSON *o = run_rung("disk_cache", NULL);
  assert_string_equal(str_of(o, "cache_state"), "built");
  assert_true(cJSON_IsObject(cJSON_GetObjectItem(o, "cache_build")));
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "cache_bytes_match_format")));
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "epoch_s")) > 0);
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "load_s_per_batch")) > 0);
  double disk = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "cache_disk_bytes"));
  cJSON_Delete(o);
  /* a second run finds them valid: no rebuild; RAM mode holds every payload byte */
  o = run_rung("ram_cache", NULL);
  assert_string_equal(str_of(o, "cache_state"), "valid");
  assert_null(cJSON_GetObjectItem(o, "cache_build"));
  double ram = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "cache_ram_bytes"));
  assert_true(ram > 0 && ram < disk);
  cJSON_Delete(o);
  /* a flipped byte inside a record: found (every CRC checked before use) and rebuilt */
  vl_sdl_rung r;
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  assert_int_equal(vl_sdl_parse_rung(&env, "tiny", rung("disk_cache"), &r), VL_OK);
  char lat[2048], text[2048];
  assert_int_equal(vl_sdl_cache_paths(&env, &r, VL_CACHE_MOMENTS, lat, text, sizeof lat), VL_OK);
  flip_byte(lat, VL_CACHE_HEADER_BYTES + 100);
  o = run_rung("disk_cache", NULL);
  assert_string_equal(str_of(o, "cache_state"), "built");
  assert_non_null(strstr(str_of(o, "cache_found"), "corrupt"));
  cJSON_Delete(o);
  /* a truncated text file too */
  assert_int_equal(truncate(text, VL_CACHE_HEADER_BYTES + 10), 0);
  o = run_rung("disk_cache", NULL);
  assert_string_equal(str_of(o, "cache_state"), "built");
  cJSON_Delete(o);
  /* an image whose bytes change but not its size (nor its pixels: a byte of the JFIF
   * header's density): the latents' key differs, the cache is stale and rebuilt */
  vl_captions *img_set = NULL;
  assert_int_equal(vl_sdl_open_set(&env, &r, &img_set), VL_OK);
  char img[2048], jfif[5] = "";
  assert_non_null(vl_captions_path(img_set, 3, img, sizeof img));
  vl_captions_close(img_set);
  FILE *f = fopen(img, "rb");
  assert_non_null(f);
  assert_int_equal(fseek(f, 6, SEEK_SET), 0);
  assert_int_equal(fread(jfif, 1, 4, f), 4);
  fclose(f);
  assert_string_equal(jfif, "JFIF");
  struct stat before, after;
  assert_int_equal(stat(img, &before), 0);
  flip_byte(img, 15); /* the low byte of Xdensity */
  assert_int_equal(stat(img, &after), 0);
  assert_int_equal(before.st_size, after.st_size);
  o = run_rung("disk_cache", NULL);
  assert_string_equal(str_of(o, "cache_state"), "built");
  if (!strstr(str_of(o, "cache_found"), "data_hash")) fail_msg("cache_found: %s", str_of(o, "cache_found"));
  cJSON_Delete(o);
  o = run_rung("disk_cache", NULL); /* and then valid again */
  assert_string_equal(str_of(o, "cache_state"), "valid");
  cJSON_Delete(o);
  /* another key (fp32 storage) is another file; under cache_mismatch = error a stale file
   * stops the run naming the field */
  vl_ladder *L = malloc(sizeof *L);
  assert_non_null(L);
  *L = *ladder;
  assert_int_equal(vl_knob_set(&L->setting, "cache_mismatch", "error"), 0);
  assert_int_equal(vl_knob_set(&L->setting, "seed", "2"), 0); /* other weights */
  vl_case_env e2 = {.scale = "tiny", .device = VL_DEV_CPU, .setting = &L->setting, .quiet = 1};
  vl_sdl_rung r2;
  assert_int_equal(vl_sdl_parse_rung(&e2, "tiny", rung("disk_cache"), &r2), VL_OK);
  char lat2[2048], text2[2048];
  assert_int_equal(vl_sdl_cache_paths(&e2, &r2, VL_CACHE_MOMENTS, lat2, text2, sizeof lat2), VL_OK);
  /* the seed-2 caches sit in their own folder: copy seed 1's there, so the key differs */
  char cmd[5000];
  snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\" && cp '%s' '%s'", lat2, lat, lat2);
  assert_int_equal(system(cmd), 0);
  vl_captions *set = NULL;
  assert_int_equal(vl_sdl_open_set(&e2, &r2, &set), VL_OK);
  vl_sdl_caches cc;
  vl_sdl_build b;
  assert_int_equal(vl_sdl_caches_open(&e2, &r2, set, VL_CACHE_MOMENTS, false, &cc, &b), VL_ERR_INVALID);
  assert_non_null(strstr(e2.err.msg, "model_hash"));
  vl_captions_close(set);
  free(L);
}

/* ---- the same latent with and without the cache ---------------------------------------------- */
static void test_cached_and_uncached_latents_agree(void **state) {
  (void)state;
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  vl_knobs k = *rung("disk_cache");
  vl_err err;
  assert_int_equal(vl_knobs_apply_list(&k, "precision=fp32,cache_dtype=fp32", &err), 0);
  vl_sdl_rung r;
  assert_int_equal(vl_sdl_parse_rung(&env, "tiny", &k, &r), VL_OK);
  vl_captions *set = NULL;
  assert_int_equal(vl_sdl_open_set(&env, &r, &set), VL_OK);
  vl_sdl_caches cc;
  vl_sdl_build b;
  if (vl_sdl_caches_open(&env, &r, set, VL_CACHE_MOMENTS, false, &cc, &b)) fail_msg("%s", env.err.msg);
  /* the uncached path: the loader's image 3, the model's own VAE on it */
  const int64_t idx = 3, C = r.model.vae.latent_ch, h = r.model.unet.sample, side = vl_sd_image_side(&r.model);
  vl_loader_cfg lc;
  vl_sdl_loader_cfg(&r, &lc, 1, 0, false);
  vl_dataset ds = vl_captions_dataset(set);
  vl_loader *l = NULL;
  vl_err lerr;
  assert_int_equal(vl_loader_create(&l, &lc, &ds, &lerr), VL_OK);
  assert_int_equal(vl_loader_start_epoch(l, 0), VL_OK);
  vl_batch_buf *bb = NULL;
  for (int64_t i = 0; i <= idx; i++) {
    if (bb) vl_loader_release(l, bb);
    assert_int_equal(vl_loader_next(l, &bb), VL_OK);
  }
  assert_int_equal(bb->index[0], idx);
  vl_ctx *c = NULL;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_sd_vae *vae = NULL;
  assert_int_equal(vl_sd_vae_create(c, &r.model.vae, vl_sd_vae_seed((uint64_t)r.seed), &vae), VL_OK);
  int64_t ish[4] = {1, 3, side, side}, lsh[4] = {1, C, h, h};
  float *eps = malloc((size_t)(C * h * h) * sizeof(float)), *noise = malloc((size_t)(C * h * h) * sizeof(float));
  int32_t t;
  vl_sdl_draw((uint64_t)r.seed, 0, idx, C * h * h, eps, noise, &t);
  vl_tensor img = tu_tnew(c, VL_F32, 3 * side * side, bb->x), ep = tu_tnew(c, VL_F32, C * h * h, eps), z, mom;
  vl_tensor_set_shape(&img, VL_F32, 4, ish);
  vl_tensor_set_shape(&ep, VL_F32, 4, lsh);
  assert_int_equal(vl_sd_vae_encode(vae, &img, &ep, &z, &mom, VL_MEM_TEMP), VL_OK);
  /* the distribution: the cache's moments record is the in-step VAE's */
  float *rec = malloc((size_t)(2 * C * h * h) * sizeof(float)), *got = malloc((size_t)(2 * C * h * h) * sizeof(float));
  assert_int_equal(vl_cache_read(c, cc.lat, idx, rec), VL_OK);
  tu_tget(&mom, got);
  tu_assert_close(rec, got, 2 * C * h * h, 1e-5, 1e-4, "cached vs in-step moments");
  /* the latent: the feed's z for the image (epoch 0, moments sampled with the same eps) is
   * the in-step VAE's z */
  vl_sdl_feed *f = NULL;
  r.workers = 2;
  assert_int_equal(vl_sdl_feed_open(&env, &r, set, &cc, 4, false, &f), VL_OK);
  assert_int_equal(vl_sdl_feed_epoch(&env, f, 0), VL_OK);
  vl_sdl_micro m;
  assert_int_equal(vl_sdl_micro_alloc(&r.model, 4, &m), VL_OK);
  bool end;
  double p;
  assert_int_equal(vl_sdl_feed_next(&env, f, &m, &end, &p), VL_OK);
  assert_false(end);
  assert_int_equal(m.index[idx], idx);
  tu_tget(&z, got);
  tu_assert_close(m.latents + idx * C * h * h, got, C * h * h, 1e-5, 1e-4, "feed's z vs in-step z");
  /* and the same U-Net noise and timestep as the uncached pipeline draws */
  assert_int_equal(m.t[idx], t);
  assert_memory_equal(m.noise + idx * C * h * h, noise, (size_t)(C * h * h) * sizeof(float));
  vl_sdl_micro_free(&m);
  vl_sdl_feed_close(f);
  TU_TFREE(c, &mom, &z, &ep, &img);
  vl_sd_vae_destroy(vae);
  vl_ctx_destroy(c);
  vl_loader_release(l, bb);
  vl_loader_destroy(l);
  free(eps); free(noise); free(rec); free(got);
  vl_sdl_caches_close(&cc);
  vl_captions_close(set);
}

/* ---- the cache reader over an epoch ------------------------------------------------------------ */
static void count_epoch(vl_case_env *env, vl_sdl_rung *r, vl_captions *set, vl_sdl_caches *cc, int64_t B,
                        int64_t epoch, int64_t want_batches, int64_t want_samples) {
  int64_t n = vl_captions_len(set), seen[64] = {0}, got = 0, batches = 0;
  vl_sdl_feed *f = NULL;
  assert_int_equal(vl_sdl_feed_open(env, r, set, cc, B, true, &f), VL_OK);
  assert_int_equal(vl_sdl_feed_batches(f), want_batches);
  assert_int_equal(vl_sdl_feed_epoch(env, f, epoch), VL_OK);
  vl_sdl_micro m;
  assert_int_equal(vl_sdl_micro_alloc(&r->model, B, &m), VL_OK);
  for (;;) {
    bool end;
    double p;
    assert_int_equal(vl_sdl_feed_next(env, f, &m, &end, &p), VL_OK);
    if (end) break;
    batches++;
    for (int64_t j = 0; j < m.n; j++) {
      assert_true(m.index[j] >= 0 && m.index[j] < n);
      seen[m.index[j]]++;
      got++;
    }
  }
  assert_int_equal(batches, want_batches);
  assert_int_equal(got, want_samples);
  for (int64_t i = 0; i < n; i++) assert_true(seen[i] <= 1);
  vl_sdl_micro_free(&m);
  vl_sdl_feed_close(f);
}

/* The order of an epoch's samples through a feed (B = 1, shuffled). */
static void feed_order(vl_case_env *env, vl_sdl_rung *r, vl_captions *set, vl_sdl_caches *cc, int64_t epoch,
                       int64_t *order) {
  vl_sdl_feed *f = NULL;
  assert_int_equal(vl_sdl_feed_open(env, r, set, cc, 1, true, &f), VL_OK);
  assert_int_equal(vl_sdl_feed_epoch(env, f, epoch), VL_OK);
  vl_sdl_micro m;
  assert_int_equal(vl_sdl_micro_alloc(&r->model, 1, &m), VL_OK);
  for (int64_t i = 0; i < vl_captions_len(set); i++) {
    bool end;
    double p;
    assert_int_equal(vl_sdl_feed_next(env, f, &m, &end, &p), VL_OK);
    assert_false(end);
    order[i] = m.index[0];
  }
  vl_sdl_micro_free(&m);
  vl_sdl_feed_close(f);
}

static void test_cache_reader_every_sample_once(void **state) {
  (void)state;
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  vl_sdl_rung r;
  assert_int_equal(vl_sdl_parse_rung(&env, "tiny", rung("prefetch16"), &r), VL_OK);
  vl_captions *set = NULL;
  assert_int_equal(vl_sdl_open_set(&env, &r, &set), VL_OK);
  vl_sdl_caches cc;
  vl_sdl_build b;
  if (vl_sdl_caches_open(&env, &r, set, VL_CACHE_MOMENTS, true, &cc, &b)) fail_msg("%s", env.err.msg);
  assert_int_equal(vl_captions_len(set), 8);
  r.workers = 2;
  r.prefetch = 2;
  r.drop_last = 0;
  for (int64_t e = 0; e < 3; e++) count_epoch(&env, &r, set, &cc, 3, e, 3, 8); /* 3 + 3 + 2 */
  r.drop_last = 1;
  count_epoch(&env, &r, set, &cc, 3, 0, 2, 6);
  r.workers = 0;
  count_epoch(&env, &r, set, &cc, 3, 1, 2, 6);
  /* the same order as the loader's (uncached rungs): consumer = model rungs see the same
   * samples with and without the cache */
  vl_sdl_rung u;
  assert_int_equal(vl_sdl_parse_rung(&env, "tiny", rung("before"), &u), VL_OK);
  r.drop_last = u.drop_last = 0;
  for (int64_t e = 0; e < 3; e++) {
    int64_t a[8], b2[8];
    feed_order(&env, &r, set, &cc, e, a);
    feed_order(&env, &u, set, NULL, e, b2);
    assert_memory_equal(a, b2, sizeof a);
  }
  vl_sdl_caches_close(&cc);
  vl_captions_close(set);
}

/* ---- the ladder through the report ---------------------------------------------------------------- */
static void test_report_of_a_tiny_ladder(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("sd-lora");
  vl_ladder *L = malloc(sizeof *L);
  assert_non_null(L);
  *L = *ladder;
  assert_int_equal(vl_knob_set(&L->setting, "loss_steps", "2"), 0);
  assert_int_equal(vl_knob_set(&L->setting, "steps", "1"), 0);
  assert_int_equal(vl_knob_set(&L->setting, "warmup", "0"), 0);
  vl_case_env env = {.scale = "tiny", .device = VL_DEV_CPU, .setting = &L->setting, .quiet = 1};
  cJSON *res = cJSON_CreateObject();
  cJSON_AddNumberToObject(res, "schema_version", VL_RESULTS_SCHEMA_VERSION);
  cJSON_AddStringToObject(res, "case", c->id);
  cJSON_AddStringToObject(cJSON_AddObjectToObject(res, "env"), "device", "cpu");
  cJSON_AddStringToObject(res, "run_scale", "tiny");
  cJSON *rungs = cJSON_AddArrayToObject(res, "rungs");
  for (int i = 0; i < L->n_rungs; i++) {
    cJSON *o = cJSON_CreateObject(), *kn;
    cJSON_AddStringToObject(o, "name", L->rungs[i].name);
    cJSON_AddStringToObject(o, "label", L->rungs[i].label);
    kn = cJSON_AddObjectToObject(o, "knobs");
    for (int j = 0; j < L->rungs[i].knobs.n; j++)
      cJSON_AddStringToObject(kn, L->rungs[i].knobs.k[j].key, L->rungs[i].knobs.k[j].val);
    vl_case_env pe = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L->setting, .quiet = 1};
    if (c->plan(&pe, "full", &L->rungs[i].knobs, cJSON_AddObjectToObject(o, "plan"))) fail_msg("%s", pe.err.msg);
    cJSON *run = cJSON_CreateObject();
    if (c->run(&env, &L->rungs[i].knobs, 0, run)) fail_msg("%s: %s", L->rungs[i].name, env.err.msg);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "runs"), run);
    cJSON_AddItemToArray(rungs, o);
  }
  if (c->extra(&env, res)) fail_msg("extra: %s", env.err.msg);
  const cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(cm, "cache_build_s")) > 0);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cm, "loss_cached_moments")), 2);
  /* the same samples, noise and timesteps: the cached moments' loss is the uncached one's up
   * to the fp16 cache's rounding; a stored sample is another draw */
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(cm, "loss_max_rel_diff_moments")) < 2e-3);
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(cm, "latent_epoch_change_moments")) > 0.01);
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(cm, "latent_epoch_change_sample")) == 0);
  char path[512], md[512];
  vl_err err = {0};
  tu_join(path, sizeof path, tu_tmp, "results.json");
  tu_join(md, sizeof md, tu_tmp, "sd-lora.md");
  char *text = cJSON_Print(res);
  tu_write_text(path, text);
  free(text);
  setenv("VRAMLAB_NO_GNUPLOT", "1", 1);
  if (vl_report_write(c, L, path, md, &err)) fail_msg("report: %s", err.msg);
  uint8_t *t;
  size_t n = tu_slurp(md, &t);
  t[n] = 0;
  const char *want[] = {"## Claims of the articles", "## Ladder at full scale (planned, 512x512)", "## Ladder at `tiny` scale",
                        "## The cache", "**Payoff**", "| latents, moments",
                        "Plots are missing: rendering is off",
                        "| 3.28 GB (`ram_cache`) | planned | the range; exact | **does not hold** |",
                        /* #19: classic attention is the second number of the efficient row, not a row of its own */
                        "33 (`after`); planned: 8 (`after`) (holds, not counted) | planned | the range; exact | **does not hold** |",
                        "**Findings:**\n- 50k cached latents take 3.28 GB, not 20 GB",
                        "`tiny` scale: SD 1.5's structure with U-Net channels 32/64/64/64",
                        "| `a6000_mem` |", "article 000: 10 checkable, 10 in this report",
                        /* the cache's loss check is the engine's validation: in the appendix */
                        "## Appendix: the engine's own validation", "### sd-lora: the loss with and without the cache"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    if (!strstr((char *)t, want[i])) fail_msg("the report lacks \"%s\":\n%s", want[i], (char *)t);
  const char *gone[] = {"| `batch_24_classic` |", "| `batch_48_classic` |", "| `memory_batch16", "| `load_time_pipeline` |"};
  for (size_t i = 0; i < sizeof gone / sizeof *gone; i++)
    if (strstr((char *)t, gone[i])) fail_msg("the report still has \"%s\" as a row of its own", gone[i]);
  assert_true(strstr((char *)t, "### sd-lora: the loss") > strstr((char *)t, "## Plots"));
  assert_null(strstr((char *)t, " nan"));
  assert_null(strstr((char *)t, "-nan"));
  free(t);
  const char *files[] = {"load.gp", "load.dat", "payoff.dat", "batch.dat", "attn_classic.dat", "mem_by_category.gp"};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char p[600];
    snprintf(p, sizeof p, "%s/sd-lora/%s", tu_tmp, files[i]);
    if (access(p, F_OK)) fail_msg("the report wrote no %s", p);
  }
  cJSON_Delete(res);
  free(L);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_every_rung),
      cmocka_unit_test(test_check_refuses_bad_knobs),
      cmocka_unit_test(test_cached_run_builds_reuses_rebuilds),
      cmocka_unit_test(test_cached_and_uncached_latents_agree),
      cmocka_unit_test(test_cache_reader_every_sample_once),
      cmocka_unit_test(test_report_of_a_tiny_ladder),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
