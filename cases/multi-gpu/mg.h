/* multi-gpu's own pieces shared by its files: a rung's settings and its knob table
 * (config.c), the ring allreduce time model of the modeled section (timemodel.c), the
 * full-scale plan of a rung and its per-card tables (plan.c), the per-rank worker under
 * mpirun (worker.c), the parent's run hook that starts and aggregates it (run.c), the
 * case-wide measurements after the ladder (extra.c) and the report sections
 * (mg_report.c).
 * The U-Net rung, its training settings, its data and loader are the kit's (kit/segrung.h),
 * shared with seg-ckpt.
 * Every function that can fail returns vl_status with its message in env->err. */
#ifndef VRAMLAB_MULTI_GPU_H
#define VRAMLAB_MULTI_GPU_H

#include "kit/segrung.h"
#include "vramlab/ddp.h"

/* ---- the ring allreduce time model (pure) ---------------------------------------------- */
/* A link preset: nccl-tests' bus bandwidth of the link, the latency of one ring step, and
 * the device's peak compute rate; efficiency is the share of the peak a step achieves. */
typedef struct {
  const char *name;  /* "pcie" | "nvlink" */
  double busbw;      /* bytes/s */
  double latency;    /* seconds per ring step */
  double peak_flops; /* FLOP/s */
  double efficiency; /* achieved / peak, (0, 1] */
} vl_mg_link;

/* One rank's step as the model sees it (from the plan). */
typedef struct {
  double flops;          /* FLOPs one rank computes per step (recomputed ones included) */
  double bwd_share;      /* share of the compute time that is backward (overlap window) */
  const double *buckets; /* DDP: bucket bytes in reduction order (the last is exposed) */
  int n_buckets;
  double grad_bytes;     /* ZeRO-1: the padded flat gradient buffer; DP: the reduce */
  double param_bytes;    /* ZeRO-1: the fp32 parameters all-gathered; DP: broadcast */
  double input_bytes;    /* DP: one rank's input shard, scattered by rank 0 */
} vl_mg_work;

typedef struct {
  double compute_s;  /* flops / (peak x efficiency) */
  double comm_s;     /* every collective of the step, end to end */
  double exposed_s;  /* the part of comm_s the step waits for */
  double step_s;     /* compute_s + exposed_s */
  double speedup;    /* n x compute_s / step_s: samples/s against one card at the same batch */
  double busy;       /* compute_s / step_s */
} vl_mg_time;

/* Ring allreduce of `bytes` over n ranks: 2(n-1)/n x bytes / busbw + 2(n-1) x latency
 * (0 for n = 1). Reduce-scatter or allgather of `bytes` (the whole buffer): half of it,
 * (n-1)/n x bytes / busbw + (n-1) x latency. Rooted reduce or broadcast (pipelined):
 * bytes / busbw + (n-1) x latency. */
double vl_mg_allreduce_s(double bytes, int n, const vl_mg_link *l);
double vl_mg_half_s(double bytes, int n, const vl_mg_link *l);
double vl_mg_rooted_s(double bytes, int n, const vl_mg_link *l);
/* The modeled step of mode on n cards (assumptions in timemodel.c's top comment). */
vl_mg_time vl_mg_model(vl_dist_mode mode, bool overlap, int n, const vl_mg_link *l, const vl_mg_work *w);

/* ---- a rung ------------------------------------------------------------------------------- */
#define VL_MG_MAX_SWEEP 8
#define VL_MG_CARDS_N 4 /* the per-card tables: 1, 2, 4, 8 cards */
extern const int vl_mg_cards[VL_MG_CARDS_N];

typedef struct {
  vl_segrung seg;          /* the U-Net, training, loader, card (seg-ckpt's parse) */
  vl_dist_mode mode;
  int ranks, threads;
  bool oversubscribe, overlap, grad_as_bucket_view;
  size_t bucket_cap, first_bucket_cap;
  long steps, warmup;       /* timed and warm-up steps of a run, per rank */
  double timeout_s;         /* one mpirun job */
  double bwd_share;
  vl_mg_link link[2];       /* the modeled presets: pcie (RTX 4090 class), nvlink (H100 class) */
  size_t sweep[VL_MG_MAX_SWEEP]; /* bucket caps of extra's sweep (n_sweep 0: none) */
  int n_sweep;
  size_t coll_max_bytes;    /* largest size of extra's collective benchmark */
  double disturbed_share;   /* a job during which other processes used more of the cores ... */
  long disturbed_retries;   /* ... is run again, at most this many times */
} vl_mg_rung;

