/* multi-gpu: the ranks' files of one job (worker.c) aggregated into a run's metrics. Steps
 * are synchronised by the collectives, so a step's time is the slowest rank's; samples/s
 * count the global batch over the slowest rank's wall time of the timed steps. A rank's
 * busy share is the wrapper's compute seconds (forward, backward, update) over that wall
 * time. Communication: the wrapper's seconds from each collective's start to its end, summed
 * (collectives in flight together each count), and the seconds a rank was blocked waiting
 * (exposed); the share hidden behind backward needs the same gradients' communication with
 * nothing hidden, so extra.c takes it against the DDP rung without overlap. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mg.h"
#include "kit/rep.h"

static double num(const cJSON *o, const char *k) { return vl_rep_num(o, k); }

/* Per-step times of the timed steps: the slowest rank's, into t (n steps). */
static int step_times(const cJSON *ranks, double **t) {
  int n = -1;
  const cJSON *rk;
  cJSON_ArrayForEach(rk, ranks) {
    int m = cJSON_GetArraySize(cJSON_GetObjectItem(rk, "times"));
    if (n < 0 || m < n) n = m;
  }
  if (n <= 0 || !(*t = calloc((size_t)n, sizeof **t))) return 0;
  cJSON_ArrayForEach(rk, ranks) {
    const cJSON *times = cJSON_GetObjectItem(rk, "times");
    for (int i = 0; i < n; i++) {
      double v = vl_rep_numv(cJSON_GetArrayItem(times, i));
      if (v > (*t)[i]) (*t)[i] = v;
    }
  }
  return n;
}

/* The loss per step: the mean over ranks (each rank's loss is its own shard's), or rank 0's
 * for DataParallel (it computes the loss of the global batch). */
static cJSON *loss_json(const vl_mg_rung *r, const cJSON *ranks) {
  int n = -1, nr = 0;
  const cJSON *rk;
  cJSON_ArrayForEach(rk, ranks) {
    int m = cJSON_GetArraySize(cJSON_GetObjectItem(rk, "losses"));
    if (n < 0 || m < n) n = m;
    nr++;
  }
  if (n <= 0) return cJSON_CreateArray();
  double *l = calloc((size_t)n, sizeof *l);
  if (!l) return cJSON_CreateArray();
  int used = r->mode == VL_DIST_DP ? 1 : nr, k = 0;
  cJSON_ArrayForEach(rk, ranks) {
    if (k++ >= used) break;
    const cJSON *ls = cJSON_GetObjectItem(rk, "losses");
    for (int i = 0; i < n; i++) l[i] += vl_rep_numv(cJSON_GetArrayItem(ls, i)) / used;
  }
  cJSON *a = cJSON_CreateDoubleArray(l, n);
  free(l);
  return a;
}

double vl_mg_run_median(const cJSON *rung, const char *key, int *used, int *total) {
  double all[128], quiet[128];
  int na = 0, nq = 0;
  const cJSON *run;
  cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs")) {
    double x = vl_rep_num(run, key);
    if (isnan(x) || na >= 128) continue;
    all[na++] = x;
    if (!cJSON_IsTrue(cJSON_GetObjectItem(run, "disturbed"))) quiet[nq++] = x;
  }
  if (used) *used = nq ? nq : na;
  if (total) *total = na;
  return nq ? vl_mg_median(quiet, nq) : vl_mg_median(all, na);
}

