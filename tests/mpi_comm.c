/* The MPI communicator on 2 (or more) ranks under mpirun (tests/mpirun.sh 2 mpi_comm): every
 * collective against a serial reference computed here from every rank's contribution, out
 * of place and in place (dist.h's NCCL convention), fp32/fp16/bf16/i32, uneven sizes
 * (1, 3, 1000003 elements), blocking and non-blocking (several outstanding, waited in
 * another order), a wait that times out, argument errors. Each rank's contribution differs
 * (val() depends on the rank), so a copy, a missing average or a wrong chunk fails.
 * Verdicts are agreed over MPI_Allreduce directly (not the code under test), so every rank
 * fails the same test and the ranks stay in step.
 *
 * Modes for tests/test_dist.c's killed-rank tests (not run by ctest directly):
 *   mpi_comm --die R    rank R raises SIGKILL before an allreduce
 *   mpi_comm --fail R   rank R calls vl_comm_abort before an allreduce */
#include "testutil.h"

#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kcommon.h"
#include "vramlab/dist.h"

static vl_comm *cm;
static vl_ctx *cx;
static int rank, size;

static const int64_t sizes[] = {1, 3, 1000003};
#define NSIZES ((int)(sizeof sizes / sizeof sizes[0]))
static const vl_dtype dtypes[] = {VL_F32, VL_F16, VL_BF16, VL_I32};
#define NDT 4

/* Rank r's value at global index i: a small integer (exact in every dtype, and so are sums
 * over a few ranks and their halves), different on every rank. */
static float val(int r, int64_t i) { return (float)(((i * 7 + r * 13 + 1) % 17) - 8); }
#define GARBAGE 99.0f

static size_t es(vl_dtype dt) { return vl_dtype_bytes(dt, 1); }
static void st(void *p, vl_dtype dt, int64_t i, float x) {
  if (dt == VL_I32) ((int32_t *)p)[i] = (int32_t)x;
  else vl_st(p, (int)dt, i, x);
}
static float ld(const void *p, vl_dtype dt, int64_t i) {
  return dt == VL_I32 ? (float)((const int32_t *)p)[i] : vl_ld(p, (int)dt, i);
}
static void *buf(vl_dtype dt, int64_t n) {
  void *p = malloc(es(dt) * (size_t)n + 1);
  assert_non_null(p);
  return p;
}
static void fill(void *p, vl_dtype dt, int64_t n, int r, int64_t i0) {
  for (int64_t i = 0; i < n; i++) st(p, dt, i, val(r, i0 + i));
}
static void fill_const(void *p, vl_dtype dt, int64_t n, float x) {
  for (int64_t i = 0; i < n; i++) st(p, dt, i, x);
}
static float sum_at(int64_t i, vl_red_op op) {
  float s = 0;
  for (int r = 0; r < size; r++) s += val(r, i);
  return op == VL_RED_AVG ? s / size : s;
}
/* The rounding an average may carry: sums of small integers are exact, the scale by 1/size
 * is one rounding to dt (none for 2 ranks, a power of two). */
static double avg_tol(vl_dtype dt, vl_red_op op) {
  if (op != VL_RED_AVG) return 0;
  return dt == VL_BF16 ? 1.0 / 256 : dt == VL_F16 ? 1.0 / 2048 : 1.0 / (1 << 23);
}
/* Elements of p[0..n) that differ from want(i0 + i) by more than tol relative; prints the
 * first. */
static long count_bad_tol(const void *p, vl_dtype dt, int64_t n, int64_t i0,
                          float (*want)(int64_t, void *), void *u, double tol, const char *what) {
  long bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float w = want(i0 + i, u), g = ld(p, dt, i);
    if (!(fabs((double)g - w) <= tol * fabs((double)w)) && bad++ == 0)
      print_error("rank %d: %s %s n=%lld: [%lld] = %g, want %g\n", rank, what,
                  vl_dtype_name(dt), (long long)n, (long long)i, g, w);
  }
  return bad;
}
static long count_bad(const void *p, vl_dtype dt, int64_t n, int64_t i0,
                      float (*want)(int64_t, void *), void *u, const char *what) {
  return count_bad_tol(p, dt, n, i0, want, u, 0, what);
}
static float want_sum(int64_t i, void *u) { return sum_at(i, *(vl_red_op *)u); }
static float want_rank(int64_t i, void *u) { return val(*(int *)u, i); }

