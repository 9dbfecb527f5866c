/* Stable Diffusion 1.5's two encoders as engine models: the VAE encoder (diffusers
 * AutoencoderKL's `encoder` + `quant_conv`, then the diagonal Gaussian sample scaled by
 * 0.18215), forward only, and the CLIP ViT-L/14 text encoder (transformers CLIPTextModel:
 * last_hidden_state, after final_layer_norm), frozen by default and LoRA-trainable (kohya's
 * train_network.py trains it beside the U-Net by default).
 *
 * Weights are frozen vl_params (VL_MEM_FROZEN) named exactly as the PyTorch state_dict keys
 * (tests/fixtures/sd15_params_{vae_encoder,text_encoder}.txt), with their PyTorch shapes
 * beside them, so real or reference weights load by name (vl_param_load). Every
 * intermediate of a forward that does not train is VL_MEM_TEMP and is freed as soon as it is
 * consumed, so the arena's peak is the largest live set of the forward (three 128-channel
 * 512x512 maps at the first VAE level); a failed forward (OOM) frees everything it made.
 * Outputs are allocated by the forward and belong to the caller.
 *
 * Precision: weights stored in `weights` (fp32/fp16/bf16), activations in `acts`, outputs in
 * `out`; every op accumulates in fp32. Attention: `attn` picks vl_attention_fwd's classic
 * (materialised scores) or efficient (tiled) implementation. */
#ifndef VRAMLAB_SD_ENCODERS_H
#define VRAMLAB_SD_ENCODERS_H

#include "vramlab/attention.h"
#include "vramlab/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- parameter tables (engine/models/sd_params.c) ------------------------------------- */
/* How a parameter is initialised (seeded, on a computing context): U(-a, a), N(0, a^2), all
 * ones or all zeros. The models follow PyTorch's defaults: a = 1/sqrt(fan_in) for the
 * weight and bias of a convolution or a linear, norms 1 and 0, embeddings N(0, 0.02^2). */
typedef enum { VL_SD_INIT_UNIFORM = 0, VL_SD_INIT_NORMAL, VL_SD_INIT_ONE, VL_SD_INIT_ZERO } vl_sd_init;

/* A parameter's PyTorch shape (conv weights (K, C, R, S), linears (out, in), vectors (n))
 * and its initialisation. */
typedef struct {
  int ndim;
  int64_t d[VL_MAX_DIMS];
  vl_sd_init init;
  float a;
} vl_sd_pinfo;

/* Frozen parameters in state_dict order: p[i].name is the key, info[i] its PyTorch shape
 * (p[i].rows = d[0], p[i].cols = the product of the rest). */
typedef struct {
  vl_param *p;
  vl_sd_pinfo *info;
  int n, cap;
} vl_sd_params;

/* Appends a frozen parameter (VL_MEM_FROZEN) of `dtype` storage named `name`. */
vl_status vl_sd_params_add(vl_ctx *c, vl_sd_params *t, const char *name, const vl_sd_pinfo *info,
                           vl_dtype dtype);
/* Frees every parameter (newest first) and the table. */
void vl_sd_params_free(vl_ctx *c, vl_sd_params *t);
/* Index of the parameter called `name`, or -1. */
int vl_sd_params_find(const vl_sd_params *t, const char *name);
/* Total elements. */
int64_t vl_sd_params_count(const vl_sd_params *t);
/* Seeded values on c following each parameter's vl_sd_init (nothing on a plan context). */
vl_status vl_sd_params_init(vl_ctx *c, vl_sd_params *t, uint64_t seed);

/* ---- the VAE encoder ------------------------------------------------------------------ */
#define VL_SD_VAE_MAX_LEVELS 6

typedef struct {
  /* architecture: diffusers AutoencoderKL's encoder config */
  int64_t in_ch;              /* 3 */
  int n_levels;               /* len(block_out_channels): 4 */
  int64_t ch[VL_SD_VAE_MAX_LEVELS]; /* block_out_channels: 128, 256, 512, 512 */
  int layers_per_block;       /* ResnetBlock2Ds per DownEncoderBlock2D: 2 */
  int64_t groups;             /* norm_num_groups: 32 (every GroupNorm) */
  int64_t latent_ch;          /* 4; conv_out and quant_conv make 2 x latent_ch moments */
  bool mid_attn;              /* mid_block_add_attention (one head of all channels): true */
  float eps;                  /* every GroupNorm: 1e-6 */
  float scale;                /* scaling_factor of the sample: 0.18215 */
  int64_t image;              /* the scale's input side (plans, benches): 512 */
  /* precision and implementation */
  vl_dtype weights;           /* frozen storage: fp32, fp16, bf16 */
  vl_dtype acts;              /* activations: fp32, fp16, bf16 */
  vl_dtype out;               /* z and the moments: fp32, fp16, bf16 */
  vl_attn_impl attn;
} vl_sd_vae_cfg;

