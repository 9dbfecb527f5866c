/* Operations are data (docs/architecture.md "Operations", as in ggml).
 *
 * One enum of operations, one argument struct per operation, and per operation a
 * descriptor (engine/backend/ops.c): its name, its argument size, a pure function for the
 * FLOPs and bytes it moves, and a pure function for the workspace it needs on a target.
 * Layers call one dispatch point, vl_op_run(ctx, op, &args), which
 *   - checks the arguments with the descriptor's check, on every backend (a plan refuses
 *     what a run refuses, with the same status and message);
 *   - counts FLOPs and bytes (the only place that counts; FLOPs of a checkpoint's re-run
 *     forward go to flops_recompute);
 *   - takes the op's workspace from the arena (VL_MEM_WORKSPACE) for the duration of the
 *     call when the op needs one and the caller passed none;
 *   - returns after that on a plan context (ctx->plan);
 *   - otherwise calls the backend's kernel, ctx->be->ops[op]; a backend without one returns
 *     VL_ERR_UNSUPPORTED naming the operation and the backend, never a silent skip;
 *   - with ctx->profile on, adds calls, seconds and FLOPs to the op's profile entry.
 * Adding an operation: one X() line and its argument struct here; its descriptor (cost,
 * workspace, argument check) in ops.c; a kernel body in engine/kernels; in one kernel file
 * of each backend its kernel and its registration line, b->ops[VL_OP_...] = kernel;
 * gpu-check cases (tools/gpu_check_cases.c, their builder in tools/gpu_check.c).
 *
 * Tensors are row-major. Ops accumulate in fp32 and read/write any float storage dtype
 * (fp32, fp16, bf16) unless stated; NF4 appears only as GEMM operand B (a frozen weight);
 * token ids, targets and class masks are VL_I32 tensors. */
#ifndef VRAMLAB_OPS_H
#define VRAMLAB_OPS_H

#include "vramlab/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(ENUM, name, argument struct): the list every table below is built from. */
#define VL_OPS(X)                                                         \
  X(GEMM, gemm, vl_gemm)                                                  \
  X(CONV_FWD, conv_fwd, vl_conv_fwd_args)                                 \
  X(CONV_BWD_DATA, conv_bwd_data, vl_conv_bwd_data_args)                  \
  X(CONV_BWD_WEIGHT, conv_bwd_weight, vl_conv_bwd_weight_args)            \
  X(ZERO, zero, vl_zero_args)                                             \
  X(CONVERT, convert, vl_convert_args)                                    \
  X(AXPBY, axpby, vl_axpby_args)                                          \
  X(EMBED_FWD, embed_fwd, vl_embed_fwd_args)                              \
  X(EMBED_BWD, embed_bwd, vl_embed_bwd_args)                              \
  X(RMSNORM_FWD, rmsnorm_fwd, vl_rmsnorm_fwd_args)                        \
  X(RMSNORM_BWD, rmsnorm_bwd, vl_rmsnorm_bwd_args)                        \
  X(ROPE, rope, vl_rope_args)                                             \
  X(PERMUTE, permute, vl_permute_args)                                    \
  X(SOFTMAX_FWD, softmax_fwd, vl_softmax_fwd_args)                         \
  X(SOFTMAX_BWD, softmax_bwd, vl_softmax_bwd_args)                         \
  X(SWIGLU_FWD, swiglu_fwd, vl_swiglu_fwd_args)                           \
  X(SWIGLU_BWD, swiglu_bwd, vl_swiglu_bwd_args)                           \
  X(XENT_FUSED, xent_fused, vl_xent_fused_args)                           \
  X(SUMSQ, sumsq, vl_sumsq_args)                                          \
  X(ADAMW, adamw, vl_adamw_args)                                          \
  X(SGD, sgd, vl_sgd_args)                                                \
  X(ADAFACTOR, adafactor, vl_adafactor_args)                              \
  X(BN_FWD_TRAIN, bn_fwd_train, vl_bn_fwd_train_args)                     \
  X(BN_FWD_EVAL, bn_fwd_eval, vl_bn_fwd_eval_args)                        \
  X(BN_BWD, bn_bwd, vl_bn_bwd_args)                                       \
  X(RELU_FWD, relu_fwd, vl_relu_fwd_args)                                 \
  X(RELU_BWD, relu_bwd, vl_relu_bwd_args)                                 \
  X(MAXPOOL_FWD, maxpool_fwd, vl_maxpool_fwd_args)                        \
  X(MAXPOOL_BWD, maxpool_bwd, vl_maxpool_bwd_args)                        \
  X(UPSAMPLE2X_FWD, upsample2x_fwd, vl_upsample2x_fwd_args)               \
  X(UPSAMPLE2X_BWD, upsample2x_bwd, vl_upsample2x_bwd_args)               \
  X(CHAN_COPY, chan_copy, vl_chan_copy_args)                              \
  X(XENT_PIX, xent_pix, vl_xent_pix_args)                                 \
  X(GROUPNORM_FWD, groupnorm_fwd, vl_groupnorm_fwd_args)                  \
  X(GROUPNORM_BWD, groupnorm_bwd, vl_groupnorm_bwd_args)                  \
  X(LAYERNORM_FWD, layernorm_fwd, vl_layernorm_fwd_args)                  \
  X(LAYERNORM_BWD, layernorm_bwd, vl_layernorm_bwd_args)                  \
  X(ACT_FWD, act_fwd, vl_act_fwd_args)                                    \
  X(ACT_BWD, act_bwd, vl_act_bwd_args)                                    \
  X(GEGLU_FWD, geglu_fwd, vl_geglu_fwd_args)                              \
  X(GEGLU_BWD, geglu_bwd, vl_geglu_bwd_args)                              \
  X(BIAS_FWD, bias_fwd, vl_bias_fwd_args)                                 \
  X(BIAS_BWD, bias_bwd, vl_bias_bwd_args)                                 \
  X(PAD2D_FWD, pad2d_fwd, vl_pad2d_fwd_args)                              \
  X(PAD2D_BWD, pad2d_bwd, vl_pad2d_bwd_args)                              \
  X(TIMESTEP_EMBED, timestep_embed, vl_timestep_embed_args)               \
  X(MSE_FUSED, mse_fused, vl_mse_fused_args)                              \
  X(GAUSS_SAMPLE, gauss_sample, vl_gauss_sample_args)                     \
  X(ATTN_FWD, attn_fwd, vl_attn_fwd_args)                                 \
  X(ATTN_BWD, attn_bwd, vl_attn_bwd_args)

