/* The PyTorch peers of the model cases (docs/architecture.md "Measurement rules": peers side by side):
 * a peer process (tools/peers/<case>_peer.py) driven over a line protocol
 * (tools/peers/peer_common.py), the same step run in turn with the engine's in one run, and
 * the report's side-by-side section. Shared by llm-lora and seg-ckpt (llm_torch.c,
 * seg_torch.c map their rungs to the peer's config). A peer that is missing, fails, prints garbage or
 * stalls is a "not measured here" with the reason, never a failure of the bench. */
#ifndef VRAMLAB_KIT_PEERS_H
#define VRAMLAB_KIT_PEERS_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include "case.h"

#define VL_PEER_WHY_LEN 400
#define VL_PEER_REPLY_MAX ((size_t)1 << 20) /* a longer reply line is garbage */

/* ---- the process ----------------------------------------------------------------------------- */
typedef struct {
  pid_t pid;       /* 0: not running */
  int fd;          /* our end of the socket that is the peer's stdin and stdout */
  char *buf;       /* reply bytes read and not yet consumed */
  size_t len, cap;
  char script[64]; /* the peer's script under tools/peers/ (vl_peer_open) */
  char log[64];    /* the peer's stderr (a temp file): its last line is the reason it failed */
  char why[VL_PEER_WHY_LEN]; /* why the last call returned NULL */
} vl_peer;

/* Start argv (argv[0] found in PATH; no shell) with env_add ("NAME=value", replacing the
 * same names; NULL-terminated, may be NULL) added to the environment, in its own process
 * group, and read its first reply (the hello) within timeout_s. Returns the hello (the
 * caller frees it), or NULL with the reason in p->why (the peer is then stopped). */
cJSON *vl_peer_start(vl_peer *p, char *const argv[], char *const env_add[], double timeout_s);
/* Send one request line (no newline) and read one reply within timeout_s. NULL with
 * p->why: the peer's {"error": ...} (it keeps running), or a reply that is not one JSON
 * object, its exit, or the timeout (it is then stopped: p->pid is 0). */
cJSON *vl_peer_call(vl_peer *p, const char *request, double timeout_s);
/* "quit", up to 5 s for it to exit, else SIGKILL; its log removed. Safe on a stopped peer. */
void vl_peer_stop(vl_peer *p);

/* ---- pure pieces --------------------------------------------------------------------------- */
/* One reply line as an object, or NULL with why: not JSON, not an object, or
 * {"error": "..."} (why: the error). */
cJSON *vl_peer_parse_reply(const char *line, char *why, size_t n);
/* reply.times: exactly k finite numbers > 0 into t; 0, or -1 with why. */
int vl_peer_reply_times(const cJSON *reply, int k, double *t, char *why, size_t n);
/* Median of n values (sorts t). */
double vl_peer_median(double *t, int n);
/* A hello (or its absence) as the reason a case's peer is not measured: NULL when it is a
 * good hello; else "PyTorch is not installed (<install>): ..." for a missing module or no
 * interpreter, or the failure as it is, into why. */
const char *vl_peer_hello_why(const cJSON *hello, const char *start_why, const char *install, char *why, size_t n);

/* ---- a case's comparison --------------------------------------------------------------------- */
typedef struct {
  const char *script;  /* under tools/peers/ */
  const char *install; /* the pip line that installs what it imports */
  const char *unit;    /* "tokens" or "images": what a step processes */
  bool fresh;          /* a fresh peer process per rung (a process that ran an earlier rung
                          keeps pools and caches that make its next rung's memory read low) */
} vl_peer_kind;

/* warmup untimed steps each side first; then `rounds` rounds, each of round_warmup untimed and
 * `steps` timed steps of the engine, then the same of the peer (switching processes leaves
 * caches and idle thread pools cold for a step, on both sides alike). */
typedef struct { int warmup, round_warmup, rounds, steps; } vl_peer_rounds;

/* One rung side by side. The engine's model m (in context c) steps on accum copies of the
 * micro-batch mb; the peer gets `setup` (the same step in PyTorch). */
