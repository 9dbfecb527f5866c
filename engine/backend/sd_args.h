/* Argument checks of Stable Diffusion's operations (vramlab/ops.h), run by the operation
 * descriptors (ops.c) through vl_op_run on every backend, the plan backend included,
 * so all of them reject the same calls with the same message. Host code only; plain C. Each
 * returns VL_OK or VL_ERR_INVALID with a message naming the op and the argument, and puts
 * the element count of the op's main tensor in *numel (0: nothing to do). Built on the
 * tensor checks of cnn_args.h. */
#ifndef VRAMLAB_SD_ARGS_H
#define VRAMLAB_SD_ARGS_H
#include "cnn_args.h"

static inline vl_status vl_sd_eps(vl_ctx *c, const char *op, float eps) {
  if (!(eps >= 0.0f) || !isfinite(eps))
    return vl_fail(c, VL_ERR_INVALID, "%s: eps %g must be finite and >= 0", op, (double)eps);
  return VL_OK;
}

static inline vl_status vl_sd_finite(vl_ctx *c, const char *op, const char *name, float v) {
  if (!isfinite(v))
    return vl_fail(c, VL_ERR_INVALID, "%s: %s %g is not finite", op, name, (double)v);
  return VL_OK;
}

/* ---- norms ------------------------------------------------------------------------------ */

/* GroupNorm's shape: G >= 1 divides C. */
static inline vl_status vl_sd_groups(vl_ctx *c, const char *op, int64_t N, int64_t C, int64_t HW,
                                     int64_t G, int64_t *numel) {
  VL_TRY(vl_cnn_dims(c, op, numel, N, C, HW));
  if (G < 1 || C % G != 0)
    return vl_fail(c, VL_ERR_INVALID, "%s: %lld groups do not divide %lld channels", op,
                   (long long)G, (long long)C);
  return VL_OK;
}

