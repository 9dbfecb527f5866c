/* PLACEHOLDER until the oneDNN convolutions land. */
#include "cpu_internal.h"
size_t vl_cpu_conv_ws(const vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, bool accumulate) { return 0; }
size_t vl_conv_ws_cpu(const vl_conv *cv, vl_conv_dir dir, bool accumulate) { return 0; }
size_t vl_conv_ws_cuda(const vl_conv *cv, vl_conv_dir dir, bool accumulate) { return 0; }
bool vl_conv_init(vl_conv *cv, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                  int64_t S, int stride, int pad, int dil) { return false; }
double vl_conv_flops(const vl_conv *cv) { return 0; }
vl_status vl_cpu_conv_fwd(vl_ctx *c, const vl_conv *cv, vl_tensor *y, const vl_tensor *x,
                          const vl_tensor *w, void *ws, size_t ws_bytes) { return VL_ERR_UNSUPPORTED; }
vl_status vl_cpu_conv_bwd_data(vl_ctx *c, const vl_conv *cv, vl_tensor *dx, const vl_tensor *dy,
                               const vl_tensor *w, void *ws, size_t ws_bytes) { return VL_ERR_UNSUPPORTED; }
vl_status vl_cpu_conv_bwd_weight(vl_ctx *c, const vl_conv *cv, vl_tensor *dw, const vl_tensor *x,
                                 const vl_tensor *dy, bool accumulate, void *ws, size_t ws_bytes) { return VL_ERR_UNSUPPORTED; }
