/* The optimizer step shared by every model: GradScaler-style dynamic loss scaling, the
 * overflow check, global-norm clipping, the update of each parameter and zeroed gradients. */
#include <math.h>

#include "vramlab/nn.h"

void vl_optim_cfg_default(vl_optim_cfg *o, float lr) {
  o->opt = VL_OPT_ADAMW;
  o->adafactor_beta1 = false;
  o->state_elsewhere = false;
  o->hp = (vl_optim_hp){.lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                        .weight_decay = 0.0f, .eps2 = 1e-3f, .clip_thr = 1.0f,
                        .decay_pow = 0.8f, .momentum = 0.9f, .grad_scale = 1.0f};
}

void vl_scaler_init(vl_scaler *s, bool fp16, float init_scale, int window) {
  s->fp16 = fp16;
  s->scale = fp16 ? init_scale : 1.0f;
  s->window = window;
  s->good = 0;
  s->t = 0;
}

vl_status vl_params_zero_grads(vl_ctx *c, vl_param *p, int n) {
  for (int i = 0; i < n; i++)
    if (p[i].trainable && p[i].grad.n) VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &p[i].grad}));
  return VL_OK;
}

vl_status vl_scaler_skip(vl_ctx *c, vl_param *p, int n, vl_scaler *s) {
  s->scale *= 0.5f;
  s->good = 0;
  return vl_params_zero_grads(c, p, n);
}

vl_status vl_params_apply(vl_ctx *c, vl_param *p, int n, const vl_optim_cfg *oc, float clip,
                          vl_scaler *s, bool *skipped, double *grad_norm) {
  *skipped = false;
  *grad_norm = 0;
  double ss = 0;
  bool bad = false;
  for (int i = 0; i < n; i++) {
    if (!p[i].trainable || !p[i].grad.n) continue;
    double s1 = 0; /* stays 0 on a plan context */
    bool b1 = false;
    VL_TRY(vl_sumsq_run(c, &(vl_sumsq_args){.x = &p[i].grad, .n = p[i].rows * p[i].cols, .out = &s1,
                                            .nonfinite = &b1}));
    ss += s1;
    bad |= b1;
  }
  float ls = s->scale;
  if (bad) {
    if (!s->fp16) {
      vl_params_zero_grads(c, p, n);
      return vl_fail(c, VL_ERR_NUMERIC, "non-finite gradient without fp16 loss scaling");
    }
    *skipped = true;
    return vl_scaler_skip(c, p, n, s);
  }
  double norm = sqrt(ss) / ls;
  *grad_norm = norm;
  float coef = 1.0f;
  if (clip > 0 && norm > clip) coef = (float)(clip / (norm + 1e-6));
  s->t++;
  for (int i = 0; i < n; i++) {
    vl_status status = vl_param_update(c, &p[i], oc, s->t, coef / ls);
    if (status != VL_OK) {
      vl_params_zero_grads(c, p, n); /* the next step must not see this step's gradients */
      return status;
    }
  }
  if (s->fp16 && ++s->good >= s->window) {
    s->scale = ls * 2.0f;
    s->good = 0;
  }
  return vl_params_zero_grads(c, p, n);
}
