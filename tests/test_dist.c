/* engine/dist in one process: the pure helpers (busbw factors, device choice, the NCCL
 * path's codes, local rank and stream/event plan, the latter run through a small stream
 * simulator), the `self` communicator, the timeout setting, vl_mpirun's errors, exit
 * statuses, output and time limit, and the killed-rank tests: 2 ranks of mpi_comm
 * (tests/mpi_comm.c) where rank 1 dies (SIGKILL) or aborts before an allreduce end the job
 * with an error naming rank 1, well inside a bound. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/nccl_plan.h"
#include "kit/mpirun.h"
#include "vramlab/dist.h"

/* ============================== pure helpers ======================================== */

static void test_busbw_factor(void **state) {
  assert_true(vl_comm_busbw_factor("allreduce", 2) == 1.0);
  assert_true(vl_comm_busbw_factor("allreduce", 4) == 1.5);
  assert_true(vl_comm_busbw_factor("allreduce", 8) == 1.75);
  assert_true(vl_comm_busbw_factor("allreduce", 1) == 0.0);
  assert_true(vl_comm_busbw_factor("reduce_scatter", 4) == 0.75);
  assert_true(vl_comm_busbw_factor("allgather", 2) == 0.5);
  assert_true(vl_comm_busbw_factor("broadcast", 8) == 1.0);
  assert_true(vl_comm_busbw_factor("reduce", 3) == 1.0);
  assert_true(vl_comm_busbw_factor("nonsense", 4) == 0.0);
  assert_true(vl_comm_busbw_factor("allreduce", 0) == 0.0);
  assert_true(vl_comm_busbw_factor(NULL, 2) == 0.0);
}

static void test_device_of(void **state) {
  assert_int_equal(vl_comm_device_of(0, 4), 0);
  assert_int_equal(vl_comm_device_of(3, 4), 3);
  assert_int_equal(vl_comm_device_of(5, 4), 1);
  assert_int_equal(vl_comm_device_of(1, 1), 0);
  assert_int_equal(vl_comm_device_of(0, 0), -1);
  assert_int_equal(vl_comm_device_of(-1, 2), -1);
  assert_int_equal(vl_nccl_local_rank("3", "1", "2", 9), 3);
  assert_int_equal(vl_nccl_local_rank(NULL, "1", "2", 9), 1);
  assert_int_equal(vl_nccl_local_rank(NULL, NULL, "2", 9), 2);
  assert_int_equal(vl_nccl_local_rank(NULL, NULL, NULL, 9), 9);
  assert_int_equal(vl_nccl_local_rank("x", "-1", "", 5), 5);
}

static void test_nccl_codes(void **state) {
  /* nccl.h: ncclFloat32 7, ncclFloat16 6, ncclBfloat16 9, ncclInt32 2; ncclSum 0, ncclAvg 4 */
  assert_int_equal(vl_nccl_dtype(VL_F32), 7);
  assert_int_equal(vl_nccl_dtype(VL_F16), 6);
  assert_int_equal(vl_nccl_dtype(VL_BF16), 9);
  assert_int_equal(vl_nccl_dtype(VL_I32), 2);
  assert_int_equal(vl_nccl_dtype(VL_NF4), -1);
  assert_int_equal(vl_nccl_redop(VL_RED_SUM), 0);
  assert_int_equal(vl_nccl_redop(VL_RED_AVG), 4);
  assert_int_equal(vl_nccl_redop((vl_red_op)7), -1);
}

/* ---- the stream/event plan on a simulated GPU ------------------------------------------ */

/* Host program: compute kernels (K), collective starts (S slot) and waits (W slot), turned
 * into two stream queues with the plan; the simulator runs the queues (CUDA semantics: a
 * stream runs its items in order, a WAIT holds it until the event's RECORD has run),
 * preferring one stream, and logs the order items ran in. */
enum { K = 0, S = 1, W = 2 };
typedef struct { int what, arg; } host_op;
typedef struct { vl_nccl_act a; int kernel; int coll; } item; /* kernel/coll: ids, -1 */
#define QMAX 64

typedef struct {
  item q[2][QMAX];
  int n[2], pos[2];
  bool recorded[64];
  int order_kernel[QMAX], order_launch[QMAX]; /* time step each ran at */
} sim;

