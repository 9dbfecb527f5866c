/* Shared helpers for the cmocka tests. */
#ifndef VRAMLAB_TESTUTIL_H
#define VRAMLAB_TESTUTIL_H
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "vramlab/core.h"
#include "vramlab/data.h"
#include "vramlab/ops.h"

/* Fill with seeded N(0, scale^2) values. */
void tu_randn(float *x, int64_t n, float scale, uint64_t seed);
/* Max of |a-b| / (atol + rtol*|b|); <= 1 means within tolerance. */
double tu_max_rel_err(const float *a, const float *b, int64_t n, double atol, double rtol);
/* Assert |a-b| <= atol + rtol*|b| elementwise, printing the first failure. */
void tu_assert_close(const float *a, const float *b, int64_t n, double atol, double rtol,
                     const char *what);
/* A CPU context shared by a test group: pass tu_cpu_setup/tu_cpu_teardown to
 * cmocka_run_group_tests. */
extern vl_ctx *tu_cpu;
int tu_cpu_setup(void **state);
int tu_cpu_teardown(void **state);

/* ---- tensors and host arrays (CPU contexts: tensor data is host memory) -------------- */

/* A 1-D VL_MEM_TEMP tensor of n elements of dtype dt on c holding host (each value stored
 * with the dtype's rounding), or zeros when host is NULL. */
vl_tensor tu_tnew(vl_ctx *c, vl_dtype dt, int64_t n, const float *host);
/* Every element of t, loaded as float, into host[0 .. t->n). */
void tu_tget(const vl_tensor *t, float *host);
/* Frees n tensors of c in order; TU_TFREE(c, &a, &b, ...) lists them. */
void tu_tfree_n(vl_ctx *c, vl_tensor *const *ts, int n);
#define TU_TFREE(c, ...)                                                                   \
  tu_tfree_n((c), (vl_tensor *const[]){__VA_ARGS__},                                       \
             (int)(sizeof((vl_tensor *const[]){__VA_ARGS__}) / sizeof(vl_tensor *)))
/* malloc'd arrays (the caller frees): tu_randn values, zeros, x rounded to dtype dt. */
float *tu_randn_new(int64_t n, float scale, uint64_t seed);
float *tu_zeros(int64_t n);
float *tu_rounded(const float *x, int64_t n, vl_dtype dt);
/* sum(a[i] * b[i]) accumulated in double. */
double tu_dot(const float *a, const float *b, int64_t n);

/* ---- gradient and storage-dtype checks ------------------------------------------------ */

typedef double (*tu_loss_fn)(void *ctx);
/* Central differences of L(ctx) with respect to each x[i] (steps x[i] +- eps, divided by
 * the step actually taken), against the analytic gradient an: fails unless
 * |fd - an| <= tol * max(1, |an|) for every i, and unless max |an| > 0.05 (a vanishing
 * gradient would pass vacuously). x is restored. */
void tu_fd_check(tu_loss_fn L, void *ctx, float *x, int64_t n, const float *an, float eps,
                 double tol, const char *what);
/* The unit roundoff of a storage dtype: 2^-8 bf16, 2^-11 fp16, 2^-22 (a few ulps) fp32. */
double tu_unit_roundoff(vl_dtype dt);
/* Assert |got - ref| <= 1.0001 u |ref| + 1e-7 elementwise, u = tu_unit_roundoff(dt): an op
 * computing in fp32 and storing in dt, against the fp32 op on the rounded inputs. */
void tu_assert_close_dt(const float *got, const float *ref, int64_t n, vl_dtype dt,
                        const char *what);

/* ---- operation profile -------------------------------------------------------------------- */

/* Per-operation profile of one step on the CPU (c) and planned (p): every op in `must` (an
 * array) ran; both ran the same ops the same number of times; the profile's FLOPs
 * and bytes add up to the context's counters (model and recompute FLOPs together). */
void tu_check_profile(vl_ctx *c, vl_ctx *p, const vl_op *must, int n_must);

/* ---- files ------------------------------------------------------------------------------ */

/* Creates a fresh directory /tmp/<prefix>XXXXXX into buf (n >= strlen(prefix) + 12);
 * 0, or -1 (buf[0] == 0) on failure. Setup-time: no cmocka asserts. */
int tu_tmpdir(char *buf, size_t n, const char *prefix);
/* Removes dir and everything below it (no-op for ""). */
void tu_rmtree(const char *dir);
/* A temporary directory shared by a test group: its setup makes it with
 * tu_tmpdir(tu_tmp, sizeof tu_tmp, prefix); pass tu_tmp_teardown to cmocka_run_group_tests
 * to remove it. */
