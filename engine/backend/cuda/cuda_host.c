/* Host-side logic of the CUDA backend (see cuda_host.h): pure, compiled in every build and
 * unit-tested on the CPU by tests/test_cuda_host.c. */
#include "cuda_host.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_gemm_k.h"

/* ---- GEMM argument mapping --------------------------------------------------------- */

vl_cublas_args vl_cublas_map(const vl_gemm *g) {
  /* A row-major (r, c) matrix with leading dim ld is, byte for byte, the column-major
   * (c, r) matrix with the same ld: its transpose. So the row-major C[M,N] is the
   * column-major C^T[N,M], and C^T = op(B)^T op(A)^T: cuBLAS's first operand is our B
   * (stored transposed already, so it keeps tb as its op), its second is our A. */
  vl_cublas_args a;
  memset(&a, 0, sizeof a);
  a.transa = g->tb ? VL_CU_OP_T : VL_CU_OP_N;
  a.transb = g->ta ? VL_CU_OP_T : VL_CU_OP_N;
  a.m = g->N;
  a.n = g->M;
  a.k = g->K;
  a.first = VL_CU_OPND_B;
  a.second = VL_CU_OPND_A;
  a.first_off = g->b_off;
  a.second_off = g->a_off;
  a.c_off = g->c_off;
  a.lda = g->ldb;
  a.ldb = g->lda;
  a.ldc = g->ldc;
  a.stride_a = g->sb;
  a.stride_b = g->sa;
  a.stride_c = g->sc;
  a.batch = g->batch;
  return a;
}

vl_cublas_args vl_cublas_slice(const vl_cublas_args *a, int64_t b) {
  vl_cublas_args s = *a;
  s.first_off += b * a->stride_a;
  s.second_off += b * a->stride_b;
  s.c_off += b * a->stride_c;
  s.batch = 1;
  return s;
}

static int64_t at_least1(int64_t x) { return x > 1 ? x : 1; }

vl_status vl_cublas_check(const vl_cublas_args *a, const char **why) {
  const char *w = NULL;
  if (a->m < 0 || a->n < 0 || a->k < 0 || a->batch < 0) w = "negative dimension or batch";
  else if (a->lda < at_least1(a->transa == VL_CU_OP_N ? a->m : a->k)) w = "lda below the rows of op A";
  else if (a->ldb < at_least1(a->transb == VL_CU_OP_N ? a->k : a->n)) w = "ldb below the rows of op B";
  else if (a->ldc < at_least1(a->m)) w = "ldc below m";
  else if (a->m > INT_MAX || a->n > INT_MAX || a->k > INT_MAX || a->lda > INT_MAX ||
           a->ldb > INT_MAX || a->ldc > INT_MAX || a->batch > INT_MAX)
    w = "dimension beyond cuBLAS's int range";
  else if (a->first_off < 0 || a->second_off < 0 || a->c_off < 0 || a->stride_a < 0 ||
           a->stride_b < 0 || a->stride_c < 0)
    w = "negative offset or stride";
  if (why) *why = w;
  return w ? VL_ERR_INVALID : VL_OK;
}

/* Stored column-major (rows, cols) with leading dim ld, `batch` copies `stride` apart. */
static int64_t extent(int64_t off, int64_t batch, int64_t stride, int64_t rows, int64_t cols,
                      int64_t ld) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return 0;
  return off + (batch - 1) * stride + (cols - 1) * ld + rows;
}

void vl_cublas_extents(const vl_cublas_args *a, int64_t *first, int64_t *second, int64_t *c) {
  bool na = a->transa == VL_CU_OP_N, nb = a->transb == VL_CU_OP_N;
  *first = extent(a->first_off, a->batch, a->stride_a, na ? a->m : a->k, na ? a->k : a->m, a->lda);
  *second = extent(a->second_off, a->batch, a->stride_b, nb ? a->k : a->n, nb ? a->n : a->k, a->ldb);
  *c = extent(a->c_off, a->batch, a->stride_c, a->m, a->n, a->ldc);
}

