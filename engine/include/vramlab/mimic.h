/* A plan that mimics PyTorch: the allocations and frees PyTorch's own training step makes,
 * replayed without running it (`vramlab plan CASE --mimic pytorch`).
 *
 * The engine's plan answers for the engine's step. PyTorch's step keeps other tensors:
 * autograd's saved inputs as each ATen op saves them, gradients created in backward and set
 * to None by zero_grad, optimizer state created on the first step, autocast's casts and its
 * weight cache, Hugging Face's fp32 upcast of the logits, the caching allocator's 512-byte
 * blocks and segments. A mimic walks the framework's code path op by op over a storage-level
 * autograd model (engine/mimic/tape.c: each op's outputs, what its backward formula saves and
 * allocates, the reference that keeps a storage alive) and reports:
 *   - peak_bytes: the highest sum of live storage bytes (exact nbytes: what PyTorch's
 *     MemTracker and a malloc count on the CPU see), with categories at that moment;
 *   - max_allocated / max_reserved: what torch.cuda.max_memory_allocated() and
 *     max_memory_reserved() would read (the same events through the caching allocator's
 *     rules, vramlab/cachealloc.h) for the CUDA device's code path.
 * Learned from PyTorch itself: tools/peers/torch_trace.py records every op's allocations on
 * fake tensors; tests/test_mimic.c compares the mimic with the committed traces. */
#ifndef VRAMLAB_MIMIC_H
#define VRAMLAB_MIMIC_H

#include <stdbool.h>
#include <stdint.h>

#include "vramlab/core.h"
#include "vramlab/mistral.h"
#include "vramlab/resunet.h"
#include "vramlab/sd_encoders.h"
#include "vramlab/sd_unet.h"

/* MemTracker's categories (torch.distributed._tools.mem_tracker._MemRefType), OTH holding the
 * batch. */
typedef enum { VL_MC_PARAM, VL_MC_BUFFER, VL_MC_GRAD, VL_MC_ACT, VL_MC_TEMP, VL_MC_OPT, VL_MC_OTH, VL_MC_N } vl_mimic_cat;
const char *vl_mimic_cat_name(int cat);

typedef enum {
  VL_MIMIC_CPU,  /* PyTorch's CPU code path (single-tensor optimizer, SDPA's CPU kernel) */
  VL_MIMIC_CUDA, /* its CUDA code path (foreach optimizer and clip) + the caching allocator */
} vl_mimic_device;

/* One event of the replay: bytes > 0 an allocation, < 0 a free; phase 'f' forward, 'b'
 * backward, 'o' clip/optimizer/zero_grad. */
typedef struct {
  const char *op; /* the ATen op that allocated it (for a free: the op it was allocated by) */
  char phase;
  int64_t bytes;
} vl_mimic_event;
typedef void (*vl_mimic_sink)(void *user, const vl_mimic_event *e);

typedef struct {
  int64_t peak_bytes;          /* highest live bytes, everything counted (batch included) */
  int64_t cat[VL_MC_N];        /* categories at that peak */
  char peak_phase;             /* 'f', 'b' or 'o' */
  char peak_op[48];            /* the op whose allocation made the peak */
  int peak_step;               /* which traced step (0-based) */
  int64_t base_bytes;          /* live before the first step: parameters, buffers, batch */
  int64_t end_forward_bytes;   /* live at the end of the last step's (last micro-batch's) forward */
  int64_t max_allocated;       /* CUDA: caching allocator's peak allocated (512-byte blocks) */
  int64_t max_reserved;        /* CUDA: its peak reserved (segments) */
  bool oom;                    /* CUDA with a capacity: the caching allocator ran out (the
                                  peaks are those reached before it did) */
  int64_t n_events;
  double seconds;              /* the mimic's own time */
} vl_mimic_result;

