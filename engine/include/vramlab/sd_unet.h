/* Stable Diffusion 1.5's U-Net (diffusers' UNet2DConditionModel) as an engine model, forward
 * and backward, LoRA-trainable (diffusers' train_text_to_image_lora.py: peft LoRA on to_q,
 * to_k, to_v and to_out.0 of every attn1 and attn2), with activation checkpointing per
 * ResnetBlock2D and per Transformer2DModel. It predicts the noise of noisy latents; the
 * DDPM noising and the MSE loss are the caller's (a vl_model wrapper).
 *
 * Architecture (SD 1.5's config; the other presets keep the structure): conv_in 3x3 ->
 * time embedding (sinusoidal, flip_sin_to_cos, shift 0; linear, SiLU, linear) -> down blocks
 * (layers x [ResnetBlock2D (+ Transformer2DModel)], then a stride-2 3x3 conv except in the
 * last) -> mid block (resnet, transformer, resnet) -> up blocks (layers + 1 x [resnet on
 * cat(h, skip) (+ transformer)], then nearest 2x + 3x3 conv except in the last) ->
 * GroupNorm, SiLU, conv_out 3x3. Every skip (conv_in's output, each resnet/transformer pair's
 * output, each downsampler's output) is popped by one up resnet.
 *
 * Memory: frozen weights are VL_MEM_FROZEN in `weights` storage, named exactly as the
 * state_dict keys (tests/fixtures/sd15_params_unet.txt) with their PyTorch shapes; LoRA
 * factors are trainable fp32 vl_params (with an `acts`-dtype working copy under AMP,
 * nn/param.c), named "<linear>.lora_A.weight" (r, in) and "<linear>.lora_B.weight" (out, r)
 * as peft's get_peft_model_state_dict writes them. A training forward keeps what backward
 * needs in VL_MEM_ACTS; backward frees it as it consumes it.
 *
 * What backward computes: LoRA gradients (accumulated, so micro-batches sum), and dL/dcontext
 * when ctx_grad is on. No gradient flows into the time embedding (frozen, timesteps are not
 * learned), and nothing is computed before the first gradient sink in forward order (the
 * first transformer with LoRA, or with ctx_grad the first transformer): conv_in and
 * down_blocks.0.resnets.0 run forward only and keep nothing, and the first transformer
 * computes no gradient for its input (no GroupNorm, proj_in or norm1 backward). */
#ifndef VRAMLAB_SD_UNET_H
#define VRAMLAB_SD_UNET_H

#include "vramlab/attention.h"
#include "vramlab/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VL_SD_UNET_MAX_BLOCKS 4

typedef struct {
  /* architecture: diffusers UNet2DConditionModel's config */
  int64_t in_ch, out_ch;                 /* 4, 4 */
  int n_blocks;                          /* len(block_out_channels): 4 */
  int64_t ch[VL_SD_UNET_MAX_BLOCKS];     /* block_out_channels: 320, 640, 1280, 1280 */
  bool down_attn[VL_SD_UNET_MAX_BLOCKS]; /* CrossAttnDownBlock2D (true) or DownBlock2D, per
                                            down block: true, true, true, false */
  bool up_attn[VL_SD_UNET_MAX_BLOCKS];   /* CrossAttnUpBlock2D or UpBlock2D, in up order:
                                            false, true, true, true */
  int layers;                            /* layers_per_block: 2 (up blocks have layers + 1) */
  int64_t heads;                         /* attention heads at every level: 8 (SD 1.5's
                                            `attention_head_dim: 8` is the head count) */
  int64_t groups;                        /* norm_num_groups: 32 (every GroupNorm) */
  float norm_eps;                        /* resnets' and conv_norm_out's GroupNorm: 1e-5 */
  float attn_norm_eps;                   /* Transformer2DModel's GroupNorm: 1e-6 */
  float ln_eps;                          /* BasicTransformerBlock's LayerNorms: 1e-5 */
  int64_t sample;                        /* latent side of the scale: 64 (512x512 images) */
  int64_t ctx_len, ctx_dim;              /* text context: 77 x 768 */
  /* precision, training */
  vl_dtype weights;                      /* frozen storage: fp32, fp16, bf16 */
  vl_dtype acts;                         /* activations and LoRA working copies: fp32,
                                            fp16, bf16 (AMP: fp32 LoRA masters) */
  int lora_rank;                         /* 0: nothing trainable */
  float lora_alpha;                      /* LoRA scale = alpha / rank */
  vl_attn_impl attn;                     /* classic or efficient attention */
  bool checkpoint;                       /* per resnet and per transformer */
  bool ctx_grad;                         /* backward computes dL/dcontext (a trainable text
                                            encoder); off by default */
} vl_sd_unet_cfg;