typedef enum {
#define VL_OP_ENUM_(id, name, type) VL_OP_##id,
  VL_OPS(VL_OP_ENUM_)
#undef VL_OP_ENUM_
  VL_OP_COUNT
} vl_op;

/* ---- argument structs ------------------------------------------------------------------ */

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
  /* VL_MEM_WORKSPACE scratch: from vl_op_run when ws is NULL and ws_bytes 0 */
  void *ws; size_t ws_bytes;
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


/* Convolutions: geometry and dtypes in cv. Workspace: from vl_op_run when ws is NULL and
 * ws_bytes 0 (what the layers do), else the caller's (at least the descriptor's bytes). */
typedef struct { /* y (N,K,P,Q) = conv(x (N,C,H,W), w (K,C,R,S)) */
  vl_conv cv;
  vl_tensor *y; const vl_tensor *x, *w;
  void *ws; size_t ws_bytes;
} vl_conv_fwd_args;
typedef struct { /* dx (N,C,H,W) = conv^T(dy, w), overwritten */
  vl_conv cv;
  vl_tensor *dx; const vl_tensor *dy, *w;
  void *ws; size_t ws_bytes;
} vl_conv_bwd_data_args;
typedef struct { /* dw (K,C,R,S) = grad_w, or dw += grad_w when accumulate */
  vl_conv cv;
  vl_tensor *dw; const vl_tensor *x, *dy;
  bool accumulate;
  void *ws; size_t ws_bytes;
} vl_conv_bwd_weight_args;

typedef struct { vl_tensor *y; } vl_zero_args; /* y = 0 (the whole tensor) */
/* y[i] = convert(x[i]) for the first n elements (dtype conversion / copy). */
typedef struct { vl_tensor *y; const vl_tensor *x; int64_t n; } vl_convert_args;
/* y = a*x + b*y over n elements (b = 0 ignores what y held, NaN included) */
typedef struct { vl_tensor *y; float a; const vl_tensor *x; float b; int64_t n; } vl_axpby_args;
/* out (R,C) = wte[tok[r]]; tok (R) VL_I32 in device memory (the batch's data tensor). */
typedef struct {
  vl_tensor *out; const vl_tensor *wte, *tok;
  int64_t R, C;
} vl_embed_fwd_args;
/* dwte[tok[r]] += dout[r] (row order per column: deterministic) */
typedef struct {
  vl_tensor *dwte; const vl_tensor *dout, *tok;
  int64_t R, C;
} vl_embed_bwd_args;
/* out (R,C) = x * rstd * w; rstd (R) fp32 saved for backward */
typedef struct {
  vl_tensor *out, *rstd; const vl_tensor *x, *w;
  int64_t R, C; float eps;
} vl_rmsnorm_fwd_args;
/* dx += ...; dw += ... (dw NULL when the norm weight is frozen) */
typedef struct {
  vl_tensor *dx, *dw; const vl_tensor *dout, *x, *w, *rstd;
  int64_t R, C;
} vl_rmsnorm_bwd_args;
/* In-place rotary embedding of x (B,T,H,D) at positions 0..T-1; inverse rotates by -theta
 * (the backward of a rotation is its transpose). */
