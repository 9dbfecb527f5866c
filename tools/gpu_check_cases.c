/* The gpu-check case table (see gpu_check_cases.h). The same coverage as the hand-written
 * checks it replaced: every op, its in-place and optional-argument variants, mixed dtypes. */
#include "gpu_check_cases.h"

#include <string.h>
#include <strings.h>

#define F32 VL_F32
#define F16 VL_F16
#define BF16 VL_BF16
#define NF4 VL_NF4
#define I32 VL_I32
#define A1(d) {d, d, d}
#define A2(d, e) {d, e, d}
#define E GC_EXACT

#define OP(x) VL_OP_##x
/* the geometries the old checks used, by name */
#define BN_SMALL {6, 19, 143}  /* HW below the CUDA block, not a divisor: strides cross planes */
#define BN_BIG {2, 5, 300}     /* HW above the CUDA block */
#define POOL_STEM {6, 17, 17, 3, 2, 1, 9, 9} /* ResNet's stem 3x3/2 pad 1 */
#define POOL_2X2 {6, 16, 14, 2, 2, 0, 8, 7}  /* U-Net's 2x2/2 */
#define POOL_CEIL {6, 16, 14, 3, 2, 1, 9, 8} /* ceil_mode sizes: windows hang over the edge */
#define UP {5, 13, 11}
#define UP_W1 {5, 9, 1}                      /* a 1-pixel-wide plane: both edges clamp */
#define CC {3, 16, 12, 63, 5, 3, 7}          /* channels [3, 10) of 12 into [5, 12) of 16 */
#define CONV_3 {2, 8, 9, 16, 3, 1, 1, 1}     /* 3x3 pad 1 stride 1 */
#define CONV_3S2 {2, 8, 9, 16, 3, 2, 1, 1}   /* 3x3 pad 1 stride 2 */
#define CONV_DIL {2, 8, 9, 16, 3, 1, 2, 2}   /* 3x3 dilation 2 pad 2 */
#define CONV_1S2 {2, 8, 9, 16, 1, 2, 0, 1}   /* 1x1 stride 2: a ResNet downsampling shortcut */
/* seg-ckpt's small U-Net head in fp16 (batch 8, 8 -> 4 channels at 128x128): cuDNN ranks an
 * algorithm under tensor-op math that needs more workspace than under default math; the
 * call must run with the math type whose workspace was checked (a BAD_PARAM on the H200) */
#define CONV_HEAD {8, 8, 128, 4, 3, 1, 1, 1}
#define GEMM {37, 64, 48}

