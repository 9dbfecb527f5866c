/* CUDA backend: cuBLAS for GEMM, and every element-wise / row-wise op a grid-stride kernel
 * whose body is the same single-source vl_k_* function the CPU backend loops over
 * (docs/architecture.md "The CUDA backend must be verifiable without a GPU"). All argument logic
 * (GEMM mapping, dtype choice, launch geometry, arena size) lives in cuda_host.c and is
 * unit-tested on the CPU; this file only executes it.
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
#include "../../kernels/elem.h"
#include "../../kernels/nf4.h"
#include "../../kernels/optim.h"
#include "../../kernels/rows.h"

/* The operations are reached through the op table at the end (make_backend), whose entries
 * unpack each op's argument struct (vramlab/ops.h) into the cu_* functions below. */



/* ---- kernels: thin grid-stride wrappers over the single-source bodies -------------------- */

__global__ void k_convert(void *y, int ydt, const void *x, int xdt, int64_t n) {
  GRID_STRIDE(i, n) vl_k_convert(y, ydt, x, xdt, i);
}
__global__ void k_axpby(void *y, int ydt, float a, const void *x, int xdt, float b, int64_t n) {
  GRID_STRIDE(i, n) vl_k_axpby(y, ydt, a, x, xdt, b, i);
}
__global__ void k_embed_fwd(void *out, int odt, const void *wte, int wdt, const int32_t *tok,
                            int64_t C, int64_t n) {
  GRID_STRIDE(i, n) vl_k_embed_fwd(out, odt, wte, wdt, tok, C, i);
}
__global__ void k_embed_bwd(void *dw, int wdt, const void *dout, int odt, const int32_t *tok,
                            int64_t R, int64_t C) {
  GRID_STRIDE(k, C) vl_k_embed_bwd_col(dw, wdt, dout, odt, tok, R, C, k);
}
__global__ void k_rmsnorm_fwd(void *out, int odt, float *rstd, const void *x, int xdt,
                              const void *w, int wdt, int64_t R, int64_t C, float eps) {
  GRID_STRIDE(r, R) vl_k_rmsnorm_fwd_row(out, odt, rstd, x, xdt, w, wdt, C, eps, r);
}
__global__ void k_rmsnorm_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *x,
                              int xdt, const void *w, int wdt, const float *rstd, int64_t R,
                              int64_t C) {
  GRID_STRIDE(r, R) vl_k_rmsnorm_bwd_row(dx, dxdt, dy, dydt, x, xdt, w, wdt, rstd, C, r);
}
__global__ void k_rmsnorm_dw(void *dw, int dwdt, const void *dy, int dydt, const void *x,
                             int xdt, const float *rstd, int64_t R, int64_t C) {
  GRID_STRIDE(k, C) vl_k_rmsnorm_dw_col(dw, dwdt, dy, dydt, x, xdt, rstd, R, C, k);
}
__global__ void k_rope(void *x, int xdt, int64_t T, int64_t H, int64_t D, float theta,
                       int inverse, int64_t n) {
  GRID_STRIDE(i, n) vl_k_rope(x, xdt, T, H, D, theta, inverse, i);
}
__global__ void k_permute(void *y, const void *x, int xdt, int64_t T, int64_t H, int64_t D,
                          int back, int64_t n) {
  GRID_STRIDE(i, n) vl_k_permute(y, x, xdt, T, H, D, back, i);
}
__global__ void k_softmax_fwd(void *P, int pdt, const void *S, int sdt, int64_t T, float scale,
                              int causal, int64_t rows) {
  GRID_STRIDE(r, rows) vl_k_softmax_row(P, pdt, S, sdt, T, scale, causal, r);
}
__global__ void k_softmax_bwd(void *dS, int ddt, const void *dP, int dpdt, const void *P, int pdt,
                              int64_t T, float scale, int causal, int64_t rows) {
  GRID_STRIDE(r, rows) vl_k_softmax_bwd_row(dS, ddt, dP, dpdt, P, pdt, T, scale, causal, r);
}
__global__ void k_swiglu_fwd(void *out, int odt, const void *g, const void *u, int gdt,
                             int64_t n) {
  GRID_STRIDE(i, n) vl_k_swiglu_fwd(out, odt, g, u, gdt, i);
}
__global__ void k_swiglu_bwd(void *dg, void *du, int ddt, const void *dout, int odt,
                             const void *g, const void *u, int gdt, int64_t n) {
  GRID_STRIDE(i, n) vl_k_swiglu_bwd(dg, du, ddt, dout, odt, g, u, gdt, i);
}
__global__ void k_xent(void *logits, int ldt, float *loss, const int32_t *tgt, int64_t V,
                       float s, int64_t R) {
  GRID_STRIDE(r, R) vl_k_xent_row(logits, ldt, loss, tgt, V, s, r);
}
__global__ void k_adamw(float *p, const float *g, float *m, float *v, float lr, float b1,
                        float b2, float eps, float wd, float bc1, float bc2, float gscale,
                        int64_t n) {
  GRID_STRIDE(i, n) vl_k_adamw(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2, gscale, i);
}
__global__ void k_sgd(float *p, const float *g, float *mom, float lr, float mu, float wd,
                      float gscale, int64_t n) {
  GRID_STRIDE(i, n) vl_k_sgd(p, g, mom, lr, mu, wd, gscale, i);
}
__global__ void k_adafactor_row(float *vr, const float *g, int64_t R, int64_t C, float b2t,
                                float eps1, float gscale) {
  GRID_STRIDE(r, R) vl_k_adafactor_row(vr, g, C, b2t, eps1, gscale, r);
}
__global__ void k_adafactor_col(float *vc, const float *g, int64_t R, int64_t C, float b2t,
                                float eps1, float gscale) {
  GRID_STRIDE(k, C) vl_k_adafactor_col(vc, g, R, C, b2t, eps1, gscale, k);
}

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

