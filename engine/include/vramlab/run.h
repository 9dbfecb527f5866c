/* The training scaffolding every case shares, written once over vl_model (engine/run):
 * plan a step on the plan device (plan.c), fits and the largest-batch search (search.c),
 * the timed loop with warm-up and OOM triage (loop.c), planned-equals-measured (plan.c).
 * It returns C structs; the cases turn them into JSON (the engine has no JSON). */
#ifndef VRAMLAB_RUN_H
#define VRAMLAB_RUN_H

#include <signal.h>

#include "vramlab/ckpt.h"
#include "vramlab/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- planning ------------------------------------------------------------------------ */
/* One training step: a model and its config, the shapes of one micro-batch (data ignored)
 * and how many micro-batches of that shape the step sums. */
typedef struct {
  const vl_model_type *type;
  const void *cfg;
  uint64_t seed;
  vl_batch batch;
  int64_t accum;
  int plan_micro_max; /* micro-batches a plan runs (the rest extrapolated); 0: VL_PLAN_MICRO_MAX */
} vl_step_spec;

/* spec->batch := the model's planned batch of B samples at its config's full size. */
void vl_step_spec_set_batch(vl_step_spec *s, int64_t B);

typedef struct {
  int64_t seq;  /* allocation sequence number (a device-free time axis) */
  size_t bytes; /* live bytes: the maximum over the points this one stands for */
} vl_mem_point;

typedef struct {
  vl_status status;
  char err[256];          /* the plan context's message when status != VL_OK */
  vl_mem_stats mem;       /* the arena's stats after the step (also after a failed one) */
  vl_param_counts params;
  double flops, flops_recompute, bytes_moved; /* of the whole step (all micro-batches) */
  vl_mem_point *timeline; /* with `timeline`: the step's live bytes, at most ~800 points */
  size_t n_timeline;
} vl_plan_result;

/* A step of accum micro-batches is planned with at most VL_PLAN_MICRO_MAX of them. Every
 * micro-batch after the first allocates and frees the same tensors in the same order, so
 * the arena is in its steady state from the second on and a longer step has the same peak;
 * FLOPs and bytes of the micro-batches not planned are the last planned one's, added.
 * Planning all of them took minutes at accum=4096: the batch search plans dozens of steps.
 * 4 covers every ladder's accumulation exactly (seg-ckpt's 4) and makes the Mistral-7B ckpt
 * rung at accum=4096 plan in 0.3 s instead of 3 s (64 before); test_run proves the
 * extrapolation equal to planning every micro-batch, byte for byte and FLOP for FLOP. */
#define VL_PLAN_MICRO_MAX 4

/* Plan one full training step from a fresh plan arena capped at `cap`, following the
 * workspace rules of `target` (VL_DEV_CUDA: a card's; VL_DEV_CPU: this machine's). Returns
 * out->status (VL_ERR_OOM: the step does not fit under cap). Free with vl_plan_result_free. */
vl_status vl_run_plan(const vl_step_spec *s, size_t cap, vl_device target, bool timeline,
                      vl_plan_result *out);
void vl_plan_result_free(vl_plan_result *r);

/* Does the step fit under cap on a CUDA card (its workspace rules)? */
bool vl_run_fits(const vl_step_spec *s, size_t cap);

/* Planned-equals-measured: plan the step uncapped with this machine's CPU workspace rules;
 * *planned is its peak, *match whether it planned and equals measured_peak exactly. */
void vl_run_plan_check(const vl_step_spec *s, size_t measured_peak, size_t *planned, bool *match);

/* ---- the largest batch ---------------------------------------------------------------- */
#define VL_MAX_BATCH_SEARCH 65536

/* Largest b in [lo, limit] with pred(b) true, for a predicate monotone in b (true up to a
 * point): doubling from lo, then bisection. 0 when pred(lo) is false; `limit` means "at
 * least that many". */
int64_t vl_run_max_true(bool (*pred)(void *user, int64_t b), void *user, int64_t lo, int64_t limit);

/* Largest micro-batch B >= lo (the model's planned batch of B samples, s->accum of them)
 * whose step fits under cap on a CUDA card; 0 when not even lo fits, VL_MAX_BATCH_SEARCH
 * means "at least that many". */
int64_t vl_run_max_batch(const vl_step_spec *s, size_t cap, int64_t lo);

