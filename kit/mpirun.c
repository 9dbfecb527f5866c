/* Starting ranks (mpirun.h): mpirun found at $VRAMLAB_MPIRUN, the path CMake saw, or on PATH,
 * started with fork/exec (no shell) in a process group of its own, with what Open MPI needs
 * here (root permission, no CMA single-copy, --oversubscribe when asked, no core binding so
 * ranks share the machine with whatever else runs), the threads of every rank, the job's
 * output into a file or passed through, and a wall-clock limit: past it the whole group gets
 * SIGTERM (mpirun then ends its ranks), SIGKILL 5 s later, and the status is 124. The job
 * ends with its launcher: SIGTERM, SIGINT or SIGHUP to the launcher ends the group the same
 * way before the launcher acts on the signal (mpirun's own group never sees a terminal's
 * Ctrl-C), and every rank that calls vl_mpirun_watch_launcher ends itself when the launcher
 * (its PID in VRAMLAB_PARENT_PID) or its own parent is gone (a SIGKILL reaches no handler). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "interrupt.h"
#include "mpirun.h"
#include "vramlab/fileio.h"
#include "parse.h"

#define MPIRUN_INSTALL "apt-get install libopenmpi-dev openmpi-bin"
#define MAX_ARGS 256

int vl_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int vl_self_exe(char *buf, size_t n) {
  if (!buf || n < 2) return -1;
  ssize_t k = readlink("/proc/self/exe", buf, n - 1);
  if (k <= 0 || (size_t)k >= n - 1) return -1;
  buf[k] = 0;
  return 0;
}

static bool executable(const char *p) {
  struct stat s;
  return p && *p && stat(p, &s) == 0 && S_ISREG(s.st_mode) && access(p, X_OK) == 0;
}

/* mpirun's path into buf: $VRAMLAB_MPIRUN when set (and nothing else then), CMake's, else
 * the first on PATH. */
static int find_mpirun(char *buf, size_t n) {
  const char *env = getenv("VRAMLAB_MPIRUN");
  if (env && *env) {
    snprintf(buf, n, "%s", env);
    return executable(env) ? 0 : -1;
  }
#ifdef VRAMLAB_MPIRUN
  if (executable(VRAMLAB_MPIRUN)) {
    snprintf(buf, n, "%s", VRAMLAB_MPIRUN);
    return 0;
  }
#endif
  const char *path = getenv("PATH");
  if (!path) return -1;
  const char *p = path;
  while (*p) {
    const char *e = strchr(p, ':');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len > 0 && len < n - 8) {
      snprintf(buf, n, "%.*s/mpirun", (int)len, p);
      if (executable(buf)) return 0;
    }
    p += len + (e ? 1 : 0);
  }
  return -1;
}

/* ---- the job ends with its launcher ------------------------------------------------------ */

#define LAUNCHER_ENV "VRAMLAB_PARENT_PID"

/* The signals that end a job: a launcher's own handler (vl_interrupt's, or none: the default
 * action) runs only after the job is gone. One ignored when the job starts (nohup) stays so. */
static const int job_signals[] = {SIGTERM, SIGINT, SIGHUP};
#define N_JOB_SIGNALS (int)(sizeof job_signals / sizeof *job_signals)
static volatile sig_atomic_t job_signal, job_signal_count;

static void on_job_signal(int sig) {
  job_signal = sig;
  job_signal_count++;
}

static void catch_job_signals(struct sigaction old[N_JOB_SIGNALS]) {
  job_signal = job_signal_count = 0;
  struct sigaction sa = {0};
  sa.sa_handler = on_job_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < N_JOB_SIGNALS; i++) {
    sigaction(job_signals[i], NULL, &old[i]);
    if (old[i].sa_handler != SIG_IGN) sigaction(job_signals[i], &sa, NULL);
  }
}

static void restore_job_signals(const struct sigaction old[N_JOB_SIGNALS]) {
  for (int i = 0; i < N_JOB_SIGNALS; i++) sigaction(job_signals[i], &old[i], NULL);
}

/* The start time of process pid (field 22 of /proc/PID/stat, clock ticks since boot): a PID
 * used again by a later process has another; 0 when pid is gone or a zombie. */
static unsigned long long proc_start(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t k = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (k <= 0) return 0;
  buf[k] = 0;
  char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X') return 0;
  for (int field = 2; field < 22 && p; field++) p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

static pid_t watched_launcher, watched_parent;
static unsigned long long watched_start;

static void *watch_launcher(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
    const char *gone = proc_start(watched_launcher) != watched_start ? "the vramlab process that started the job"
                       : getppid() != watched_parent                 ? "this rank's parent (mpirun)"
                                                                     : NULL;
    if (gone) { /* write(2), not stdio: the rank's main thread may hold stderr's lock */
      char msg[160];
      int k = snprintf(msg, sizeof msg, "vramlab: rank (pid %d): %s is gone: ending this rank\n", (int)getpid(), gone);
      if (k > 0 && write(STDERR_FILENO, msg, (size_t)k < sizeof msg ? (size_t)k : sizeof msg - 1) < 0) {}
      _exit(VL_EXIT_INTERRUPTED);
    }
  }
  return NULL;
}

