/* Stable Diffusion 1.5 LoRA training step as a vl_model (vramlab/sd.h): batch tensors ->
 * device data, [VAE + text encoder], DDPM noising, U-Net forward, fp32 MSE, U-Net backward;
 * AdamW on the LoRA factors. Allocation order per micro-batch (what the planner replays):
 * the batch's data tensors, the encoders' outputs, noisy latents, the prediction, its fp32
 * copy and the per-row losses; everything is freed before the next micro-batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/sd.h"

typedef struct {
  vl_ctx *c;
  vl_sd_cfg cfg;
  vl_sd_unet *unet;
  vl_sd_vae *vae;   /* encoders_in_step only */
  vl_sd_clip *clip; /* encoders_in_step only */
  int64_t n_vae, n_clip;
  bool train_text;  /* LoRA on the text encoder too (kohya's default) */
  vl_param *train;  /* with train_text: the U-Net's and the text encoder's LoRA factors,
                       one array, so one global norm clips both */
  int n_train;
  float abar[VL_DDPM_STEPS];
  vl_scaler sc;
} sd_state;

/* ---- configuration ------------------------------------------------------------------- */

int vl_sd_preset(const char *scale, vl_sd_cfg *out) {
  memset(out, 0, sizeof *out);
  if (vl_sd_unet_preset(scale, &out->unet) || vl_sd_vae_preset(scale, &out->vae) ||
      vl_sd_clip_preset(scale, &out->clip))
    return -1;
  out->unet.ctx_len = out->clip.n_pos;
  out->unet.ctx_dim = out->clip.dim;
  int64_t side = vl_sd_image_side(out);
  out->vae.image = side;
  vl_optim_cfg_default(&out->optim, 1e-4f);
  out->clip_norm = 1.0f;
  out->loss_scale = 65536.0f;
  out->loss_scale_window = 2000;
  return 0;
}

void vl_sd_set_precision(vl_sd_cfg *cfg, vl_dtype frozen, vl_dtype acts) {
  cfg->unet.weights = cfg->vae.weights = cfg->clip.weights = frozen;
  cfg->unet.acts = cfg->vae.acts = cfg->clip.acts = acts;
  cfg->vae.out = cfg->clip.out = acts;
}

int64_t vl_sd_image_side(const vl_sd_cfg *cfg) {
  int64_t side = cfg->unet.sample;
  for (int i = 1; i < cfg->vae.n_levels; i++) side *= 2;
  return side;
}

uint64_t vl_sd_vae_seed(uint64_t seed) { return seed ^ 0x5644u; }
uint64_t vl_sd_clip_seed(uint64_t seed) { return seed ^ 0x434cu; }

void vl_ddpm_alphas_cumprod(int n, double beta_start, double beta_end, float *out) {
  /* torch's CPU cumprod accumulates float in double (acc_type) and rounds each output */
  /* the script's Python floats: beta ** 0.5 in double, then float32 (linspace's endpoints) */
  float a = (float)sqrt(beta_start), b = (float)sqrt(beta_end);
  double prod = 1.0;
  for (int i = 0; i < n; i++) {
    /* torch.linspace(a, b, n) in float32 as its vectorised CPU kernel computes it: from the
     * nearer end, a fused multiply-add (a plain multiply then add differs in 145 of 1000) */
    float step = (b - a) / (float)(n - 1);
    float s = i < n / 2 ? fmaf(step, (float)i, a) : fmaf(-step, (float)(n - 1 - i), b);
    float beta = s * s;
    prod *= (double)(1.0f - beta);
    out[i] = (float)prod;
  }
}

/* ---- the model ------------------------------------------------------------------------- */

static void destroy(void *state) {
  sd_state *s = state;
  if (!s) return;
  vl_sd_unet_destroy(s->unet);
  vl_sd_vae_destroy(s->vae);
  vl_sd_clip_destroy(s->clip);
  free(s->train);
  free(s);
}

/* Parameter counts of the encoders that do not run in the step, from a throwaway plan
 * context (shapes only, no memory). */
static vl_status count_encoders(sd_state *s) {
  vl_ctx *p = NULL;
  VL_TRY(vl_ctx_create(&p, VL_DEV_PLAN, VL_NO_CAP));
  vl_sd_vae *v = NULL;
  vl_sd_clip *t = NULL;
  vl_status st = vl_sd_vae_create(p, &s->cfg.vae, 1, &v);
  if (st == VL_OK) st = vl_sd_clip_create(p, &s->cfg.clip, 1, &t);
  if (st == VL_OK) {
    s->n_vae = vl_sd_vae_n_params(v);
    s->n_clip = vl_sd_clip_n_params(t);
  } else {
    (void)vl_fail(s->c, st, "counting the encoders: %s", p->err);
  }
  vl_sd_vae_destroy(v);
  vl_sd_clip_destroy(t);
  vl_ctx_destroy(p);
  return st;
}

