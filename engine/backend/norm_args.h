/* Argument checks of RMSNorm's are in ops.c; here LayerNorm, GroupNorm and batch norm, run by the operation descriptors (ops.c) through vl_op_run on
 * every backend, the plan backend included, so all of them reject the same calls with the
 * same message. Host code only; plain C that also compiles as the host side of a .cu file. Each check
 * returns VL_OK or a VL_ERR_INVALID status whose message names the op and the argument, and
 * where it says so puts the element count of the op's main tensor in *numel (0: nothing to
 * do). Built on the tensor checks of args.h. */
#ifndef VRAMLAB_NORM_ARGS_H
#define VRAMLAB_NORM_ARGS_H
#include "args.h"

static inline vl_status vl_check_bn_train(vl_ctx *c, const vl_tensor *y, const vl_tensor *mean,
                                              const vl_tensor *rstd, const vl_tensor *rmean,
                                              const vl_tensor *rvar, const vl_tensor *x,
                                              const vl_tensor *gamma, const vl_tensor *beta,
                                              int64_t N, int64_t C, int64_t HW, float eps,
                                              float momentum, int64_t *numel) {
  const char *op = "bn_fwd_train";
  VL_TRY(vl_arg_dims(c, op, numel, N, C, HW));
  VL_TRY(vl_arg_tensor(c, op, "y", y, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "x", x, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "mean", mean, C, true));
  VL_TRY(vl_arg_tensor(c, op, "rstd", rstd, C, true));
  VL_TRY(vl_arg_opt(c, op, "running mean", rmean, C, true));
  VL_TRY(vl_arg_opt(c, op, "running var", rvar, C, true));
  VL_TRY(vl_arg_tensor(c, op, "gamma", gamma, C, false));
  VL_TRY(vl_arg_tensor(c, op, "beta", beta, C, false));
  VL_TRY(vl_arg_distinct(c, op, y, x, "y and x")); /* the normalisation rereads x */
  if (*numel > 0 && N * HW < 2) /* the unbiased variance needs two; PyTorch refuses too */
    return vl_fail(c, VL_ERR_INVALID,
                   "bn_fwd_train: %lld value per channel; training needs more than 1",
                   (long long)(N * HW));
  if (!(eps >= 0.0f) || !isfinite(eps) || !(momentum >= 0.0f && momentum <= 1.0f))
    return vl_fail(c, VL_ERR_INVALID, "bn_fwd_train: eps %g must be >= 0, momentum %g in [0, 1]",
                   (double)eps, (double)momentum);
  return VL_OK;
}

static inline vl_status vl_check_bn_eval(vl_ctx *c, const vl_tensor *y, const vl_tensor *x,
                                             const vl_tensor *gamma, const vl_tensor *beta,
                                             const vl_tensor *rmean, const vl_tensor *rvar,
                                             int64_t N, int64_t C, int64_t HW, float eps,
                                             int64_t *numel) {
  const char *op = "bn_fwd_eval";
  VL_TRY(vl_arg_dims(c, op, numel, N, C, HW));
  VL_TRY(vl_arg_tensor(c, op, "y", y, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "x", x, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "gamma", gamma, C, false));
  VL_TRY(vl_arg_tensor(c, op, "beta", beta, C, false));
  VL_TRY(vl_arg_tensor(c, op, "running mean", rmean, C, true));
  VL_TRY(vl_arg_tensor(c, op, "running var", rvar, C, true));
  VL_TRY(vl_arg_inplace(c, op, y, x, "y and x"));
  if (!(eps >= 0.0f) || !isfinite(eps))
    return vl_fail(c, VL_ERR_INVALID, "bn_fwd_eval: eps %g must be >= 0", (double)eps);
  return VL_OK;
}

static inline vl_status vl_check_bn_bwd(vl_ctx *c, const vl_tensor *dx, const vl_tensor *dgamma,
                                            const vl_tensor *dbeta, const vl_tensor *dy,
                                            const vl_tensor *x, const vl_tensor *gamma,
                                            const vl_tensor *mean, const vl_tensor *rstd,
                                            int64_t N, int64_t C, int64_t HW, int64_t *numel) {
  const char *op = "bn_bwd";
  VL_TRY(vl_arg_dims(c, op, numel, N, C, HW));
  VL_TRY(vl_arg_tensor(c, op, "dx", dx, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "dy", dy, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "x", x, *numel, false));
  VL_TRY(vl_arg_opt(c, op, "dgamma", dgamma, C, false));
  VL_TRY(vl_arg_opt(c, op, "dbeta", dbeta, C, false));
  VL_TRY(vl_arg_tensor(c, op, "gamma", gamma, C, false));
  VL_TRY(vl_arg_tensor(c, op, "mean", mean, C, true));
  VL_TRY(vl_arg_tensor(c, op, "rstd", rstd, C, true));
  VL_TRY(vl_arg_inplace(c, op, dx, dy, "dx and dy"));
  VL_TRY(vl_arg_distinct(c, op, dx, x, "dx and x")); /* x is reread after dx is written */
  return VL_OK;
}

