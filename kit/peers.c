/* The PyTorch peers of the model cases (peers.h): the peer process and its line protocol,
 * the interleaved comparison of one rung, and the report's side-by-side section. */
#define _GNU_SOURCE
#include "peers.h"
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "interrupt.h"
#include "rep.h"

extern char **environ;

/* ---- pure pieces ------------------------------------------------------------------------------ */
cJSON *vl_peer_parse_reply(const char *line, char *why, size_t n) {
  const char *end = NULL;
  cJSON *o = cJSON_ParseWithOpts(line, &end, 0);
  if (!o || !cJSON_IsObject(o)) {
    char head[61];
    size_t k = 0;
    for (const char *s = line; *s && k < sizeof head - 1; s++) head[k++] = (*s >= 32 && *s < 127) ? *s : '?';
    head[k] = 0;
    snprintf(why, n, "the peer printed something that is not a JSON object: \"%s%s\"", head,
             strlen(line) > k ? "..." : "");
    cJSON_Delete(o);
    return NULL;
  }
  while (end && (*end == ' ' || *end == '\t' || *end == '\r')) end++;
  if (end && *end) {
    snprintf(why, n, "the peer printed text after its JSON reply");
    cJSON_Delete(o);
    return NULL;
  }
  const cJSON *e = cJSON_GetObjectItem(o, "error");
  if (e) {
    snprintf(why, n, "%s", cJSON_IsString(e) ? e->valuestring : "the peer reported an error");
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

int vl_peer_reply_times(const cJSON *reply, int k, double *t, char *why, size_t n) {
  const cJSON *a = cJSON_GetObjectItem(reply, "times"), *e;
  if (!cJSON_IsArray(a)) { snprintf(why, n, "the peer's reply has no times"); return -1; }
  if (cJSON_GetArraySize(a) != k) {
    snprintf(why, n, "the peer timed %d steps, %d were asked", cJSON_GetArraySize(a), k);
    return -1;
  }
  int i = 0;
  cJSON_ArrayForEach(e, a) {
    if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || !(e->valuedouble > 0)) {
      snprintf(why, n, "the peer's step time %d is not a positive number", i);
      return -1;
    }
    t[i++] = e->valuedouble;
  }
  return 0;
}

double vl_peer_median(double *t, int n) {
  if (n < 1) return NAN;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && t[j - 1] > t[j]; j--) { double x = t[j]; t[j] = t[j - 1]; t[j - 1] = x; }
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

const char *vl_peer_hello_why(const cJSON *hello, const char *start_why, const char *install, char *why, size_t n) {
  if (hello && cJSON_IsTrue(cJSON_GetObjectItem(hello, "hello"))) return NULL;
  if (hello && cJSON_IsNumber(cJSON_GetObjectItem(hello, "hello"))) return NULL;
  const char *w = start_why && *start_why ? start_why : "the peer did not answer";
  if (strstr(w, "cannot import") || strstr(w, "not found") || strstr(w, "No module"))
    snprintf(why, n, "PyTorch is not installed (%s): %s", install, w);
  else snprintf(why, n, "%s", w);
  return why;
}

/* ---- the process ------------------------------------------------------------------------------ */
/* argv0 as execve wants it: a path as given, else the first executable in PATH. */
static int find_program(const char *argv0, char *out, size_t n) {
  if (strchr(argv0, '/')) {
    snprintf(out, n, "%s", argv0);
    return access(out, X_OK);
  }
  const char *path = getenv("PATH");
  if (!path) path = "/usr/local/bin:/usr/bin:/bin";
  for (const char *s = path; *s;) {
    const char *e = strchr(s, ':');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (len && (int)snprintf(out, n, "%.*s/%s", (int)len, s, argv0) < (int)n && access(out, X_OK) == 0) return 0;
    s += len + (e != NULL);
  }
  return -1;
}

/* environ without the names env_add sets, then env_add; NULL-terminated (the strings are
 * not copied). */
static char **child_env(char *const env_add[]) {
  int ne = 0, na = 0;
  while (environ[ne]) ne++;
  while (env_add && env_add[na]) na++;
  char **e = calloc((size_t)(ne + na + 1), sizeof *e);
  if (!e) return NULL;
  int k = 0;
  for (int i = 0; i < ne; i++) {
    bool replaced = false;
    for (int j = 0; j < na && !replaced; j++) {
      const char *eq = strchr(env_add[j], '=');
      size_t len = eq ? (size_t)(eq - env_add[j]) + 1 : strlen(env_add[j]);
      replaced = !strncmp(environ[i], env_add[j], len);
    }
    if (!replaced) e[k++] = environ[i];
  }
  for (int j = 0; j < na; j++) e[k++] = env_add[j];
  return e;
}

/* The last non-empty line of the peer's stderr (a Python traceback's is the exception),
 * appended to why as ": <line>". */
static void append_log_tail(vl_peer *p) {
  FILE *f = p->log[0] ? fopen(p->log, "r") : NULL;
  if (!f) return;
  char line[512], last[512] = "";
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = 0;
    if (line[0]) snprintf(last, sizeof last, "%s", line);
  }
  fclose(f);
  size_t k = strlen(p->why);
  if (last[0] && k + 3 < sizeof p->why) snprintf(p->why + k, sizeof p->why - k, ": %s", last);
}

/* Reap the peer: wait up to `grace` seconds, then SIGKILL its process group. Returns the
 * wait status (-1 when killed). */
static int reap(vl_peer *p, double grace) {
  int st = -1;
  double end = vl_now() + grace;
  for (;;) {
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) break;
    if (r < 0 && errno != EINTR) { st = -1; break; }
    if (vl_now() > end) {
      kill(-p->pid, SIGKILL);
      kill(p->pid, SIGKILL);
      while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {
      }
      st = -1;
      break;
    }
    usleep(20000);
  }
  p->pid = 0;
  if (p->fd >= 0) close(p->fd);
  p->fd = -1;
  return st;
}

static void peer_failed(vl_peer *p, const char *fmt, const char *arg, double grace) {
  snprintf(p->why, sizeof p->why, fmt, arg);
  int st = reap(p, grace);
  if (st >= 0 && WIFEXITED(st)) {
    size_t k = strlen(p->why);
    snprintf(p->why + k, sizeof p->why - k, " (exit status %d)", WEXITSTATUS(st));
  } else if (st >= 0 && WIFSIGNALED(st)) {
    size_t k = strlen(p->why);
    snprintf(p->why + k, sizeof p->why - k, " (killed by signal %d)", WTERMSIG(st));
  }
  append_log_tail(p);
}

/* One line from the peer within timeout_s, parsed; NULL with p->why (and the peer stopped
 * unless it answered an error). */
