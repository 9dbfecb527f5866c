/* libvlmemcount.so (tools/memcount/memcount.c), the malloc-counting preload library of the
 * PyTorch peers: this executable re-runs itself as a child with the library preloaded; the
 * child makes known allocations with every wrapped function (and from two threads at once)
 * and prints what the counters moved by next to what the allocations hold
 * (malloc_usable_size); the parent checks them equal, exactly. Also: a library loaded but
 * not preloaded sees no calls (how a peer knows its memory is not counted), and the counts
 * written at exit (VL_MEMCOUNT_OUT). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define CHILD_ARG "--memcount-child"

/* ---- the child: known allocations, results printed at the end (printf allocates) ---------- */
typedef int64_t (*i64_fn)(void);
typedef uint64_t (*u64_fn)(void);
typedef void (*void_fn)(void);
static i64_fn mc_live, mc_peak;
static u64_fn mc_calls;
static void_fn mc_reset;

enum { MAX_ROWS = 64 };
typedef struct { const char *name; long long got, want; } check_row;
static check_row rows[MAX_ROWS];
static int n_rows;
static void row(const char *name, long long got, long long want) {
  if (n_rows < MAX_ROWS) rows[n_rows++] = (check_row){name, got, want};
}

static long long usable(void *p) { return (long long)malloc_usable_size(p); }

/* Each wrapped function: the live count moves by the block's usable size, and back. */
static void child_functions(void) {
  long long l0 = mc_live();
  void *volatile p = malloc(1000);
  row("malloc", mc_live() - l0, usable(p));
  row("malloc_at_least_asked", usable(p) >= 1000, 1);
  free(p);
  row("malloc_free", mc_live() - l0, 0);
  p = calloc(100, 40);
  row("calloc", mc_live() - l0, usable(p));
  free(p);
  p = malloc(100);
  long long small = usable(p);
  void *q = realloc(p, 100000); /* grows: the old block goes, the new one counts */
  row("realloc_grow", mc_live() - l0, usable(q));
  row("realloc_grew", usable(q) > small, 1);
  q = realloc(q, 0); /* glibc frees */
  row("realloc_zero_frees", mc_live() - l0, 0);
  p = reallocarray(NULL, 300, 7);
  row("reallocarray", mc_live() - l0, usable(p));
  free(p);
  void *a = NULL;
  int r = posix_memalign(&a, 4096, 70000);
  row("posix_memalign_ok", r, 0);
  row("posix_memalign", mc_live() - l0, usable(a));
  row("posix_memalign_aligned", (long long)((uintptr_t)a % 4096), 0);
  free(a);
  a = aligned_alloc(64, 6400);
  row("aligned_alloc", mc_live() - l0, usable(a));
  free(a);
  a = memalign(256, 1000);
  row("memalign", mc_live() - l0, usable(a));
  free(a);
  a = valloc(5000);
  row("valloc", mc_live() - l0, usable(a));
  free(a);
  row("all_freed", mc_live() - l0, 0);
}

/* The peak: reset to live, one large block (mmap'd by glibc) raises it by its size, freeing
 * it lowers live but not the peak, a reset brings the peak down to live. */
static void child_peak(void) {
  mc_reset();
  long long l = mc_live();
  row("reset_peak_is_live", mc_peak(), l);
  void *big = malloc(8u << 20);
  long long ub = usable(big);
  row("peak_big", mc_peak() - l, ub);
  row("big_at_least_asked", ub >= (8LL << 20), 1);
  free(big);
  row("big_freed", mc_live(), l);
  row("peak_kept", mc_peak() - l, ub);
  mc_reset();
  row("peak_reset", mc_peak(), l);
}

/* Two threads allocate and free at once, keeping 100 blocks each: between barriers the live
 * count moves by exactly the kept blocks, whatever the interleaving. */
enum { KEEP = 100, CHURN = 20000 };
static pthread_barrier_t bar;
typedef struct { unsigned seed; long long kept; void *blocks[KEEP]; } worker;

