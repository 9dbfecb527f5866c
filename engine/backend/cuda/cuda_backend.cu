/* CUDA backend: cuBLAS for GEMM, and every element-wise / row-wise op (cuda_<family>.cu) a
 * grid-stride kernel whose body is the same single-source vl_k_* function the CPU backend
 * loops over (docs/architecture.md "The CUDA backend must be verifiable without a GPU"). All
 * argument logic (GEMM mapping, dtype choice, launch geometry, arena size) lives in
 * cuda_host.c and is unit-tested on the CPU; this file only executes it.
 *
 * Device memory: the arena is ONE cudaMalloc of the cap, taken in init; the cuBLAS
 * workspace is its first block (VL_MEM_WORKSPACE), so it is counted. Outside the arena,
 * and therefore inside VL_CUDA_UNCAPPED_RESERVE, are only: the CUDA context and cuBLAS
 * handle and the reduction partial sums (VL_RED_BLOCKS doubles + ints, ~12 KiB, taken once).
 * Token ids and targets are VL_I32 tensors in the arena (the batch's data block).
 *
 * Everything runs on one stream, so ops are ordered; host-visible results (sumsq,
 * download) synchronise it. Errors become VL_ERR_BACKEND statuses, never exit/abort. */
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/backend.h"
#include "cuda_host.h"
#include "cuda_internal.h"
#include "cuda_gemm_k.h"
#include "../../kernels/nf4.h"

/* The operations live one family per file (cuda_norm.cu, cuda_act.cu, ...; cuda_internal.h);
 * this file keeps the backend itself and GEMM, and fills the op table (make_backend). */

/* GEMM helpers (cuda_gemm_k.h): operand packing, NF4 dequantisation, and the generic
 * column-major GEMM for C types cuBLAS cannot produce from the operand type. */
__global__ void k_gemm_pack(void *dst, int ddt, const void *src, int sdt, int64_t off,
                            int64_t ld, int64_t cols, int64_t n) {
  GRID_STRIDE(i, n) vl_kg_pack(dst, ddt, src, sdt, off, ld, cols, i);
}
__global__ void k_gemm_nf4(void *dst, int ddt, const uint8_t *q, int64_t n) {
  GRID_STRIDE(i, n) vl_kg_nf4(dst, ddt, q, n, i);
}
__global__ void k_gemm_generic(vl_cublas_args a, const void *F, int fdt, const void *S, int sdt,
                               void *C, int cdt, float alpha, float beta, int64_t total) {
  GRID_STRIDE(i, total) vl_kg_colmajor(&a, F, fdt, S, sdt, C, cdt, alpha, beta, i);
}

/* ---- lifecycle ------------------------------------------------------------------------ */

/* The arena cap the context was created with (vl_ctx_create_ex sets it before init). */
static size_t ctx_cap(const vl_ctx *c) { return c->cap; }

static void prof_fini(cu_state *s) {
  for (size_t i = 0; i < s->prof_nev; i++) (void)cudaEventDestroy(s->prof_ev[i]);
  free(s->prof_ev);
  free(s->prof_op);
  s->prof_ev = NULL;
  s->prof_op = NULL;
  s->prof_n = s->prof_cap = s->prof_nev = 0;
}

/* VRAMLAB_CUDA_MEMINFO=1 (tools/gpu/first-light.sh): the device's own count of its memory on
 * stderr, one line at init and one at fini, so a GPU run can measure what lives outside the
 * arena (context, cuBLAS, cuDNN) against the plan's assumed cuda_context. Nothing otherwise. */
static void meminfo(const char *when, const vl_ctx *c, size_t arena_bytes) {
  const char *e = getenv("VRAMLAB_CUDA_MEMINFO");
  size_t free_b = 0, total_b = 0;
  if (!e || !*e || !strcmp(e, "0")) return;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  vl_mem_stats ms;
  memset(&ms, 0, sizeof ms);
  if (c->arena) vl_arena_stats(c->arena, &ms);
  fprintf(stderr, "vramlab-cuda-meminfo: when=%s total=%zu used=%zu arena=%zu arena_peak=%zu\n", when,
          total_b, total_b - free_b, arena_bytes, (size_t)ms.peak_total);
}

