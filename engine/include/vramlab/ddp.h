/* Data parallelism over any vl_model that hands out its train state (vramlab/model.h):
 * a wrapper model, so planning, the timed loop, the largest-batch search and OOM triage
 * (vramlab/run.h) drive a data-parallel step exactly as they drive one rank.
 *
 *   single  one rank; the inner model as it is (the ladder's baseline)
 *   dp      torch.nn.DataParallel's pattern: rank 0 holds the global batch and scatters it,
 *           every replica runs forward + backward on its shard, gradients are reduced to
 *           rank 0, rank 0 alone clips and updates, then broadcasts the parameters; the
 *           other ranks wait meanwhile (their idle share is measured, not asserted)
 *   ddp     torch DistributedDataParallel: parameters broadcast from rank 0 at creation;
 *           gradients in buckets, PyTorch's bucket assignment (first bucket capped at
 *           first_bucket_cap, the others at bucket_cap, reverse parameter order), a bucket's
 *           allreduce (average) started as soon as its last gradient is ready (overlap) or
 *           all of them after backward (no overlap); buckets are VL_MEM_COMM, or with
 *           grad_as_bucket_view the gradients live in the buckets (no copy, no extra bytes)
 *   zero1   ZeRO stage 1: gradients in one flat padded buffer (VL_MEM_COMM) reduce-scattered
 *           (average), this rank's shard of the optimizer state only (1/world of it), the
 *           shard updated, the fp32 parameters all-gathered
 *
 * On a plan context nothing is communicated: world and rank size the buckets and shards, so
 * per-rank memory plans exactly for any number of ranks.
 *
 * Details every mode shares:
 *  - Every parameter (frozen ones too) is broadcast from rank 0 at creation, and the
 *    model's buffers (train_state's, e.g. the U-Net's BN running statistics) before every
 *    forward (torch DDP's broadcast_buffers default; DataParallel's replicate does the same).
 *  - The loss a step reports is the global one: every rank's loss sum over every rank's
 *    targets (world 1: the model's own number, bit for bit).
 *  - Each rank's loss is normalised by its own targets and the gradients are averaged (as
 *    torch DDP): equal to one rank at world x the batch when every rank has as many valid
 *    targets (fixed-length sequences, fully labelled masks).
 *  - fp16: a rank whose loss overflows skips; every other rank then skips too (the skip
 *    flags travel with the loss), and the loss scaler stays the same on every rank.
 *  - Batch norm uses each rank's own batch statistics (like DDP without SyncBatchNorm):
 *    N ranks at batch b are not one rank at N*b for the U-Net; the parameters stay the same
 *    on every rank all the same (averaged gradients, rank 0's running statistics).
 *  - A model calls vl_grad_ready when a gradient is final in a micro-batch's backward;
 *    with overlap on, the wrapper's hook (c->grad_hook) copies it into its bucket and
 *    starts every bucket whose gradients are all final, in bucket order (as torch's
 *    Reducer), driving MPI's progress meanwhile. A model that never calls it still works:
 *    every bucket then starts after backward.
 *
 * dp: every rank passes fwd_bwd the global batch's shapes (plan_batch(B) gives world * B
 * samples, the leading dimension a multiple of world); only rank 0's data is read, the
 * other ranks' data is ignored (NULL is fine). Rows [r*b, (r+1)*b) of every tensor go to
 * rank r. How it differs from torch.nn.DataParallel: DataParallel gathers the replicas'
 * outputs on device 0 and computes the loss there; our models fuse forward, loss and
 * backward, so each replica computes the loss of its shard (only the numbers travel).
 * That spares rank 0 the gathered outputs and the loss, so the baseline is faster than
 * DataParallel and its measured idle share is a lower bound. Replicas keep no optimizer
 * state (as DataParallel's replicas); an NCCL communicator is refused (host scatter).
 *
 * zero1: AdamW and SGD only (Adafactor's factored second moment is not elementwise: it
 * is refused). The global gradient norm is the sum of the shards' sums of squares (the
 * same on every rank), so clipping, the fp16 overflow skip and the loss scaler decide
 * alike everywhere. The updated fp32 values are all-gathered through the gradients' flat
 * buffer (spent by then: no extra bytes) and copied into the parameters (masters under
 * AMP, whose working copies are then refreshed).
 *
 * Stats: compute_s is the inner forward + backward and the update; comm_s each collective
 * from its start to its completion (seen by a poll during backward or when its wait
 * returns); exposed_s the time blocked in waits; idle_s (dp, ranks other than 0) the time
 * blocked waiting for rank 0 (scatter, its decision, the parameters' broadcast). Host
 * clock, after a device sync on CUDA. */
