/* Mistral as a vl_model: named batch tensors -> vl_mistral_batch micro-batches. The model
 * allocates its data block from the shapes exactly as vl_mistral_fwd_bwd always has. */
#include <stdlib.h>
#include <string.h>

#include "vramlab/mistral.h"

static vl_status create(vl_ctx *c, const void *cfg, const vl_model_opts *o, uint64_t seed,
                        void **state) {
  const vl_mistral_model_cfg *k = cfg;
  vl_train_cfg tc = k->tc;
  tc.optim.state_elsewhere = o->optim_state_elsewhere;
  vl_mistral *m = NULL;
  vl_status s = vl_mistral_create(c, &k->mc, &tc, seed, &m);
  *state = m;
  return s;
}

static void destroy(void *state) { vl_mistral_destroy(state); }

static void params(const void *state, vl_param_counts *out) {
  out->total = vl_mistral_n_params(state, false);
  out->trainable = vl_mistral_n_params(state, true);
}

static void plan_batch(const void *cfg, int64_t B, vl_batch *out) {
  const vl_mistral_model_cfg *k = cfg;
  int64_t bt[2] = {B, k->mc.seq}; // (B, T)
  memset(out, 0, sizeof *out);
  vl_batch_add(out, "tokens", VL_I32, 2, bt, NULL);
  vl_batch_add(out, "targets", VL_I32, 2, bt, NULL);
}

/* tokens (B, T) and targets (B, T) of each micro-batch into the model's own struct. */
static vl_status to_micro(vl_ctx *c, const vl_batch *b, int i, vl_mistral_batch *out) {
  vl_status s;
  const vl_batch_tensor *tok = vl_batch_want(c, b, "tokens", VL_I32, 2, &s);
  if (!tok) return s;
  const vl_batch_tensor *tgt = vl_batch_want(c, b, "targets", VL_I32, 2, &s);
  if (!tgt) return s;
  if (tok->shape[0] != tgt->shape[0] || tok->shape[1] != tgt->shape[1])
    return vl_fail(c, VL_ERR_INVALID, "micro-batch %d: tokens and targets differ in shape", i);
  *out = (vl_mistral_batch){tok->shape[0], tok->shape[1], tok->data, tgt->data};
  return VL_OK;
}

static vl_status fwd_bwd(void *state, const vl_batch *mb, int n, vl_step_info *info) {
  vl_mistral *m = state;
  vl_ctx *c = vl_mistral_ctx(m);
  memset(info, 0, sizeof *info);
  if (n < 1) return vl_fail(c, VL_ERR_INVALID, "need at least one micro-batch");
  vl_mistral_batch *b = malloc((size_t)n * sizeof *b);
  if (!b) return vl_fail(c, VL_ERR_OOM, "host memory for %d micro-batches", n);
  vl_status s = VL_OK;
  for (int i = 0; s == VL_OK && i < n; i++) s = to_micro(c, &mb[i], i, &b[i]);
  vl_mistral_step_info mi = {0};
  if (s == VL_OK) s = vl_mistral_fwd_bwd(m, b, n, &mi);
  free(b);
  *info = (vl_step_info){mi.loss, mi.n_tokens, mi.skipped, mi.loss_scale, mi.grad_norm};
  return s;
}

static vl_status apply(void *state, vl_step_info *info) {
  vl_mistral_step_info mi = {.loss = info->loss, .n_tokens = info->n_targets};
  vl_status s = vl_mistral_apply(state, &mi);
  info->skipped = mi.skipped;
  info->loss_scale = mi.loss_scale;
  info->grad_norm = mi.grad_norm;
  return s;
}


static vl_status train_state(void *state, vl_train_state *out) {
  return vl_mistral_train_state(state, out);
}

const vl_model_type vl_model_mistral = {
    .name = "mistral",
    .create = create,
    .destroy = destroy,
    .params = params,
    .plan_batch = plan_batch,
    .fwd_bwd = fwd_bwd,
    .apply = apply,
    .predict = NULL,
    .train_state = train_state,
};
