/* CUDA convolutions through cuDNN (legacy convolution API, cuDNN 8/9). Everything decided
 * before the calls is in cuda_host.c (vl_cuda_conv_plan_make: io dtype, copies, algorithm
 * budget; descriptor dims/strides), unit-tested on the CPU; this file only executes it.
 * The workspace is the caller's arena block of vl_conv_ws_cuda bytes: [weight copy | dw
 * copy | algorithm workspace]. The algorithm is the first of cuDNN's heuristic ranking
 * (cudnnGet*Algorithm_v7) that succeeds and fits the budget under its own math type, so
 * memory never depends on a benchmark search; it is asked once per problem and kept
 * (vl_cuda_algo_cache). */
#include <cudnn.h>

#include "cuda_internal.h"
#include "../../kernels/kcommon.h"

#define DNN_CHECK(c, call)                                                                 \
  do {                                                                                     \
    cudnnStatus_t s_ = (call);                                                             \
    if (s_ != CUDNN_STATUS_SUCCESS)                                                        \
      return vl_fail((c), VL_ERR_BACKEND, "%s:%d: %s: %s", __FILE__, __LINE__, #call,      \
                     cudnnGetErrorString(s_));                                             \
  } while (0)

typedef struct {
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
} descs;

static cudnnDataType_t dnn_type(vl_cu_dtype d) {
  return d == VL_CU_R_16F ? CUDNN_DATA_HALF : d == VL_CU_R_16BF ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static void descs_free(descs *d) {
  if (d->x) cudnnDestroyTensorDescriptor(d->x);
  if (d->y) cudnnDestroyTensorDescriptor(d->y);
  if (d->w) cudnnDestroyFilterDescriptor(d->w);
  if (d->conv) cudnnDestroyConvolutionDescriptor(d->conv);
}

static vl_status handle(vl_ctx *c, cudnnHandle_t *h) {
  cu_state *s = st(c);
  if (!s->dnn) {
    cudnnHandle_t nh;
    DNN_CHECK(c, cudnnCreate(&nh));
    s->dnn = (void *)nh;
  }
  *h = (cudnnHandle_t)s->dnn;
  DNN_CHECK(c, cudnnSetStream(*h, s->stream));
  return VL_OK;
}

static vl_status descs_make(vl_ctx *c, const vl_conv *cv, const vl_cuda_conv_plan *p, descs *d) {
  memset(d, 0, sizeof *d);
  if (!vl_cudnn_fits_int(cv))
    return vl_fail(c, VL_ERR_UNSUPPORTED, "conv: a tensor exceeds cuDNN's 2^31 elements");
  cudnnDataType_t t = dnn_type(p->io);
  int dims[4], str[4], pad[2], stride[2], dil[2];
  DNN_CHECK(c, cudnnCreateTensorDescriptor(&d->x));
  DNN_CHECK(c, cudnnCreateTensorDescriptor(&d->y));
  DNN_CHECK(c, cudnnCreateFilterDescriptor(&d->w));
  DNN_CHECK(c, cudnnCreateConvolutionDescriptor(&d->conv));
  vl_cudnn_nchw(cv->N, cv->C, cv->H, cv->W, dims, str);
  DNN_CHECK(c, cudnnSetTensorNdDescriptor(d->x, t, 4, dims, str));
  vl_cudnn_nchw(cv->N, cv->K, cv->P, cv->Q, dims, str);
  DNN_CHECK(c, cudnnSetTensorNdDescriptor(d->y, t, 4, dims, str));
  int fdims[4] = {(int)cv->K, (int)cv->C, (int)cv->R, (int)cv->S};
  DNN_CHECK(c, cudnnSetFilterNdDescriptor(d->w, t, CUDNN_TENSOR_NCHW, 4, fdims));
  vl_cudnn_conv_params(cv, pad, stride, dil);
  DNN_CHECK(c, cudnnSetConvolutionNdDescriptor(d->conv, 2, pad, stride, dil,
                                               CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  DNN_CHECK(c, cudnnSetConvolutionMathType(d->conv, p->tensor_op ? CUDNN_TENSOR_OP_MATH : CUDNN_DEFAULT_MATH));
  return VL_OK;
}

__global__ void k_conv_convert(void *y, int ydt, const void *x, int xdt, int64_t n, int acc) {
  GRID_STRIDE(i, n) {
    float v = vl_ld(x, xdt, i);
    vl_st(y, ydt, i, acc ? vl_ld(y, ydt, i) + v : v);
  }
}

static vl_status convert(vl_ctx *c, void *y, int ydt, const void *x, int xdt, int64_t n, bool acc) {
  cu_state *s = st(c);
  LAUNCH(c, s, n, 256, k_conv_convert, y, ydt, x, xdt, n, acc ? 1 : 0);
  return VL_OK;
}

static vl_status prep(vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, bool acc, size_t ws_bytes,
                      void *ws, vl_cuda_conv_plan *p, cudnnHandle_t *h, descs *d) {
  if (vl_cuda_conv_plan_make(cv, dir, acc, p) != VL_OK)
    return vl_fail(c, VL_ERR_INVALID, "conv: unsupported dtype (x %d, w %d, dw %d)", (int)cv->xdt,
                   (int)cv->wdt, (int)cv->gdt);
  if (ws_bytes < p->ws_total || (p->ws_total && !ws))
    return vl_fail(c, VL_ERR_INVALID, "conv: workspace of %zu bytes, needs %zu (the op's workspace)",
                   ws_bytes, p->ws_total);
  vl_status r = handle(c, h);
  if (r == VL_OK) r = descs_make(c, cv, p, d);
  return r;
}

/* The algorithm for this problem: the cache's, else the first of cuDNN's heuristic ranking
 * that succeeds and whose workspace fits the budget under the math type cuDNN ranked it with
 * (asked again of cuDNN with that math type set: the ranking's `memory` and the call's
 * requirement differ, and a call past its workspace is a BAD_PARAM), then remembered. fp32
 * io takes only default/FMA math (no TF32: it matches the CPU to 1e-6). If nothing ranked
 * fits, algorithm 0 (implicit GEMM: no workspace) under default math. The descriptor is
 * left with the chosen math type for the call. */
template <typename Perf, int N, typename Get, typename Ws>
static vl_status pick(vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, const vl_cuda_conv_plan *p,
                      cudnnConvolutionDescriptor_t conv, Get get, Ws ws_size, int *algo) {
  vl_cuda_algo a;
  if (!vl_cuda_algo_get(&st(c)->algos, cv, (int)dir, &a)) {
    Perf perf[N];
    int got = 0;
    DNN_CHECK(c, get(N, &got, perf));
    bool found = false;
    for (int i = 0; i <= got && !found; i++) {
      /* i == got: the fallback, algorithm 0 under default math */
      cudnnMathType_t m = i < got ? perf[i].mathType : CUDNN_DEFAULT_MATH;
      int al = i < got ? (int)perf[i].algo : 0;
      if (i < got && (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > p->algo_ws)) continue;
      if (!p->tensor_op && m != CUDNN_DEFAULT_MATH && m != CUDNN_FMA_MATH) continue;
      size_t need = 0;
      if (cudnnSetConvolutionMathType(conv, m) != CUDNN_STATUS_SUCCESS) continue;
      if (ws_size(al, &need) != CUDNN_STATUS_SUCCESS || need > p->algo_ws) continue;
      a = (vl_cuda_algo){al, (int)m};
      found = true;
    }
    if (!found)
      return vl_fail(c, VL_ERR_BACKEND, "conv: no cuDNN algorithm fits %zu bytes", p->algo_ws);
    (void)vl_cuda_algo_put(&st(c)->algos, cv, (int)dir, a);
  }
  DNN_CHECK(c, cudnnSetConvolutionMathType(conv, (cudnnMathType_t)a.math));
  *algo = a.algo;
  return VL_OK;
}

static vl_status cu_conv_fwd(vl_ctx *c, const vl_conv *cv, vl_tensor *y, const vl_tensor *x,
                             const vl_tensor *w, void *ws, size_t ws_bytes) {
  vl_cuda_conv_plan p;
  cudnnHandle_t h = NULL;
  descs d = {};
  vl_status r = prep(c, cv, VL_CONV_FWD, false, ws_bytes, ws, &p, &h, &d);
  if (r == VL_OK) {
    const void *wp = w->data;
    if (p.w_copy) {
      r = convert(c, ws, (int)cv->xdt, w->data, (int)w->dtype, cv->K * cv->C * cv->R * cv->S, false);
      wp = ws;
    }
    int al = 0;
    if (r == VL_OK)
      r = pick<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
          c, cv, VL_CONV_FWD, &p, d.conv,
          [&](int n, int *got, cudnnConvolutionFwdAlgoPerf_t *perf) {
            return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, n, got, perf);
          },
          [&](int a, size_t *b) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y,
                                                           (cudnnConvolutionFwdAlgo_t)a, b);
          },
          &al);
    if (r == VL_OK) {
      r = [&]() -> vl_status {
        float one = 1.0f, zero = 0.0f;
        DNN_CHECK(c, cudnnConvolutionForward(h, &one, d.x, x->data, d.w, wp, d.conv,
                                             (cudnnConvolutionFwdAlgo_t)al,
                                             (char *)ws + p.w_copy + p.dw_copy, p.algo_ws, &zero,
                                             d.y, y->data));
        return VL_OK;
      }();
    }
  }
  descs_free(&d);
  return r;
}

