/* A case wires engine parts into one case study: which model, which data, which metrics.
 * The driver (harness/) drives it rung by rung; a case never prints reports itself. This
 * header is the kit's side of that contract: the env a hook gets, the hooks a case fills
 * in, and the pieces every case shares (kit/case_env.c, kit/case_run.c). The registry of
 * cases is the driver's (harness/registry.h). */
#ifndef VRAMLAB_CASE_H
#define VRAMLAB_CASE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>

#include "knobs.h"
#include "util.h"
#include "vramlab/mimic.h"
#include "vramlab/run.h"

/* A case's failures follow the engine's convention (vramlab/core.h): every hook and helper
 * returns vl_status and leaves its message once in the env's vl_err (vl_case_fail, or a
 * kit call given &env->err: vl_knob_int(k, ..., &env->err)); the driver owns the env and
 * prints the message. VL_CASE_ERR_LEN: the size of a case's local message buffers for the
 * engine's and the data sets' calls that still take one. */
#define VL_CASE_ERR_LEN VL_ERR_LEN

/* The most rungs a ladder holds (harness/ladder.h), so the most a results file's rungs
 * array holds for a case to walk. */
#define VL_MAX_RUNGS 16
/* One measurement's relative noise on these machines: the spread given a value measured once
 * (the report's verdicts; a case's own argmax over one-run cells, dataloader's sweep). */
#define VL_NOISE_ONE_RUN 0.05

typedef struct {
  const char *scale;       /* run scale: tiny | small | full */
  vl_device device;        /* where `run` executes */
  const vl_knobs *setting; /* the [case] section (after --set) */
  int quiet;
  bool profile;            /* --profile: model cases time every operation of the timed steps */
  double sgemm_flops;      /* this machine's sgemm FLOP/s, measured before the ladder (0: not) */
  vl_err err;              /* the last failure's message (vl_case_fail) */
  /* Checkpoint and resume (run, bench; only cases with `resumable` get them):
   * --save-every N: a checkpoint every N optimizer steps into ckpt_dir (0: none); ckpt_dir
   * (<out>/<case>/ckpt/<rung>-rep<k>, set per run by the harness; NULL: no checkpoints,
   * not even on Ctrl-C); resume: the checkpoint file this run continues from (--resume,
   * resolved by vl_ckpt_resolve; NULL: a fresh run); keep_last: the step-N.ckpt files
   * ckpt_dir keeps (--keep-last; 0: every one). */
  long save_every, keep_last;
  const char *ckpt_dir;
  const char *resume;
} vl_case_env;

/* The cases' vl_fail: record a message (printf-style) in env->err and return s, so VL_TRY
 * and VL_TRY_GOTO pass a case's failure up unchanged. A failure of an engine call is passed
 * on with the engine context's message: vl_case_fail(env, s, "%s", c->err). */