/* ---- reductions: per-block partial sums in double, summed on the host in block order
 * (deterministic for a given grid). The block size must be VL_THREADS. */

__device__ static double block_sum(double v, double *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int k = VL_THREADS / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  return sh[0];
}

/* sum of x^2 over finite x, and whether a NaN/Inf was seen (as cpu_sumsq) */
__global__ void k_sumsq(const void *x, int xdt, int64_t n, double *part, int *bad) {
  __shared__ double sh[VL_THREADS];
  __shared__ int sbad;
  if (threadIdx.x == 0) sbad = 0;
  __syncthreads();
  double acc = 0.0;
  int b = 0;
  GRID_STRIDE(i, n) {
    float v = vl_ld(x, xdt, i);
    if (!isfinite(v)) b = 1;
    else acc += (double)v * v;
  }
  if (b) atomicOr(&sbad, 1); /* an OR: order-independent */
  double s = block_sum(acc, sh);
  if (threadIdx.x == 0) { part[blockIdx.x] = s; bad[blockIdx.x] = sbad; }
}

__global__ void k_sum_f32(const float *x, int64_t n, double *part) {
  __shared__ double sh[VL_THREADS];
  double acc = 0.0;
  GRID_STRIDE(i, n) acc += x[i];
  double s = block_sum(acc, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* Partial sums of the squared unscaled Adafactor update (its RMS clips it). */
__global__ void k_adafactor_ss(const float *g, const float *vr, const float *vc, float vr_mean,
                               int64_t R, int64_t C, float gscale, double *part) {
  __shared__ double sh[VL_THREADS];
  double acc = 0.0;
  GRID_STRIDE(i, R * C) {
    float ui = vl_k_adafactor_u(g, vr, vc, vr_mean, R, C, gscale, i);
    acc += (double)ui * ui;
  }
  double s = block_sum(acc, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* The final Adafactor pass: the same single-source body as the CPU backend. */
__global__ void k_adafactor_apply(float *p, float *m, const float *g, const float *vr,
                                  const float *vc, float vr_mean, int64_t R, int64_t C,
                                  float gscale, float div, float lr, float b1, float wd) {
  GRID_STRIDE(i, R * C) vl_k_adafactor_apply(p, m, g, vr, vc, vr_mean, R, C, gscale, div, lr, b1, wd, i);
}

/* Copy `blocks` partial sums to the host and add them in block order. */
static vl_status reduce_finish(vl_ctx *c, cu_state *s, int blocks, double *sum, int *bad) {
  CU_CHECK(c, cudaMemcpyAsync(s->red_host, s->red_dev, sizeof(double) * blocks,
                              cudaMemcpyDeviceToHost, s->stream));
  if (bad)
    CU_CHECK(c, cudaMemcpyAsync(s->bad_host, s->bad_dev, sizeof(int) * blocks,
                                cudaMemcpyDeviceToHost, s->stream));
  CU_CHECK(c, cudaStreamSynchronize(s->stream));
  double acc = 0.0;
  int b = 0;
  for (int i = 0; i < blocks; i++) {
    acc += s->red_host[i];
    if (bad) b |= s->bad_host[i];
  }
  *sum = acc;
  if (bad) *bad = b;
  return VL_OK;
}

static int red_blocks(int64_t n) {
  int b;
  vl_cuda_grid(n, VL_THREADS, VL_RED_BLOCKS, &b);
  return b;
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

/* ---- element-wise and row-wise ops ------------------------------------------------------ */

static vl_status cu_zero(vl_ctx *c, vl_tensor *y) {
  CU_CHECK(c, cudaMemsetAsync(y->data, 0, y->bytes, st(c)->stream));
  return VL_OK;
}

static vl_status cu_convert(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n) {
  if (n > 0) LAUNCH(c, st(c), n, VL_THREADS, k_convert, y->data, dt(y), x->data, dt(x), n);
  return VL_OK;
}

static vl_status cu_axpby(vl_ctx *c, vl_tensor *y, float a, const vl_tensor *x, float b,
                          int64_t n) {
  if (n > 0) LAUNCH(c, st(c), n, VL_THREADS, k_axpby, y->data, dt(y), a, x->data, dt(x), b, n);
  return VL_OK;
}

static vl_status cu_embed_fwd(vl_ctx *c, vl_tensor *out, const vl_tensor *wte, const vl_tensor *ids,
                              int64_t R, int64_t C) {
  if (R <= 0 || C <= 0) return VL_OK;
  /* ids: device memory (the step's VL_MEM_DATA tensor) */
  const int32_t *tok = (const int32_t *)ids->data;
  LAUNCH(c, st(c), R * C, VL_THREADS, k_embed_fwd, out->data, dt(out), wte->data, dt(wte), tok, C,
         R * C);
  return VL_OK;
}

static vl_status cu_embed_bwd(vl_ctx *c, vl_tensor *dw, const vl_tensor *dout, const vl_tensor *ids,
                              int64_t R, int64_t C) {
  if (R <= 0 || C <= 0) return VL_OK;
  const int32_t *tok = (const int32_t *)ids->data;
  /* one thread per column, rows in order: deterministic without atomics (as on CPU) */
  LAUNCH(c, st(c), C, VL_ROW_THREADS, k_embed_bwd, dw->data, dt(dw), dout->data, dt(dout), tok, R,
         C);
  return VL_OK;
}

static vl_status cu_rmsnorm_fwd(vl_ctx *c, vl_tensor *out, vl_tensor *rstd, const vl_tensor *x,
                                const vl_tensor *w, int64_t R, int64_t C, float eps) {
  if (R > 0)
    LAUNCH(c, st(c), R, VL_ROW_THREADS, k_rmsnorm_fwd, out->data, dt(out), (float *)rstd->data,
           x->data, dt(x), w->data, dt(w), R, C, eps);
  return VL_OK;
}

static vl_status cu_rmsnorm_bwd(vl_ctx *c, vl_tensor *dx, vl_tensor *dw, const vl_tensor *dout,
                                const vl_tensor *x, const vl_tensor *w, const vl_tensor *rstd,
                                int64_t R, int64_t C) {
  if (R <= 0 || C <= 0) return VL_OK;
  cu_state *s = st(c);
  LAUNCH(c, s, R, VL_ROW_THREADS, k_rmsnorm_bwd, dx->data, dt(dx), dout->data, dt(dout), x->data,
         dt(x), w->data, dt(w), (const float *)rstd->data, R, C);
  if (dw)
    LAUNCH(c, s, C, VL_ROW_THREADS, k_rmsnorm_dw, dw->data, dt(dw), dout->data, dt(dout), x->data,
           dt(x), (const float *)rstd->data, R, C);
  return VL_OK;
}

static vl_status cu_rope(vl_ctx *c, vl_tensor *x, int64_t B, int64_t T, int64_t H, int64_t D,
                         float theta, bool inverse) {
  int64_t n = B * T * H * (D / 2);
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_rope, x->data, dt(x), T, H, D, theta, inverse ? 1 : 0, n);
  return VL_OK;
}

static vl_status cu_permute(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t B, int64_t T,
                            int64_t H, int64_t D, bool back) {
  if (y->dtype != x->dtype) return vl_fail(c, VL_ERR_INVALID, "permute: dtypes differ");
  int64_t n = B * T * H * D;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_permute, y->data, x->data, dt(x), T, H, D, back ? 1 : 0, n);
  return VL_OK;
}

static vl_status cu_softmax_fwd(vl_ctx *c, vl_tensor *P, const vl_tensor *S, int64_t rows,
                                int64_t T, float scale, bool causal) {
  if (rows > 0)
    LAUNCH(c, st(c), rows, VL_ROW_THREADS, k_softmax_fwd, P->data, dt(P), S->data, dt(S), T,
           scale, causal ? 1 : 0, rows);
  return VL_OK;
}

static vl_status cu_softmax_bwd(vl_ctx *c, vl_tensor *dS, const vl_tensor *dP, const vl_tensor *P,
                                int64_t rows, int64_t T, float scale, bool causal) {
  if (rows > 0)
    LAUNCH(c, st(c), rows, VL_ROW_THREADS, k_softmax_bwd, dS->data, dt(dS), dP->data, dt(dP),
           P->data, dt(P), T, scale, causal ? 1 : 0, rows);
  return VL_OK;
}

static vl_status cu_swiglu_fwd(vl_ctx *c, vl_tensor *out, const vl_tensor *g, const vl_tensor *u,
                               int64_t n) {
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_swiglu_fwd, out->data, dt(out), g->data, u->data, dt(g), n);
  return VL_OK;
}

static vl_status cu_swiglu_bwd(vl_ctx *c, vl_tensor *dg, vl_tensor *du, const vl_tensor *dout,
                               const vl_tensor *g, const vl_tensor *u, int64_t n) {
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_swiglu_bwd, dg->data, du->data, dt(dg), dout->data,
           dt(dout), g->data, u->data, dt(g), n);
  return VL_OK;
}

static vl_status cu_xent(vl_ctx *c, vl_tensor *logits, vl_tensor *loss, const vl_tensor *ids,
                         int64_t R, int64_t V, float scale) {
  if (R <= 0) return VL_OK;
  const int32_t *tgt = (const int32_t *)ids->data;
  LAUNCH(c, st(c), R, VL_ROW_THREADS, k_xent, logits->data, dt(logits), (float *)loss->data, tgt,
         V, scale, R);
  return VL_OK;
}

static vl_status cu_sumsq(vl_ctx *c, const vl_tensor *x, int64_t n, double *out, bool *nonfinite) {
  *out = 0.0;
  *nonfinite = false;
  if (n <= 0) return VL_OK;
  cu_state *s = st(c);
  int blocks = red_blocks(n);
  k_sumsq<<<blocks, VL_THREADS, 0, s->stream>>>(x->data, dt(x), n, s->red_dev, s->bad_dev);
  CU_CHECK(c, cudaGetLastError());
  int bad = 0;
  vl_status r = reduce_finish(c, s, blocks, out, &bad);
  *nonfinite = bad != 0;
  return r;
}

/* ---- optimizers ----------------------------------------------------------------------- */

static vl_status cu_adamw(vl_ctx *c, vl_tensor *p, const vl_tensor *g, vl_tensor *m, vl_tensor *v,
                          int64_t n, const vl_optim_hp *h) {
  if (n <= 0) return VL_OK;
  /* bias corrections on the host, in float, exactly as cpu_adamw */
  float bc1 = 1.0f - powf(h->beta1, (float)h->t), bc2 = 1.0f - powf(h->beta2, (float)h->t);
  LAUNCH(c, st(c), n, VL_THREADS, k_adamw, (float *)p->data, (const float *)g->data,
         (float *)m->data, (float *)v->data, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
         bc1, bc2, h->grad_scale, n);
  return VL_OK;
}

static vl_status cu_sgd(vl_ctx *c, vl_tensor *p, const vl_tensor *g, vl_tensor *mom, int64_t n,
                        const vl_optim_hp *h) {
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_sgd, (float *)p->data, (const float *)g->data,
           (float *)mom->data, h->lr, h->momentum, h->weight_decay, h->grad_scale, n);
  return VL_OK;
}