static void cu_fini(vl_ctx *c) {
  cu_state *s = st(c);
  if (!s) return;
  if (s->stream) (void)cudaStreamSynchronize(s->stream);
  if (s->base) meminfo("fini", c, s->base_bytes);
  if (s->blas) (void)cublasDestroy(s->blas);
  vl_cuda_conv_fini(s);
  if (s->ws_held && c->arena) vl_arena_free(c->arena, s->ws_off);
  if (s->red_dev) (void)cudaFree(s->red_dev);
  if (s->bad_dev) (void)cudaFree(s->bad_dev);
  if (s->base) (void)cudaFree(s->base);
  for (int i = 0; i < 2; i++)
    if (s->ev[i]) (void)cudaEventDestroy(s->ev[i]);
  if (s->ev_copy) (void)cudaEventDestroy(s->ev_copy);
  prof_fini(s);
  if (s->copy) (void)cudaStreamDestroy(s->copy);
  if (s->stream) (void)cudaStreamDestroy(s->stream);
  (void)cudaGetLastError();
  free(s);
  c->be_state = NULL;
}

static vl_status cu_init(vl_ctx *c) {
  cu_state *s = (cu_state *)calloc(1, sizeof *s);
  if (!s) return vl_fail(c, VL_ERR_OOM, "cuda: no host memory for the backend state");
  c->be_state = s; /* on failure vl_ctx_create_ex calls fini, which undoes what was done */
  CU_CHECK(c, cudaSetDevice(0));
  int sms = 0;
  CU_CHECK(c, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  s->max_blocks = sms > 0 ? sms * 32 : 1024;
  CU_CHECK(c, cudaStreamCreate(&s->stream));
  CU_CHECK(c, cudaEventCreate(&s->ev[0]));
  CU_CHECK(c, cudaEventCreate(&s->ev[1]));
  CU_CHECK(c, cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking));
  CU_CHECK(c, cudaEventCreateWithFlags(&s->ev_copy, cudaEventDisableTiming));
  CUBLAS_CHECK(c, cublasCreate(&s->blas));
  /* cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first. */
  CUBLAS_CHECK(c, cublasSetStream(s->blas, s->stream));
  CU_CHECK(c, cudaMalloc((void **)&s->red_dev, sizeof(double) * VL_RED_BLOCKS));
  CU_CHECK(c, cudaMalloc((void **)&s->bad_dev, sizeof(int) * VL_RED_BLOCKS));

  size_t free_b = 0, total_b = 0;
  CU_CHECK(c, cudaMemGetInfo(&free_b, &total_b));
  meminfo("init", c, 0); /* the context, cuBLAS handle and scratch: before the arena */
  size_t bytes = vl_cuda_arena_bytes(ctx_cap(c), free_b);
  if (bytes < VL_CUBLAS_WORKSPACE_BYTES)
    return vl_fail(c, VL_ERR_OOM, "cuda: an arena of %zu bytes cannot hold the %zu-byte cuBLAS "
                   "workspace (%zu bytes free)", bytes, VL_CUBLAS_WORKSPACE_BYTES, free_b);
  cudaError_t e = cudaMalloc(&s->base, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    s->base = NULL;
    return vl_fail(c, e == cudaErrorMemoryAllocation ? VL_ERR_OOM : VL_ERR_BACKEND,
                   "cuda: cannot reserve an arena of %zu bytes (%zu free of %zu): %s", bytes,
                   free_b, total_b, cudaGetErrorString(e));
  }
  s->base_bytes = bytes;
  vl_status vs = vl_arena_create(&c->arena, VL_ARENA_EXTERNAL, bytes, s->base);
  if (vs != VL_OK) return vl_fail(c, vs, "cuda: arena creation failed");
  vs = vl_arena_alloc(c->arena, VL_CUBLAS_WORKSPACE_BYTES, VL_MEM_WORKSPACE, &s->ws_off);
  if (vs != VL_OK) return vl_fail(c, vs, "cuda: no room for the cuBLAS workspace");
  s->ws_held = true;
  CUBLAS_CHECK(c, cublasSetWorkspace(s->blas, (char *)s->base + s->ws_off,
                                     VL_CUBLAS_WORKSPACE_BYTES));
  return VL_OK;
}

static vl_status cu_sync(vl_ctx *c) {
  CU_CHECK(c, cudaStreamSynchronize(st(c)->stream));
  return VL_OK;
}

static void *cu_host_alloc(vl_ctx *c, size_t bytes, bool pinned) {
  (void)c;
  void *p = NULL;
  if (!pinned) return malloc(bytes ? bytes : 1);
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}