static vl_status build(sd_state *s, vl_ctx *c, const void *cfg, const vl_model_opts *o,
                       uint64_t seed);

/* vl_model_create keeps nothing of a failed create: everything made is freed here. */
static vl_status create(vl_ctx *c, const void *cfg, const vl_model_opts *o, uint64_t seed,
                        void **state) {
  sd_state *s = calloc(1, sizeof *s);
  *state = NULL;
  if (!s) return vl_fail(c, VL_ERR_OOM, "sd: host memory for the model");
  vl_status st = build(s, c, cfg, o, seed);
  if (st != VL_OK) {
    destroy(s);
    return st;
  }
  *state = s;
  return VL_OK;
}

static vl_status build(sd_state *s, vl_ctx *c, const void *cfg, const vl_model_opts *o,
                       uint64_t seed) {
  s->c = c;
  s->cfg = *(const vl_sd_cfg *)cfg;
  s->cfg.optim.state_elsewhere = o->optim_state_elsewhere;
  vl_ddpm_alphas_cumprod(VL_DDPM_STEPS, 0.00085, 0.012, s->abar);
  vl_scaler_init(&s->sc, s->cfg.unet.acts == VL_F16, s->cfg.loss_scale, s->cfg.loss_scale_window);
  s->train_text = s->cfg.clip.lora_rank > 0;
  if (s->train_text && !s->cfg.encoders_in_step)
    return vl_fail(c, VL_ERR_INVALID, "text-encoder LoRA trains the text encoder inside the step: "
                   "it needs the encoders in the step (no cached text embeddings)");
  s->cfg.unet.ctx_grad |= s->train_text; /* dL/dcontext feeds the text encoder's backward */
  VL_TRY(vl_sd_unet_create(c, &s->cfg.unet, seed, &s->unet));
  VL_TRY(vl_sd_unet_alloc_optim(s->unet, &s->cfg.optim));
  if (!s->cfg.encoders_in_step) return count_encoders(s);
  VL_TRY(vl_sd_vae_create(c, &s->cfg.vae, vl_sd_vae_seed(seed), &s->vae));
  VL_TRY(vl_sd_clip_create(c, &s->cfg.clip, vl_sd_clip_seed(seed), &s->clip));
  s->n_vae = vl_sd_vae_n_params(s->vae);
  s->n_clip = vl_sd_clip_n_params(s->clip);
  if (!s->train_text) return VL_OK;
  VL_TRY(vl_sd_clip_alloc_optim(s->clip, &s->cfg.optim));
  /* one array of both models' trainable parameters (the structs, sharing their tensors) */
  int nu, nt;
  vl_param *pu = vl_sd_unet_trainable(s->unet, &nu), *pt = vl_sd_clip_trainable(s->clip, &nt);
  s->train = malloc((size_t)(nu + nt) * sizeof *s->train);
  if (!s->train) return vl_fail(c, VL_ERR_OOM, "sd: host memory for %d parameters", nu + nt);
  memcpy(s->train, pu, (size_t)nu * sizeof *pu);
  memcpy(s->train + nu, pt, (size_t)nt * sizeof *pt);
  s->n_train = nu + nt;
  return VL_OK;
}

static void params(const void *state, vl_param_counts *out) {
  static const char *const names[] = VL_SD_MODULES;
  const sd_state *s = state;
  vl_param_counts u = {0};
  vl_sd_unet_counts(s->unet, &u);
  int64_t text_lora = s->train_text ? vl_sd_clip_n_trainable(s->clip) : 0;
  int64_t counts[4] = {u.total - u.trainable, s->n_vae, s->n_clip, u.trainable + text_lora};
  memset(out, 0, sizeof *out);
  out->trainable = u.trainable + text_lora;
  out->total = u.total + text_lora + (s->cfg.encoders_in_step ? s->n_vae + s->n_clip : 0);
  out->n_modules = 4;
  for (int i = 0; i < 4; i++) {
    out->module_name[i] = names[i];
    out->module_count[i] = counts[i];
  }
}

