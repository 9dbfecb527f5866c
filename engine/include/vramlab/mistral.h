/* Mistral decoder (token embedding, RMSNorm, RoPE, grouped-query causal attention, SwiGLU,
 * LM head, cross-entropy) with LoRA/QLoRA, AMP, per-layer checkpointing, gradient
 * accumulation and clipping; the Llama 3.2 and Qwen2 variants by two flags: a head tied to
 * the embedding, biases on q, k and v. One explicit step: forward allocates activations,
 * backward frees them as it consumes them. */
#ifndef VRAMLAB_MISTRAL_H
#define VRAMLAB_MISTRAL_H

#include "vramlab/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn, seq;
  float rope_theta, norm_eps;
  /* tie_embed: the LM head is the embedding matrix (one parameter, held once; its gradient
   * the sum of both uses: Llama 3.2 1B/3B, the small Qwen2.5). qkv_bias: q, k and v have
   * biases (Qwen2), trainable or frozen as their weights, stored after the table's lm_head
   * slot. Both 0: Mistral, Llama 3. (ints, not bools: no padding, so two configs compare
   * bytewise.) */
  int32_t tie_embed, qkv_bias;
} vl_mistral_cfg;

/* Presets: "full" = Mistral-7B-v0.1; "small", "tiny" keep the structure (GQA included). */
int vl_mistral_preset(const char *scale, vl_mistral_cfg *out); /* 0 on success */

typedef enum { VL_LORA_QKVO = 0, VL_LORA_ALL } vl_lora_targets;

typedef struct {
  vl_dtype compute;          /* activation / working-copy dtype: fp32, or fp16/bf16 (AMP) */
  vl_dtype frozen;           /* storage of the frozen base under LoRA: fp32/fp16/bf16/nf4 */
  int lora_rank;             /* 0 = full fine-tune */
  float lora_alpha;
  vl_lora_targets lora_targets;
  bool checkpoint;           /* per-layer activation checkpointing */
  vl_optim_cfg optim;
  float clip;                /* global-norm clip; 0 = off */
  float loss_scale;          /* fp16 AMP initial dynamic loss scale */
  int loss_scale_window;     /* good steps before the scale doubles (GradScaler: 2000) */
} vl_train_cfg;

void vl_train_cfg_default(vl_train_cfg *t);

/* One micro-batch: B rows of T tokens, right-padded; targets -1 are ignored. Token arrays
 * are host memory; they may be NULL on the plan device. */
typedef struct {
  int64_t B, T;
  const int32_t *tokens;  // (B, T) token ids
  const int32_t *targets; // (B, T) next-token targets, -1 ignored
} vl_mistral_batch;

typedef struct {
  double loss;        /* mean over valid target tokens of the whole step */
  int64_t n_tokens;   /* valid target tokens */
  bool skipped;       /* fp16 overflow: step skipped, scale halved */
  float loss_scale;   /* scale used in this step */
  double grad_norm;   /* global norm of the unscaled gradients */
} vl_mistral_step_info;

typedef struct vl_mistral vl_mistral;

vl_status vl_mistral_create(vl_ctx *c, const vl_mistral_cfg *mc, const vl_train_cfg *tc,
                            uint64_t seed, vl_mistral **out);
void vl_mistral_destroy(vl_mistral *m);
/* Forward + backward over n_micro micro-batches, gradients summed; the loss of every
 * micro-batch is normalised by the valid tokens of all of them, so 4 x b == one 4b batch. */
vl_status vl_mistral_fwd_bwd(vl_mistral *m, const vl_mistral_batch *mb, int n_micro, vl_mistral_step_info *info);
/* Unscale, check overflow (fp16), clip, update, zero gradients. */
vl_status vl_mistral_apply(vl_mistral *m, vl_mistral_step_info *info);
/* fwd_bwd then apply. */
vl_status vl_mistral_step(vl_mistral *m, const vl_mistral_batch *mb, int n_micro, vl_mistral_step_info *info);
vl_status vl_mistral_zero_grads(vl_mistral *m);

vl_param *vl_mistral_params(vl_mistral *m, int *n);
/* Parameters, optimizer, clip and scaler (model.h). */
vl_status vl_mistral_train_state(vl_mistral *m, vl_train_state *out);
int64_t vl_mistral_n_params(const vl_mistral *m, bool trainable_only);
const vl_mistral_cfg *vl_mistral_config(const vl_mistral *m);
vl_ctx *vl_mistral_ctx(const vl_mistral *m);
const vl_train_cfg *vl_mistral_train_config(const vl_mistral *m);
/* ---- as a vl_model (mistral_model.c) ----------------------------------------------------- */
/* The config behind vl_model_mistral's void *cfg. Its batches: "tokens" (B, T) and
 * "targets" (B, T), VL_I32, right-padded, targets -1 ignored, T <= mc.seq. */
typedef struct {
  vl_mistral_cfg mc;
  vl_train_cfg tc;
} vl_mistral_model_cfg;

/* No predict (it has no forward-only path): vl_model_predict returns VL_ERR_UNSUPPORTED. */
extern const vl_model_type vl_model_mistral;

/* Merge LoRA adapters into the base weights on the host for checks: returns, for a
 * parameter index of a base linear, W + alpha/r * B A in fp32 (rows*cols floats). */
vl_status vl_mistral_merged_weight(vl_mistral *m, int param_index, float *out);

#ifdef __cplusplus
}
#endif
#endif
