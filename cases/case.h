/* A case wires engine parts into one case study: which model, which data, which metrics.
 * The harness drives it rung by rung; a case never prints reports itself. */
#ifndef VRAMLAB_CASE_H
#define VRAMLAB_CASE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>

#include "harness.h"
#include "knobs.h"
#include "vramlab/run.h"

typedef struct {
  const char *scale;       /* run scale: tiny | small | full */
  vl_device device;        /* where `run` executes */
  const vl_knobs *setting; /* the [case] section (after --set) */
  int quiet;
  bool profile;            /* --profile: model cases time every operation of the timed steps */
} vl_case_env;

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
  /* Optional: parse the setting and every knob of a rung (run-only ones included) at
   * env->scale without planning or running anything, so a bad value is refused before the
   * first rung runs. 0, or -1 with a message naming the knob. */
  int (*check)(const vl_case_env *env, const vl_knobs *knobs, char *err, size_t errn);
  /* Plan the rung at `scale` (memory, FLOPs, fits, max batch, OOM rate) into out. */
  int (*plan)(const vl_case_env *env, const char *scale, const vl_knobs *knobs, cJSON *out,
              char *err, size_t errn);
  /* Run one repetition of the rung on env->device at env->scale; fills out. */
  int (*run)(const vl_case_env *env, const vl_knobs *knobs, int rep, cJSON *out, char *err,
             size_t errn);
  /* Optional: case-wide measurements after the ladder's runs (a sweep, a ceiling), stored
   * in res (e.g. res.sweep, res.case_metrics). */
  int (*extra)(const vl_case_env *env, cJSON *res, char *err, size_t errn);
  /* How the case measures, one paragraph of markdown for the report's setting. */
  const char *method;
  /* The case's own report sections after the claims (tables, plots into dir). */
  void (*report)(cJSON *res, FILE *md, const char *dir, const char *case_id, bool gnuplot);
} vl_case;

const vl_case *vl_case_find(const char *id);
const vl_case *const *vl_case_all(int *n);
/* The declaration of name in the case's table (or, for a setting, the harness's) when it
 * may be set `where` (VL_KNOB_RUNG, VL_KNOB_SETTING); NULL otherwise. */
const vl_knob_decl *vl_case_knob(const vl_case *c, const char *name, unsigned where);
/* Check a rung's knobs against the case's declarations: unknown knob -> error naming the known. */
int vl_case_check_knobs(const vl_case *c, const char *rung, const vl_knobs *k, char *err, size_t errn);
/* The names declared with `where` (the case's, then for settings the harness's), ", "-separated
 * into buf (cut at n, for messages). */
void vl_case_known_names(const vl_case *c, unsigned where, char *buf, size_t n);
/* The same for one [case] setting key. */
int vl_case_check_setting(const vl_case *c, const char *key, char *err, size_t errn);

/* Shared pieces of the cases (cases/registry.c). */
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
  {"cuda_context", "512MiB", "CUDA context and libraries outside the allocator's cap",          \
   VL_KNOB_SETTING},                                                                             \
  {"cap_fraction", "1.0", "the allocator's cap as a share of the card "                         \
   "(set_per_process_memory_fraction)", VL_KNOB_RUNG}
int vl_case_card_parse(const vl_case_env *env, const vl_knobs *k, vl_case_card *out, char *err, size_t errn);
/* A planned step's common keys: scale, parameters, batch/accum, peak and categories, FLOPs. */
void vl_case_plan_json(cJSON *out, const char *scale, const vl_plan_result *p, int64_t B, int64_t accum);
/* The card and the search: card/cap/context bytes, fits, max_batch, the planner's seconds. */
void vl_case_fit_json(cJSON *out, const vl_case_card *card, bool fits, int64_t max_batch, double t_plan,
                      double t_search);
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
/* OOM triage of a run's status: 1 ran; 0 out of memory (a result: oom + error in out);
 * -1 failed (error in out and err, interrupted when so). msg: the context's message. */
int vl_case_triage(const vl_case_env *env, vl_status s, const char *msg, cJSON *out, char *err, size_t errn);

extern const vl_case vl_case_llm_lora;
extern const vl_case vl_case_dataloader;
extern const vl_case vl_case_seg_ckpt;
void vl_seg_ckpt_report(cJSON *res, FILE *md, const char *dir, const char *case_id, bool gnuplot);
void vl_dataloader_report(cJSON *res, FILE *md, const char *dir, const char *case_id, bool gnuplot);
void vl_llm_lora_report(cJSON *res, FILE *md, const char *dir, const char *case_id, bool gnuplot);
#endif