/* Four passes, as cpu_adafactor: row moments and their mean (R > 1), column moments, the
 * RMS of the update (two-pass reduction through the host), then the clipped update. */
static vl_status cu_adafactor(vl_ctx *c, vl_tensor *p, const vl_tensor *g, vl_tensor *vr,
                              vl_tensor *vc, vl_tensor *m, int64_t R, int64_t C,
                              const vl_optim_hp *h) {
  int64_t n = R * C;
  if (n <= 0) return VL_OK;
  cu_state *s = st(c);
  float b2t = 1.0f - powf((float)h->t, -h->decay_pow);
  const float eps1 = 1e-30f;
  float *gp = (float *)g->data, *vrp = (float *)vr->data, *vcp = (float *)vc->data;
  float *mp = m ? (float *)m->data : NULL;
  float vr_mean = 0.0f;
  vl_status r;
  if (R > 1) {
    LAUNCH(c, s, R, VL_ROW_THREADS, k_adafactor_row, vrp, gp, R, C, b2t, eps1, h->grad_scale);
    int blocks = red_blocks(R);
    k_sum_f32<<<blocks, VL_THREADS, 0, s->stream>>>(vrp, R, s->red_dev);
    CU_CHECK(c, cudaGetLastError());
    double sum = 0.0;
    if ((r = reduce_finish(c, s, blocks, &sum, NULL)) != VL_OK) return r;
    vr_mean = (float)(sum / (double)R);
  }
  LAUNCH(c, s, C, VL_ROW_THREADS, k_adafactor_col, vcp, gp, R, C, b2t, eps1, h->grad_scale);
  int blocks = red_blocks(n);
  k_adafactor_ss<<<blocks, VL_THREADS, 0, s->stream>>>(gp, vrp, vcp, vr_mean, R, C,
                                                        h->grad_scale, s->red_dev);
  CU_CHECK(c, cudaGetLastError());
  double ss = 0.0;
  if ((r = reduce_finish(c, s, blocks, &ss, NULL)) != VL_OK) return r;
  float rms = (float)sqrt(ss / (double)n);
  float div = rms / h->clip_thr > 1.0f ? rms / h->clip_thr : 1.0f;
  LAUNCH(c, s, n, VL_THREADS, k_adafactor_apply, (float *)p->data, mp, gp, vrp, vcp, vr_mean, R,
         C, h->grad_scale, div, h->lr, h->beta1, h->weight_decay);
  return VL_OK;
}

