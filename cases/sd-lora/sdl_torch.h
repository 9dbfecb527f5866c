/* sd-lora beside its PyTorch peer (sdl_torch.c): the extra hook's comparison, the peer-config
 * hook and the report's side-by-side section. */
#ifndef VRAMLAB_SD_LORA_PEER_H
#define VRAMLAB_SD_LORA_PEER_H

#include "kit/case.h"

/* The compared rungs (sdl_torch.c: before, disk_cache, prefetch16), engine and
 * tools/peers/sd_lora_peer.py in turn, a fresh peer process per rung, into
 * res.case_metrics.peers (and each rung's first run); "not measured here" with the reason
 * when PyTorch is not there or fails (VL_OK: never a failure of the bench). */
vl_status vl_sdl_peers(vl_case_env *env, cJSON *res);
/* The case's peer_config hook (kit/case.h): the rung's setup for tools/peers/sd_lora_peer.py,
 * or why no peer runs it (batch = max, text-encoder LoRA). */
vl_status vl_sdl_peer_config(vl_case_env *env, const vl_knobs *k, int threads, cJSON *out);
/* Every rung at `scale` (the extra's: full, SD 1.5's U-Net at 512x512) through MemTracker on fake tensors
 * beside the mimic on its terms (kit/peer_full.c), into res.case_metrics.pytorch_full_scale. */
vl_status vl_sdl_full_scale(vl_case_env *env, cJSON *res, const char *scale);
/* "### PyTorch side by side" of the report (appendix). */
void vl_sdl_peers_report(const cJSON *res, FILE *md);

#endif
