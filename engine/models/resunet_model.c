/* The ResNet-101 U-Net as a vl_model: named batch tensors -> vl_resunet_batch micro-batches.
 * The model allocates its data block (images, then masks) exactly as vl_resunet_fwd_bwd
 * always has. */
#include <stdlib.h>
#include <string.h>

#include "vramlab/resunet.h"

static vl_status create(vl_ctx *c, const void *cfg, const vl_model_opts *o, uint64_t seed,
                        void **state) {
  const vl_resunet_model_cfg *k = cfg;
  vl_resunet_train_cfg tc = k->tc;
  tc.optim.state_elsewhere = o->optim_state_elsewhere;
  vl_resunet *m = NULL;
  vl_status s = vl_resunet_create(c, &k->mc, &tc, seed, &m);
  *state = m;
  return s;
}

static void destroy(void *state) { vl_resunet_destroy(state); }

static void params(const void *state, vl_param_counts *out) {
  static const char *const names[3] = {"encoder", "decoder", "head"};
  vl_resunet *m = (vl_resunet *)state; /* vl_resunet_params hands out a mutable array */
  int n;
  const vl_param *p = vl_resunet_params(m, &n);
  out->total = vl_resunet_n_params(m, -1);
  for (int i = 0; i < n; i++)
    if (p[i].trainable) out->trainable += p[i].rows * p[i].cols;
  out->n_modules = 3;
  for (int i = 0; i < 3; i++) {
    out->module_name[i] = names[i];
    out->module_count[i] = vl_resunet_n_params(m, i);
  }
}

static void plan_batch(const void *cfg, int64_t B, vl_batch *out) {
  const vl_resunet_cfg *mc = &((const vl_resunet_model_cfg *)cfg)->mc;
  int64_t xs[4] = {B, mc->in_ch, mc->image, mc->image}; // (B, 3, H, W)
  int64_t ys[3] = {B, mc->image, mc->image};            // (B, H, W)
  memset(out, 0, sizeof *out);
  vl_batch_add(out, "images", VL_F32, 4, xs, NULL);
  vl_batch_add(out, "masks", VL_I32, 3, ys, NULL);
}

/* images (B, 3, H, W) and, for training, masks (B, H, W) of the model's image size. */
static vl_status to_micro(vl_resunet *m, const vl_batch *b, int i, bool masks,
                          vl_resunet_batch *out) {
  vl_ctx *c = vl_resunet_ctx(m);
  const vl_resunet_cfg *mc = vl_resunet_config(m);
  vl_status s;
  const vl_batch_tensor *x = vl_batch_want(c, b, "images", VL_F32, 4, &s);
  if (!x) return s;
  if (x->shape[1] != mc->in_ch || x->shape[2] != mc->image || x->shape[3] != mc->image)
    return vl_fail(c, VL_ERR_INVALID, "micro-batch %d: images (%lld, %lld, %lld) for a %lldx%lld model", i,
                   (long long)x->shape[1], (long long)x->shape[2], (long long)x->shape[3],
                   (long long)mc->image, (long long)mc->image);
  *out = (vl_resunet_batch){x->shape[0], x->data, NULL};
  if (!masks) return VL_OK;
  const vl_batch_tensor *y = vl_batch_want(c, b, "masks", VL_I32, 3, &s);
  if (!y) return s;
  if (y->shape[0] != x->shape[0] || y->shape[1] != mc->image || y->shape[2] != mc->image)
    return vl_fail(c, VL_ERR_INVALID, "micro-batch %d: masks and images differ in shape", i);
  out->y = y->data;
  return VL_OK;
}

static vl_status fwd_bwd(void *state, const vl_batch *mb, int n, vl_step_info *info) {
  vl_resunet *m = state;
  vl_ctx *c = vl_resunet_ctx(m);
  memset(info, 0, sizeof *info);
  if (n < 1) return vl_fail(c, VL_ERR_INVALID, "need at least one micro-batch");
  vl_resunet_batch *b = malloc((size_t)n * sizeof *b);
  if (!b) return vl_fail(c, VL_ERR_OOM, "host memory for %d micro-batches", n);
  vl_status s = VL_OK;
  for (int i = 0; s == VL_OK && i < n; i++) s = to_micro(m, &mb[i], i, true, &b[i]);
  vl_resunet_step_info si = {0};
  if (s == VL_OK) s = vl_resunet_fwd_bwd(m, b, n, &si);
  free(b);
  *info = (vl_step_info){si.loss, si.n_pixels, si.skipped, si.loss_scale, si.grad_norm};
  return s;
}

static vl_status apply(void *state, vl_step_info *info) {
  vl_resunet_step_info si = {.loss = info->loss, .n_pixels = info->n_targets};
  vl_status s = vl_resunet_apply(state, &si);
  info->skipped = si.skipped;
  info->loss_scale = si.loss_scale;
  info->grad_norm = si.grad_norm;
  return s;
}

static vl_status predict(void *state, const vl_batch *b, int32_t *pred) {
  vl_resunet_batch x = {0};
  VL_TRY(to_micro(state, b, 0, false, &x));
  return vl_resunet_predict(state, x.x, x.B, pred);
}

static vl_status train_state(void *state, vl_train_state *out) {
  return vl_resunet_train_state(state, out);
}

static void step_end(void *state) { vl_resunet_step_end(state); }

const vl_model_type vl_model_resunet = {
    .name = "resunet",
    .create = create,
    .destroy = destroy,
    .params = params,
    .plan_batch = plan_batch,
    .fwd_bwd = fwd_bwd,
    .apply = apply,
    .predict = predict,
    .train_state = train_state,
    .step_end = step_end,
};
