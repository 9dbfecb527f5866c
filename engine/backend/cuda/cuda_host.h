/* Host-side logic of the CUDA backend, as pure functions with CPU unit tests (docs/architecture.md
 * "The CUDA backend must be verifiable without a GPU"). Plain C, no CUDA headers: the
 * cuBLAS enums appear as our own, and cuda_backend.cu maps them 1:1.
 *
 * GEMM in three steps, all decided here and executed by the .cu:
 *   1. vl_cuda_gemm_plan_make: how each operand reaches cuBLAS (as is, converted to fp32
 *      in g->ws, or NF4 dequantised into g->ws) and which cuBLAS types that gives;
 *   2. vl_cuda_gemm_args: the column-major cuBLAS arguments for the row-major call
 *      (vl_cublas_map) with the workspace substitutions of the plan applied;
 *   3. one cublasGemmStridedBatchedEx, or one call per batch (vl_cublas_slice) when the
 *      workspace holds converted copies of a single batch. */
#ifndef VRAMLAB_CUDA_HOST_H
#define VRAMLAB_CUDA_HOST_H

#include "vramlab/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { VL_CU_OP_N = 0, VL_CU_OP_T = 1 } vl_cu_op;             /* cublasOperation_t */
typedef enum { VL_CU_OPND_A = 0, VL_CU_OPND_B = 1 } vl_cu_opnd;       /* a row-major operand */
typedef enum { VL_CU_R_32F = 0, VL_CU_R_16F, VL_CU_R_16BF } vl_cu_dtype; /* cudaDataType */
typedef enum { VL_CU_COMPUTE_32F = 0 } vl_cu_compute;                 /* cublasComputeType_t */

/* Column-major cuBLAS arguments: C[m,n] = alpha op(first)[m,k] op(second)[k,n] + beta C.
 * `first`/`second` name the row-major operand (A or B of the vl_gemm, or its workspace
 * copy) that cuBLAS sees as its A/B; offsets, leading dims and strides are in elements of
 * that operand as it is passed. Scalars and pointers are not part of it. */
typedef struct {
  vl_cu_op transa, transb;
  int64_t m, n, k;
  vl_cu_opnd first, second;
  int64_t first_off, second_off, c_off;
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
  int64_t batch;
} vl_cublas_args;

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: first = B, second = A,
 * m = N, n = M, transa = tb, transb = ta, leading dims and strides swapped with them. */
vl_cublas_args vl_cublas_map(const vl_gemm *g);
/* Batch b of a strided-batched call as a single call (batch = 1, offsets advanced). */
vl_cublas_args vl_cublas_slice(const vl_cublas_args *a, int64_t b);
/* cuBLAS's argument rules (lda >= max(1, rows of the stored first operand), ...) plus the
 * int range of its m/n/k/ld/batch parameters. On failure *why names the rule. */
vl_status vl_cublas_check(const vl_cublas_args *a, const char **why);

/* Elements each operand must hold for the call to stay inside it: the last element
 * touched plus one (offset + (batch-1)*stride + (cols-1)*ld + rows), 0 when empty. The
 * backend checks these against the tensors, so a bad mapping is an error, not a silent
 * out-of-bounds access on the device. */
void vl_cublas_extents(const vl_cublas_args *a, int64_t *first, int64_t *second, int64_t *c);

/* Naive column-major reference of the cuBLAS call (fp32 storage), all batches. */
vl_status vl_colmajor_ref_gemm(const vl_cublas_args *a, const float *first, const float *second,
                               float *C, float alpha, float beta);
/* The same for any storage dtype (VL_K_* codes), through vl_ld/vl_st. */
vl_status vl_colmajor_ref_gemm_ex(const vl_cublas_args *a, const void *first, int first_dt,
                                  const void *second, int second_dt, void *C, int c_dt,
                                  float alpha, float beta);

/* ---- dtype selection ---------------------------------------------------------------- */
typedef enum {
  VL_CU_SRC_DIRECT = 0, /* the tensor itself */
  VL_CU_SRC_CONVERT,    /* one batch packed into g->ws as fp32 (mixed A/B dtypes) */
  VL_CU_SRC_NF4         /* the whole NF4 matrix dequantised into g->ws, shared by batches */
} vl_cu_src;

