/* multi-gpu's run hook: one repetition of a rung is one mpirun job of `vramlab worker
 * multi-gpu` on the rung's ranks (one compute thread each unless asked), with a timeout and
 * its output in a file whose tail goes into the message when it fails. The parent makes the
 * data split first (ranks never race to make it), then reads every rank's file and
 * aggregates: samples/s, step time, per-rank busy share (compute / wall of the timed steps),
 * communication time and the share hidden behind backward, idle time (DataParallel), memory
 * by category with the planner's peak for each rank (planned = measured), the loss. Without
 * MPI in the build or without mpirun, the rung is "not measured here" with the apt-get line. */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kit/interrupt.h"
#include "mg.h"
#include "kit/mpirun.h"
#include "kit/rep.h"
#include "vramlab/fileio.h"

#define MG_APT "apt-get install libopenmpi-dev openmpi-bin"

double vl_mg_median(double *v, int n) {
  if (n <= 0) return NAN;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double x = v[j]; v[j] = v[j - 1]; v[j - 1] = x; }
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- the machine's other work -------------------------------------------------------------- */
/* CPU seconds every process on the machine has used (/proc/stat) and those of our waited-for
 * children (the mpirun job and its ranks); NaN where /proc/stat is unreadable. */
static double machine_cpu_s(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return NAN;
  unsigned long long v[8] = {0};
  int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                 &v[7]);
  fclose(f);
  if (n < 4) return NAN;
  /* user nice system idle iowait irq softirq steal: busy = all but idle and iowait */
  unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  return (double)busy / (double)sysconf(_SC_CLK_TCK);
}

static double children_cpu_s(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_CHILDREN, &ru)) return NAN;
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

/* ---- the job ----------------------------------------------------------------------------- */
/* What the job's output says, for a message: the ranks' own lines ("vramlab: ...": a rank
 * that failed names itself), else its last bytes; line breaks as " | ". */
static void log_tail(const char *path, char *buf, size_t n) {
  size_t len = 0;
  char *t;
  (void)vl_file_read_text(path, (uint64_t)64 << 20, NULL, &t, &len, NULL);
  buf[0] = 0;
  if (!t) return;
  const char *p = strstr(t, "vramlab: ");
  if (!p) p = len > n - 1 ? t + len - (n - 1) : t;
  size_t j = 0;
  for (; *p && j + 4 < n; p++) {
    if (*p == '\n') { if (j && p[1]) { memcpy(buf + j, " | ", 3); j += 3; } continue; }
    buf[j++] = (unsigned char)*p < 0x20 ? ' ' : *p;
  }
  buf[j] = 0;
  free(t);
}

static void rm_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[PATH_MAX];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  rmdir(dir);
}

/* argv of `vramlab worker multi-gpu`: the setting and the rung's knobs as --set / --knob. */
static char **worker_argv(const vl_case_env *env, const vl_knobs *k, const char *exe, const char *dir) {
  const vl_knobs *s = env->setting;
  int n = 8 + 2 * (s->n + k->n), i = 0;
  char **argv = calloc((size_t)n, sizeof *argv);
  if (!argv) return NULL;
  argv[i++] = strdup(exe);
  argv[i++] = strdup("worker");
  argv[i++] = strdup("multi-gpu");
  argv[i++] = strdup("--scale");
  argv[i++] = strdup(env->scale);
  argv[i++] = strdup("--out");
  argv[i++] = strdup(dir);
  for (int j = 0; j < s->n + k->n; j++) {
    const vl_knob *kn = j < s->n ? &s->k[j] : &k->k[j - s->n];
    argv[i++] = strdup(j < s->n ? "--set" : "--knob");
    size_t len = strlen(kn->key) + strlen(kn->val) + 2;
    char *kv = malloc(len);
    if (kv) snprintf(kv, len, "%s=%s", kn->key, kn->val);
    argv[i++] = kv;
  }
  for (int j = 0; j < i; j++)
    if (!argv[j]) { for (int q = 0; q < i; q++) free(argv[q]); free(argv); return NULL; }
  argv[i] = NULL;
  return argv;
}

