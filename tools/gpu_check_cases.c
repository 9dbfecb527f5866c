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
    {OP(SOFTMAX_CAUSAL_FWD), "softmax_causal_fwd f32", {102, 17}, A1(F32), 0, 1e-9},
    {OP(SOFTMAX_CAUSAL_FWD), "softmax_causal_fwd f32 in place", {102, 17}, A1(F32), GC_INPLACE, 1e-9},
    {OP(SOFTMAX_CAUSAL_FWD), "softmax_causal_fwd f16", {102, 17}, A1(F16), 0, 1e-5},
    {OP(SOFTMAX_CAUSAL_FWD), "softmax_causal_fwd bf16 (P f32)", {102, 17}, A2(BF16, F32), 0, 1e-9},
    {OP(SOFTMAX_CAUSAL_BWD), "softmax_causal_bwd f32", {52, 13}, A1(F32), 0, 1e-9},
    {OP(SOFTMAX_CAUSAL_BWD), "softmax_causal_bwd f32 in place", {52, 13}, A1(F32), GC_INPLACE, 1e-9},
    {OP(SOFTMAX_CAUSAL_BWD), "softmax_causal_bwd f16", {52, 13}, A1(F16), 0, 1e-5},
    {OP(SOFTMAX_CAUSAL_BWD), "softmax_causal_bwd bf16", {52, 13}, A1(BF16), 0, 5e-4},
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
    {OP(CONV_BWD_DATA), "conv_bwd_data f32 3x3/1", CONV_3, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_DATA), "conv_bwd_data f32 3x3/2", CONV_3S2, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_DATA), "conv_bwd_data f32 3x3 dil 2", CONV_DIL, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_DATA), "conv_bwd_data f32 1x1/2", CONV_1S2, A1(F32), 0, 1e-6},
    {OP(CONV_BWD_DATA), "conv_bwd_data f16 3x3/2", CONV_3S2, {F16, F16, F32}, 0, 1e-5},
    {OP(CONV_BWD_DATA), "conv_bwd_data bf16 1x1/2", CONV_1S2, {BF16, BF16, F32}, 0, 5e-4},
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