void vl_mg_aggregate(const vl_mg_rung *r, const cJSON *ranks, cJSON *out) {
  int nr = cJSON_GetArraySize(ranks);
  cJSON_AddStringToObject(out, "mode", vl_dist_mode_name(r->mode));
  cJSON_AddNumberToObject(out, "ranks", nr);
  cJSON_AddNumberToObject(out, "threads", r->threads);
  cJSON_AddNumberToObject(out, "batch", (double)r->seg.batch);
  cJSON_AddNumberToObject(out, "accum", 1);
  double gb = (double)r->seg.batch * nr;
  cJSON_AddNumberToObject(out, "global_batch", gb);
  double *t = NULL;
  int n = step_times(ranks, &t);
  vl_stats st;
  vl_stats_compute(t, n, &st);
  cJSON_AddItemToObject(out, "step_time", vl_stats_json(&st, t, n));
  free(t);
  cJSON_AddNumberToObject(out, "step_seconds", n ? st.median : NAN);
  /* the wrapper's seconds, per rank and summed */
  double wall_max = 0, busy_min = INFINITY, busy_sum = 0, comm = 0, exposed = 0, idle_max = 0, wait_max = 0;
  double timed = NAN;
  bool match = nr > 0;
  cJSON *pr = cJSON_AddArrayToObject(out, "per_rank");
  const cJSON *rk;
  cJSON_ArrayForEach(rk, ranks) {
    const cJSON *d = cJSON_GetObjectItem(rk, "dist");
    double wall = num(rk, "wall"), steps = num(rk, "timed"), busy = num(d, "compute_s") / wall;
    timed = steps;
    if (wall > wall_max) wall_max = wall;
    if (busy < busy_min) busy_min = busy;
    busy_sum += busy;
    comm += num(d, "comm_s");
    exposed += num(d, "exposed_s");
    if (num(d, "idle_s") / steps > idle_max) idle_max = num(d, "idle_s") / steps;
    if (num(rk, "wait") / wall > wait_max) wait_max = num(rk, "wait") / wall;
    match &= cJSON_IsTrue(cJSON_GetObjectItem(rk, "plan_matches_measured"));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", num(rk, "rank"));
    cJSON_AddNumberToObject(o, "busy_share", busy);
    cJSON_AddNumberToObject(o, "compute_s_per_step", num(d, "compute_s") / steps);
    cJSON_AddNumberToObject(o, "comm_s_per_step", num(d, "comm_s") / steps);
    cJSON_AddNumberToObject(o, "exposed_s_per_step", num(d, "exposed_s") / steps);
    cJSON_AddNumberToObject(o, "idle_s_per_step", num(d, "idle_s") / steps);
    cJSON_AddNumberToObject(o, "comm_bytes_per_step", num(d, "bytes") / steps);
    cJSON_AddNumberToObject(o, "data_wait_share", num(rk, "wait") / wall);
    cJSON_AddNumberToObject(o, "measured_peak_bytes", num(rk, "measured_peak_bytes"));
    cJSON_AddNumberToObject(o, "planned_peak_bytes", num(rk, "planned_peak_bytes"));
    cJSON_AddItemToObject(o, "plan_matches_measured",
                          cJSON_Duplicate(cJSON_GetObjectItem(rk, "plan_matches_measured"), 1));
    cJSON_AddItemToObject(o, "measured_by_category",
                          cJSON_Duplicate(cJSON_GetObjectItem(rk, "measured_by_category"), 1));
    cJSON_AddItemToArray(pr, o);
  }
  const cJSON *r0 = cJSON_GetArrayItem(ranks, 0), *d0 = cJSON_GetObjectItem(r0, "dist");
  cJSON_AddNumberToObject(out, "timed_steps", timed);
  cJSON_AddNumberToObject(out, "samples_per_s", wall_max > 0 ? gb * timed / wall_max : NAN);
  cJSON_AddNumberToObject(out, "busy_share_min", nr ? busy_min : NAN);
  cJSON_AddNumberToObject(out, "busy_share_mean", nr ? busy_sum / nr : NAN);
  cJSON_AddNumberToObject(out, "comm_s_per_step", nr ? comm / nr / timed : NAN);
  cJSON_AddNumberToObject(out, "exposed_s_per_step", nr ? exposed / nr / timed : NAN);
  cJSON_AddNumberToObject(out, "idle_s_per_step", idle_max);
  cJSON_AddNumberToObject(out, "data_wait_share", wait_max);
  cJSON_AddNumberToObject(out, "comm_bytes_per_step", num(d0, "bytes") / timed);
  cJSON_AddNumberToObject(out, "n_buckets", num(d0, "n_buckets"));
  cJSON_AddItemToObject(out, "bucket_bytes", cJSON_Duplicate(cJSON_GetObjectItem(d0, "bucket_bytes"), 1));
  cJSON_AddItemToObject(out, "loss", loss_json(r, ranks));
  /* rank 0's memory at the top (DataParallel's rank 0 holds the most); every rank's in per_rank */
  cJSON_AddNumberToObject(out, "measured_peak_bytes", num(r0, "measured_peak_bytes"));
  cJSON_AddItemToObject(out, "measured_by_category",
                        cJSON_Duplicate(cJSON_GetObjectItem(r0, "measured_by_category"), 1));
  cJSON_AddNumberToObject(out, "planned_peak_bytes", num(r0, "planned_peak_bytes"));
  cJSON_AddBoolToObject(out, "plan_matches_measured", match);
}