static void enqueue(sim *s, vl_nccl_act a, int kernel, int coll) {
  int st = a.stream;
  assert_true(s->n[st] < QMAX);
  item it = {a, kernel, coll};
  s->q[st][s->n[st]++] = it;
}

static void build(sim *s, const host_op *prog, int n) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < n; i++) {
    vl_nccl_act acts[VL_NCCL_START_ACTS];
    if (prog[i].what == K) {
      vl_nccl_act k = {VL_NA_LAUNCH, VL_NS_COMPUTE, -1};
      enqueue(s, k, prog[i].arg, -1);
    } else if (prog[i].what == S) {
      int m = vl_nccl_plan_start(prog[i].arg, acts);
      for (int j = 0; j < m; j++) enqueue(s, acts[j], -1, acts[j].kind == VL_NA_LAUNCH ? prog[i].arg : -1);
    } else {
      int m = vl_nccl_plan_wait(prog[i].arg, acts);
      for (int j = 0; j < m; j++) enqueue(s, acts[j], -1, -1);
    }
  }
}

/* Runs to the end (fails on a deadlock), `first` stream preferred. */
static void run_sim(sim *s, int first) {
  for (int t = 0;; t++) {
    bool moved = false;
    for (int k = 0; k < 2 && !moved; k++) {
      int st = k == 0 ? first : 1 - first;
      if (s->pos[st] >= s->n[st]) continue;
      item *it = &s->q[st][s->pos[st]];
      if (it->a.kind == VL_NA_WAIT && !s->recorded[it->a.event]) continue;
      if (it->a.kind == VL_NA_RECORD) s->recorded[it->a.event] = true;
      if (it->kernel >= 0) s->order_kernel[it->kernel] = t;
      if (it->coll >= 0) s->order_launch[it->coll] = t;
      s->pos[st]++;
      moved = true;
    }
    if (!moved) {
      assert_int_equal(s->pos[0], s->n[0]); /* else a deadlock */
      assert_int_equal(s->pos[1], s->n[1]);
      return;
    }
  }
}

static void test_nccl_stream_plan(void **state) {
  /* K0 S0 K1 S1 K2 W1 K3 W0 K4: collective 0 reads what K0 wrote, 1 what K0, K1 wrote; K3
   * reads collective 1's result, K4 collective 0's */
  const host_op prog[] = {{K, 0}, {S, 0}, {K, 1}, {S, 1}, {K, 2}, {W, 1}, {K, 3}, {W, 0}, {K, 4}};
  const int n = (int)(sizeof prog / sizeof prog[0]);
  for (int first = 0; first < 2; first++) {
    sim s;
    build(&s, prog, n);
    run_sim(&s, first);
    for (int i = 0; i < n; i++) {
      if (prog[i].what != S) continue;
      int c = prog[i].arg;
      for (int j = 0; j < n; j++) {
        if (prog[j].what != K) continue;
        int kk = prog[j].arg;
        if (j < i) assert_true(s.order_kernel[kk] < s.order_launch[c]); /* input ready */
        bool after_wait = false;
        for (int w = 0; w < j; w++) after_wait |= prog[w].what == W && prog[w].arg == c;
        if (after_wait) assert_true(s.order_kernel[kk] > s.order_launch[c]); /* result seen */
      }
    }
    assert_true(s.order_launch[0] < s.order_launch[1]); /* start order on every rank */
    if (first == VL_NS_COMM) { /* overlap: collective 0 need not wait for K1 or K2 */
      assert_true(s.order_launch[0] < s.order_kernel[1]);
      assert_true(s.order_launch[1] < s.order_kernel[2]);
    }
  }
}

/* ============================== self communicator =================================== */