static cJSON *read_reply(vl_peer *p, double timeout_s) {
  double deadline = vl_now() + timeout_s;
  for (;;) {
    char *nl = p->len ? memchr(p->buf, '\n', p->len) : NULL;
    if (nl) {
      *nl = 0;
      cJSON *o = vl_peer_parse_reply(p->buf, p->why, sizeof p->why);
      bool garbage = !o && strncmp(p->why, "the peer printed", 16) == 0;
      size_t used = (size_t)(nl - p->buf) + 1;
      memmove(p->buf, p->buf + used, p->len - used);
      p->len -= used;
      if (garbage) {
        char w[VL_PEER_WHY_LEN];
        snprintf(w, sizeof w, "%s", p->why);
        peer_failed(p, "%s", w, 0.5);
      }
      return o;
    }
    if (p->len >= VL_PEER_REPLY_MAX) {
      peer_failed(p, "%s", "the peer printed a line longer than 1 MiB", 0.5);
      return NULL;
    }
    double left = deadline - vl_now();
    if (left <= 0) {
      char t[32];
      snprintf(t, sizeof t, "%.0f", timeout_s);
      peer_failed(p, "the peer did not answer within %s s (stopped)", t, 0);
      return NULL;
    }
    struct pollfd pf = {p->fd, POLLIN, 0};
    int r = poll(&pf, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno != EINTR) { peer_failed(p, "%s", "poll failed", 0); return NULL; }
    if (r <= 0) continue;
    if (p->cap - p->len < 65536) {
      size_t cap = p->cap ? 2 * p->cap : 65536;
      char *b = realloc(p->buf, cap + 1);
      if (!b) { peer_failed(p, "%s", "out of host memory for its reply", 0); return NULL; }
      p->buf = b;
      p->cap = cap;
    }
    ssize_t got = read(p->fd, p->buf + p->len, p->cap - p->len);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {
      peer_failed(p, "%s", "the peer exited without answering", 5);
      return NULL;
    }
    p->len += (size_t)got;
  }
}

cJSON *vl_peer_start(vl_peer *p, char *const argv[], char *const env_add[], double timeout_s) {
  memset(p, 0, sizeof *p);
  p->fd = -1;
  char prog[PATH_MAX];
  if (find_program(argv[0], prog, sizeof prog)) {
    snprintf(p->why, sizeof p->why, "%s: not found", argv[0]);
    return NULL;
  }
  snprintf(p->log, sizeof p->log, "/tmp/vramlab-peer-XXXXXX");
  int logfd = mkostemp(p->log, O_CLOEXEC);
  if (logfd < 0) p->log[0] = 0;
  int sv[2];
  char **envp = child_env(env_add);
  if (!envp || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
    snprintf(p->why, sizeof p->why, "cannot make the peer's pipe: %s", strerror(errno));
    free(envp);
    if (logfd >= 0) { close(logfd); unlink(p->log); }
    return NULL;
  }
  pid_t pid = fork();
  if (pid == 0) { /* only async-signal-safe calls until execve */
    setpgid(0, 0);                   /* Ctrl-C is vramlab's to handle, not the peer's */
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives vramlab */
    dup2(sv[1], 0);
    dup2(sv[1], 1);
    if (logfd >= 0) dup2(logfd, 2);
    execve(prog, argv, envp);
    _exit(127);
  }
  free(envp);
  close(sv[1]);
  if (logfd >= 0) close(logfd);
  if (pid < 0) {
    snprintf(p->why, sizeof p->why, "cannot start %s: %s", argv[0], strerror(errno));
    close(sv[0]);
    if (p->log[0]) unlink(p->log);
    return NULL;
  }
  p->pid = pid;
  p->fd = sv[0];
  cJSON *hello = read_reply(p, timeout_s);
  if (!hello) { /* no hello: stop it if it still runs; its buffer and log go either way */
    char w[VL_PEER_WHY_LEN];
    snprintf(w, sizeof w, "%s", p->why);
    vl_peer_stop(p);
    snprintf(p->why, sizeof p->why, "%s", w);
  }
  return hello;
}

cJSON *vl_peer_call(vl_peer *p, const char *request, double timeout_s) {
  if (!p->pid) {
    if (!p->why[0]) snprintf(p->why, sizeof p->why, "the peer is not running");
    return NULL;
  }
  size_t n = strlen(request);
  char *line = malloc(n + 2);
  if (!line) { snprintf(p->why, sizeof p->why, "out of host memory"); return NULL; }
  memcpy(line, request, n);
  line[n] = '\n';
  size_t off = 0;
  while (off < n + 1) { /* MSG_NOSIGNAL: a peer that died is an error here, not SIGPIPE */
    ssize_t w = send(p->fd, line + off, n + 1 - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      free(line);
      peer_failed(p, "%s", "the peer stopped reading its requests", 5);
      return NULL;
    }
    off += (size_t)w;
  }
  free(line);
  return read_reply(p, timeout_s);
}

void vl_peer_stop(vl_peer *p) {
  if (p->pid) {
    send(p->fd, "quit\n", 5, MSG_NOSIGNAL);
    shutdown(p->fd, SHUT_WR);
    reap(p, 5);
  }
  if (p->log[0]) unlink(p->log);
  p->log[0] = 0;
  free(p->buf);
  p->buf = NULL;
  p->len = p->cap = 0;
}

/* ---- a case's comparison ---------------------------------------------------------------------- */
const char *vl_peer_python(void) {
  const char *py = getenv("VRAMLAB_PYTHON");
  return py && *py ? py : "python3";
}

cJSON *vl_peer_open(vl_peer *p, const vl_peer_kind *k, vl_device device, int threads) {
  char script[PATH_MAX], omp[32], preload[PATH_MAX + 64], lib[PATH_MAX + 32], dev[32];
  snprintf(script, sizeof script, "%s/tools/peers/%s", VRAMLAB_SOURCE_DIR, k->script);
  snprintf(omp, sizeof omp, "OMP_NUM_THREADS=%d", threads);
  snprintf(dev, sizeof dev, "VL_PEER_DEVICE=%s", device == VL_DEV_CUDA ? "cuda" : "cpu");
  char *env[8] = {omp, dev, "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1", NULL};
  int ne = 4;
#ifdef VRAMLAB_MEMCOUNT_LIB
  struct stat sb;
  if (device == VL_DEV_CPU && stat(VRAMLAB_MEMCOUNT_LIB, &sb) == 0) {
    const char *old = getenv("LD_PRELOAD");
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s%s%s", VRAMLAB_MEMCOUNT_LIB, old && *old ? ":" : "",
             old ? old : "");
    snprintf(lib, sizeof lib, "VL_MEMCOUNT_LIB=%s", VRAMLAB_MEMCOUNT_LIB);
    env[ne++] = preload;
    env[ne++] = lib;
  }
#else
  (void)preload;
  (void)lib;
#endif
  env[ne] = NULL;
  char *argv[] = {(char *)vl_peer_python(), script, NULL};
  cJSON *hello = vl_peer_start(p, argv, env, 300);
  snprintf(p->script, sizeof p->script, "%s", k->script);
  char why[VL_PEER_WHY_LEN];
  if (vl_peer_hello_why(hello, p->why, k->install, why, sizeof why)) {
    snprintf(p->why, sizeof p->why, "%s", why);
    cJSON_Delete(hello);
    vl_peer_stop(p);
    return NULL;
  }
  return hello;
}