typedef struct {
  vl_tensor *x;
  int64_t B, T, H, D; float theta; bool inverse;
} vl_rope_args;
/* (B,T,H,D) -> (B,H,T,D); back: (B,H,T,D) -> (B,T,H,D). Same dtype on both sides. */
typedef struct {
  vl_tensor *y; const vl_tensor *x;
  int64_t B, T, H, D; bool back;
} vl_permute_args;
/* Row softmax of scale*S over rows of T columns; with causal, row r has query position
 * r % T and sees columns 0..r % T (masked columns get 0). P may alias S. */
typedef struct {
  vl_tensor *P; const vl_tensor *S;
  int64_t rows, T; float scale; bool causal;
} vl_softmax_fwd_args;
/* dS = scale * P * (dP - sum(dP*P)); dS may alias dP */
typedef struct {
  vl_tensor *dS; const vl_tensor *dP, *P;
  int64_t rows, T; float scale; bool causal;
} vl_softmax_bwd_args;
/* out = silu(g) * u over n elements */
typedef struct { vl_tensor *out; const vl_tensor *g, *u; int64_t n; } vl_swiglu_fwd_args;
typedef struct {
  vl_tensor *dg, *du; const vl_tensor *dout, *g, *u;
  int64_t n;
} vl_swiglu_bwd_args;
/* Fused cross-entropy: per row r with target tgt[r] (VL_I32, -1 = ignored), loss[r] (fp32)
 * and, in place, logits (R,V) := dloss_scale * (softmax - onehot) (zero for ignored rows). */
typedef struct {
  vl_tensor *logits, *loss; const vl_tensor *tgt;
  int64_t R, V; float dloss_scale;
} vl_xent_fused_args;
/* Sum of squares of x[0..n) into *out (host); *nonfinite when a NaN/Inf was seen, and then
 * *out is 0 on every backend. On a plan context nothing is written: the caller initialises
 * both. */
typedef struct { const vl_tensor *x; int64_t n; double *out; bool *nonfinite; } vl_sumsq_args;
/* Optimizer updates on fp32 params p with fp32 grads g (n elements). */
typedef struct {
  vl_tensor *p; const vl_tensor *g; vl_tensor *m, *v;
  int64_t n; const vl_optim_hp *hp;
} vl_adamw_args;
typedef struct {
  vl_tensor *p; const vl_tensor *g; vl_tensor *mom;
  int64_t n; const vl_optim_hp *hp;
} vl_sgd_args;
/* Adafactor on a (R,C) matrix (R=1 for vectors: vc holds the unfactored v of C elements and
 * vr is unused). vr (R), vc (C) factored second moments; m (R*C) first moment or NULL when
 * beta1=0. The update is recomputed per pass: no (R*C) scratch. */
typedef struct {
  vl_tensor *p; const vl_tensor *g; vl_tensor *vr, *vc, *m;
  int64_t R, C; const vl_optim_hp *hp;
} vl_adafactor_args;
/* BatchNorm2d over x (N,C,HW), training mode: per-channel batch mean and biased variance;
 * mean and rstd (C, fp32) saved for backward; rmean/rvar (C, fp32) updated as PyTorch does
 * when non-NULL. y = (x-mean)*rstd*gamma + beta; y must not alias x. */
typedef struct {
  vl_tensor *y, *mean, *rstd, *rmean, *rvar;
  const vl_tensor *x, *gamma, *beta;
  int64_t N, C, HW; float eps, momentum;
} vl_bn_fwd_train_args;
/* Evaluation mode: y = (x - rmean)/sqrt(rvar + eps)*gamma + beta; y may alias x. */
typedef struct {
  vl_tensor *y; const vl_tensor *x, *gamma, *beta, *rmean, *rvar;
  int64_t N, C, HW; float eps;
} vl_bn_fwd_eval_args;
/* Training-mode backward: dx overwritten (may alias dy); dgamma, dbeta (C) accumulated, either
 * may be NULL. */
