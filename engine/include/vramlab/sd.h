/* A Stable Diffusion 1.5 LoRA training step as a vl_model (diffusers'
 * train_text_to_image_lora.py): the U-Net (vramlab/sd_unet.h) predicts the noise added to
 * the latents at a random DDPM timestep, the loss is the MSE against that noise in fp32,
 * AdamW updates the LoRA factors. The VAE encoder and the CLIP text encoder
 * (vramlab/sd_encoders.h), frozen, run inside the step (no cache: the batch carries images
 * and token ids) or not at all (cache: the batch carries latents and text embeddings).
 *
 * Batch tensors (host, row-major; randomness is the data side's, seeded):
 *   cached:   latents (B, 4, h, w) and context (B, L, ctx_dim), any float dtype
 *   in step:  images (B, 3, H, W) f32, vae_noise (B, 4, h, w) f32, tokens (B, L) i32
 *   always:   noise (B, 4, h, w) f32 (the epsilon to predict), timesteps (B) i32 in [0, 1000)
 * With clip.lora_rank > 0 the text encoder trains too (kohya's default; it must then run
 * in the step): the U-Net hands dL/dcontext to its backward and one global gradient norm
 * clips both models' LoRA factors.
 * noisy = sqrt(abar_t) latents + sqrt(1 - abar_t) noise, abar from DDPM's scaled-linear betas
 * (0.00085 -> 0.012 over 1000 steps) computed in float32 as diffusers' DDPMScheduler does. */
#ifndef VRAMLAB_SD_H
#define VRAMLAB_SD_H

#include "vramlab/sd_encoders.h"
#include "vramlab/sd_unet.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VL_DDPM_STEPS 1000

typedef struct {
  vl_sd_unet_cfg unet;
  vl_sd_vae_cfg vae;
  vl_sd_clip_cfg clip;
  bool encoders_in_step; /* no cache: the VAE and text encoder run in every micro-batch */
  vl_optim_cfg optim;    /* AdamW, lr 1e-4 (the script's default) */
  float clip_norm;       /* max_grad_norm: 1.0 */
  float loss_scale;      /* fp16 activations: initial dynamic loss scale (65536) */
  int loss_scale_window; /* good steps before the scale doubles (2000) */
} vl_sd_cfg;

/* The three models' presets of `scale` (full, small, tiny: vl_sd_unet_preset and the
 * encoders'), the context length/width taken from the text encoder's, the U-Net's latent
 * side from the VAE's, fp32, cached inputs. 0, or -1 for an unknown scale. */
int vl_sd_preset(const char *scale, vl_sd_cfg *out);
/* Storage of every frozen weight (fp32/fp16/bf16) and the activations: `amp` fp16/bf16
 * stores frozen weights and activations in that dtype with fp32 LoRA masters. */
void vl_sd_set_precision(vl_sd_cfg *cfg, vl_dtype frozen, vl_dtype acts);
/* Image side of the VAE's input for the U-Net's latent side (8x). */
int64_t vl_sd_image_side(const vl_sd_cfg *cfg);
/* The seeds vl_model_sd gives its VAE encoder and text encoder for the model seed `seed`, so
 * a latent or text-embedding cache is built by the very encoders the uncached step runs. */
uint64_t vl_sd_vae_seed(uint64_t seed);
uint64_t vl_sd_clip_seed(uint64_t seed);

/* diffusers' DDPMScheduler(beta_schedule="scaled_linear"): betas = linspace(sqrt(b0),
 * sqrt(b1), n)^2 and alphas_cumprod = cumprod(1 - betas), the same float32 values torch
 * computes on the CPU (linspace by fused multiply-add, cumprod accumulated in double). */
void vl_ddpm_alphas_cumprod(int n, double beta_start, double beta_end, float *out);

extern const vl_model_type vl_model_sd;
/* The U-Net of a vl_model_sd model (to load weights, read LoRA gradients). */
vl_sd_unet *vl_sd_model_unet(vl_model *m);

/* Parameter modules vl_model_params reports, in order: unet (frozen), vae_encoder and
 * text_encoder (frozen; counted whether or not they run in the step), lora (trainable:
 * the U-Net's and, when it trains, the text encoder's). */
#define VL_SD_MODULES {"unet", "vae_encoder", "text_encoder", "lora"}

#ifdef __cplusplus
}
#endif
#endif