/* Hugging Face's MistralForCausalLM (LlamaForCausalLM when there is no sliding window in
 * play, Qwen2ForCausalLM with qkv_bias), SDPA attention, use_cache off, PEFT LoRA on the
 * targets (lora_dropout 0, adapters in fp32), gradient checkpointing per decoder layer
 * (use_reentrant=False, with PEFT's enable_input_require_grads), autocast for fp16/bf16
 * compute with GradScaler for fp16, the clip by global norm, AdamW, SGD or transformers'
 * Adafactor, zero_grad(set_to_none=True), and an NF4 base as bitsandbytes' Linear4bit (NF4,
 * double quantisation; the weight dequantised in each forward and backward; PEFT's bitsandbytes
 * LoRA layer, which clones the base output and casts x to fp32 except under CUDA's autocast):
 * the step
 * tools/peers/llm_lora_peer.py runs. `steps` steps (2: the first creates the optimizer's
 * state, the peak is over both). traced: mirror what PyTorch does on fake tensors (the
 * transformers causal mask is built explicitly and SDPA gets it, as MemTracker and
 * torch_trace.py see); off: the real run's path (no mask tensor, is_causal).
 * VL_ERR_INVALID for a step the engine refuses too (an NF4 base without LoRA). Known gaps: on
 * CUDA bitsandbytes (0.50) picks a fused 4-bit matmul for some shapes at up to 1536 rows, which
 * allocates no dequantised weight in the forward: planned as its unfused path, one weight's
 * transient copy too much there (the backward dequantises either way); never past 1536 rows, nor
 * past 512 for a weight of 4 Mi elements or more (every 7B weight). On CUDA an fp32 step with
 * grouped KV heads runs SDPA's math kernel in PyTorch 2.11 (flash takes fp16/bf16 only, the
 * memory-efficient kernel no grouped heads), which keeps the (B, H, T, T) attention: planned as
 * that kernel (sdpa_math below; test_mimic holds it to a CPU trace of it). */
typedef struct {
  vl_mistral_model_cfg model;
  int64_t batch, seq, accum;
  int steps;
  vl_mimic_device device;
  bool traced;
  /* SDPA's math kernel (sdpa_kernel(SDPBackend.MATH) on the CPU: the traces). The CUDA path
   * takes it by itself for an fp32 step with grouped KV heads, as PyTorch 2.11 does */
  bool sdpa_math;
  /* CUDA: the bytes the caching allocator may reserve (the card less the CUDA context, or
   * a per-process fraction); 0 unlimited. Past it the allocator frees its cached segments
   * and retries, as PyTorch does, then reports out of memory (oom). */
  uint64_t capacity;
  /* CUDA: the card's compute capability (major), which sizes the cuBLAS workspace each
   * thread's handle takes from the caching allocator (vl_mimic_cublas_workspace); 0: the
   * RTX 4090's 8, the 24 GB card the ladders plan for */
  int cuda_cc_major;
} vl_mimic_llm_cfg;

/* The workspace PyTorch's cuBLAS handle takes per thread (and stream) from the caching
 * allocator, counted by max_memory_allocated and kept for the process's life: 32 MiB on
 * Hopper (compute capability 9), else CUBLAS_WORKSPACE_CONFIG's default ":4096:2:16:8"
 * (2 x 4 MiB + 8 x 16 KiB = 8,519,680 bytes). The forward and the optimizer run on the main
 * thread, the backward on autograd's: two of them in a training step. Seen on an H200:
 * 67,108,864 bytes held beside the parameters and optimizer state (reports/gpu). */
int64_t vl_mimic_cublas_workspace(int cc_major);

vl_status vl_mimic_llm(const vl_mimic_llm_cfg *cfg, vl_mimic_result *out, vl_mimic_sink sink, void *user,
                       char *why, size_t whyn);

/* The seg-ckpt step in PyTorch (tools/peers/seg_peer.py): the ResNet U-Net with torchvision's
 * Bottleneck blocks, NCHW, pixel cross-entropy on fp32 logits, autocast + GradScaler for
 * fp16/bf16, torch.utils.checkpoint (non-reentrant) around every bottleneck, ReLU in place or
 * not, AdamW or SGD, gradients set to None. */