cJSON *vl_peer_results(cJSON *res, const cJSON *hello, const char *why, const vl_peer_rounds *R) {
  cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
  if (!cm) cm = cJSON_AddObjectToObject(res, "case_metrics");
  cJSON_DeleteItemFromObject(cm, "peers");
  cJSON *o = cJSON_AddObjectToObject(cm, "peers");
  if (!hello) {
    cJSON_AddStringToObject(o, "not_measured", why);
    return o;
  }
  static const char *const keys[] = {"torch", "transformers", "device", "memory", "memory_why"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(hello, keys[i]));
    if (s) cJSON_AddStringToObject(o, keys[i], s);
  }
  cJSON_AddBoolToObject(o, "fp16_fast", cJSON_IsTrue(cJSON_GetObjectItem(hello, "fp16_fast")));
  cJSON_AddNumberToObject(o, "warmup", R->warmup);
  cJSON_AddNumberToObject(o, "round_warmup", R->round_warmup);
  cJSON_AddNumberToObject(o, "rounds", R->rounds);
  cJSON_AddNumberToObject(o, "steps_per_round", R->steps);
  cJSON_AddArrayToObject(o, "rungs");
  return o;
}

cJSON *vl_peer_train_json(const vl_optim_cfg *o, float clip, int64_t accum, vl_dtype compute) {
  cJSON *t = cJSON_CreateObject();
  cJSON_AddStringToObject(t, "compute", vl_dtype_name(compute));
  cJSON_AddStringToObject(t, "optimizer", vl_optimizer_name(o->opt));
  cJSON_AddNumberToObject(t, "lr", o->hp.lr);
  cJSON_AddItemToObject(t, "betas", cJSON_CreateDoubleArray((double[2]){o->hp.beta1, o->hp.beta2}, 2));
  cJSON_AddNumberToObject(t, "eps", o->hp.eps);
  cJSON_AddNumberToObject(t, "weight_decay", o->hp.weight_decay);
  cJSON_AddNumberToObject(t, "momentum", o->hp.momentum);
  cJSON_AddNumberToObject(t, "eps2", o->hp.eps2);
  cJSON_AddNumberToObject(t, "clip_threshold", o->hp.clip_thr);
  cJSON_AddNumberToObject(t, "decay_pow", o->hp.decay_pow);
  cJSON_AddNumberToObject(t, "beta1", o->hp.beta1);
  cJSON_AddBoolToObject(t, "adafactor_beta1", o->adafactor_beta1);
  cJSON_AddNumberToObject(t, "clip", clip);
  cJSON_AddNumberToObject(t, "accum", (double)accum);
  return t;
}

/* The engine side: every step the same accum micro-batches. */
typedef struct {
  const vl_batch *mb;
  int n;
} fixed_feed;

static vl_status fixed_next(void *user, long step, const vl_batch **mb, int *n, double *wait) {
  const fixed_feed *f = user;
  *mb = f->mb;
  *n = f->n;
  *wait = 0;
  return VL_OK;
}

/* The peer's "step k": times into t (k of them; NULL: untimed) and its memory into the maxima
 * kept in mem. */
static int peer_steps(vl_peer *p, int k, double timeout, double *t, cJSON *mem) {
  char req[32];
  snprintf(req, sizeof req, "step %d", k);
  cJSON *r = vl_peer_call(p, req, timeout);
  if (!r) return -1;
  int rc = t ? vl_peer_reply_times(r, k, t, p->why, sizeof p->why) : 0;
  static const char *const keys[] = {"peak_bytes", "step_extra_bytes", "persistent_bytes", "reserved_bytes"};
  for (size_t i = 0; rc == 0 && mem && i < sizeof keys / sizeof *keys; i++) {
    double v = vl_rep_num(r, keys[i]);
    if (isnan(v)) continue;
    cJSON *old = cJSON_GetObjectItem(mem, keys[i]);
    if (!old) cJSON_AddNumberToObject(mem, keys[i], v);
    else if (v > old->valuedouble) cJSON_SetNumberValue(old, v);
  }
  cJSON_Delete(r);
  return rc;
}

static void add_samples(cJSON *o, const char *key, const double *t, int n) {
  cJSON_AddItemToObject(o, key, cJSON_CreateDoubleArray(t, n));
}

/* The engine's memory of the step: planned on this device's rules, measured in its arena. */
static void engine_memory(vl_case_env *env, const vl_peer_cmp *cmp, cJSON *o) {
  vl_mem_stats ms;
  vl_arena_stats(cmp->c->arena, &ms);
  cJSON_AddNumberToObject(o, "engine_measured_peak_bytes", (double)ms.peak_total);
  cJSON_AddItemToObject(o, "engine_by_category", vl_case_cats_json(ms.at_peak));
  vl_plan_result pr;
  double t0 = vl_now();
  vl_run_plan(cmp->spec, VL_NO_CAP, env->device == VL_DEV_CUDA ? VL_DEV_CUDA : VL_DEV_CPU, false, &pr);
  if (pr.status == VL_OK) {
    cJSON_AddNumberToObject(o, "engine_planned_peak_bytes", (double)pr.mem.peak_total);
    cJSON_AddNumberToObject(o, "engine_plan_seconds", vl_now() - t0);
  }
  vl_plan_result_free(&pr);
}

static void peer_counts(const vl_peer_cmp *cmp, const cJSON *ready, cJSON *o) {
  vl_param_counts pc;
  vl_model_params(cmp->m, &pc);
  double pt = vl_rep_num(ready, "params_total"), pr = vl_rep_num(ready, "params_trainable");
  cJSON_AddNumberToObject(o, "engine_params", (double)pc.total);
  cJSON_AddNumberToObject(o, "engine_trainable", (double)pc.trainable);
  cJSON_AddNumberToObject(o, "peer_params", pt);
  cJSON_AddNumberToObject(o, "peer_trainable", pr);
  cJSON_AddBoolToObject(o, "params_match", pt == (double)pc.total && pr == (double)pc.trainable);
  double sb = vl_rep_num(ready, "saved_bytes");
  if (!isnan(sb)) cJSON_AddNumberToObject(o, "peer_saved_bytes", sb);
}