static void cu_host_free(vl_ctx *c, void *p, bool pinned) {
  (void)c;
  if (!p) return;
  if (pinned) (void)cudaFreeHost(p);
  else free(p);
}

static vl_status cu_upload_async(vl_ctx *c, vl_tensor *dst, size_t off, const void *src, size_t n) {
  cu_state *s = st(c);
  if (off + n > dst->bytes) return vl_fail(c, VL_ERR_INVALID, "upload of %zu bytes at %zu past a %zu-byte tensor", n, off, dst->bytes);
  CU_CHECK(c, cudaMemcpyAsync((char *)dst->data + off, src, n, cudaMemcpyHostToDevice, s->copy));
  CU_CHECK(c, cudaEventRecord(s->ev_copy, s->copy));
  CU_CHECK(c, cudaStreamWaitEvent(s->stream, s->ev_copy, 0));
  return VL_OK;
}

static vl_status cu_timer_start(vl_ctx *c) {
  CU_CHECK(c, cudaEventRecord(st(c)->ev[0], st(c)->stream));
  return VL_OK;
}

static vl_status cu_timer_stop(vl_ctx *c, double *sec) {
  cu_state *s = st(c);
  float ms = 0;
  CU_CHECK(c, cudaEventRecord(s->ev[1], s->stream));
  CU_CHECK(c, cudaEventSynchronize(s->ev[1]));
  CU_CHECK(c, cudaEventElapsedTime(&ms, s->ev[0], s->ev[1]));
  *sec = 1e-3 * ms;
  return VL_OK;
}

/* ---- per-operation timing (--profile): event pairs, read when the profile is read ----- */

#define PROF_MAX_PAIRS 4096 /* a full pool is collected (one wait) before it grows further */

static vl_status cu_op_timer_collect(vl_ctx *c, vl_op_profile *prof) {
  cu_state *s = st(c);
  for (size_t i = 0; i < s->prof_n; i++) {
    float ms = 0;
    CU_CHECK(c, cudaEventSynchronize(s->prof_ev[2 * i + 1]));
    CU_CHECK(c, cudaEventElapsedTime(&ms, s->prof_ev[2 * i], s->prof_ev[2 * i + 1]));
    if (prof && s->prof_op[i] >= 0 && s->prof_op[i] < VL_OP_COUNT)
      prof[s->prof_op[i]].seconds += 1e-3 * ms;
  }
  s->prof_n = 0;
  return VL_OK;
}

static vl_status cu_op_timer_begin(vl_ctx *c) {
  cu_state *s = st(c);
  if (s->prof_n == PROF_MAX_PAIRS) VL_TRY(cu_op_timer_collect(c, c->prof));
  if (s->prof_n == s->prof_cap) {
    size_t cap = s->prof_cap ? 2 * s->prof_cap : 64;
    cudaEvent_t *ev = (cudaEvent_t *)realloc(s->prof_ev, 2 * cap * sizeof *ev);
    if (!ev) return vl_fail(c, VL_ERR_OOM, "profile: no host memory for %zu event pairs", cap);
    s->prof_ev = ev;
    int *op = (int *)realloc(s->prof_op, cap * sizeof *op);
    if (!op) return vl_fail(c, VL_ERR_OOM, "profile: no host memory for %zu event pairs", cap);
    s->prof_op = op;
    for (size_t i = s->prof_nev; i < 2 * cap; i++) {
      CU_CHECK(c, cudaEventCreate(&s->prof_ev[i]));
      s->prof_nev = i + 1; /* what cu_fini destroys */
    }
    s->prof_cap = cap;
  }
  CU_CHECK(c, cudaEventRecord(s->prof_ev[2 * s->prof_n], s->stream));
  return VL_OK;
}

static vl_status cu_op_timer_end(vl_ctx *c, vl_op op) {
  cu_state *s = st(c);
  CU_CHECK(c, cudaEventRecord(s->prof_ev[2 * s->prof_n + 1], s->stream));
  s->prof_op[s->prof_n++] = (int)op;
  return VL_OK;
}

static size_t cu_fixed_ws(const vl_ctx *c) { (void)c; return VL_CUBLAS_WORKSPACE_BYTES; }

/* ---- GEMM ----------------------------------------------------------------------------- */

static cudaDataType_t cuda_type(vl_cu_dtype d) {
  return d == VL_CU_R_16F ? CUDA_R_16F : d == VL_CU_R_16BF ? CUDA_R_16BF : CUDA_R_32F;
}
static cublasOperation_t cuda_op(vl_cu_op o) { return o == VL_CU_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N; }
static cublasComputeType_t cuda_compute(vl_cu_compute k) { (void)k; return CUBLAS_COMPUTE_32F; }