const vl_gc_case VL_GC_CASES[] = {
    /* backend checks that are not operations */
    {GC_COPY, "upload/download f32", {1024}, A1(F32), 0, E},
    {GC_COPY, "upload/download bf16", {1024}, A1(BF16), 0, E},
    {GC_COPY, "upload/download nf4", {1024}, A1(NF4), 0, E},
    {GC_COPY, "upload/download i32", {1024}, A1(I32), 0, E},
    {GC_SYNC, "sync", {0}, A1(F32), 0, E},
    {GC_UPLOAD_ASYNC, "upload_async pageable", {4099}, A1(F32), 0, E},
    {GC_UPLOAD_ASYNC, "upload_async pinned", {4099}, A1(F32), GC_PINNED, E},
    /* element-wise: a = y, b = x */
    {OP(ZERO), "zero f32", {3001}, A1(F32), 0, E},
    {OP(ZERO), "zero f16", {3001}, A1(F16), 0, E},
    {OP(ZERO), "zero bf16", {3001}, A1(BF16), 0, E},
    {OP(CONVERT), "convert f32->f16", {4099}, {F16, F32}, 0, E},
    {OP(CONVERT), "convert f32->bf16", {4099}, {BF16, F32}, 0, E},
    {OP(CONVERT), "convert f16->f32", {4099}, {F32, F16}, 0, E},
    {OP(CONVERT), "convert bf16->f16", {4099}, {F16, BF16}, 0, E},
    {OP(CONVERT), "convert f16->bf16", {4099}, {BF16, F16}, 0, E},
    {OP(AXPBY), "axpby f32", {5003}, A1(F32), 0, 1e-12},
    {OP(AXPBY), "axpby f32 b=0", {5003}, A1(F32), GC_B0, 1e-12},
    {OP(AXPBY), "axpby f16 (x f32)", {5003}, A2(F16, F32), 0, 1e-6},
    {OP(AXPBY), "axpby f16 (x f32) b=0", {5003}, A2(F16, F32), GC_B0, 1e-6},
    {OP(AXPBY), "axpby bf16", {5003}, A1(BF16), 0, 1e-4},
    {OP(AXPBY), "axpby bf16 b=0", {5003}, A1(BF16), GC_B0, 1e-4},
    /* embedding: a = out / dwte, b = wte / dout */
    {OP(EMBED_FWD), "embed_fwd f32", {53, 96, 70}, A1(F32), 0, E},
    {OP(EMBED_FWD), "embed_fwd bf16 (wte f32)", {53, 96, 70}, A2(BF16, F32), 0, E},
    {OP(EMBED_FWD), "embed_fwd f16", {53, 96, 70}, A1(F16), 0, E},
    {OP(EMBED_BWD), "embed_bwd f32", {11, 130, 97}, A1(F32), 0, 1e-12}, /* many repeats */
    {OP(EMBED_BWD), "embed_bwd f32 (dout bf16)", {11, 130, 97}, A2(F32, BF16), 0, 1e-12},
    {OP(EMBED_BWD), "embed_bwd f16", {11, 130, 97}, A1(F16), 0, 1e-6},
    /* RMSNorm: a = activations, b = weight */
    {OP(RMSNORM_FWD), "rmsnorm_fwd f32", {33, 200}, A1(F32), 0, 1e-9},
    {OP(RMSNORM_FWD), "rmsnorm_fwd f16", {33, 200}, A1(F16), 0, 1e-5},
    {OP(RMSNORM_FWD), "rmsnorm_fwd bf16 (w f32)", {33, 200}, A2(BF16, F32), 0, 5e-4},
    {OP(RMSNORM_BWD), "rmsnorm_bwd f32", {29, 160}, A1(F32), 0, 1e-9},
    {OP(RMSNORM_BWD), "rmsnorm_bwd f32 (no dw)", {29, 160}, A1(F32), GC_NO_DW, 1e-9},
    {OP(RMSNORM_BWD), "rmsnorm_bwd f16", {29, 160}, A1(F16), 0, 1e-5},
    {OP(RMSNORM_BWD), "rmsnorm_bwd bf16", {29, 160}, A1(BF16), 0, 5e-4},
    {OP(ROPE), "rope f32", {2, 19, 3, 16}, A1(F32), 0, 1e-9},
    {OP(ROPE), "rope f32 inverse", {2, 19, 3, 16}, A1(F32), GC_INVERSE, 1e-9},
    {OP(ROPE), "rope f16", {2, 19, 3, 16}, A1(F16), 0, 1e-5},
    {OP(ROPE), "rope bf16 inverse", {2, 19, 3, 16}, A1(BF16), GC_INVERSE, 5e-4},
    {OP(PERMUTE), "permute f32", {2, 7, 5, 12}, A1(F32), 0, E},
    {OP(PERMUTE), "permute f32 back", {2, 7, 5, 12}, A1(F32), GC_BACK, E},
    {OP(PERMUTE), "permute bf16", {2, 7, 5, 12}, A1(BF16), 0, E},
    {OP(PERMUTE), "permute f16 back", {2, 7, 5, 12}, A1(F16), GC_BACK, E},
    /* softmax: a = S / P / dP / dS, b = P (forward, not in place) */
    {OP(SOFTMAX_FWD), "softmax_fwd f32", {102, 17}, A1(F32), 0, 1e-9},
    {OP(SOFTMAX_FWD), "softmax_fwd f32 in place", {102, 17}, A1(F32), GC_INPLACE, 1e-9},
    {OP(SOFTMAX_FWD), "softmax_fwd f16", {102, 17}, A1(F16), 0, 1e-5},
    {OP(SOFTMAX_FWD), "softmax_fwd bf16 (P f32)", {102, 17}, A2(BF16, F32), 0, 1e-9},
    {OP(SOFTMAX_FWD), "softmax_fwd f32 full", {102, 17}, A1(F32), GC_FULL, 1e-9},
    {OP(SOFTMAX_FWD), "softmax_fwd f16 full in place", {102, 17}, A1(F16), GC_FULL | GC_INPLACE, 1e-5},
    {OP(SOFTMAX_BWD), "softmax_bwd f32", {52, 13}, A1(F32), 0, 1e-9},
    {OP(SOFTMAX_BWD), "softmax_bwd f32 full", {52, 13}, A1(F32), GC_FULL, 1e-9},
    {OP(SOFTMAX_BWD), "softmax_bwd f32 in place", {52, 13}, A1(F32), GC_INPLACE, 1e-9},
    {OP(SOFTMAX_BWD), "softmax_bwd f16", {52, 13}, A1(F16), 0, 1e-5},
    {OP(SOFTMAX_BWD), "softmax_bwd bf16", {52, 13}, A1(BF16), 0, 5e-4},
    /* SwiGLU: a = inputs, b = outputs */
    {OP(SWIGLU_FWD), "swiglu_fwd f32", {6007}, A1(F32), 0, 1e-9},
    {OP(SWIGLU_FWD), "swiglu_fwd f16", {6007}, A1(F16), 0, 1e-5},
    {OP(SWIGLU_FWD), "swiglu_fwd bf16 (out f32)", {6007}, A2(BF16, F32), 0, 1e-9},
    {OP(SWIGLU_BWD), "swiglu_bwd f32", {6007}, A1(F32), 0, 1e-9},
    {OP(SWIGLU_BWD), "swiglu_bwd f16", {6007}, A1(F16), 0, 1e-5},
    {OP(SWIGLU_BWD), "swiglu_bwd bf16 (grads f32)", {6007}, A2(BF16, F32), 0, 1e-9},
    {OP(XENT_FUSED), "xent_fused f32", {19, 300}, A1(F32), 0, 1e-9},
    {OP(XENT_FUSED), "xent_fused f16", {19, 300}, A1(F16), 0, 1e-5},
    {OP(XENT_FUSED), "xent_fused bf16", {19, 300}, A1(BF16), 0, 5e-4},
    {OP(SUMSQ), "sumsq f32", {300007}, A1(F32), 0, 1e-20},
    {OP(SUMSQ), "sumsq f16", {300007}, A1(F16), 0, 1e-20},
    {OP(SUMSQ), "sumsq bf16 non-finite", {300007}, A1(BF16), GC_NONFINITE, 1e-20},
    {OP(ADAMW), "adamw f32", {7001}, A1(F32), 0, 1e-9},
    {OP(SGD), "sgd f32", {7001}, A1(F32), 0, 1e-9},
    {OP(ADAFACTOR), "adafactor f32 matrix", {37, 150}, A1(F32), 0, 1e-9},
    {OP(ADAFACTOR), "adafactor f32 vector", {1, 150}, A1(F32), GC_NO_M, 1e-9},
    {OP(ADAFACTOR), "adafactor f32 matrix beta1=0", {37, 150}, A1(F32), GC_NO_M, 1e-9},
    /* GEMM: A, B, C dtypes */
    {OP(GEMM), "gemm f32 NN", GEMM, {F32, F32, F32}, 0, 1e-9},
    {OP(GEMM), "gemm f32 TN", GEMM, {F32, F32, F32}, GC_TA, 1e-9},
    {OP(GEMM), "gemm f32 NT", GEMM, {F32, F32, F32}, GC_TB, 1e-9},
    {OP(GEMM), "gemm f32 TT", GEMM, {F32, F32, F32}, GC_TA | GC_TB, 1e-9},
    {OP(GEMM), "gemm f32 NN batched padded", GEMM, {F32, F32, F32}, GC_BATCHED, 1e-9},
    {OP(GEMM), "gemm f32 TT batched padded", GEMM, {F32, F32, F32}, GC_TA | GC_TB | GC_BATCHED, 1e-9},
    {OP(GEMM), "gemm f16 NT", GEMM, {F16, F16, F16}, GC_TB, 1e-5},
    {OP(GEMM), "gemm f16->f32 TN batched", GEMM, {F16, F16, F32}, GC_TA | GC_BATCHED, 1e-9},
    {OP(GEMM), "gemm bf16 NN", GEMM, {BF16, BF16, BF16}, 0, 5e-4},
    {OP(GEMM), "gemm bf16->f32 NT batched", GEMM, {BF16, BF16, F32}, GC_TB | GC_BATCHED, 1e-9},
    {OP(GEMM), "gemm bf16 x f32 -> f32 batched", GEMM, {BF16, F32, F32}, GC_BATCHED, 1e-9},
    {OP(GEMM), "gemm f32 x f16 -> f32 TT", GEMM, {F32, F16, F32}, GC_TA | GC_TB, 1e-9},
    {OP(GEMM), "gemm bf16 x f32 -> bf16 (kernel)", GEMM, {BF16, F32, BF16}, GC_TA, 5e-4},
    {OP(GEMM), "gemm f32 -> f16 (kernel) batched", GEMM, {F32, F32, F16}, GC_TB | GC_BATCHED, 1e-5},
    {OP(GEMM), "gemm f16 x nf4 -> f16", GEMM, {F16, NF4, F16}, 0, 1e-5},
    {OP(GEMM), "gemm bf16 x nf4 -> bf16 NT", GEMM, {BF16, NF4, BF16}, GC_TB, 5e-4},
    {OP(GEMM), "gemm f32 x nf4 -> f32 batched", GEMM, {F32, NF4, F32}, GC_BATCHED, 1e-9},
    {OP(GEMM), "gemm bf16 x nf4 -> f32 TN", GEMM, {BF16, NF4, F32}, GC_TA, 5e-4},
    /* Batch norm: a = x/y/dx/dy, b = gamma/beta, c = dgamma/dbeta. Per-channel sums in double
     * in another order (a block tree on CUDA), then fp32 math with the compilers' own FMA
     * contraction: rounding level. */
    {OP(BN_FWD_TRAIN), "bn_fwd_train f32", BN_SMALL, A1(F32), 0, 1e-9},
    {OP(BN_FWD_TRAIN), "bn_fwd_train f32 big HW, no running", BN_BIG, A1(F32), GC_NO_STATS, 1e-9},
    {OP(BN_FWD_TRAIN), "bn_fwd_train f16 (gamma f32)", BN_SMALL, A2(F16, F32), 0, 1e-5},
    {OP(BN_FWD_TRAIN), "bn_fwd_train bf16", BN_BIG, A1(BF16), 0, 5e-4},
    {OP(BN_FWD_EVAL), "bn_fwd_eval f32", BN_SMALL, A1(F32), 0, 1e-9},
    {OP(BN_FWD_EVAL), "bn_fwd_eval f32 in place", BN_BIG, A1(F32), GC_INPLACE, 1e-9},
    {OP(BN_FWD_EVAL), "bn_fwd_eval bf16 in place, gamma f32", BN_SMALL, {BF16, F32, BF16}, GC_INPLACE, 5e-4},
    {OP(BN_BWD), "bn_bwd f32", BN_SMALL, A1(F32), 0, 1e-9},
    {OP(BN_BWD), "bn_bwd f32 big HW, dx over dy", BN_BIG, A1(F32), GC_INPLACE, 1e-9},
    {OP(BN_BWD), "bn_bwd f32 no dgamma/dbeta", BN_SMALL, A1(F32), GC_NO_GRADS, 1e-9},
    {OP(BN_BWD), "bn_bwd f16 (gamma, grads f32)", BN_SMALL, {F16, F32, F32}, 0, 1e-5},
    {OP(BN_BWD), "bn_bwd bf16 dx over dy", BN_SMALL, {BF16, BF16, F32}, GC_INPLACE, 5e-4},
    /* ReLU, pooling, channel copy: data movement and comparisons, bit-exact.
     * a = the output side (y, dx, dy), b = x / the forward output y */
    {OP(RELU_FWD), "relu_fwd f32", {10007}, A1(F32), 0, E},
    {OP(RELU_FWD), "relu_fwd f32 in place", {10007}, A1(F32), GC_INPLACE, E},
    {OP(RELU_FWD), "relu_fwd bf16 (x f32)", {10007}, A2(BF16, F32), 0, E},
    {OP(RELU_FWD), "relu_fwd f16 in place", {10007}, A1(F16), GC_INPLACE, E},
    {OP(RELU_BWD), "relu_bwd f32", {10007}, A1(F32), 0, E},
    {OP(RELU_BWD), "relu_bwd f32 in place", {10007}, A1(F32), GC_INPLACE, E},
    {OP(RELU_BWD), "relu_bwd bf16 in place", {10007}, A1(BF16), GC_INPLACE, E},
    {OP(MAXPOOL_FWD), "maxpool_fwd f32 3x3/2 pad 1", POOL_STEM, A1(F32), 0, E},
    {OP(MAXPOOL_FWD), "maxpool_fwd f32 2x2/2", POOL_2X2, A1(F32), 0, E},
    {OP(MAXPOOL_FWD), "maxpool_fwd bf16 ceil sizes", POOL_CEIL, A1(BF16), 0, E},
    {OP(MAXPOOL_FWD), "maxpool_fwd f16 (x f32)", POOL_STEM, A2(F16, F32), 0, E},
    /* the CUDA gather adds each input's gradients in the CPU's order: bit-exact */
    {OP(MAXPOOL_BWD), "maxpool_bwd f32 3x3/2 pad 1", POOL_STEM, A1(F32), 0, E},
    {OP(MAXPOOL_BWD), "maxpool_bwd f32 2x2/2", POOL_2X2, A1(F32), 0, E},
    {OP(MAXPOOL_BWD), "maxpool_bwd f32 ceil sizes", POOL_CEIL, A1(F32), 0, E},
    {OP(MAXPOOL_BWD), "maxpool_bwd f16 3x3/2 pad 1", POOL_STEM, A1(F16), 0, E},
    {OP(MAXPOOL_BWD), "maxpool_bwd bf16 (x f32) ceil sizes", POOL_CEIL, A2(BF16, F32), 0, E},
    {OP(CHAN_COPY), "chan_copy f32", CC, A1(F32), 0, E},
    {OP(CHAN_COPY), "chan_copy f32 accumulate", CC, A1(F32), GC_ACC, E},
    {OP(CHAN_COPY), "chan_copy bf16 <- f32", CC, A2(BF16, F32), 0, E},
    {OP(CHAN_COPY), "chan_copy f16 accumulate", CC, A1(F16), GC_ACC, E},
    /* upsampling: a = the high-resolution side, b = the low; 4 weighted terms (16 in
     * backward), FMA contraction may differ */
    {OP(UPSAMPLE2X_FWD), "upsample2x_fwd f32", UP, A1(F32), 0, 1e-12},
    {OP(UPSAMPLE2X_FWD), "upsample2x_fwd f32 width 1", UP_W1, A1(F32), 0, 1e-12},
    {OP(UPSAMPLE2X_FWD), "upsample2x_fwd f16", UP, A1(F16), 0, 1e-5},
    {OP(UPSAMPLE2X_FWD), "upsample2x_fwd bf16 (x f32)", UP, A2(BF16, F32), 0, 5e-4},
    {OP(UPSAMPLE2X_BWD), "upsample2x_bwd f32", UP, A1(F32), 0, 1e-12},
    {OP(UPSAMPLE2X_BWD), "upsample2x_bwd f32 width 1", UP_W1, A1(F32), 0, 1e-12},
    {OP(UPSAMPLE2X_BWD), "upsample2x_bwd bf16", UP, A1(BF16), 0, 5e-4},
    {OP(UPSAMPLE2X_BWD), "upsample2x_bwd f16 (dx f32)", UP, A2(F16, F32), 0, 1e-9},
    {OP(XENT_PIX), "xent_pix f32", {2, 21, 195}, A1(F32), 0, 1e-9},
    {OP(XENT_PIX), "xent_pix f16", {2, 21, 195}, A1(F16), 0, 1e-5},
    {OP(XENT_PIX), "xent_pix bf16", {2, 21, 195}, A1(BF16), 0, 5e-4},
    /* convolutions (oneDNN against cuDNN): a = activations, b = w, c = dw. Sums of C*R*S = 72
     * products in another order; cuDNN may run fp32 through TF32 tensor cores (~1e-7), a
     * wrong index is ~1 */
    {OP(CONV_FWD), "conv_fwd f32 3x3/1", CONV_3, A1(F32), 0, 1e-6},
    {OP(CONV_FWD), "conv_fwd f32 3x3/2", CONV_3S2, A1(F32), 0, 1e-6},
    {OP(CONV_FWD), "conv_fwd f32 3x3 dil 2", CONV_DIL, A1(F32), 0, 1e-6},
    {OP(CONV_FWD), "conv_fwd f32 1x1/2", CONV_1S2, A1(F32), 0, 1e-6},
    {OP(CONV_FWD), "conv_fwd f16 3x3/1", CONV_3, {F16, F16, F32}, 0, 1e-5},
    {OP(CONV_FWD), "conv_fwd bf16 3x3/2", CONV_3S2, {BF16, BF16, F32}, 0, 5e-4},
    {OP(CONV_FWD), "conv_fwd f16 8x8x128^2 -> 4 (workspace)", CONV_HEAD, {F16, F16, F32}, 0, 1e-5},
    {OP(CONV_FWD), "conv_fwd bf16 8x8x128^2 -> 4 (workspace)", CONV_HEAD, {BF16, BF16, F32}, 0, 5e-4},
    {OP(CONV_BWD_DATA), "conv_bwd_data f32 3x3/1", CONV_3, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_DATA), "conv_bwd_data f32 3x3/2", CONV_3S2, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_DATA), "conv_bwd_data f32 3x3 dil 2", CONV_DIL, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_DATA), "conv_bwd_data f32 1x1/2", CONV_1S2, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_DATA), "conv_bwd_data f16 3x3/2", CONV_3S2, {F16, F16, F32}, 0, 1e-5},
    {OP(CONV_BWD_DATA), "conv_bwd_data bf16 1x1/2", CONV_1S2, {BF16, BF16, F32}, 0, 5e-4},
    {OP(CONV_BWD_DATA), "conv_bwd_data f16 8x8x128^2 -> 4 (workspace)", CONV_HEAD, {F16, F16, F32}, 0, 1e-5},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f32 3x3/1", CONV_3, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f32 3x3/1 accumulate", CONV_3, A1(F32), GC_ACC, 1e-6},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f32 3x3/2", CONV_3S2, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f32 3x3/2 accumulate", CONV_3S2, A1(F32), GC_ACC, 1e-6},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f32 3x3 dil 2", CONV_DIL, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f32 dil 2 accumulate", CONV_DIL, A1(F32), GC_ACC, 1e-6},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f32 1x1/2", CONV_1S2, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f32 1x1/2 accumulate", CONV_1S2, A1(F32), GC_ACC, 1e-6},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f16 accumulate", CONV_3, {F16, F16, F32}, GC_ACC, 1e-5},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight bf16 (dw bf16)", CONV_3S2, {BF16, BF16, BF16}, 0, 5e-4},
    {OP(CONV_BWD_WEIGHT), "conv_bwd_weight f16 8x8x128^2 -> 4 (workspace)", CONV_HEAD, {F16, F16, F32}, 0, 1e-5},
    /* Stable Diffusion's operations */
    /* GroupNorm / LayerNorm: a = x/y/dx/dy, b = gamma/beta, c = dgamma/dbeta. Sums in double
     * in another order (a block tree over strided subsets on CUDA), then fp32 math with the
     * compilers' own FMA contraction: rounding level. Groups of 148 and 600 elements (below
     * and above the 256-thread block, not divisors), G = 1, rows of 300 and 77 columns (not
     * multiples of the 32-column dgamma blocks). */
    {OP(GROUPNORM_FWD), "groupnorm_fwd f32 M=148", {2, 12, 37, 3}, A1(F32), 0, 1e-9},
    {OP(GROUPNORM_FWD), "groupnorm_fwd f32 32 groups M=600", {2, 64, 300, 32}, A1(F32), 0, 1e-9},
    {OP(GROUPNORM_FWD), "groupnorm_fwd f32 G=1", {1, 6, 77, 1}, A1(F32), 0, 1e-9},
    {OP(GROUPNORM_FWD), "groupnorm_fwd f16 (gamma f32)", {2, 12, 37, 3}, A2(F16, F32), 0, 1e-5},
    {OP(GROUPNORM_FWD), "groupnorm_fwd bf16", {2, 64, 300, 32}, A1(BF16), 0, 5e-4},
    {OP(GROUPNORM_BWD), "groupnorm_bwd f32 M=148", {2, 12, 37, 3}, A1(F32), 0, 1e-9},
    {OP(GROUPNORM_BWD), "groupnorm_bwd f32 32 groups accumulate", {2, 64, 300, 32}, A1(F32), GC_ACC, 1e-9},
    {OP(GROUPNORM_BWD), "groupnorm_bwd f32 frozen (no dgamma/dbeta)", {2, 12, 37, 3}, A1(F32), GC_NO_GRADS, 1e-9},
    {OP(GROUPNORM_BWD), "groupnorm_bwd f16 (gamma, grads f32)", {2, 12, 37, 3}, {F16, F32, F32}, 0, 1e-5},
    {OP(GROUPNORM_BWD), "groupnorm_bwd bf16 accumulate, frozen", {1, 6, 77, 1}, {BF16, BF16, F32}, GC_ACC | GC_NO_GRADS, 5e-4},
    {OP(LAYERNORM_FWD), "layernorm_fwd f32 C=300", {37, 300}, A1(F32), 0, 1e-9},
    {OP(LAYERNORM_FWD), "layernorm_fwd f32 C=77", {50, 77}, A1(F32), 0, 1e-9},
    {OP(LAYERNORM_FWD), "layernorm_fwd f16 (gamma f32)", {37, 300}, A2(F16, F32), 0, 1e-5},
    {OP(LAYERNORM_FWD), "layernorm_fwd bf16", {50, 77}, A1(BF16), 0, 5e-4},
    {OP(LAYERNORM_BWD), "layernorm_bwd f32 C=300", {37, 300}, A1(F32), 0, 1e-9},
    {OP(LAYERNORM_BWD), "layernorm_bwd f32 C=77 accumulate", {50, 77}, A1(F32), GC_ACC, 1e-9},
    {OP(LAYERNORM_BWD), "layernorm_bwd f32 frozen (no dgamma/dbeta)", {37, 300}, A1(F32), GC_NO_GRADS, 1e-9},
    {OP(LAYERNORM_BWD), "layernorm_bwd f16 (gamma, grads f32)", {50, 77}, {F16, F32, F32}, 0, 1e-5},
    {OP(LAYERNORM_BWD), "layernorm_bwd bf16 accumulate", {37, 300}, {BF16, BF16, F32}, GC_ACC, 5e-4},
    /* activations {n, act}: a = y / dx, dy; b = x. expf / erff of the device libraries
     * differ from glibc's in the last bits */
    {OP(ACT_FWD), "act_fwd f32 silu", {10007, VL_ACT_SILU}, A1(F32), 0, 1e-9},
    {OP(ACT_FWD), "act_fwd f32 gelu", {10007, VL_ACT_GELU}, A1(F32), 0, 1e-9},
    {OP(ACT_FWD), "act_fwd f32 quick_gelu in place", {10007, VL_ACT_QUICK_GELU}, A1(F32), GC_INPLACE, 1e-9},
    {OP(ACT_FWD), "act_fwd f16 silu in place", {10007, VL_ACT_SILU}, A1(F16), GC_INPLACE, 1e-5},
    {OP(ACT_FWD), "act_fwd bf16 gelu (x f32)", {10007, VL_ACT_GELU}, A2(BF16, F32), 0, 5e-4},
    {OP(ACT_BWD), "act_bwd f32 silu", {10007, VL_ACT_SILU}, A1(F32), 0, 1e-9},
    {OP(ACT_BWD), "act_bwd f32 gelu dx over dy", {10007, VL_ACT_GELU}, A1(F32), GC_INPLACE, 1e-9},
    {OP(ACT_BWD), "act_bwd f32 quick_gelu", {10007, VL_ACT_QUICK_GELU}, A1(F32), 0, 1e-9},
    {OP(ACT_BWD), "act_bwd f16 gelu", {10007, VL_ACT_GELU}, A1(F16), 0, 1e-5},
    {OP(ACT_BWD), "act_bwd bf16 silu (x f32)", {10007, VL_ACT_SILU}, A2(BF16, F32), 0, 5e-4},
    /* GEGLU {R, F}: a = h / dh, b = out / dout */
    {OP(GEGLU_FWD), "geglu_fwd f32", {37, 97}, A1(F32), 0, 1e-9},
    {OP(GEGLU_FWD), "geglu_fwd f16", {37, 97}, A1(F16), 0, 1e-5},
    {OP(GEGLU_FWD), "geglu_fwd bf16 (out f32)", {37, 97}, A2(BF16, F32), 0, 1e-9},
    {OP(GEGLU_BWD), "geglu_bwd f32", {37, 97}, A1(F32), 0, 1e-9},
    {OP(GEGLU_BWD), "geglu_bwd f32 dh over h", {37, 97}, A1(F32), GC_INPLACE, 1e-9},
    {OP(GEGLU_BWD), "geglu_bwd f16 dh over h", {37, 97}, A1(F16), GC_INPLACE, 1e-5},
    {OP(GEGLU_BWD), "geglu_bwd bf16 (dout f32)", {37, 97}, A2(BF16, F32), 0, 5e-4},
    /* bias {outer, C, inner}: a = y / dy, b = b / db. Forward one add: exact. Backward sums in
     * double in another order (a block per channel / plane, or the 32 x 8 column kernel for
     * a linear layer's (R, N)) rounded once */
    {OP(BIAS_FWD), "bias_fwd f32 conv", {3, 40, 133}, A1(F32), 0, E},
    {OP(BIAS_FWD), "bias_fwd f32 linear", {53, 70, 1}, A1(F32), 0, E},
    {OP(BIAS_FWD), "bias_fwd f32 per sample", {3, 40, 133}, A1(F32), GC_PER_OUTER, E},
    {OP(BIAS_FWD), "bias_fwd bf16 (b f32)", {3, 40, 133}, A2(BF16, F32), 0, E},
    {OP(BIAS_FWD), "bias_fwd f16 linear (b f16)", {53, 70, 1}, A1(F16), 0, E},
    {OP(BIAS_BWD), "bias_bwd f32 conv", {3, 40, 133}, A1(F32), 0, 1e-12},
    {OP(BIAS_BWD), "bias_bwd f32 conv accumulate", {3, 40, 133}, A1(F32), GC_ACC, 1e-12},
    {OP(BIAS_BWD), "bias_bwd f32 linear", {53, 70, 1}, A1(F32), 0, 1e-12},
    {OP(BIAS_BWD), "bias_bwd f32 linear accumulate", {300, 37, 1}, A1(F32), GC_ACC, 1e-12},
    {OP(BIAS_BWD), "bias_bwd f32 per sample", {3, 40, 133}, A1(F32), GC_PER_OUTER, 1e-12},
    {OP(BIAS_BWD), "bias_bwd f16 -> f32 accumulate", {3, 40, 133}, A2(F16, F32), GC_ACC, 1e-12},
    {OP(BIAS_BWD), "bias_bwd bf16 -> bf16 linear", {53, 70, 1}, A1(BF16), 0, 5e-4},
    /* zero padding {planes, H, W, top, bottom, left, right}: a = padded, b = x; data movement */
    {OP(PAD2D_FWD), "pad2d_fwd f32 (0, 1, 0, 1)", {6, 13, 11, 0, 1, 0, 1}, A1(F32), 0, E},
    {OP(PAD2D_FWD), "pad2d_fwd f32 (1, 2, 3, 0)", {4, 7, 9, 1, 2, 3, 0}, A1(F32), 0, E},
    {OP(PAD2D_FWD), "pad2d_fwd bf16 (x f32)", {6, 13, 11, 0, 1, 0, 1}, A2(BF16, F32), 0, E},
    {OP(PAD2D_BWD), "pad2d_bwd f32 (0, 1, 0, 1)", {6, 13, 11, 0, 1, 0, 1}, A1(F32), 0, E},
    {OP(PAD2D_BWD), "pad2d_bwd f16 (1, 2, 3, 0)", {4, 7, 9, 1, 2, 3, 0}, A1(F16), 0, E},
    /* timestep embedding {B, dim, shift}: a = emb. t * exp(...) up to 999 rad: an ulp of the
     * device's expf moves sin/cos by ~6e-5 */
    {OP(TIMESTEP_EMBED), "timestep_embed f32 SD (flip, shift 0)", {37, 320, 0}, A1(F32), GC_FLIP, 1e-7},
    {OP(TIMESTEP_EMBED), "timestep_embed f32 shift 1", {37, 64, 1}, A1(F32), 0, 1e-7},
    {OP(TIMESTEP_EMBED), "timestep_embed f16 SD", {37, 320, 0}, A1(F16), GC_FLIP, 1e-5},
    {OP(TIMESTEP_EMBED), "timestep_embed bf16", {37, 64, 1}, A1(BF16), 0, 5e-4},
    /* fused MSE {R, C}: a = pred, b = target */
    {OP(MSE_FUSED), "mse_fused f32", {3, 4099}, A1(F32), 0, 1e-9},
    {OP(MSE_FUSED), "mse_fused f16 (target f32)", {3, 4099}, A2(F16, F32), 0, 1e-5},
    {OP(MSE_FUSED), "mse_fused bf16", {5, 300}, A1(BF16), 0, 5e-4},
    /* Gaussian sample {N, C, HW}: a = z, noise; b = moments */
    {OP(GAUSS_SAMPLE), "gauss_sample f32", {2, 4, 300}, A1(F32), 0, 1e-9},
    {OP(GAUSS_SAMPLE), "gauss_sample f32 z over noise", {2, 4, 300}, A1(F32), GC_INPLACE, 1e-9},
    {OP(GAUSS_SAMPLE), "gauss_sample f16 (moments f32)", {2, 4, 300}, A2(F16, F32), 0, 1e-5},
    {OP(GAUSS_SAMPLE), "gauss_sample bf16", {1, 4, 257}, A1(BF16), 0, 5e-4},
    /* nearest 2x upsampling (SD's Upsample2D): copies forward, 4 adds in a fixed order
     * backward: exact */
    {OP(UPSAMPLE2X_FWD), "upsample2x_fwd f32 nearest", UP, A1(F32), GC_NEAREST, E},
    {OP(UPSAMPLE2X_FWD), "upsample2x_fwd bf16 nearest (x f32)", UP, A2(BF16, F32), GC_NEAREST, E},
    {OP(UPSAMPLE2X_FWD), "upsample2x_fwd f16 nearest width 1", UP_W1, A1(F16), GC_NEAREST, E},
    {OP(UPSAMPLE2X_BWD), "upsample2x_bwd f32 nearest", UP, A1(F32), GC_NEAREST, E},
    {OP(UPSAMPLE2X_BWD), "upsample2x_bwd f16 nearest (dx f32)", UP, A2(F16, F32), GC_NEAREST, E},
    {OP(UPSAMPLE2X_BWD), "upsample2x_bwd bf16 nearest width 1", UP_W1, A1(BF16), GC_NEAREST, E},
    /* attention */
    /* memory-efficient attention, {B, H, Tq, Tk, D}: a = q, k, v; b = o, dout; c = dq, dk,
     * dv. Sums of D products and of Tk exponentials in the body's order; expf, logf and FMA
     * contraction differ in the last bits. Self (64x64 latents' head dims 40/80/160), cross
     * to 77 text tokens, causal (CLIP), odd sizes off the 8-lane dot and 32-key tile, the
     * VAE's single 512-wide head, mixed dtypes. */
    {OP(ATTN_FWD), "attn_fwd f32 self D40", {2, 3, 37, 37, 40}, A1(F32), 0, 1e-9},
    {OP(ATTN_FWD), "attn_fwd f32 cross 37x77 D64", {2, 2, 37, 77, 64}, A1(F32), 0, 1e-9},
    {OP(ATTN_FWD), "attn_fwd f32 causal D80", {2, 2, 45, 45, 80}, A1(F32), GC_CAUSAL, 1e-9},
    {OP(ATTN_FWD), "attn_fwd f32 odd D13 T33x65", {1, 3, 33, 65, 13}, A1(F32), 0, 1e-9},
    {OP(ATTN_FWD), "attn_fwd f32 D160", {1, 2, 40, 70, 160}, A1(F32), 0, 1e-9},
    {OP(ATTN_FWD), "attn_fwd f32 one head D512", {1, 1, 33, 33, 512}, A1(F32), 0, 1e-9},
    {OP(ATTN_FWD), "attn_fwd f16 self D80", {1, 2, 70, 70, 80}, A1(F16), 0, 1e-5},
    {OP(ATTN_FWD), "attn_fwd f16 causal odd D24", {2, 1, 35, 35, 24}, A1(F16), GC_CAUSAL, 1e-5},
    {OP(ATTN_FWD), "attn_fwd bf16 cross 37x77 D40", {2, 3, 37, 77, 40}, A1(BF16), 0, 5e-4},
    {OP(ATTN_FWD), "attn_fwd bf16 in, f32 out", {1, 2, 37, 77, 64}, A2(BF16, F32), 0, 1e-9},
    {OP(ATTN_BWD), "attn_bwd f32 self D40", {2, 3, 37, 37, 40}, A1(F32), 0, 1e-9},
    {OP(ATTN_BWD), "attn_bwd f32 cross 37x77 D64", {2, 2, 37, 77, 64}, A1(F32), 0, 1e-9},
    {OP(ATTN_BWD), "attn_bwd f32 causal D80", {2, 2, 45, 45, 80}, A1(F32), GC_CAUSAL, 1e-9},
    {OP(ATTN_BWD), "attn_bwd f32 odd D13 T33x65", {1, 3, 33, 65, 13}, A1(F32), 0, 1e-9},
    {OP(ATTN_BWD), "attn_bwd f32 D160", {1, 2, 40, 70, 160}, A1(F32), 0, 1e-9},
    {OP(ATTN_BWD), "attn_bwd f32 one head D512", {1, 1, 33, 33, 512}, A1(F32), 0, 1e-9},
    {OP(ATTN_BWD), "attn_bwd f16 self D80", {1, 2, 70, 70, 80}, A1(F16), 0, 1e-5},
    {OP(ATTN_BWD), "attn_bwd f16 causal odd D24", {2, 1, 35, 35, 24}, A1(F16), GC_CAUSAL, 1e-5},
    {OP(ATTN_BWD), "attn_bwd bf16 cross 37x77 D40", {2, 3, 37, 77, 40}, A1(BF16), 0, 5e-4},
    {OP(ATTN_BWD), "attn_bwd bf16 in, f32 grads", {1, 2, 37, 77, 64}, {BF16, BF16, F32}, 0, 1e-9},
};
const size_t VL_GC_NCASES = sizeof VL_GC_CASES / sizeof VL_GC_CASES[0];

static const char *const EXTRA[] = {"copy", "upload_async", "sync"};

const char *vl_gc_kind_name(int kind) {
  if (kind >= 0 && kind < VL_OP_COUNT) return vl_op_name((vl_op)kind);
  if (kind >= GC_COPY && kind < GC_KIND_COUNT) return EXTRA[kind - GC_COPY];
  return "?";
}

int vl_gc_kind_parse(const char *name) {
  vl_op op;
  if (!vl_op_parse(name, &op)) return (int)op;
  for (int i = 0; i < GC_KIND_COUNT - GC_COPY; i++)
    if (!strcasecmp(name, EXTRA[i])) return GC_COPY + i;
  return -1;
}