static void plan_batch(const void *cfg, int64_t B, vl_batch *out) {
  const vl_sd_cfg *k = cfg;
  const vl_sd_unet_cfg *u = &k->unet;
  int64_t h = u->sample, H = vl_sd_image_side(k);
  int64_t lat[4] = {B, u->in_ch, h, h};             // (B, 4, h, w)
  int64_t img[4] = {B, k->vae.in_ch, H, H};         // (B, 3, H, W)
  int64_t tok[2] = {B, u->ctx_len};                 // (B, L)
  int64_t ctx[3] = {B, u->ctx_len, u->ctx_dim};     // (B, L, ctx_dim)
  int64_t ts[1] = {B};                              // (B)
  memset(out, 0, sizeof *out);
  if (k->encoders_in_step) {
    vl_batch_add(out, "images", VL_F32, 4, img, NULL);
    vl_batch_add(out, "vae_noise", VL_F32, 4, lat, NULL);
    vl_batch_add(out, "tokens", VL_I32, 2, tok, NULL);
  } else {
    vl_batch_add(out, "latents", VL_F32, 4, lat, NULL);
    vl_batch_add(out, "context", VL_F32, 3, ctx, NULL);
  }
  vl_batch_add(out, "noise", VL_F32, 4, lat, NULL);
  vl_batch_add(out, "timesteps", VL_I32, 1, ts, NULL);
}

/* ---- one micro-batch ------------------------------------------------------------------- */

/* The batch tensor `name` as a VL_MEM_DATA device tensor (uploaded unless planning). */
static vl_status upload(vl_ctx *c, const vl_batch_tensor *bt, vl_tensor *dev) {
  VL_TRY(vl_tensor_alloc(c, dev, bt->dtype, VL_MEM_DATA, bt->ndim, bt->shape));
  if (c->plan || !bt->data) return VL_OK;
  return c->be->upload(c, dev, 0, bt->data, dev->bytes);
}

static bool same_shape(const vl_batch_tensor *t, int ndim, const int64_t *shape) {
  if (t->ndim != ndim) return false;
  for (int i = 0; i < ndim; i++)
    if (t->shape[i] != shape[i]) return false;
  return true;
}

/* A float batch tensor (f32, f16 or bf16) of exactly `shape`, or NULL with the message. */
static const vl_batch_tensor *want_float(vl_ctx *c, const vl_batch *b, const char *name,
                                         int ndim, const int64_t *shape, vl_status *st) {
  const vl_batch_tensor *t = vl_batch_get(b, name);
  *st = VL_ERR_INVALID;
  if (!t) return (vl_fail(c, *st, "batch has no tensor '%s'", name), NULL);
  if (!vl_dtype_is_float(t->dtype))
    return (vl_fail(c, *st, "batch tensor '%s': %s, a float dtype expected", name,
                    vl_dtype_name(t->dtype)), NULL);
  if (!same_shape(t, ndim, shape))
    return (vl_fail(c, *st, "batch tensor '%s' has the wrong shape for this model", name), NULL);
  *st = VL_OK;
  return t;
}

/* Device tensors of one micro-batch, in allocation order. */
typedef struct {
  vl_tensor in[3];  /* latents, context | images, vae_noise, tokens */
  vl_tensor noise, t;
  vl_tensor latents, context; /* encoder outputs (in step) */
  vl_tensor noisy, pred, pred32, loss;
} micro_t;

static void micro_free(vl_ctx *c, micro_t *m) {
  vl_tensor *order[] = {&m->loss, &m->pred32, &m->pred, &m->noisy, &m->context, &m->latents,
                        &m->t, &m->noise, &m->in[2], &m->in[1], &m->in[0]};
  for (size_t i = 0; i < sizeof order / sizeof *order; i++)
    if (order[i]->owned) vl_tensor_free(c, order[i]);
}

/* Upload the inputs and run the encoders when they are in the step: latents and context
 * point at what the U-Net reads. */