static void free_argv(char **argv) {
  for (int i = 0; argv && argv[i]; i++) free(argv[i]);
  free(argv);
}

/* Every rank's file, in rank order. */
static vl_status read_ranks(vl_case_env *env, const char *dir, int np, cJSON **out) {
  cJSON *arr = cJSON_CreateArray();
  for (int r = 0; r < np; r++) {
    char path[PATH_MAX];
    vl_err e;
    snprintf(path, sizeof path, "%s/rank-%d.json", dir, r);
    char *t;
    (void)vl_file_read_text(path, (uint64_t)64 << 20, NULL, &t, NULL, &e);
    bool read = t != NULL;
    cJSON *o = t ? cJSON_Parse(t) : NULL;
    free(t);
    if (!o || vl_rep_num(o, "rank") != r) {
      cJSON_Delete(o);
      cJSON_Delete(arr);
      return vl_case_fail(env, VL_ERR_IO, "rank %d wrote no readable results (%s)", r, read ? "not its JSON" : e.msg);
    }
    cJSON_AddItemToArray(arr, o);
  }
  *out = arr;
  return VL_OK;
}

vl_status vl_mg_launch(vl_case_env *env, const vl_mg_rung *r, const vl_knobs *k, int np, cJSON **ranks,
                       double *foreign) {
  *ranks = NULL;
  if (foreign) *foreign = NAN;
  char exe[PATH_MAX], dir[] = "/tmp/vramlab-mg-XXXXXX", log[PATH_MAX];
  vl_err err;
  if (vl_self_exe(exe, sizeof exe)) return vl_case_fail(env, VL_ERR_IO, "cannot find this executable (/proc/self/exe)");
  if (!mkdtemp(dir)) return vl_case_fail(env, VL_ERR_IO, "cannot make a folder in /tmp for the ranks' results");
  snprintf(log, sizeof log, "%s/job.log", dir);
  char **argv = worker_argv(env, k, exe, dir);
  if (!argv) {
    rm_dir(dir);
    return vl_case_fail(env, VL_ERR_OOM, "host memory");
  }
  vl_mpirun_opts o = {np, r->oversubscribe, r->threads, r->timeout_s, log};
  err.msg[0] = 0;
  double m0 = machine_cpu_s(), c0 = children_cpu_s(), t0 = vl_now();
  int rc = vl_mpirun(&o, argv, &err);
  /* the share of the machine's cores other processes used meanwhile (a neighbour's build
   * or benchmark slows the ranks down: the report flags it) */
  double wall = vl_now() - t0, other = (machine_cpu_s() - m0) - (children_cpu_s() - c0);
  if (foreign && wall > 0) *foreign = other > 0 ? other / (wall * vl_cores()) : 0;
  free_argv(argv);
  vl_status s = VL_OK;
  if (rc < 0) {
    s = vl_case_fail(env, VL_ERR_UNSUPPORTED, "%s", err.msg);
  } else if (rc != 0) {
    char tail[360];
    log_tail(log, tail, sizeof tail);
    s = vl_case_fail(env, VL_ERR_COMM, "mpirun of %d rank(s) %s %d (output kept in %s): %s", np,
                     rc == 124 ? "ran past its timeout: status" : "exited with status", rc, log, tail);
    return s; /* the folder stays for the log */
  } else {
    s = read_ranks(env, dir, np, ranks);
    if (s != VL_OK) return s;
  }
  rm_dir(dir);
  return s;
}