/* Medians, ratio, throughput and FLOP/s of both sides from their samples. */
static void summarise(const vl_peer_cmp *cmp, const vl_loop_result *lr, double *te, double *tp, int n, cJSON *o) {
  add_samples(o, "engine_step_seconds", te, n);
  add_samples(o, "peer_step_seconds", tp, n);
  double me = vl_peer_median(te, n), mp = vl_peer_median(tp, n);
  double flops = lr->timed ? lr->flops / (double)lr->timed : NAN;
  cJSON_AddNumberToObject(o, "engine_median", me);
  cJSON_AddNumberToObject(o, "peer_median", mp);
  cJSON_AddNumberToObject(o, "speedup", mp / me);
  cJSON_AddNumberToObject(o, "engine_units_per_s", cmp->units_per_step / me);
  cJSON_AddNumberToObject(o, "peer_units_per_s", cmp->units_per_step / mp);
  cJSON_AddNumberToObject(o, "model_flops_per_step", flops);
  cJSON_AddNumberToObject(o, "engine_flops_per_s", flops / me);
  cJSON_AddNumberToObject(o, "peer_flops_per_s", flops / mp);
}

cJSON *vl_peer_run_tool(const char *peer_script, const cJSON *setup, const char *tool, char *const extra[], cJSON *o,
                        const char *why_key, double *secs) {
  char script[PATH_MAX];
  snprintf(script, sizeof script, "%s/tools/peers/%s", VRAMLAB_SOURCE_DIR, tool);
  char *js = cJSON_PrintUnformatted(setup);
  char *out = malloc(1 << 16);
  if (!js || !out) {
    free(js);
    free(out);
    cJSON_AddStringToObject(o, why_key, "no host memory");
    return NULL;
  }
  char *argv[12] = {(char *)vl_peer_python(), script, "--script", (char *)peer_script, "--config", js};
  int k = 6;
  for (int i = 0; extra && extra[i] && k < 11; i++) argv[k++] = extra[i];
  argv[k] = NULL;
  double t0 = vl_now();
  int rc = vl_run_capture(argv, out, 1 << 16);
  *secs = vl_now() - t0;
  char head[120];
  snprintf(head, sizeof head, "%s", out);
  char *line = NULL, *save = NULL;
  for (char *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
    if (*l == '{') line = l;
  char why[VL_PEER_WHY_LEN];
  cJSON *r = line ? vl_peer_parse_reply(line, why, sizeof why) : NULL;
  if (!r) {
    if (!line) snprintf(why, sizeof why, "%s (exit status %d%s%.100s)", rc < 0 ? "it could not run" : "no reply", rc,
                        *head ? ", printed: " : "", head);
    cJSON_AddStringToObject(o, why_key, why);
    cJSON *err = line ? cJSON_Parse(line) : NULL; /* an error reply: is a module missing? */
    const char *missing = cJSON_GetStringValue(cJSON_GetObjectItem(err, "missing"));
    if (missing && !cJSON_GetObjectItem(o, "missing")) cJSON_AddStringToObject(o, "missing", missing);
    cJSON_Delete(err);
  }
  free(js);
  free(out);
  return r;
}

void vl_peer_memtracker(const char *peer_script, const cJSON *setup, cJSON *o) {
  double secs = 0;
  cJSON *r = vl_peer_run_tool(peer_script, setup, "memtracker_peer.py", NULL, o, "memtracker_why", &secs);
  if (!r) return;
  cJSON_AddNumberToObject(o, "memtracker_peak_bytes", vl_rep_num(r, "peak_bytes"));
  cJSON_AddNumberToObject(o, "memtracker_seconds", vl_rep_num(r, "trace_seconds"));
  cJSON_AddNumberToObject(o, "memtracker_build_seconds", vl_rep_num(r, "build_seconds"));
  cJSON_AddNumberToObject(o, "memtracker_process_seconds", secs);
  cJSON *c = cJSON_DetachItemFromObject(r, "categories");
  if (c) cJSON_AddItemToObject(o, "memtracker_categories", c);
  cJSON_Delete(r);
}

/* What PyTorch's real CPU peak is made of: tools/peers/heap_breakdown.py runs the step again in
 * a fresh process with libvlmemcount's who mode (tensors and what is no tensor, by op) into o
 * ("heap_*"), or why not ("heap_why"): a CPU peer only (on a GPU max_memory_allocated counts
 * tensors alone). */
static void heap_breakdown(vl_case_env *env, const vl_peer *p, const cJSON *setup, cJSON *o) {
  const char *dev = cJSON_GetStringValue(cJSON_GetObjectItem(setup, "device"));
  if (dev && strcmp(dev, "cpu")) {
    cJSON_AddStringToObject(o, "heap_why", "a GPU peer: max_memory_allocated counts tensors alone");
    return;
  }
#ifdef VRAMLAB_MEMCOUNT_LIB
  if (!env->quiet) vl_progress("  PyTorch's peak split into tensors and the rest (real step): %s", vl_rep_str(o, "rung"));
  char *extra[] = {"--lib", VRAMLAB_MEMCOUNT_LIB, NULL};
  double secs = 0;
  cJSON *r = vl_peer_run_tool(p->script, setup, "heap_breakdown.py", extra, o, "heap_why", &secs);
  if (!r) return;
  const char *k[] = {"peak_bytes", "tensor_bytes_at_peak", "no_tensor_bytes_at_peak", "tensor_peak_bytes",
                     "no_tensor_kept_bytes"};
  for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
    char key[64];
    snprintf(key, sizeof key, "heap_%s", k[i]);
    cJSON_AddNumberToObject(o, key, vl_rep_num(r, k[i]));
  }
  cJSON *top = cJSON_DetachItemFromObject(r, "no_tensor_at_peak");
  if (top) cJSON_AddItemToObject(o, "heap_no_tensor_at_peak", top);
  cJSON_Delete(r);
#else
  (void)env;
  (void)p;
  cJSON_AddStringToObject(o, "heap_why", "libvlmemcount was not built");
#endif
}