static void *work(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(&bar); /* A: main has read live; counted from here */
  for (int i = 0; i < CHURN; i++) {
    void *volatile p = malloc(1 + rand_r(&w->seed) % 5000); /* volatile: kept from being elided */
    free(p);
  }
  for (int i = 0; i < KEEP; i++) {
    w->blocks[i] = malloc(1 + rand_r(&w->seed) % 3000);
    w->kept += usable(w->blocks[i]);
  }
  pthread_barrier_wait(&bar); /* B: main reads live */
  pthread_barrier_wait(&bar); /* C: free the kept blocks */
  for (int i = 0; i < KEEP; i++) free(w->blocks[i]);
  pthread_barrier_wait(&bar); /* D: main reads live again */
  return NULL;
}

static void child_threads(void) {
  pthread_barrier_init(&bar, NULL, 3);
  worker w[2] = {{.seed = 1}, {.seed = 2}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, work, &w[i]);
  long long la = mc_live(); /* the workers allocate nothing before A */
  pthread_barrier_wait(&bar);
  pthread_barrier_wait(&bar);
  long long lb = mc_live();
  pthread_barrier_wait(&bar);
  pthread_barrier_wait(&bar);
  long long ld = mc_live();
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  row("threads_kept", lb - la, w[0].kept + w[1].kept);
  row("threads_freed", ld - la, 0);
  pthread_barrier_destroy(&bar);
}

/* Who mode (VL_MEMCOUNT_WHO=1): the sites of known blocks at the base, the peak and now, from
 * the library's own dump (VL_WHO_DUMP names its file). A block is an op's ("opA") until it is
 * marked a tensor; one marked after a peak it was live at moves at the peak too; one made
 * after the peak does not. */
typedef void (*who_op_fn)(const char *);
typedef void (*who_tensor_fn)(const void *, const char *);
typedef int (*who_dump_fn)(const char *);

static long long dump_site(const char *path, const char *cls, const char *op, int col) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[512];
  long long v[3] = {0, 0, 0}, found = 0;
  if (!fgets(line, sizeof line, f)) { /* the header */
    fclose(f);
    return -1;
  }
  while (fgets(line, sizeof line, f)) {
    char c[64], o[128];
    long long b, p, n;
    if (sscanf(line, "%63[^\t]\t%127[^\t]\t%lld\t%lld\t%lld", c, o, &b, &p, &n) == 5 && !strcmp(c, cls) &&
        !strcmp(o, op)) {
      v[0] = b, v[1] = p, v[2] = n;
      found = 1;
    }
  }
  fclose(f);
  return found ? v[col] : 0;
}

static void child_who(const char *path) {
  who_op_fn op = (who_op_fn)dlsym(RTLD_DEFAULT, "vl_memcount_who_op");
  who_tensor_fn tensor = (who_tensor_fn)dlsym(RTLD_DEFAULT, "vl_memcount_who_tensor");
  void_fn base = (void_fn)dlsym(RTLD_DEFAULT, "vl_memcount_who_base");
  who_dump_fn dump = (who_dump_fn)dlsym(RTLD_DEFAULT, "vl_memcount_who_dump");
  if (!op || !tensor || !base || !dump) {
    row("who_symbols", 0, 1);
    return;
  }
  base();
  op("opA");
  void *volatile p = malloc(100000);
  void *volatile s = malloc(100);
  op(NULL);
  void *volatile t = malloc(200000); /* the peak: p, s and t live */
  tensor(t, "opB");
  long long up = usable(p), us = usable(s), ut = usable(t);
  free(p);
  free(s);
  void *volatile u = malloc(50000); /* below the peak */
  tensor(u, "opC");
  long long uu = usable(u);
  row("who_dump", dump(path), 0);
  row("who_opA_peak", dump_site(path, "other", "opA", 1), up);
  row("who_opA_now", dump_site(path, "other", "opA", 2), 0);
  row("who_small_peak", dump_site(path, "small", "opA", 1), us);
  row("who_tensor_at_peak", dump_site(path, "tensor", "opB", 1), ut);
  row("who_tensor_now", dump_site(path, "tensor", "opB", 2), ut);
  row("who_unmarked_at_peak", dump_site(path, "other", "-", 1), 0);
  row("who_after_peak", dump_site(path, "tensor", "opC", 1), 0);
  row("who_after_now", dump_site(path, "tensor", "opC", 2), uu);
  free(t);
  free(u);
}