vl_status vl_colmajor_ref_gemm_ex(const vl_cublas_args *a, const void *first, int first_dt,
                                  const void *second, int second_dt, void *C, int c_dt,
                                  float alpha, float beta) {
  vl_status s = vl_cublas_check(a, NULL);
  if (s != VL_OK) return s;
  int64_t total = a->batch * a->m * a->n;
  for (int64_t idx = 0; idx < total; idx++)
    vl_kg_colmajor(a, first, first_dt, second, second_dt, C, c_dt, alpha, beta, idx);
  return VL_OK;
}

vl_status vl_colmajor_ref_gemm(const vl_cublas_args *a, const float *first, const float *second,
                               float *C, float alpha, float beta) {
  return vl_colmajor_ref_gemm_ex(a, first, VL_K_F32, second, VL_K_F32, C, VL_K_F32, alpha, beta);
}

/* ---- dtype selection ---------------------------------------------------------------- */

vl_cu_dtype vl_cu_dtype_of(vl_dtype d) {
  return d == VL_F16 ? VL_CU_R_16F : d == VL_BF16 ? VL_CU_R_16BF : VL_CU_R_32F;
}

int vl_cu_dtype_k(vl_cu_dtype d) {
  return d == VL_CU_R_16F ? VL_K_F16 : d == VL_CU_R_16BF ? VL_K_BF16 : VL_K_F32;
}

size_t vl_cu_dtype_size(vl_cu_dtype d) { return d == VL_CU_R_32F ? 4 : 2; }

bool vl_cublas_types_ok(vl_cu_dtype ab, vl_cu_dtype c) {
  /* cublasGemmEx's CUBLAS_COMPUTE_32F table: 32F/32F/32F, 16F/16F/{16F,32F},
   * 16BF/16BF/{16BF,32F}. */
  return c == ab || c == VL_CU_R_32F;
}

static bool storage_dtype(vl_dtype d) { return d == VL_F32 || d == VL_F16 || d == VL_BF16; }

vl_status vl_cuda_gemm_plan_make(const vl_gemm *g, vl_cuda_gemm_plan *p) {
  memset(p, 0, sizeof *p);
  vl_dtype ad = g->A->dtype, bd = g->B->dtype, cd = g->C->dtype;
  p->a_rows = g->ta ? g->K : g->M;
  p->a_cols = g->ta ? g->M : g->K;
  p->b_rows = g->tb ? g->N : g->K;
  p->b_cols = g->tb ? g->K : g->N;
  p->compute = VL_CU_COMPUTE_32F;
  p->path = VL_CU_PATH_CUBLAS;
  if (!storage_dtype(ad) || !storage_dtype(cd) || !(storage_dtype(bd) || bd == VL_NF4)) {
    p->why = "gemm: A and C must be fp32/fp16/bf16, B also nf4";
    return VL_ERR_UNSUPPORTED;
  }
  p->a_type = vl_cu_dtype_of(ad);
  p->b_type = vl_cu_dtype_of(bd);
  p->c_type = vl_cu_dtype_of(cd);
  if (bd == VL_NF4) {
    if (g->b_off != 0 || g->ldb != p->b_cols || p->b_rows * p->b_cols != g->B->n) {
      p->why = "nf4 gemm operand must be a whole contiguous matrix";
      return VL_ERR_UNSUPPORTED;
    }
    /* Dequantise to A's 16-bit type so cuBLAS runs on equal types without converting A;
     * to fp32 for an fp32 A (vl_gemm_ws_cuda reserves exactly that). */
    p->b_src = VL_CU_SRC_NF4;
    p->b_type = p->a_type;
    p->ws_need = vl_cu_dtype_size(p->b_type) * (size_t)g->B->n;
  } else if (ad != bd) {
    size_t off = 0;
    if (ad != VL_F32) {
      p->a_src = VL_CU_SRC_CONVERT;
      off += 4 * (size_t)(p->a_rows * p->a_cols);
    }
    if (bd != VL_F32) {
      p->b_src = VL_CU_SRC_CONVERT;
      p->b_ws = off;
      off += 4 * (size_t)(p->b_rows * p->b_cols);
    }
    p->a_type = p->b_type = VL_CU_R_32F;
    p->ws_need = off;
    p->per_batch = true;
  }
  if (!vl_cublas_types_ok(p->a_type, p->c_type)) {
    /* The generic kernel reads any dtype, so converted copies would be wasted work. */
    p->path = VL_CU_PATH_KERNEL;
    p->per_batch = false;
    if (p->a_src == VL_CU_SRC_CONVERT) { p->a_src = VL_CU_SRC_DIRECT; p->a_type = vl_cu_dtype_of(ad); }
    if (p->b_src == VL_CU_SRC_CONVERT) { p->b_src = VL_CU_SRC_DIRECT; p->b_type = vl_cu_dtype_of(bd); }
    p->a_ws = p->b_ws = 0;
    p->ws_need = p->b_src == VL_CU_SRC_NF4 ? vl_cu_dtype_size(p->b_type) * (size_t)g->B->n : 0;
  }
  return VL_OK;
}

