/* Context creation: pick the backend for a device and give it its arena. */
#include <stdlib.h>
#include <string.h>

#include "vramlab/backend.h"

vl_status vl_ctx_create(vl_ctx **out, vl_device device, size_t cap) {
  return vl_ctx_create_ex(out, device, cap, VL_DEV_CUDA);
}

vl_status vl_ctx_create_ex(vl_ctx **out, vl_device device, size_t cap, vl_device plan_target) {
  *out = NULL;
  const vl_backend *be = device == VL_DEV_CPU ? vl_backend_cpu()
                         : device == VL_DEV_PLAN ? &vl_backend_plan
                                                 : vl_backend_cuda();
  if (!be) return VL_ERR_UNSUPPORTED;
  vl_ctx *c = calloc(1, sizeof *c);
  if (!c) return VL_ERR_OOM;
  c->prof = calloc(VL_OP_COUNT, sizeof *c->prof);
  if (!c->prof) { free(c); return VL_ERR_OOM; }
  c->be = be;
  c->device = device;
  c->plan = device == VL_DEV_PLAN;
  c->plan_target = plan_target;
  c->cap = cap;
  vl_status s = VL_OK;
  if (device == VL_DEV_CPU) s = vl_arena_create(&c->arena, VL_ARENA_HOST, cap, NULL);
  else if (device == VL_DEV_PLAN) s = vl_arena_create(&c->arena, VL_ARENA_VIRTUAL, cap, NULL);
  /* The CUDA backend creates its arena over one cudaMalloc of the cap in init. */
  if (s == VL_OK) s = be->init(c);
  if (s != VL_OK) { vl_ctx_destroy(c); return s; }
  *out = c;
  return VL_OK;
}

void vl_ctx_destroy(vl_ctx *c) {
  if (!c) return;
  if (c->be && c->be->fini) c->be->fini(c);
  vl_arena_destroy(c->arena);
  free(c->prof);
  free(c);
}