static void test_self(void **state) {
  vl_err err;
  vl_comm *cm = NULL;
  assert_int_equal(vl_comm_create_self(&cm, &err), VL_OK);
  assert_int_equal(vl_comm_kind_of(cm), VL_COMM_SELF);
  assert_string_equal(vl_comm_kind_name(VL_COMM_SELF), "self");
  assert_int_equal(vl_comm_rank(cm), 0);
  assert_int_equal(vl_comm_size(cm), 1);
  vl_ctx *c = tu_cpu;
  float a[5] = {1, -2, 3.5f, 4, 5}, b[5] = {0};
  assert_int_equal(vl_comm_allreduce(cm, c, a, b, 5, VL_F32, VL_RED_AVG, NULL), VL_OK);
  assert_memory_equal(a, b, sizeof a);
  memset(b, 0, sizeof b);
  vl_comm_req *r = NULL;
  assert_int_equal(vl_comm_reduce_scatter(cm, c, a, b, 5, VL_F32, VL_RED_SUM, &r), VL_OK);
  bool done = false;
  assert_int_equal(vl_comm_test(cm, c, r, &done), VL_OK);
  assert_true(done);
  assert_int_equal(vl_comm_wait(cm, c, r), VL_OK);
  assert_memory_equal(a, b, sizeof a);
  memset(b, 0, sizeof b);
  assert_int_equal(vl_comm_allgather(cm, c, a, b, 3, VL_F32, NULL), VL_OK);
  assert_memory_equal(a, b, 3 * sizeof(float));
  assert_true(b[3] == 0);
  assert_int_equal(vl_comm_allreduce(cm, c, a, a, 5, VL_F32, VL_RED_SUM, NULL), VL_OK);
  assert_true(a[2] == 3.5f);
  assert_int_equal(vl_comm_bcast(cm, c, a, 5, VL_F32, 0, NULL), VL_OK);
  assert_int_equal(vl_comm_barrier(cm, c, NULL), VL_OK);
  assert_int_equal(vl_comm_gather(cm, c, a, b, 5, VL_F32, 0, NULL), VL_OK);
  assert_int_equal(vl_comm_wait(cm, c, NULL), VL_OK);
  TU_BAD(c, vl_comm_bcast(cm, c, a, 5, VL_F32, 1, NULL), "root 1");
  TU_BAD(c, vl_comm_allreduce(cm, c, a, a + 2, 3, VL_F32, VL_RED_SUM, NULL), "overlap");
  vl_comm_progress(cm);
  vl_comm_destroy(cm);
  vl_comm_destroy(NULL);
}

static void test_timeout_env(void **state) {
  vl_err err = {""};
  vl_comm *cm = NULL;
  setenv("VRAMLAB_COMM_TIMEOUT", "2.5", 1);
  assert_int_equal(vl_comm_create_self(&cm, &err), VL_OK);
  assert_true(vl_comm_timeout(cm) == 2.5);
  vl_comm_set_timeout(cm, 7);
  assert_true(vl_comm_timeout(cm) == 7);
  vl_comm_destroy(cm);
  setenv("VRAMLAB_COMM_TIMEOUT", "soon", 1);
  assert_int_equal(vl_comm_create_self(&cm, &err), VL_ERR_INVALID);
  assert_null(cm);
  assert_non_null(strstr(err.msg, "VRAMLAB_COMM_TIMEOUT=soon"));
  unsetenv("VRAMLAB_COMM_TIMEOUT");
  assert_int_equal(vl_comm_create_self(&cm, &err), VL_OK);
  assert_true(vl_comm_timeout(cm) == 120);
  vl_comm_destroy(cm);
}

/* vl_comm_abort on self: the message on stderr, the exit status */
static void test_self_abort(void **state) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(p[1], 2);
    vl_err err;
    vl_comm *cm = NULL;
    if (vl_comm_create_self(&cm, &err)) _exit(99);
    vl_comm_abort(cm, 7, "the loss is NaN");
  }
  close(p[1]);
  char out[512] = "";
  ssize_t k = read(p[0], out, sizeof out - 1);
  close(p[0]);
  out[k > 0 ? k : 0] = 0;
  int st;
  waitpid(pid, &st, 0);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 7);
  assert_non_null(strstr(out, "vramlab: rank 0 of 1: the loss is NaN"));
}

