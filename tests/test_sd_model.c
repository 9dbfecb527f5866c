/* The SD 1.5 LoRA step as a vl_model (engine/models/sd_model.c, vramlab/sd.h): diffusers'
 * DDPM schedule bit for bit, the whole step (noising, U-Net, fp32 MSE, backward) against
 * diffusers + peft in float64 (tests/fixtures/sd_unet_parity.bin), parameters by module at
 * full scale (diffusers' / transformers' / peft's counts), a full-scale plan in < 0.5 s,
 * planned peak == measured peak on the CPU with cached inputs and with the encoders in the
 * step, 2 micro-batches of 1 == one batch of 2, and bad batches refused. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/backend.h"
#include "vramlab/run.h"
#include "vramlab/sd.h"

#include "sd_fixture.c"
#include "sd_unet_fx.c"

#define OK(expr) assert_int_equal((expr), VL_OK)

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
 * num_train_timesteps=1000).alphas_cumprod (diffusers 0.42, torch 2.x, CPU), as float32 bit
 * patterns: the C schedule must be the same floats, not merely close. */
static void test_ddpm_schedule(void **state) {
  (void)state;
  float a[VL_DDPM_STEPS];
  vl_ddpm_alphas_cumprod(VL_DDPM_STEPS, 0.00085, 0.012, a);
  const int t[] = {0, 1, 10, 499, 500, 700, 999};
  const uint32_t want[] = {1065338955u, 1065324628u, 1065192680u, 1049504432u,
                           1049459571u, 1034485932u, 999863222u};
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    if (bits(a[t[i]]) != want[i])
      fail_msg("alphas_cumprod[%d] = %.9g (bits %u), diffusers %u", t[i], a[t[i]], bits(a[t[i]]), want[i]);
  }
  /* the whole schedule against the fixture's (float64 there, from the same float32 values) */
  sdfx_file fx;
  char path[512], err[1024];
  sdfx_fixture_path(path, sizeof path, "sd_unet_parity.bin");
  if (sdfx_open(&fx, path, err, sizeof err) != 0) fail_msg("%s", err);
  int64_t n;
  double *w = sdfx_get_f64(&fx, "ddpm.alphas_cumprod", &n, err, sizeof err);
  if (!w) fail_msg("%s", err);
  assert_int_equal(n, VL_DDPM_STEPS);
  for (int i = 0; i < VL_DDPM_STEPS; i++)
    if ((double)a[i] != w[i]) fail_msg("alphas_cumprod[%d] = %.9g, fixture %.9g", i, a[i], w[i]);
  free(w);
  sdfx_close(&fx);
}

/* ---- the whole step against diffusers ------------------------------------------------------ */

static float *fx_f32(const sdfx_file *fx, const char *name, int64_t *n) {
  char err[1024];
  float *h = sdfx_get_f32(fx, name, n, err, sizeof err);
  if (!h) fail_msg("%s", err);
  return h;
}