extern const vl_knob_decl vl_mg_knobs[];
/* Every knob of a rung and the setting at `scale` into r; VL_ERR_INVALID naming the knob. */
vl_status vl_mg_parse_rung(vl_case_env *env, const char *scale, const vl_knobs *k, vl_mg_rung *r);
/* The data-parallel wrapper's config for this rung at world ranks, this rank (comm NULL:
 * a plan; the inner config points into r). */
vl_dist_cfg vl_mg_dist_cfg(const vl_mg_rung *r, int world, int rank, vl_comm *comm);
/* The wrapped step at the rung's per-rank batch (DataParallel: every rank passes the global
 * batch's shapes, rank 0 its data). */
vl_step_spec vl_mg_step_spec(const vl_mg_rung *r, const vl_dist_cfg *dc);
/* Samples rank `rank` loads per step: the per-rank batch; DataParallel's rank 0 the global
 * one, its other ranks none (their shard arrives from rank 0). */
int64_t vl_mg_rank_batch(const vl_mg_rung *r, int world, int rank);

/* ---- planning (plan.c) ------------------------------------------------------------------- */
/* The rung planned at `scale` on rank 0 of its ranks: memory by category, buckets, payload,
 * the per-card table for 1, 2, 4, 8 cards and the modeled times (both presets). */
vl_status vl_mg_plan(vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out);
/* The gradients' tensor bytes in parameter order and their count (trainable elements),
 * from the inner model made on a plan context; *bytes malloc'd. */
vl_status vl_mg_grad_layout(vl_case_env *env, const vl_mg_rung *r, size_t **bytes, int *n, int64_t *elems);

/* ---- running (run.c, worker.c, extra.c) -------------------------------------------------- */
/* One repetition: `vramlab worker multi-gpu` on the rung's ranks under mpirun; aggregates
 * the ranks' files into out. Without MPI: out.not_measured with the apt-get line. */
vl_status vl_mg_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out);
/* The worker hook (`vramlab worker multi-gpu ...`): one rank's run; exit status. */
int vl_mg_worker(int argc, char **argv);
/* Start `vramlab worker multi-gpu` for rung knobs k on np ranks and read every rank's file
 * into ranks (an array, rank order); *foreign (may be NULL): the share of the machine's cores
 * that other processes used while the job ran. VL_ERR_UNSUPPORTED: no mpirun. */
vl_status vl_mg_launch(vl_case_env *env, const vl_mg_rung *r, const vl_knobs *k, int np, cJSON **ranks,
                       double *foreign);
/* vl_mg_launch, run again while other processes used more than r->disturbed_share of the
 * cores (at most r->disturbed_retries times); out gets foreign_cpu_share (of the kept job),
 * attempts and the discarded jobs' shares (disturbed_shares). */
vl_status vl_mg_launch_quiet(vl_case_env *env, const vl_mg_rung *r, const vl_knobs *k, int np, cJSON **ranks,
                             cJSON *out);
/* The ranks' files aggregated into a run's metrics. */
void vl_mg_aggregate(const vl_mg_rung *r, const cJSON *ranks, cJSON *out);
/* Speedups against the single rung, the medians for the claims, the bucket-cap sweep and
 * the collective benchmark. */
vl_status vl_mg_extra(vl_case_env *env, cJSON *res);
/* Median of n values (sorted in place); NaN for n = 0. */
double vl_mg_median(double *v, int n);
/* The median of run metric key over a rung's runs: those that ran undisturbed (other
 * processes under the disturbed_share setting) when there are any, else all of them;
 * *used / *total (may be NULL): the runs it took and the runs with the key. */
double vl_mg_run_median(const cJSON *rung, const char *key, int *used, int *total);

/* ---- report (mg_report.c) ---------------------------------------------------------------- */
void vl_mg_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot);

#endif
