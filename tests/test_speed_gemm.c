/* The CPU GEMM threaded by slices (engine/backend/cpu/cpu_gemm.c) against the algorithm it
 * replaced: every non-fp32 operand of a batch converted whole into fp32, one cblas_sgemm
 * call per batch, C converted back. Cases cover every layout, every operand dtype (NF4
 * included), beta 0 and 1, batches split by thread or by slice, heads interleaved in C's
 * rows, and teams of 1, 2 and 3 threads, all forked (3 does not divide the tiles evenly).
 *
 * Tolerance. OpenBLAS's micro-kernels do not sum K in the same order for every tile shape
 * (a 75-row slice of a 150-row product differs in the last bits from the whole, and so did
 * its own threaded driver from its single-threaded one), so a slice equals the whole up to
 * the reassociation of the K sum: |got - want| <= 2 K 2^-24 mag, mag = sum_k |alpha a b| +
 * |beta c| (the classic bound for two orders of a float sum), plus 2 u |want| when C is
 * stored in a type of unit roundoff u (the two sums may round to neighbouring values).
 * Everything outside C's blocks (padding, gaps) must be bitwise untouched.
 *
 * Why it exists: OpenBLAS's own threads synchronise inside one call; for this engine's
 * shapes (1024 x 64..896 x 64..896, attention products 512 x 128 x 32 over 16 groups) one
 * fork per call with single-threaded slices ran 1.5-10x faster on a shared 2-core machine. */
#include "testutil.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "kernels/kcommon.h"
#include "kernels/nf4.h"
#include "vramlab/quant.h"

#define OK(expr) assert_int_equal((expr), VL_OK)
#define cx tu_cpu

/* The reference: the replaced algorithm on host copies of the operands (t_* hold the
 * stored values; C is updated in place as stored bytes). */
static void ref_gemm(const vl_gemm *g, void *cdata, double *mag) {
  int64_t ar = g->ta ? g->K : g->M, ac = g->ta ? g->M : g->K;
  int64_t br = g->tb ? g->N : g->K, bc = g->tb ? g->K : g->N;
  float *a = malloc((size_t)(ar * ac) * 4), *b = malloc((size_t)(br * bc) * 4),
        *c = malloc((size_t)(g->M * g->N) * 4);
  int ad = (int)g->A->dtype, bd = (int)g->B->dtype, cd = (int)g->C->dtype;
  for (int64_t n = 0; n < g->batch; n++) {
    int64_t ao = g->a_off + n * g->sa, bo = g->b_off + n * g->sb, co = g->c_off + n * g->sc;
    for (int64_t r = 0; r < ar; r++)
      for (int64_t k = 0; k < ac; k++) a[r * ac + k] = vl_ld(g->A->data, ad, ao + r * g->lda + k);
    for (int64_t r = 0; r < br; r++)
      for (int64_t k = 0; k < bc; k++)
        b[r * bc + k] = g->B->dtype == VL_NF4 ? vl_nf4_get(g->B->data, g->B->n, r * bc + k)
                                              : vl_ld(g->B->data, bd, bo + r * g->ldb + k);
    for (int64_t r = 0; r < g->M; r++)
      for (int64_t k = 0; k < g->N; k++)
        c[r * g->N + k] = g->beta != 0.0f ? vl_ld(cdata, cd, co + r * g->ldc + k) : 0.0f;
    for (int64_t r = 0; mag && r < g->M; r++)
      for (int64_t k = 0; k < g->N; k++) {
        double s = fabs((double)g->beta * c[r * g->N + k]);
        for (int64_t i = 0; i < g->K; i++)
          s += fabs((double)g->alpha * (g->ta ? a[i * ac + r] : a[r * ac + i]) *
                    (g->tb ? b[k * bc + i] : b[i * bc + k]));
        mag[co + r * g->ldc + k] = s;
      }
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                (blasint)g->M, (blasint)g->N, (blasint)g->K, g->alpha, a, (blasint)ac, b,
                (blasint)bc, g->beta, c, (blasint)g->N);
    for (int64_t r = 0; r < g->M; r++)
      for (int64_t k = 0; k < g->N; k++) vl_st(cdata, cd, co + r * g->ldc + k, c[r * g->N + k]);
  }
  free(a); free(b); free(c);
}

typedef struct {
  bool ta, tb;
  int64_t M, N, K, batch;
  float alpha, beta;
  vl_dtype adt, bdt, cdt;
  bool heads; /* C's batches interleaved within rows: (M, batch*N), batch h at column h*N */
} gcase;

/* Runs one case through vl_gemm_run with 1, 2 and 3 OpenMP threads, each time from the
 * same C, and compares C (padding included) with the reference. */