vl_status vl_peer_compare(vl_case_env *env, vl_peer *p, const vl_peer_cmp *cmp, const vl_peer_rounds *R, cJSON *o) {
  cJSON_AddStringToObject(o, "rung", cmp->rung);
  if (cmp->variant) cJSON_AddStringToObject(o, "variant", cmp->variant);
  cJSON_AddNumberToObject(o, "units_per_step", cmp->units_per_step);
  cJSON_AddNumberToObject(o, "accum", (double)cmp->accum);
  char *js = cJSON_PrintUnformatted(cmp->setup);
  char *req = js ? malloc(strlen(js) + 8) : NULL;
  if (req) sprintf(req, "setup %s", js);
  free(js);
  cJSON *ready = req ? vl_peer_call(p, req, 600) : NULL;
  free(req);
  if (!ready) {
    cJSON_AddStringToObject(o, "not_measured", p->why);
    return VL_OK;
  }
  int n = R->rounds * R->steps;
  double *te = calloc((size_t)n, sizeof *te), *tp = calloc((size_t)n, sizeof *tp);
  vl_batch *mbs = calloc((size_t)cmp->accum, sizeof *mbs);
  if (!te || !tp || !mbs) {
    free(te); free(tp); free(mbs);
    cJSON_Delete(ready);
    return vl_case_fail(env, VL_ERR_OOM, "host memory for the side-by-side timings");
  }
  for (int64_t i = 0; i < cmp->accum; i++) mbs[i] = *cmp->mb;
  fixed_feed feed = {mbs, (int)cmp->accum};
  vl_loop_cfg lc = {.warmup = R->warmup, .total = R->warmup, .reset_peaks_after_warmup = true,
                    .next = fixed_next, .user = &feed, .stop = &vl_interrupted, .stop_now = &vl_terminated};
  vl_loop_result lr = {0};
  vl_status s = vl_run_loop(cmp->m, &lc, &lr);
  cJSON *mem = cJSON_CreateObject();
  int prc = 0;
  double t0 = vl_now();
  if (s == VL_OK) prc = peer_steps(p, R->warmup, 600, NULL, NULL);
  /* the peer's first steps tell how long a round may take: generous, never unbounded */
  double per = (vl_now() - t0) / (R->warmup > 0 ? R->warmup : 1), timeout = 120 + 20.0 * R->steps * per;
  for (int r = 0; s == VL_OK && prc == 0 && r < R->rounds && !vl_interrupted; r++) {
    if (!env->quiet) vl_progress("  PyTorch side by side: %s, round %d/%d", cmp->rung, r + 1, R->rounds);
    vl_step_info info;
    for (int w = 0; s == VL_OK && w < R->round_warmup; w++) s = vl_model_step(cmp->m, mbs, feed.n, &info);
    lc.total += R->steps;
    if (s == VL_OK) s = vl_run_loop(cmp->m, &lc, &lr);
    if (s == VL_OK && R->round_warmup) prc = peer_steps(p, R->round_warmup, timeout, NULL, NULL);
    if (s == VL_OK && !prc) prc = peer_steps(p, R->steps, timeout, tp + r * R->steps, mem);
  }
  if (s == VL_OK && !prc && !vl_interrupted && lr.timed == n) {
    memcpy(te, lr.times, (size_t)n * sizeof *te);
    summarise(cmp, &lr, te, tp, n, o);
    engine_memory(env, cmp, o);
    peer_counts(cmp, ready, o);
    /* reserved_bytes: torch.cuda.max_memory_reserved (GPU peers only) */
    const char *mk[] = {"peak_bytes", "step_extra_bytes", "persistent_bytes", "reserved_bytes"};
    const char *ok[] = {"peer_peak_bytes", "peer_step_extra_bytes", "peer_persistent_bytes", "peer_reserved_bytes"};
    for (int i = 0; i < 4; i++)
      if (!isnan(vl_rep_num(mem, mk[i]))) cJSON_AddNumberToObject(o, ok[i], vl_rep_num(mem, mk[i]));
    if (!env->quiet) vl_progress("  MemTracker (PyTorch's estimator, fake tensors): %s", cmp->rung);
    vl_peer_memtracker(p->script, cmp->setup, o);
    heap_breakdown(env, p, cmp->setup, o);
  } else if (s == VL_ERR_INTERRUPTED || vl_interrupted) {
    cJSON_AddStringToObject(o, "not_measured", "the run was interrupted");
    s = VL_OK;
  } else if (s == VL_OK) {
    cJSON_AddStringToObject(o, "not_measured", p->why);
  }
  if (s != VL_OK) s = vl_peer_engine_failed(env, s, cmp->c, cmp->rung, o);
  cJSON_Delete(mem);
  cJSON_Delete(ready);
  vl_loop_result_free(&lr);
  free(te); free(tp); free(mbs);
  return s;
}

size_t vl_peer_engine_cap(const vl_step_spec *spec, vl_device device) {
  if (device != VL_DEV_CUDA) return VL_NO_CAP;
  vl_plan_result pr;
  vl_run_plan(spec, VL_NO_CAP, VL_DEV_CUDA, false, &pr);
  size_t cap = pr.status == VL_OK ? pr.mem.reserved + pr.mem.reserved / 64 + ((size_t)64 << 20) : VL_NO_CAP;
  vl_plan_result_free(&pr);
  return cap;
}

int vl_peer_cuda_cc_major(const cJSON *hello) {
  const cJSON *cc = cJSON_GetObjectItem(hello, "cuda_capability");
  return cJSON_IsArray(cc) && cJSON_IsNumber(cJSON_GetArrayItem(cc, 0)) ? (int)cJSON_GetNumberValue(cJSON_GetArrayItem(cc, 0))
                                                                          : 0;
}

vl_status vl_peer_compare_model(vl_case_env *env, vl_peer *p, vl_peer_cmp *cmp, const vl_peer_rounds *R,
                                const vl_model_type *type, const void *model_cfg, uint64_t seed, cJSON *o) {
  vl_ctx *c;
  vl_status s = vl_ctx_create(&c, env->device, vl_peer_engine_cap(cmp->spec, env->device));
  if (s != VL_OK) return vl_peer_engine_failed(env, s, NULL, cmp->rung, o);
  vl_model *m = NULL;
  s = vl_model_create(c, type, model_cfg, seed, &m);
  if (s != VL_OK) {
    s = vl_peer_engine_failed(env, s, c, cmp->rung, o);
  } else {
    cmp->c = c;
    cmp->m = m;
    s = vl_peer_compare(env, p, cmp, R, o);
    cmp->c = NULL;
    cmp->m = NULL;
  }
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  return s;
}

vl_status vl_peer_engine_failed(vl_case_env *env, vl_status s, const vl_ctx *c, const char *rung, cJSON *o) {
  if (!vl_run_is_oom(s))
    return vl_case_fail(env, s, "side by side %s: the engine failed: %s", rung, c ? c->err : vl_status_name(s));
  if (!cJSON_GetObjectItem(o, "rung")) cJSON_AddStringToObject(o, "rung", rung);
  char why[VL_PEER_WHY_LEN];
  snprintf(why, sizeof why, "the engine's step does not fit this device: %s", c ? c->err : "out of memory");
  cJSON_DeleteItemFromObject(o, "not_measured");
  cJSON_AddStringToObject(o, "not_measured", why);
  return VL_OK;
}

void vl_peer_rung_metrics(cJSON *res, const cJSON *o) {
  if (cJSON_GetObjectItem(o, "variant") || cJSON_GetObjectItem(o, "not_measured")) return;
  const cJSON *rung = vl_rep_rung(res, cJSON_GetStringValue(cJSON_GetObjectItem(o, "rung")));
  cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(rung, "runs"), 0);
  if (!r0) return;
  cJSON_AddNumberToObject(r0, "peer_step_seconds", vl_rep_num(o, "peer_median"));
  cJSON_AddNumberToObject(r0, "speedup_vs_torch", vl_rep_num(o, "speedup"));
  double pk = vl_rep_num(o, "peer_peak_bytes");
  if (!isnan(pk)) cJSON_AddNumberToObject(r0, "peer_peak_bytes", pk);
}

/* ---- the report ------------------------------------------------------------------------------- */
static double mb(double b) { return b / 1e6; }

