/* PLACEHOLDER until the CNN ops land: every op reports VL_ERR_UNSUPPORTED. */
#include "cpu_internal.h"

vl_status vl_cpu_bn_fwd_train(vl_ctx *c, vl_tensor *y, vl_tensor *mean, vl_tensor *rstd,
                              vl_tensor *rmean, vl_tensor *rvar, const vl_tensor *x,
                              const vl_tensor *gamma, const vl_tensor *beta, int64_t N, int64_t C,
                              int64_t HW, float eps, float momentum) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_bn_fwd_train: not implemented");
}
vl_status vl_cpu_bn_fwd_eval(vl_ctx *c, vl_tensor *y, const vl_tensor *x, const vl_tensor *gamma,
                             const vl_tensor *beta, const vl_tensor *rmean, const vl_tensor *rvar,
                             int64_t N, int64_t C, int64_t HW, float eps) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_bn_fwd_eval: not implemented");
}
vl_status vl_cpu_bn_bwd(vl_ctx *c, vl_tensor *dx, vl_tensor *dgamma, vl_tensor *dbeta,
                        const vl_tensor *dy, const vl_tensor *x, const vl_tensor *gamma,
                        const vl_tensor *mean, const vl_tensor *rstd, int64_t N, int64_t C,
                        int64_t HW) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_bn_bwd: not implemented");
}
vl_status vl_cpu_relu_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_relu_fwd: not implemented");
}
vl_status vl_cpu_relu_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *y,
                          int64_t n) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_relu_bwd: not implemented");
}
vl_status vl_cpu_maxpool_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                             int64_t H, int64_t W, int k, int stride, int pad, int64_t P,
                             int64_t Q) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_maxpool_fwd: not implemented");
}
vl_status vl_cpu_maxpool_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *x,
                             int64_t planes, int64_t H, int64_t W, int k, int stride, int pad,
                             int64_t P, int64_t Q) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_maxpool_bwd: not implemented");
}
vl_status vl_cpu_upsample2x_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                                int64_t H, int64_t W) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_upsample2x_fwd: not implemented");
}
vl_status vl_cpu_upsample2x_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, int64_t planes,
                                int64_t H, int64_t W) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_upsample2x_bwd: not implemented");
}
vl_status vl_cpu_chan_copy(vl_ctx *c, vl_tensor *y, int64_t yC, int64_t y_c0, const vl_tensor *x,
                           int64_t xC, int64_t x_c0, int64_t nc, int64_t N, int64_t HW,
                           bool accumulate) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_chan_copy: not implemented");
}
vl_status vl_cpu_xent_pix(vl_ctx *c, vl_tensor *logits, vl_tensor *loss, const int32_t *tgt,
                          int64_t N, int64_t K, int64_t HW, float dloss_scale) {
  return vl_fail(c, VL_ERR_UNSUPPORTED, "vl_cpu_xent_pix: not implemented");
}
