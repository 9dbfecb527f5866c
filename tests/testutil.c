#define _GNU_SOURCE /* mkdtemp, nftw */
#include "testutil.h"

#include <string.h>

#include <cjson/cJSON.h>
#include "vramlab/ops.h"

#include <fcntl.h>
#include <ftw.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/kcommon.h"
#include "vramlab/backend.h"

void tu_randn(float *x, int64_t n, float scale, uint64_t seed) {
  vl_rng r;
  vl_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++) x[i] = scale * vl_rng_normal(&r);
}

double tu_max_rel_err(const float *a, const float *b, int64_t n, double atol, double rtol) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]) / (atol + rtol * fabs((double)b[i]));
    if (!(e <= worst)) worst = e; /* NaN wins */
  }
  return worst;
}

void tu_assert_close(const float *a, const float *b, int64_t n, double atol, double rtol,
                     const char *what) {
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= atol + rtol * fabs((double)b[i]))) {
      print_error("%s: element %lld: got %.9g, want %.9g (atol %g, rtol %g)\n", what,
                  (long long)i, a[i], b[i], atol, rtol);
      fail();
    }
  }
}

vl_ctx *tu_cpu;

int tu_cpu_setup(void **state) {
  (void)state;
  return vl_ctx_create(&tu_cpu, VL_DEV_CPU, VL_NO_CAP) == VL_OK ? 0 : -1;
}

int tu_cpu_teardown(void **state) {
  (void)state;
  vl_ctx_destroy(tu_cpu);
  tu_cpu = NULL;
  return 0;
}

/* ---- tensors and host arrays ------------------------------------------------------------ */

vl_tensor tu_tnew(vl_ctx *c, vl_dtype dt, int64_t n, const float *host) {
  vl_tensor t;
  assert_int_equal(vl_tensor_alloc(c, &t, dt, VL_MEM_TEMP, 1, &n), VL_OK);
  if (host) for (int64_t i = 0; i < n; i++) vl_st(t.data, (int)dt, i, host[i]);
  else assert_int_equal(vl_zero_run(c, &(vl_zero_args){.y = &t}), VL_OK);
  return t;
}

void tu_tget(const vl_tensor *t, float *host) {
  for (int64_t i = 0; i < t->n; i++) host[i] = vl_ld(t->data, (int)t->dtype, i);
}

void tu_tfree_n(vl_ctx *c, vl_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++) vl_tensor_free(c, ts[i]);
}

float *tu_randn_new(int64_t n, float scale, uint64_t seed) {
  float *x = malloc((size_t)n * sizeof *x);
  tu_randn(x, n, scale, seed);
  return x;
}

float *tu_zeros(int64_t n) { return calloc((size_t)n, sizeof(float)); }

float *tu_rounded(const float *x, int64_t n, vl_dtype dt) {
  float *y = malloc((size_t)n * sizeof *y);
  for (int64_t i = 0; i < n; i++) y[i] = vl_round_to((int)dt, x[i]);
  return y;
}

double tu_dot(const float *a, const float *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
  return s;
}

/* ---- gradient and storage-dtype checks -------------------------------------------------- */

void tu_fd_check(tu_loss_fn L, void *ctx, float *x, int64_t n, const float *an, float eps,
                 double tol, const char *what) {
  double amax = 0, worst = 0;
  for (int64_t i = 0; i < n; i++) {
    float x0 = x[i], xp = x0 + eps, xm = x0 - eps;
    x[i] = xp;
    double lp = L(ctx);
    x[i] = xm;
    double lm = L(ctx);
    x[i] = x0;
    double fd = (lp - lm) / ((double)xp - (double)xm);
    double err = fabs(fd - (double)an[i]), lim = tol * fmax(1.0, fabs((double)an[i]));
    if (!(err <= lim)) {
      print_error("%s[%lld]: analytic %.7g, finite difference %.7g\n", what, (long long)i, an[i],
                  fd);
      fail();
    }
    amax = fmax(amax, fabs((double)an[i]));
    worst = fmax(worst, err / lim);
  }
  assert_true(amax > 0.05); /* a vanishing gradient would pass vacuously */
  print_message("  fd %-18s n=%-3lld max|an|=%.3f worst err/tol=%.3f\n", what, (long long)n, amax,
                worst);
}

double tu_unit_roundoff(vl_dtype dt) {
  return dt == VL_BF16 ? 0x1p-8 : dt == VL_F16 ? 0x1p-11 : 0x1p-22; /* fp32: a few ulps */
}

void tu_assert_close_dt(const float *got, const float *ref, int64_t n, vl_dtype dt,
                        const char *what) {
  double u = tu_unit_roundoff(dt) * 1.0001;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)ref[i]);
    if (!(d <= u * fabs((double)ref[i]) + 1e-7)) {
      print_error("%s (%s) element %lld: got %.9g, want %.9g\n", what, vl_dtype_name(dt),
                  (long long)i, got[i], ref[i]);
      fail();
    }
  }
}

/* ---- files ------------------------------------------------------------------------------ */