/* One cuBLAS call (or generic kernel launch) for the mapped arguments; pa / pb are the
 * row-major A / B as the plan passes them (the tensor or its workspace copy). */
static vl_status gemm_run(vl_ctx *c, cu_state *s, const vl_gemm *g, const vl_cuda_gemm_plan *p,
                          const vl_cublas_args *a, const void *pa, const void *pb) {
  bool fa = a->first == VL_CU_OPND_A, sa = a->second == VL_CU_OPND_A;
  const void *F = fa ? pa : pb, *S = sa ? pa : pb;
  vl_cu_dtype ft = fa ? p->a_type : p->b_type, stp = sa ? p->a_type : p->b_type;
  if (p->path == VL_CU_PATH_KERNEL) {
    int64_t total = a->batch * a->m * a->n;
    LAUNCH(c, s, total, VL_THREADS, k_gemm_generic, *a, F, vl_cu_dtype_k(ft), S,
           vl_cu_dtype_k(stp), g->C->data, vl_cu_dtype_k(p->c_type), g->alpha, g->beta, total);
    return VL_OK;
  }
  const char *Fp = (const char *)F + a->first_off * (int64_t)vl_cu_dtype_size(ft);
  const char *Sp = (const char *)S + a->second_off * (int64_t)vl_cu_dtype_size(stp);
  char *Cp = (char *)g->C->data + a->c_off * (int64_t)vl_cu_dtype_size(p->c_type);
  CUBLAS_CHECK(c, cublasGemmStridedBatchedEx(
                      s->blas, cuda_op(a->transa), cuda_op(a->transb), (int)a->m, (int)a->n,
                      (int)a->k, &g->alpha, Fp, cuda_type(ft), (int)a->lda,
                      (long long)a->stride_a, Sp, cuda_type(stp), (int)a->ldb,
                      (long long)a->stride_b, &g->beta, Cp, cuda_type(p->c_type), (int)a->ldc,
                      (long long)a->stride_c, (int)a->batch, cuda_compute(p->compute),
                      CUBLAS_GEMM_DEFAULT));
  return VL_OK;
}

static vl_status cu_gemm(vl_ctx *c, const void *args) {
  const vl_gemm *g = (const vl_gemm *)args;
  cu_state *s = st(c);
  vl_cuda_gemm_plan p;
  if (vl_cuda_gemm_plan_make(g, &p) != VL_OK)
    return vl_fail(c, VL_ERR_UNSUPPORTED, "cuda gemm: %s", p.why);
  if (g->ws_bytes < p.ws_need || (p.ws_need && !g->ws))
    return vl_fail(c, VL_ERR_INVALID, "gemm workspace %zu < %zu", g->ws_bytes, p.ws_need);
  if (g->batch <= 0 || g->M <= 0 || g->N <= 0) return VL_OK;
  vl_cublas_args a = vl_cuda_gemm_args(g, &p);
  const char *why = NULL;
  if (vl_cublas_check(&a, &why) != VL_OK) return vl_fail(c, VL_ERR_INVALID, "cuda gemm: %s", why);
  /* an operand region past its tensor would be a silent out-of-bounds read on the device */
  int64_t ef, es, ec;
  vl_cublas_extents(&a, &ef, &es, &ec);
  int64_t ea = a.first == VL_CU_OPND_A ? ef : es, eb = a.first == VL_CU_OPND_A ? es : ef;
  if ((p.a_src == VL_CU_SRC_DIRECT && (size_t)ea * vl_cu_dtype_size(p.a_type) > g->A->bytes) ||
      (p.b_src == VL_CU_SRC_DIRECT && (size_t)eb * vl_cu_dtype_size(p.b_type) > g->B->bytes) ||
      (size_t)ec * vl_cu_dtype_size(p.c_type) > g->C->bytes)
    return vl_fail(c, VL_ERR_INVALID, "cuda gemm: an operand region exceeds its tensor");
  char *ws = (char *)g->ws;
  const void *pa = p.a_src == VL_CU_SRC_DIRECT ? g->A->data : (const void *)(ws + p.a_ws);
  const void *pb = p.b_src == VL_CU_SRC_DIRECT ? g->B->data : (const void *)(ws + p.b_ws);
  if (p.b_src == VL_CU_SRC_NF4)
    LAUNCH(c, s, g->B->n, VL_THREADS, k_gemm_nf4, ws + p.b_ws, vl_cu_dtype_k(p.b_type),
           (const uint8_t *)g->B->data, g->B->n);
  if (!p.per_batch) return gemm_run(c, s, g, &p, &a, pa, pb);
  /* The workspace holds one batch of each converted operand: one call per batch. */
  int64_t na = p.a_rows * p.a_cols, nb = p.b_rows * p.b_cols;
  for (int64_t b = 0; b < g->batch; b++) {
    if (p.a_src == VL_CU_SRC_CONVERT)
      LAUNCH(c, s, na, VL_THREADS, k_gemm_pack, ws + p.a_ws, VL_K_F32, g->A->data, dt(g->A),
             g->a_off + b * g->sa, g->lda, p.a_cols, na);
    if (p.b_src == VL_CU_SRC_CONVERT)
      LAUNCH(c, s, nb, VL_THREADS, k_gemm_pack, ws + p.b_ws, VL_K_F32, g->B->data, dt(g->B),
             g->b_off + b * g->sb, g->ldb, p.b_cols, nb);
    vl_cublas_args one = vl_cublas_slice(&a, b);
    vl_status r = gemm_run(c, s, g, &p, &one, pa, pb);
    if (r != VL_OK) return r;
  }
  return VL_OK;
}

