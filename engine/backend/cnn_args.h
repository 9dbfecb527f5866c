/* Argument checks of the CNN element/plane ops (and of the id tensors of embed/xent), run
 * by the operation descriptors (ops.c) through vl_op_run on every backend, the plan
 * backend included, so all of them reject the same calls with the same message. Host code
 * only; plain C that also compiles as the host side of a .cu file. Every check returns VL_OK
 * or a VL_ERR_INVALID status whose message names the op and the argument. */
#ifndef VRAMLAB_CNN_ARGS_H
#define VRAMLAB_CNN_ARGS_H
#include <math.h>

#include "vramlab/backend.h"

/* *n = a*b*c; false when a factor is negative or the product overflows int64. */
static inline bool vl_cnn_mul3(int64_t *n, int64_t a, int64_t b, int64_t c) {
  *n = 0;
  if (a < 0 || b < 0 || c < 0) return false;
  if (a != 0 && b > INT64_MAX / a) return false;
  int64_t ab = a * b;
  if (ab != 0 && c > INT64_MAX / ab) return false;
  *n = ab * c;
  return true;
}

static inline vl_status vl_cnn_dims(vl_ctx *c, const char *op, int64_t *n, int64_t a, int64_t b,
                                    int64_t d) {
  if (!vl_cnn_mul3(n, a, b, d))
    return vl_fail(c, VL_ERR_INVALID, "%s: sizes %lld x %lld x %lld are negative or overflow",
                   op, (long long)a, (long long)b, (long long)d);
  return VL_OK;
}

/* t exists, is stored as fp32/fp16/bf16 (fp32 only when f32), holds >= n elements and has
 * storage (a plan context's tensors have none). */
static inline vl_status vl_cnn_tensor(vl_ctx *c, const char *op, const char *name,
                                      const vl_tensor *t, int64_t n, bool f32) {
  if (!t) return vl_fail(c, VL_ERR_INVALID, "%s: %s is NULL", op, name);
  if (t->dtype != VL_F32 && (f32 || (t->dtype != VL_F16 && t->dtype != VL_BF16)))
    return vl_fail(c, VL_ERR_INVALID, "%s: %s is %s, %s expected", op, name,
                   vl_dtype_name(t->dtype), f32 ? "fp32" : "fp32, fp16 or bf16");
  if (t->n < n)
    return vl_fail(c, VL_ERR_INVALID, "%s: %s holds %lld elements, the sizes need %lld", op,
                   name, (long long)t->n, (long long)n);
  if (n > 0 && !t->data && t->device != VL_DEV_PLAN)
    return vl_fail(c, VL_ERR_INVALID, "%s: %s has no storage", op, name);
  return VL_OK;
}

/* An optional tensor (NULL allowed). */
static inline vl_status vl_cnn_opt(vl_ctx *c, const char *op, const char *name,
                                   const vl_tensor *t, int64_t n, bool f32) {
  return t ? vl_cnn_tensor(c, op, name, t, n, f32) : VL_OK;
}

/* In place is allowed only as the same tensor storage in the same dtype (an fp16 y over an
 * fp32 x would overwrite elements not yet read). */
static inline vl_status vl_cnn_inplace(vl_ctx *c, const char *op, const vl_tensor *out,
                                       const vl_tensor *in, const char *names) {
  if (out->data && out->data == in->data && out->dtype != in->dtype)
    return vl_fail(c, VL_ERR_INVALID, "%s: %s alias with different dtypes", op, names);
  return VL_OK;
}

static inline vl_status vl_cnn_distinct(vl_ctx *c, const char *op, const vl_tensor *a,
                                        const vl_tensor *b, const char *names) {
  if (a->data && a->data == b->data)
    return vl_fail(c, VL_ERR_INVALID, "%s: %s must not alias", op, names);
  return VL_OK;
}

/* Token ids, targets, class masks: t exists, is VL_I32, holds >= n ids. */
static inline vl_status vl_check_ids(vl_ctx *c, const char *op, const char *name,
                                     const vl_tensor *t, int64_t n) {
  if (!t) return n > 0 ? vl_fail(c, VL_ERR_INVALID, "%s: %s are NULL", op, name) : VL_OK;
  if (t->dtype != VL_I32)
    return vl_fail(c, VL_ERR_INVALID, "%s: %s are %s, i32 expected", op, name,
                   vl_dtype_name(t->dtype));
  if (t->n < n)
    return vl_fail(c, VL_ERR_INVALID, "%s: %s hold %lld ids, the sizes need %lld", op, name,
                   (long long)t->n, (long long)n);
  if (n > 0 && !t->data && t->device != VL_DEV_PLAN)
    return vl_fail(c, VL_ERR_INVALID, "%s: %s have no storage", op, name);
  return VL_OK;
}

/* ---- per op: *numel is the element count of the op's main (N, C, HW) tensor ------------- */

