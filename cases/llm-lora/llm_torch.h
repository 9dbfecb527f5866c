/* llm-lora beside its PyTorch peer (llm_torch.c): the extra hook's comparison and the report's
 * side-by-side section. */
#ifndef VRAMLAB_LLM_LORA_PEER_H
#define VRAMLAB_LLM_LORA_PEER_H

#include "kit/case.h"
#include "llm.h"
#include "vramlab/mimic.h"

/* The baseline and lora rungs, engine and tools/peers/llm_lora_peer.py in turn, into
 * res.case_metrics.peers (and each rung's first run); "not measured here" with the reason
 * when PyTorch is not there or fails (VL_OK: never a failure of the bench). */
vl_status vl_llm_peers(vl_case_env *env, cJSON *res);
/* The case's peer_config hook (kit/case.h): the rung's setup for tools/peers/llm_lora_peer.py,
 * or why no CPU peer runs it (an NF4 base, batch = max). */
vl_status vl_llm_peer_config(vl_case_env *env, const vl_knobs *k, int threads, cJSON *out);
/* Every rung at `scale` (the extra's: full, the article's 7B step) through MemTracker on fake tensors beside
 * the mimic on its terms (kit/peer_full.c), into res.case_metrics.pytorch_full_scale. */
vl_status vl_llm_full_scale(vl_case_env *env, cJSON *res, const char *scale);
/* The mimic of llm_lora_peer.py's step for the rung at batch B and length T on `dev`: two
 * steps (the first creates AdamW's state), the rung's accumulation; the caller sets the rest
 * (capacity, cuda_cc_major, traced). */
vl_mimic_llm_cfg vl_llm_mimic_cfg(const vl_llm_rung *r, int64_t B, int64_t T, vl_mimic_device dev);
/* "## PyTorch side by side" of the report. */
void vl_llm_peers_report(const cJSON *res, FILE *md);

#endif
