/* llm-lora's own pieces shared by its files: a rung's settings as a Mistral config and its
 * knob table (config.c), the step a rung plans and runs, the timed run (run.c). */
#ifndef VRAMLAB_LLM_LORA_H
#define VRAMLAB_LLM_LORA_H

#include "case.h"
#include "vramlab/mistral.h"

typedef struct {
  vl_mistral_model_cfg model;
  long batch;       /* micro-batch rows; 0 = "max" */
  long accum;
  vl_case_card card;
  size_t run_cap;   /* arena cap of the timed runs (VL_NO_CAP: uncapped) */
  long seed, steps, warmup, oom_batches;
} vl_llm_rung;

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

#endif