/* ---- the op table's entries: unpack the argument structs (vramlab/ops.h) ------------------ */

#define ARGS(type) const type *a = (const type *)p
static vl_status op_zero(vl_ctx *c, const void *p) { ARGS(vl_zero_args); return cu_zero(c, a->y); }
static vl_status op_convert(vl_ctx *c, const void *p) {
  ARGS(vl_convert_args);
  return cu_convert(c, a->y, a->x, a->n);
}
static vl_status op_axpby(vl_ctx *c, const void *p) {
  ARGS(vl_axpby_args);
  return cu_axpby(c, a->y, a->a, a->x, a->b, a->n);
}
static vl_status op_embed_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_embed_fwd_args);
  return cu_embed_fwd(c, a->out, a->wte, a->tok, a->R, a->C);
}
static vl_status op_embed_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_embed_bwd_args);
  return cu_embed_bwd(c, a->dwte, a->dout, a->tok, a->R, a->C);
}
static vl_status op_rmsnorm_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_rmsnorm_fwd_args);
  return cu_rmsnorm_fwd(c, a->out, a->rstd, a->x, a->w, a->R, a->C, a->eps);
}
static vl_status op_rmsnorm_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_rmsnorm_bwd_args);
  return cu_rmsnorm_bwd(c, a->dx, a->dw, a->dout, a->x, a->w, a->rstd, a->R, a->C);
}
static vl_status op_rope(vl_ctx *c, const void *p) {
  ARGS(vl_rope_args);
  return cu_rope(c, a->x, a->B, a->T, a->H, a->D, a->theta, a->inverse);
}
static vl_status op_permute(vl_ctx *c, const void *p) {
  ARGS(vl_permute_args);
  return cu_permute(c, a->y, a->x, a->B, a->T, a->H, a->D, a->back);
}
static vl_status op_softmax_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_softmax_fwd_args);
  return cu_softmax_fwd(c, a->P, a->S, a->rows, a->T, a->scale, a->causal);
}
static vl_status op_softmax_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_softmax_bwd_args);
  return cu_softmax_bwd(c, a->dS, a->dP, a->P, a->rows, a->T, a->scale, a->causal);
}
static vl_status op_swiglu_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_swiglu_fwd_args);
  return cu_swiglu_fwd(c, a->out, a->g, a->u, a->n);
}
static vl_status op_swiglu_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_swiglu_bwd_args);
  return cu_swiglu_bwd(c, a->dg, a->du, a->dout, a->g, a->u, a->n);
}
static vl_status op_xent(vl_ctx *c, const void *p) {
  ARGS(vl_xent_fused_args);
  return cu_xent(c, a->logits, a->loss, a->tgt, a->R, a->V, a->dloss_scale);
}
static vl_status op_sumsq(vl_ctx *c, const void *p) {
  ARGS(vl_sumsq_args);
  return cu_sumsq(c, a->x, a->n, a->out, a->nonfinite);
}
static vl_status op_adamw(vl_ctx *c, const void *p) {
  ARGS(vl_adamw_args);
  return cu_adamw(c, a->p, a->g, a->m, a->v, a->n, a->hp);
}
static vl_status op_sgd(vl_ctx *c, const void *p) {
  ARGS(vl_sgd_args);
  return cu_sgd(c, a->p, a->g, a->mom, a->n, a->hp);
}
static vl_status op_adafactor(vl_ctx *c, const void *p) {
  ARGS(vl_adafactor_args);
  return cu_adafactor(c, a->p, a->g, a->vr, a->vc, a->m, a->R, a->C, a->hp);
}

