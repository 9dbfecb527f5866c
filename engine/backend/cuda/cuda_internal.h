/* State and launch helpers shared by the CUDA backend's translation units (cuda_backend.cu:
 * the backend itself and GEMM; cuda_conv.cu: cuDNN convolutions; cuda_<family>.cu: the
 * grid-stride kernels over engine/kernels/<family>.h). Included by .cu files only. */
#ifndef VRAMLAB_CUDA_INTERNAL_H
#define VRAMLAB_CUDA_INTERNAL_H
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include "vramlab/backend.h"
#include "cuda_host.h"
#include "../be_common.h"

#define VL_THREADS 256     /* element-wise blocks; a power of two for the reductions */
#define VL_ROW_THREADS 128 /* one thread per row / column: fewer, longer threads */
#define VL_RED_BLOCKS 1024 /* most partial sums a reduction produces */

typedef struct {
  cudaStream_t stream;
  cublasHandle_t blas;
  void *base;         /* the cudaMalloc backing the arena */
  size_t base_bytes;  /* its size */
  size_t ws_off;      /* cuBLAS workspace block in the arena */
  bool ws_held;
  int max_blocks;     /* grid-stride cap: 32 blocks per SM */
  double *red_dev;    /* VL_RED_BLOCKS partial sums (outside the arena) */
  int *bad_dev;       /* VL_RED_BLOCKS non-finite flags (outside the arena) */
  double red_host[VL_RED_BLOCKS];
  int bad_host[VL_RED_BLOCKS];
  cudaEvent_t ev[2];  /* step timing: start, stop */
  cudaStream_t copy;  /* host -> device batch uploads */
  cudaEvent_t ev_copy;
  void *dnn;          /* cudnnHandle_t, created on the first convolution (cuda_conv.cu) */
  vl_cuda_algo_cache algos; /* cuDNN's algorithm per convolution problem (cuda_host.h) */
  /* --profile: event pairs around kernels, [2i] start and [2i+1] end of the kernel of
   * op prof_op[i]; prof_n pairs recorded, room for prof_cap, prof_nev events created
   * (cuda_backend.cu) */
  cudaEvent_t *prof_ev;
  int *prof_op;
  size_t prof_n, prof_cap, prof_nev;
} cu_state;

#define CU_CHECK(c, call)                                                                  \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess)                                                                 \
      return vl_fail((c), VL_ERR_BACKEND, "%s:%d: %s: %s", __FILE__, __LINE__, #call,      \
                     cudaGetErrorString(e_));                                              \
  } while (0)

#define CUBLAS_CHECK(c, call)                                                              \
  do {                                                                                     \
    cublasStatus_t s_ = (call);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                       \
      return vl_fail((c), VL_ERR_BACKEND, "%s:%d: %s: %s", __FILE__, __LINE__, #call,      \
                     cublasGetStatusString(s_));                                           \
  } while (0)

/* Grid-stride launch of `kernel` over n items on the context's stream, then check it. */
#define LAUNCH(c, s, n, threads, kernel, ...)                                              \
  do {                                                                                     \
    int nb_;                                                                               \
    vl_cuda_grid((n), (threads), (s)->max_blocks, &nb_);                                   \
    kernel<<<nb_, (threads), 0, (s)->stream>>>(__VA_ARGS__);                               \
    CU_CHECK((c), cudaGetLastError());                                                     \
  } while (0)

#define GRID_STRIDE(i, n)                                                                  \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
       i += (int64_t)blockDim.x * gridDim.x)

static inline cu_state *st(vl_ctx *c) { return (cu_state *)c->be_state; }

/* An op table entry's argument struct (vramlab/ops.h). */
#define ARGS(type) const type *a = (const type *)p

/* Each file fills its ops into the table (called once, by make_backend in cuda_backend.cu). */
void vl_cuda_gemm_ops(vl_backend *b);  /* cuda_backend.cu: GEMM (cuBLAS) */
void vl_cuda_conv_ops(vl_backend *b);  /* cuda_conv.cu: convolutions (cuDNN) */
void vl_cuda_norm_ops(vl_backend *b);  /* cuda_norm.cu */
void vl_cuda_act_ops(vl_backend *b);   /* cuda_act.cu */
void vl_cuda_attn_ops(vl_backend *b);  /* cuda_attn.cu */
void vl_cuda_pool_ops(vl_backend *b);  /* cuda_pool.cu */
void vl_cuda_loss_ops(vl_backend *b);  /* cuda_loss.cu */
void vl_cuda_embed_ops(vl_backend *b); /* cuda_embed.cu */
void vl_cuda_optim_ops(vl_backend *b); /* cuda_optim.cu */
/* Releases the cuDNN handle, if one was made (cu_fini). */
void vl_cuda_conv_fini(cu_state *s);

#endif
