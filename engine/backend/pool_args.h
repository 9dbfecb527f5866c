/* Argument checks of pooling, 2x upsampling, padding and channel copy, run by the operation descriptors (ops.c) through vl_op_run on
 * every backend, the plan backend included, so all of them reject the same calls with the
 * same message. Host code only; plain C that also compiles as the host side of a .cu file. Each check
 * returns VL_OK or a VL_ERR_INVALID status whose message names the op and the argument, and
 * where it says so puts the element count of the op's main tensor in *numel (0: nothing to
 * do). Built on the tensor checks of args.h. */
#ifndef VRAMLAB_POOL_ARGS_H
#define VRAMLAB_POOL_ARGS_H
#include "args.h"

/* Pooling geometry: every window must hold at least one element of the image, so padding
 * never wins: pad <= k/2 (PyTorch's rule) and the last window starts inside the image
 * (floor and ceil_mode output sizes both pass). */
static inline vl_status vl_check_pool(vl_ctx *c, const char *op, int64_t planes, int64_t H,
                                          int64_t W, int k, int stride, int pad, int64_t P,
                                          int64_t Q, int64_t *nin, int64_t *nout) {
  if (k < 1 || stride < 1 || pad < 0 || 2 * pad > k)
    return vl_fail(c, VL_ERR_INVALID,
                   "%s: window %d, stride %d, pad %d (need k, stride >= 1, 0 <= pad <= k/2)", op,
                   k, stride, pad);
  if (H < 1 || W < 1 || P < 1 || Q < 1 || (P - 1) * stride - pad >= H ||
      (Q - 1) * stride - pad >= W)
    return vl_fail(c, VL_ERR_INVALID,
                   "%s: output %lld x %lld does not fit input %lld x %lld with window %d, "
                   "stride %d, pad %d",
                   op, (long long)P, (long long)Q, (long long)H, (long long)W, k, stride, pad);
  VL_TRY(vl_arg_dims(c, op, nin, planes, H, W));
  return vl_arg_dims(c, op, nout, planes, P, Q);
}

static inline vl_status vl_check_maxpool_fwd(vl_ctx *c, const vl_tensor *y, const vl_tensor *x,
                                                 int64_t planes, int64_t H, int64_t W, int k,
                                                 int stride, int pad, int64_t P, int64_t Q,
                                                 int64_t *nout) {
  const char *op = "maxpool_fwd";
  int64_t nin = 0;
  VL_TRY(vl_check_pool(c, op, planes, H, W, k, stride, pad, P, Q, &nin, nout));
  VL_TRY(vl_arg_tensor(c, op, "y", y, *nout, false));
  VL_TRY(vl_arg_tensor(c, op, "x", x, nin, false));
  return vl_arg_distinct(c, op, y, x, "y and x");
}

static inline vl_status vl_check_maxpool_bwd(vl_ctx *c, const vl_tensor *dx,
                                                 const vl_tensor *dy, const vl_tensor *x,
                                                 int64_t planes, int64_t H, int64_t W, int k,
                                                 int stride, int pad, int64_t P, int64_t Q,
                                                 int64_t *nin) {
  const char *op = "maxpool_bwd";
  int64_t nout = 0;
  VL_TRY(vl_check_pool(c, op, planes, H, W, k, stride, pad, P, Q, nin, &nout));
  VL_TRY(vl_arg_tensor(c, op, "dx", dx, *nin, false));
  VL_TRY(vl_arg_tensor(c, op, "dy", dy, nout, false));
  VL_TRY(vl_arg_tensor(c, op, "x", x, *nin, false));
  VL_TRY(vl_arg_distinct(c, op, dx, dy, "dx and dy"));
  return vl_arg_distinct(c, op, dx, x, "dx and x");
}

/* Upsampling: lo = (planes, H, W), hi = (planes, 2H, 2W); fwd reads lo, bwd reads hi. */
static inline vl_status vl_check_up2(vl_ctx *c, const char *op, const vl_tensor *lo,
                                         const vl_tensor *hi, int64_t planes, int64_t H,
                                         int64_t W, bool fwd, int64_t *nlo, int64_t *nhi) {
  VL_TRY(vl_arg_dims(c, op, nlo, planes, H, W));
  if (H > INT64_MAX / 4 || W > INT64_MAX / 4)
    return vl_fail(c, VL_ERR_INVALID, "%s: size overflow", op);
  VL_TRY(vl_arg_dims(c, op, nhi, planes, 2 * H, 2 * W));
  VL_TRY(vl_arg_tensor(c, op, fwd ? "x" : "dx", lo, *nlo, false));
  VL_TRY(vl_arg_tensor(c, op, fwd ? "y" : "dy", hi, *nhi, false));
  return vl_arg_distinct(c, op, lo, hi, fwd ? "y and x" : "dx and dy");
}

static inline vl_status vl_check_chan_copy(vl_ctx *c, const vl_tensor *y, int64_t yC,
                                               int64_t y_c0, const vl_tensor *x, int64_t xC,
                                               int64_t x_c0, int64_t nc, int64_t N, int64_t HW,
                                               int64_t *ncopy) {
  const char *op = "chan_copy";
  int64_t ny = 0, nx = 0;
  if (nc < 0 || y_c0 < 0 || x_c0 < 0 || y_c0 > yC - nc || x_c0 > xC - nc)
    return vl_fail(c, VL_ERR_INVALID,
                   "chan_copy: channels [%lld, %lld) of %lld into [%lld, %lld) of %lld "
                   "out of range",
                   (long long)x_c0, (long long)(x_c0 + nc), (long long)xC, (long long)y_c0,
                   (long long)(y_c0 + nc), (long long)yC);
  VL_TRY(vl_arg_dims(c, op, &ny, N, yC, HW));
  VL_TRY(vl_arg_dims(c, op, &nx, N, xC, HW));
  VL_TRY(vl_arg_dims(c, op, ncopy, N, nc, HW));
  VL_TRY(vl_arg_tensor(c, op, "y", y, ny, false));
  VL_TRY(vl_arg_tensor(c, op, "x", x, nx, false));
  return vl_arg_distinct(c, op, y, x, "y and x");
}

/* Padding: pads >= 0; *nin = planes*H*W, *nout the padded size. */
static inline vl_status vl_check_pad(vl_ctx *c, const char *op, const vl_tensor *lo,
                                        const vl_tensor *hi, int64_t planes, int64_t H, int64_t W,
                                        int top, int bottom, int left, int right, bool fwd,
                                        int64_t *nin, int64_t *nout) {
  if (top < 0 || bottom < 0 || left < 0 || right < 0)
    return vl_fail(c, VL_ERR_INVALID, "%s: padding (%d, %d, %d, %d) must be >= 0", op, top,
                   bottom, left, right);
  VL_TRY(vl_arg_dims(c, op, nin, planes, H, W));
  if (H > INT64_MAX / 2 - INT32_MAX || W > INT64_MAX / 2 - INT32_MAX)
    return vl_fail(c, VL_ERR_INVALID, "%s: size overflow", op);
  VL_TRY(vl_arg_dims(c, op, nout, planes, H + top + bottom, W + left + right));
  VL_TRY(vl_arg_tensor(c, op, fwd ? "x" : "dx", lo, *nin, false));
  VL_TRY(vl_arg_tensor(c, op, fwd ? "y" : "dy", hi, *nout, false));
  return vl_arg_distinct(c, op, lo, hi, fwd ? "y and x" : "dx and dy");
}

#endif
