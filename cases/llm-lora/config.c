/* llm-lora's knobs and what they mean: the knob table, a rung's knobs and the setting
 * mapped to a Mistral model and training config, and the step (spec) a rung plans and
 * runs. The model: the scale's preset, else the model_config file's (hfconfig.c), then
 * each size knob given (layers, dim, ffn, heads, kv_heads, vocab, seq) over it. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "llm.h"

const vl_knob_decl vl_llm_knobs[] = {
    {"compute", "fp32", "compute dtype: fp32, fp16 or bf16 (AMP with fp32 master weights)", VL_KNOB_RUNG},
    {"frozen", "fp32", "storage of the frozen base weights: fp32, fp16, bf16 or nf4", VL_KNOB_RUNG},
    {"lora_rank", "0", "LoRA rank; 0 = full fine-tune", VL_KNOB_RUNG},
    {"lora_alpha", "16", "LoRA alpha (scale alpha / rank)", VL_KNOB_RUNG},
    {"lora_targets", "qkvo", "linears LoRA adapts: qkvo or all", VL_KNOB_RUNG},
    {"optimizer", "adamw", "adamw, adafactor or sgd", VL_KNOB_RUNG},
    {"adafactor_beta1", "false", "Adafactor keeps a first moment", VL_KNOB_RUNG},
    {"checkpoint", "false", "gradient checkpointing per layer", VL_KNOB_RUNG},
    {"lr", "1e-4", "learning rate", VL_KNOB_RUNG},
    {"batch", "2", "micro-batch rows, or max (the largest that fits the cap at full scale)",
     VL_KNOB_RUNG | VL_KNOB_SETTING},
    {"accum", "1", "gradient accumulation micro-batches per step", VL_KNOB_RUNG},
    {"clip", "1.0", "gradient clipping by global norm (0: off)", VL_KNOB_RUNG},
    {"weight_decay", "0", "decoupled weight decay", VL_KNOB_RUNG},
    VL_CASE_CARD_KNOBS,
    {"seq", "preset",
     "sequence length planned (and longest run batch); preset: the scale's (512 full, 128 small, 32 tiny)",
     VL_KNOB_SETTING},
    {"run_seq", "0", "runs: 0 = variable-length dialogue batches; N = every batch exactly N tokens (like-for-like)",
     VL_KNOB_SETTING},
    {"model_config", "none",
     "a Hugging Face config.json (Llama/Mistral) as the model at every scale (--model-config); none: the preset",
     VL_KNOB_SETTING},
    {"layers", "preset", "decoder layers; preset: the scale's (or model_config's)", VL_KNOB_SETTING},
    {"dim", "preset", "hidden size; preset: the scale's (or model_config's)", VL_KNOB_SETTING},
    {"ffn", "preset", "SwiGLU intermediate size; preset: the scale's (or model_config's)", VL_KNOB_SETTING},
    {"heads", "preset", "attention heads, dividing dim (head_dim = dim / heads); preset: the scale's", VL_KNOB_SETTING},
    {"kv_heads", "preset", "key/value heads (GQA), dividing heads; preset: the scale's (or model_config's)",
     VL_KNOB_SETTING},
    {"vocab", "preset", "vocabulary size; preset: the scale's (or model_config's)", VL_KNOB_SETTING},
    {"seed", "1", "seed of weights and data", VL_KNOB_SETTING},
    {"steps", "12", "timed steps per rung and repetition", VL_KNOB_SETTING},
    {"warmup", "2", "untimed steps before them", VL_KNOB_SETTING},
    {"oom_batches", "200", "variable-length batches sampled for the OOM rate", VL_KNOB_SETTING},
    {"run_cap", "none", "arena cap of the timed runs (a size, or none: uncapped)", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};

static vl_status parse_dtype(vl_case_env *env, const vl_knobs *k, const char *key, vl_dtype *out) {
  const char *v = vl_knob_str(k, key, vl_llm_knobs);
  if (vl_dtype_parse(v, out))
    return vl_case_fail(env, VL_ERR_INVALID, "%s = '%s': expected fp32, fp16, bf16 or nf4", key, v);
  return VL_OK;
}

/* A size knob: "preset" leaves *v as it is (the preset's or the model config's), a number
 * in [lo, hi] replaces it; *given says which. */
