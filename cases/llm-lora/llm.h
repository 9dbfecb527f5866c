/* llm-lora's own pieces shared by its files: a rung's settings as a Mistral config and its
 * knob table (config.c), a Hugging Face config.json as the model (hfconfig.c), the step a
 * rung plans and runs, the timed run (run.c). */
#ifndef VRAMLAB_LLM_LORA_H
#define VRAMLAB_LLM_LORA_H

#include "kit/case.h"
#include "vramlab/mistral.h"

typedef struct {
  vl_mistral_model_cfg model;
  long batch;       /* micro-batch rows; 0 = "max" */
  long accum;
  vl_case_card card;
  size_t run_cap;   /* arena cap of the timed runs (VL_NO_CAP: uncapped) */
  long seed, steps, warmup, oom_batches;
  long run_seq;     /* runs: 0 = variable-length dialogue batches; N = every batch N tokens */
  int64_t max_pos;  /* the model config's max_position_embeddings; 0 without one */
  /* the model config's model_type (llama, mistral, qwen2: the transformers class the peers
   * build); NULL without one (the scale's preset: Mistral) */
  const char *model_type;
} vl_llm_rung;

/* Upper bounds of the model's sizes, for the knobs and the config reader alike. */
typedef struct {
  long vocab, dim, ffn, layers, heads, head_dim, seq;
} vl_llm_dim_limits;
extern const vl_llm_dim_limits vl_llm_dim_max;

/* A Hugging Face config.json of the Llama/Mistral family (hfconfig.c: the fields read,
 * refused and ignored) over the sizes of *mc (seq is left alone: a training setting) and
 * its max_position_embeddings into *max_pos. Strict: a missing, mistyped, non-integer or
 * out-of-range field, heads not dividing the hidden size, a key given twice, trailing text
 * is VL_ERR_INVALID with a message naming the file and the field; *mc is then unchanged.
 * `name` names the text in messages. *model_type (when not NULL): its model_type, a static
 * string ("llama", "mistral" or "qwen2"). */
#define VL_LLM_HF_CONFIG_MAX_BYTES (1u << 20)
vl_status vl_llm_hf_config_parse(vl_case_env *env, const char *text, size_t n, const char *name, vl_mistral_cfg *mc,
                                 int64_t *max_pos, const char **model_type);
/* The same from a file (a regular file of at most VL_LLM_HF_CONFIG_MAX_BYTES, read with
 * vl_file_read_text); a file that cannot be read is VL_ERR_INVALID too (a bad value of the
 * model_config setting). The file is read once: the accepted config is kept and reused
 * while the file stays the same (inode, size, mtime, ctime), so a ladder reads it once. */
vl_status vl_llm_hf_config_load(vl_case_env *env, const char *path, vl_mistral_cfg *mc, int64_t *max_pos,
                                const char **model_type);

/* Every knob a rung may set and every setting the case reads (config.c). */
extern const vl_knob_decl vl_llm_knobs[];

/* Every knob of a rung and the setting at `scale` into r; VL_ERR_INVALID with a message
 * naming the knob. */
vl_status vl_llm_parse_rung(vl_case_env *env, const char *scale, const vl_knobs *k, vl_llm_rung *r);
/* One micro-batch: tokens (B, T) and targets (B, T), i32; NULL data when planning. */
vl_batch vl_llm_token_batch(int64_t B, int64_t T, const int32_t *tok, const int32_t *tgt);
/* A step of accum micro-batches of B x T. */
vl_step_spec vl_llm_step_spec(const vl_llm_rung *r, int64_t B, int64_t T);
/* Largest micro-batch whose worst-case step (T = seq) fits under the cap, the model's
 * planned batch (peak is monotone in B). */
int64_t vl_llm_max_batch(const vl_llm_rung *r);

/* One repetition of a rung on env->device at env->scale (run.c): the case's run hook. */
vl_status vl_llm_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out);

/* The case's report sections (the report hook). */
void vl_llm_lora_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot);

#endif
