/* Plan backend: computes nothing. A plan context has ctx->plan set, so vl_op_run counts
 * every op and returns before looking at this (empty) op table; layers run their exact
 * allocation sequence over a virtual arena. Workspace rules follow the planned-for target,
 * ctx->plan_target (cuda by default; cpu when checking the planner against a measured CPU
 * run). Copies are NULL: there is no data on this device. */
#include "vramlab/backend.h"

/* The cuBLAS workspace a CUDA context takes at init is planned the same way. */
static vl_status plan_init(vl_ctx *c) {
  if (c->plan_target != VL_DEV_CUDA) return VL_OK;
  size_t off;
  return vl_arena_alloc(c->arena, VL_CUBLAS_WORKSPACE_BYTES, VL_MEM_WORKSPACE, &off);
}
static vl_status plan_sync(vl_ctx *c) { (void)c; return VL_OK; }

static size_t plan_fixed_ws(const vl_ctx *c) {
  return c->plan_target == VL_DEV_CPU ? 0 : VL_CUBLAS_WORKSPACE_BYTES;
}

const vl_backend vl_backend_plan = {
    .name = "plan", .device = VL_DEV_PLAN,
    .init = plan_init, .sync = plan_sync, .fixed_ws_bytes = plan_fixed_ws,
};