/* "full": SD 1.5 exactly (859,520,964 frozen parameters), 64x64 latents, context 77x768.
 * "small": widths 64/128/256/256, 16 groups, 8 heads, 32x32 latents, context 77x256.
 * "tiny": widths 32/64/64/64, 8 groups, 4 heads, 16x16 latents, context 16x32.
 * All three: 4 blocks of 2 layers, 16 transformers. Defaults: fp32 weights and
 * activations, LoRA rank 4 alpha 4 (the script's --rank 4, lora_alpha = rank), efficient
 * attention, no checkpointing, no context gradient. 0 on success, -1 for an unknown scale. */
int vl_sd_unet_preset(const char *scale, vl_sd_unet_cfg *out);

typedef struct vl_sd_unet vl_sd_unet;

/* Make the model in c's arena: frozen weights initialised as PyTorch does (U(-a, a),
 * a = 1/sqrt(fan_in), norms 1 and 0), LoRA A ~ N(0, 1/r^2) and B = 0 (peft's "gaussian"
 * init, the script's), all seeded; nothing is written on a plan context. */
vl_status vl_sd_unet_create(vl_ctx *c, const vl_sd_unet_cfg *cfg, uint64_t seed,
                            vl_sd_unet **out);
void vl_sd_unet_destroy(vl_sd_unet *m); /* NULL is fine; frees a step in flight too */
const vl_sd_unet_cfg *vl_sd_unet_config(const vl_sd_unet *m);
vl_ctx *vl_sd_unet_ctx(const vl_sd_unet *m);

/* ---- parameters ---------------------------------------------------------------------- */
/* Every parameter, frozen ones first in state_dict order, then the LoRA factors (A then B
 * of each adapted linear, in state_dict order of the linears): index i < n. */
int vl_sd_unet_n_params(const vl_sd_unet *m);
vl_param *vl_sd_unet_param_at(vl_sd_unet *m, int i);
/* Its PyTorch shape into shape[0..ndim) (conv weights (K, C, R, S), linears (out, in),
 * vectors (n)); returns ndim, 0 for an index out of range. */
int vl_sd_unet_param_shape(const vl_sd_unet *m, int i, int64_t shape[VL_MAX_DIMS]);
/* The parameter whose state_dict key is `name`, or NULL. */
vl_param *vl_sd_unet_param(vl_sd_unet *m, const char *name);
/* The trainable ones (LoRA), contiguous: for vl_params_apply and optimizer state. */
vl_param *vl_sd_unet_trainable(vl_sd_unet *m, int *n);
/* total (frozen + LoRA), trainable (LoRA), and frozen elements by module: conv_in,
 * time_embedding, down_blocks, mid_block, up_blocks, conv_out (with conv_norm_out). */
void vl_sd_unet_counts(const vl_sd_unet *m, vl_param_counts *out);

/* ---- one step --------------------------------------------------------------------------- */
/* Forward of noisy latents x (B, in_ch, h, w) (h, w multiples of 2^(n_blocks-1)), timesteps
 * t (B) VL_I32 and the text context ctx (B, L, ctx_dim), device tensors of c in any float
 * dtype (x and ctx are converted to `acts` when they differ). pred (B, out_ch, h, w) in the
 * `acts` dtype is allocated here in VL_MEM_TEMP and belongs to the caller. train: keep what
 * backward needs (VL_MEM_ACTS); ctx must then stay alive and unchanged until backward when
 * it is already in the `acts` dtype (it is read, not copied). Without train nothing is kept.
 * On failure everything the step made is freed. */
vl_status vl_sd_unet_forward(vl_sd_unet *m, const vl_tensor *x, const vl_tensor *t,
                             const vl_tensor *ctx, bool train, vl_tensor *pred);
/* Backward of the last training forward from dpred = dL/dpred (B, out_ch, h, w), any float
 * dtype (e.g. pred itself turned into the gradient by MSE_FUSED; not freed here): LoRA
 * gradients accumulate into their grad tensors; with ctx_grad, dL/dctx is left in
 * vl_sd_unet_dctx. Frees everything the forward kept, also on failure. */
vl_status vl_sd_unet_backward(vl_sd_unet *m, const vl_tensor *dpred);
/* dL/dctx (B, L, ctx_dim) fp32 (VL_MEM_TEMP) of the last backward with ctx_grad, or NULL;
 * it stays until the next forward, vl_sd_unet_release or destroy. */
const vl_tensor *vl_sd_unet_dctx(const vl_sd_unet *m);
/* Frees whatever a step holds (a forward without its backward, dctx). */
void vl_sd_unet_release(vl_sd_unet *m);

/* ---- optimizer ------------------------------------------------------------------------- */
/* Optimizer state of every trainable parameter (zeroed). */
vl_status vl_sd_unet_alloc_optim(vl_sd_unet *m, const vl_optim_cfg *oc);
/* vl_params_apply over the trainable parameters: unscale, overflow check, clip, update,
 * zero gradients. */
vl_status vl_sd_unet_apply(vl_sd_unet *m, const vl_optim_cfg *oc, float clip, vl_scaler *s,
                           bool *skipped, double *grad_norm);
vl_status vl_sd_unet_zero_grads(vl_sd_unet *m);

#ifdef __cplusplus
}
#endif
#endif
