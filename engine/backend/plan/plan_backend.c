/* Plan backend: computes nothing. Every compute op is NULL ("counted, not computed"), so
 * layers run their exact allocation sequence over a virtual arena and count FLOPs/bytes.
 * Workspace rules follow the planned-for target, ctx->plan_target (cuda by default; cpu
 * when checking the planner against a measured CPU run). */
#include "vramlab/backend.h"

/* The cuBLAS workspace a CUDA context takes at init is planned the same way. */
static vl_status plan_init(vl_ctx *c) {
  if (c->plan_target != VL_DEV_CUDA) return VL_OK;
  size_t off;
  return vl_arena_alloc(c->arena, VL_CUBLAS_WORKSPACE_BYTES, VL_MEM_WORKSPACE, &off);
}
static vl_status plan_sync(vl_ctx *c) { (void)c; return VL_OK; }

static size_t plan_ws(const vl_ctx *c, const vl_gemm *g) {
  return c->plan_target == VL_DEV_CPU ? vl_gemm_ws_cpu(g) : vl_gemm_ws_cuda(g);
}
static size_t plan_fixed_ws(const vl_ctx *c) {
  return c->plan_target == VL_DEV_CPU ? 0 : VL_CUBLAS_WORKSPACE_BYTES;
}

static size_t plan_conv_ws(const vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, bool acc) {
  return c->plan_target == VL_DEV_CPU ? vl_conv_ws_cpu(cv, dir, acc) : vl_conv_ws_cuda(cv, dir, acc);
}

const vl_backend vl_backend_plan = {
    .name = "plan", .device = VL_DEV_PLAN,
    .init = plan_init, .sync = plan_sync,
    .gemm_ws_bytes = plan_ws, .fixed_ws_bytes = plan_fixed_ws, .conv_ws_bytes = plan_conv_ws,
};