/* One rung's row of the time and memory table. */
static void report_row(const cJSON *o, FILE *md, double sg) {
  char name[160];
  const char *v = cJSON_GetStringValue(cJSON_GetObjectItem(o, "variant"));
  snprintf(name, sizeof name, "%s%s", vl_rep_str(o, "rung"), v ? " (variant)" : "");
  if (cJSON_GetObjectItem(o, "not_measured")) {
    fprintf(md, "| %s | not measured here: %s |||||||||\n", name, vl_rep_str(o, "not_measured"));
    return;
  }
  double pk = vl_rep_num(o, "peer_peak_bytes"), pl = vl_rep_num(o, "engine_planned_peak_bytes");
  double fe = vl_rep_num(o, "engine_flops_per_s"), fp = vl_rep_num(o, "peer_flops_per_s");
  fprintf(md, "| %s | %s | %s | **%s** | %s | %s | %s (%s) | %s (%s) | %s | %s | %s |\n", name,
          vl_rep_fmt("%.4f", vl_rep_num(o, "engine_median")), vl_rep_fmt("%.4f", vl_rep_num(o, "peer_median")),
          vl_rep_fmt("%.2f×", vl_rep_num(o, "speedup")), vl_rep_fmt("%.0f", vl_rep_num(o, "engine_units_per_s")),
          vl_rep_fmt("%.0f", vl_rep_num(o, "peer_units_per_s")), vl_rep_fmt("%.1f", fe / 1e9),
          vl_rep_fmt("%.0f%%", sg > 0 ? 100 * fe / sg : NAN), vl_rep_fmt("%.1f", fp / 1e9),
          vl_rep_fmt("%.0f%%", sg > 0 ? 100 * fp / sg : NAN), vl_rep_fmt("%.1f", mb(pl)), vl_rep_fmt("%.1f", mb(pk)),
          vl_rep_fmt("%+.1f", mb(pk - pl)));
}

/* One rung's memory by part: the engine's categories at its peak, PyTorch's live bytes
 * before the step and what the step adds. */
static void report_memory_row(const cJSON *o, FILE *md) {
  if (cJSON_GetObjectItem(o, "not_measured")) return;
  const cJSON *c = cJSON_GetObjectItem(o, "engine_by_category");
  double w = vl_rep_num(c, "frozen") + vl_rep_num(c, "params");
  fprintf(md, "| %s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", vl_rep_str(o, "rung"),
          cJSON_GetObjectItem(o, "variant") ? " (variant)" : "", vl_rep_fmt("%.1f", mb(w)),
          vl_rep_fmt("%.1f", mb(vl_rep_num(c, "grads"))), vl_rep_fmt("%.1f", mb(vl_rep_num(c, "optim"))),
          vl_rep_fmt("%.1f", mb(vl_rep_num(c, "acts"))),
          vl_rep_fmt("%.1f", mb(vl_rep_num(c, "temp") + vl_rep_num(c, "workspace") + vl_rep_num(c, "data"))),
          vl_rep_fmt("%.1f", mb(vl_rep_num(o, "peer_persistent_bytes"))),
          vl_rep_fmt("%.1f", mb(vl_rep_num(o, "peer_step_extra_bytes"))),
          vl_rep_fmt("%.1f", mb(vl_rep_num(o, "peer_saved_bytes"))),
          cJSON_IsTrue(cJSON_GetObjectItem(o, "params_match")) ? "yes" : "**no**");
}

static const char *mb_or(const cJSON *o, const char *key, const char *why_key, const char *missing) {
  double v = vl_rep_num(o, key);
  if (!isnan(v)) return vl_rep_fmt("%.1f", mb(v));
  return cJSON_GetObjectItem(o, why_key) ? missing : "-";
}

static const char *pct_vs(const cJSON *o, const char *key, double real) {
  double v = vl_rep_num(o, key);
  return isnan(v) || isnan(real) || real <= 0 ? "-" : vl_rep_fmt("%+.1f%%", 100 * (v / real - 1));
}

/* The largest parts of a rung's measured peak that are no tensor, in words. */
static const char *heap_class_words(const char *c) {
  static const char *const map[][2] = {
      {"c10_allocator", "buffers a library took through PyTorch's CPU allocator, no op's output"},
      {"libtorch_cpu", "libtorch_cpu's own buffers (oneDNN, MKL)"},
      {"operator_new", "C++ objects (autograd's graph, library state)"},
      {"python", "Python objects"},
      {"small", "blocks under 4 KiB"},
      {"other", "other libraries' buffers"}};
  for (size_t i = 0; i < sizeof map / sizeof *map; i++)
    if (!strcmp(c, map[i][0])) return map[i][1];
  return c;
}

static void report_no_tensor(const cJSON *o, FILE *md) {
  double at = vl_rep_num(o, "heap_no_tensor_bytes_at_peak"), pk = vl_rep_num(o, "heap_peak_bytes");
  const cJSON *top = cJSON_GetObjectItem(o, "heap_no_tensor_at_peak");
  if (isnan(at) || isnan(pk) || !cJSON_IsArray(top)) return;
  fprintf(md, " %s: of its split's peak, %s MB, %s MB is no tensor (%s MB still held after the step)", vl_rep_str(o, "rung"),
          vl_rep_fmt("%.1f", mb(pk)), vl_rep_fmt("%.1f", mb(at)), vl_rep_fmt("%.1f", mb(vl_rep_num(o, "heap_no_tensor_kept_bytes"))));
  int k = 0;
  const cJSON *r;
  cJSON_ArrayForEach(r, top) {
    const char *c = cJSON_GetStringValue(cJSON_GetArrayItem(r, 0)), *op = cJSON_GetStringValue(cJSON_GetArrayItem(r, 1));
    double n = cJSON_GetNumberValue(cJSON_GetArrayItem(r, 2));
    if (!c || !op || isnan(n) || k == 3) break;
    fprintf(md, "%s%s MB %s%s%s", k ? "; " : ": largest ", vl_rep_fmt("%.1f", mb(n)), heap_class_words(c),
            strcmp(op, "-") ? " in " : "", strcmp(op, "-") ? op : " between ops");
    k++;
  }
  fprintf(md, ".");
}

/* The four answers to "how much memory does this step take": the engine's plan of its own
 * step, the mimic of PyTorch's (vramlab/mimic.h, where the case has one), PyTorch's own
 * estimator (MemTracker on fake tensors), and PyTorch's step measured; with the time each
 * planner took. */
