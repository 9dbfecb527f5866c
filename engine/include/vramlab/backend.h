/* The backend interface: what is not an operation (context lifecycle, sync, timers,
 * copies, host memory) as function pointers, and the operations as one table indexed by
 * vl_op (vramlab/ops.h), called only through vl_op_run.
 *
 * Three backends implement it: `cpu` (OpenBLAS, oneDNN and OpenMP loops over the
 * single-source kernels), `cuda` (cuBLAS, cuDNN and the same kernels wrapped in grid-stride
 * launches) and `plan` (computes nothing: a plan context has ctx->plan set, so vl_op_run
 * counts and returns; its op table is empty and its copies are NULL). Workspace sizing is a
 * pure function of an op's arguments and a target (the op's descriptor), so the planner
 * follows the rules of the backend it plans *for* (ctx->plan_target). */
#ifndef VRAMLAB_BACKEND_H
#define VRAMLAB_BACKEND_H

#include "vramlab/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An operation's kernel: args points to the op's argument struct (ops.h). */
typedef vl_status (*vl_op_fn)(vl_ctx *c, const void *args);

typedef struct vl_backend {
  const char *name;
  vl_device device;
  vl_status (*init)(vl_ctx *c);
  void (*fini)(vl_ctx *c);
  vl_status (*sync)(vl_ctx *c);
  /* Step timing at step edges: CUDA events on the compute stream, the monotonic host clock
   * on CPU. timer_stop waits for the work recorded since timer_start and returns seconds. */
  vl_status (*timer_start)(vl_ctx *c);
  vl_status (*timer_stop)(vl_ctx *c, double *seconds);
  /* Persistent library workspace taken once at context creation (cuBLAS); 0 on CPU. */
  size_t (*fixed_ws_bytes)(const vl_ctx *c);
  /* Host <-> device copies of raw bytes into a tensor (uploading batches, weights). */
  vl_status (*upload)(vl_ctx *c, vl_tensor *dst, size_t dst_off, const void *src, size_t n);
  vl_status (*download)(vl_ctx *c, void *dst, const vl_tensor *src, size_t src_off, size_t n);
  /* Host memory for input batches: page-locked (pinned) on CUDA when `pinned`, so uploads
   * from it run asynchronously; plain malloc on CPU, where no device copy exists. */
  void *(*host_alloc)(vl_ctx *c, size_t bytes, bool pinned);
  void (*host_free)(vl_ctx *c, void *p, bool pinned);
  /* Host -> device copy on the backend's copy stream; the compute stream waits for it (an
   * event), so it overlaps the compute already queued. From pageable memory CUDA stages
   * the copy itself (slower, the comparison pinning is about). src must stay untouched until
   * the compute stream has passed this point (a sync or timer_stop). CPU: memcpy. */
  vl_status (*upload_async)(vl_ctx *c, vl_tensor *dst, size_t dst_off, const void *src, size_t n);
  /* Per-operation timing for --profile without a host sync around every operation:
   * op_timer_begin / op_timer_end bracket one kernel on the device's own clock (CUDA: a pair
   * of events recorded on the compute stream, kept in a pool); op_timer_collect waits for
   * what was recorded, adds each pair's seconds to prof[op] and empties the pool. NULL: the
   * dispatch times with the host clock between two syncs (CPU: operations are synchronous). */
  vl_status (*op_timer_begin)(vl_ctx *c);
  vl_status (*op_timer_end)(vl_ctx *c, vl_op op);
  vl_status (*op_timer_collect)(vl_ctx *c, vl_op_profile *prof);
  /* The kernels: each kernel file of a backend registers its own, b->ops[VL_OP_...] = kernel
   * (vl_cpu_*_ops, vl_cuda_*_ops); a NULL entry makes vl_op_run return VL_ERR_UNSUPPORTED
   * naming the op and this backend. */
  vl_op_fn ops[VL_OP_COUNT];
} vl_backend;

/* The CPU backend (its table is built on the first call). */
const vl_backend *vl_backend_cpu(void);
extern const vl_backend vl_backend_plan;
/* The CUDA backend (NULL-returning when built without CUDA). */
const vl_backend *vl_backend_cuda(void);
/* True when a CUDA device is visible (always false without the CUDA build). */
bool vl_cuda_available(void);

/* Shared workspace rules (pure; used by the backends and the planner). */
size_t vl_gemm_ws_cpu(const vl_gemm *g);
size_t vl_gemm_ws_cuda(const vl_gemm *g);
#define VL_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)
/* Conv workspace rules: CPU asks oneDNN for the primitive's scratchpad, plus the buffers of
 * the reorders into its preferred layout and of fp16/bf16 -> fp32 conversions; CUDA is the fixed cuDNN budget rule of cuda_host.c (the backend picks the
 * fastest algorithm that fits in it). */
size_t vl_conv_ws_cpu(const vl_conv *cv, vl_conv_dir dir, bool accumulate);
size_t vl_conv_ws_cuda(const vl_conv *cv, vl_conv_dir dir, bool accumulate);
/* The oneDNN implementation the CPU backend uses for (cv, dir), e.g. "gemm:jit" ("none"
 * when oneDNN has none), for reports. */
const char *vl_cpu_conv_impl(const vl_conv *cv, vl_conv_dir dir);
/* What the CPU backend's numbers depend on beyond the engine's code, as keys a regression
 * baseline stores beside the numbers they determine: the convolutions oneDNN chose for every
 * shape run so far in this process (version, ISA, implementation, scratchpad, reorders;
 * hashed), and OpenBLAS's sgemm kernel (its core name). Equal keys: bit-identical losses and
 * the same measured peak; different keys: another kernel, judged with a tolerance. */
void vl_cpu_conv_key(char *out, size_t n);
void vl_cpu_blas_key(char *out, size_t n);

#ifdef __cplusplus
}
#endif
#endif
