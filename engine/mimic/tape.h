/* The mimic's storage-level model of PyTorch's autograd (engine/mimic only).
 *
 * A tensor here is a storage: its bytes, its dtype size, its category, a reference count
 * (the Python names the program holds + autograd's saved references + pending gradients) and
 * the node that made it. An op allocates its output (an allocation event), records a node
 * when an input requires grad, with the inputs its derivative formula saves (a reference
 * each, dropped after the node's backward runs). A storage is freed (a free event) when its
 * last reference goes. Views are not tensors: an op that returns a view returns the same id
 * with a new reference.
 *
 * Backward runs the nodes in reverse creation order (what autograd's ready queue does for a
 * program that is one sequence of ops): each node's gradient formula allocates the input
 * gradients its ATen derivative allocates (derivatives.yaml, in the order the generated
 * code computes them), hands each to its input (a second gradient for the same tensor is an
 * out-of-place add, as autograd's InputBuffer does on the CPU; a leaf parameter's first
 * gradient is stolen into .grad, a later one added in place), then drops its saved
 * references and its output's gradient. */
#ifndef VRAMLAB_MIMIC_TAPE_H
#define VRAMLAB_MIMIC_TAPE_H

#include <stdbool.h>
#include <stdint.h>

#include "vramlab/mimic.h"
#include "vramlab/nn.h"

typedef int32_t mt_id; /* 0: none */

/* The derivative formulas the programs need. */
typedef enum {
  MT_BW_MM,       /* linear / mm / addmm: in0 x, in1 W, in2 bias: saves x (if W needs grad) and
                     W (if x does); grads: bias (sum), x (mm), W (mm) */
  MT_BW_MUL,      /* a * b (broadcast): saves b if a needs grad, a if b does; grads a*b-size
                     each, then a sum to a smaller input's size */
  MT_BW_MULS,     /* a * scalar, a / scalar: no saves; grad: one of a's size */
  MT_BW_ADD,      /* a + b, a + scalar: the gradient itself to each input (a sum for a smaller one) */
  MT_BW_POW2,     /* x.pow(2): saves x; grad: pow, mul.Scalar, mul (3 allocations, 2 freed) */
  MT_BW_RSQRT,    /* rsqrt: saves its result; grad as pow's */
  MT_BW_MEAN,     /* mean over the last dim: no saves; grad: div of the input's size */
  MT_BW_CAST,     /* _to_copy to another dtype: no saves; grad: a cast back */
  MT_BW_SILU,     /* silu: saves x; grad: silu_backward */
  MT_BW_NEG,      /* neg: no saves; grad: neg */
  MT_BW_SLICE,    /* a slice (view) of in0 taken by an op: grad: slice_backward (in0's size) */
  MT_BW_CAT,      /* cat: no saves; grads: views of the gradient */
  MT_BW_EXPAND,   /* expand + reshape copy (repeat_kv's clone): grad: a sum to in0's size */
  MT_BW_SDPA,     /* SDPA: saves q, k, v, out, logsumexp (+ mask); grads q, k, v */
  MT_BW_EMBED,    /* embedding: saves the indices; grad: embedding_dense_backward (W's size) */
  MT_BW_LOGSOFTMAX, /* saves its result; grad: one of the input's size */
  MT_BW_NLL,      /* nll_loss: saves target; grad: one of the input's size */
  MT_BW_CONV,     /* convolution: in0 x, in1 W: saves both (one formula); grads
                     convolution_backward: x's, then W's */
  MT_BW_BN,       /* native_batch_norm (training): saves x, weight, save_mean, save_invstd;
                     grads native_batch_norm_backward: x's, weight's, bias's (in2) */
  MT_BW_RELU,     /* relu / relu_: saves its result; grad: threshold_backward */
  MT_BW_POOL,     /* max_pool2d_with_indices: saves x and the indices; grad: one of x's size */
  MT_BW_UPSAMPLE, /* upsample_bilinear2d: no saves; grad: one of x's size */
  MT_BW_DIVS,     /* a / scalar: no saves; grad: div of a's size */
  MT_BW_GN,       /* native_group_norm: saves x (+ mean, rstd through mt_aux); grad
                     native_group_norm_backward: x's (the affine weights frozen) */
  MT_BW_LN,       /* native_layer_norm: as MT_BW_GN, native_layer_norm_backward */
  MT_BW_GELU,     /* gelu: saves x; grad: gelu_backward */
  MT_BW_NEAREST,  /* upsample_nearest2d: no saves; grad: one of x's size */
  MT_BW_MSE,      /* mse_loss: saves both inputs; grad: mse_loss_backward of the first's size */
  MT_BW_SPLIT,    /* chunk(2) of in0 into two views (mt_chunk2): grad: cat of both halves' */
  MT_BW_BMM,      /* bmm(a, b): saves each input the other's gradient needs; grads: b's (bmm), then a's */
  MT_BW_BADDBMM,  /* baddbmm(empty, a, b^T, beta 0, alpha): saves a and b as bmm does; grads: a's
                     (bmm, then mul.Scalar by alpha), then b's (the same) */
  MT_BW_SOFTMAX,  /* _softmax: saves its result; grad: _softmax_backward_data */
  MT_BW_NF4,      /* bitsandbytes' MatMul4Bit: in0 x, in1 the packed NF4 weight (n/2 bytes): saves
                     nothing that is not a parameter; grad: x's, grad_output @ the weight
                     dequantised again (F.dequantize_4bit: its absmax, n/64 fp32, then the
                     weight in grad_output's dtype; each freed after its use) */
} mt_bw;

