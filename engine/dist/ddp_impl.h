/* What the data-parallel wrapper's files share (engine-internal): the wrapper's state, its
 * gradient buckets, ZeRO-1's optimizer slices, and the helpers each mode uses.
 *   ddp.c          the vl_model_type: create, the modes' steps, stats, the parameter broadcast
 *   ddp_buckets.c  pure helpers (PyTorch's bucket assignment, ZeRO's layout, mode names)
 *   ddp_reduce.c   buckets: layout, the grad-ready hook, launching and completing collectives
 *   ddp_dp.c       the DataParallel-style baseline (scatter, reduce to rank 0, broadcast)
 *   zero1.c        ZeRO stage 1 (flat gradients, sharded optimizer state, allgather) */
#ifndef VRAMLAB_DDP_IMPL_H
#define VRAMLAB_DDP_IMPL_H

#include "vramlab/ddp.h"

/* One gradient bucket: fp32 elements of its parameters, back to back in parameter order. */
typedef struct {
  vl_tensor buf;      // (n) fp32, VL_MEM_COMM (DDP / DP)
  int first, count;   /* its trainable slots: d->border[first .. first + count) */
  int64_t n;          /* elements */
  int ready;          /* parameters whose gradient is final in this step */
  bool launched;      /* its collective has started in this step */
  vl_comm_req *req;   /* in flight (NULL once completed) */
  double t_start;
  bool seen_done;     /* completion observed by a poll before the wait */
  double t_done;
} vl_ddp_bucket;

/* ZeRO-1: the part of one parameter inside this rank's shard, with its optimizer state. */
typedef struct {
  int slot;           /* trainable slot */
  int64_t lo, len;    /* elements [lo, lo + len) of the parameter */
  vl_tensor state[2]; // (1, len) fp32 each: AdamW m, v; SGD momentum in [0]
} vl_zero_slice;

typedef struct vl_dist {
  vl_ctx *c;
  vl_dist_cfg cfg;
  vl_model *inner;
  vl_train_state ts;
  int world, rank;
  vl_comm *comm;
  bool talk;          /* collectives run: a communicator, a run context, world > 1 */
  /* trainable parameters with a gradient, in parameter order ("slots") */
  int nt;
  int *tidx;          /* (nt) parameter index of each slot */
  int *slot_of;       /* (ts.n) slot of each parameter, -1 when it has none */
  int64_t *off;       /* (nt) element offset in its bucket (DDP/DP) or in the flat (ZeRO-1) */
  int *bucket_of;     /* (nt) bucket in reduction order */
  int *nready;        /* (nt) grad-ready calls in this step */
  int n_micro;        /* micro-batches of the step in flight (what "ready" counts to) */
  int nb, next_launch;
  vl_ddp_bucket *b;
  int *border;        /* (nt) slots bucket by bucket */
  bool hooked;        /* the grad-ready hook is installed (overlap) */
  vl_status hook_status;
  char hook_err[512];
  /* ZeRO-1 */
  vl_tensor flat;     // (padded) fp32 VL_MEM_COMM: every gradient, then the gathered params
  int64_t total, padded, shard;
  int nsl;
  vl_zero_slice *sl;
  /* NCCL: the small exchanges (loss, skip, norm) go through device memory */
  vl_tensor xbuf;     // (world * VL_DIST_XMAX) f64 as bytes, VL_MEM_COMM; NCCL only
  vl_dist_stats st;
} vl_dist;

#define VL_DIST_XMAX 8 /* doubles per rank in one small exchange */

/* Host clock at a step edge (after a device sync on CUDA, so the time is the work's). */
double vl_dist_now(vl_dist *d);
/* The parameter of a trainable slot. */
static inline vl_param *vl_dist_param(vl_dist *d, int slot) { return &d->ts.p[d->tidx[slot]]; }
/* The fp32 tensor an update writes: the AMP master, else the weights. */
static inline vl_tensor *vl_dist_truth(vl_param *p) { return p->has_master ? &p->master : &p->w; }
/* A (1, n) fp32 view of t starting at element e0. */
vl_tensor vl_dist_span(const vl_tensor *t, int64_t e0, int64_t n);

/* rank 0's buffers (BN running statistics) to every rank (torch DDP's broadcast_buffers). */
vl_status vl_dist_sync_buffers(vl_dist *d);

/* ---- ddp_reduce.c ---------------------------------------------------------------------- */
/* Buckets from PyTorch's assignment; with grad_as_bucket_view each gradient freed and made
 * a view into its bucket. Buckets zeroed. */
vl_status vl_dist_make_buckets(vl_dist *d);
void vl_dist_free_buckets(vl_dist *d);
/* The step's reduction: reset per-step counters (n micro-batches), the hook in or out. */
void vl_dist_step_begin(vl_dist *d, int n_micro, bool hook);
void vl_dist_step_hook_off(vl_dist *d);
/* Copy every gradient not yet in its bucket and start every bucket not yet started. */
vl_status vl_dist_launch_rest(vl_dist *d);
/* Wait for every started bucket (comm time from its start to its completion). */
vl_status vl_dist_wait_buckets(vl_dist *d);
/* The reduced gradients from the buckets into p->grad (nothing with grad_as_bucket_view). */
vl_status vl_dist_copy_back(vl_dist *d);
/* Every rank's k doubles (k <= VL_DIST_XMAX) into all (world * k), rank-major. Without
 * collectives every slot holds mine. */
vl_status vl_dist_exchange(vl_dist *d, const double *mine, int k, double *all);
/* Wait for one request, counting the blocked time (exposed; idle too when idle). */
vl_status vl_dist_wait(vl_dist *d, vl_comm_req *r, bool idle);

/* After the reduction: the global loss, the skip consensus (a rank that saw an fp16
 * overflow in forward skipped; then every rank skips), the targets of every rank. */
vl_status vl_dist_agree(vl_dist *d, vl_step_info *info);
/* The inner model's own per-step bookkeeping without its update (the U-Net's "gradient
 * written yet" flags): vl_model_step_end. */
vl_status vl_dist_inner_bookkeeping(vl_dist *d);

/* ---- ddp_dp.c ---------------------------------------------------------------------------- */
vl_status vl_dist_dp_fwd_bwd(vl_dist *d, const vl_batch *mb, int n, vl_step_info *info);
vl_status vl_dist_dp_apply(vl_dist *d, vl_step_info *info);

/* ---- zero1.c ------------------------------------------------------------------------------ */
vl_status vl_dist_zero_make(vl_dist *d);
void vl_dist_zero_free(vl_dist *d);
vl_status vl_dist_zero_fwd_bwd(vl_dist *d, const vl_batch *mb, int n, vl_step_info *info);
vl_status vl_dist_zero_apply(vl_dist *d, vl_step_info *info);

#endif
