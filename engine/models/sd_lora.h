/* LoRA shared by the Stable Diffusion models that train adapters (the U-Net, sd_unet_blocks.c;
 * the CLIP text encoder, sd_clip.c): a frozen linear layer with peft's LoRA path, forward and
 * backward, and the table of LoRA factors. Not a public header.
 *
 *   y (R, out) = x (R, in) W^T [+ b] [+ s (x A^T) B^T],  s = alpha / r
 *
 * W (out, in) and b (out) are frozen (no gradient); A (r, in) and B (out, r) are trainable
 * vl_params (fp32, or an acts-dtype working copy of an fp32 master under AMP, nn/param.c),
 * named "<linear>.lora_A.weight" / "<linear>.lora_B.weight" as peft's saved state dict. */
#ifndef VRAMLAB_SD_LORA_H
#define VRAMLAB_SD_LORA_H

#include "vramlab/sd_encoders.h"

/* One linear layer as the kernels see it (pointers valid while the caller's tables do not
 * grow: build it just before a call). */
typedef struct {
  const vl_tensor *w; /* (out, in) frozen weight */
  const vl_tensor *b; /* (out) frozen bias, or NULL */
  vl_param *A, *B;    /* LoRA factors (r, in) and (out, r); both NULL: a plain linear */
  int64_t in, out, r;
  float scale;        /* alpha / r */
  vl_dtype acts;      /* dtype of x A^T and of the backward's (R, r) temporary */
} sd_lora_lin;

/* y (R, out) (beta 0 overwrites, 1 accumulates: a residual) = x W^T [+ b] [+ s (x A^T) B^T].
 * keep: x A^T (R, r) stays in *xa (VL_MEM_ACTS) for dB; otherwise it is a temporary freed
 * before returning. xa is unused without LoRA. */
vl_status sd_lora_lin_fwd(vl_ctx *c, const sd_lora_lin *L, vl_tensor *y, const vl_tensor *x,
                          int64_t R, float beta, bool keep, vl_tensor *xa);

/* Only the LoRA input x A^T (R, r) into *xa (VL_MEM_ACTS), as sd_lora_lin_fwd keeps it: for
 * a checkpoint's re-run that stops before the layer's output. Nothing without LoRA. */
vl_status sd_lora_lin_xa(vl_ctx *c, const sd_lora_lin *L, const vl_tensor *x, int64_t R,
                         vl_tensor *xa);

/* From dy (R, out): dB += s dy^T xa and dA += (s dy B)^T x (xa is freed; dxa is the slot of
 * the (R, r) temporary s dy B, freed before returning); with dx, dx (R, in) (beta 0
 * overwrites, 1 accumulates) = dy W [+ (s dy B) A]. W and b get no gradient; x is read only
 * with LoRA. */
vl_status sd_lora_lin_bwd(vl_ctx *c, const sd_lora_lin *L, vl_tensor *dx, float beta,
                          const vl_tensor *dy, const vl_tensor *x, vl_tensor *xa, vl_tensor *dxa,
                          int64_t R);

/* Appends a trainable (rows, cols) matrix named `name` to t, stored in `dtype` (fp32, or the
 * AMP working copy of an fp32 master), initialised by vl_sd_params_init as `init` / `a` says
 * (peft's "gaussian" init: A N(0, 1/r^2), B zero). vl_sd_params_free / find / count / init
 * work on such a table as on a frozen one. */
vl_status sd_lora_add(vl_ctx *c, vl_sd_params *t, const char *name, int64_t rows, int64_t cols,
                      vl_dtype dtype, vl_sd_init init, float a);

#endif
