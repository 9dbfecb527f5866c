/* The tensor and scalar checks every operation's argument check is built from (norm_args.h,
 * act_args.h, pool_args.h, loss_args.h, embed_args.h; ops.c). Host code only; plain C that
 * also compiles as the host side of a .cu file. Every check returns VL_OK or a VL_ERR_INVALID
 * status whose message names the op and the argument. */
#ifndef VRAMLAB_ARGS_H
#define VRAMLAB_ARGS_H
#include <math.h>

#include "vramlab/backend.h"

/* *n = a*b*c; false when a factor is negative or the product overflows int64. */
static inline bool vl_arg_mul3(int64_t *n, int64_t a, int64_t b, int64_t c) {
  *n = 0;
  if (a < 0 || b < 0 || c < 0) return false;
  if (a != 0 && b > INT64_MAX / a) return false;
  int64_t ab = a * b;
  if (ab != 0 && c > INT64_MAX / ab) return false;
  *n = ab * c;
  return true;
}

static inline vl_status vl_arg_dims(vl_ctx *c, const char *op, int64_t *n, int64_t a, int64_t b,
                                    int64_t d) {
  if (!vl_arg_mul3(n, a, b, d))
    return vl_fail(c, VL_ERR_INVALID, "%s: sizes %lld x %lld x %lld are negative or overflow",
                   op, (long long)a, (long long)b, (long long)d);
  return VL_OK;
}

/* t exists, is stored as fp32/fp16/bf16 (fp32 only when f32), holds >= n elements and has
 * storage (a plan context's tensors have none). */
static inline vl_status vl_arg_tensor(vl_ctx *c, const char *op, const char *name,
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
static inline vl_status vl_arg_opt(vl_ctx *c, const char *op, const char *name,
                                   const vl_tensor *t, int64_t n, bool f32) {
  return t ? vl_arg_tensor(c, op, name, t, n, f32) : VL_OK;
}

/* In place is allowed only as the same tensor storage in the same dtype (an fp16 y over an
 * fp32 x would overwrite elements not yet read). */
static inline vl_status vl_arg_inplace(vl_ctx *c, const char *op, const vl_tensor *out,
                                       const vl_tensor *in, const char *names) {
  if (out->data && out->data == in->data && out->dtype != in->dtype)
    return vl_fail(c, VL_ERR_INVALID, "%s: %s alias with different dtypes", op, names);
  return VL_OK;
}

static inline vl_status vl_arg_distinct(vl_ctx *c, const char *op, const vl_tensor *a,
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

static inline vl_status vl_arg_eps(vl_ctx *c, const char *op, float eps) {
  if (!(eps >= 0.0f) || !isfinite(eps))
    return vl_fail(c, VL_ERR_INVALID, "%s: eps %g must be finite and >= 0", op, (double)eps);
  return VL_OK;
}

static inline vl_status vl_arg_finite(vl_ctx *c, const char *op, const char *name, float v) {
  if (!isfinite(v))
    return vl_fail(c, VL_ERR_INVALID, "%s: %s %g is not finite", op, name, (double)v);
  return VL_OK;
}

#endif