typedef enum {
  VL_CU_PATH_CUBLAS = 0, /* cublasGemmStridedBatchedEx */
  VL_CU_PATH_KERNEL      /* the generic kernel: C's type is one cuBLAS cannot write from
                            the operand type (e.g. fp32 operands into a bf16 C) */
} vl_cu_path;

typedef struct {
  vl_cu_path path;
  vl_cu_src a_src, b_src;
  vl_cu_dtype a_type, b_type, c_type; /* as passed to cuBLAS / the kernel */
  vl_cu_compute compute;
  size_t a_ws, b_ws;                  /* byte offsets of the A / B copies in g->ws */
  size_t ws_need;                     /* bytes of g->ws used; <= vl_gemm_ws_cuda(g) */
  int64_t a_rows, a_cols, b_rows, b_cols; /* stored (untransposed) operand regions */
  bool per_batch;                     /* converted copies hold one batch: loop batches */
  const char *why;                    /* reason when not VL_OK */
} vl_cuda_gemm_plan;

/* Rules, within the workspace vl_gemm_ws_cuda sizes:
 * - NF4 B is dequantised once to A's dtype when A is fp16/bf16 (cuBLAS then runs on two
 *   equal 16-bit types), else to fp32; it must be a whole contiguous matrix (as on CPU)
 *   and is shared by all batches (stride 0), as the CPU backend does.
 * - equal A/B dtypes go to cuBLAS as they are;
 * - different A/B dtypes: each non-fp32 operand is converted to fp32, one batch at a time;
 * - cuBLAS (CUBLAS_COMPUTE_32F) writes C of the operand type, or fp32 from 16-bit
 *   operands; any other C type takes the generic kernel, reading the operands directly. */
vl_status vl_cuda_gemm_plan_make(const vl_gemm *g, vl_cuda_gemm_plan *p);
/* vl_cublas_map with the plan's workspace copies substituted (offset 0, packed leading
 * dim, stride 0). */
vl_cublas_args vl_cuda_gemm_args(const vl_gemm *g, const vl_cuda_gemm_plan *p);
/* cuBLAS with CUBLAS_COMPUTE_32F accepts (A=B=ab, C=c) for these pairs only. */
bool vl_cublas_types_ok(vl_cu_dtype ab, vl_cu_dtype c);
vl_cu_dtype vl_cu_dtype_of(vl_dtype d); /* fp32/fp16/bf16 storage; NF4 is not one */
int vl_cu_dtype_k(vl_cu_dtype d);       /* the VL_K_* code for vl_ld/vl_st */
size_t vl_cu_dtype_size(vl_cu_dtype d);

/* ---- launch geometry and memory --------------------------------------------------------- */
/* Grid-stride launch: blocks = min(ceil(n / threads), max_blocks), at least 1. */
void vl_cuda_grid(int64_t n, int threads, int max_blocks, int *blocks);

/* Device memory left outside the arena when no cap is given (CUDA context, cuBLAS,
 * NCCL internals, the backend's small scratch buffers). */
#define VL_CUDA_UNCAPPED_RESERVE ((size_t)512 << 20)
/* Bytes of the one cudaMalloc that backs the arena: the cap, or free memory less the
 * reserve when uncapped; rounded down to VL_ARENA_ALIGN. 0 when nothing is left. */
size_t vl_cuda_arena_bytes(size_t cap, size_t free_bytes);

/* ---- defined in cuda_backend.cu (CUDA builds only) --------------------------------------
 * Reached through vl_backend_cuda() / vl_cuda_available() in cuda_entry.c (link order). */
const vl_backend *vl_cuda_backend_table(void); /* the backend, with every op */
bool vl_cuda_probe(void); /* a device is visible; false (no crash) without driver or GPU */