static void step_parity(vl_attn_impl attn, bool ckpt) {
  sdfx_file fx;
  char path[512], err[1024];
  sdfx_fixture_path(path, sizeof path, "sd_unet_parity.bin");
  if (sdfx_open(&fx, path, err, sizeof err) != 0) fail_msg("%s", err);
  vl_sd_cfg cfg;
  assert_int_equal(vl_sd_preset("tiny", &cfg), 0);
  sdfx_unet_cfg(&fx, attn, &cfg.unet);
  cfg.unet.checkpoint = ckpt;
  vl_ctx *c;
  OK(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP));
  vl_model *m = NULL;
  OK(vl_model_create(c, &vl_model_sd, &cfg, 3, &m));
  vl_sd_unet *u = vl_sd_model_unet(m);
  assert_non_null(u);
  sdfx_unet_load(&fx, c, u);
  /* the batch as the data side gives it: clean latents, noise, timesteps, text */
  int64_t nl = 0, nn = 0, nc = 0;
  float *lat = fx_f32(&fx, "input.latents", &nl), *noise = fx_f32(&fx, "input.noise", &nn);
  float *ctx = fx_f32(&fx, "input.encoder_hidden_states", &nc);
  const sdfx_record *ehs = sdfx_find(&fx, "input.encoder_hidden_states");
  int64_t B = ehs->dims[0], S = cfg.unet.sample, ts64[8];
  if (sdfx_read_i64(&fx, "input.timesteps", ts64, B, err, sizeof err)) fail_msg("%s", err);
  int32_t ts[8];
  for (int64_t i = 0; i < B; i++) ts[i] = (int32_t)ts64[i];
  int64_t ls[4] = {B, cfg.unet.in_ch, S, S}, cs[3] = {B, ehs->dims[1], ehs->dims[2]};
  assert_int_equal(nl, ls[0] * ls[1] * ls[2] * ls[3]);
  vl_batch b = {0};
  vl_batch_add(&b, "latents", VL_F32, 4, ls, lat);
  vl_batch_add(&b, "context", VL_F32, 3, cs, ctx);
  vl_batch_add(&b, "noise", VL_F32, 4, ls, noise);
  vl_batch_add(&b, "timesteps", VL_I32, 1, &B, ts);
  vl_step_info info;
  OK(vl_model_fwd_bwd(m, &b, 1, &info));
  double lw;
  if (sdfx_read_f64(&fx, "out.loss", &lw, 1, err, sizeof err)) fail_msg("%s", err);
  double e_grad = 0;
  int n_lora;
  vl_param *lp = vl_sd_unet_trainable(u, &n_lora);
  for (int i = 0; i < n_lora; i++) {
    char rec[160];
    snprintf(rec, sizeof rec, "grad.%s", lp[i].name);
    int64_t gn = 0;
    double *gw = sdfx_get_f64(&fx, rec, &gn, err, sizeof err);
    if (!gw) fail_msg("%s", err);
    float *gh = malloc((size_t)gn * 4);
    OK(vl_param_read_grad(c, &lp[i], gh));
    double e = sdfx_max_norm_err(gh, gw, gn);
    if (e > e_grad) e_grad = e;
    free(gh);
    free(gw);
  }
  print_message("  step parity (%s%s): loss %.9f vs diffusers %.9f (rel %.2e), LoRA gradients "
                "max err/max %.2e\n", vl_attn_impl_name(attn), ckpt ? ", checkpointed" : "",
                info.loss, lw, fabs(info.loss - lw) / lw, e_grad);
  assert_int_equal(info.n_targets, nl);
  assert_true(fabs(info.loss - lw) <= 1e-5 * lw);
  assert_true(e_grad < 1e-4);
  free(lat); free(noise); free(ctx);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  sdfx_close(&fx);
}

static void test_step_parity(void **state) {
  (void)state;
  step_parity(VL_ATTN_EFFICIENT, false);
  step_parity(VL_ATTN_CLASSIC, true);
}

/* ---- full scale: counts and plan time --------------------------------------------------- */

static void test_full_scale(void **state) {
  (void)state;
  vl_sd_cfg cfg;
  assert_int_equal(vl_sd_preset("full", &cfg), 0);
  vl_sd_set_precision(&cfg, VL_F16, VL_F16);
  assert_int_equal(vl_sd_image_side(&cfg), 512);
  vl_step_spec s = {.type = &vl_model_sd, .cfg = &cfg, .seed = 1, .batch = {0}, .accum = 1};
  vl_step_spec_set_batch(&s, 1);
  vl_plan_result p;
  double t0 = vl_now();
  OK(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &p));
  double dt = vl_now() - t0;
  /* diffusers UNet2DConditionModel, AutoencoderKL encoder + quant_conv, transformers
   * CLIPTextModel, peft LoRA r=4 on to_q/k/v/out.0 (tests/torch/sd_param_counts.py) */
  const int64_t want[4] = {859520964, 34163664, 123060480, 797184};
  const char *names[4] = VL_SD_MODULES;
  assert_int_equal(p.params.n_modules, 4);
  for (int i = 0; i < 4; i++) {
    assert_string_equal(p.params.module_name[i], names[i]);
    assert_int_equal(p.params.module_count[i], want[i]);
  }
  assert_int_equal(p.params.trainable, 797184);
  assert_int_equal(p.params.total, 859520964 + 797184); /* cached: no encoders in memory */
  print_message("  full-scale LoRA step, B=1, fp16, cached: planned in %.3f s, peak %.3f GiB\n", dt,
                (double)p.mem.peak_total / (1 << 30));
  assert_true(dt < 0.5);
  vl_plan_result_free(&p);
  /* the encoders in the step: their weights in memory, their activations at 512x512 */
  cfg.encoders_in_step = true;
  vl_step_spec_set_batch(&s, 1);
  vl_plan_result q;
  OK(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &q));
  assert_int_equal(q.params.total, 859520964 + 797184 + 34163664 + 123060480);
  assert_true(q.mem.at_peak[VL_MEM_FROZEN] > (size_t)2 * (859520964 + 34163664 + 123060480));
  vl_plan_result_free(&q);
  /* and the text encoder trained: peft's count for r=4 on q/k/v/out_proj is 294,912 */
  cfg.clip.lora_rank = 4;
  cfg.clip.lora_alpha = 4;
  OK(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &q));
  assert_int_equal(q.params.trainable, 797184 + 294912);
  assert_int_equal(q.params.module_count[3], 797184 + 294912);
  vl_plan_result_free(&q);
  /* it needs the text encoder in the step */
  cfg.encoders_in_step = false;
  assert_int_equal(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &q), VL_ERR_INVALID);
  vl_plan_result_free(&q);
  assert_non_null(strstr(q.err, "text-encoder LoRA"));
}

