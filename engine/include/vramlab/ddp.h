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
 * per-rank memory plans exactly for any number of ranks. */
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