static void test_nccl_unsupported(void **state) {
  vl_err err = {""};
  vl_comm *self = NULL, *nc = (vl_comm *)&err;
  assert_int_equal(vl_comm_create_self(&self, &err), VL_OK);
  /* a CPU context: NCCL needs device buffers, whatever the build */
  vl_status s = vl_comm_create_nccl(self, tu_cpu, &nc, &err);
  assert_int_equal(s, VL_ERR_UNSUPPORTED);
  assert_null(nc);
  assert_true(strlen(err.msg) > 10);
  vl_comm_destroy(self);
#ifdef VRAMLAB_HAVE_MPI
  assert_true(vl_comm_have_mpi());
#else
  vl_comm *m = NULL;
  assert_int_equal(vl_comm_create_mpi(&m, &err), VL_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "apt-get install libopenmpi-dev openmpi-bin"));
#endif
}

/* ============================== vl_mpirun =========================================== */

/* A file's bytes as a NUL-terminated string (malloc'd). */
__attribute__((unused)) static char *slurp_text(const char *path) {
  uint8_t *b = NULL;
  size_t n = tu_slurp(path, &b);
  b[n] = 0;
  return (char *)b;
}

static void test_self_exe_cores(void **state) {
  char exe[4096];
  assert_int_equal(vl_self_exe(exe, sizeof exe), 0);
  assert_non_null(strstr(exe, "test_dist"));
  assert_int_equal(vl_self_exe(exe, 4), -1);
  assert_true(vl_cores() >= 1);
}

static void test_mpirun_errors(void **state) {
  vl_err err = {0};
  char *cmd[] = {"/bin/true", NULL};
  vl_mpirun_opts o = {0, false, 0, 30, NULL};
  assert_int_equal(vl_mpirun(&o, cmd, &err), -1);
  assert_non_null(strstr(err.msg, "at least 1"));
  o.np = vl_cores() + 1;
  assert_int_equal(vl_mpirun(&o, cmd, &err), -1);
  assert_non_null(strstr(err.msg, "oversubscri"));
  o.np = 1;
  char *none[] = {NULL};
  assert_int_equal(vl_mpirun(&o, none, &err), -1);
  assert_non_null(strstr(err.msg, "no command"));
  setenv("VRAMLAB_MPIRUN", "/nonexistent/mpirun", 1);
  assert_int_equal(vl_mpirun(&o, cmd, &err), -1);
  unsetenv("VRAMLAB_MPIRUN");
  assert_non_null(strstr(err.msg, "apt-get install libopenmpi-dev openmpi-bin"));
}

/* The job's output file: a link planted at its path is replaced, never written through (its
 * target keeps its bytes); stdout and stderr both land in the new file, and no temporary file
 * is left. A fake mpirun (VRAMLAB_MPIRUN): no MPI needed. */
static void test_mpirun_out_link_not_followed(void **state) {
  char fake[300], out[300], victim[300];
  vl_err err = {0};
  tu_join(fake, sizeof fake, tu_tmp, "fake-mpirun");
  tu_join(out, sizeof out, tu_tmp, "job-out.txt");
  tu_join(victim, sizeof victim, tu_tmp, "precious.txt");
  tu_write_text(fake, "#!/bin/sh\necho 'fake job out'\necho 'fake job err' >&2\nexit 0\n");
  assert_int_equal(chmod(fake, 0755), 0);
  tu_write_text(victim, "precious\n");
  unlink(out);
  assert_int_equal(symlink(victim, out), 0);
  setenv("VRAMLAB_MPIRUN", fake, 1);
  char *cmd[] = {"/bin/true", NULL};
  vl_mpirun_opts o = {1, false, 0, 30, out};
  int st = vl_mpirun(&o, cmd, &err);
  unsetenv("VRAMLAB_MPIRUN");
  if (st) fail_msg("status %d: %s", st, err.msg);
  char *t = slurp_text(victim);
  assert_string_equal(t, "precious\n");
  free(t);
  struct stat sb;
  assert_int_equal(lstat(out, &sb), 0);
  assert_true(S_ISREG(sb.st_mode));
  t = slurp_text(out);
  assert_non_null(strstr(t, "fake job out"));
  assert_non_null(strstr(t, "fake job err"));
  free(t);
  DIR *d = opendir(tu_tmp);
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d));)
    if (strstr(e->d_name, "job-out.txt.tmp.")) fail_msg("a temporary file is left: %s", e->d_name);
  closedir(d);
}