static inline vl_status vl_sd_check_groupnorm_fwd(vl_ctx *c, const vl_groupnorm_fwd_args *a,
                                                  int64_t *numel) {
  const char *op = "groupnorm_fwd";
  VL_TRY(vl_sd_groups(c, op, a->N, a->C, a->HW, a->G, numel));
  VL_TRY(vl_cnn_tensor(c, op, "y", a->y, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", a->x, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "mean", a->mean, a->N * a->G, true));
  VL_TRY(vl_cnn_tensor(c, op, "rstd", a->rstd, a->N * a->G, true));
  VL_TRY(vl_cnn_tensor(c, op, "gamma", a->gamma, a->C, false));
  VL_TRY(vl_cnn_tensor(c, op, "beta", a->beta, a->C, false));
  VL_TRY(vl_cnn_distinct(c, op, a->y, a->x, "y and x")); /* backward rereads x */
  VL_TRY(vl_cnn_distinct(c, op, a->mean, a->rstd, "mean and rstd"));
  return vl_sd_eps(c, op, a->eps);
}

/* dgamma/dbeta (C, any float dtype) are optional; dx may alias neither dy nor x (the
 * per-channel pass rereads both after dx is written). */
static inline vl_status vl_sd_check_norm_bwd(vl_ctx *c, const char *op, const vl_tensor *dx,
                                             const vl_tensor *dgamma, const vl_tensor *dbeta,
                                             const vl_tensor *dy, const vl_tensor *x,
                                             const vl_tensor *gamma, const vl_tensor *mean,
                                             const vl_tensor *rstd, int64_t numel, int64_t C,
                                             int64_t nstat) {
  VL_TRY(vl_cnn_tensor(c, op, "dx", dx, numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "dy", dy, numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", x, numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "gamma", gamma, C, false));
  VL_TRY(vl_cnn_tensor(c, op, "mean", mean, nstat, true));
  VL_TRY(vl_cnn_tensor(c, op, "rstd", rstd, nstat, true));
  VL_TRY(vl_cnn_opt(c, op, "dgamma", dgamma, C, false));
  VL_TRY(vl_cnn_opt(c, op, "dbeta", dbeta, C, false));
  VL_TRY(vl_cnn_distinct(c, op, dx, dy, "dx and dy"));
  VL_TRY(vl_cnn_distinct(c, op, dx, x, "dx and x"));
  if (dgamma && dbeta) VL_TRY(vl_cnn_distinct(c, op, dgamma, dbeta, "dgamma and dbeta"));
  return VL_OK;
}

static inline vl_status vl_sd_check_groupnorm_bwd(vl_ctx *c, const vl_groupnorm_bwd_args *a,
                                                  int64_t *numel) {
  const char *op = "groupnorm_bwd";
  VL_TRY(vl_sd_groups(c, op, a->N, a->C, a->HW, a->G, numel));
  return vl_sd_check_norm_bwd(c, op, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean,
                              a->rstd, *numel, a->C, a->N * a->G);
}

static inline vl_status vl_sd_check_layernorm_fwd(vl_ctx *c, const vl_layernorm_fwd_args *a,
                                                  int64_t *numel) {
  const char *op = "layernorm_fwd";
  VL_TRY(vl_cnn_dims(c, op, numel, a->R, a->C, 1));
  VL_TRY(vl_cnn_tensor(c, op, "y", a->y, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", a->x, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "mean", a->mean, a->R, true));
  VL_TRY(vl_cnn_tensor(c, op, "rstd", a->rstd, a->R, true));
  VL_TRY(vl_cnn_tensor(c, op, "gamma", a->gamma, a->C, false));
  VL_TRY(vl_cnn_tensor(c, op, "beta", a->beta, a->C, false));
  VL_TRY(vl_cnn_distinct(c, op, a->y, a->x, "y and x"));
  VL_TRY(vl_cnn_distinct(c, op, a->mean, a->rstd, "mean and rstd"));
  return vl_sd_eps(c, op, a->eps);
}

static inline vl_status vl_sd_check_layernorm_bwd(vl_ctx *c, const vl_layernorm_bwd_args *a,
                                                  int64_t *numel) {
  const char *op = "layernorm_bwd";
  VL_TRY(vl_cnn_dims(c, op, numel, a->R, a->C, 1));
  return vl_sd_check_norm_bwd(c, op, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean,
                              a->rstd, *numel, a->C, a->R);
}

/* ---- element-wise ----------------------------------------------------------------------- */

static inline vl_status vl_sd_act(vl_ctx *c, const char *op, int64_t n, vl_act act) {
  if (n < 0) return vl_fail(c, VL_ERR_INVALID, "%s: n = %lld", op, (long long)n);
  if ((unsigned)act >= VL_ACT_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "%s: unknown activation %d", op, (int)act);
  return VL_OK;
}

static inline vl_status vl_sd_check_act_fwd(vl_ctx *c, const vl_act_fwd_args *a) {
  const char *op = "act_fwd";
  VL_TRY(vl_sd_act(c, op, a->n, a->act));
  VL_TRY(vl_cnn_tensor(c, op, "y", a->y, a->n, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", a->x, a->n, false));
  return vl_cnn_inplace(c, op, a->y, a->x, "y and x");
}

static inline vl_status vl_sd_check_act_bwd(vl_ctx *c, const vl_act_bwd_args *a) {
  const char *op = "act_bwd";
  VL_TRY(vl_sd_act(c, op, a->n, a->act));
  VL_TRY(vl_cnn_tensor(c, op, "dx", a->dx, a->n, false));
  VL_TRY(vl_cnn_tensor(c, op, "dy", a->dy, a->n, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", a->x, a->n, false));
  VL_TRY(vl_cnn_inplace(c, op, a->dx, a->dy, "dx and dy"));
  return vl_cnn_inplace(c, op, a->dx, a->x, "dx and x");
}

/* GEGLU: *numel = R*F (outputs of the forward). */
static inline vl_status vl_sd_check_geglu_fwd(vl_ctx *c, const vl_geglu_fwd_args *a,
                                              int64_t *numel) {
  const char *op = "geglu_fwd";
  int64_t nh = 0;
  VL_TRY(vl_cnn_dims(c, op, numel, a->R, a->F, 1));
  VL_TRY(vl_cnn_dims(c, op, &nh, a->R, a->F, 2));
  VL_TRY(vl_cnn_tensor(c, op, "out", a->out, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "h", a->h, nh, false));
  return vl_cnn_distinct(c, op, a->out, a->h, "out and h");
}

/* dh may alias h in the same dtype (each (value, gate) pair is read before it is written),
 * never dout (laid out with another row stride). */
static inline vl_status vl_sd_check_geglu_bwd(vl_ctx *c, const vl_geglu_bwd_args *a,
                                              int64_t *numel) {
  const char *op = "geglu_bwd";
  int64_t nh = 0;
  VL_TRY(vl_cnn_dims(c, op, numel, a->R, a->F, 1));
  VL_TRY(vl_cnn_dims(c, op, &nh, a->R, a->F, 2));
  VL_TRY(vl_cnn_tensor(c, op, "dh", a->dh, nh, false));
  VL_TRY(vl_cnn_tensor(c, op, "dout", a->dout, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "h", a->h, nh, false));
  VL_TRY(vl_cnn_distinct(c, op, a->dh, a->dout, "dh and dout"));
  return vl_cnn_inplace(c, op, a->dh, a->h, "dh and h");
}

/* Bias: *numel = outer*C*inner, *nb the bias's elements. */
static inline vl_status vl_sd_bias_dims(vl_ctx *c, const char *op, int64_t outer, int64_t C,
                                        int64_t inner, bool per_outer, int64_t *numel,
                                        int64_t *nb) {
  VL_TRY(vl_cnn_dims(c, op, numel, outer, C, inner));
  return vl_cnn_dims(c, op, nb, per_outer ? outer : 1, C, 1);
}

static inline vl_status vl_sd_check_bias_fwd(vl_ctx *c, const vl_bias_fwd_args *a, int64_t *numel) {
  const char *op = "bias_fwd";
  int64_t nb = 0;
  VL_TRY(vl_sd_bias_dims(c, op, a->outer, a->C, a->inner, a->per_outer, numel, &nb));
  VL_TRY(vl_cnn_tensor(c, op, "y", a->y, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "b", a->b, nb, false));
  return vl_cnn_distinct(c, op, a->y, a->b, "y and b");
}

static inline vl_status vl_sd_check_bias_bwd(vl_ctx *c, const vl_bias_bwd_args *a, int64_t *numel,
                                             int64_t *nb) {
  const char *op = "bias_bwd";
  VL_TRY(vl_sd_bias_dims(c, op, a->outer, a->C, a->inner, a->per_outer, numel, nb));
  VL_TRY(vl_cnn_tensor(c, op, "db", a->db, *nb, false));
  VL_TRY(vl_cnn_tensor(c, op, "dy", a->dy, *numel, false));
  return vl_cnn_distinct(c, op, a->db, a->dy, "db and dy");
}

/* Padding: pads >= 0; *nin = planes*H*W, *nout the padded size. */
static inline vl_status vl_sd_check_pad(vl_ctx *c, const char *op, const vl_tensor *lo,
                                        const vl_tensor *hi, int64_t planes, int64_t H, int64_t W,
                                        int top, int bottom, int left, int right, bool fwd,
                                        int64_t *nin, int64_t *nout) {
  if (top < 0 || bottom < 0 || left < 0 || right < 0)
    return vl_fail(c, VL_ERR_INVALID, "%s: padding (%d, %d, %d, %d) must be >= 0", op, top,
                   bottom, left, right);
  VL_TRY(vl_cnn_dims(c, op, nin, planes, H, W));
  if (H > INT64_MAX / 2 - INT32_MAX || W > INT64_MAX / 2 - INT32_MAX)
    return vl_fail(c, VL_ERR_INVALID, "%s: size overflow", op);
  VL_TRY(vl_cnn_dims(c, op, nout, planes, H + top + bottom, W + left + right));
  VL_TRY(vl_cnn_tensor(c, op, fwd ? "x" : "dx", lo, *nin, false));
  VL_TRY(vl_cnn_tensor(c, op, fwd ? "y" : "dy", hi, *nout, false));
  return vl_cnn_distinct(c, op, lo, hi, fwd ? "y and x" : "dx and dy");
}

/* Timestep embedding: *numel = B*dim. */
static inline vl_status vl_sd_check_timestep(vl_ctx *c, const vl_timestep_embed_args *a,
                                             int64_t *numel) {
  const char *op = "timestep_embed";
  VL_TRY(vl_cnn_dims(c, op, numel, a->B, a->dim, 1));
  if (a->dim < 2 || a->dim % 2 != 0)
    return vl_fail(c, VL_ERR_INVALID, "timestep_embed: dim %lld must be even and >= 2",
                   (long long)a->dim);
  if (!((float)(a->dim / 2) - a->shift > 0.0f) || !isfinite(a->shift))
    return vl_fail(c, VL_ERR_INVALID,
                   "timestep_embed: shift %g leaves no positive divisor half - shift (half %lld)",
                   (double)a->shift, (long long)(a->dim / 2));
  if (!(a->max_period > 0.0f) || !isfinite(a->max_period))
    return vl_fail(c, VL_ERR_INVALID, "timestep_embed: max_period %g must be > 0",
                   (double)a->max_period);
  VL_TRY(vl_cnn_tensor(c, op, "emb", a->emb, *numel, false));
  return vl_check_ids(c, op, "timesteps", a->t, a->B);
}

/* Fused MSE: *numel = R*C. */
static inline vl_status vl_sd_check_mse(vl_ctx *c, const vl_mse_fused_args *a, int64_t *numel) {
  const char *op = "mse_fused";
  VL_TRY(vl_cnn_dims(c, op, numel, a->R, a->C, 1));
  VL_TRY(vl_cnn_tensor(c, op, "pred", a->pred, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "target", a->target, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "loss", a->loss, a->R, true));
  VL_TRY(vl_cnn_distinct(c, op, a->pred, a->target, "pred and target"));
  VL_TRY(vl_cnn_distinct(c, op, a->pred, a->loss, "pred and loss"));
  VL_TRY(vl_cnn_distinct(c, op, a->target, a->loss, "target and loss"));
  return vl_sd_finite(c, op, "dloss_scale", a->dloss_scale);
}

/* Gaussian sample: *numel = N*C*HW (z, noise); moments hold twice that. z may alias noise
 * (same dtype, element by element), never moments. */
static inline vl_status vl_sd_check_gauss(vl_ctx *c, const vl_gauss_sample_args *a,
                                          int64_t *numel) {
  const char *op = "gauss_sample";
  int64_t nm = 0;
  VL_TRY(vl_cnn_dims(c, op, numel, a->N, a->C, a->HW));
  if (a->C > INT64_MAX / 2) return vl_fail(c, VL_ERR_INVALID, "gauss_sample: size overflow");
  VL_TRY(vl_cnn_dims(c, op, &nm, a->N, 2 * a->C, a->HW));
  VL_TRY(vl_cnn_tensor(c, op, "z", a->z, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "moments", a->moments, nm, false));
  VL_TRY(vl_cnn_tensor(c, op, "noise", a->noise, *numel, false));
  VL_TRY(vl_cnn_distinct(c, op, a->z, a->moments, "z and moments"));
  VL_TRY(vl_cnn_inplace(c, op, a->z, a->noise, "z and noise"));
  return vl_sd_finite(c, op, "scale", a->scale);
}

#endif