typedef struct mt_tape mt_tape;

mt_tape *mt_new(vl_mimic_sink sink, void *user);
void mt_free(mt_tape *t);
void mt_phase(mt_tape *t, char phase);
void mt_step(mt_tape *t, int step);
void mt_autocast_exit(mt_tape *t); /* drops the autocast weight cache */

/* A leaf that exists before the step (parameter, buffer, batch) or optimizer state. */
mt_id mt_leaf(mt_tape *t, const char *op, int64_t numel, int esz, int cat, bool requires_grad);
/* x.requires_grad_(True) on a tensor without history (PEFT's enable_input_require_grads on
 * the embedding's output): a leaf whose gradient autograd accumulates; the graph holds it
 * until the backward ends. */
void mt_input_requires_grad(mt_tape *t, mt_id x);
/* A new tensor with no autograd history (masks, rotary tables, temporaries). */
mt_id mt_temp(mt_tape *t, const char *op, int64_t numel, int esz);
/* An op: out = numel x esz from inputs (0-terminated list of up to 4); saves per its formula;
 * `extra`: a second output (SDPA's logsumexp: numel x 4 bytes), returned through *extra.
 * When no input requires grad (torch.no_grad over frozen weights and data: sd-lora's VAE
 * encoder and CLIP in the step; inputs may be 0) it records no node and saves nothing, the
 * formula unused: the output is all there is, freed when its last reference goes. */
mt_id mt_op(mt_tape *t, const char *op, mt_bw bw, int64_t numel, int esz, mt_id a, mt_id b, mt_id c);
/* An in-place op on x (relu_, add_): x's storage under a new name (no bytes, keeps x alive)
 * whose node is the op's, b the other operand (add_) or 0. */
mt_id mt_inplace(mt_tape *t, const char *op, mt_bw bw, mt_id x, mt_id b);
/* Two more outputs of an op that only its node keeps (batch norm's save_mean and save_invstd,
 * max-pool's indices): allocated after out and saved by out's node (or dropped at once when
 * out has none). */
void mt_aux(mt_tape *t, mt_id out, const char *op, int64_t numel, int esz);

/* torch.utils.checkpoint (non-reentrant) around a block: between begin and end nothing is
 * saved (the frame keeps the block's input, x); in backward, before the block's last node
 * runs, fn(ctx, x) runs the block again and what its ops save is attached to the block's
 * nodes in order (the recomputed values, freed as each node lets go of them); the frame lets
 * go of x once the block's first node has run. */
typedef mt_id (*mt_block_fn)(void *ctx, mt_id x);
void mt_ckpt_begin(mt_tape *t, mt_id x);
void mt_ckpt_end(mt_tape *t, mt_block_fn fn, void *ctx);

/* x.chunk(2, dim=-1): two views of x (*lo, *hi), one SplitBackward node whose backward
 * cats both halves' gradients (zeros for a missing one) into one of x's size */
void mt_chunk2(mt_tape *t, mt_id x, mt_id *lo, mt_id *hi);
/* a slice of x (a view: no bytes, keeps x alive; its backward is slice_backward) */
mt_id mt_slice(mt_tape *t, mt_id x, int64_t numel);
/* SDPA: out (q's size) and its logsumexp (lse_numel x 4 bytes); saves q, k, v (mask), out and
 * the logsumexp when any of q, k, v requires grad, else (no_grad) records nothing and lets
 * the logsumexp go at once */
mt_id mt_sdpa(mt_tape *t, const char *op, mt_id q, mt_id k, mt_id v, mt_id mask, int64_t lse_numel);
/* CUDA's flash attention (PyTorch's FlashAttention-2, flash_api.cpp's mha_bwd): what its
 * backward makes beside dq, dk and dv and frees at its return, attached to the node of the SDPA
 * whose output is `out` (nothing without a graph): softmax_d (B·H·Tq rounded up to 128, fp32),
 * dq_accum (B·Tq rounded·H·hd rounded up to 32, or 64 past 128, fp32), and with grouped KV
 * heads dK and dV at every query head (q's dtype) that it then sums to the KV heads. Read from
 * the source, not yet measured on a GPU. */