/* ---- copies --------------------------------------------------------------------------- */

static vl_status cu_upload(vl_ctx *c, vl_tensor *dst, size_t off, const void *src, size_t n) {
  if (off + n > dst->bytes)
    return vl_fail(c, VL_ERR_INVALID, "upload of %zu bytes at %zu into a %zu-byte tensor", n, off,
                   dst->bytes);
  cu_state *s = st(c);
  CU_CHECK(c, cudaMemcpyAsync((char *)dst->data + off, src, n, cudaMemcpyHostToDevice, s->stream));
  CU_CHECK(c, cudaStreamSynchronize(s->stream)); /* the caller may reuse src at once */
  return VL_OK;
}

static vl_status cu_download(vl_ctx *c, void *dst, const vl_tensor *src, size_t off, size_t n) {
  if (off + n > src->bytes)
    return vl_fail(c, VL_ERR_INVALID, "download of %zu bytes at %zu from a %zu-byte tensor", n,
                   off, src->bytes);
  cu_state *s = st(c);
  CU_CHECK(c, cudaMemcpyAsync(dst, (const char *)src->data + off, n, cudaMemcpyDeviceToHost,
                              s->stream));
  CU_CHECK(c, cudaStreamSynchronize(s->stream));
  return VL_OK;
}

/* GEMM is this file's one operation. */
void vl_cuda_gemm_ops(vl_backend *b) {
  b->ops[VL_OP_GEMM] = cu_gemm;
}

/* The table, filled once at load time: GEMM, then each kernel file's operations
 * (cuda_internal.h), the way the CPU backend fills its own. */
static vl_backend make_backend(void) {
  vl_backend b;
  memset(&b, 0, sizeof b);
  b.name = "cuda";
  b.device = VL_DEV_CUDA;
  b.init = cu_init;
  b.fini = cu_fini;
  b.sync = cu_sync;
  b.timer_start = cu_timer_start;
  b.timer_stop = cu_timer_stop;
  b.op_timer_begin = cu_op_timer_begin;
  b.op_timer_end = cu_op_timer_end;
  b.op_timer_collect = cu_op_timer_collect;
  b.host_alloc = cu_host_alloc;
  b.host_free = cu_host_free;
  b.upload_async = cu_upload_async;
  b.fixed_ws_bytes = cu_fixed_ws;
  b.upload = cu_upload;
  b.download = cu_download;
  vl_cuda_gemm_ops(&b);
  vl_cuda_conv_ops(&b);
  vl_cuda_norm_ops(&b);
  vl_cuda_act_ops(&b);
  vl_cuda_attn_ops(&b);
  vl_cuda_pool_ops(&b);
  vl_cuda_loss_ops(&b);
  vl_cuda_embed_ops(&b);
  vl_cuda_optim_ops(&b);
  return b;
}

/* Filled once at load time (namespace-scope initialisation). */
static const vl_backend g_cuda_backend = make_backend();

const vl_backend *vl_cuda_backend_table(void) { return &g_cuda_backend; }

bool vl_cuda_probe(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n); /* no driver / no GPU: an error, not a crash */
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}