#ifdef VRAMLAB_HAVE_MPI
/* exit status and output of a 2-rank job of plain shell commands; the threads setting */
static void test_mpirun_runs(void **state) {
  char out[300];
  vl_err err = {0};
  tu_join(out, sizeof out, tu_tmp, "job.txt");
  char *ok[] = {"/bin/sh", "-c", "echo rank $OMPI_COMM_WORLD_RANK threads $OMP_NUM_THREADS", NULL};
  vl_mpirun_opts o = {2, false, 1, 60, out};
  assert_int_equal(vl_mpirun(&o, ok, &err), 0);
  char *text = slurp_text(out);
  assert_non_null(strstr(text, "rank 0 threads 1"));
  assert_non_null(strstr(text, "rank 1 threads 1"));
  free(text);
  char *bad[] = {"/bin/sh", "-c", "exit 3", NULL};
  int st = vl_mpirun(&o, bad, &err);
  assert_true(st != 0 && st != 124 && st != -1);
}

/* pid has exited (or is a zombie waiting for its reaper) within `seconds` */
static bool gone(pid_t pid, double seconds) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  for (double t0 = vl_now();; usleep(20 * 1000)) { /* seconds 0: one look */
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    char *rp = strrchr(buf, ')');
    if (rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X')) return true;
    if (vl_now() - t0 >= seconds) return false;
  }
}

/* past the limit the job is killed: 124, quickly, with the sleeping ranks gone */
static void test_mpirun_timeout(void **state) {
  char out[300];
  vl_err err = {0};
  tu_join(out, sizeof out, tu_tmp, "slow.txt");
  char *slow[] = {"/bin/sh", "-c", "echo $$; exec sleep 30", NULL};
  vl_mpirun_opts o = {2, false, 0, 1.5, out};
  double t0 = vl_now();
  assert_int_equal(vl_mpirun(&o, slow, &err), 124);
  double dt = vl_now() - t0;
  assert_true(dt >= 1.4 && dt < 12);
  assert_non_null(strstr(err.msg, "ran past 1.5 s"));
  char *text = slurp_text(out);
  int pids = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    if (strspn(line, "0123456789") != strlen(line)) continue; /* mpirun's own lines */
    pids++;
    assert_true(gone((pid_t)atol(line), 3.0)); /* the rank is gone */
  }
  free(text);
  assert_int_equal(pids, 2);
}

/* rank 1 of mpi_comm dies by SIGKILL (or calls vl_comm_abort) before an allreduce rank 0
 * waits in: the job ends non-zero within 60 s and its output names rank 1 */
static void fault_job(const char *mode, const char *name, const char *want) {
  char exe[300], out[300];
  vl_err err = {0};
  snprintf(exe, sizeof exe, "%s/mpi_comm", VRAMLAB_BINARY_DIR);
  if (access(exe, X_OK)) {
    print_error("%s missing: build the mpi_comm target\n", exe);
    fail();
  }
  tu_join(out, sizeof out, tu_tmp, name);
  char *cmd[] = {exe, (char *)mode, "1", NULL};
  vl_mpirun_opts o = {2, false, 1, 90, out};
  double t0 = vl_now();
  int st = vl_mpirun(&o, cmd, &err);
  double dt = vl_now() - t0;
  char *text = slurp_text(out);
  if (st == 0 || st == 124 || st == -1 || dt > 60 || !strstr(text, want)) {
    print_error("%s: status %d after %.1f s (%s); output:\n%s\n", mode, st, dt, err.msg, text);
    fail();
  }
  assert_null(strstr(text, "completed without rank"));
  free(text);
}

/* `vramlab bench`: relaunched under mpirun, every row checked (#wrong 0), sizes doubling
 * from 8 B to the maximum, busbw = algbw * (n-1)/n, the JSON written; bad arguments exit 2 */