typedef struct {
  vl_tensor *dx, *dgamma, *dbeta;
  const vl_tensor *dy, *x, *gamma, *mean, *rstd;
  int64_t N, C, HW;
} vl_bn_bwd_args;
/* y = max(x, 0) over n elements; y may alias x (in-place ReLU). */
typedef struct { vl_tensor *y; const vl_tensor *x; int64_t n; } vl_relu_fwd_args;
/* dx = dy * (y > 0), from the output y; dx may alias dy. */
typedef struct { vl_tensor *dx; const vl_tensor *dy, *y; int64_t n; } vl_relu_bwd_args;
/* Max pooling of `planes` (N*C) planes H x W, window k, stride, padding pad (padding never
 * wins), output P x Q. Backward recomputes the argmax from x (first maximum in row-major
 * window order, as PyTorch's CPU kernel); dx overwritten. */
typedef struct {
  vl_tensor *y; const vl_tensor *x;
  int64_t planes, H, W; int k, stride, pad; int64_t P, Q;
} vl_maxpool_fwd_args;
typedef struct {
  vl_tensor *dx; const vl_tensor *dy, *x;
  int64_t planes, H, W; int k, stride, pad; int64_t P, Q;
} vl_maxpool_bwd_args;
/* 2x upsampling of `planes` planes H x W -> 2H x 2W: bilinear (align_corners=False, the
 * default) or nearest (F.interpolate(scale_factor=2, mode="nearest"), SD's Upsample2D);
 * backward: dx (planes, H, W) overwritten from dy (planes, 2H, 2W). */
typedef struct {
  vl_tensor *y; const vl_tensor *x;
  int64_t planes, H, W; bool nearest;
} vl_upsample2x_fwd_args;
typedef struct {
  vl_tensor *dx; const vl_tensor *dy;
  int64_t planes, H, W; bool nearest;
} vl_upsample2x_bwd_args;
/* Channel copy for concat and its backward: for n < N, k < nc:
 * y[n, y_c0 + k, :] = x[n, x_c0 + k, :] (+ y[...] when accumulate), planes of HW;
 * y has yC channels, x has xC. */
typedef struct {
  vl_tensor *y; int64_t yC, y_c0;
  const vl_tensor *x; int64_t xC, x_c0;
  int64_t nc, N, HW; bool accumulate;
} vl_chan_copy_args;
/* Per-pixel cross-entropy over logits (N, K, HW) with targets tgt (N*HW, VL_I32; -1 =
 * ignored): loss (N*HW, fp32) per pixel (0 when ignored), and in place
 * logits := dloss_scale * (softmax - onehot) (zero for ignored pixels). */
typedef struct {
  vl_tensor *logits, *loss; const vl_tensor *tgt;
  int64_t N, K, HW; float dloss_scale;
} vl_xent_pix_args;

/* ---- Stable Diffusion's operations (U-Net, VAE encoder, CLIP text encoder) ------------- */

/* GroupNorm over x (N, C, HW) in G groups of C/G channels (PyTorch's nn.GroupNorm, biased
 * variance): mean, rstd (N*G, fp32) saved for backward; y = (x - mean) * rstd * gamma[c] +
 * beta[c]. y must not alias x (backward reads x). */
typedef struct {
  vl_tensor *y, *mean, *rstd; const vl_tensor *x, *gamma, *beta;
  int64_t N, C, HW, G; float eps;
} vl_groupnorm_fwd_args;
/* dx (N, C, HW) overwritten, or accumulated when accumulate; dgamma, dbeta (C, fp32)
 * accumulated, both NULL when the norm is frozen. dx may not alias dy. */
typedef struct {
  vl_tensor *dx, *dgamma, *dbeta; const vl_tensor *dy, *x, *gamma, *mean, *rstd;
  int64_t N, C, HW, G; bool accumulate;
} vl_groupnorm_bwd_args;
/* LayerNorm over the last dim of x (R, C) (nn.LayerNorm): mean, rstd (R, fp32) saved;
 * y = (x - mean) * rstd * gamma + beta. y must not alias x. */