vl_status vl_case_fail(vl_case_env *env, vl_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

typedef struct vl_case {
  const char *id;
  const char *summary;
  /* Every knob a rung may set and every [case] setting the case reads, with its default
   * and help, {NULL}-terminated: the one place a default is written (knobs.h). The
   * harness's own settings (title, reps) are vl_harness_settings. */
  const vl_knob_decl *knobs;
  const char *const *scales;  /* valid scales, NULL-terminated */
  /* Every metric its plan, run and extra write (numbers a claim can judge), NULL-terminated:
   * a claim naming anything else is refused when the claims file is loaded. */
  const char *const *metrics;
  /* Every hook returns VL_OK, or a status with its message in env->err (vl_case_fail). */
  /* Optional: parse the setting and every knob of a rung (run-only ones included) at
   * env->scale without planning or running anything, so a bad value is refused before the
   * first rung runs; the message names the knob. */
  vl_status (*check)(vl_case_env *env, const vl_knobs *knobs);
  /* Plan the rung at `scale` (memory, FLOPs, fits, max batch, OOM rate) into out. */
  vl_status (*plan)(vl_case_env *env, const char *scale, const vl_knobs *knobs, cJSON *out);
  /* Run one repetition of the rung on env->device at env->scale; fills out. A rung out of
   * memory is a result (out.oom), not a failure. */
  vl_status (*run)(vl_case_env *env, const vl_knobs *knobs, int rep, cJSON *out);
  /* Optional: case-wide measurements after the ladder's runs (a sweep, a ceiling), stored
   * in res (e.g. res.sweep, res.case_metrics). */
  vl_status (*extra)(vl_case_env *env, cJSON *res);
  /* Optional: the rung's PyTorch peer at env->scale without running anything (`vramlab
   * peer-config`, the MemTracker fixtures): out gets "script" (under tools/peers/) and
   * "config" (the setup JSON the extra hook sends it, at `threads` threads on env->device),
   * or "not_measured" with the reason a peer cannot run the rung. */
  vl_status (*peer_config)(vl_case_env *env, const vl_knobs *knobs, int threads, cJSON *out);
  /* How the case measures, one paragraph of markdown for the report's setting. */
  const char *method;
  /* The case's own report sections after the claims (tables, plots into dir). */
  void (*report)(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot);
  /* Optional: the process a case starts on every rank under mpirun (`vramlab worker CASE
   * ARGS...`, multi-gpu); returns the process's exit status. */
  int (*worker)(int argc, char **argv);
  /* Its run honours env->save_every, env->ckpt_dir and env->resume (--save-every,
   * --resume); the harness refuses those options for any other case. */
  bool resumable;
} vl_case;

/* A rung's knobs as a results file holds them (rung.knobs, strings) into k. */
vl_status vl_case_knobs_of(vl_case_env *env, const cJSON *rung, vl_knobs *k);

/* Shared pieces of the cases (case_env.c). */
/* A JSON object {category: bytes} of the arena's categories. */
cJSON *vl_case_cats_json(const size_t *v);
/* Loader x_alloc/x_free hooks: batch images in the backend's pinned host memory; user is
 * the vl_ctx. */
void *vl_case_pinned_alloc(void *user, size_t n);
void vl_case_pinned_free(void *user, void *p);
/* Data-generation progress on the harness's progress line (every `every` items). */
void vl_case_gen_progress(int64_t done, int64_t total, void *user);
/* Least squares y = a + b x over n points, with R^2. */
void vl_case_linfit(const double *x, const double *y, int n, double *a, double *b, double *r2);

/* ---- the engine's training scaffolding (vramlab/run.h) as results JSON (case_run.c) ---- */
/* The card a rung plans for: card and cuda_context (setting), cap_fraction (rung). The
 * arena gets fraction x card, at most card - context (the CUDA context sits outside the cap
 * set_per_process_memory_fraction sets). */
typedef struct {
  size_t card, context, cap;
  double cap_fraction;
} vl_case_card;
/* The declarations vl_case_card_parse reads, for a case's knob table (one definition of
 * their defaults, shared by every case that plans for a card). */
#define VL_CASE_CARD_KNOBS                                                                       \
  {"card", "24GiB", "the card's memory the plan fits under (--vram sets it)", VL_KNOB_SETTING},  \
  {"cuda_context", "600MiB", "CUDA context and libraries outside the allocator's cap (measured on " \
   "an H200: context + cuBLAS 599.7 MiB)",                                                       \
   VL_KNOB_SETTING},                                                                             \
  {"cap_fraction", "1.0", "the allocator's cap as a share of the card "                         \
   "(set_per_process_memory_fraction)", VL_KNOB_RUNG}
vl_status vl_case_card_parse(vl_case_env *env, const vl_knobs *k, vl_case_card *out);
/* A planned step's common keys: scale, parameters, batch/accum, peak and categories, FLOPs. */
void vl_case_plan_json(cJSON *out, const char *scale, const vl_plan_result *p, int64_t B, int64_t accum);
/* The card and the search: card/cap/context bytes, fits, max_batch, the planner's seconds. */
void vl_case_fit_json(cJSON *out, const vl_case_card *card, bool fits, int64_t max_batch, double t_plan,
                      double t_search);
/* PyTorch's step on the card (vramlab/mimic.h) as a plan's "pytorch" object: what the mimic
 * of the case's PyTorch step at `batch` needs (peak tensors, max_memory_allocated/reserved,
 * categories, where its peak is), whether it fits under `cap` (the caching allocator's
 * replay never fails), the largest batch that does (bisection up to 4096) and the seconds;
 * {"not_mimicked": why} where the rung's step is not mimicked. run(cfg, batch, capacity, ...)
 * runs the case's mimic. */
typedef vl_status (*vl_case_mimic_fn)(const void *cfg, int64_t batch, uint64_t capacity, vl_mimic_result *r,
                                      char *why, size_t whyn);
void vl_case_pytorch_json(cJSON *out, vl_case_mimic_fn run, const void *cfg, int64_t batch, uint64_t cap,
                          const char *code_path);
/* The mimic of a side by side's PyTorch step (the peer's own batch and code path) into a
 * compared rung `o`: mimic_peak_bytes (on the CPU the live tensor peak, what the peer's malloc
 * count sees; on CUDA max_memory_allocated, what the peer reads there), mimic_max_reserved_bytes
 * (CUDA), mimic_code_path, mimic_seconds; mimic_why where it is not mimicked. fake (NULL: none):
 * the mimic of the step as MemTracker traces it (PyTorch's code path on fake tensors, the CPU's),
 * into mimic_fake_peak_bytes less the batch, which MemTracker does not count: the like-for-like
 * number beside MemTracker's. */
void vl_case_peer_mimic_json(cJSON *o, vl_status s, const vl_mimic_result *m, const vl_mimic_result *fake,
                             const char *why, bool cuda);
/* "## PyTorch's own step on the card (planned, mimic)": each rung's "pytorch" beside the
 * engine's plan; replays: what step it is ("tools/peers/X.py runs (...)"); note: what it does
 * not mimic. Nothing when no rung has one. */
void vl_case_pytorch_report(const cJSON *res, FILE *md, const char *replays, const char *note);
/* What a GPU showed of the mimic (a note for vl_case_pytorch_report): measured on the H200
 * the first-light calls were lent, reports/gpu/cuda-nvidia-h200/README.md. */
#define VL_MIMIC_GPU_MEASURED                                                                         \
  "On a GPU the mimic was measured at small scale only: on an H200 (torch 2.11) its "               \
  "max_memory_allocated came within 0.04% of PyTorch's own and its max_memory_reserved within 2.3%, " \
  "on llm-lora's `baseline` and `lora` and seg-ckpt's `before` and `relu_off`, each rung in a fresh "   \
  "process (measured, reports/gpu/cuda-nvidia-h200); the full-scale steps above are not measured on a GPU."
/* A max batch as a report cell: "none fits", "≥N" at the search limit, "—" when absent. */
const char *vl_case_batch_cell(const cJSON *p, const char *key, char *b, size_t n);
/* A run's common keys: scale, device, batch/accum, step_time, FLOPs, losses, loss scale,
 * the measured peak; its step-time statistics into *st. */
void vl_case_run_json(cJSON *out, const vl_case_env *env, const vl_loop_result *L, const vl_mem_stats *ms,
                      int64_t B, int64_t accum, vl_stats *st);
/* With a profiled loop (vl_loop_cfg.profile), called by vl_case_run_json: `profile`, one
 * entry per operation kind that ran, slowest first {op, calls, seconds, flops, bytes,
 * flops_per_s, share}, totals over the timed steps, share = seconds / profile_seconds; and
 * profile_steps, profile_seconds (the timed steps' time), profile_other_seconds (step time
 * inside no operation: the model's glue, allocation, sync), profile_recompute_flops. */
void vl_case_profile_json(cJSON *out, const vl_loop_result *L);
/* On the CPU: planned_peak_bytes and plan_matches_measured for the step spec. */
void vl_case_plan_check_json(cJSON *out, const vl_case_env *env, const vl_step_spec *s, size_t measured_peak);
/* OOM triage of a run's status s (msg: the context's message; env->err may be passed).
 * VL_OK with *ran: it ran; VL_OK without: out of memory, a result (oom + error in out);
 * otherwise s, failed, with the message in env->err and out.error (and out.interrupted
 * when so). */
vl_status vl_case_triage(vl_case_env *env, vl_status s, const char *msg, cJSON *out, bool *ran);

#endif