typedef struct {
  vl_resunet_cfg model;
  vl_dtype compute;
  bool checkpoint, relu_inplace;
  vl_optimizer optim;
  float clip;
  int64_t batch, accum;
  int steps;
  vl_mimic_device device;
  uint64_t capacity; /* as vl_mimic_llm_cfg's */
} vl_mimic_resunet_cfg;
vl_status vl_mimic_resunet(const vl_mimic_resunet_cfg *cfg, vl_mimic_result *out, vl_mimic_sink sink, void *user,
                           char *why, size_t whyn);

/* The sd-lora step in PyTorch (tools/peers/sd_lora_peer.py): diffusers' UNet2DConditionModel at
 * the engine's dimensions (model: its architecture, `weights`/`acts` the rung's precision,
 * lora_rank/alpha, attn, checkpoint), PEFT LoRA on to_q/to_k/to_v/to_out.0 of every attention
 * (fp32 factors), DDPMScheduler.add_noise, F.mse_loss on the noise, AdamW on the factors, the
 * clip, gradients set to None. Mimicked: the cached rungs (latents and text embeddings
 * given) and the uncached ones (encoders_in_step: in every micro-batch, under no_grad,
 * diffusers' AutoencoderKL encoder + quant_conv, latent_dist.sample() x scaling factor, and
 * transformers' CLIPTextModel's last_hidden_state, from images and token ids; nothing of
 * theirs kept for backward), fp32 or fp16/bf16 autocast (+ GradScaler for fp16), per-resnet
 * and per-transformer-block checkpointing or none, SDPA attention (AttnProcessor2_0; CLIP's
 * "sdpa") or classic (AttnProcessor: baddbmm, softmax, bmm; CLIP's "eager" with its causal
 * mask), on PyTorch's CPU code path (held op by op to the traces of fp32 and fp16,
 * checkpointing off and on, bf16, both attentions, cached and uncached) and its CUDA one
 * (foreach AdamW, autocast's fp32 norms and exp, flash / memory-efficient attention, the
 * cuBLAS workspaces, the caching allocator: not held to a trace, never run against a GPU).
 * VL_ERR_UNSUPPORTED with "not mimicked: ..." in *why for the rest: optimizers other than
 * AdamW, a frozen base whose dtype is not the compute dtype. */
typedef struct {
  vl_sd_unet_cfg model;
  /* an uncached rung: the VAE encoder and CLIP under no_grad. Their architecture is read from
   * vae (in_ch, n_levels, ch, layers_per_block, groups, latent_ch, mid_attn, image) and text
   * (the CLIP text encoder's vocab, dim, n_layers, n_heads, ffn, n_pos); their precision and
   * attention are the U-Net's (model.weights, model.attn), as the peer builds them. The VAE's latent side must be model.sample, CLIP's width model.ctx_dim and
   * model.ctx_len <= n_pos (the tokens' length). */
  bool encoders_in_step;
  vl_sd_vae_cfg vae;
  vl_sd_clip_cfg text;
  vl_optimizer optim;
  float clip;
  int64_t batch, accum;
  int steps;
  vl_mimic_device device;
  uint64_t capacity;  /* as vl_mimic_llm_cfg's */
  int cuda_cc_major;  /* as vl_mimic_llm_cfg's */
  bool traced;        /* what PyTorch does on fake tensors (MemTracker, torch_trace.py): F.mse_loss's
                         output is a storage of its own; off, the real run's: the mean is taken in
                         the unreduced buffer, which the loss keeps (the traces named -real) */
} vl_mimic_sd_unet_cfg;
vl_status vl_mimic_sd_unet(const vl_mimic_sd_unet_cfg *cfg, vl_mimic_result *out, vl_mimic_sink sink, void *user,
                           char *why, size_t whyn);

#endif