/* ---- planned == measured; accumulation -------------------------------------------------- */

typedef struct {
  float *lat, *ctx, *noise, *img, *vnoise;
  int32_t *t, *tok;
} host_batch;

/* A seeded batch of B samples with the planned batch's shapes, into b (data filled). */
static void make_batch(const vl_sd_cfg *cfg, int64_t B, uint64_t seed, vl_batch *b, host_batch *h) {
  vl_model_sd.plan_batch(cfg, B, b);
  vl_rng r;
  vl_rng_seed(&r, seed);
  memset(h, 0, sizeof *h);
  for (int i = 0; i < b->n; i++) {
    vl_batch_tensor *t = &b->t[i];
    int64_t e = 1;
    for (int d = 0; d < t->ndim; d++) e *= t->shape[d];
    if (t->dtype == VL_I32) {
      int32_t *x = malloc((size_t)e * 4);
      int32_t top = !strcmp(t->name, "tokens") ? (int32_t)cfg->clip.vocab : VL_DDPM_STEPS;
      for (int64_t q = 0; q < e; q++) x[q] = (int32_t)vl_rng_below(&r, (uint64_t)top);
      if (!strcmp(t->name, "tokens")) h->tok = x; else h->t = x;
      t->data = x;
    } else {
      float *x = malloc((size_t)e * 4);
      for (int64_t q = 0; q < e; q++) x[q] = vl_rng_normal(&r);
      float **slot = !strcmp(t->name, "latents") ? &h->lat : !strcmp(t->name, "context") ? &h->ctx
                   : !strcmp(t->name, "images") ? &h->img : !strcmp(t->name, "vae_noise") ? &h->vnoise : &h->noise;
      *slot = x;
      t->data = x;
    }
  }
}

static void free_batch(host_batch *h) {
  free(h->lat); free(h->ctx); free(h->noise); free(h->img); free(h->vnoise); free(h->t); free(h->tok);
}

static void planned_equals_measured(bool in_step, vl_attn_impl attn, bool ckpt, vl_dtype dt, int text_rank) {
  vl_sd_cfg cfg;
  assert_int_equal(vl_sd_preset("tiny", &cfg), 0);
  cfg.clip.lora_rank = text_rank;
  cfg.clip.lora_alpha = (float)text_rank;
  cfg.clip.checkpoint = ckpt;
  vl_sd_set_precision(&cfg, dt, dt);
  cfg.encoders_in_step = in_step;
  cfg.unet.attn = cfg.vae.attn = cfg.clip.attn = attn;
  cfg.unet.checkpoint = ckpt;
  vl_batch b;
  host_batch h;
  make_batch(&cfg, 2, 5, &b, &h);
  vl_ctx *c;
  OK(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP));
  vl_model *m = NULL;
  OK(vl_model_create(c, &vl_model_sd, &cfg, 1, &m));
  vl_step_info info;
  OK(vl_model_step(m, &b, 1, &info));
  assert_true(isfinite(info.loss) && info.loss > 0.1);
  vl_mem_stats ms;
  vl_arena_stats(c->arena, &ms);
  vl_step_spec s = {.type = &vl_model_sd, .cfg = &cfg, .seed = 1, .batch = b, .accum = 1};
  size_t planned;
  bool match;
  vl_run_plan_check(&s, ms.peak_total, &planned, &match);
  if (!match)
    fail_msg("in_step %d %s ckpt %d %s: planned %zu, measured %zu", in_step, vl_attn_impl_name(attn), ckpt,
             vl_dtype_name(dt), planned, ms.peak_total);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  free_batch(&h);
}

static void test_planned_equals_measured(void **state) {
  (void)state;
  planned_equals_measured(false, VL_ATTN_EFFICIENT, false, VL_F32, 0);
  planned_equals_measured(false, VL_ATTN_CLASSIC, true, VL_BF16, 0);
  planned_equals_measured(true, VL_ATTN_EFFICIENT, false, VL_F32, 0);
  planned_equals_measured(true, VL_ATTN_CLASSIC, true, VL_BF16, 0);
  /* the text encoder trained too: its activations, gradients and optimizer state */
  planned_equals_measured(true, VL_ATTN_EFFICIENT, false, VL_F32, 4);
  planned_equals_measured(true, VL_ATTN_CLASSIC, true, VL_BF16, 2);
}

