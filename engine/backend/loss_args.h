/* Argument checks of the per-pixel cross-entropy and the fused MSE, run by the operation descriptors (ops.c) through vl_op_run on
 * every backend, the plan backend included, so all of them reject the same calls with the
 * same message. Host code only; plain C that also compiles as the host side of a .cu file. Each check
 * returns VL_OK or a VL_ERR_INVALID status whose message names the op and the argument, and
 * where it says so puts the element count of the op's main tensor in *numel (0: nothing to
 * do). Built on the tensor checks of args.h. */
#ifndef VRAMLAB_LOSS_ARGS_H
#define VRAMLAB_LOSS_ARGS_H
#include "args.h"

static inline vl_status vl_check_xent_pix(vl_ctx *c, const vl_tensor *logits,
                                              const vl_tensor *loss, const vl_tensor *tgt,
                                              int64_t N, int64_t K, int64_t HW, float scale,
                                              int64_t *npix) {
  const char *op = "xent_pix";
  int64_t nl = 0;
  VL_TRY(vl_arg_dims(c, op, &nl, N, K, HW));
  VL_TRY(vl_arg_dims(c, op, npix, N, 1, HW));
  if (*npix > 0 && K < 1) return vl_fail(c, VL_ERR_INVALID, "xent_pix: %lld classes", (long long)K);
  VL_TRY(vl_arg_tensor(c, op, "logits", logits, nl, false));
  VL_TRY(vl_arg_tensor(c, op, "loss", loss, *npix, true));
  VL_TRY(vl_check_ids(c, op, "targets", tgt, *npix));
  if (!isfinite(scale))
    return vl_fail(c, VL_ERR_INVALID, "xent_pix: dloss_scale %g", (double)scale);
  return vl_arg_distinct(c, op, logits, loss, "logits and loss");
}

/* Fused MSE: *numel = R*C. */
static inline vl_status vl_check_mse(vl_ctx *c, const vl_mse_fused_args *a, int64_t *numel) {
  const char *op = "mse_fused";
  VL_TRY(vl_arg_dims(c, op, numel, a->R, a->C, 1));
  VL_TRY(vl_arg_tensor(c, op, "pred", a->pred, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "target", a->target, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "loss", a->loss, a->R, true));
  VL_TRY(vl_arg_distinct(c, op, a->pred, a->target, "pred and target"));
  VL_TRY(vl_arg_distinct(c, op, a->pred, a->loss, "pred and loss"));
  VL_TRY(vl_arg_distinct(c, op, a->target, a->loss, "target and loss"));
  return vl_arg_finite(c, op, "dloss_scale", a->dloss_scale);
}

#endif
