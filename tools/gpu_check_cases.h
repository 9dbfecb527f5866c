/* The cases of vramlab-gpu-check as data (docs/architecture.md "The CUDA backend must be verifiable
 * without a GPU", point 3): per case an operation (vramlab/ops.h, or one of the backend
 * checks below), its shape, its dtypes, flags and the normalised-MSE limit of every output
 * against the CPU backend. tools/gpu_check.c builds the inputs and arguments per operation
 * and runs each case on both backends; tests/test_gpu_check_table.c checks that every
 * operation has a case. */
#ifndef VRAMLAB_GPU_CHECK_CASES_H
#define VRAMLAB_GPU_CHECK_CASES_H

#include <stddef.h>

#include "vramlab/ops.h"

/* Checks of the backend that are not operations (copies, sync), after the operations. */
enum { GC_COPY = VL_OP_COUNT, GC_UPLOAD_ASYNC, GC_SYNC, GC_KIND_COUNT };

/* Flags: variants of an operation's call. */
enum {
  GC_INPLACE = 1 << 0,  /* the output aliases an input (softmax, relu, bn_eval, bn_bwd,
                         * act, geglu_bwd, gauss_sample) */
  GC_INVERSE = 1 << 1,  /* rope: rotate by -theta */
  GC_BACK = 1 << 2,     /* permute: (B,H,T,D) -> (B,T,H,D) */
  GC_NO_DW = 1 << 3,    /* rmsnorm_bwd: frozen weight, dw NULL */
  GC_NO_STATS = 1 << 4, /* bn_fwd_train: no running statistics */
  GC_NO_GRADS = 1 << 5, /* bn_bwd, groupnorm_bwd, layernorm_bwd: no dgamma/dbeta */
  GC_ACC = 1 << 6,      /* chan_copy, conv_bwd_weight, norm bwd (dx), bias_bwd: accumulate */
  GC_NONFINITE = 1 << 7, /* sumsq: a NaN and an Inf in the input, both sides must see them */
  GC_TA = 1 << 8,       /* gemm: op(A) = A^T */
  GC_TB = 1 << 9,       /* gemm: op(B) = B^T */
  GC_BATCHED = 1 << 10, /* gemm: 3 batches, padded leading dims, offsets and strides */
  GC_NO_M = 1 << 11,    /* adafactor: no first moment (beta1 = 0) */
  GC_PINNED = 1 << 12,  /* upload_async: from pinned host memory */
  GC_B0 = 1 << 13,      /* axpby: b = 0 over a NaN-filled y (must be ignored) */
  GC_FULL = 1 << 14,    /* softmax: no causal mask */
  GC_NEAREST = 1 << 15, /* upsample2x: nearest instead of bilinear */
  GC_CAUSAL = 1 << 16,  /* attn_fwd/bwd: causal mask (Tq == Tk) */
  GC_PER_OUTER = 1 << 17, /* bias_fwd/bwd: a bias per (outer, C) (the time embedding) */
  GC_FLIP = 1 << 18,    /* timestep_embed: flip_sin_to_cos, [cos, sin] (SD) */
};

/* Limits: bit-identical for data movement; otherwise the last-bit differences of the math
 * libraries (expf, FMA contraction, summation order) after rounding to the storage dtype:
 * 1 ulp of fp16 is 2^-11 relative, of bf16 2^-8. */
#define GC_EXACT 0.0

/* Shapes, d[] per kind:
 *   copy, upload_async, zero, convert, axpby, swiglu_*, sumsq, adamw, sgd, relu_*: {n}
 *   embed_fwd/bwd: {V, C, R}            rmsnorm_fwd/bwd: {R, C}
 *   rope, permute: {B, T, H, D}          softmax_fwd/bwd: {rows, T}
 *   xent_fused: {R, V}                   adafactor: {R, C} (R = 1: a vector)
 *   gemm: {M, N, K}                      bn_*: {N, C, HW}
 *   maxpool_fwd/bwd: {planes, H, W, k, stride, pad, P, Q}
 *   upsample2x_fwd/bwd: {planes, H, W}   xent_pix: {N, K, HW}
 *   chan_copy: {N, yC, xC, HW, y_c0, x_c0, nc}
 *   conv_*: {N, C, H (= W), K, R (= S), stride, pad, dil}
 *   groupnorm_fwd/bwd: {N, C, HW, G}    layernorm_fwd/bwd: {R, C}
 *     (a = x/y/dx/dy, b = gamma/beta, c = dgamma/dbeta)
 *   act_fwd/bwd: {n, act (a vl_act)}   geglu_fwd/bwd: {R, F}
 *   bias_fwd/bwd: {outer, C, inner}    pad2d_fwd/bwd: {planes, H, W, top, bottom, left, right}
 *   timestep_embed: {B, dim, shift}    mse_fused: {R, C}    gauss_sample: {N, C, HW}
 *   attn_fwd/bwd: {B, H, Tq, Tk, D} (a = q, k, v; b = o, dout; c = dq, dk, dv)
 * Dtypes dt[3] (a, b, c) per kind: the tensors each plays, in gpu_check.c's builders. */
typedef struct {
  int kind;          /* a vl_op, or GC_COPY.. */
  const char *name;  /* unique, printed */
  int64_t d[8];
  vl_dtype dt[3];
  unsigned flags;
  double limit;      /* normalised MSE of every output */
} vl_gc_case;

extern const vl_gc_case VL_GC_CASES[];
extern const size_t VL_GC_NCASES;

/* "gemm", ..., "copy", "upload_async", "sync" */
const char *vl_gc_kind_name(int kind);
int vl_gc_kind_parse(const char *name); /* -1 when unknown */

#endif