/* LoRA gradients after fwd_bwd over mb (n micro-batches), as one host array. */
static float *grads_after(const vl_sd_cfg *cfg, const vl_batch *mb, int n, double *loss, int64_t *len) {
  vl_ctx *c;
  OK(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP));
  vl_model *m = NULL;
  OK(vl_model_create(c, &vl_model_sd, cfg, 1, &m));
  vl_sd_unet *u = vl_sd_model_unet(m);
  int nt;
  vl_param *lp = vl_sd_unet_trainable(u, &nt);
  /* lora_B starts at zero (peft): give it values so lora_A's gradients are not zero too */
  vl_rng r;
  vl_rng_seed(&r, 77);
  for (int i = 0; i < nt; i++) {
    if (!strstr(lp[i].name, "lora_B")) continue;
    int64_t e = lp[i].rows * lp[i].cols;
    float *v = malloc((size_t)e * 4);
    for (int64_t q = 0; q < e; q++) v[q] = 0.1f * vl_rng_normal(&r);
    OK(vl_param_load(c, &lp[i], v));
    free(v);
  }
  vl_step_info info;
  OK(vl_model_fwd_bwd(m, mb, n, &info));
  *loss = info.loss;
  int64_t tot = 0;
  for (int i = 0; i < nt; i++) tot += lp[i].rows * lp[i].cols;
  float *g = malloc((size_t)tot * 4), *p = g;
  for (int i = 0; i < nt; i++) {
    OK(vl_param_read_grad(c, &lp[i], p));
    p += lp[i].rows * lp[i].cols;
  }
  *len = tot;
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  return g;
}

/* Accumulation: two micro-batches of one sample give the gradients and loss of one batch of
 * both (the loss is the mean over all of the step's elements). */
static void test_accumulation(void **state) {
  (void)state;
  vl_sd_cfg cfg;
  assert_int_equal(vl_sd_preset("tiny", &cfg), 0);
  vl_batch two;
  host_batch h;
  make_batch(&cfg, 2, 9, &two, &h);
  vl_batch one[2];
  for (int j = 0; j < 2; j++) {
    one[j] = two;
    for (int i = 0; i < one[j].n; i++) {
      vl_batch_tensor *t = &one[j].t[i];
      int64_t per = 1;
      for (int d = 1; d < t->ndim; d++) per *= t->shape[d];
      t->shape[0] = 1;
      t->data = (const char *)t->data + (size_t)(j * per) * (t->dtype == VL_I32 ? 4 : 4);
    }
  }
  double l2, l11;
  int64_t n2, n11;
  float *g2 = grads_after(&cfg, &two, 1, &l2, &n2), *g11 = grads_after(&cfg, one, 2, &l11, &n11);
  assert_int_equal(n2, n11);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n2; i++) {
    num = fmax(num, fabs((double)g2[i] - g11[i]));
    den = fmax(den, fabs((double)g2[i]));
  }
  print_message("  accumulation 2 x 1 vs 1 x 2: loss %.9f vs %.9f, gradients max err/max %.2e\n", l11, l2,
                num / den);
  assert_true(den > 0);
  assert_true(num / den < 1e-5);
  assert_true(fabs(l2 - l11) <= 1e-6 * l2);
  free(g2); free(g11);
  free_batch(&h);
}

/* A batch the model cannot take is refused with a message, and nothing stays allocated. */
static void test_bad_batches(void **state) {
  (void)state;
  vl_sd_cfg cfg;
  assert_int_equal(vl_sd_preset("tiny", &cfg), 0);
  vl_batch b;
  host_batch h;
  make_batch(&cfg, 1, 3, &b, &h);
  vl_ctx *c;
  OK(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP));
  vl_model *m = NULL;
  OK(vl_model_create(c, &vl_model_sd, &cfg, 1, &m));
  vl_mem_stats before, after;
  vl_arena_stats(c->arena, &before);
  vl_step_info info;
  vl_batch bad = b;
  bad.t[0].shape[2] = 8; /* latents of another size */
  assert_int_equal(vl_model_fwd_bwd(m, &bad, 1, &info), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "latents"));
  bad = b;
  h.t[0] = 1000; /* past the schedule */
  assert_int_equal(vl_model_fwd_bwd(m, &bad, 1, &info), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "timestep 1000"));
  h.t[0] = 0;
  bad = b;
  bad.n = 2; /* no noise, no timesteps */
  assert_int_equal(vl_model_fwd_bwd(m, &bad, 1, &info), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "noise"));
  vl_arena_stats(c->arena, &after);
  assert_int_equal(after.cur_total, before.cur_total);
  OK(vl_model_fwd_bwd(m, &b, 1, &info)); /* and the good one still runs */
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  free_batch(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ddpm_schedule),           cmocka_unit_test(test_step_parity),
      cmocka_unit_test(test_full_scale),              cmocka_unit_test(test_planned_equals_measured),
      cmocka_unit_test(test_accumulation),            cmocka_unit_test(test_bad_batches),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
