/* nn.Linear forward/backward as GEMMs (their FLOPs and workspace: vl_op_run). */
#include "vramlab/nn.h"

vl_status vl_linear_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, const vl_tensor *W,
                        int64_t R, int64_t K, int64_t N, float beta) {
  vl_gemm g = {.ta = false, .tb = true, .M = R, .N = N, .K = K, .alpha = 1.0f, .beta = beta,
               .A = x, .lda = K, .B = W, .ldb = K, .C = y, .ldc = N, .batch = 1};
  return vl_gemm_run(c, &g);
}

vl_status vl_linear_bwd_x(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *W,
                          int64_t R, int64_t K, int64_t N, float beta) {
  vl_gemm g = {.ta = false, .tb = false, .M = R, .N = K, .K = N, .alpha = 1.0f, .beta = beta,
               .A = dy, .lda = N, .B = W, .ldb = K, .C = dx, .ldc = K, .batch = 1};
  return vl_gemm_run(c, &g);
}

vl_status vl_linear_bwd_w(vl_ctx *c, vl_tensor *dW, const vl_tensor *dy, const vl_tensor *x,
                          int64_t R, int64_t K, int64_t N, float scale) {
  vl_gemm g = {.ta = true, .tb = false, .M = N, .N = K, .K = R, .alpha = scale, .beta = 1.0f,
               .A = dy, .lda = N, .B = x, .ldb = K, .C = dW, .ldc = K, .batch = 1};
  return vl_gemm_run(c, &g);
}