static vl_status cu_conv_bwd_data(vl_ctx *c, const vl_conv *cv, vl_tensor *dx, const vl_tensor *dy,
                                  const vl_tensor *w, void *ws, size_t ws_bytes) {
  vl_cuda_conv_plan p;
  cudnnHandle_t h = NULL;
  descs d = {};
  vl_status r = prep(c, cv, VL_CONV_BWD_DATA, false, ws_bytes, ws, &p, &h, &d);
  if (r == VL_OK) {
    const void *wp = w->data;
    if (p.w_copy) {
      r = convert(c, ws, (int)cv->xdt, w->data, (int)w->dtype, cv->K * cv->C * cv->R * cv->S, false);
      wp = ws;
    }
    int al = 0;
    if (r == VL_OK)
      r = pick<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
          c, cv, VL_CONV_BWD_DATA, &p, d.conv,
          [&](int n, int *got, cudnnConvolutionBwdDataAlgoPerf_t *perf) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, n, got, perf);
          },
          [&](int a, size_t *b) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x,
                                                                (cudnnConvolutionBwdDataAlgo_t)a, b);
          },
          &al);
    if (r == VL_OK) {
      r = [&]() -> vl_status {
        float one = 1.0f, zero = 0.0f;
        DNN_CHECK(c, cudnnConvolutionBackwardData(h, &one, d.w, wp, d.y, dy->data, d.conv,
                                                  (cudnnConvolutionBwdDataAlgo_t)al,
                                                  (char *)ws + p.w_copy + p.dw_copy, p.algo_ws,
                                                  &zero, d.x, dx->data));
        return VL_OK;
      }();
    }
  }
  descs_free(&d);
  return r;
}