/* "full": SD 1.5 exactly (128/256/512/512, 2 resnets a level, 32 groups, 512x512);
 * "small": 32/64/128/128, 2 resnets a level, 8 groups, 128x128;
 * "tiny": 8/16/32/32, 1 resnet a level, 4 groups, 64x64.
 * All fp32 weights, activations and outputs, efficient attention. 0 on success. */
int vl_sd_vae_preset(const char *scale, vl_sd_vae_cfg *out);

typedef struct vl_sd_vae vl_sd_vae;

/* Make the encoder's frozen weights in c's arena, seeded (vl_sd_params_init). */
vl_status vl_sd_vae_create(vl_ctx *c, const vl_sd_vae_cfg *cfg, uint64_t seed, vl_sd_vae **out);
void vl_sd_vae_destroy(vl_sd_vae *m); /* NULL is fine */
const vl_sd_vae_cfg *vl_sd_vae_config(const vl_sd_vae *m);
vl_sd_params *vl_sd_vae_params(vl_sd_vae *m);
/* The parameter whose state_dict key is `name`, or NULL. */
vl_param *vl_sd_vae_param(vl_sd_vae *m, const char *name);
int64_t vl_sd_vae_n_params(const vl_sd_vae *m);
/* Latent side of an input side (each downsampler: pad (0, 1) then a stride-2 3x3 conv):
 * 512 -> 64 for SD 1.5. 0 when the input is too small. */
int64_t vl_sd_vae_latent_side(const vl_sd_vae *m, int64_t side);

/* Encode images (B, in_ch, H, W) (any float dtype; converted to the activation dtype when
 * it differs). With z: z (B, latent_ch, h, w) = scale * (mean + exp(logvar / 2) * noise),
 * noise (B, latent_ch, h, w) N(0, 1) (any float dtype) from the batch. With moments: the
 * moments (B, 2 latent_ch, h, w) (mean in channels [0, latent_ch), log-variance unclamped
 * after it), what a latent cache stores. z and moments (either may be NULL, not both) are
 * allocated here in cfg.out dtype and category out_cat and belong to the caller. On a plan
 * context the tensors carry shapes only. */
vl_status vl_sd_vae_encode(vl_sd_vae *m, const vl_tensor *images, const vl_tensor *noise,
                           vl_tensor *z, vl_tensor *moments, vl_mem_cat out_cat);
/* The same sample on the host from cached fp32 moments (N, 2C, HW) and noise (N, C, HW):
 * z[i] = scale * (mean + exp(clamp(logvar, -30, 20) / 2) * noise[i]) for the first n
 * elements, the very body the GAUSS_SAMPLE kernels run. */
void vl_sd_vae_sample_host(float *z, const float *moments, const float *noise, int64_t C,
                           int64_t HW, float scale, int64_t n);

/* ---- the CLIP text encoder ------------------------------------------------------------ */
/* The linears of each encoder layer that get LoRA factors: ATTN the attention's q_proj,
 * k_proj, v_proj and out_proj (peft target_modules ["q_proj", "k_proj", "v_proj",
 * "out_proj"]); KOHYA those and the MLP's fc1 and fc2 (kohya's networks/lora.py adapts every
 * Linear inside CLIPAttention and CLIPMLP). */
typedef enum {
  VL_SD_CLIP_LORA_ATTN = 0,
  VL_SD_CLIP_LORA_KOHYA,
  VL_SD_CLIP_LORA_TARGETS_COUNT
} vl_sd_clip_lora_targets;
const char *vl_sd_clip_lora_targets_name(vl_sd_clip_lora_targets t); /* "attn", "kohya" */
int vl_sd_clip_lora_targets_parse(const char *s, vl_sd_clip_lora_targets *out); /* 0: ok */

typedef struct {
  /* architecture: transformers CLIPTextConfig */
  int64_t vocab;              /* 49408 */
  int64_t dim;                /* hidden_size: 768 */
  int64_t n_layers;           /* 12 */
  int64_t n_heads;            /* 12 (head dim 64) */
  int64_t ffn;                /* intermediate_size: 3072 */
  int64_t n_pos;              /* max_position_embeddings: 77 (the prompt length) */
  float eps;                  /* LayerNorm: 1e-5 */
  vl_act act;                 /* hidden_act: quick-GELU */
  /* precision and implementation */
  vl_dtype weights, acts, out;
  vl_attn_impl attn;
  /* training: LoRA (peft's, as kohya's networks/lora.py puts it on the text encoder) */
  int lora_rank;              /* 0: frozen, nothing trainable (the default) */
  float lora_alpha;           /* scale alpha / rank; must be > 0 with a rank */
  vl_sd_clip_lora_targets lora_targets; /* which linears of every layer are adapted */
  bool checkpoint;            /* activation checkpointing per encoder layer */
} vl_sd_clip_cfg;