vl_cublas_args vl_cuda_gemm_args(const vl_gemm *g, const vl_cuda_gemm_plan *p) {
  vl_cublas_args a = vl_cublas_map(g);
  if (p->b_src != VL_CU_SRC_DIRECT) { /* B is cuBLAS's first operand */
    a.first_off = 0;
    a.lda = at_least1(p->b_cols);
    a.stride_a = 0;
  }
  if (p->a_src != VL_CU_SRC_DIRECT) {
    a.second_off = 0;
    a.ldb = at_least1(p->a_cols);
    a.stride_b = 0;
  }
  return a;
}

/* ---- launch geometry and memory --------------------------------------------------------- */

void vl_cuda_grid(int64_t n, int threads, int max_blocks, int *blocks) {
  if (threads < 1) threads = 1;
  if (max_blocks < 1) max_blocks = 1;
  int64_t need = n <= 0 ? 1 : n / threads + (n % threads != 0);
  *blocks = need < max_blocks ? (int)need : max_blocks;
}

size_t vl_cuda_arena_bytes(size_t cap, size_t free_bytes) {
  size_t b;
  if (cap != VL_NO_CAP) b = cap;
  else b = free_bytes > VL_CUDA_UNCAPPED_RESERVE ? free_bytes - VL_CUDA_UNCAPPED_RESERVE : 0;
  return b / VL_ARENA_ALIGN * VL_ARENA_ALIGN;
}

/* ---- convolutions --------------------------------------------------------------------- */

static size_t up256(size_t b) { return (b + 255) / 256 * 256; }

vl_status vl_cuda_conv_plan_make(const vl_conv *cv, vl_conv_dir dir, bool accumulate,
                                 vl_cuda_conv_plan *p) {
  memset(p, 0, sizeof *p);
  if (!storage_dtype(cv->xdt) || !storage_dtype(cv->wdt) || !storage_dtype(cv->gdt))
    return VL_ERR_INVALID;
  p->io = vl_cu_dtype_of(cv->xdt);
  p->tensor_op = p->io != VL_CU_R_32F;
  size_t esz = vl_cu_dtype_size(p->io);
  size_t nw = (size_t)(cv->K * cv->C * cv->R * cv->S);
  if (dir != VL_CONV_BWD_WEIGHT && cv->wdt != cv->xdt) p->w_copy = up256(nw * esz);
  /* cuDNN's beta accumulates in the io dtype: an fp32 gradient of fp16 activations is
   * produced in a copy and added by our kernel; an io-dtype one is written directly. */
  if (dir == VL_CONV_BWD_WEIGHT && cv->gdt != cv->xdt) p->dw_copy = up256(nw * esz);
  (void)accumulate;
  size_t xb = (size_t)(cv->N * cv->C * cv->H * cv->W) * esz;
  size_t yb = (size_t)(cv->N * cv->K * cv->P * cv->Q) * esz;
  size_t big = xb > yb ? xb : yb;
  p->algo_ws = up256(big < VL_CUDNN_ALGO_WS_MAX ? big : VL_CUDNN_ALGO_WS_MAX);
  p->ws_total = p->w_copy + p->dw_copy + p->algo_ws;
  return VL_OK;
}

size_t vl_conv_ws_cuda(const vl_conv *cv, vl_conv_dir dir, bool accumulate) {
  vl_cuda_conv_plan p;
  return vl_cuda_conv_plan_make(cv, dir, accumulate, &p) == VL_OK ? p.ws_total : 0;
}