static vl_status cu_conv_bwd_weight(vl_ctx *c, const vl_conv *cv, vl_tensor *dw, const vl_tensor *x,
                                    const vl_tensor *dy, bool accumulate, void *ws,
                                    size_t ws_bytes) {
  vl_cuda_conv_plan p;
  cudnnHandle_t h = NULL;
  descs d = {};
  vl_status r = prep(c, cv, VL_CONV_BWD_WEIGHT, accumulate, ws_bytes, ws, &p, &h, &d);
  if (r == VL_OK) {
    void *dwp = p.dw_copy ? (char *)ws + p.w_copy : dw->data;
    int al = 0;
    r = pick<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
        c, cv, VL_CONV_BWD_WEIGHT, &p, d.conv,
        [&](int n, int *got, cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
          return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, n, got, perf);
        },
        [&](int a, size_t *b) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w,
                                                                (cudnnConvolutionBwdFilterAlgo_t)a, b);
        },
        &al);
    if (r == VL_OK) r = [&]() -> vl_status {
      float one = 1.0f, beta = (accumulate && !p.dw_copy) ? 1.0f : 0.0f;
      DNN_CHECK(c, cudnnConvolutionBackwardFilter(h, &one, d.x, x->data, d.y, dy->data, d.conv,
                                                  (cudnnConvolutionBwdFilterAlgo_t)al,
                                                  (char *)ws + p.w_copy + p.dw_copy, p.algo_ws,
                                                  &beta, d.w, dwp));
      return VL_OK;
    }();
    if (r == VL_OK && p.dw_copy)
      r = convert(c, dw->data, (int)dw->dtype, dwp, (int)cv->xdt, cv->K * cv->C * cv->R * cv->S,
                  accumulate);
  }
  descs_free(&d);
  return r;
}

/* The op table's entries: unpack the argument structs (vramlab/ops.h). */
static vl_status op_conv_fwd(vl_ctx *c, const void *p) {
  const vl_conv_fwd_args *a = (const vl_conv_fwd_args *)p;
  return cu_conv_fwd(c, &a->cv, a->y, a->x, a->w, a->ws, a->ws_bytes);
}
static vl_status op_conv_bwd_data(vl_ctx *c, const void *p) {
  const vl_conv_bwd_data_args *a = (const vl_conv_bwd_data_args *)p;
  return cu_conv_bwd_data(c, &a->cv, a->dx, a->dy, a->w, a->ws, a->ws_bytes);
}
static vl_status op_conv_bwd_weight(vl_ctx *c, const void *p) {
  const vl_conv_bwd_weight_args *a = (const vl_conv_bwd_weight_args *)p;
  return cu_conv_bwd_weight(c, &a->cv, a->dw, a->x, a->dy, a->accumulate, a->ws, a->ws_bytes);
}

void vl_cuda_conv_ops(vl_backend *b) {
  b->ops[VL_OP_CONV_FWD] = op_conv_fwd;
  b->ops[VL_OP_CONV_BWD_DATA] = op_conv_bwd_data;
  b->ops[VL_OP_CONV_BWD_WEIGHT] = op_conv_bwd_weight;
}

void vl_cuda_conv_fini(cu_state *s) {
  if (s->dnn) (void)cudnnDestroy((cudnnHandle_t)s->dnn);
  s->dnn = NULL;
  vl_cuda_algo_cache_free(&s->algos);
}