int vl_mpirun_watch_launcher(void) {
  const char *v = getenv(LAUNCHER_ENV);
  int64_t pid;
  if (!v || vl_parse_i64(v, 1, INT_MAX, &pid) != VL_PARSE_OK) return 0; /* not started by vl_mpirun */
  watched_launcher = (pid_t)pid;
  watched_parent = getppid();
  watched_start = proc_start(watched_launcher);
  if (!watched_start) {
    fprintf(stderr, "vramlab: rank (pid %d): the vramlab process that started the job is gone\n", (int)getpid());
    return -1;
  }
  pthread_t t;
  if (pthread_create(&t, NULL, watch_launcher, NULL) != 0) return -1;
  pthread_detach(t);
  return 0;
}

/* ---- starting and waiting ------------------------------------------------------------------ */

/* The child: the signals as the launcher had them, own process group, environment, output,
 * then exec; on failure errno goes to the parent through the close-on-exec pipe. */
static void child(const vl_mpirun_opts *o, char *const argv[], int out_fd, int fd_err,
                  const struct sigaction old[N_JOB_SIGNALS]) {
  restore_job_signals(old);
  setpgid(0, 0);
  char launcher[24];
  snprintf(launcher, sizeof launcher, "%ld", (long)getppid());
  setenv(LAUNCHER_ENV, launcher, 1); /* mpirun hands its environment to the ranks */
  if (geteuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  const char *asan = getenv("ASAN_OPTIONS");
  if (asan && *asan && !strstr(asan, "fast_unwind_on_malloc")) {
    /* under the sanitizers (make asan): Open MPI has no frame pointers, so the fast unwinder
     * stops at its first frame and tests/lsan.supp cannot see Open MPI allocated a block */
    char *v = NULL;
    if (asprintf(&v, "%s:fast_unwind_on_malloc=0", asan) > 0) setenv("ASAN_OPTIONS", v, 1);
    free(v);
  }
  if (o->threads > 0) {
    char t[16];
    snprintf(t, sizeof t, "%d", o->threads);
    setenv("OMP_NUM_THREADS", t, 1);
    setenv("OPENBLAS_NUM_THREADS", t, 1);
  }
  if (out_fd >= 0 && (dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0)) goto fail;
  execv(argv[0], argv);
fail:;
  int e = errno;
  if (write(fd_err, &e, sizeof e) < 0) {}
  _exit(127);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Wait for pid until the deadline or until the launcher has had more than `signals` of
 * job_signals; 1 when it ended (*st filled), 0 otherwise. */
static int wait_until(pid_t pid, double deadline, sig_atomic_t signals, int *st) {
  for (;;) {
    pid_t w = waitpid(pid, st, WNOHANG);
    if (w == pid) return 1;
    if (w < 0 && errno != EINTR) {
      *st = 0;
      return 1;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec + now.tv_nsec * 1e-9 >= deadline || job_signal_count > signals) return 0;
    sleep_ms(20);
  }
}

static double mono(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

/* The job's process group: SIGTERM (mpirun then ends its ranks), SIGKILL 5 s later or at
 * one more signal to the launcher, then SIGKILL again for ranks mpirun left behind. */
static void end_job(pid_t pid, int *st) {
  sig_atomic_t signals = job_signal_count;
  kill(-pid, SIGTERM);
  if (!wait_until(pid, mono() + 5, signals, st)) {
    kill(-pid, SIGKILL);
    waitpid(pid, st, 0);
  }
  kill(-pid, SIGKILL);
}

/* argv of mpirun: the options, then cmd. */
static int build_argv(const vl_mpirun_opts *o, const char *mpirun, char *const cmd[], char **av,
                      char *np, size_t npn, vl_err *err) {
  int k = 0;
  snprintf(np, npn, "%d", o->np);
  av[k++] = (char *)mpirun;
  av[k++] = "-np";
  av[k++] = np;
  av[k++] = "--mca";
  av[k++] = "btl_vader_single_copy_mechanism";
  av[k++] = "none";
  av[k++] = "--bind-to";
  av[k++] = "none";
  if (o->oversubscribe) av[k++] = "--oversubscribe";
  if (o->threads > 0) {
    av[k++] = "-x";
    av[k++] = "OMP_NUM_THREADS";
    av[k++] = "-x";
    av[k++] = "OPENBLAS_NUM_THREADS";
  }
  for (int i = 0; cmd[i]; i++) {
    if (k >= MAX_ARGS - 1) {
      vl_err_set(err, VL_ERR_IO, "mpirun: more than %d arguments", MAX_ARGS - 16);
      return -1;
    }
    av[k++] = cmd[i];
  }
  av[k] = NULL;
  return 0;
}

static int check_opts(const vl_mpirun_opts *o, char *const cmd[], vl_err *err) {
  if (!o || !cmd || !cmd[0] || !cmd[0][0]) {
    vl_err_set(err, VL_ERR_INVALID, "mpirun: no command to run");
    return -1;
  }
  if (o->np < 1) {
    vl_err_set(err, VL_ERR_INVALID, "mpirun: %d ranks: need at least 1", o->np);
    return -1;
  }
  int cores = vl_cores();
  if (o->np > cores && !o->oversubscribe) {
    vl_err_set(err, VL_ERR_INVALID, "mpirun: %d ranks on %d cores: ask for oversubscription (--oversubscribe) "
                                    "to run more ranks than cores", o->np, cores);
    return -1;
  }
  if (o->timeout_s < 0) {
    vl_err_set(err, VL_ERR_INVALID, "mpirun: timeout %g s is negative", o->timeout_s);
    return -1;
  }
  return 0;
}

int vl_mpirun(const vl_mpirun_opts *o, char *const cmd[], vl_err *err) {
  if (check_opts(o, cmd, err)) return -1;
  char mpirun[4096], np[16];
  if (find_mpirun(mpirun, sizeof mpirun)) {
    const char *env = getenv("VRAMLAB_MPIRUN");
    if (env && *env)
      vl_err_set(err, VL_ERR_IO, "mpirun not found at VRAMLAB_MPIRUN=%s: %s", env, MPIRUN_INSTALL);
    else
      vl_err_set(err, VL_ERR_IO, "mpirun not found (Open MPI is not installed): %s", MPIRUN_INSTALL);
    return -1;
  }
  char *av[MAX_ARGS];
  if (build_argv(o, mpirun, cmd, av, np, sizeof np, err)) return -1;
  /* the job's output goes to a fresh file of ours, renamed to out_path when the job ends: a
   * link planted at out_path is replaced, never written through */
  char out_tmp[PATH_MAX];
  vl_err m;
  int out_fd = -1;
  if (o->out_path && vl_file_tmp_beside(o->out_path, out_tmp, sizeof out_tmp, &out_fd, &m)) {
    vl_err_set(err, VL_ERR_IO, "mpirun: the job's output: %s", m.msg);
    return -1;
  }
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC)) {
    vl_err_set(err, VL_ERR_IO, "mpirun: pipe: %s", strerror(errno));
    if (out_fd >= 0) close(out_fd), unlink(out_tmp);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  struct sigaction old[N_JOB_SIGNALS];
  catch_job_signals(old); /* before the fork: no signal between it and the wait is lost */
  pid_t pid = fork();
  if (pid < 0) {
    vl_err_set(err, VL_ERR_IO, "mpirun: fork: %s", strerror(errno));
    restore_job_signals(old);
    close(pfd[0]), close(pfd[1]);
    if (out_fd >= 0) close(out_fd), unlink(out_tmp);
    return -1;
  }
  if (pid == 0) {
    close(pfd[0]);
    child(o, av, out_fd, pfd[1], old);
  }
  setpgid(pid, pid); /* both sides set it: no race with the kill below */
  close(pfd[1]);
  int e = 0;
  ssize_t got;
  do got = read(pfd[0], &e, sizeof e); while (got < 0 && errno == EINTR);
  close(pfd[0]);
  if (got == (ssize_t)sizeof e) { /* exec (or the output's dup2) failed */
    int st;
    waitpid(pid, &st, 0);
    restore_job_signals(old);
    vl_err_set(err, VL_ERR_IO, "mpirun: could not start %s%s%s: %s", mpirun, o->out_path ? " into " : "",
               o->out_path ? o->out_path : "", strerror(e));
    if (out_fd >= 0) close(out_fd), unlink(out_tmp);
    return -1;
  }
  double limit = o->timeout_s > 0 ? o->timeout_s : 600;
  int st = 0;
  int ended = wait_until(pid, mono() + limit, 0, &st);
  int sig = job_signal;
  if (!ended) end_job(pid, &st);
  restore_job_signals(old);
  int rc;
  if (sig) {
    vl_err_set(err, VL_ERR_IO, "mpirun: the job was ended: this process got %s", strsignal(sig));
    rc = 128 + sig;
  } else if (!ended) {
    vl_err_set(err, VL_ERR_IO, "mpirun: the job ran past %g s and was killed", limit);
    rc = 124;
  } else {
    rc = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 255;
  }
  if (out_fd >= 0 && vl_file_tmp_commit(out_fd, out_tmp, o->out_path, &m) && rc == 0) {
    vl_err_set(err, VL_ERR_IO, "mpirun: the job's output: %s", m.msg);
    rc = -1;
  }
  /* the job is gone and its output kept; now the launcher's own handling of the signal (the
   * default action ends it, vl_interrupt's stops the run at its next step edge) */
  if (sig) raise(sig);
  return rc;
}
