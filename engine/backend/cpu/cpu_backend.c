/* CPU backend: the backend itself (host memory, timers, the op table); its operations live
 * one family per file (cpu_internal.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/backend.h"
#include "cpu_internal.h"

/* The backend's state on a context (c->be_state). */
typedef struct {
  double timer_t0; /* host clock at timer_start */
} cpu_state;

static vl_status cpu_init(vl_ctx *c) {
  c->be_state = calloc(1, sizeof(cpu_state));
  return c->be_state ? VL_OK : vl_fail(c, VL_ERR_OOM, "cpu backend state");
}
static void cpu_fini(vl_ctx *c) {
  free(c->be_state);
  c->be_state = NULL;
}
static vl_status cpu_sync(vl_ctx *c) { (void)c; return VL_OK; }
static vl_status cpu_timer_start(vl_ctx *c) {
  ((cpu_state *)c->be_state)->timer_t0 = vl_now();
  return VL_OK;
}
static vl_status cpu_timer_stop(vl_ctx *c, double *sec) {
  *sec = vl_now() - ((cpu_state *)c->be_state)->timer_t0;
  return VL_OK;
}
static size_t cpu_fixed_ws(const vl_ctx *c) { (void)c; return 0; }

static vl_status cpu_upload(vl_ctx *c, vl_tensor *dst, size_t off, const void *src, size_t n) {
  (void)c;
  memcpy((char *)dst->data + off, src, n);
  return VL_OK;
}
static vl_status cpu_download(vl_ctx *c, void *dst, const vl_tensor *src, size_t off, size_t n) {
  (void)c;
  memcpy(dst, (const char *)src->data + off, n);
  return VL_OK;
}
static void *cpu_host_alloc(vl_ctx *c, size_t bytes, bool pinned) {
  (void)c; (void)pinned; /* nothing to pin for: batches stay in host memory */
  return malloc(bytes ? bytes : 1);
}
static void cpu_host_free(vl_ctx *c, void *p, bool pinned) { (void)c; (void)pinned; free(p); }

/* The table: filled once, on first use, by this file and each kernel file (cpu_internal.h),
 * the way the CUDA backend fills its own. */
static vl_backend g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void make_backend(void) {
  g_cpu = (vl_backend){
      .name = "cpu", .device = VL_DEV_CPU,
      .init = cpu_init, .fini = cpu_fini, .sync = cpu_sync,
      .timer_start = cpu_timer_start, .timer_stop = cpu_timer_stop,
      .fixed_ws_bytes = cpu_fixed_ws, .upload = cpu_upload, .download = cpu_download,
      .host_alloc = cpu_host_alloc, .host_free = cpu_host_free, .upload_async = cpu_upload,
  };
  vl_cpu_gemm_ops(&g_cpu);
  vl_cpu_conv_ops(&g_cpu);
  vl_cpu_norm_ops(&g_cpu);
  vl_cpu_act_ops(&g_cpu);
  vl_cpu_attn_ops(&g_cpu);
  vl_cpu_pool_ops(&g_cpu);
  vl_cpu_loss_ops(&g_cpu);
  vl_cpu_embed_ops(&g_cpu);
  vl_cpu_optim_ops(&g_cpu);
}

const vl_backend *vl_backend_cpu(void) {
  pthread_once(&g_cpu_once, make_backend);
  return &g_cpu;
}