static inline vl_status vl_cnn_check_bn_train(vl_ctx *c, const vl_tensor *y, const vl_tensor *mean,
                                              const vl_tensor *rstd, const vl_tensor *rmean,
                                              const vl_tensor *rvar, const vl_tensor *x,
                                              const vl_tensor *gamma, const vl_tensor *beta,
                                              int64_t N, int64_t C, int64_t HW, float eps,
                                              float momentum, int64_t *numel) {
  const char *op = "bn_fwd_train";
  VL_TRY(vl_cnn_dims(c, op, numel, N, C, HW));
  VL_TRY(vl_cnn_tensor(c, op, "y", y, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", x, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "mean", mean, C, true));
  VL_TRY(vl_cnn_tensor(c, op, "rstd", rstd, C, true));
  VL_TRY(vl_cnn_opt(c, op, "running mean", rmean, C, true));
  VL_TRY(vl_cnn_opt(c, op, "running var", rvar, C, true));
  VL_TRY(vl_cnn_tensor(c, op, "gamma", gamma, C, false));
  VL_TRY(vl_cnn_tensor(c, op, "beta", beta, C, false));
  VL_TRY(vl_cnn_distinct(c, op, y, x, "y and x")); /* the normalisation rereads x */
  if (*numel > 0 && N * HW < 2) /* the unbiased variance needs two; PyTorch refuses too */
    return vl_fail(c, VL_ERR_INVALID,
                   "bn_fwd_train: %lld value per channel; training needs more than 1",
                   (long long)(N * HW));
  if (!(eps >= 0.0f) || !isfinite(eps) || !(momentum >= 0.0f && momentum <= 1.0f))
    return vl_fail(c, VL_ERR_INVALID, "bn_fwd_train: eps %g must be >= 0, momentum %g in [0, 1]",
                   (double)eps, (double)momentum);
  return VL_OK;
}

static inline vl_status vl_cnn_check_bn_eval(vl_ctx *c, const vl_tensor *y, const vl_tensor *x,
                                             const vl_tensor *gamma, const vl_tensor *beta,
                                             const vl_tensor *rmean, const vl_tensor *rvar,
                                             int64_t N, int64_t C, int64_t HW, float eps,
                                             int64_t *numel) {
  const char *op = "bn_fwd_eval";
  VL_TRY(vl_cnn_dims(c, op, numel, N, C, HW));
  VL_TRY(vl_cnn_tensor(c, op, "y", y, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", x, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "gamma", gamma, C, false));
  VL_TRY(vl_cnn_tensor(c, op, "beta", beta, C, false));
  VL_TRY(vl_cnn_tensor(c, op, "running mean", rmean, C, true));
  VL_TRY(vl_cnn_tensor(c, op, "running var", rvar, C, true));
  VL_TRY(vl_cnn_inplace(c, op, y, x, "y and x"));
  if (!(eps >= 0.0f) || !isfinite(eps))
    return vl_fail(c, VL_ERR_INVALID, "bn_fwd_eval: eps %g must be >= 0", (double)eps);
  return VL_OK;
}

static inline vl_status vl_cnn_check_bn_bwd(vl_ctx *c, const vl_tensor *dx, const vl_tensor *dgamma,
                                            const vl_tensor *dbeta, const vl_tensor *dy,
                                            const vl_tensor *x, const vl_tensor *gamma,
                                            const vl_tensor *mean, const vl_tensor *rstd,
                                            int64_t N, int64_t C, int64_t HW, int64_t *numel) {
  const char *op = "bn_bwd";
  VL_TRY(vl_cnn_dims(c, op, numel, N, C, HW));
  VL_TRY(vl_cnn_tensor(c, op, "dx", dx, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "dy", dy, *numel, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", x, *numel, false));
  VL_TRY(vl_cnn_opt(c, op, "dgamma", dgamma, C, false));
  VL_TRY(vl_cnn_opt(c, op, "dbeta", dbeta, C, false));
  VL_TRY(vl_cnn_tensor(c, op, "gamma", gamma, C, false));
  VL_TRY(vl_cnn_tensor(c, op, "mean", mean, C, true));
  VL_TRY(vl_cnn_tensor(c, op, "rstd", rstd, C, true));
  VL_TRY(vl_cnn_inplace(c, op, dx, dy, "dx and dy"));
  VL_TRY(vl_cnn_distinct(c, op, dx, x, "dx and x")); /* x is reread after dx is written */
  return VL_OK;
}

/* forward: out = y, in = x; backward (bwd): out = dx, in = dy, and y the forward output */
static inline vl_status vl_cnn_check_relu(vl_ctx *c, const char *op, bool bwd, const vl_tensor *out,
                                          const vl_tensor *in, const vl_tensor *y, int64_t n) {
  if (n < 0) return vl_fail(c, VL_ERR_INVALID, "%s: n = %lld", op, (long long)n);
  VL_TRY(vl_cnn_tensor(c, op, bwd ? "dx" : "y", out, n, false));
  VL_TRY(vl_cnn_tensor(c, op, bwd ? "dy" : "x", in, n, false));
  if (bwd) VL_TRY(vl_cnn_tensor(c, op, "y", y, n, false));
  return vl_cnn_inplace(c, op, out, in, bwd ? "dx and dy" : "y and x");
}

/* Pooling geometry: every window must hold at least one element of the image, so padding
 * never wins: pad <= k/2 (PyTorch's rule) and the last window starts inside the image
 * (floor and ceil_mode output sizes both pass). */
static inline vl_status vl_cnn_check_pool(vl_ctx *c, const char *op, int64_t planes, int64_t H,
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
  VL_TRY(vl_cnn_dims(c, op, nin, planes, H, W));
  return vl_cnn_dims(c, op, nout, planes, P, Q);
}

static inline vl_status vl_cnn_check_maxpool_fwd(vl_ctx *c, const vl_tensor *y, const vl_tensor *x,
                                                 int64_t planes, int64_t H, int64_t W, int k,
                                                 int stride, int pad, int64_t P, int64_t Q,
                                                 int64_t *nout) {
  const char *op = "maxpool_fwd";
  int64_t nin = 0;
  VL_TRY(vl_cnn_check_pool(c, op, planes, H, W, k, stride, pad, P, Q, &nin, nout));
  VL_TRY(vl_cnn_tensor(c, op, "y", y, *nout, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", x, nin, false));
  return vl_cnn_distinct(c, op, y, x, "y and x");
}

static inline vl_status vl_cnn_check_maxpool_bwd(vl_ctx *c, const vl_tensor *dx,
                                                 const vl_tensor *dy, const vl_tensor *x,
                                                 int64_t planes, int64_t H, int64_t W, int k,
                                                 int stride, int pad, int64_t P, int64_t Q,
                                                 int64_t *nin) {
  const char *op = "maxpool_bwd";
  int64_t nout = 0;
  VL_TRY(vl_cnn_check_pool(c, op, planes, H, W, k, stride, pad, P, Q, nin, &nout));
  VL_TRY(vl_cnn_tensor(c, op, "dx", dx, *nin, false));
  VL_TRY(vl_cnn_tensor(c, op, "dy", dy, nout, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", x, *nin, false));
  VL_TRY(vl_cnn_distinct(c, op, dx, dy, "dx and dy"));
  return vl_cnn_distinct(c, op, dx, x, "dx and x");
}

/* Upsampling: lo = (planes, H, W), hi = (planes, 2H, 2W); fwd reads lo, bwd reads hi. */
static inline vl_status vl_cnn_check_up2(vl_ctx *c, const char *op, const vl_tensor *lo,
                                         const vl_tensor *hi, int64_t planes, int64_t H,
                                         int64_t W, bool fwd, int64_t *nlo, int64_t *nhi) {
  VL_TRY(vl_cnn_dims(c, op, nlo, planes, H, W));
  if (H > INT64_MAX / 4 || W > INT64_MAX / 4)
    return vl_fail(c, VL_ERR_INVALID, "%s: size overflow", op);
  VL_TRY(vl_cnn_dims(c, op, nhi, planes, 2 * H, 2 * W));
  VL_TRY(vl_cnn_tensor(c, op, fwd ? "x" : "dx", lo, *nlo, false));
  VL_TRY(vl_cnn_tensor(c, op, fwd ? "y" : "dy", hi, *nhi, false));
  return vl_cnn_distinct(c, op, lo, hi, fwd ? "y and x" : "dx and dy");
}

static inline vl_status vl_cnn_check_chan_copy(vl_ctx *c, const vl_tensor *y, int64_t yC,
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
  VL_TRY(vl_cnn_dims(c, op, &ny, N, yC, HW));
  VL_TRY(vl_cnn_dims(c, op, &nx, N, xC, HW));
  VL_TRY(vl_cnn_dims(c, op, ncopy, N, nc, HW));
  VL_TRY(vl_cnn_tensor(c, op, "y", y, ny, false));
  VL_TRY(vl_cnn_tensor(c, op, "x", x, nx, false));
  return vl_cnn_distinct(c, op, y, x, "y and x");
}

static inline vl_status vl_cnn_check_xent_pix(vl_ctx *c, const vl_tensor *logits,
                                              const vl_tensor *loss, const vl_tensor *tgt,
                                              int64_t N, int64_t K, int64_t HW, float scale,
                                              int64_t *npix) {
  const char *op = "xent_pix";
  int64_t nl = 0;
  VL_TRY(vl_cnn_dims(c, op, &nl, N, K, HW));
  VL_TRY(vl_cnn_dims(c, op, npix, N, 1, HW));
  if (*npix > 0 && K < 1) return vl_fail(c, VL_ERR_INVALID, "xent_pix: %lld classes", (long long)K);
  VL_TRY(vl_cnn_tensor(c, op, "logits", logits, nl, false));
  VL_TRY(vl_cnn_tensor(c, op, "loss", loss, *npix, true));
  VL_TRY(vl_check_ids(c, op, "targets", tgt, *npix));
  if (!isfinite(scale))
    return vl_fail(c, VL_ERR_INVALID, "xent_pix: dloss_scale %g", (double)scale);
  return vl_cnn_distinct(c, op, logits, loss, "logits and loss");
}

#endif