typedef struct {
  const char *rung;
  const char *variant; /* NULL, or what the comparison changed from the rung and why */
  vl_ctx *c;
  vl_model *m;
  const vl_batch *mb;
  int64_t accum;
  double units_per_step; /* tokens or images per step (both sides) */
  const vl_step_spec *spec; /* the step, for the planned peak */
  const cJSON *setup;
} vl_peer_cmp;

/* The Python the peers run on: $VRAMLAB_PYTHON, else python3. */
const char *vl_peer_python(void);
/* Start the case's peer for `device` with `threads` threads (on the CPU, with
 * libvlmemcount.so preloaded when the build has it). The hello, or NULL with the
 * "not measured here" reason in p->why. */
cJSON *vl_peer_open(vl_peer *p, const vl_peer_kind *k, vl_device device, int threads);
/* res.case_metrics.peers: the peer's versions, device, threads and memory method from the
 * hello (NULL: not_measured = why) and the rounds; its "rungs" array for vl_peer_compare. */
cJSON *vl_peer_results(cJSON *res, const cJSON *hello, const char *why, const vl_peer_rounds *R);
/* One rung of a case's side by side: the engine model and its batch made, then
 * vl_peer_compare into o. */
typedef vl_status (*vl_peer_rung_fn)(vl_case_env *env, vl_peer *p, const cJSON *hello, const cJSON *rung,
                                     int threads, cJSON *o);
/* A case's extra hook of PyTorch side by side: the rungs named in `compared` that ran (in
 * res), one peer process for all of them (k->fresh: a new one for each rung), `fn` for each,
 * res.case_metrics.peers (fresh_process: k->fresh) and the rungs' metrics filled. Nothing on
 * the plan device or for a ladder without those rungs. */
vl_status vl_peer_side_by_side(vl_case_env *env, cJSON *res, const vl_peer_kind *k, const vl_peer_rounds *R,
                               const char *const *compared, int n_compared, vl_peer_rung_fn fn);
/* The rung, engine and peer in turn: the peer's setup, then the rounds of R. Into o: the times of both,
 * medians, the ratio (PyTorch / engine), units/s, FLOP/s of the engine's model FLOPs at
 * both times, the engine's planned and measured peak by category, the peer's peak, its
 * live bytes before the step and what the step adds, parameter counts of both. A peer that
 * fails leaves o.not_measured and VL_OK; an engine failure is returned (env->err). */
vl_status vl_peer_compare(vl_case_env *env, vl_peer *p, const vl_peer_cmp *cmp, const vl_peer_rounds *R, cJSON *o);
/* vl_peer_compare with the engine's side made for it: a context capped by
 * vl_peer_engine_cap(cmp->spec), the model of `type` from `model_cfg` and `seed` in it
 * (cmp->c and cmp->m are set for the call, both destroyed after); an engine that cannot make
 * them goes through vl_peer_engine_failed. cmp->mb is the caller's, on the host. */
vl_status vl_peer_compare_model(vl_case_env *env, vl_peer *p, vl_peer_cmp *cmp, const vl_peer_rounds *R,
                                const vl_model_type *type, const void *model_cfg, uint64_t seed, cJSON *o);
/* The engine context's cap for a side-by-side step: none on the CPU (its pages are touched
 * lazily); on a GPU the step's planned peak and a little, since an uncapped CUDA arena
 * reserves nearly all the card and the peer process needs the rest. */
size_t vl_peer_engine_cap(const vl_step_spec *spec, vl_device device);
/* An engine failure s in a side-by-side rung (context c, may be NULL): out of memory is a
 * result (o: the rung and not_measured, VL_OK), anything else the failure (env->err). */
vl_status vl_peer_engine_failed(vl_case_env *env, vl_status s, const vl_ctx *c, const char *rung, cJSON *o);
/* The rung's first run gets peer_step_seconds, speedup_vs_torch and peer_peak_bytes from o
 * (claims and the ladder read them like any run metric); nothing for a variant. */