static vl_status inputs(sd_state *s, const vl_batch *b, int64_t B, micro_t *m,
                        const vl_tensor **lat, const vl_tensor **ctx) {
  vl_ctx *c = s->c;
  const vl_sd_unet_cfg *u = &s->cfg.unet;
  int64_t h = u->sample, H = vl_sd_image_side(&s->cfg);
  int64_t lshape[4] = {B, u->in_ch, h, h}, cshape[3] = {B, u->ctx_len, u->ctx_dim};
  int64_t ishape[4] = {B, s->cfg.vae.in_ch, H, H}, tshape[2] = {B, u->ctx_len};
  vl_status st;
  if (!s->cfg.encoders_in_step) {
    const vl_batch_tensor *l = want_float(c, b, "latents", 4, lshape, &st);
    if (!l) return st;
    const vl_batch_tensor *x = want_float(c, b, "context", 3, cshape, &st);
    if (!x) return st;
    VL_TRY(upload(c, l, &m->in[0]));
    VL_TRY(upload(c, x, &m->in[1]));
    *lat = &m->in[0];
    *ctx = &m->in[1];
    return VL_OK;
  }
  const vl_batch_tensor *im = vl_batch_want(c, b, "images", VL_F32, 4, &st);
  if (!im) return st;
  const vl_batch_tensor *vn = vl_batch_want(c, b, "vae_noise", VL_F32, 4, &st);
  if (!vn) return st;
  const vl_batch_tensor *tk = vl_batch_want(c, b, "tokens", VL_I32, 2, &st);
  if (!tk) return st;
  if (!same_shape(im, 4, ishape) || !same_shape(vn, 4, lshape) || !same_shape(tk, 2, tshape))
    return vl_fail(c, VL_ERR_INVALID, "images, vae_noise or tokens have the wrong shape for this model");
  VL_TRY(upload(c, im, &m->in[0]));
  VL_TRY(upload(c, vn, &m->in[1]));
  VL_TRY(upload(c, tk, &m->in[2]));
  VL_TRY(vl_sd_vae_encode(s->vae, &m->in[0], &m->in[1], &m->latents, NULL, VL_MEM_TEMP));
  if (s->train_text) VL_TRY(vl_sd_clip_forward(s->clip, &m->in[2], true, &m->context));
  else VL_TRY(vl_sd_clip_encode(s->clip, &m->in[2], &m->context, VL_MEM_TEMP));
  *lat = &m->latents;
  *ctx = &m->context;
  return VL_OK;
}

/* noisy[b] = sqrt(abar[t_b]) latents[b] + sqrt(1 - abar[t_b]) noise[b], fp32. On the plan
 * device the timesteps are unknown (no data): t = 0 (the cost does not depend on it). */
static vl_status add_noise(sd_state *s, const int32_t *t, int64_t B, const vl_tensor *lat,
                           micro_t *m) {
  vl_ctx *c = s->c;
  VL_TRY(vl_tensor_alloc(c, &m->noisy, VL_F32, VL_MEM_TEMP, 4, m->noise.shape));
  int64_t per = m->noise.n / B;
  for (int64_t i = 0; i < B; i++) {
    int32_t ti = t ? t[i] : 0;
    if (ti < 0 || ti >= VL_DDPM_STEPS)
      return vl_fail(c, VL_ERR_INVALID, "timestep %d of sample %lld outside [0, %d)", ti, (long long)i,
                     VL_DDPM_STEPS);
    /* diffusers: alphas_cumprod[t] ** 0.5 in float32 */
    float a = sqrtf(s->abar[ti]), sg = sqrtf(1.0f - s->abar[ti]);
    vl_tensor y = vl_tensor_rows(&m->noisy, i, 1), n = vl_tensor_rows(&m->noise, i, 1);
    vl_tensor x = vl_tensor_rows(lat, i, 1);
    VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = &y, .a = sg, .x = &n, .b = 0.0f, .n = per}));
    VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = &y, .a = a, .x = &x, .b = 1.0f, .n = per}));
  }
  return VL_OK;
}

/* The MSE of pred against the noise in fp32; pred32 becomes dL/dpred (scaled by dscale). */
static vl_status mse(sd_state *s, int64_t B, float dscale, double *loss_sum, micro_t *m) {
  vl_ctx *c = s->c;
  int64_t per = m->noise.n / B;
  VL_TRY(vl_tensor_alloc(c, &m->pred32, VL_F32, VL_MEM_TEMP, 4, m->pred.shape));
  VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &m->pred32, .x = &m->pred, .n = m->pred.n}));
  vl_tensor_free(c, &m->pred);
  VL_TRY(vl_tensor_alloc2(c, &m->loss, VL_F32, VL_MEM_TEMP, B, 1));
  VL_TRY(vl_mse_fused_run(c, &(vl_mse_fused_args){.pred = &m->pred32, .loss = &m->loss,
                                                  .target = &m->noise, .R = B, .C = per,
                                                  .dloss_scale = dscale}));
  if (c->plan) return VL_OK;
  float *rows = malloc((size_t)B * sizeof *rows);
  if (!rows) return vl_fail(c, VL_ERR_OOM, "host memory for %lld losses", (long long)B);
  vl_status st = c->be->download(c, rows, &m->loss, 0, (size_t)B * sizeof *rows);
  for (int64_t i = 0; st == VL_OK && i < B; i++) *loss_sum += rows[i];
  free(rows);
  return st;
}

