/* multi-gpu's extra hook, after the ladder's runs: every 2-rank run's speedup and scaling
 * efficiency against the single rung's run of the same repetition (the repetitions ran in
 * interleaved order, so a pair shares the machine's state), the medians the claims read
 * (case_metrics.measured_*), the bucket-cap sweep on the last DDP rung (how its bucket_cap
 * was chosen), and the collective benchmark (`vramlab bench allreduce | reduce_scatter |
 * allgather` under mpirun: the nccl-tests table). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kit/interrupt.h"
#include "mg.h"
#include "kit/mpirun.h"
#include "kit/rep.h"
#include "vramlab/fileio.h"

/* A rung of the results with its parsed knobs. */
typedef struct {
  cJSON *rung;
  vl_mg_rung r;
  vl_knobs k;
} mg_rung_ref;

/* The rungs of res that parse (all of them: the harness checked them), in ladder order. */
static int rungs_of(vl_case_env *env, cJSON *res, mg_rung_ref *out, int max) {
  int n = 0;
  cJSON *rg;
  cJSON_ArrayForEach(rg, cJSON_GetObjectItem(res, "rungs")) {
    if (n >= max) break;
    out[n].rung = rg;
    if (vl_case_knobs_of(env, rg, &out[n].k) != VL_OK) continue;
    if (vl_mg_parse_rung(env, env->scale, &out[n].k, &out[n].r) != VL_OK) continue;
    n++;
  }
  return n;
}

/* The median of a run metric over a rung's undisturbed runs (all when none is). */
static double run_median(const cJSON *rung, const char *key) { return vl_mg_run_median(rung, key, NULL, NULL); }

/* The share of communication hidden behind backward: 1 - exposed / the exposed seconds of the
 * DDP rung without overlap (there every allreduce starts after backward, so a rank waits for
 * all of it), paired by repetition. The wrapper's summed collective seconds cannot serve:
 * buckets in flight together each count their whole span. */
static void hidden_shares(mg_rung_ref *rr, int n) {
  const cJSON *ref = NULL;
  for (int i = 0; i < n && !ref; i++)
    if (rr[i].r.mode == VL_DIST_DDP && !rr[i].r.overlap) ref = rr[i].rung;
  if (!ref) return;
  const cJSON *runs = cJSON_GetObjectItem(ref, "runs");
  double med = run_median(ref, "exposed_s_per_step");
  for (int i = 0; i < n; i++) {
    if (rr[i].r.mode != VL_DIST_DDP) continue;
    int rep = 0;
    cJSON *run;
    cJSON_ArrayForEach(run, cJSON_GetObjectItem(rr[i].rung, "runs")) {
      const cJSON *rr0 = cJSON_GetArrayItem(runs, rep++);
      double e0 = cJSON_IsTrue(cJSON_GetObjectItem(rr0, "disturbed")) ? NAN : vl_rep_num(rr0, "exposed_s_per_step");
      if (isnan(e0)) e0 = med;
      double h = rr[i].rung == ref ? 0 : 1.0 - vl_rep_num(run, "exposed_s_per_step") / e0;
      if (!isnan(h)) cJSON_AddNumberToObject(run, "hidden_comm_share", h);
    }
  }
}