int tu_tmpdir(char *buf, size_t n, const char *prefix) {
  if (snprintf(buf, n, "/tmp/%sXXXXXX", prefix) >= (int)n || !mkdtemp(buf)) {
    if (n) buf[0] = '\0';
    return -1;
  }
  return 0;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(p);
}

void tu_rmtree(const char *dir) {
  if (dir[0]) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char tu_tmp[256];

int tu_tmp_teardown(void **state) {
  (void)state;
  tu_rmtree(tu_tmp);
  tu_tmp[0] = '\0';
  return 0;
}

void tu_join(char *buf, size_t n, const char *dir, const char *name) {
  snprintf(buf, n, "%s/%s", dir, name);
}

size_t tu_slurp(const char *path, uint8_t **out) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *out = malloc((size_t)n + 1);
  assert_non_null(*out);
  assert_int_equal(fread(*out, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  return (size_t)n;
}

bool tu_same_file(const char *a, const char *b) {
  uint8_t *x, *y;
  size_t nx = tu_slurp(a, &x), ny = tu_slurp(b, &y);
  bool same = nx == ny && memcmp(x, y, nx) == 0;
  free(x);
  free(y);
  return same;
}

void tu_write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

void tu_write_text(const char *path, const char *text) { tu_write_bytes(path, text, strlen(text)); }

void tu_sparse_file(const char *path, uint64_t bytes) {
  unlink(path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
  close(fd);
}

/* ---- hangs, memory ------------------------------------------------------------------------ */

static char watchdog_msg[256];

static void watchdog_fire(int sig) {
  (void)sig;
  /* async-signal-safe: write and _exit only */
  ssize_t k = write(2, watchdog_msg, strlen(watchdog_msg));
  (void)k;
  _exit(124);
}

void tu_watchdog(unsigned seconds, const char *what) {
  alarm(0);
  if (!seconds) return;
  snprintf(watchdog_msg, sizeof watchdog_msg, "\nwatchdog: %s (still running after %u s)\n",
           what ? what : "a test hung", seconds);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = watchdog_fire;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, NULL);
  alarm(seconds);
}

long tu_peak_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

uint64_t tu_hash(const void *p, size_t n, uint64_t h) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

void tu_image_free(vl_image *im) {
  free(im->pix);
  free(im->mask);
  memset(im, 0, sizeof *im);
}

/* ---- progress callbacks ----------------------------------------------------------------- */

void tu_on_progress(int64_t done, int64_t total, void *user) {
  tu_progress *p = user;
  if (done < p->last) p->backwards++;
  p->calls++;
  p->last = done;
  p->total = total;
}

void tu_assert_progress_done(const tu_progress *p, int64_t n) {
  assert_int_equal(p->total, n);
  assert_int_equal(p->last, n);
  assert_true(p->calls >= 1);
  assert_int_equal(p->backwards, 0);
}

int tu_count_entries(const char *dir) {
  DIR *dp = opendir(dir);
  assert_non_null(dp);
  int n = 0;
  for (struct dirent *e; (e = readdir(dp));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(dp);
  return n;
}

/* Per-operation profile of one step on the CPU (c) and planned (p): every op in `must` ran;
 * both ran the same ops the same number of times; the profile's FLOPs and bytes add up to
 * the context's counters (model and recompute FLOPs together). */
void tu_check_profile(vl_ctx *c, vl_ctx *p, const vl_op *must, int n_must) {
  const vl_op_profile *pc = vl_ctx_profile(c), *pp = vl_ctx_profile(p);
  double f = 0, b = 0;
  for (int op = 0; op < VL_OP_COUNT; op++) {
    if (pc[op].calls != pp[op].calls) {
      print_error("%s: %llu calls on cpu, %llu planned\n", vl_op_name((vl_op)op),
                  (unsigned long long)pc[op].calls, (unsigned long long)pp[op].calls);
      fail();
    }
    assert_true(pc[op].seconds >= 0 && (pc[op].calls > 0 || pc[op].flops == 0));
    assert_true(pc[op].flops == pp[op].flops);
    f += pc[op].flops;
    b += pc[op].bytes;
  }
  for (int i = 0; i < n_must; i++)
    if (pc[must[i]].calls == 0) {
      print_error("%s did not run\n", vl_op_name(must[i]));
      fail();
    }
  assert_true(fabs(f - (c->flops + c->flops_recompute)) <= 1e-12 * f && f > 0);
  assert_true(fabs(b - c->bytes_moved) <= 1e-12 * b);
}

/* The damage helpers: a file of their own, compiled here because the CMake rule builds
 * each test from its tests/test_*.c and tests/testutil.c only. */
#include "damage.c"

void tu_strip_timings(struct cJSON *o) {
  cJSON *e = o ? o->child : NULL;
  while (e) {
    cJSON *next = e->next;
    size_t n = e->string ? strlen(e->string) : 0;
    if (n >= 7 && !strcmp(e->string + n - 7, "seconds"))
      cJSON_Delete(cJSON_DetachItemViaPointer(o, e));
    else if (cJSON_IsObject(e))
      tu_strip_timings(e);
    e = next;
  }
}