static void run_case(const gcase *k, uint64_t seed) {
  int64_t ar = k->ta ? k->K : k->M, ac = k->ta ? k->M : k->K;
  int64_t br = k->tb ? k->N : k->K, bc = k->tb ? k->K : k->N;
  bool nf4 = k->bdt == VL_NF4;
  int64_t lda = ac + 3, ldb = nf4 ? bc : bc + 2;
  int64_t sa = ar * lda + 5, sb = nf4 ? 0 : br * ldb + 7;
  int64_t ldc = k->heads ? k->batch * k->N + 1 : k->N + 1, sc = k->heads ? k->N : k->M * ldc + 2;
  int64_t a_off = 4, b_off = nf4 ? 0 : 6, c_off = 3;
  int64_t na = a_off + k->batch * sa, nb = nf4 ? br * bc : b_off + k->batch * sb;
  int64_t nc = c_off + (k->heads ? k->M * ldc : k->batch * sc);
  float *A = tu_randn_new(na, 1.0f, seed), *B = tu_randn_new(nb, 0.5f, seed + 1),
        *C0 = tu_randn_new(nc, 1.0f, seed + 2);
  vl_tensor tA = tu_tnew(cx, k->adt, na, A), tC = tu_tnew(cx, k->cdt, nc, C0), tB;
  if (nf4) {
    OK(vl_tensor_alloc2(cx, &tB, VL_NF4, VL_MEM_TEMP, br, bc));
    assert_int_equal(vl_nf4_quantize_host(tB.data, B, nb), 0);
  } else {
    tB = tu_tnew(cx, k->bdt, nb, B);
  }
  vl_gemm g = {.ta = k->ta, .tb = k->tb, .M = k->M, .N = k->N, .K = k->K, .alpha = k->alpha,
               .beta = k->beta, .A = &tA, .a_off = a_off, .lda = lda, .sa = sa,
               .B = &tB, .b_off = b_off, .ldb = ldb, .sb = sb,
               .C = &tC, .c_off = c_off, .ldc = ldc, .sc = sc, .batch = k->batch};
  void *want = malloc(tC.bytes);
  double *mag = malloc((size_t)nc * sizeof *mag);
  for (int64_t i = 0; i < nc; i++) mag[i] = -1; /* -1: not in C's blocks */
  void *c0 = malloc(tC.bytes);
  memcpy(want, tC.data, tC.bytes);
  memcpy(c0, tC.data, tC.bytes);
  ref_gemm(&g, want, mag);
  float *got = tu_zeros(nc), *ref = tu_zeros(nc);
  vl_tensor tw = tC;
  tw.data = want;
  tu_tget(&tw, ref);
  double u = k->cdt == VL_F32 ? 0 : tu_unit_roundoff(k->cdt);
  int saved = omp_get_max_threads();
  for (int threads = 1; threads <= 3; threads++) {
    memcpy(tC.data, c0, tC.bytes);
    omp_set_num_threads(threads); /* the team: `threads` slices, all forked */
    vl_cpu_threads_force(threads);
    vl_status st = vl_gemm_run(cx, &g);
    vl_cpu_threads_force(0);
    omp_set_num_threads(saved);
    OK(st);
    tu_tget(&tC, got);
    for (int64_t i = 0; i < nc; i++) {
      bool ok = mag[i] < 0 ? !memcmp(&got[i], &ref[i], 4)
                           : fabs((double)got[i] - ref[i]) <=
                                 2.0 * (double)k->K * 0x1p-24 * mag[i] + 2.0 * u * fabs(ref[i]);
      if (!ok) {
        print_error("gemm ta=%d tb=%d %lldx%lldx%lld batch %lld %s/%s/%s beta %g, %d threads: "
                    "%s[%lld] = %.9g, unthreaded %.9g\n", k->ta, k->tb, (long long)k->M,
                    (long long)k->N, (long long)k->K, (long long)k->batch, vl_dtype_name(k->adt),
                    vl_dtype_name(k->bdt), vl_dtype_name(k->cdt), k->beta, threads,
                    mag[i] < 0 ? "padding" : "C", (long long)i, got[i], ref[i]);
        fail();
      }
    }
  }
  TU_TFREE(cx, &tA, &tB, &tC);
  free(got); free(ref); free(mag); free(want); free(c0); free(A); free(B); free(C0);
}

/* fp32, every layout, above the size that forks; batch 1, 3 (slices) and 4 (whole
 * batches per thread), overwrite and accumulate. */
static void test_fp32_layouts(void **state) {
  (void)state;
  uint64_t seed = 100;
  const int64_t batches[3] = {1, 3, 4};
  for (int t = 0; t < 4; t++)
    for (int i = 0; i < 3; i++) {
      bool ta = t & 1, tb = t >> 1;
      float beta = (float)((t + i) & 1);
      gcase k = {ta, tb, 150, 70, 130, batches[i], 1.5f, beta, VL_F32, VL_F32, VL_F32, false};
      run_case(&k, seed += 3);
      gcase w = {ta, tb, 40, 190, 140, batches[i], -0.5f, 1.0f - beta,
                 VL_F32, VL_F32, VL_F32, false};
      run_case(&w, seed += 3); /* wider than tall: C's columns are split */
    }
}