static int child_main(void) {
  alarm(60); /* never a hang */
  const char *who_path = getenv("VL_WHO_DUMP");
  if (who_path) {
    child_who(who_path);
    for (int i = 0; i < n_rows; i++) printf("%s %lld %lld\n", rows[i].name, rows[i].got, rows[i].want);
    printf("end %d\n", n_rows);
    return 0;
  }
  mc_live = (i64_fn)dlsym(RTLD_DEFAULT, "vl_memcount_live");
  mc_peak = (i64_fn)dlsym(RTLD_DEFAULT, "vl_memcount_peak");
  mc_calls = (u64_fn)dlsym(RTLD_DEFAULT, "vl_memcount_calls");
  mc_reset = (void_fn)dlsym(RTLD_DEFAULT, "vl_memcount_reset_peak");
  if (!mc_live || !mc_peak || !mc_calls || !mc_reset) {
    printf("not-preloaded\n");
    return 0;
  }
  child_functions();
  child_peak();
  child_threads();
  row("calls_seen", mc_calls() > 0, 1);
  for (int i = 0; i < n_rows; i++) printf("%s %lld %lld\n", rows[i].name, rows[i].got, rows[i].want);
  printf("end %d\n", n_rows);
  return 0;
}

/* ---- the parent ------------------------------------------------------------------------------ */
#ifdef VRAMLAB_MEMCOUNT_LIB
extern char **environ;

/* Runs this executable as the child with `extra` added to the environment; its stdout into
 * out. Returns its exit status (-1: killed or not run). */
static int run_child(const char *const *extra, int n_extra, char *out, size_t n) {
  int fd[2];
  if (pipe(fd)) return -1;
  int ne = 0;
  while (environ[ne]) ne++;
  char **envp = calloc((size_t)(ne + n_extra + 1), sizeof *envp);
  if (!envp) return -1;
  int k = 0;
  for (int i = 0; i < ne; i++) envp[k++] = environ[i];
  for (int i = 0; i < n_extra; i++) envp[k++] = (char *)extra[i];
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    char *argv[] = {"test_memcount", CHILD_ARG, NULL};
    execve("/proc/self/exe", argv, envp);
    _exit(127);
  }
  free(envp);
  close(fd[1]);
  size_t got = 0;
  ssize_t r;
  while ((r = read(fd[0], out + got, n - 1 - got)) > 0) got += (size_t)r;
  out[got] = 0;
  close(fd[0]);
  int st;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

/* The child's "name got want" rows, each equal; n of them. */
static void check_rows(char *out, int want_rows) {
  int n = 0, end = -1;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    char name[64];
    long long got, want;
    if (sscanf(line, "end %d", &end) == 1) continue;
    if (sscanf(line, "%63s %lld %lld", name, &got, &want) != 3) fail_msg("unexpected child line: %s", line);
    if (got != want) fail_msg("%s: counted %lld, expected %lld", name, got, want);
    n++;
  }
  assert_int_equal(end, n);
  assert_int_equal(n, want_rows); /* every check ran (a child that stops early fails here) */
}

static void test_preloaded_counts_exactly(void **state) {
  (void)state;
  static char out[1 << 16];
  const char *env[] = {"LD_PRELOAD=" VRAMLAB_MEMCOUNT_LIB};
  assert_int_equal(run_child(env, 1, out, sizeof out), 0);
  check_rows(out, 24);
}

/* Who mode: each known block at its site, at the peak and now (child_who). */
static void test_who_sites(void **state) {
  (void)state;
  static char out[1 << 16];
  char path[64], envv[96];
  snprintf(path, sizeof path, "/tmp/vramlab-memcount-who-%d.tsv", (int)getpid());
  snprintf(envv, sizeof envv, "VL_WHO_DUMP=%s", path);
  const char *env[] = {"LD_PRELOAD=" VRAMLAB_MEMCOUNT_LIB, "VL_MEMCOUNT_WHO=1", envv};
  assert_int_equal(run_child(env, 3, out, sizeof out), 0);
  unlink(path);
  check_rows(out, 9);
}

