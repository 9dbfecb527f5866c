/* seg-ckpt beside its PyTorch peer (seg_torch.c): the extra hook's comparison and the report's
 * side-by-side section. */
#ifndef VRAMLAB_SEG_CKPT_PEER_H
#define VRAMLAB_SEG_CKPT_PEER_H

#include "kit/case.h"
#include "kit/segrung.h"
#include "vramlab/mimic.h"

/* The before and relu_off rungs, engine and tools/peers/seg_peer.py in turn, into
 * res.case_metrics.peers (and each rung's first run); "not measured here" with the reason
 * when PyTorch is not there or fails (VL_OK: never a failure of the bench). */
vl_status vl_segcase_peers(vl_case_env *env, cJSON *res);
/* The case's peer_config hook (kit/case.h): the rung's setup for tools/peers/seg_peer.py, or
 * why no peer runs it (batch = max). */
vl_status vl_segcase_peer_config(vl_case_env *env, const vl_knobs *k, int threads, cJSON *out);
/* Every rung at `scale` (the extra's: full, ResNet-101 at 512x512) through MemTracker on fake tensors beside
 * the mimic on its terms (kit/peer_full.c), into res.case_metrics.pytorch_full_scale. */
vl_status vl_segcase_full_scale(vl_case_env *env, cJSON *res, const char *scale);
/* The mimic of seg_peer.py's step for the rung at this batch on `dev`: two steps (the first
 * creates the optimizer's state), the rung's precision, checkpointing, ReLU, optimizer,
 * clipping and accumulation; the caller sets the rest (capacity). */
vl_mimic_resunet_cfg vl_segcase_mimic_cfg(const vl_segrung *r, int64_t batch, vl_mimic_device dev);
/* "## PyTorch side by side" of the report. */
void vl_segcase_peers_report(const cJSON *res, FILE *md);

#endif