#ifndef VRAMLAB_DDP_H
#define VRAMLAB_DDP_H

#include "vramlab/dist.h"
#include "vramlab/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { VL_DIST_SINGLE = 0, VL_DIST_DP, VL_DIST_DDP, VL_DIST_ZERO1, VL_DIST_COUNT } vl_dist_mode;
const char *vl_dist_mode_name(vl_dist_mode m);
int vl_dist_mode_parse(const char *s, vl_dist_mode *out); /* 0 on success */

#define VL_DDP_BUCKET_CAP (25u << 20)      /* PyTorch's bucket_cap_mb=25 */
#define VL_DDP_FIRST_BUCKET_CAP (1u << 20) /* dist._DEFAULT_FIRST_BUCKET_BYTES */

/* What one rank measured over the steps since the model was made (or stats reset). */
typedef struct {
  long steps;
  double step_s;        /* wall seconds inside fwd_bwd + apply */
  double compute_s;     /* inner fwd_bwd and the update: this rank busy */
  double comm_s;        /* from each collective's start to its completion, summed */
  double exposed_s;     /* blocked waiting for collectives (comm not hidden, and idle) */
  double idle_s;        /* dp: waiting for rank 0 (scatter, update, broadcast) */
  double bytes;         /* payload bytes this rank sent into collectives */
  int n_buckets;
  size_t bucket_bytes[64]; /* the first 64 buckets' sizes, in reduction order */
} vl_dist_stats;

typedef struct {
  const vl_model_type *inner; /* must have train_state */
  const void *inner_cfg;
  vl_dist_mode mode;
  int world, rank;            /* a run: the communicator's; a plan: any */
  vl_comm *comm;              /* NULL on a plan context (and fine for single) */
  size_t bucket_cap;          /* 0: VL_DDP_BUCKET_CAP */
  size_t first_bucket_cap;    /* 0: VL_DDP_FIRST_BUCKET_CAP */
  bool overlap;               /* ddp: allreduce each bucket when ready (else after backward) */
  bool grad_as_bucket_view;   /* ddp: gradients are views into the buckets */
} vl_dist_cfg;

extern const vl_model_type vl_model_dist;

/* The wrapper's measurements; VL_ERR_INVALID when m is not a vl_model_dist. */
vl_status vl_dist_stats_get(const vl_model *m, vl_dist_stats *out);
void vl_dist_stats_reset(vl_model *m);
/* The inner model (e.g. for predict); NULL when m is not a vl_model_dist. */
vl_model *vl_dist_inner(vl_model *m);

/* ---- pure helpers -------------------------------------------------------------------- */
/* PyTorch's dist._compute_bucket_assignment_by_size over tensors of bytes[i] in the order
 * given (model.parameters() order), limits {first, cap, cap, ...} as DDP passes them, and
 * the reversal DDP applies before handing buckets to its reducer: bucket_of[i] is tensor
 * i's bucket in reduction order (0 = the first reduced). Returns the bucket count. */
int vl_ddp_assign_buckets(const size_t *bytes, int n, size_t first_cap, size_t cap, int *bucket_of);
/* ZeRO-1's flat layout: total elements padded up to a multiple of world; shard = padded /
 * world; this rank's shard is [rank * shard, (rank + 1) * shard). */
void vl_zero_layout(int64_t total, int world, int64_t *padded, int64_t *shard);

#ifdef __cplusplus
}
#endif
#endif