void vl_cudnn_nchw(int64_t n, int64_t c, int64_t h, int64_t w, int dims[4], int strides[4]) {
  dims[0] = (int)n; dims[1] = (int)c; dims[2] = (int)h; dims[3] = (int)w;
  strides[3] = 1;
  strides[2] = (int)w;
  strides[1] = (int)(h * w);
  strides[0] = (int)(c * h * w);
}

void vl_cudnn_conv_params(const vl_conv *cv, int pad[2], int stride[2], int dil[2]) {
  pad[0] = pad[1] = cv->pad;
  stride[0] = stride[1] = cv->stride;
  dil[0] = dil[1] = cv->dil;
}

bool vl_cudnn_fits_int(const vl_conv *cv) {
  const int64_t lim = 2147483647;
  return cv->C * cv->H * cv->W <= lim && cv->K * cv->P * cv->Q <= lim &&
         cv->N * cv->C * cv->H * cv->W <= lim && cv->N * cv->K * cv->P * cv->Q <= lim;
}

/* ---- cuDNN algorithm cache --------------------------------------------------------------- */

static uint64_t mix(uint64_t h, int64_t v) { return (h ^ (uint64_t)v) * 1099511628211ull; }

static uint64_t algo_hash(const vl_conv *cv, int dir) {
  const int64_t f[] = {cv->N, cv->C, cv->H, cv->W, cv->K, cv->R, cv->S, cv->stride, cv->pad, cv->dil,
                       cv->P, cv->Q, cv->xdt, cv->wdt, cv->gdt, dir};
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) h = mix(h, f[i]);
  return h;
}

/* field by field: the struct's padding bytes are not part of the key */
static bool algo_same(const vl_cuda_algo_entry *e, const vl_conv *cv, int dir) {
  const vl_conv *a = &e->cv;
  return a->N == cv->N && a->C == cv->C && a->H == cv->H && a->W == cv->W && a->K == cv->K && a->R == cv->R &&
         a->S == cv->S && a->stride == cv->stride && a->pad == cv->pad && a->dil == cv->dil && a->P == cv->P &&
         a->Q == cv->Q && a->xdt == cv->xdt && a->wdt == cv->wdt && a->gdt == cv->gdt && e->dir == dir;
}

/* the slot holding the problem, else the empty slot where it goes (cap > n always) */
static size_t algo_slot(const vl_cuda_algo_cache *c, const vl_conv *cv, int dir) {
  size_t i = (size_t)(algo_hash(cv, dir) & (c->cap - 1));
  while (c->e[i].used && !algo_same(&c->e[i], cv, dir)) i = (i + 1) & (c->cap - 1);
  return i;
}

bool vl_cuda_algo_get(const vl_cuda_algo_cache *c, const vl_conv *cv, int dir, vl_cuda_algo *a) {
  if (!c->cap) return false;
  const vl_cuda_algo_entry *e = &c->e[algo_slot(c, cv, dir)];
  if (!e->used) return false;
  *a = e->a;
  return true;
}

vl_status vl_cuda_algo_put(vl_cuda_algo_cache *c, const vl_conv *cv, int dir, vl_cuda_algo a) {
  if (2 * (c->n + 1) > c->cap) { /* grow to keep the load at most one half */
    size_t cap = c->cap ? 2 * c->cap : 64;
    vl_cuda_algo_entry *e = calloc(cap, sizeof *e);
    if (!e) return VL_ERR_OOM;
    vl_cuda_algo_cache g = {e, cap, 0};
    for (size_t i = 0; i < c->cap; i++)
      if (c->e[i].used) {
        g.e[algo_slot(&g, &c->e[i].cv, c->e[i].dir)] = c->e[i];
        g.n++;
      }
    free(c->e);
    *c = g;
  }
  vl_cuda_algo_entry *e = &c->e[algo_slot(c, cv, dir)];
  if (!e->used) c->n++;
  *e = (vl_cuda_algo_entry){.cv = *cv, .dir = dir, .a = a, .used = true};
  return VL_OK;
}

void vl_cuda_algo_cache_free(vl_cuda_algo_cache *c) {
  free(c->e);
  *c = (vl_cuda_algo_cache){0};
}