/* Off (no VL_MEMCOUNT_WHO): the who functions do nothing and the dump says so. */
static void test_who_off(void **state) {
  (void)state;
  static char out[1 << 16];
  char path[64], envv[96];
  snprintf(path, sizeof path, "/tmp/vramlab-memcount-whooff-%d.tsv", (int)getpid());
  snprintf(envv, sizeof envv, "VL_WHO_DUMP=%s", path);
  const char *env[] = {"LD_PRELOAD=" VRAMLAB_MEMCOUNT_LIB, envv};
  assert_int_equal(run_child(env, 2, out, sizeof out), 0);
  assert_non_null(strstr(out, "who_dump -1 0"));
  assert_int_equal(access(path, F_OK), -1);
}

/* Loaded but not preloaded: the program's allocations go to libc, the library sees none. */
static void test_dlopen_sees_no_calls(void **state) {
  (void)state;
  void *h = dlopen(VRAMLAB_MEMCOUNT_LIB, RTLD_NOW | RTLD_LOCAL);
  assert_non_null(h);
  u64_fn calls = (u64_fn)dlsym(h, "vl_memcount_calls");
  assert_non_null(calls);
  free(malloc(12345));
  assert_int_equal(calls(), 0);
  dlclose(h);
}

/* VL_MEMCOUNT_OUT: peak, live and calls at exit. The last peak reset comes before the two
 * threads' kept blocks (200 of 1..3000 bytes: over 100 kB in all), freed before the end. */
static void test_exit_file(void **state) {
  (void)state;
  char path[64], envv[96], out[1 << 16];
  snprintf(path, sizeof path, "/tmp/vramlab-memcount-%d.txt", (int)getpid());
  snprintf(envv, sizeof envv, "VL_MEMCOUNT_OUT=%s", path);
  const char *env[] = {"LD_PRELOAD=" VRAMLAB_MEMCOUNT_LIB, envv};
  assert_int_equal(run_child(env, 2, out, sizeof out), 0);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  long long peak = -1, live = -1;
  unsigned long long calls = 0;
  assert_int_equal(fscanf(f, "%lld %lld %llu", &peak, &live, &calls), 3);
  fclose(f);
  unlink(path);
  assert_true(calls > 0);
  assert_true(live >= 0);
  assert_true(peak >= live + 100000);
}
/* A link planted at VL_MEMCOUNT_OUT is not written through: its target keeps its bytes. */
static void test_exit_file_link_refused(void **state) {
  (void)state;
  char path[64], victim[64], envv[96], out[1 << 16];
  snprintf(path, sizeof path, "/tmp/vramlab-memcount-link-%d.txt", (int)getpid());
  snprintf(victim, sizeof victim, "/tmp/vramlab-memcount-victim-%d.txt", (int)getpid());
  FILE *f = fopen(victim, "w");
  assert_non_null(f);
  fputs("precious\n", f);
  fclose(f);
  unlink(path);
  assert_int_equal(symlink(victim, path), 0);
  snprintf(envv, sizeof envv, "VL_MEMCOUNT_OUT=%s", path);
  const char *env[] = {"LD_PRELOAD=" VRAMLAB_MEMCOUNT_LIB, envv};
  assert_int_equal(run_child(env, 2, out, sizeof out), 0);
  char back[64] = "";
  f = fopen(victim, "r");
  assert_non_null(f);
  assert_non_null(fgets(back, sizeof back, f));
  fclose(f);
  unlink(path);
  unlink(victim);
  assert_string_equal(back, "precious\n");
}
#else
static void skipped(void **state) {
  (void)state;
  printf("skipped: libvlmemcount.so is not built in this configuration (sanitizers or fuzzer)\n");
  skip();
}
#endif

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], CHILD_ARG)) return child_main();
#ifdef VRAMLAB_MEMCOUNT_LIB
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_preloaded_counts_exactly),
      cmocka_unit_test(test_who_sites),
      cmocka_unit_test(test_who_off),
      cmocka_unit_test(test_dlopen_sees_no_calls),
      cmocka_unit_test(test_exit_file),
      cmocka_unit_test(test_exit_file_link_refused),
  };
#else
  const struct CMUnitTest tests[] = {cmocka_unit_test(skipped)};
#endif
  return cmocka_run_group_tests(tests, NULL, NULL);
}
