/* The descriptors' argument checks (op_checks.h): each unpacks its argument struct into the
 * shared checkers of cnn_args.h, sd_args.h and attn_args.h. The element counts those hand
 * back are not needed here. */
#include "op_checks.h"

#include "attn_args.h"
#include "sd_args.h"

/* ---- Mistral's ops with token ids or targets ---------------------------------------------- */

vl_status vl_ck_embed_fwd(vl_ctx *c, const void *args) {
  const vl_embed_fwd_args *a = args;
  return vl_check_ids(c, "embed_fwd", "token ids", a->tok, a->R);
}
vl_status vl_ck_embed_bwd(vl_ctx *c, const void *args) {
  const vl_embed_bwd_args *a = args;
  return vl_check_ids(c, "embed_bwd", "token ids", a->tok, a->R);
}
vl_status vl_ck_xent_fused(vl_ctx *c, const void *args) {
  const vl_xent_fused_args *a = args;
  return vl_check_ids(c, "xent_fused", "targets", a->tgt, a->R);
}

/* ---- the CNN's ops ------------------------------------------------------------------------ */

vl_status vl_ck_bn_fwd_train(vl_ctx *c, const void *args) {
  const vl_bn_fwd_train_args *a = args;
  int64_t n = 0;
  return vl_cnn_check_bn_train(c, a->y, a->mean, a->rstd, a->rmean, a->rvar, a->x, a->gamma,
                               a->beta, a->N, a->C, a->HW, a->eps, a->momentum, &n);
}
vl_status vl_ck_bn_fwd_eval(vl_ctx *c, const void *args) {
  const vl_bn_fwd_eval_args *a = args;
  int64_t n = 0;
  return vl_cnn_check_bn_eval(c, a->y, a->x, a->gamma, a->beta, a->rmean, a->rvar, a->N, a->C,
                              a->HW, a->eps, &n);
}
vl_status vl_ck_bn_bwd(vl_ctx *c, const void *args) {
  const vl_bn_bwd_args *a = args;
  int64_t n = 0;
  return vl_cnn_check_bn_bwd(c, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean,
                             a->rstd, a->N, a->C, a->HW, &n);
}
vl_status vl_ck_relu_fwd(vl_ctx *c, const void *args) {
  const vl_relu_fwd_args *a = args;
  return vl_cnn_check_relu(c, "relu_fwd", false, a->y, a->x, NULL, a->n);
}
vl_status vl_ck_relu_bwd(vl_ctx *c, const void *args) {
  const vl_relu_bwd_args *a = args;
  return vl_cnn_check_relu(c, "relu_bwd", true, a->dx, a->dy, a->y, a->n);
}
vl_status vl_ck_maxpool_fwd(vl_ctx *c, const void *args) {
  const vl_maxpool_fwd_args *a = args;
  int64_t n = 0;
  return vl_cnn_check_maxpool_fwd(c, a->y, a->x, a->planes, a->H, a->W, a->k, a->stride, a->pad,
                                  a->P, a->Q, &n);
}
vl_status vl_ck_maxpool_bwd(vl_ctx *c, const void *args) {
  const vl_maxpool_bwd_args *a = args;
  int64_t n = 0;
  return vl_cnn_check_maxpool_bwd(c, a->dx, a->dy, a->x, a->planes, a->H, a->W, a->k, a->stride,
                                  a->pad, a->P, a->Q, &n);
}
vl_status vl_ck_upsample2x_fwd(vl_ctx *c, const void *args) {
  const vl_upsample2x_fwd_args *a = args;
  int64_t lo = 0, hi = 0;
  return vl_cnn_check_up2(c, "upsample2x_fwd", a->x, a->y, a->planes, a->H, a->W, true, &lo, &hi);
}
vl_status vl_ck_upsample2x_bwd(vl_ctx *c, const void *args) {
  const vl_upsample2x_bwd_args *a = args;
  int64_t lo = 0, hi = 0;
  return vl_cnn_check_up2(c, "upsample2x_bwd", a->dx, a->dy, a->planes, a->H, a->W, false, &lo,
                          &hi);
}
vl_status vl_ck_chan_copy(vl_ctx *c, const void *args) {
  const vl_chan_copy_args *a = args;
  int64_t n = 0;
  return vl_cnn_check_chan_copy(c, a->y, a->yC, a->y_c0, a->x, a->xC, a->x_c0, a->nc, a->N, a->HW,
                                &n);
}
vl_status vl_ck_xent_pix(vl_ctx *c, const void *args) {
  const vl_xent_pix_args *a = args;
  int64_t n = 0;
  return vl_cnn_check_xent_pix(c, a->logits, a->loss, a->tgt, a->N, a->K, a->HW, a->dloss_scale,
                               &n);
}

/* ---- Stable Diffusion's ops --------------------------------------------------------------- */

vl_status vl_ck_groupnorm_fwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_groupnorm_fwd(c, args, &n);
}
vl_status vl_ck_groupnorm_bwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_groupnorm_bwd(c, args, &n);
}
vl_status vl_ck_layernorm_fwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_layernorm_fwd(c, args, &n);
}
vl_status vl_ck_layernorm_bwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_layernorm_bwd(c, args, &n);
}
vl_status vl_ck_act_fwd(vl_ctx *c, const void *args) { return vl_sd_check_act_fwd(c, args); }
vl_status vl_ck_act_bwd(vl_ctx *c, const void *args) { return vl_sd_check_act_bwd(c, args); }
vl_status vl_ck_geglu_fwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_geglu_fwd(c, args, &n);
}
vl_status vl_ck_geglu_bwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_geglu_bwd(c, args, &n);
}
vl_status vl_ck_bias_fwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_bias_fwd(c, args, &n);
}
vl_status vl_ck_bias_bwd(vl_ctx *c, const void *args) {
  int64_t n = 0, nb = 0;
  return vl_sd_check_bias_bwd(c, args, &n, &nb);
}
vl_status vl_ck_pad2d_fwd(vl_ctx *c, const void *args) {
  const vl_pad2d_fwd_args *a = args;
  int64_t nin = 0, nout = 0;
  return vl_sd_check_pad(c, "pad2d_fwd", a->x, a->y, a->planes, a->H, a->W, a->top, a->bottom,
                         a->left, a->right, true, &nin, &nout);
}
vl_status vl_ck_pad2d_bwd(vl_ctx *c, const void *args) {
  const vl_pad2d_bwd_args *a = args;
  int64_t nin = 0, nout = 0;
  return vl_sd_check_pad(c, "pad2d_bwd", a->dx, a->dy, a->planes, a->H, a->W, a->top, a->bottom,
                         a->left, a->right, false, &nin, &nout);
}
vl_status vl_ck_timestep_embed(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_timestep(c, args, &n);
}
vl_status vl_ck_mse_fused(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_mse(c, args, &n);
}
vl_status vl_ck_gauss_sample(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_sd_check_gauss(c, args, &n);
}

/* ---- attention ------------------------------------------------------------------------------ */

vl_status vl_ck_attn_fwd(vl_ctx *c, const void *args) {
  int64_t rows = 0;
  return vl_attn_check_fwd(c, args, &rows);
}
vl_status vl_ck_attn_bwd(vl_ctx *c, const void *args) {
  int64_t rows = 0;
  return vl_attn_check_bwd(c, args, &rows);
}