static void report_estimates(const cJSON *pe, FILE *md) {
  const cJSON *o;
  int any = 0;
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(pe, "rungs")) any |= !cJSON_GetObjectItem(o, "not_measured");
  if (!any) return;
  fprintf(md, "\n#### The step's peak, four ways\n\n"
              "| rung | engine's plan MB (planned) | PyTorch mimic MB (planned) | MemTracker MB (PyTorch's estimator) "
              "| mimic on MemTracker's terms MB (planned; vs MemTracker) | PyTorch measured MB | mimic vs measured | MemTracker vs measured | PyTorch's tensors at their peak MB "
              "(measured) | mimic vs measured tensors | no tensor at the measured peak MB (measured) | planning time: "
              "engine ms / mimic ms / MemTracker s |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(pe, "rungs")) {
    if (cJSON_GetObjectItem(o, "not_measured")) continue;
    double fake = vl_rep_num(o, "mimic_fake_peak_bytes"), mt = vl_rep_num(o, "memtracker_peak_bytes");
    double real = vl_rep_num(o, "peer_peak_bytes");
    double tens = vl_rep_num(o, "heap_tensor_peak_bytes");
    fprintf(md, "| %s%s | %s | %s | %s | %s%s | %s | %s | %s | %s | %s | %s | %s / %s / %s |\n", vl_rep_str(o, "rung"),
            cJSON_GetObjectItem(o, "variant") ? " (variant)" : "",
            vl_rep_fmt("%.1f", mb(vl_rep_num(o, "engine_planned_peak_bytes"))), mb_or(o, "mimic_peak_bytes", "mimic_why", "not mimicked"),
            mb_or(o, "memtracker_peak_bytes", "memtracker_why", "not measured here"),
            mb_or(o, "mimic_fake_peak_bytes", "mimic_why", "-"), isnan(fake) || isnan(mt) ? "" : vl_rep_fmt(" (%+.1f%%)", 100 * (fake / mt - 1)),
            vl_rep_fmt("%.1f", mb(real)),
            pct_vs(o, "mimic_peak_bytes", real), pct_vs(o, "memtracker_peak_bytes", real),
            mb_or(o, "heap_tensor_peak_bytes", "heap_why", "not measured here"), pct_vs(o, "mimic_peak_bytes", tens),
            mb_or(o, "heap_no_tensor_bytes_at_peak", "heap_why", "not measured here"),
            vl_rep_fmt("%.2f", 1e3 * vl_rep_num(o, "engine_plan_seconds")),
            vl_rep_fmt("%.2f", 1e3 * vl_rep_num(o, "mimic_seconds")), vl_rep_fmt("%.1f", vl_rep_num(o, "memtracker_seconds")));
  }
  const char *mem = cJSON_GetStringValue(cJSON_GetObjectItem(pe, "memory"));
  if (mem && !strcmp(mem, "cuda")) {
    fprintf(md, "\nAll four at this run's scale and batch, on this GPU. The mimic replays PyTorch's own CUDA step op by "
                "op (`vramlab plan CASE --mimic pytorch`, its CUDA path: autocast's casts, SDPA's kernel on this card, "
                "cuBLAS's workspaces); MemTracker (`torch.distributed._tools.mem_tracker`) traces the real ops on "
                "fake CUDA tensors, the batch not counted; \"measured\" is `torch.cuda.max_memory_allocated` above "
                "the bytes allocated when the setup began: tensors only, each rounded to the caching allocator's "
                "512-byte blocks, so no column splits it. The mimic on MemTracker's terms is the CPU's fake-tensor "
                "code path and is not made on a GPU.");
  } else {
    fprintf(md, "\nAll four at this run's scale and batch, on this CPU. The mimic replays PyTorch's own step op by op "
                "(`vramlab plan CASE --mimic pytorch`; tests/test_mimic.c holds it to PyTorch's traces); MemTracker "
                "(`torch.distributed._tools.mem_tracker`) traces the real ops on fake tensors, the batch not counted; "
                "\"measured\" is the peer's live heap bytes above those when its setup began (malloc-counted: kernel "
                "workspaces and library buffers that are no tensor are in it, not in the two estimates). MemTracker's "
                "terms: the mimic of the step as MemTracker traces it, PyTorch's code path on fake tensors (there "
                "transformers builds the causal mask as a tensor and SDPA repeats k and v to every head, where the "
                "real run passes is_causal and grouped heads; F.mse_loss's output is a storage of its own), the batch "
                "not counted: the like-for-like number beside MemTracker's. Its split "
                "(tools/peers/heap_breakdown.py: the step run again in a fresh process, each heap block kept with the "
                "ATen op that made it and whether it is a tensor's storage) gives PyTorch's tensors at their highest, "
                "the number the mimic and MemTracker estimate, and what is no tensor at the measured peak.");
    cJSON_ArrayForEach(o, cJSON_GetObjectItem(pe, "rungs")) report_no_tensor(o, md);
  }
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(pe, "rungs")) {
    const char *w = cJSON_GetStringValue(cJSON_GetObjectItem(o, "memtracker_why"));
    const char *m = cJSON_GetStringValue(cJSON_GetObjectItem(o, "mimic_why"));
    if (w) fprintf(md, " %s: MemTracker not measured here: %s.", vl_rep_str(o, "rung"), w);
    if (m) fprintf(md, " %s: no mimic: %s.", vl_rep_str(o, "rung"), m);
  }
  fprintf(md, "\n");
}

/* One rung's difference in words: the total, then the parts measured on both sides. */
static void report_difference(const cJSON *o, FILE *md) {
  if (cJSON_GetObjectItem(o, "not_measured") || isnan(vl_rep_num(o, "peer_peak_bytes"))) return;
  const cJSON *c = cJSON_GetObjectItem(o, "engine_by_category");
  double pk = vl_rep_num(o, "peer_peak_bytes"), pl = vl_rep_num(o, "engine_planned_peak_bytes");
  double keep = vl_rep_num(c, "frozen") + vl_rep_num(c, "params") + vl_rep_num(c, "optim");
  double before = vl_rep_num(o, "peer_persistent_bytes"), saved = vl_rep_num(o, "peer_saved_bytes");
  fprintf(md, "- %s%s: PyTorch's peak is %s MB %s the plan's. Before a step PyTorch holds %s MB against the "
              "engine's %s MB of weights and optimizer state (%s MB: what its libraries keep after first use, "
              "buffer pools and caches that are no tensor, and allocation rounding); the engine also keeps %s MB of gradients between steps, which PyTorch "
              "frees.", vl_rep_str(o, "rung"), cJSON_GetObjectItem(o, "variant") ? " (variant)" : "",
          vl_rep_fmt("%.1f", fabs(mb(pk - pl))), pk >= pl ? "above" : "below",
          vl_rep_fmt("%.1f", mb(before)), vl_rep_fmt("%.1f", mb(keep)), vl_rep_fmt("%+.1f", mb(before - keep)),
          vl_rep_fmt("%.1f", mb(vl_rep_num(c, "grads"))));
  if (!isnan(saved))
    fprintf(md, " Autograd saves %s MB for backward against the engine's %s MB of activations (%s MB).",
            vl_rep_fmt("%.1f", mb(saved)), vl_rep_fmt("%.1f", mb(vl_rep_num(c, "acts"))),
            vl_rep_fmt("%+.1f", mb(saved - vl_rep_num(c, "acts"))));
  fprintf(md, "\n");
}