extern char tu_tmp[256];
int tu_tmp_teardown(void **state);
/* dir/name into buf. */
void tu_join(char *buf, size_t n, const char *dir, const char *name);
/* The whole file into *out (malloc'd, one spare byte); its size. Asserts it is readable. */
size_t tu_slurp(const char *path, uint8_t **out);
/* Entries of a directory, without "." and "..". Asserts it can be opened. */
int tu_count_entries(const char *dir);
/* Whether two files have the same bytes. */
bool tu_same_file(const char *a, const char *b);
/* Writes (replaces) a file, asserting every byte is written. */
void tu_write_bytes(const char *path, const void *data, size_t n);
void tu_write_text(const char *path, const char *text);

/* A sparse file of `bytes` bytes at path (replacing what is there): costs no disk space. */
void tu_sparse_file(const char *path, uint64_t bytes);

/* ---- hangs, memory ------------------------------------------------------------------------ */

/* Arms a watchdog for a test that would hang on a regression: after `seconds` the process
 * prints "watchdog: <what>" and exits with status 124, so the test fails instead of
 * blocking forever. tu_watchdog(0, NULL) disarms it. One at a time (SIGALRM). */
void tu_watchdog(unsigned seconds, const char *what);
/* This process's peak resident set so far, in KiB (getrusage). */
long tu_peak_rss_kib(void);

/* FNV-1a of n bytes, continuing from h (start with TU_HASH0). */
#define TU_HASH0 0xcbf29ce484222325ull
uint64_t tu_hash(const void *p, size_t n, uint64_t h);

/* ---- images ----------------------------------------------------------------------------- */

/* Frees an image's pixels and mask and zeroes it (ready for reuse). */
void tu_image_free(vl_image *im);

/* ---- damaged data sets (tests/damage.c) ----------------------------------------------- */

/* How a JPEG is damaged: cut to half its size; 64 bytes of garbage seeded by the salt in
 * the middle of its entropy-coded data (always with a stray EOI marker, so the decoder
 * must notice); replaced by a text file. */
enum { TU_JPEG_TRUNCATE = 0, TU_JPEG_GARBAGE = 1, TU_JPEG_NOT_JPEG = 2 };
/* Damage the JPEG at path in place. 0, or -1 with a message in err. */
int tu_damage_jpeg(const char *path, int mode, uint64_t salt, char *err, size_t errn);
/* Damage image i of the jpegset in dir (a TU_JPEG_* mode, salted by i). 0, or -1. */
int tu_jpegset_corrupt(const char *dir, int64_t i, int mode, char *err, size_t errn);
/* Damage sample i of the segset in dir. 0, or -1 with a message. */
enum {
  TU_SEGSET_IMG_TRUNCATE = 0,    /* the JPEG cut to half its size */
  TU_SEGSET_IMG_GARBAGE = 1,     /* garbage (with a stray marker) in its entropy-coded data */
  TU_SEGSET_IMG_NOT_JPEG = 2,    /* replaced by a text file */
  TU_SEGSET_MASK_TRUNCATE = 3,   /* the mask cut to half its size */
  TU_SEGSET_MASK_WRONG_SIZE = 4, /* a valid PGM of (size/2) x size */
  TU_SEGSET_MASK_BAD_CLASS = 5,  /* one pixel set to num_classes */
  TU_SEGSET_MASK_BAD_HEADER = 6, /* the magic "P5" replaced with "P2" */
  TU_SEGSET_IMG_MISSING = 7,     /* the JPEG deleted */
  TU_SEGSET_MASK_MISSING = 8     /* the mask deleted */
};
int tu_segset_corrupt(const char *dir, int64_t i, int what, char *err, size_t errn);

/* ---- progress callbacks ----------------------------------------------------------------- */

/* What a progress callback saw: tu_on_progress(done, total, user = tu_progress *). */
typedef struct {
  int64_t calls, last, total, backwards; /* backwards: calls with done < the previous done */
} tu_progress;
void tu_on_progress(int64_t done, int64_t total, void *user);
/* Asserts a finished run reported at least once, never went backwards, and ended at
 * done == total == n. */
void tu_assert_progress_done(const tu_progress *p, int64_t n);

/* expr returns VL_ERR_INVALID and the context cx's message names `word`. */
#define TU_BAD(cx, expr, word)                                                             \
  do {                                                                                     \
    assert_int_equal((expr), VL_ERR_INVALID);                                              \
    if (!strstr((cx)->err, (word))) {                                                      \
      print_error("message \"%s\" lacks \"%s\"\n", (cx)->err, (word));                   \
      fail();                                                                              \
    }                                                                                      \
  } while (0)

/* Wall-clock fields out of a plan (every key ending in "seconds", at any depth): what two
 * plans of the same step may differ in. */
struct cJSON;
void tu_strip_timings(struct cJSON *o);

#endif
