/* GEMM dispatch with arena-owned workspace, and nn.Linear forward/backward. */
#include "vramlab/nn.h"

vl_status vl_op_gemm(vl_ctx *c, vl_gemm *g) {
  double flops = 2.0 * (double)g->M * (double)g->N * (double)g->K * (double)g->batch;
  double bytes = (double)g->batch * ((double)vl_dtype_bytes(g->A->dtype, g->M * g->K) +
                                     (double)vl_dtype_bytes(g->C->dtype, g->M * g->N)) +
                 (double)vl_dtype_bytes(g->B->dtype, g->K * g->N);
  vl_count(c, flops, bytes);
  size_t ws = c->be->gemm_ws_bytes(c, g);
  vl_tensor wt = {0};
  if (ws) {
    int64_t n = (int64_t)((ws + 3) / 4);
    VL_TRY(vl_tensor_alloc(c, &wt, VL_F32, VL_MEM_WORKSPACE, 1, &n));
  }
  g->ws = wt.data;
  g->ws_bytes = ws;
  vl_status s = VL_RUN(c, gemm, g);
  if (ws) vl_tensor_free(c, &wt);
  return s;
}

vl_status vl_linear_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, const vl_tensor *W,
                        int64_t R, int64_t K, int64_t N, float beta) {
  vl_gemm g = {.ta = false, .tb = true, .M = R, .N = N, .K = K, .alpha = 1.0f, .beta = beta,
               .A = x, .lda = K, .B = W, .ldb = K, .C = y, .ldc = N, .batch = 1};
  return vl_op_gemm(c, &g);
}

vl_status vl_linear_bwd_x(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *W,
                          int64_t R, int64_t K, int64_t N, float beta) {
  vl_gemm g = {.ta = false, .tb = false, .M = R, .N = K, .K = N, .alpha = 1.0f, .beta = beta,
               .A = dy, .lda = N, .B = W, .ldb = K, .C = dx, .ldc = K, .batch = 1};
  return vl_op_gemm(c, &g);
}

vl_status vl_linear_bwd_w(vl_ctx *c, vl_tensor *dW, const vl_tensor *dy, const vl_tensor *x,
                          int64_t R, int64_t K, int64_t N, float scale) {
  vl_gemm g = {.ta = true, .tb = false, .M = N, .N = K, .K = R, .alpha = scale, .beta = 1.0f,
               .A = dy, .lda = N, .B = x, .ldb = K, .C = dW, .ldc = K, .batch = 1};
  return vl_op_gemm(c, &g);
}