/* ---- norms ------------------------------------------------------------------------------ */

/* GroupNorm's shape: G >= 1 divides C. */
static inline vl_status vl_check_groups(vl_ctx *c, const char *op, int64_t N, int64_t C, int64_t HW,
                                     int64_t G, int64_t *numel) {
  VL_TRY(vl_arg_dims(c, op, numel, N, C, HW));
  if (G < 1 || C % G != 0)
    return vl_fail(c, VL_ERR_INVALID, "%s: %lld groups do not divide %lld channels", op,
                   (long long)G, (long long)C);
  return VL_OK;
}

static inline vl_status vl_check_groupnorm_fwd(vl_ctx *c, const vl_groupnorm_fwd_args *a,
                                                  int64_t *numel) {
  const char *op = "groupnorm_fwd";
  VL_TRY(vl_check_groups(c, op, a->N, a->C, a->HW, a->G, numel));
  VL_TRY(vl_arg_tensor(c, op, "y", a->y, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "x", a->x, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "mean", a->mean, a->N * a->G, true));
  VL_TRY(vl_arg_tensor(c, op, "rstd", a->rstd, a->N * a->G, true));
  VL_TRY(vl_arg_tensor(c, op, "gamma", a->gamma, a->C, false));
  VL_TRY(vl_arg_tensor(c, op, "beta", a->beta, a->C, false));
  VL_TRY(vl_arg_distinct(c, op, a->y, a->x, "y and x")); /* backward rereads x */
  VL_TRY(vl_arg_distinct(c, op, a->mean, a->rstd, "mean and rstd"));
  return vl_arg_eps(c, op, a->eps);
}

/* dgamma/dbeta (C, any float dtype) are optional; dx may alias neither dy nor x (the
 * per-channel pass rereads both after dx is written). */
static inline vl_status vl_check_norm_bwd(vl_ctx *c, const char *op, const vl_tensor *dx,
                                             const vl_tensor *dgamma, const vl_tensor *dbeta,
                                             const vl_tensor *dy, const vl_tensor *x,
                                             const vl_tensor *gamma, const vl_tensor *mean,
                                             const vl_tensor *rstd, int64_t numel, int64_t C,
                                             int64_t nstat) {
  VL_TRY(vl_arg_tensor(c, op, "dx", dx, numel, false));
  VL_TRY(vl_arg_tensor(c, op, "dy", dy, numel, false));
  VL_TRY(vl_arg_tensor(c, op, "x", x, numel, false));
  VL_TRY(vl_arg_tensor(c, op, "gamma", gamma, C, false));
  VL_TRY(vl_arg_tensor(c, op, "mean", mean, nstat, true));
  VL_TRY(vl_arg_tensor(c, op, "rstd", rstd, nstat, true));
  VL_TRY(vl_arg_opt(c, op, "dgamma", dgamma, C, false));
  VL_TRY(vl_arg_opt(c, op, "dbeta", dbeta, C, false));
  VL_TRY(vl_arg_distinct(c, op, dx, dy, "dx and dy"));
  VL_TRY(vl_arg_distinct(c, op, dx, x, "dx and x"));
  if (dgamma && dbeta) VL_TRY(vl_arg_distinct(c, op, dgamma, dbeta, "dgamma and dbeta"));
  return VL_OK;
}

static inline vl_status vl_check_groupnorm_bwd(vl_ctx *c, const vl_groupnorm_bwd_args *a,
                                                  int64_t *numel) {
  const char *op = "groupnorm_bwd";
  VL_TRY(vl_check_groups(c, op, a->N, a->C, a->HW, a->G, numel));
  return vl_check_norm_bwd(c, op, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean,
                              a->rstd, *numel, a->C, a->N * a->G);
}

static inline vl_status vl_check_layernorm_fwd(vl_ctx *c, const vl_layernorm_fwd_args *a,
                                                  int64_t *numel) {
  const char *op = "layernorm_fwd";
  VL_TRY(vl_arg_dims(c, op, numel, a->R, a->C, 1));
  VL_TRY(vl_arg_tensor(c, op, "y", a->y, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "x", a->x, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "mean", a->mean, a->R, true));
  VL_TRY(vl_arg_tensor(c, op, "rstd", a->rstd, a->R, true));
  VL_TRY(vl_arg_tensor(c, op, "gamma", a->gamma, a->C, false));
  VL_TRY(vl_arg_tensor(c, op, "beta", a->beta, a->C, false));
  VL_TRY(vl_arg_distinct(c, op, a->y, a->x, "y and x"));
  VL_TRY(vl_arg_distinct(c, op, a->mean, a->rstd, "mean and rstd"));
  return vl_arg_eps(c, op, a->eps);
}

static inline vl_status vl_check_layernorm_bwd(vl_ctx *c, const vl_layernorm_bwd_args *a,
                                                  int64_t *numel) {
  const char *op = "layernorm_bwd";
  VL_TRY(vl_arg_dims(c, op, numel, a->R, a->C, 1));
  return vl_check_norm_bwd(c, op, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean,
                              a->rstd, *numel, a->C, a->R);
}

#endif