static vl_status size_knob(vl_case_env *env, const char *key, long lo, long hi, int64_t *v, bool *given) {
  const char *t = vl_knob_str(env->setting, key, vl_llm_knobs);
  *given = strcasecmp(t, "preset") != 0;
  if (!*given) return VL_OK;
  long x;
  VL_TRY(vl_knob_int(env->setting, key, vl_llm_knobs, lo, hi, &x, &env->err));
  *v = x;
  return VL_OK;
}

/* The model's sizes: the scale's preset, the model config over it, the size knobs over
 * both; every relation the model needs checked here, naming the knobs. */
static vl_status parse_model(vl_case_env *env, const char *scale, vl_mistral_cfg *mc, int64_t *max_pos,
                             const char **model_type) {
  if (vl_mistral_preset(scale, mc))
    return vl_case_fail(env, VL_ERR_INVALID, "unknown scale '%s' (tiny, small, full)", scale);
  *max_pos = 0;
  *model_type = NULL;
  const char *path = vl_knob_str(env->setting, "model_config", vl_llm_knobs);
  bool cfg = strcasecmp(path, "none") != 0;
  if (cfg) VL_TRY(vl_llm_hf_config_load(env, path, mc, max_pos, model_type));
  const vl_llm_dim_limits *X = &vl_llm_dim_max;
  bool g_layers, g_dim, g_ffn, g_heads, g_kv, g_vocab, g_seq;
  VL_TRY(size_knob(env, "layers", 1, X->layers, &mc->n_layers, &g_layers));
  VL_TRY(size_knob(env, "dim", 2, X->dim, &mc->dim, &g_dim));
  VL_TRY(size_knob(env, "ffn", 1, X->ffn, &mc->ffn, &g_ffn));
  VL_TRY(size_knob(env, "heads", 1, X->heads, &mc->n_heads, &g_heads));
  VL_TRY(size_knob(env, "kv_heads", 1, X->heads, &mc->n_kv_heads, &g_kv));
  VL_TRY(size_knob(env, "vocab", 2, X->vocab, &mc->vocab, &g_vocab));
  VL_TRY(size_knob(env, "seq", 1, X->seq, &mc->seq, &g_seq));
  if (g_dim || g_heads) { /* a head size of its own (a config's head_dim) holds only while both stand */
    if (mc->dim % mc->n_heads)
      return vl_case_fail(env, VL_ERR_INVALID, "heads = %lld does not divide dim = %lld", (long long)mc->n_heads,
                          (long long)mc->dim);
    mc->head_dim = mc->dim / mc->n_heads;
    if (mc->head_dim % 2)
      return vl_case_fail(env, VL_ERR_INVALID, "dim / heads = %lld: the head size must be even (RoPE)",
                          (long long)mc->head_dim);
  }
  if (mc->n_heads % mc->n_kv_heads)
    return vl_case_fail(env, VL_ERR_INVALID, "kv_heads = %lld does not divide heads = %lld", (long long)mc->n_kv_heads,
                        (long long)mc->n_heads);
  if (cfg && mc->seq > *max_pos)
    return vl_case_fail(env, VL_ERR_INVALID, "seq = %lld exceeds max_position_embeddings %lld of model_config '%s'",
                        (long long)mc->seq, (long long)*max_pos, path);
  return VL_OK;
}