static void test_collbench(void **state) {
  char cmd[1024], js[300], log[300];
  tu_join(js, sizeof js, tu_tmp, "rs.json");
  tu_join(log, sizeof log, tu_tmp, "rs.txt");
  snprintf(cmd, sizeof cmd, "%s/vramlab bench reduce_scatter --max-bytes 4K --iters 3 --warmup 1 "
           "--dtype bfloat16 --json %s > %s 2>&1", VRAMLAB_BINARY_DIR, js, log);
  int st = system(cmd);
  char *text = slurp_text(log);
  if (st != 0) print_error("%s: status %d\n%s\n", cmd, st, text);
  assert_int_equal(st, 0);
  assert_non_null(strstr(text, "# Out of bounds values : 0 OK"));
  assert_non_null(strstr(text, "bfloat16"));
  free(text);
  text = slurp_text(js);
  cJSON *o = cJSON_Parse(text);
  free(text);
  assert_non_null(o);
  assert_string_equal(cJSON_GetObjectItem(o, "collective")->valuestring, "reduce_scatter");
  assert_string_equal(cJSON_GetObjectItem(o, "backend")->valuestring, "mpi");
  assert_int_equal(cJSON_GetObjectItem(o, "ranks")->valueint, 2);
  cJSON *rows = cJSON_GetObjectItem(o, "rows");
  assert_int_equal(cJSON_GetArraySize(rows), 10); /* 8 B .. 4 KiB */
  double bytes = 8, sum = 0;
  cJSON *r;
  cJSON_ArrayForEach(r, rows) {
    assert_true(cJSON_GetObjectItem(r, "bytes")->valuedouble == bytes);
    assert_true(cJSON_GetObjectItem(r, "count")->valuedouble == bytes / 2);
    for (int k = 0; k < 2; k++) {
      cJSON *m = cJSON_GetObjectItem(r, k ? "ip" : "oop");
      double t = cJSON_GetObjectItem(m, "time_us")->valuedouble;
      double alg = cJSON_GetObjectItem(m, "algbw_gbs")->valuedouble;
      double bus = cJSON_GetObjectItem(m, "busbw_gbs")->valuedouble;
      assert_true(t > 0);
      assert_true(fabs(alg - bytes / (t * 1e-6) / 1e9) <= 1e-6 * alg);
      assert_true(fabs(bus - alg * 0.5) <= 1e-9 + 1e-9 * bus);
      assert_int_equal(cJSON_GetObjectItem(m, "wrong")->valueint, 0);
      sum += bus;
    }
    bytes *= 2;
  }
  assert_true(fabs(cJSON_GetObjectItem(o, "avg_busbw_gbs")->valuedouble - sum / 20) <= 1e-9 * sum);
  cJSON_Delete(o);
  snprintf(cmd, sizeof cmd, "%s/vramlab bench allgather --dtype nf4 > %s 2>&1", VRAMLAB_BINARY_DIR, log);
  st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  text = slurp_text(log);
  assert_non_null(strstr(text, "--dtype nf4"));
  free(text);
}

/* #22.12: --min-bytes nan went through (size_t)NaN (undefined; the message said
 * 9223372036854775808), and a bad --json path was found only after the whole benchmark
 * (--json DIR made its temporary file beside DIR first). Each is refused before any rank
 * starts, naming the option and the path. */
static void test_collbench_bad_args(void **state) {
  char missing[300], log[300], cmd[1400];
  tu_join(missing, sizeof missing, tu_tmp, "no/such/folder/x.json");
  tu_join(log, sizeof log, tu_tmp, "bad.txt");
  struct { const char *opt, *val, *want; } cases[] = {
      {"--min-bytes", "nan", "--min-bytes nan: a size >= 1 byte"},
      {"--json", tu_tmp, "is a folder, not a file name"},
      {"--json", missing, "its folder " },
      {"--json", "/proc/vramlab-test.json", "cannot write in /proc"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(cmd, sizeof cmd, "%s/vramlab bench allreduce --max-bytes 64 --iters 1 --warmup 0 %s '%s' > %s 2>&1",
             VRAMLAB_BINARY_DIR, cases[i].opt, cases[i].val, log);
    int st = system(cmd);
    char *text = slurp_text(log);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || !strstr(text, cases[i].want) ||
        !strstr(text, cases[i].opt) || strstr(text, "# Using devices")) {
      print_error("%s: status %d, expected 2, '%s' and no benchmark; output:\n%s\n", cmd, st,
                  cases[i].want, text);
      fail();
    }
    free(text);
  }
  struct stat sb;
  assert_int_equal(stat(missing, &sb), -1);
}

/* The live (not zombie) processes whose command line holds marker, but not `except`, into
 * pids (at most max): the job's mpirun and ranks carry the bench's arguments. */