vl_status vl_mg_launch_quiet(vl_case_env *env, const vl_mg_rung *r, const vl_knobs *k, int np, cJSON **ranks,
                             cJSON *out) {
  cJSON *disturbed = cJSON_CreateArray();
  double foreign = NAN;
  int attempt = 0;
  vl_status s;
  for (;;) {
    attempt++;
    s = vl_mg_launch(env, r, k, np, ranks, &foreign);
    if (s != VL_OK || !(foreign > r->disturbed_share) || attempt > r->disturbed_retries || vl_interrupted) break;
    if (!env->quiet)
      vl_progress("  other processes used %.0f%% of the cores meanwhile: measuring again (%d of %ld)", 100 * foreign,
                  attempt, r->disturbed_retries);
    cJSON_AddItemToArray(disturbed, cJSON_CreateNumber(foreign));
    cJSON_Delete(*ranks);
    *ranks = NULL;
  }
  cJSON_AddNumberToObject(out, "foreign_cpu_share", foreign);
  /* still disturbed after the retries: kept, and left out of the medians when others are not */
  cJSON_AddBoolToObject(out, "disturbed", foreign > r->disturbed_share);
  cJSON_AddNumberToObject(out, "attempts", attempt);
  cJSON_AddItemToObject(out, "disturbed_shares", disturbed);
  return s;
}

/* ---- the hook ------------------------------------------------------------------------------ */
vl_status vl_mg_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out) {
  (void)rep;
  vl_mg_rung r;
  VL_TRY(vl_mg_parse_rung(env, env->scale, k, &r));
  if (env->device == VL_DEV_PLAN)
    return vl_case_fail(env, VL_ERR_INVALID, "run needs a compute device (cpu), not plan");
  cJSON_AddStringToObject(out, "scale", env->scale);
  cJSON_AddStringToObject(out, "device", vl_device_name(env->device));
  if (env->device != VL_DEV_CPU) {
    cJSON_AddStringToObject(out, "not_measured", "the case's ranks run on the CPU backend over MPI; "
                                                 "NCCL ranks on GPUs are not wired into it");
    return VL_OK;
  }
  if (!vl_comm_have_mpi()) {
    cJSON_AddStringToObject(out, "not_measured", "this build has no MPI (" MG_APT ", then rebuild)");
    if (!env->quiet) vl_progress("  not measured here: no MPI in this build (%s)", MG_APT);
    return VL_OK;
  }
  int cores = vl_cores();
  bool over = r.ranks * r.threads > cores;
  if (over && !r.oversubscribe)
    return vl_case_fail(env, VL_ERR_INVALID,
                        "ranks x threads = %d x %d exceeds this machine's %d cores: set oversubscribe=true to run "
                        "anyway (labelled oversubscribed)", r.ranks, r.threads, cores);
  if (!strcmp(env->scale, "full"))
    return vl_case_fail(env, VL_ERR_UNSUPPORTED, "a full-scale (512x512 ResNet-101) step is too slow for this CPU: "
                        "use --scale small or tiny, or --device plan");
  vl_segset *ts = NULL; /* made here, once, before any rank reads it */
  VL_TRY(vl_segrung_open_split(env, &r.seg, false, &ts));
  vl_segset_close(ts);
  cJSON *ranks = NULL;
  vl_status s = vl_mg_launch_quiet(env, &r, k, r.ranks, &ranks, out);
  if (s == VL_ERR_UNSUPPORTED) { /* no mpirun: not measured, the bench goes on */
    cJSON_AddStringToObject(out, "not_measured", env->err.msg);
    if (!env->quiet) vl_progress("  not measured here: %s", env->err.msg);
    return VL_OK;
  }
  if (s != VL_OK) {
    cJSON_AddStringToObject(out, "error", env->err.msg);
    return s;
  }
  cJSON_AddBoolToObject(out, "oversubscribed", over);
  cJSON_AddNumberToObject(out, "cores", cores);
  vl_mg_aggregate(&r, ranks, out);
  cJSON_Delete(ranks);
  if (!env->quiet) {
    vl_progress("  %s on %d rank(s): %.1f samples/s, step %.3f s, busy min %.0f%%, waiting for collectives "
                "%.3f s/step; other processes used %.0f%% of the cores", vl_dist_mode_name(r.mode), r.ranks,
                vl_rep_num(out, "samples_per_s"), vl_rep_num(out, "step_seconds"),
                100 * vl_rep_num(out, "busy_share_min"), vl_rep_num(out, "exposed_s_per_step"),
                100 * vl_rep_num(out, "foreign_cpu_share"));
  }
  return VL_OK;
}