void mt_flash_bw_buffers(mt_tape *t, mt_id out, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk,
                         int64_t hd);
/* autocast's cast of x to esz: x itself if it already has it; a leaf that requires grad is
 * cast once per autocast region (the weight cache) */
mt_id mt_cast(mt_tape *t, mt_id x, int esz, bool autocast);
/* x is viewed and transposed before use (q, k, v): its gradient comes back non-contiguous and
 * its mm backward copies it first */
void mt_noncontig_grad(mt_tape *t, mt_id x);
void mt_ref(mt_tape *t, mt_id x);
void mt_drop(mt_tape *t, mt_id x);
int mt_esz(const mt_tape *t, mt_id x);
int64_t mt_numel(const mt_tape *t, mt_id x);
bool mt_requires_grad(const mt_tape *t, mt_id x);

/* CUDA: each thread's cuBLAS handle (the main thread's for forward and optimizer,
 * autograd's for backward) takes `bytes` of workspace from the caching allocator at its first
 * matmul and keeps it (PyTorch's getCurrentCUDABlasHandle); 0 (the default): none. */
void mt_blas_workspace(mt_tape *t, int64_t bytes);

/* loss.backward() from the scalar x (ones_like, then every node in reverse order). */
void mt_backward(mt_tape *t, mt_id loss);
/* The loss's name let go: its graph's structure goes with it, and what the graph kept (the
 * leaves of inputs made to require grad, with their .grad).
 * mark = mt_graph_mark() taken before the graphs to keep were built (the current one). */
int mt_graph_mark(const mt_tape *t);
void mt_release_graph(mt_tape *t, int mark);
/* a parameter's .grad (0: None); setting it None drops it */
mt_id mt_grad(const mt_tape *t, mt_id p);
void mt_grad_none(mt_tape *t, mt_id p);
void mt_set_cat(mt_tape *t, mt_id x, int cat);

/* results: live bytes now, the peak and its categories, the events (for the caching
 * allocator's replay: id > 0 allocation of bytes, id < 0 free of -id) */
int64_t mt_live(const mt_tape *t);
void mt_result(const mt_tape *t, vl_mimic_result *r);
typedef struct {
  int32_t id;
  int64_t bytes;
} mt_ev;
const mt_ev *mt_events(const mt_tape *t, int64_t *n);

/* ---- step.c: what every step shares ------------------------------------------------------ */
/* The micro-batches a step replays: every one up to MT_MICRO_MAX, then MT_MICRO_MAX. From the
 * third on each repeats the one before it (the same tensors; the gradients accumulated in place
 * into .grad), so neither the peak nor the allocator's high-water marks move past it
 * (test_mimic: accum 3 and 8 plan the same), and a plan with accum 4096 stays fast. */
#define MT_MICRO_MAX 8
static inline int64_t mt_micro_batches(int64_t accum) { return accum < MT_MICRO_MAX ? accum : MT_MICRO_MAX; }

#define MT_OPT_STATE 4
typedef struct {
  mt_id *train;   /* the trainable parameters, in model.parameters() order */
  int ntrain;
  mt_id *state;   /* AdamW (exp_avg, exp_avg_sq), SGD (momentum_buffer) or Adafactor (exp_avg,
                     exp_avg_sq_row or exp_avg_sq, exp_avg_sq_col, RMS) per parameter: room for
                     MT_OPT_STATE each */
  int64_t *cols;  /* Adafactor: each trainable's last dimension (0: one-dimensional, not factored) */
  bool beta1;     /* Adafactor keeps a first moment (exp_avg) */
  bool has_state; /* created on the first step */
  vl_optimizer opt;
  bool cuda;      /* foreach (CUDA) or single-tensor (CPU) code path */
} mt_optim;
void mt_clip(mt_tape *t, const mt_optim *o);
/* the optimizer's step: torch.optim's AdamW (single-tensor on the CPU, foreach on CUDA) and SGD,
 * transformers' Adafactor (a loop over the parameters on either) */
void mt_optim_step(mt_tape *t, mt_optim *o);
void mt_zero_grad(mt_tape *t, const mt_optim *o);
/* What every peer's one_step ends with after its micro-batches (peer_common.py): phase 'o',
 * clip_grad_norm_ when clipping, the optimizer's step, zero_grad(set_to_none=True), and the
 * last loss's graph released as one_step returns. */
void mt_step_tail(mt_tape *t, mt_optim *o, bool clip);
/* CUDA: the tape's events through the caching allocator (capacity 0: unlimited) into
 * r->max_allocated / max_reserved, r->oom when it ran out. */
vl_status mt_replay_cuda(const mt_tape *t, uint64_t capacity, vl_mimic_result *r, char *why, size_t whyn);

#endif
