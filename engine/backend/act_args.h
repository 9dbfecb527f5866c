/* Argument checks of the element-wise ops (activations, GEGLU, bias, the Gaussian sample), run by the operation descriptors (ops.c) through vl_op_run on
 * every backend, the plan backend included, so all of them reject the same calls with the
 * same message. Host code only; plain C that also compiles as the host side of a .cu file. Each check
 * returns VL_OK or a VL_ERR_INVALID status whose message names the op and the argument, and
 * where it says so puts the element count of the op's main tensor in *numel (0: nothing to
 * do). Built on the tensor checks of args.h. */
#ifndef VRAMLAB_ACT_ARGS_H
#define VRAMLAB_ACT_ARGS_H
#include "args.h"

/* forward: out = y, in = x; backward (bwd): out = dx, in = dy, and y the forward output */
static inline vl_status vl_check_relu(vl_ctx *c, const char *op, bool bwd, const vl_tensor *out,
                                          const vl_tensor *in, const vl_tensor *y, int64_t n) {
  if (n < 0) return vl_fail(c, VL_ERR_INVALID, "%s: n = %lld", op, (long long)n);
  VL_TRY(vl_arg_tensor(c, op, bwd ? "dx" : "y", out, n, false));
  VL_TRY(vl_arg_tensor(c, op, bwd ? "dy" : "x", in, n, false));
  if (bwd) VL_TRY(vl_arg_tensor(c, op, "y", y, n, false));
  return vl_arg_inplace(c, op, out, in, bwd ? "dx and dy" : "y and x");
}

/* ---- element-wise ----------------------------------------------------------------------- */

static inline vl_status vl_check_act(vl_ctx *c, const char *op, int64_t n, vl_act act) {
  if (n < 0) return vl_fail(c, VL_ERR_INVALID, "%s: n = %lld", op, (long long)n);
  if ((unsigned)act >= VL_ACT_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "%s: unknown activation %d", op, (int)act);
  return VL_OK;
}

static inline vl_status vl_check_act_fwd(vl_ctx *c, const vl_act_fwd_args *a) {
  const char *op = "act_fwd";
  VL_TRY(vl_check_act(c, op, a->n, a->act));
  VL_TRY(vl_arg_tensor(c, op, "y", a->y, a->n, false));
  VL_TRY(vl_arg_tensor(c, op, "x", a->x, a->n, false));
  return vl_arg_inplace(c, op, a->y, a->x, "y and x");
}

static inline vl_status vl_check_act_bwd(vl_ctx *c, const vl_act_bwd_args *a) {
  const char *op = "act_bwd";
  VL_TRY(vl_check_act(c, op, a->n, a->act));
  VL_TRY(vl_arg_tensor(c, op, "dx", a->dx, a->n, false));
  VL_TRY(vl_arg_tensor(c, op, "dy", a->dy, a->n, false));
  VL_TRY(vl_arg_tensor(c, op, "x", a->x, a->n, false));
  VL_TRY(vl_arg_inplace(c, op, a->dx, a->dy, "dx and dy"));
  return vl_arg_inplace(c, op, a->dx, a->x, "dx and x");
}

/* GEGLU: *numel = R*F (outputs of the forward). */
static inline vl_status vl_check_geglu_fwd(vl_ctx *c, const vl_geglu_fwd_args *a,
                                              int64_t *numel) {
  const char *op = "geglu_fwd";
  int64_t nh = 0;
  VL_TRY(vl_arg_dims(c, op, numel, a->R, a->F, 1));
  VL_TRY(vl_arg_dims(c, op, &nh, a->R, a->F, 2));
  VL_TRY(vl_arg_tensor(c, op, "out", a->out, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "h", a->h, nh, false));
  return vl_arg_distinct(c, op, a->out, a->h, "out and h");
}

/* dh may alias h in the same dtype (each (value, gate) pair is read before it is written),
 * never dout (laid out with another row stride). */
static inline vl_status vl_check_geglu_bwd(vl_ctx *c, const vl_geglu_bwd_args *a,
                                              int64_t *numel) {
  const char *op = "geglu_bwd";
  int64_t nh = 0;
  VL_TRY(vl_arg_dims(c, op, numel, a->R, a->F, 1));
  VL_TRY(vl_arg_dims(c, op, &nh, a->R, a->F, 2));
  VL_TRY(vl_arg_tensor(c, op, "dh", a->dh, nh, false));
  VL_TRY(vl_arg_tensor(c, op, "dout", a->dout, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "h", a->h, nh, false));
  VL_TRY(vl_arg_distinct(c, op, a->dh, a->dout, "dh and dout"));
  return vl_arg_inplace(c, op, a->dh, a->h, "dh and h");
}

/* Bias: *numel = outer*C*inner, *nb the bias's elements. */
static inline vl_status vl_check_bias_dims(vl_ctx *c, const char *op, int64_t outer, int64_t C,
                                        int64_t inner, bool per_outer, int64_t *numel,
                                        int64_t *nb) {
  VL_TRY(vl_arg_dims(c, op, numel, outer, C, inner));
  return vl_arg_dims(c, op, nb, per_outer ? outer : 1, C, 1);
}

static inline vl_status vl_check_bias_fwd(vl_ctx *c, const vl_bias_fwd_args *a, int64_t *numel) {
  const char *op = "bias_fwd";
  int64_t nb = 0;
  VL_TRY(vl_check_bias_dims(c, op, a->outer, a->C, a->inner, a->per_outer, numel, &nb));
  VL_TRY(vl_arg_tensor(c, op, "y", a->y, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "b", a->b, nb, false));
  return vl_arg_distinct(c, op, a->y, a->b, "y and b");
}

static inline vl_status vl_check_bias_bwd(vl_ctx *c, const vl_bias_bwd_args *a, int64_t *numel,
                                             int64_t *nb) {
  const char *op = "bias_bwd";
  VL_TRY(vl_check_bias_dims(c, op, a->outer, a->C, a->inner, a->per_outer, numel, nb));
  VL_TRY(vl_arg_tensor(c, op, "db", a->db, *nb, false));
  VL_TRY(vl_arg_tensor(c, op, "dy", a->dy, *numel, false));
  return vl_arg_distinct(c, op, a->db, a->dy, "db and dy");
}

/* Gaussian sample: *numel = N*C*HW (z, noise); moments hold twice that. z may alias noise
 * (same dtype, element by element), never moments. */
static inline vl_status vl_check_gauss(vl_ctx *c, const vl_gauss_sample_args *a,
                                          int64_t *numel) {
  const char *op = "gauss_sample";
  int64_t nm = 0;
  VL_TRY(vl_arg_dims(c, op, numel, a->N, a->C, a->HW));
  if (a->C > INT64_MAX / 2) return vl_fail(c, VL_ERR_INVALID, "gauss_sample: size overflow");
  VL_TRY(vl_arg_dims(c, op, &nm, a->N, 2 * a->C, a->HW));
  VL_TRY(vl_arg_tensor(c, op, "z", a->z, *numel, false));
  VL_TRY(vl_arg_tensor(c, op, "moments", a->moments, nm, false));
  VL_TRY(vl_arg_tensor(c, op, "noise", a->noise, *numel, false));
  VL_TRY(vl_arg_distinct(c, op, a->z, a->moments, "z and moments"));
  VL_TRY(vl_arg_inplace(c, op, a->z, a->noise, "z and noise"));
  return vl_arg_finite(c, op, "scale", a->scale);
}

#endif