/* Attention's shape: heads interleaved in C's rows, whole heads per thread. */
static void test_fp32_heads(void **state) {
  (void)state;
  gcase k = {false, false, 128, 32, 128, 8, 1.0f, 0.0f, VL_F32, VL_F32, VL_F32, true};
  run_case(&k, 200);
  gcase t = {false, true, 128, 32, 64, 6, 1.0f, 1.0f, VL_F32, VL_F32, VL_F32, true};
  run_case(&t, 210);
}

/* Low-precision operands: each thread converts its own part, or the team converts the
 * shared operand behind a barrier (both A and B converted, batches in a row). */
static void test_converted(void **state) {
  (void)state;
  /* A only, B only, C only, A and B, all three, B and C */
  const vl_dtype dts[6][3] = {{VL_F16, VL_F32, VL_F32}, {VL_F32, VL_BF16, VL_F32},
                              {VL_F32, VL_F32, VL_F16}, {VL_BF16, VL_F16, VL_F32},
                              {VL_F16, VL_BF16, VL_BF16}, {VL_F32, VL_F16, VL_BF16}};
  uint64_t seed = 300;
  for (int i = 0; i < 6; i++)
    for (int t = 0; t < 4; t++) {
      bool ta = t & 1, tb = t >> 1;
      gcase k = {ta, tb, 96, 80, 160, 2, 1.0f, (float)(i & 1),
                 dts[i][0], dts[i][1], dts[i][2], false};
      run_case(&k, seed += 3);
      gcase w = {tb, ta, 36, 200, 160, 1, 0.75f, 1.0f, dts[i][0], dts[i][1], dts[i][2], false};
      run_case(&w, seed += 3);
    }
}

/* A frozen NF4 weight as B, dequantised whole once, with fp32 and bf16 activations. */
static void test_nf4(void **state) {
  (void)state;
  for (int tb = 0; tb < 2; tb++)
    for (int a = 0; a < 2; a++) {
      vl_dtype adt = a ? VL_BF16 : VL_F32;
      gcase k = {false, tb, 130, 128, 192, 1, 1.0f, 0.0f, adt, VL_NF4, VL_F32, false};
      run_case(&k, 400 + 10 * (uint64_t)(2 * tb + a));
      gcase w = {false, tb, 20, 256, 512, 2, 1.0f, 1.0f, adt, VL_NF4, adt, false};
      run_case(&w, 450 + 10 * (uint64_t)(2 * tb + a));
    }
}

/* The comparison itself can fail: a case whose C the kernel gets wrong by more than the
 * bound (here: beta 1 run on a C the reference did not see) is caught. */
static void test_check_can_fail(void **state) {
  (void)state;
  /* same shapes and data as a passing case, but C scaled by 1 + 2^-10 after the reference:
   * far above 2 K 2^-24 mag relative to these O(10) sums */
  int64_t M = 150, N = 70, K = 130, lda = 133, ldb = 72, ldc = 71;
  int64_t na = 4 + M * lda, nb = 6 + K * ldb, nc = 3 + M * ldc;
  float *A = tu_randn_new(na, 1.0f, 1), *B = tu_randn_new(nb, 1.0f, 2);
  vl_tensor tA = tu_tnew(cx, VL_F32, na, A), tB = tu_tnew(cx, VL_F32, nb, B),
            tC = tu_tnew(cx, VL_F32, nc, NULL);
  vl_gemm g = {.M = M, .N = N, .K = K, .alpha = 1, .A = &tA, .a_off = 4, .lda = lda,
               .B = &tB, .b_off = 6, .ldb = ldb, .C = &tC, .c_off = 3, .ldc = ldc, .batch = 1};
  float *want = tu_zeros(nc);
  double *mag = calloc((size_t)nc, sizeof *mag);
  ref_gemm(&g, want, mag);
  OK(vl_gemm_run(cx, &g));
  float *got = tC.data;
  int64_t i = 3 + ldc * 75 + 9, bad = 0;
  got[i] *= 1.0f + 0x1p-10f;
  for (int64_t j = 0; j < nc; j++)
    bad += !(fabs((double)got[j] - want[j]) <= 2.0 * (double)K * 0x1p-24 * mag[j]);
  assert_int_equal(bad, 1);
  TU_TFREE(cx, &tA, &tB, &tC);
  free(A); free(B); free(want); free(mag);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp32_layouts),
      cmocka_unit_test(test_fp32_heads),
      cmocka_unit_test(test_converted),
      cmocka_unit_test(test_nf4),
      cmocka_unit_test(test_check_can_fail),
  };
  return cmocka_run_group_tests(tests, tu_cpu_setup, tu_cpu_teardown);
}