void vl_peer_rung_metrics(cJSON *res, const cJSON *o);
/* The major compute capability of the peer's card from its hello ("cuda_capability": [major,
 * minor]); 0 when it reports none (CPU): what sizes the mimic's cuBLAS workspaces. */
int vl_peer_cuda_cc_major(const cJSON *hello);
/* A tool of tools/peers/ (python3 TOOL --script PEER_SCRIPT --config SETUP [extra...]) run in
 * a fresh process: its reply (the last line that is a JSON object), or NULL with why in
 * o[why_key]; *secs the process's seconds. A tool that cannot import a module (PyTorch, ...)
 * names it in its reply's "missing": then o["missing"] is that module too. */
cJSON *vl_peer_run_tool(const char *peer_script, const cJSON *setup, const char *tool, char *const extra[], cJSON *o,
                        const char *why_key, double *secs);
/* PyTorch's own estimate of the step `setup` sets up for peer_script: tools/peers/memtracker_peer.py
 * (MemTracker on fake tensors) in a fresh process, into o: memtracker_peak_bytes,
 * memtracker_categories, memtracker_seconds (the trace), memtracker_build_seconds (the model
 * on fake tensors) and memtracker_process_seconds (all of it, imports too); or why not
 * (memtracker_why). */
void vl_peer_memtracker(const char *peer_script, const cJSON *setup, cJSON *o);
/* The peer's optimizer, clipping, accumulation and compute dtype as the setup's "train". */
cJSON *vl_peer_train_json(const vl_optim_cfg *o, float clip, int64_t accum, vl_dtype compute);

/* ---- PyTorch's estimator at full scale (kit/peer_full.c) ----------------------------------- */
/* A case's peer_config hook (case.h). */
typedef vl_status (*vl_peer_config_fn)(vl_case_env *env, const vl_knobs *knobs, int threads, cJSON *out);
/* The mimic of the rung's step as MemTracker traces it (PyTorch's CPU code path on fake
 * tensors, vramlab/mimic.h), the rung parsed at env->scale: *m, or a status with why. */
typedef vl_status (*vl_peer_fake_mimic_fn)(vl_case_env *env, const vl_knobs *knobs, vl_mimic_result *m, char *why,
                                           size_t n);
/* For every rung of the ladder in res at `scale` (the case's "full": the article's model):
 * MemTracker's trace of the peer's step on fake tensors of the CPU device
 * (tools/peers/memtracker_peer.py, a fresh process per rung) beside `fake`'s mimic of it, the
 * peaks and the seconds each took, into res.case_metrics.pytorch_full_scale.rungs (a rung
 * whose setup repeats an earlier one's gets that trace, same_setup_as; a rung no peer runs,
 * not_measured). A Python without PyTorch is said once (pytorch_full_scale.not_measured) and
 * stops it. Nothing on the plan device; on a GPU only that reason (the trace is the host's, and
 * the card would idle through it). VL_OK unless a rung cannot be parsed (env->err). */
vl_status vl_peer_full_scale(vl_case_env *env, cJSON *res, const char *scale, vl_peer_config_fn config,
                             vl_peer_fake_mimic_fn fake);
/* "### The full-scale step beside PyTorch's own estimator": per rung the mimic's peak, MemTracker's,
 * their difference, the mimic's milliseconds and MemTracker's seconds and their ratio; why a
 * rung has none. Nothing for results without it. */
void vl_peer_full_scale_report(const cJSON *res, FILE *md);

/* ---- the report --------------------------------------------------------------------------- */
/* "## PyTorch side by side": per compared rung, step times, the ratio, units/s, FLOP/s
 * shares of the run's sgemm, the planned peak beside PyTorch's measured peak with the
 * difference; `notes` (markdown, the case's words on what differs) after the table; a
 * results file without the comparison says why. */
void vl_peer_report(const cJSON *res, FILE *md, const vl_peer_kind *k, const char *notes);

#endif
