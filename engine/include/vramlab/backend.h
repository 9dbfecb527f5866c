/* The backend interface: a struct of function pointers plus a context (DESIGN.md).
 *
 * Three backends implement it: `cpu` (OpenBLAS + OpenMP loops over the single-source
 * kernels), `cuda` (cuBLAS + the same kernels wrapped in grid-stride launches) and `plan`
 * (computes nothing). A NULL op pointer means "counted, not computed": the plan backend
 * leaves every compute op NULL, so the layers still run their allocation sequence and
 * count FLOPs and bytes, and nothing touches memory. Workspace sizing is a pure function
 * of the op's arguments, so the planner can ask the backend it plans *for* (its target).
 *
 * Tensors are row-major. All ops accumulate in fp32 and read/write any storage dtype
 * (fp32, fp16, bf16) unless stated; NF4 appears only as GEMM operand B (a frozen weight). */
#ifndef VRAMLAB_BACKEND_H
#define VRAMLAB_BACKEND_H

#include "vramlab/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Row-major C[M,N] = alpha * op(A)[M,K] op(B)[K,N] + beta * C, `batch` times with element
 * strides sa/sb/sc. Offsets and leading dimensions are in elements of the operand. */
typedef struct {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
  const vl_tensor *A; int64_t a_off, lda, sa;
  const vl_tensor *B; int64_t b_off, ldb, sb;
  vl_tensor *C; int64_t c_off, ldc, sc;
  int64_t batch;
  void *ws; size_t ws_bytes; /* from gemm_ws_bytes, allocated in VL_MEM_WORKSPACE */
} vl_gemm;

/* 2-D convolution (cross-correlation, as every framework), NCHW activations, weights
 * (K, C, R, S), groups 1, no bias, symmetric padding. Dtypes are part of the shape: x/y/dx/dy
 * are stored in xdt, the weights in wdt, the weight gradient in gdt (fp32, fp16, bf16). */
typedef struct {
  int64_t N, C, H, W;   /* input */
  int64_t K, R, S;      /* output channels, kernel height, width */
  int stride, pad, dil; /* dil: 1 = dense */
  int64_t P, Q;         /* output height, width: set by vl_conv_init */
  vl_dtype xdt, wdt, gdt;
} vl_conv;
typedef enum { VL_CONV_FWD = 0, VL_CONV_BWD_DATA = 1, VL_CONV_BWD_WEIGHT = 2 } vl_conv_dir;

/* Fills cv (dtypes fp32) and its output size P = (H + 2 pad - dil (R-1) - 1) / stride + 1;
 * false when an argument is out of range or the output would be empty. */
bool vl_conv_init(vl_conv *cv, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                  int64_t S, int stride, int pad, int dil);
/* Multiply-adds x 2 of one direction (each of the three costs the same). */
double vl_conv_flops(const vl_conv *cv);

typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t t;        /* step count, from 1 */
  float eps2;       /* Adafactor: regulariser of the factored second moment */
  float clip_thr;   /* Adafactor: update RMS clip (1.0 in the paper) */
  float decay_pow;  /* Adafactor: beta2_t = 1 - t^(-decay_pow); 0.8 in the paper */
  float momentum;   /* SGD */
  float grad_scale; /* gradients are multiplied by this first (1/loss_scale, clip coef) */
} vl_optim_hp;

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
  size_t (*gemm_ws_bytes)(const vl_ctx *c, const vl_gemm *g);
  /* Persistent library workspace taken once at context creation (cuBLAS); 0 on CPU. */
  size_t (*fixed_ws_bytes)(const vl_ctx *c);

  vl_status (*gemm)(vl_ctx *c, const vl_gemm *g);
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

  /* y = 0 */
  vl_status (*zero)(vl_ctx *c, vl_tensor *y);
  /* y[i] = convert(x[i]) for the first n elements (dtype conversion / copy). */
  vl_status (*convert)(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n);
  /* y = a*x + b*y over n elements */
  vl_status (*axpby)(vl_ctx *c, vl_tensor *y, float a, const vl_tensor *x, float b, int64_t n);
  /* out (R,C) = wte[tok[r]]. Token and target ids (int32) are device memory: they live in
   * the step's VL_MEM_DATA tensor, so the input batch is counted like any other buffer. */
  vl_status (*embed_fwd)(vl_ctx *c, vl_tensor *out, const vl_tensor *wte, const int32_t *tok,
                         int64_t R, int64_t C);
  vl_status (*embed_bwd)(vl_ctx *c, vl_tensor *dwte, const vl_tensor *dout, const int32_t *tok,
                         int64_t R, int64_t C);
  /* out = x * rstd * w ; rstd (R) fp32 saved for backward */
  vl_status (*rmsnorm_fwd)(vl_ctx *c, vl_tensor *out, vl_tensor *rstd, const vl_tensor *x,
                           const vl_tensor *w, int64_t R, int64_t C, float eps);
  /* dx += ... ; dw += ... (dw may be NULL when the norm weight is frozen) */
  vl_status (*rmsnorm_bwd)(vl_ctx *c, vl_tensor *dx, vl_tensor *dw, const vl_tensor *dout,
                           const vl_tensor *x, const vl_tensor *w, const vl_tensor *rstd,
                           int64_t R, int64_t C);
  /* In-place rotary embedding of x (B,T,H,D) at positions 0..T-1; inverse=true rotates by
   * -theta (the backward of a rotation is its transpose). */
  vl_status (*rope)(vl_ctx *c, vl_tensor *x, int64_t B, int64_t T, int64_t H, int64_t D,
                    float theta, bool inverse);
  /* (B,T,H,D) <-> (B,H,T,D); back=true maps (B,H,T,D) -> (B,T,H,D). */
  vl_status (*permute)(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t B, int64_t T,
                       int64_t H, int64_t D, bool back);
  /* Row softmax of scale*S with a causal mask; rows are (.., T) where row r has query
   * position r % T. P may alias S. */
  vl_status (*softmax_causal_fwd)(vl_ctx *c, vl_tensor *P, const vl_tensor *S, int64_t rows,
                                  int64_t T, float scale);
  /* dS = scale * P * (dP - sum(dP*P)); dS may alias dP */
  vl_status (*softmax_causal_bwd)(vl_ctx *c, vl_tensor *dS, const vl_tensor *dP,
                                  const vl_tensor *P, int64_t rows, int64_t T, float scale);
  /* out = silu(g) * u over n elements */
  vl_status (*swiglu_fwd)(vl_ctx *c, vl_tensor *out, const vl_tensor *g, const vl_tensor *u,
                          int64_t n);
  vl_status (*swiglu_bwd)(vl_ctx *c, vl_tensor *dg, vl_tensor *du, const vl_tensor *dout,
                          const vl_tensor *g, const vl_tensor *u, int64_t n);
  /* Fused cross-entropy: per row r with target tgt[r] (-1 = ignored), loss[r] (fp32) and,
   * in place, logits := dloss_scale * (softmax - onehot) (zero for ignored rows). */
  vl_status (*xent_fused)(vl_ctx *c, vl_tensor *logits, vl_tensor *loss, const int32_t *tgt,
                          int64_t R, int64_t V, float dloss_scale);
  /* sum of squares of x[0..n) into *out (double on host); sets *nonfinite when a NaN/Inf
   * was seen. */
  vl_status (*sumsq)(vl_ctx *c, const vl_tensor *x, int64_t n, double *out, bool *nonfinite);
  /* Optimizer updates on fp32 params p with fp32 grads g (n elements). */
  vl_status (*adamw)(vl_ctx *c, vl_tensor *p, const vl_tensor *g, vl_tensor *m, vl_tensor *v,
                     int64_t n, const vl_optim_hp *hp);
  vl_status (*sgd)(vl_ctx *c, vl_tensor *p, const vl_tensor *g, vl_tensor *mom, int64_t n,
                   const vl_optim_hp *hp);
  /* Adafactor on a (R,C) matrix (R=1 for vectors: vc holds the unfactored v of C
   * elements and vr is unused). vr (R), vc (C) factored second moments; m (R*C) first
   * moment or NULL when beta1=0. The update is recomputed per pass: no (R*C) scratch. */
  vl_status (*adafactor)(vl_ctx *c, vl_tensor *p, const vl_tensor *g, vl_tensor *vr,
                         vl_tensor *vc, vl_tensor *m, int64_t R, int64_t C,
                         const vl_optim_hp *hp);

  /* ---- convolutional networks (engine/kernels/cnn.h; conv via oneDNN / cuDNN) ---------- */
  /* Library scratch one conv call needs (oneDNN user scratchpad plus dtype conversions on
   * CPU; the cuDNN algorithm's workspace on CUDA), taken by the caller from the arena as
   * VL_MEM_WORKSPACE. Pure in its arguments. accumulate: see conv_bwd_weight. */
  size_t (*conv_ws_bytes)(const vl_ctx *c, const vl_conv *cv, vl_conv_dir dir, bool accumulate);
  /* y (N,K,P,Q) = conv(x (N,C,H,W), w (K,C,R,S)) */
  vl_status (*conv_fwd)(vl_ctx *c, const vl_conv *cv, vl_tensor *y, const vl_tensor *x,
                        const vl_tensor *w, void *ws, size_t ws_bytes);
  /* dx (N,C,H,W) = conv^T(dy, w), overwritten */
  vl_status (*conv_bwd_data)(vl_ctx *c, const vl_conv *cv, vl_tensor *dx, const vl_tensor *dy,
                             const vl_tensor *w, void *ws, size_t ws_bytes);
  /* dw (K,C,R,S) = grad_w, or dw += grad_w when accumulate (gradient accumulation) */
  vl_status (*conv_bwd_weight)(vl_ctx *c, const vl_conv *cv, vl_tensor *dw, const vl_tensor *x,
                               const vl_tensor *dy, bool accumulate, void *ws, size_t ws_bytes);
  /* BatchNorm2d over x (N,C,HW), training mode: per-channel batch mean and biased variance
   * normalise x; mean and rstd = 1/sqrt(var+eps) (C, fp32) are saved for backward; when
   * rmean/rvar (C, fp32) are non-NULL they are updated as PyTorch does
   * (r = (1-momentum) r + momentum * batch, with the unbiased variance for rvar).
   * y = (x-mean)*rstd*gamma + beta; y must not alias x. gamma/beta any float dtype. */
  vl_status (*bn_fwd_train)(vl_ctx *c, vl_tensor *y, vl_tensor *mean, vl_tensor *rstd,
                            vl_tensor *rmean, vl_tensor *rvar, const vl_tensor *x,
                            const vl_tensor *gamma, const vl_tensor *beta, int64_t N, int64_t C,
                            int64_t HW, float eps, float momentum);
  /* Evaluation mode: y = (x - rmean)/sqrt(rvar + eps)*gamma + beta; y may alias x. */
  vl_status (*bn_fwd_eval)(vl_ctx *c, vl_tensor *y, const vl_tensor *x, const vl_tensor *gamma,
                           const vl_tensor *beta, const vl_tensor *rmean, const vl_tensor *rvar,
                           int64_t N, int64_t C, int64_t HW, float eps);
  /* Training-mode backward: dx overwritten (may alias dy); dgamma, dbeta (C) accumulated
   * (+=), either may be NULL. */
  vl_status (*bn_bwd)(vl_ctx *c, vl_tensor *dx, vl_tensor *dgamma, vl_tensor *dbeta,
                      const vl_tensor *dy, const vl_tensor *x, const vl_tensor *gamma,
                      const vl_tensor *mean, const vl_tensor *rstd, int64_t N, int64_t C,
                      int64_t HW);
  /* y = max(x, 0) over n elements; y may alias x (in-place ReLU). */
  vl_status (*relu_fwd)(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n);
  /* dx = dy * (y > 0), from the output y; dx may alias dy. */
  vl_status (*relu_bwd)(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *y,
                        int64_t n);
  /* Max pooling of `planes` (N*C) planes H x W, window k, stride, padding pad (padding never
   * wins), output P x Q. Backward recomputes the argmax from x (first maximum in row-major
   * window order, as PyTorch's CPU kernel) instead of keeping indices; dx overwritten. */
  vl_status (*maxpool_fwd)(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                           int64_t H, int64_t W, int k, int stride, int pad, int64_t P,
                           int64_t Q);
  vl_status (*maxpool_bwd)(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *x,
                           int64_t planes, int64_t H, int64_t W, int k, int stride, int pad,
                           int64_t P, int64_t Q);
  /* Bilinear 2x upsampling (align_corners=False, PyTorch's F.interpolate) of `planes` planes
   * H x W -> 2H x 2W; backward: dx (planes, H, W) overwritten from dy (planes, 2H, 2W). */
  vl_status (*upsample2x_fwd)(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t planes,
                              int64_t H, int64_t W);
  vl_status (*upsample2x_bwd)(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, int64_t planes,
                              int64_t H, int64_t W);
  /* Channel copy for concat and its backward: for n < N, k < nc:
   * y[n, y_c0 + k, :] = x[n, x_c0 + k, :] (+ y[...] when accumulate), planes of HW;
   * y has yC channels, x has xC. */
  vl_status (*chan_copy)(vl_ctx *c, vl_tensor *y, int64_t yC, int64_t y_c0, const vl_tensor *x,
                         int64_t xC, int64_t x_c0, int64_t nc, int64_t N, int64_t HW,
                         bool accumulate);
  /* Per-pixel cross-entropy over logits (N, K, HW) with targets tgt (N*HW int32, device
   * memory; -1 = ignored): loss (N*HW, fp32) per pixel (0 when ignored), and in place
   * logits := dloss_scale * (softmax - onehot) (zero for ignored pixels). */
  vl_status (*xent_pix)(vl_ctx *c, vl_tensor *logits, vl_tensor *loss, const int32_t *tgt,
                        int64_t N, int64_t K, int64_t HW, float dloss_scale);
} vl_backend;

extern const vl_backend vl_backend_cpu;
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

#ifdef __cplusplus
}
#endif
#endif