/* Each run's speedup against the single rung's run of the same repetition. */
static void speedups(mg_rung_ref *rr, int n, cJSON *res) {
  const cJSON *base = NULL;
  for (int i = 0; i < n && !base; i++)
    if (rr[i].r.mode == VL_DIST_SINGLE) base = rr[i].rung;
  if (!base) return;
  const cJSON *bruns = cJSON_GetObjectItem(base, "runs");
  double base_med = run_median(base, "samples_per_s");
  for (int i = 0; i < n; i++) {
    int rep = 0;
    cJSON *run;
    cJSON_ArrayForEach(run, cJSON_GetObjectItem(rr[i].rung, "runs")) {
      /* the same repetition's single run, unless it was disturbed (then the undisturbed median) */
      const cJSON *br = cJSON_GetArrayItem(bruns, rep++);
      double b = cJSON_IsTrue(cJSON_GetObjectItem(br, "disturbed")) ? NAN : vl_rep_num(br, "samples_per_s");
      if (isnan(b)) b = base_med;
      double s = vl_rep_num(run, "samples_per_s") / b;
      if (isnan(s)) continue;
      cJSON_AddNumberToObject(run, "speedup", s);
      cJSON_AddNumberToObject(run, "scaling_efficiency", s / vl_rep_num(run, "ranks"));
    }
  }
  /* the claims' numbers: medians of the last rung of each mode */
  cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
  if (!cm) cm = cJSON_AddObjectToObject(res, "case_metrics");
  static const struct { vl_dist_mode m; const char *tag; } modes[] = {
      {VL_DIST_DP, "dp"}, {VL_DIST_DDP, "ddp"}, {VL_DIST_ZERO1, "zero1"}};
  for (size_t j = 0; j < sizeof modes / sizeof *modes; j++) {
    const mg_rung_ref *last = NULL;
    for (int i = 0; i < n; i++)
      if (rr[i].r.mode == modes[j].m && cJSON_GetArraySize(cJSON_GetObjectItem(rr[i].rung, "runs"))) last = &rr[i];
    if (!last) continue;
    char k[64];
    snprintf(k, sizeof k, "measured_speedup_%s", modes[j].tag);
    cJSON_AddNumberToObject(cm, k, run_median(last->rung, "speedup"));
    snprintf(k, sizeof k, "measured_rung_%s", modes[j].tag);
    cJSON_AddStringToObject(cm, k, cJSON_GetStringValue(cJSON_GetObjectItem(last->rung, "name")));
    if (modes[j].m == VL_DIST_ZERO1) continue;
    snprintf(k, sizeof k, "measured_efficiency_%s", modes[j].tag);
    cJSON_AddNumberToObject(cm, k, run_median(last->rung, "scaling_efficiency"));
    snprintf(k, sizeof k, "measured_busy_min_%s", modes[j].tag);
    cJSON_AddNumberToObject(cm, k, run_median(last->rung, "busy_share_min"));
    if (modes[j].m == VL_DIST_DDP) {
      cJSON_AddNumberToObject(cm, "measured_hidden_comm_ddp", run_median(last->rung, "hidden_comm_share"));
      cJSON_AddNumberToObject(cm, "measured_ranks", last->r.ranks);
    }
  }
}

/* ---- the bucket-cap sweep --------------------------------------------------------------------- */
static vl_status sweep(vl_case_env *env, const mg_rung_ref *rr, int n, cJSON *res) {
  const mg_rung_ref *t = NULL;
  for (int i = 0; i < n; i++)
    if (rr[i].r.mode == VL_DIST_DDP) t = &rr[i];
  if (!t || !t->r.n_sweep) return VL_OK;
  cJSON *o = cJSON_AddObjectToObject(res, "bucket_sweep");
  cJSON_AddStringToObject(o, "rung", cJSON_GetStringValue(cJSON_GetObjectItem(t->rung, "name")));
  cJSON_AddNumberToObject(o, "rung_bucket_cap", (double)t->r.bucket_cap);
  cJSON *pts = cJSON_AddArrayToObject(o, "points");
  double ref = NAN; /* the no-overlap DDP rung's wait: nothing hidden */
  for (int i = 0; i < n && isnan(ref); i++)
    if (rr[i].r.mode == VL_DIST_DDP && !rr[i].r.overlap) ref = run_median(rr[i].rung, "exposed_s_per_step");
  for (int i = 0; i < t->r.n_sweep && !vl_interrupted; i++) {
    vl_knobs *k = malloc(sizeof *k);
    if (!k) return vl_case_fail(env, VL_ERR_OOM, "host memory");
    *k = t->k;
    char v[32];
    snprintf(v, sizeof v, "%zu", t->r.sweep[i]);
    vl_status s = vl_knob_set_err(k, "bucket_cap", v, &env->err);
    vl_mg_rung r = t->r;
    r.bucket_cap = t->r.sweep[i];
    cJSON *ranks = NULL;
    if (!env->quiet) vl_progress("bucket-cap sweep: %s with bucket_cap %s", cJSON_GetStringValue(cJSON_GetObjectItem(t->rung, "name")), v);
    cJSON *p = cJSON_CreateObject(), *agg = cJSON_CreateObject();
    if (s == VL_OK) s = vl_mg_launch_quiet(env, &r, k, r.ranks, &ranks, p);
    free(k);
    if (s != VL_OK) {
      cJSON_Delete(p);
      cJSON_Delete(agg);
      return s;
    }
    vl_mg_aggregate(&r, ranks, agg);
    cJSON_Delete(ranks);
    cJSON_AddNumberToObject(p, "bucket_cap", (double)r.bucket_cap);
    static const char *keep[] = {"n_buckets", "samples_per_s", "step_seconds", "comm_s_per_step",
                                 "exposed_s_per_step", "busy_share_min"};
    for (size_t j = 0; j < sizeof keep / sizeof *keep; j++)
      cJSON_AddNumberToObject(p, keep[j], vl_rep_num(agg, keep[j]));
    cJSON_AddNumberToObject(p, "hidden_comm_share", 1.0 - vl_rep_num(agg, "exposed_s_per_step") / ref);
    cJSON_Delete(agg);
    cJSON_AddItemToArray(pts, p);
  }
  return VL_OK;
}