static vl_status micro(sd_state *s, const vl_batch *b, int idx, float dscale, double *loss_sum) {
  vl_ctx *c = s->c;
  vl_status st;
  const vl_batch_tensor *nz = vl_batch_want(c, b, "noise", VL_F32, 4, &st);
  if (!nz) return st;
  const vl_batch_tensor *ts = vl_batch_want(c, b, "timesteps", VL_I32, 1, &st);
  if (!ts) return st;
  int64_t B = nz->shape[0];
  if (ts->shape[0] != B) return vl_fail(c, VL_ERR_INVALID, "micro-batch %d: %lld timesteps for %lld samples",
                                        idx, (long long)ts->shape[0], (long long)B);
  micro_t m = {0};
  const vl_tensor *lat = NULL, *ctx = NULL;
  st = inputs(s, b, B, &m, &lat, &ctx);
  if (st == VL_OK) st = upload(c, nz, &m.noise);
  if (st == VL_OK) st = upload(c, ts, &m.t);
  if (st == VL_OK && !same_shape(nz, lat->ndim, lat->shape))
    st = vl_fail(c, VL_ERR_INVALID, "micro-batch %d: noise and latents differ in shape", idx);
  if (st == VL_OK) st = add_noise(s, ts->data, B, lat, &m);
  if (st == VL_OK) st = vl_sd_unet_forward(s->unet, &m.noisy, &m.t, ctx, true, &m.pred);
  if (st == VL_OK) st = mse(s, B, dscale, loss_sum, &m);
  if (st == VL_OK) st = vl_sd_unet_backward(s->unet, &m.pred32);
  if (st == VL_OK && s->train_text) st = vl_sd_clip_backward(s->clip, vl_sd_unet_dctx(s->unet));
  vl_sd_unet_release(s->unet); /* dL/dcontext, or what a failed step left */
  if (st != VL_OK && s->train_text) vl_sd_clip_release(s->clip);
  micro_free(c, &m);
  return st;
}

static vl_status fwd_bwd(void *state, const vl_batch *mb, int n, vl_step_info *info) {
  sd_state *s = state;
  vl_ctx *c = s->c;
  memset(info, 0, sizeof *info);
  if (n < 1) return vl_fail(c, VL_ERR_INVALID, "need at least one micro-batch");
  int64_t total = 0; /* loss elements of the whole step: the mean is over all of them */
  for (int i = 0; i < n; i++) {
    const vl_batch_tensor *nz = vl_batch_get(&mb[i], "noise");
    if (!nz) return vl_fail(c, VL_ERR_INVALID, "micro-batch %d has no tensor 'noise'", i);
    int64_t e = 1;
    for (int d = 0; d < nz->ndim; d++) e *= nz->shape[d];
    total += e;
  }
  float dscale = s->sc.scale / (float)total;
  double loss_sum = 0;
  for (int i = 0; i < n; i++) VL_TRY(micro(s, &mb[i], i, dscale, &loss_sum));
  info->loss = loss_sum / (double)total;
  info->n_targets = total;
  info->loss_scale = s->sc.scale;
  if (!c->plan && !isfinite(info->loss))
    return vl_fail(c, VL_ERR_NUMERIC, "loss is %g", info->loss);
  return VL_OK;
}

static vl_status apply(void *state, vl_step_info *info) {
  sd_state *s = state;
  if (s->train_text)
    return vl_params_apply(s->c, s->train, s->n_train, &s->cfg.optim, s->cfg.clip_norm, &s->sc,
                           &info->skipped, &info->grad_norm);
  return vl_sd_unet_apply(s->unet, &s->cfg.optim, s->cfg.clip_norm, &s->sc, &info->skipped,
                          &info->grad_norm);
}

vl_sd_unet *vl_sd_model_unet(vl_model *m) {
  return m && m->type == &vl_model_sd ? ((sd_state *)m->state)->unet : NULL;
}

const vl_model_type vl_model_sd = {
    .name = "sd",
    .create = create,
    .destroy = destroy,
    .params = params,
    .plan_batch = plan_batch,
    .fwd_bwd = fwd_bwd,
    .apply = apply,
    .predict = NULL,
};