vl_status vl_llm_parse_rung(vl_case_env *env, const char *scale, const vl_knobs *k, vl_llm_rung *r) {
  memset(r, 0, sizeof *r);
  vl_train_cfg *tc = &r->model.tc;
  VL_TRY(parse_model(env, scale, &r->model.mc, &r->max_pos, &r->model_type));
  vl_train_cfg_default(tc);
  const vl_knobs *s = env->setting;
  VL_TRY(vl_knob_int(s, "run_seq", vl_llm_knobs, 0, vl_llm_dim_max.seq, &r->run_seq, &env->err));
  if (r->max_pos && r->run_seq > r->max_pos)
    return vl_case_fail(env, VL_ERR_INVALID, "run_seq = %ld exceeds max_position_embeddings %lld of model_config",
                        r->run_seq, (long long)r->max_pos);
  VL_TRY(vl_case_card_parse(env, k, &r->card));
  VL_TRY(vl_knob_int(s, "seed", vl_llm_knobs, 0, 1L << 40, &r->seed, &env->err));
  VL_TRY(vl_knob_int(s, "steps", vl_llm_knobs, 1, 100000, &r->steps, &env->err));
  VL_TRY(vl_knob_int(s, "warmup", vl_llm_knobs, 0, 1000, &r->warmup, &env->err));
  VL_TRY(vl_knob_int(s, "oom_batches", vl_llm_knobs, 1, 1000000, &r->oom_batches, &env->err));
  VL_TRY(parse_dtype(env, k, "compute", &tc->compute));
  if (tc->compute == VL_NF4)
    return vl_case_fail(env, VL_ERR_INVALID, "compute = nf4: nf4 is a storage format for frozen weights");
  VL_TRY(parse_dtype(env, k, "frozen", &tc->frozen));
  long v;
  VL_TRY(vl_knob_int(k, "lora_rank", vl_llm_knobs, 0, 4096, &v, &env->err));
  tc->lora_rank = (int)v;
  double d;
  VL_TRY(vl_knob_double(k, "lora_alpha", vl_llm_knobs, 1e-6, 1e6, &d, &env->err));
  tc->lora_alpha = (float)d;
  const char *t = vl_knob_str(k, "lora_targets", vl_llm_knobs);
  if (!strcasecmp(t, "all")) tc->lora_targets = VL_LORA_ALL;
  else if (!strcasecmp(t, "qkvo")) tc->lora_targets = VL_LORA_QKVO;
  else return vl_case_fail(env, VL_ERR_INVALID, "lora_targets = '%s': expected qkvo or all", t);
  const char *o = vl_knob_str(k, "optimizer", vl_llm_knobs);
  if (vl_optimizer_parse(o, &tc->optim.opt))
    return vl_case_fail(env, VL_ERR_INVALID, "optimizer = '%s': expected adamw, adafactor or sgd", o);
  int b;
  VL_TRY(vl_knob_bool(k, "adafactor_beta1", vl_llm_knobs, &b, &env->err));
  tc->optim.adafactor_beta1 = b;
  VL_TRY(vl_knob_bool(k, "checkpoint", vl_llm_knobs, &b, &env->err));
  tc->checkpoint = b;
  VL_TRY(vl_knob_double(k, "lr", vl_llm_knobs, 1e-12, 10, &d, &env->err));
  tc->optim.hp.lr = (float)d;
  VL_TRY(vl_knob_double(k, "clip", vl_llm_knobs, 0, 1e9, &d, &env->err));
  tc->clip = (float)d;
  VL_TRY(vl_knob_double(k, "weight_decay", vl_llm_knobs, 0, 10, &d, &env->err));
  tc->optim.hp.weight_decay = (float)d;
  /* the rung's batch, else the setting's, else the declared default */
  const char *bs = vl_knob_get(k, "batch");
  if (!bs) bs = vl_knob_str(s, "batch", vl_llm_knobs);
  if (!strcasecmp(bs, "max")) r->batch = 0;
  else {
    vl_knobs tmp = {0};
    vl_knob_set(&tmp, "batch", bs);
    VL_TRY(vl_knob_int(&tmp, "batch", vl_llm_knobs, 1, 1 << 20, &r->batch, &env->err));
  }
  VL_TRY(vl_knob_int(k, "accum", vl_llm_knobs, 1, 4096, &r->accum, &env->err));
  /* Runs are uncapped unless run_cap says otherwise (to study OOM at the run scale); parsed
   * here with the rest so a bad value is refused before anything runs. */
  r->run_cap = VL_NO_CAP;
  const char *rc_s = vl_knob_str(s, "run_cap", vl_llm_knobs);
  if (strcasecmp(rc_s, "none")) VL_TRY(vl_knob_bytes(s, "run_cap", vl_llm_knobs, &r->run_cap, &env->err));
  return VL_OK;
}

vl_batch vl_llm_token_batch(int64_t B, int64_t T, const int32_t *tok, const int32_t *tgt) {
  vl_batch b = {0};
  int64_t bt[2] = {B, T};
  vl_batch_add(&b, "tokens", VL_I32, 2, bt, tok);
  vl_batch_add(&b, "targets", VL_I32, 2, bt, tgt);
  return b;
}

vl_step_spec vl_llm_step_spec(const vl_llm_rung *r, int64_t B, int64_t T) {
  return (vl_step_spec){.type = &vl_model_mistral, .cfg = &r->model, .seed = (uint64_t)r->seed,
                        .batch = vl_llm_token_batch(B, T, NULL, NULL), .accum = r->accum};
}

int64_t vl_llm_max_batch(const vl_llm_rung *r) {
  vl_step_spec s = vl_llm_step_spec(r, 1, r->model.mc.seq);
  return vl_run_max_batch(&s, r->card.cap, 1);
}
