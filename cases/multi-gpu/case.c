/* multi-gpu: data-parallel training of the ResNet-101 U-Net of seg-ckpt on several cards
 * (docs/cases.md §5): one rank -> DataParallel-style -> DDP -> DDP with overlap and tuned buckets
 * -> DDP + ZeRO-1. Per-card memory comes from the plan backend at full scale through the
 * data-parallel wrapper (plan.c), with the per-card table for 1, 2, 4, 8 cards and modeled
 * times for two link presets (timemodel.c); speed, busy shares, communication and memory by
 * category are measured on this machine with MPI ranks of one thread each (run.c, worker.c),
 * the speedups, the bucket-cap sweep and the collective benchmark after the ladder (extra.c).
 * This file holds the check and the case itself. */
#include "mg.h"

static vl_status mg_check(vl_case_env *env, const vl_knobs *k) {
  vl_mg_rung r;
  return vl_mg_parse_rung(env, env->scale, k, &r);
}

/* What plan, run and extra write at the top level of a rung's plan or run, and the case
 * metrics the claims read. */
static const char *const metrics[] = {
    /* plan */
    "params_total", "params_trainable", "batch", "accum", "effective_batch", "peak_bytes", "reserved_bytes",
    "weight_bytes", "acts_bytes", "flops_per_step", "flops_recompute", "ranks", "global_batch", "image",
    "model_state_bytes", "params_bytes", "grads_bytes", "optim_bytes", "comm_bytes", "n_buckets",
    "trainable_elems", "zero_padded_elems", "zero_shard_elems", "comm_payload_bytes", "step_flops_per_card",
    "card_bytes", "cap_bytes", "cuda_context_bytes", "fits", "max_batch", "max_batch_at_search_limit",
    "plan_seconds", "max_batch_search_seconds", "modeled_speedup_pcie", "modeled_busy_pcie",
    "modeled_step_s_pcie", "modeled_compute_s_pcie", "modeled_comm_s_pcie", "modeled_exposed_s_pcie",
    "modeled_speedup_nvlink", "modeled_busy_nvlink", "modeled_step_s_nvlink", "modeled_compute_s_nvlink",
    "modeled_comm_s_nvlink", "modeled_exposed_s_nvlink",
    /* run */
    "oversubscribed", "cores", "foreign_cpu_share", "attempts", "threads", "step_seconds", "timed_steps", "samples_per_s", "busy_share_min",
    "busy_share_mean", "comm_s_per_step", "exposed_s_per_step", "hidden_comm_share", "idle_s_per_step",
    "data_wait_share", "comm_bytes_per_step", "measured_peak_bytes", "planned_peak_bytes", "plan_matches_measured",
    "speedup", "scaling_efficiency",
    /* case metrics (extra: medians over the repetitions) */
    "measured_ranks", "measured_speedup_dp", "measured_speedup_ddp", "measured_speedup_zero1",
    "measured_efficiency_dp", "measured_efficiency_ddp", "measured_busy_min_dp", "measured_busy_min_ddp",
    "measured_hidden_comm_ddp", NULL};

static const char *const scales[] = {"tiny", "small", "full", NULL};

const vl_case vl_case_multi_gpu = {
    .id = "multi-gpu",
    .summary = "ResNet-101 U-Net data-parallel on several cards: 1 rank -> DataParallel -> DDP -> DDP overlap + "
               "tuned buckets -> DDP + ZeRO-1",
    .knobs = vl_mg_knobs,
    .scales = scales,
    .metrics = metrics,
    .check = mg_check,
    .plan = vl_mg_plan,
    .run = vl_mg_run,
    .extra = vl_mg_extra,
    .method = "Per-card memory is **planned at full scale** (512x512, the per-card batch) by the plan backend "
              "through the data-parallel wrapper `vl_model_dist` on rank 0 of the rung's ranks (world and "
              "rank size the buckets and shards; nothing is communicated), with a card's workspace rules; "
              "the same plan at 1, 2, 4 and 8 cards gives the per-card table. Time at full scale is "
              "**modeled**: the step's planned FLOPs at a stated device rate plus a ring allreduce model over "
              "two link presets (PCIe without peer-to-peer, RTX 4090 class; NVLink, H100 class). Speed, "
              "per-rank busy share, communication and the share of it hidden behind backward, and memory by "
              "category (measured = planned) are **measured** here: every rung repetition is one `mpirun` "
              "job of `vramlab worker multi-gpu`, ranks of one compute thread each, each rank reading its "
              "shard of the synthetic segmentation set through the engine's loader (DistributedSampler "
              "semantics; DataParallel: rank 0 loads the global batch and scatters it). Repetitions run in "
              "interleaved order across rungs; the tables show medians. Batch norm is per rank (no "
              "SyncBatchNorm), as in plain DDP.",
    .report = vl_mg_report,
    .worker = vl_mg_worker,
};