/* ---- the timed loop ---------------------------------------------------------------------- */
typedef struct {
  long warmup;                     /* the first `warmup` steps (of res->steps) are not timed */
  long total;                      /* stop when res->steps reaches it; < 0: when data ends */
  bool reset_peaks_after_warmup;   /* arena peaks := current before the first timed step */
  /* --profile: ctx->profile on for the timed steps only (warm-up, and whatever the caller
   * runs between calls, e.g. an evaluation, stay out), summed into res->profile */
  bool profile;
  /* The micro-batches of step `step` (*mb, *n); *n = 0 ends the loop (end of the data).
   * *wait: seconds the step waited for its data (0 when it never waits). */
  vl_status (*next)(void *user, long step, const vl_batch **mb, int *n, double *wait);
  /* After each step (progress lines, the case's own counters); may be NULL. */
  void (*after)(void *user, long step, bool timed, const vl_step_info *info, double seconds,
                double wait);
  void *user;
  const volatile sig_atomic_t *stop; /* set (Ctrl-C): stop at the next step edge; may be NULL */
  /* set (SIGTERM): stop between operations, inside a step (ctx->stop_ops while it runs): the
   * step in flight is lost and nothing is saved for it; may be NULL */
  const volatile sig_atomic_t *stop_now;
  /* Checkpoints (vramlab/ckpt.h) into save_dir (NULL: none) as step-<n>.ckpt + latest:
   * after every step that makes res->steps a multiple of save_every (0: none), and, when
   * `stop` ends the loop, at that step edge before it returns VL_ERR_INTERRUPTED. Each holds
   * the model's training state, the losses of every step so far and the caller's own state
   * from save_state. The time spent saving is in no step's time (res->save_seconds). */
  long save_every;
  const char *save_dir;
  const char *ckpt_tag; /* the checkpoint's tag (vl_ckpt_meta.tag), e.g. the case id; may be NULL */
  /* The run's settings that shape its trajectory (vl_ckpt_meta.settings), recorded in each
   * checkpoint for a resume to compare; may be NULL. */
  const char *ckpt_settings;
  long keep_last; /* step-N.ckpt files save_dir keeps (vl_ckpt_save_dir); 0: every one */
  /* The caller's state at the edge after `steps` steps (its data position, RNG) as a
   * malloc'd blob the loop frees; NULL: none. A resume hands it back (vl_run_resume). */
  vl_status (*save_state)(void *user, long steps, void **blob, size_t *len);
} vl_loop_cfg;

/* What the loop measured; vl_run_loop appends to it, so a case can run it epoch by epoch
 * (evaluating between them). Zero it before the first call; free with vl_loop_result_free. */
typedef struct {
  long steps;           /* steps taken (warm-up included) */
  double *losses;       /* (steps) the loss of every step */
  long timed;
  double *times;        /* (timed) step seconds, backend timer (CUDA events / host clock) */
  double flops;         /* model FLOPs of the timed steps (recompute excluded) */
  double wall, wait;    /* of the timed steps: wall seconds including data, data wait */
  int64_t targets;      /* valid targets (tokens, pixels) of the timed steps */
  long skipped, skipped_timed; /* fp16 overflow skips: all steps / timed steps */
  float loss_scale_end;
  long cap;             /* capacity of losses and times */
  /* With cfg->profile: the operations of the timed steps, indexed by vl_op (calls, kernel
   * seconds, FLOPs with recompute, bytes), and the recompute FLOPs apart, so the profile's
   * FLOPs reconcile with `flops`. */
  bool profiled;
  vl_op_profile profile[VL_OP_COUNT];
  double flops_recompute;
  /* Checkpoints: steps restored by vl_run_resume (0: a fresh run), checkpoints written, the
   * step count of the last one and its path, seconds spent writing them. */
  long resumed_from;
  long saves, saved_step;
  char saved_path[4096];
  double save_seconds;
} vl_loop_result;

/* Warm-up, then timed steps (timer_start/timer_stop of the backend around each step).
 * Returns the first failing status with the context's message: VL_ERR_OOM when a step
 * ran out of memory (see vl_run_is_oom), VL_ERR_INTERRUPTED when cfg->stop was set (after
 * saving a checkpoint at that step edge when cfg->save_dir is set). After a resume the first
 * step is warm-up again (cold caches and first-use costs), unless cfg->warmup is 0. */
vl_status vl_run_loop(vl_model *m, const vl_loop_cfg *cfg, vl_loop_result *res);
void vl_loop_result_free(vl_loop_result *r);

/* Resume: restore m from the checkpoint at path (vl_ckpt_load; tag and settings as there: a
 * checkpoint made with other settings is refused, naming the first that differs) and put its
 * steps and losses into res (fresh: zeroed), so vl_run_loop continues at the saved step
 * and res->losses holds the whole trajectory. *meta (vl_ckpt_meta_free) carries the
 * caller's blob back. A refused checkpoint leaves m and res unchanged. */
vl_status vl_run_resume(vl_model *m, const char *path, const char *tag, const char *settings, vl_loop_result *res,
                        vl_ckpt_meta *meta);

/* Interleaved repetitions: `warm` untimed rounds, then `rounds` timed ones, each one step of
 * every model in turn on the same batch b (one micro-batch), so a noisy neighbour on a
 * shared machine hits every model alike. times: (n, rounds), model-major. The models share
 * one context. */
vl_status vl_run_interleaved(vl_model *const *m, int n, const vl_batch *b, int warm, int rounds,
                             const volatile sig_atomic_t *stop, double *times);

/* OOM triage: a step that ran out of memory is a result (the rung does not fit this
 * device), not a failure of the run. */
static inline bool vl_run_is_oom(vl_status s) { return s == VL_ERR_OOM; }

#ifdef __cplusplus
}
#endif
#endif