/* ---- convolutions (cuDNN) ------------------------------------------------------------
 * cuDNN wants x, w and y (or their gradients) in one io dtype, fp32 compute (fp16/bf16
 * io with fp32 compute: its "pseudo half" configuration). The plan says which operands
 * reach cuDNN through an io-dtype copy in the workspace (weights stored in another dtype
 * than the activations; a weight gradient kept in another dtype, or fp16 weight gradients
 * summed in fp32 by a separate pass), and how much is left for the algorithm: the
 * algorithm budget rule, min(VL_CUDNN_ALGO_WS_MAX, larger of the input and output
 * activation bytes). The backend takes the fastest algorithm cuDNN's heuristics rank whose
 * workspace fits that budget (implicit GEMM needs none, so one always does), and the
 * caller allocates exactly ws_total: planned equals measured by construction. */
#define VL_CUDNN_ALGO_WS_MAX ((size_t)64 << 20)

typedef struct {
  vl_cu_dtype io;       /* x, w, y as cuDNN sees them (the activation dtype) */
  size_t w_copy;        /* bytes of the io-dtype weight copy (0: the weights are used) */
  size_t dw_copy;       /* bytes of the io-dtype weight-gradient buffer (0: written directly,
                           with cuDNN's beta = 1 when accumulating) */
  size_t algo_ws;       /* what the algorithm may use */
  size_t ws_total;      /* w_copy + dw_copy + algo_ws, each rounded up to 256 bytes */
  bool tensor_op;       /* CUDNN_TENSOR_OP_MATH for 16-bit io: the legacy API runs tensor-core
                           kernels only when asked (as PyTorch asks for half); fp32 keeps
                           CUDNN_DEFAULT_MATH, no TF32, so it matches the CPU to 1e-6 */
} vl_cuda_conv_plan;

/* VL_ERR_INVALID for a dtype cuDNN convolutions cannot take (NF4). */
vl_status vl_cuda_conv_plan_make(const vl_conv *cv, vl_conv_dir dir, bool accumulate,
                                 vl_cuda_conv_plan *p);
/* cudnnSetTensorNdDescriptor / FilterNd arguments of a fully packed NCHW tensor and
 * cudnnSetConvolutionNdDescriptor's pad/stride/dilation (CUDNN_CROSS_CORRELATION). */
void vl_cudnn_nchw(int64_t n, int64_t c, int64_t h, int64_t w, int dims[4], int strides[4]);
void vl_cudnn_conv_params(const vl_conv *cv, int pad[2], int stride[2], int dil[2]);
/* false when a dimension exceeds what cuDNN's int descriptors hold. */
bool vl_cudnn_fits_int(const vl_conv *cv);

/* cuDNN's algorithm for one convolution problem, chosen once. The heuristics query
 * (cudnnGet*Algorithm_v7) costs host time on every call; the backend asks once per problem
 * (geometry and dtypes, direction: the io dtype and workspace budget follow from them,
 * vl_cuda_conv_plan_make) and keeps the answer for the context's life, as frameworks do.
 * The answer is the algorithm and the math type cuDNN ranked it with: the same algorithm
 * under CUDNN_TENSOR_OP_MATH can need more workspace than under CUDNN_DEFAULT_MATH, so the
 * call must run with the math type whose workspace was checked. An open-addressing table
 * that grows at half load. */
typedef struct {
  int algo, math;
} vl_cuda_algo;
typedef struct {
  vl_conv cv;
  int dir;
  vl_cuda_algo a;
  bool used;
} vl_cuda_algo_entry;
typedef struct {
  vl_cuda_algo_entry *e;
  size_t cap, n;
} vl_cuda_algo_cache;
/* true and *a when the problem was answered before. */
bool vl_cuda_algo_get(const vl_cuda_algo_cache *c, const vl_conv *cv, int dir, vl_cuda_algo *a);
/* Remember (or overwrite) the answer; VL_ERR_OOM when the table cannot grow (it stays valid:
 * the caller just asks cuDNN again next time). */
vl_status vl_cuda_algo_put(vl_cuda_algo_cache *c, const vl_conv *cv, int dir, vl_cuda_algo a);
void vl_cuda_algo_cache_free(vl_cuda_algo_cache *c);

#ifdef __cplusplus
}
#endif
#endif