static int marked_procs(const char *marker, pid_t except, pid_t *pids, int max) {
  DIR *d = opendir("/proc");
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) && n < max;) {
    pid_t pid = (pid_t)atol(e->d_name);
    if (pid <= 0 || pid == except || pid == getpid() || gone(pid, 0)) continue;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < k; i++) buf[i] = buf[i] ? buf[i] : ' ';
    buf[k] = 0;
    if (strstr(buf, marker)) pids[n++] = pid;
  }
  closedir(d);
  return n;
}

/* #22.3: `bench allreduce` started in a child (its mpirun in a process group of its own, so
 * a terminal's Ctrl-C never reaches it); once both ranks run, the child gets sig. Within a
 * few seconds no process of the job is left: SIGTERM is forwarded to the job, and after a
 * SIGKILL (no handler runs) each rank sees its launcher gone and ends itself. */
static void launcher_killed(int sig, const char *name) {
  char json[300], log[300];
  tu_join(json, sizeof json, tu_tmp, name); /* unique on the job's command lines */
  tu_join(log, sizeof log, tu_tmp, "launcher.txt");
  tu_write_text(log, ""); /* there before the child writes it */
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    if (!freopen(log, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(127);
    execl(VRAMLAB_BINARY_DIR "/vramlab", "vramlab", "bench", "allreduce", "--min-bytes", "8", "--max-bytes", "8",
          "--iters", "2000000000", "--warmup", "0", "--json", json, (char *)NULL);
    _exit(127);
  }
  /* no assertion until the job's processes are killed: a failed test leaves no ranks spinning */
  pid_t job[8];
  int started = 0, n = 0;
  for (double t0 = vl_now(); !started && vl_now() - t0 < 60; usleep(100 * 1000)) {
    char *text = slurp_text(log); /* rank 0 in its loop, mpirun and both ranks seen */
    started = strstr(text, "# Using devices") && marked_procs(name, child, job, 8) >= 3;
    free(text);
  }
  kill(child, sig);
  int st;
  waitpid(child, &st, 0);
  double t0 = vl_now();
  while ((n = marked_procs(name, child, job, 8)) > 0 && vl_now() - t0 < 10) usleep(100 * 1000);
  for (int i = 0; i < n; i++) kill(job[i], SIGKILL);
  if (!started || n) {
    print_error("%s; %d process(es) of the job alive 10 s after the launcher got signal %d\n",
                started ? "the job ran" : "the job did not start within 60 s", n, sig);
    fail();
  }
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == sig); /* the launcher then died of it */
}

static void test_job_ends_with_launcher(void **state) {
  launcher_killed(SIGTERM, "term-job.json");
  launcher_killed(SIGKILL, "kill-job.json");
}

static void test_killed_rank(void **state) {
  fault_job("--die", "die.txt", "rank 1");
}
static void test_failed_rank(void **state) {
  fault_job("--fail", "fail.txt", "vramlab: rank 1 of 2: injected failure before an allreduce");
}
#endif

static int setup(void **state) {
  if (tu_tmpdir(tu_tmp, sizeof tu_tmp, "vl_dist")) return -1;
  return tu_cpu_setup(state);
}
static int teardown(void **state) {
  tu_tmp_teardown(state);
  return tu_cpu_teardown(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_busbw_factor),     cmocka_unit_test(test_device_of),
      cmocka_unit_test(test_nccl_codes),       cmocka_unit_test(test_nccl_stream_plan),
      cmocka_unit_test(test_self),             cmocka_unit_test(test_timeout_env),
      cmocka_unit_test(test_self_abort),       cmocka_unit_test(test_nccl_unsupported),
      cmocka_unit_test(test_self_exe_cores),   cmocka_unit_test(test_mpirun_errors),
      cmocka_unit_test(test_mpirun_out_link_not_followed),
#ifdef VRAMLAB_HAVE_MPI
      cmocka_unit_test(test_mpirun_runs),      cmocka_unit_test(test_mpirun_timeout),
      cmocka_unit_test(test_killed_rank),      cmocka_unit_test(test_failed_rank),
      cmocka_unit_test(test_collbench),        cmocka_unit_test(test_collbench_bad_args),
      cmocka_unit_test(test_job_ends_with_launcher),
#endif
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