typedef struct {
  vl_tensor *y, *mean, *rstd; const vl_tensor *x, *gamma, *beta;
  int64_t R, C; float eps;
} vl_layernorm_fwd_args;
/* dx (R, C) overwritten or accumulated; dgamma, dbeta (C, fp32) accumulated or both NULL. */
typedef struct {
  vl_tensor *dx, *dgamma, *dbeta; const vl_tensor *dy, *x, *gamma, *mean, *rstd;
  int64_t R, C; bool accumulate;
} vl_layernorm_bwd_args;
/* Activations: SiLU x*sigmoid(x); GELU the exact erf form 0.5x(1+erf(x/sqrt 2)) (PyTorch's
 * default, diffusers' GEGLU); quick-GELU x*sigmoid(1.702x) (CLIP). */
typedef enum { VL_ACT_SILU = 0, VL_ACT_GELU, VL_ACT_QUICK_GELU, VL_ACT_COUNT } vl_act;
/* y = act(x) over n elements; y may alias x only when no backward follows (it reads x). */
typedef struct { vl_tensor *y; const vl_tensor *x; int64_t n; vl_act act; } vl_act_fwd_args;
/* dx = dy * act'(x), overwritten; dx may alias dy. */
typedef struct { vl_tensor *dx; const vl_tensor *dy, *x; int64_t n; vl_act act; } vl_act_bwd_args;
/* diffusers' GEGLU after its projection h (R, 2F): out (R, F) = h[:, :F] * gelu(h[:, F:])
 * (the first half is the value, the second the gate, as `hidden, gate = h.chunk(2, -1)`). */
typedef struct { vl_tensor *out; const vl_tensor *h; int64_t R, F; } vl_geglu_fwd_args;
/* dh (R, 2F) overwritten from dout (R, F) and h. */
typedef struct { vl_tensor *dh; const vl_tensor *dout, *h; int64_t R, F; } vl_geglu_bwd_args;
/* Bias over y viewed as (outer, C, inner): y[o, c, i] += b[c], or b[o, c] when per_outer
 * (the U-Net's time embedding added per sample to (N, C, HW)). Linear: (R, N, 1); conv:
 * (N, K, P*Q). b in any float dtype (a frozen fp16 bias, an fp32 trainable one). */
typedef struct {
  vl_tensor *y; const vl_tensor *b;
  int64_t outer, C, inner; bool per_outer;
} vl_bias_fwd_args;
/* db[c] (or db[o, c]) = sum over the rest of dy; accumulated into db when accumulate (a
 * parameter's gradient), else overwritten (a per-sample temporary). */
typedef struct {
  vl_tensor *db; const vl_tensor *dy;
  int64_t outer, C, inner; bool per_outer, accumulate;
} vl_bias_bwd_args;
/* Zero padding of `planes` planes H x W by (top, bottom, left, right) -> (H+t+b, W+l+r):
 * the VAE's asymmetric F.pad(x, (0, 1, 0, 1)) before its stride-2 convolution. Backward
 * crops: dx (planes, H, W) overwritten from dy. */
typedef struct {
  vl_tensor *y; const vl_tensor *x;
  int64_t planes, H, W; int top, bottom, left, right;
} vl_pad2d_fwd_args;
typedef struct {
  vl_tensor *dx; const vl_tensor *dy;
  int64_t planes, H, W; int top, bottom, left, right;
} vl_pad2d_bwd_args;
/* diffusers' get_timestep_embedding: t (B, VL_I32), half = dim/2, freq[j] = exp(-ln(max_period)
 * * j / (half - shift)), e = t * freq, emb (B, dim) = [sin e, cos e], or [cos e, sin e] when
 * flip_sin_to_cos (SD: flip, shift 0, max_period 10000). dim even. */
typedef struct {
  vl_tensor *emb; const vl_tensor *t;
  int64_t B, dim; bool flip_sin_to_cos; float shift, max_period;
} vl_timestep_embed_args;
/* Fused MSE in fp32: per row r of pred (R, C), loss[r] (fp32) = sum_c (pred - target)^2; in
 * place pred := dloss_scale * 2 * (pred - target) (the caller folds the mean, the loss scale
 * and accumulation into dloss_scale). */
typedef struct {
  vl_tensor *pred, *loss; const vl_tensor *target;
  int64_t R, C; float dloss_scale;
} vl_mse_fused_args;
/* The VAE's DiagonalGaussianDistribution sample, scaled: moments (N, 2C, HW) hold mean
 * (channels [0, C)) and log-variance ([C, 2C)); logvar clamped to [-30, 20];
 * z (N, C, HW) = scale * (mean + exp(logvar / 2) * noise), noise (N, C, HW) N(0, 1) from the
 * batch. scale: 0.18215 for SD 1.5. */