/* ---- the collective benchmark ------------------------------------------------------------------- */
/* `vramlab bench COLL --ranks N --json FILE --min-bytes A --max-bytes B` under mpirun. */
static vl_status collective(vl_case_env *env, const char *coll, int np, size_t lo, size_t hi, double timeout,
                            cJSON *arr) {
  char exe[4096], dir[] = "/tmp/vramlab-coll-XXXXXX", file[256], log[256], nps[16], los[32], his[32];
  vl_err err;
  if (vl_self_exe(exe, sizeof exe)) return vl_case_fail(env, VL_ERR_IO, "cannot find this executable");
  if (!mkdtemp(dir)) return vl_case_fail(env, VL_ERR_IO, "cannot make a folder in /tmp");
  snprintf(file, sizeof file, "%s/%s.json", dir, coll);
  snprintf(log, sizeof log, "%s/job.log", dir);
  snprintf(nps, sizeof nps, "%d", np);
  snprintf(los, sizeof los, "%zu", lo);
  snprintf(his, sizeof his, "%zu", hi);
  char *argv[] = {exe, "bench", (char *)coll, "--ranks", nps, "--json", file, "--min-bytes", los, "--max-bytes", his, NULL};
  vl_mpirun_opts o = {np, np > vl_cores(), 1, timeout, log};
  if (!env->quiet) vl_progress("collective benchmark: %s on %d ranks, %s..%s bytes", coll, np, los, his);
  int rc = vl_mpirun(&o, argv, &err);
  vl_status s = VL_OK;
  char *t = NULL;
  if (rc == 0) (void)vl_file_read_text(file, (uint64_t)16 << 20, NULL, &t, NULL, NULL);
  cJSON *j = t ? cJSON_Parse(t) : NULL;
  free(t);
  if (j) {
    cJSON_AddItemToArray(arr, j);
  } else {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "collective", coll);
    char why[800];
    if (rc < 0) snprintf(why, sizeof why, "not measured here: %s", err.msg);
    else snprintf(why, sizeof why, "failed (status %d; its output is in %s)", rc, log);
    cJSON_AddStringToObject(e, "error", why);
    cJSON_AddItemToArray(arr, e);
  }
  if (j) {
    unlink(file);
    unlink(log);
    rmdir(dir);
  }
  return s;
}

vl_status vl_mg_extra(vl_case_env *env, cJSON *res) {
  mg_rung_ref *rr = calloc(VL_MAX_RUNGS, sizeof *rr);
  if (!rr) return vl_case_fail(env, VL_ERR_OOM, "host memory");
  int n = rungs_of(env, res, rr, VL_MAX_RUNGS);
  hidden_shares(rr, n);
  speedups(rr, n, res);
  vl_status s = VL_OK;
  int np = 2;
  size_t hi = 64u << 20;
  double timeout = 300;
  bool ran = false; /* any rung measured: MPI is there */
  for (int i = 0; i < n; i++) {
    if (rr[i].r.ranks > np) np = rr[i].r.ranks;
    hi = rr[i].r.coll_max_bytes;
    timeout = rr[i].r.timeout_s;
    const cJSON *run;
    cJSON_ArrayForEach(run, cJSON_GetObjectItem(rr[i].rung, "runs")) ran |= cJSON_GetObjectItem(run, "step_time") != NULL;
  }
  if (ran && env->device == VL_DEV_CPU) s = sweep(env, rr, n, res);
  if (s == VL_OK && ran && !vl_interrupted) {
    cJSON *arr = cJSON_AddArrayToObject(res, "collectives");
    /* allreduce over every size (the nccl-tests sweep); the others at a few large sizes */
    size_t lo = hi < (1u << 20) ? hi : (1u << 20);
    s = collective(env, "allreduce", np, 8, hi, timeout, arr);
    if (s == VL_OK) s = collective(env, "reduce_scatter", np, lo, hi, timeout, arr);
    if (s == VL_OK) s = collective(env, "allgather", np, lo, hi, timeout, arr);
  }
  free(rr);
  return s;
}