/* "full": CLIP ViT-L/14's text tower exactly; "small": vocab 4096, 256 wide, 4 layers of 4
 * heads, ffn 1024, 77 positions; "tiny": vocab 512, 64 wide, 2 layers of 4 heads, ffn 256,
 * 16 positions. All quick-GELU, fp32, efficient attention, frozen (lora_rank 0, alpha 0,
 * targets attn, no checkpointing). 0 on success. */
int vl_sd_clip_preset(const char *scale, vl_sd_clip_cfg *out);

typedef struct vl_sd_clip vl_sd_clip;

/* Make the encoder in c's arena: frozen weights seeded as PyTorch initialises them, then,
 * with lora_rank > 0, the LoRA factors of every adapted linear as trainable vl_params
 * (fp32, with an `acts`-dtype working copy under AMP), A ~ N(0, 1/r^2) and B = 0 (peft's
 * "gaussian" init, the U-Net's); nothing is written on a plan context. */
vl_status vl_sd_clip_create(vl_ctx *c, const vl_sd_clip_cfg *cfg, uint64_t seed,
                            vl_sd_clip **out);
void vl_sd_clip_destroy(vl_sd_clip *m); /* NULL is fine; frees a step in flight too */
const vl_sd_clip_cfg *vl_sd_clip_config(const vl_sd_clip *m);
/* The frozen parameters (state_dict order). */
vl_sd_params *vl_sd_clip_params(vl_sd_clip *m);
/* The parameter (frozen or LoRA) whose name is `name`, or NULL. */
vl_param *vl_sd_clip_param(vl_sd_clip *m, const char *name);
/* Frozen elements (the LoRA factors are not counted). */
int64_t vl_sd_clip_n_params(const vl_sd_clip *m);

/* Encode tokens (B, T) VL_I32 ids in [0, vocab) on c's device, T <= n_pos (positions
 * 0..T-1; SD pads every prompt to 77): hidden (B, T, dim), allocated here in cfg.out dtype
 * and category out_cat, belongs to the caller. Nothing is kept (a LoRA model applies its
 * factors); drops what a training forward held. */
vl_status vl_sd_clip_encode(vl_sd_clip *m, const vl_tensor *tokens, vl_tensor *hidden,
                            vl_mem_cat out_cat);

/* ---- training (lora_rank > 0) ---------------------------------------------------------- */
/* The LoRA factors, contiguous, in peft's state_dict order (per layer k_proj, v_proj,
 * q_proj, out_proj[, fc1, fc2], A then B of each), named
 * "encoder.layers.<l>.self_attn.q_proj.lora_A.weight" (r, in) and "...lora_B.weight"
 * (out, r): for vl_params_apply and optimizer state. *n = 0 (and NULL) when frozen. */
vl_param *vl_sd_clip_trainable(vl_sd_clip *m, int *n);
int64_t vl_sd_clip_n_trainable(const vl_sd_clip *m); /* their elements */

/* As vl_sd_clip_encode, hidden (B, T, dim) in cfg.out dtype and VL_MEM_TEMP. train (needs
 * lora_rank > 0): keep what backward reads (VL_MEM_ACTS: per layer the LayerNorm inputs and
 * statistics, the LoRA inputs and x A^T, q, k, v, the attention output and what the
 * attention saves, fc1's output; with checkpointing only each layer's input, the layer being
 * re-run in backward). Without train nothing is kept. On failure everything is freed. */
vl_status vl_sd_clip_forward(vl_sd_clip *m, const vl_tensor *tokens, bool train,
                             vl_tensor *hidden);
/* Backward of the last training forward from dhidden = dL/dhidden (B, T, dim), any float
 * dtype (e.g. the U-Net's fp32 dL/dcontext; not freed here): the LoRA gradients accumulate
 * into their grad tensors (micro-batches sum). No gradient reaches the embeddings (frozen)
 * and the first layer computes none for its input. Frees everything the forward kept, also
 * on failure. */
vl_status vl_sd_clip_backward(vl_sd_clip *m, const vl_tensor *dhidden);
/* Frees whatever a training forward holds (a forward without its backward). */
void vl_sd_clip_release(vl_sd_clip *m);

/* Optimizer state of every LoRA factor (zeroed). */
vl_status vl_sd_clip_alloc_optim(vl_sd_clip *m, const vl_optim_cfg *oc);
vl_status vl_sd_clip_zero_grads(vl_sd_clip *m);
/* vl_params_apply over the LoRA factors: unscale, overflow check, clip, update, zero
 * gradients. (A step training the U-Net too clips both by one global norm: apply over both
 * models' trainable arrays together.) */
vl_status vl_sd_clip_apply(vl_sd_clip *m, const vl_optim_cfg *oc, float clip, vl_scaler *s,
                           bool *skipped, double *grad_norm);

#ifdef __cplusplus
}
#endif
#endif
