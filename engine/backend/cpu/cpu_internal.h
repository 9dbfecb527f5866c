/* The CPU backend's ops that live outside cpu_backend.c: cpu_conv.c (oneDNN convolutions)
 * and cpu_cnn.c (loops over engine/kernels/cnn.h). Signatures as in vl_backend. */
#ifndef VRAMLAB_CPU_INTERNAL_H
#define VRAMLAB_CPU_INTERNAL_H
#include "vramlab/backend.h"

size_t vl_cpu_conv_ws(const vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, bool accumulate);
vl_status vl_cpu_conv_fwd(vl_ctx *c, const vl_conv *cv, vl_tensor *y, const vl_tensor *x,
                          const vl_tensor *w, void *ws, size_t ws_bytes);
vl_status vl_cpu_conv_bwd_data(vl_ctx *c, const vl_conv *cv, vl_tensor *dx, const vl_tensor *dy,
                               const vl_tensor *w, void *ws, size_t ws_bytes);
vl_status vl_cpu_conv_bwd_weight(vl_ctx *c, const vl_conv *cv, vl_tensor *dw, const vl_tensor *x,
                                 const vl_tensor *dy, bool accumulate, void *ws, size_t ws_bytes);

vl_status vl_cpu_bn_fwd_train(vl_ctx *c, vl_tensor *y, vl_tensor *mean, vl_tensor *rstd,
                              vl_tensor *rmean, vl_tensor *rvar, const vl_tensor *x,
                              const vl_tensor *gamma, const vl_tensor *beta, int64_t N, int64_t C,
                              int64_t HW, float eps, float momentum);
vl_status vl_cpu_bn_fwd_eval(vl_ctx *c, vl_tensor *y, const vl_tensor *x, const vl_tensor *gamma,
                             const vl_tensor *beta, const vl_tensor *rmean, const vl_tensor *rvar,
                             int64_t N, int64_t C, int64_t HW, float eps);
vl_status vl_cpu_bn_bwd(vl_ctx *c, vl_tensor *dx, vl_tensor *dgamma, vl_tensor *dbeta,
                        const vl_tensor *dy, const vl_tensor *x, const vl_tensor *gamma,
                        const vl_tensor *mean, const vl_tensor *rstd, int64_t N, int64_t C,
                        int64_t HW);
vl_status vl_cpu_relu_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n);
vl_status vl_cpu_relu_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *y,
                          int64_t n);
vl_status vl_cpu_maxpool_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                             int64_t H, int64_t W, int k, int stride, int pad, int64_t P,
                             int64_t Q);
vl_status vl_cpu_maxpool_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *x,
                             int64_t planes, int64_t H, int64_t W, int k, int stride, int pad,
                             int64_t P, int64_t Q);
vl_status vl_cpu_upsample2x_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                                int64_t H, int64_t W);
vl_status vl_cpu_upsample2x_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, int64_t planes,
                                int64_t H, int64_t W);
vl_status vl_cpu_chan_copy(vl_ctx *c, vl_tensor *y, int64_t yC, int64_t y_c0, const vl_tensor *x,
                           int64_t xC, int64_t x_c0, int64_t nc, int64_t N, int64_t HW,
                           bool accumulate);
vl_status vl_cpu_xent_pix(vl_ctx *c, vl_tensor *logits, vl_tensor *loss, const int32_t *tgt,
                          int64_t N, int64_t K, int64_t HW, float dloss_scale);
#endif