void vl_peer_report(const cJSON *res, FILE *md, const vl_peer_kind *k, const char *notes) {
  fprintf(md, "### PyTorch side by side\n\n");
  const cJSON *pe = cJSON_GetObjectItem(cJSON_GetObjectItem(res, "case_metrics"), "peers"), *o;
  if (!cJSON_IsObject(pe)) {
    fprintf(md, "Not measured in this run: the comparison runs after the ladder (`vramlab bench`, or `vramlab "
                "run` without `--step`) when PyTorch is installed (`%s`).\n\n", k->install);
    return;
  }
  if (cJSON_GetObjectItem(pe, "not_measured")) {
    fprintf(md, "Not measured here: %s.\n\n", vl_rep_str(pe, "not_measured"));
    return;
  }
  const char *mem = cJSON_GetStringValue(cJSON_GetObjectItem(pe, "memory"));
  char tv[96] = "";
  if (cJSON_GetStringValue(cJSON_GetObjectItem(pe, "transformers")))
    snprintf(tv, sizeof tv, " (transformers %s)", vl_rep_str(pe, "transformers"));
  fprintf(md, "The same step in PyTorch %s%s on the %s, run in turn with the engine's in "
              "this run: %s warm-up steps each, then %s rounds, each %s untimed and %s timed engine steps "
              "followed by the same in PyTorch (switching processes leaves caches and idle thread pools cold "
              "for a step, on both sides alike); the PyTorch process stays up between rounds, so its start-up "
              "is not timed%s. Medians over the timed steps; ratio = PyTorch's median / the engine's (above 1: "
              "the engine is faster). FLOP/s of both are the engine's model FLOPs per step (recompute "
              "excluded) over each side's step time, as a share of this run's sgemm. Both sides use the same "
              "threads, batch, sequence or image size, dtypes and optimizer.\n\n",
          vl_rep_str(pe, "torch"), tv, vl_rep_str(pe, "device"),
          vl_rep_fmt("%g", vl_rep_num(pe, "warmup")), vl_rep_fmt("%g", vl_rep_num(pe, "rounds")),
          vl_rep_fmt("%g", vl_rep_num(pe, "round_warmup")), vl_rep_fmt("%g", vl_rep_num(pe, "steps_per_round")),
          cJSON_IsTrue(cJSON_GetObjectItem(pe, "fresh_process"))
              ? ", and each rung has a fresh PyTorch process (one that ran an earlier rung keeps pools and "
                "caches that make the next rung's memory read low)"
              : "");
  double sg = vl_rep_num(res, "sgemm_flops_per_s");
  fprintf(md, "| rung | engine s/step | PyTorch s/step | PyTorch / engine | engine %s/s | PyTorch %s/s | engine "
              "GFLOP/s (share of sgemm) | PyTorch GFLOP/s (share) | engine peak MB (planned) | PyTorch peak MB "
              "(measured) | PyTorch − planned MB |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
          k->unit, k->unit);
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(pe, "rungs")) report_row(o, md, sg);
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(pe, "rungs")) {
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItem(o, "variant"));
    if (v) fprintf(md, "\n%s (variant): %s.", vl_rep_str(o, "rung"), vl_rep_str(o, "variant"));
  }
  if (!mem)
    fprintf(md, "\n\nPyTorch's memory: not measured here: %s.\n", vl_rep_str(pe, "memory_why"));
  else
    fprintf(md, "\n\nPyTorch's memory: %s, above the live bytes when the setup began (the interpreter and "
                "the libraries' own allocations left out), the highest over the timed steps.\n",
            !strcmp(mem, "cuda") ? "`torch.cuda.max_memory_allocated`" :
            "live heap bytes counted by `libvlmemcount.so` (malloc, calloc, realloc, posix_memalign and the "
            "other allocation calls wrapped by LD_PRELOAD; each block's usable size, so malloc's rounding is "
            "in; memory a library maps itself is not)");
  fprintf(md, "\n| rung | engine weights MB | grads | optimizer | activations | temp + workspace + data | "
              "PyTorch before the step MB | the step adds | saved for backward | parameters equal |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(pe, "rungs")) report_memory_row(o, md);
  fprintf(md, "\nThe engine's columns are its arena's categories at its peak (planned = measured on the CPU). "
              "PyTorch's \"before the step\" is weights and optimizer state: its gradients are set to None "
              "after every step (`zero_grad()`'s default) and come back during backward, while the engine keeps "
              "its gradient buffers for the whole run and zeroes them, so both peaks hold gradients but only "
              "the engine holds them between steps. \"The step adds\" is gradients, the tensors autograd saves "
              "for backward, temporaries, and library workspace (oneDNN's scratchpads, MKL's and OpenMP's "
              "buffers), plus malloc's rounding of each block; \"saved for backward\" is the bytes of the "
              "distinct tensors autograd saved in one forward (parameters left out; not measured under "
              "checkpointing, whose re-run hides them).\n\n");
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(pe, "rungs")) report_difference(o, md);
  report_estimates(pe, md);
  if (notes && *notes) fprintf(md, "\n%s\n", notes);
  fprintf(md, "\n");
}

vl_status vl_peer_side_by_side(vl_case_env *env, cJSON *res, const vl_peer_kind *k, const vl_peer_rounds *R,
                               const char *const *compared, int n_compared, vl_peer_rung_fn fn) {
  if (env->device == VL_DEV_PLAN) return VL_OK;
  const cJSON *which[16];
  int n = 0;
  for (int i = 0; i < n_compared && n < 16; i++) {
    const cJSON *r = vl_rep_rung(res, compared[i]);
    if (r && cJSON_GetObjectItem(r, "runs")) which[n++] = r;
  }
  if (!n) return VL_OK; /* a ladder without them: nothing to compare */
  int threads = omp_get_max_threads();
  vl_peer p;
  if (!env->quiet) vl_progress("PyTorch side by side: starting tools/peers/%s", k->script);
  cJSON *hello = vl_peer_open(&p, k, env->device, threads);
  cJSON *pe = vl_peer_results(res, hello, p.why, R);
  vl_status s = VL_OK;
  if (hello) cJSON_AddBoolToObject(pe, "fresh_process", k->fresh);
  for (int i = 0; hello && s == VL_OK && i < n && !vl_interrupted; i++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_GetObjectItem(pe, "rungs"), o);
    if (i > 0 && k->fresh) { /* a new process for this rung: the last one's pools and caches gone */
      vl_peer_stop(&p);
      cJSON *again = vl_peer_open(&p, k, env->device, threads);
      if (!again) {
        cJSON_AddStringToObject(o, "rung", cJSON_GetStringValue(cJSON_GetObjectItem(which[i], "name")));
        cJSON_AddStringToObject(o, "not_measured", p.why);
        continue;
      }
      cJSON_Delete(hello);
      hello = again;
    }
    s = fn(env, &p, hello, which[i], threads, o);
    vl_peer_rung_metrics(res, o);
  }
  vl_peer_stop(&p);
  cJSON_Delete(hello);
  return s;
}