/* ---- the backend ---------------------------------------------------------------------- */

/* This file's kernels: GEMM, the LLM ops, copies and the optimizers. */
static void core_ops(vl_backend *b) {
  b->ops[VL_OP_GEMM] = cu_gemm;
  b->ops[VL_OP_ZERO] = op_zero;
  b->ops[VL_OP_CONVERT] = op_convert;
  b->ops[VL_OP_AXPBY] = op_axpby;
  b->ops[VL_OP_EMBED_FWD] = op_embed_fwd;
  b->ops[VL_OP_EMBED_BWD] = op_embed_bwd;
  b->ops[VL_OP_RMSNORM_FWD] = op_rmsnorm_fwd;
  b->ops[VL_OP_RMSNORM_BWD] = op_rmsnorm_bwd;
  b->ops[VL_OP_ROPE] = op_rope;
  b->ops[VL_OP_PERMUTE] = op_permute;
  b->ops[VL_OP_SOFTMAX_FWD] = op_softmax_fwd;
  b->ops[VL_OP_SOFTMAX_BWD] = op_softmax_bwd;
  b->ops[VL_OP_SWIGLU_FWD] = op_swiglu_fwd;
  b->ops[VL_OP_SWIGLU_BWD] = op_swiglu_bwd;
  b->ops[VL_OP_XENT_FUSED] = op_xent;
  b->ops[VL_OP_SUMSQ] = op_sumsq;
  b->ops[VL_OP_ADAMW] = op_adamw;
  b->ops[VL_OP_SGD] = op_sgd;
  b->ops[VL_OP_ADAFACTOR] = op_adafactor;
}

/* The table, filled once at load time: this file's kernels, then each kernel file's
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
  core_ops(&b);
  vl_cuda_cnn_ops(&b);
  vl_cuda_conv_ops(&b);
  vl_cuda_sd_ops(&b);
  vl_cuda_attn_ops(&b);
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