/* Every rank's bad count summed (plain MPI: independent of the code under test). */
static void agree(long bad, const char *what) {
  long total = 0;
  MPI_Allreduce(&bad, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (total) print_error("%s: %ld wrong elements over all ranks\n", what, total);
  assert_int_equal(total, 0);
}
static void ok(vl_status s) {
  if (s != VL_OK) print_error("rank %d: %s: %s\n", rank, vl_status_name(s), cx->err);
  assert_int_equal(s, VL_OK);
}

/* ============================== reductions ========================================= */

static long allreduce_case(vl_dtype dt, vl_red_op op, int64_t n, bool inplace) {
  void *s = buf(dt, n), *r = inplace ? s : buf(dt, n);
  fill(s, dt, n, rank, 0);
  if (!inplace) fill_const(r, dt, n, GARBAGE);
  ok(vl_comm_allreduce(cm, cx, s, r, n, dt, op, NULL));
  long bad = count_bad_tol(r, dt, n, 0, want_sum, &op, avg_tol(dt, op),
                           inplace ? "allreduce in place" : "allreduce");
  if (!inplace) bad += count_bad(s, dt, n, 0, want_rank, &rank, "allreduce send kept");
  if (!inplace) free(r);
  free(s);
  return bad;
}

static void test_allreduce(void **state) {
  long bad = 0;
  for (int d = 0; d < NDT; d++)
    for (int op = VL_RED_SUM; op <= VL_RED_AVG; op++) {
      if (op == VL_RED_AVG && dtypes[d] == VL_I32) continue;
      for (int k = 0; k < NSIZES; k++)
        for (int ip = 0; ip < 2; ip++) bad += allreduce_case(dtypes[d], (vl_red_op)op, sizes[k], ip);
    }
  agree(bad, "allreduce");
}

typedef struct { int64_t rc; vl_red_op op; } rs_want;
static float want_rs(int64_t i, void *u) { return sum_at(i, ((rs_want *)u)->op); }

static long reduce_scatter_case(vl_dtype dt, vl_red_op op, int64_t rc, bool inplace) {
  int64_t n = rc * size;
  void *s = buf(dt, n), *r = inplace ? (char *)s + (size_t)(rank * rc) * es(dt) : buf(dt, rc);
  fill(s, dt, n, rank, 0);
  if (!inplace) fill_const(r, dt, rc, GARBAGE);
  ok(vl_comm_reduce_scatter(cm, cx, s, r, rc, dt, op, NULL));
  rs_want w = {rc, op};
  long bad = count_bad_tol(r, dt, rc, rank * rc, want_rs, &w, avg_tol(dt, op),
                           inplace ? "reduce_scatter in place" : "reduce_scatter");
  /* the other chunks of send are left as they were (in place too) */
  for (int q = 0; q < size; q++) {
    if (inplace && q == rank) continue;
    bad += count_bad((char *)s + (size_t)(q * rc) * es(dt), dt, rc, q * rc, want_rank, &rank,
                     "reduce_scatter send kept");
  }
  if (!inplace) free(r);
  free(s);
  return bad;
}

static void test_reduce_scatter(void **state) {
  long bad = 0;
  for (int d = 0; d < NDT; d++)
    for (int op = VL_RED_SUM; op <= VL_RED_AVG; op++) {
      if (op == VL_RED_AVG && dtypes[d] == VL_I32) continue;
      for (int k = 0; k < NSIZES; k++)
        for (int ip = 0; ip < 2; ip++) bad += reduce_scatter_case(dtypes[d], (vl_red_op)op, sizes[k], ip);
    }
  agree(bad, "reduce_scatter");
}

/* reduce to root: root's recv holds the sum (in place when send == recv); elsewhere recv is
 * ignored (NULL here) and send is untouched */
static long reduce_case(vl_dtype dt, vl_red_op op, int64_t n, int root, bool inplace) {
  bool me = rank == root;
  void *s = buf(dt, n), *r = me ? (inplace ? s : buf(dt, n)) : NULL;
  fill(s, dt, n, rank, 0);
  if (me && !inplace) fill_const(r, dt, n, GARBAGE);
  ok(vl_comm_reduce(cm, cx, s, r, n, dt, op, root, NULL));
  long bad = 0;
  if (me)
    bad += count_bad_tol(r, dt, n, 0, want_sum, &op, avg_tol(dt, op),
                         inplace ? "reduce in place" : "reduce");
  if (!me || !inplace) bad += count_bad(s, dt, n, 0, want_rank, &rank, "reduce send kept");
  if (me && !inplace) free(r);
  free(s);
  return bad;
}

static void test_reduce(void **state) {
  long bad = 0;
  for (int d = 0; d < NDT; d++)
    for (int root = 0; root < size; root++)
      for (int k = 0; k < NSIZES; k++)
        for (int ip = 0; ip < 2; ip++) {
          vl_red_op op = (k + ip) % 2 && dtypes[d] != VL_I32 ? VL_RED_AVG : VL_RED_SUM;
          bad += reduce_case(dtypes[d], op, sizes[k], root, ip);
        }
  agree(bad, "reduce");
}

/* ============================== data movement ====================================== */

/* the slot's owner: allgather/gather chunk q holds rank q's values at global indices */
static float want_owner(int64_t i, void *u) { return val((int)(i / *(int64_t *)u), i); }

static long allgather_case(vl_dtype dt, int64_t sc, bool inplace) {
  int64_t n = sc * size;
  void *r = buf(dt, n);
  fill_const(r, dt, n, GARBAGE);
  void *s = inplace ? (char *)r + (size_t)(rank * sc) * es(dt) : buf(dt, sc);
  fill(s, dt, sc, rank, rank * sc);
  ok(vl_comm_allgather(cm, cx, s, r, sc, dt, NULL));
  long bad = count_bad(r, dt, n, 0, want_owner, &sc, inplace ? "allgather in place" : "allgather");
  if (!inplace) free(s);
  free(r);
  return bad;
}

static void test_allgather(void **state) {
  long bad = 0;
  for (int d = 0; d < NDT; d++)
    for (int k = 0; k < NSIZES; k++)
      for (int ip = 0; ip < 2; ip++) bad += allgather_case(dtypes[d], sizes[k], ip);
  agree(bad, "allgather");
}

static long gather_case(vl_dtype dt, int64_t sc, int root, bool inplace) {
  bool me = rank == root;
  int64_t n = sc * size;
  void *r = me ? buf(dt, n) : NULL;
  if (me) fill_const(r, dt, n, GARBAGE);
  void *s = me && inplace ? (char *)r + (size_t)(rank * sc) * es(dt) : buf(dt, sc);
  fill(s, dt, sc, rank, rank * sc);
  ok(vl_comm_gather(cm, cx, s, r, sc, dt, root, NULL));
  long bad = me ? count_bad(r, dt, n, 0, want_owner, &sc, inplace ? "gather in place" : "gather") : 0;
  if (!(me && inplace)) free(s);
  free(r);
  return bad;
}

static long scatter_case(vl_dtype dt, int64_t rc, int root, bool inplace) {
  bool me = rank == root;
  int64_t n = rc * size;
  void *s = me ? buf(dt, n) : NULL;
  if (me) /* chunk q carries rank q's values */
    for (int q = 0; q < size; q++) fill((char *)s + (size_t)(q * rc) * es(dt), dt, rc, q, q * rc);
  void *r = me && inplace ? (char *)s + (size_t)(rank * rc) * es(dt) : buf(dt, rc);
  if (!(me && inplace)) fill_const(r, dt, rc, GARBAGE);
  ok(vl_comm_scatter(cm, cx, s, r, rc, dt, root, NULL));
  long bad = count_bad(r, dt, rc, rank * rc, want_rank, &rank, inplace ? "scatter in place" : "scatter");
  if (!(me && inplace)) free(r);
  free(s);
  return bad;
}

static void test_gather_scatter(void **state) {
  long bad = 0;
  for (int d = 0; d < NDT; d++)
    for (int root = 0; root < size; root++)
      for (int k = 0; k < NSIZES; k++)
        for (int ip = 0; ip < 2; ip++) {
          bad += gather_case(dtypes[d], sizes[k], root, ip);
          bad += scatter_case(dtypes[d], sizes[k], root, ip);
        }
  agree(bad, "gather/scatter");
}

/* broadcast moves raw bytes: every dtype, NF4 included (its packed size) */
static void test_bcast(void **state) {
  long bad = 0;
  const vl_dtype all[] = {VL_F32, VL_F16, VL_BF16, VL_I32, VL_NF4};
  const int64_t n_of[] = {1, 3, 1000003, 64, 4096};
  for (int d = 0; d < 5; d++)
    for (int k = 0; k < 5; k++) {
      vl_dtype dt = all[d];
      int64_t n = n_of[k];
      if (dt == VL_NF4 && n % 64) continue;
      if (dt != VL_NF4 && k >= 3) continue;
      size_t nb = vl_dtype_bytes(dt, n);
      for (int root = 0; root < size; root++) {
        uint8_t *p = malloc(nb);
        assert_non_null(p);
        for (size_t i = 0; i < nb; i++) p[i] = (uint8_t)(rank == root ? vl_mix64(i + 977 * root) : 0xEE);
        ok(vl_comm_bcast(cm, cx, p, n, dt, root, NULL));
        for (size_t i = 0; i < nb; i++)
          if (p[i] != (uint8_t)vl_mix64(i + 977 * root) && bad++ == 0)
            print_error("rank %d: bcast %s n=%lld root %d: byte %zu wrong\n", rank,
                        vl_dtype_name(dt), (long long)n, root, i);
        free(p);
      }
    }
  agree(bad, "bcast");
}

/* the barrier holds every rank until the last arrives: rank 1 comes 300 ms late */
static void test_barrier(void **state) {
  if (rank == 1) usleep(300 * 1000);
  double t0 = vl_now();
  ok(vl_comm_barrier(cm, cx, NULL));
  double dt = vl_now() - t0;
  long bad = rank == 0 && dt < 0.2;
  if (bad) print_error("rank 0 left the barrier after %.3f s, before rank 1 arrived\n", dt);
  agree(bad, "barrier");
}

/* ============================== non-blocking ======================================= */

/* Four collectives outstanding at once, driven by vl_comm_progress and vl_comm_test, then
 * waited in another order than they were started. */
static void test_nonblocking(void **state) {
  const int64_t n = 100003, rc = 5003, sc = 777, nb = 3001;
  vl_red_op avg = VL_RED_AVG;
  float *ar = buf(VL_F32, n);
  fill(ar, VL_F32, n, rank, 0);
  uint16_t *rs = buf(VL_BF16, rc * size), *rsr = buf(VL_BF16, rc);
  fill(rs, VL_BF16, rc * size, rank, 0);
  int32_t *ag = buf(VL_I32, sc * size), *ags = buf(VL_I32, sc);
  fill(ags, VL_I32, sc, rank, rank * sc);
  uint16_t *bc = buf(VL_F16, nb);
  if (rank == 1 % size) fill(bc, VL_F16, nb, rank, 0);
  else fill_const(bc, VL_F16, nb, GARBAGE);
  vl_comm_req *q[4] = {NULL, NULL, NULL, NULL};
  ok(vl_comm_allreduce(cm, cx, ar, ar, n, VL_F32, VL_RED_AVG, &q[0]));
  ok(vl_comm_reduce_scatter(cm, cx, rs, rsr, rc, VL_BF16, VL_RED_SUM, &q[1]));
  ok(vl_comm_allgather(cm, cx, ags, ag, sc, VL_I32, &q[2]));
  ok(vl_comm_bcast(cm, cx, bc, nb, VL_F16, 1 % size, &q[3]));
  for (int i = 0; i < 4; i++) assert_non_null(q[i]);
  bool done = false;
  double t0 = vl_now();
  while (!done && vl_now() - t0 < 30) { /* the bcast completes under progress + test alone */
    vl_comm_progress(cm);
    ok(vl_comm_test(cm, cx, q[3], &done));
  }
  assert_true(done);
  int order[4] = {2, 0, 3, 1};
  for (int i = 0; i < 4; i++) ok(vl_comm_wait(cm, cx, q[order[i]]));
  ok(vl_comm_wait(cm, cx, NULL));
  long bad = count_bad_tol(ar, VL_F32, n, 0, want_sum, &avg, avg_tol(VL_F32, avg), "iallreduce avg");
  rs_want w = {rc, VL_RED_SUM};
  bad += count_bad(rsr, VL_BF16, rc, rank * rc, want_rs, &w, "ireduce_scatter");
  int64_t scv = sc;
  bad += count_bad(ag, VL_I32, sc * size, 0, want_owner, &scv, "iallgather");
  int root = 1 % size;
  bad += count_bad(bc, VL_F16, nb, 0, want_rank, &root, "ibcast");
  free(ar), free(rs), free(rsr), free(ag), free(ags), free(bc);
  agree(bad, "non-blocking");
}

/* ============================== timeout and errors ================================= */

/* Rank 0 waits 0.5 s on a barrier rank 1 joins 2 s late: VL_ERR_COMM naming the rank, the
 * collective and the timeout. The abandoned barrier still completes later (rank 1 joins),
 * so a second barrier keeps the ranks in step. */
static void test_timeout(void **state) {
  double keep = vl_comm_timeout(cm);
  long bad = 0;
  if (rank == 0) {
    vl_comm_set_timeout(cm, 0.5);
    double t0 = vl_now();
    vl_status s = vl_comm_barrier(cm, cx, NULL);
    double dt = vl_now() - t0;
    vl_comm_set_timeout(cm, keep);
    if (s != VL_ERR_COMM || dt < 0.45 || dt > 1.9 || !strstr(cx->err, "rank 0 of") ||
        !strstr(cx->err, "barrier") || !strstr(cx->err, "timed out after 0.5 s") ||
        !strstr(cx->err, "peer rank died or stopped")) {
      print_error("timeout: status %s after %.2f s: %s\n", vl_status_name(s), dt, cx->err);
      bad = 1;
    }
  } else {
    usleep(2000 * 1000);
    ok(vl_comm_barrier(cm, cx, NULL));
  }
  ok(vl_comm_barrier(cm, cx, NULL));
  agree(bad, "timeout");
}

static void test_bad_args(void **state) {
  float x[8] = {0};
  int32_t k[8] = {0};
  TU_BAD(cx, vl_comm_bcast(cm, cx, x, 8, VL_F32, size, NULL), "root");
  TU_BAD(cx, vl_comm_reduce(cm, cx, x, x, 8, VL_F32, VL_RED_SUM, -1, NULL), "root");
  TU_BAD(cx, vl_comm_allreduce(cm, cx, k, k, 8, VL_I32, VL_RED_AVG, NULL), "i32");
  TU_BAD(cx, vl_comm_allreduce(cm, cx, x, x + 1, 4, VL_F32, VL_RED_SUM, NULL), "overlap");
  TU_BAD(cx, vl_comm_allreduce(cm, cx, x, x, -1, VL_F32, VL_RED_SUM, NULL), "negative");
  TU_BAD(cx, vl_comm_allreduce(cm, cx, x, x, 64, VL_NF4, VL_RED_SUM, NULL), "nf4");
  TU_BAD(cx, vl_comm_allgather(cm, cx, NULL, x, 1, VL_F32, NULL), "NULL");
  vl_comm_req *r = (vl_comm_req *)x;
  TU_BAD(cx, vl_comm_allreduce(NULL, cx, x, x, 1, VL_F32, VL_RED_SUM, &r), "NULL");
  assert_null(r);
  assert_int_equal(vl_comm_kind_of(cm), VL_COMM_MPI);
  assert_int_equal(vl_comm_rank(cm), rank);
  assert_true(vl_comm_under_mpirun());
  agree(0, "bad args");
}

/* ============================== setup and modes ==================================== */

static int setup(void **state) {
  vl_err err;
  if (vl_comm_create_mpi(&cm, &err) != VL_OK) {
    fprintf(stderr, "mpi_comm: %s\n", err.msg);
    return -1;
  }
  rank = vl_comm_rank(cm);
  size = vl_comm_size(cm);
  vl_comm_set_timeout(cm, 60); /* a broken collective fails the test, not CI's clock */
  return vl_ctx_create(&cx, VL_DEV_CPU, 64u << 20) == VL_OK ? 0 : -1;
}

static int teardown(void **state) {
  vl_ctx_destroy(cx);
  vl_comm_destroy(cm);
  return 0;
}

/* --die R / --fail R: rank R dies (SIGKILL) or aborts before an allreduce the others wait in */
static int fault_mode(const char *mode, int victim) {
  char err[256];
  if (setup(NULL)) return 2;
  vl_comm_set_timeout(cm, 30);
  if (rank == victim) {
    if (!strcmp(mode, "--die")) raise(SIGKILL);
    vl_comm_abort(cm, 3, "injected failure before an allreduce");
  }
  float x = 1;
  vl_status s = vl_comm_allreduce(cm, cx, &x, &x, 1, VL_F32, VL_RED_SUM, NULL);
  if (s != VL_OK) {
    snprintf(err, sizeof err, "%s", cx->err);
    vl_comm_abort(cm, 4, err);
  }
  fprintf(stderr, "rank %d: the allreduce completed without rank %d\n", rank, victim);
  teardown(NULL);
  return 5;
}

int main(int argc, char **argv) {
  if (argc == 3 && (!strcmp(argv[1], "--die") || !strcmp(argv[1], "--fail")))
    return fault_mode(argv[1], atoi(argv[2]));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_args),     cmocka_unit_test(test_allreduce),
      cmocka_unit_test(test_reduce_scatter), cmocka_unit_test(test_reduce),
      cmocka_unit_test(test_allgather),    cmocka_unit_test(test_gather_scatter),
      cmocka_unit_test(test_bcast),        cmocka_unit_test(test_barrier),
      cmocka_unit_test(test_nonblocking),  cmocka_unit_test(test_timeout),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