typedef struct {
  vl_tensor *z; const vl_tensor *moments, *noise;
  int64_t N, C, HW; float scale;
} vl_gauss_sample_args;
/* Memory-efficient attention (tiled, online softmax; what SDPA's efficient/flash kernels
 * do): q (B, Tq, H*D), k and v (B, Tk, H*D) as the projections write them (head h in
 * columns [h*D, (h+1)*D)), o (B, Tq, H*D) = softmax(scale q k^T [+ causal mask]) v per head;
 * lse (B, H, Tq, fp32) the log-sum-exp of each score row, kept for backward. causal:
 * Tq == Tk, query i sees keys 0..i (CLIP). No (Tq, Tk) tensor is ever stored. */
typedef struct {
  vl_tensor *o, *lse; const vl_tensor *q, *k, *v;
  int64_t B, H, Tq, Tk, D; float scale; bool causal;
} vl_attn_fwd_args;
/* Its backward: recomputes the probabilities from q, k and lse; dq, dk, dv overwritten.
 * Workspace (fp32, B*H*Tq): delta = rowsum(dout * o), from vl_op_run. */
typedef struct {
  vl_tensor *dq, *dk, *dv; const vl_tensor *dout, *o, *lse, *q, *k, *v;
  int64_t B, H, Tq, Tk, D; float scale; bool causal;
  void *ws; size_t ws_bytes;
} vl_attn_bwd_args;

/* ---- descriptors ------------------------------------------------------------------------ */
typedef struct { double flops, bytes; } vl_op_cost;

typedef struct {
  const char *name;       /* "gemm", "rmsnorm_fwd", ... */
  size_t args_size;       /* sizeof its argument struct */
  /* FLOPs and bytes read + written, from the arguments alone (pure). */
  vl_op_cost (*cost)(const void *args);
  /* Workspace bytes on `target` (VL_DEV_CPU or VL_DEV_CUDA), pure; NULL: none. Where it goes
   * in the arguments: the void * at ws_ptr_off and the size_t at ws_len_off. */
  size_t (*ws_bytes)(const void *args, vl_device target);
  size_t ws_ptr_off, ws_len_off;
  /* The argument checks (shapes, dtypes, sizes, aliasing): VL_OK or VL_ERR_INVALID with a
   * message naming the op and the argument; NULL: none. Run on every backend, plan included. */
  vl_status (*check)(vl_ctx *c, const void *args);
} vl_op_desc;

/* The descriptor of op (NULL when op is out of range). */
const vl_op_desc *vl_op_describe(vl_op op);
const char *vl_op_name(vl_op op);             /* "?" when out of range */
int vl_op_parse(const char *name, vl_op *out); /* 0 on success */
/* The device whose rules a context follows: its own, or its plan target. */
vl_device vl_ctx_target(const vl_ctx *c);
/* Workspace bytes op needs for args on c's target (0 when it needs none). */
size_t vl_op_ws_bytes(const vl_ctx *c, vl_op op, const void *args);

/* The one dispatch point (see the top of this file). */
vl_status vl_op_run(vl_ctx *c, vl_op op, const void *args);

/* Typed wrappers, one per op: vl_gemm_run(c, &g), vl_rope_run(c, &(vl_rope_args){...}). */
#define VL_OP_WRAP_(id, name, type)                                                  \
  static inline vl_status vl_##name##_run(vl_ctx *c, const type *a) {               \
    return vl_op_run(c, VL_OP_##id, a);                                              \
  }
VL_OPS(VL_OP_WRAP_)
#undef VL_OP_WRAP_

/* ---- per-operation profile (engine side of --profile) ---------------------------------- */
/* With ctx->profile on, vl_op_run adds to entry [op]: calls, seconds of the kernel, FLOPs
 * (recompute included) and bytes. Seconds: on a backend with device timers (CUDA) a pair of
 * events around the kernel, collected when the profile is read, so the stream never stalls;
 * otherwise (CPU) the host clock around the kernel after a sync before and after. Plan
 * contexts count calls, FLOPs and bytes; their seconds are ~0. */
typedef struct vl_op_profile {
  uint64_t calls;
  double seconds, flops, bytes;
} vl_op_profile;

/* VL_OP_COUNT entries, indexed by vl_op (waits for the device timers still pending). */
const vl_op_profile *vl_ctx_profile(vl_ctx *c);
void vl_ctx_profile_reset(vl_ctx *c);

#ifdef __cplusplus
}
#endif
#endif
