/* Argument checks of the timestep embedding, run by the operation descriptors (ops.c) through vl_op_run on
 * every backend, the plan backend included, so all of them reject the same calls with the
 * same message. Host code only; plain C that also compiles as the host side of a .cu file. Each check
 * returns VL_OK or a VL_ERR_INVALID status whose message names the op and the argument, and
 * where it says so puts the element count of the op's main tensor in *numel (0: nothing to
 * do). Built on the tensor checks of args.h. */
#ifndef VRAMLAB_EMBED_ARGS_H
#define VRAMLAB_EMBED_ARGS_H
#include "args.h"

/* Timestep embedding: *numel = B*dim. */
static inline vl_status vl_check_timestep(vl_ctx *c, const vl_timestep_embed_args *a,
                                             int64_t *numel) {
  const char *op = "timestep_embed";
  VL_TRY(vl_arg_dims(c, op, numel, a->B, a->dim, 1));
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
  VL_TRY(vl_arg_tensor(c, op, "emb", a->emb, *numel, false));
  return vl_check_ids(c, op, "timesteps", a->t, a->B);
}

#endif
