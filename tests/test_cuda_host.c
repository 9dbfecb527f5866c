/* Host-side logic of the CUDA backend, tested without a GPU (docs/architecture.md "The CUDA backend
 * must be verifiable without a GPU"): the row-major -> column-major cuBLAS mapping fed to a
 * column-major reference GEMM must equal the CPU backend's GEMM for every transpose combo,
 * padded leading dims, offsets, batch strides and non-trivial alpha/beta; the GEMM plan
 * (dtype selection, workspace use) simulated on the host must equal it too for mixed and
 * NF4 operands; launch geometry and arena sizing edge cases. */
#include "testutil.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_gemm_k.h"
#include "backend/cuda/cuda_host.h"
#include "kernels/kcommon.h"
#include "vramlab/backend.h"
#include "vramlab/quant.h"

/* One GEMM shape. Padding makes leading dims and batch strides larger than the matrices
 * so a mapping that mixes them up reads the wrong elements. */
typedef struct {
  bool ta, tb;
  int64_t M, N, K, batch;
  int64_t lda_pad, ldb_pad, ldc_pad;     /* ld = cols + pad */
  int64_t a_off, b_off, c_off;           /* element offsets of batch 0 */
  int64_t sa_pad, sb_pad, sc_pad;        /* stride = rows * ld + pad */
  float alpha, beta;
} shape;

typedef struct {
  vl_ctx *c;
  vl_tensor A, B, C;
  vl_gemm g;
  int64_t na, nb, nc; /* elements in each buffer */
} gemm_fix;

static int64_t rows_of(bool t, int64_t r, int64_t c) { return t ? c : r; }
static int64_t cols_of(bool t, int64_t r, int64_t c) { return t ? r : c; }

static void fill(vl_tensor *t, int64_t n, uint64_t seed) {
  float *tmp = malloc(sizeof(float) * (size_t)n);
  assert_non_null(tmp);
  tu_randn(tmp, n, 1.0f, seed);
  if (t->dtype == VL_NF4) {
    assert_int_equal(vl_nf4_quantize_host(t->data, tmp, n), 0);
  } else {
    for (int64_t i = 0; i < n; i++) vl_st(t->data, (int)t->dtype, i, tmp[i]);
  }
  free(tmp);
}

/* Allocate A, B, C (dtypes ad, bd, cd) for shape s on a CPU context and fill them. An NF4
 * B is a whole contiguous matrix (shared by the batches, as the backends require). */
static void fix_make(gemm_fix *f, const shape *s, vl_dtype ad, vl_dtype bd, vl_dtype cd) {
  memset(f, 0, sizeof *f);
  assert_int_equal(vl_ctx_create(&f->c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_gemm *g = &f->g;
  g->ta = s->ta; g->tb = s->tb;
  g->M = s->M; g->N = s->N; g->K = s->K;
  g->alpha = s->alpha; g->beta = s->beta;
  g->batch = s->batch;
  int64_t ar = rows_of(s->ta, s->M, s->K), ac = cols_of(s->ta, s->M, s->K);
  int64_t br = rows_of(s->tb, s->K, s->N), bc = cols_of(s->tb, s->K, s->N);
  g->lda = ac + s->lda_pad; g->a_off = s->a_off; g->sa = ar * g->lda + s->sa_pad;
  g->ldc = s->N + s->ldc_pad; g->c_off = s->c_off; g->sc = s->M * g->ldc + s->sc_pad;
  if (bd == VL_NF4) {
    g->ldb = bc; g->b_off = 0; g->sb = 0;
    f->nb = br * bc;
  } else {
    g->ldb = bc + s->ldb_pad; g->b_off = s->b_off; g->sb = br * g->ldb + s->sb_pad;
    f->nb = g->b_off + (s->batch - 1) * g->sb + br * g->ldb;
  }
  f->na = g->a_off + (s->batch - 1) * g->sa + ar * g->lda;
  f->nc = g->c_off + (s->batch - 1) * g->sc + s->M * g->ldc;
  assert_int_equal(vl_tensor_alloc2(f->c, &f->A, ad, VL_MEM_TEMP, 1, f->na), VL_OK);
  assert_int_equal(vl_tensor_alloc2(f->c, &f->B, bd, VL_MEM_TEMP, 1, f->nb), VL_OK);
  assert_int_equal(vl_tensor_alloc2(f->c, &f->C, cd, VL_MEM_TEMP, 1, f->nc), VL_OK);
  fill(&f->A, f->na, 11);
  fill(&f->B, f->nb, 22);
  fill(&f->C, f->nc, 33);
  g->A = &f->A; g->B = &f->B; g->C = &f->C;
}

static void fix_free(gemm_fix *f) { vl_ctx_destroy(f->c); }

/* Run the CPU backend's GEMM on f (in place on f->C) and return C as fp32. */
static float *cpu_gemm_result(gemm_fix *f) {
  vl_gemm g = f->g;
  g.ws_bytes = vl_op_ws_bytes(f->c, VL_OP_GEMM, &g);
  g.ws = g.ws_bytes ? malloc(g.ws_bytes) : NULL;
  assert_int_equal(vl_gemm_run(f->c, &g), VL_OK);
  free(g.ws);
  float *out = malloc(sizeof(float) * (size_t)f->nc);
  assert_non_null(out);
  for (int64_t i = 0; i < f->nc; i++) out[i] = vl_ld(f->C.data, (int)f->C.dtype, i);
  return out;
}

/* Maximum error (tu_max_rel_err units, <= 1 is a pass) of the column-major reference GEMM
 * fed with map(g), against the CPU backend, over the WHOLE C buffer (elements outside the
 * matrices must stay untouched). INFINITY when the reference rejects the arguments. */
static double mapped_err(const shape *s, vl_cublas_args (*map)(const vl_gemm *)) {
  gemm_fix f;
  fix_make(&f, s, VL_F32, VL_F32, VL_F32);
  float *ref = malloc(sizeof(float) * (size_t)f.nc);
  assert_non_null(ref);
  memcpy(ref, f.C.data, sizeof(float) * (size_t)f.nc);
  vl_cublas_args a = map(&f.g);
  const float *A = f.A.data, *B = f.B.data;
  const float *first = a.first == VL_CU_OPND_A ? A : B;
  const float *second = a.second == VL_CU_OPND_A ? A : B;
  /* a wrong mapping may reach outside the buffers: that counts as a failure */
  int64_t ef, es, ec;
  vl_cublas_extents(&a, &ef, &es, &ec);
  bool inside = ef <= (a.first == VL_CU_OPND_A ? f.na : f.nb) &&
                es <= (a.second == VL_CU_OPND_A ? f.na : f.nb) && ec <= f.nc;
  vl_status st = inside ? vl_colmajor_ref_gemm(&a, first, second, ref, s->alpha, s->beta)
                        : VL_ERR_INVALID;
  float *cpu = cpu_gemm_result(&f);
  double err = st == VL_OK ? tu_max_rel_err(ref, cpu, f.nc, 1e-4, 1e-4) : INFINITY;
  free(ref);
  free(cpu);
  fix_free(&f);
  return err;
}

/* What a mapping that forgot the transpose trick would pass: our A as cuBLAS's A. */
static vl_cublas_args unswapped_map(const vl_gemm *g) {
  vl_cublas_args a = vl_cublas_map(g);
  a.transa = g->ta ? VL_CU_OP_T : VL_CU_OP_N;
  a.transb = g->tb ? VL_CU_OP_T : VL_CU_OP_N;
  a.m = g->M; a.n = g->N;
  a.first = VL_CU_OPND_A; a.second = VL_CU_OPND_B;
  a.first_off = g->a_off; a.second_off = g->b_off;
  a.lda = g->lda; a.ldb = g->ldb;
  a.stride_a = g->sa; a.stride_b = g->sb;
  return a;
}

static const shape SHAPES[] = {
    /* ta  tb    M   N   K  bat  lda ldb ldc  aoff boff coff  sa sb sc   alpha  beta */
    {false, false, 5, 7, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0f, 0.0f},
    {false, false, 17, 9, 33, 1, 3, 5, 2, 4, 6, 8, 0, 0, 0, 0.7f, -0.4f},
    {true, false, 17, 9, 33, 1, 3, 5, 2, 4, 6, 8, 0, 0, 0, 1.3f, 0.5f},
    {false, true, 17, 9, 33, 1, 3, 5, 2, 4, 6, 8, 0, 0, 0, -1.1f, 1.0f},
    {true, true, 17, 9, 33, 1, 3, 5, 2, 4, 6, 8, 0, 0, 0, 0.25f, 2.0f},
    {false, false, 1, 13, 8, 3, 0, 2, 1, 1, 2, 3, 5, 7, 9, 1.0f, 1.0f},
    {true, true, 13, 1, 8, 3, 1, 0, 4, 0, 0, 5, 2, 3, 1, -0.5f, 0.0f},
    {true, false, 6, 6, 6, 4, 2, 2, 2, 0, 0, 0, 3, 3, 3, 1.0f, 0.3f},
    {false, true, 31, 2, 65, 2, 7, 1, 0, 9, 10, 11, 13, 0, 17, 0.9f, -1.0f},
    {true, false, 2, 40, 1, 5, 0, 3, 3, 2, 0, 7, 4, 6, 8, 2.5f, 0.5f},
    {false, false, 64, 48, 80, 2, 16, 8, 32, 64, 32, 16, 128, 64, 32, 1.0f, 0.0f},
};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])

static void test_map_matches_cpu(void **state) {
  (void)state;
  for (size_t i = 0; i < NSHAPES; i++) {
    double e = mapped_err(&SHAPES[i], vl_cublas_map);
    if (!(e <= 1.0)) print_error("shape %zu: error %g\n", i, e);
    assert_true(e <= 1.0);
  }
}

/* The same comparison with the operands NOT swapped must fail on every shape (a wrong
 * result, or arguments the cuBLAS rules reject): the test above can fail. */
static void test_unswapped_map_fails(void **state) {
  (void)state;
  for (size_t i = 0; i < NSHAPES; i++) assert_true(mapped_err(&SHAPES[i], unswapped_map) > 1.0);
}

static void test_map_fields(void **state) {
  (void)state;
  vl_tensor A = {0}, B = {0}, C = {0};
  vl_gemm g = {.ta = true, .tb = false, .M = 3, .N = 5, .K = 7, .alpha = 1, .beta = 0,
               .A = &A, .a_off = 2, .lda = 4, .sa = 100,
               .B = &B, .b_off = 3, .ldb = 6, .sb = 200,
               .C = &C, .c_off = 4, .ldc = 8, .sc = 300, .batch = 9};
  vl_cublas_args a = vl_cublas_map(&g);
  assert_int_equal(a.transa, VL_CU_OP_N); /* tb */
  assert_int_equal(a.transb, VL_CU_OP_T); /* ta */
  assert_int_equal(a.m, 5);
  assert_int_equal(a.n, 3);
  assert_int_equal(a.k, 7);
  assert_int_equal(a.first, VL_CU_OPND_B);
  assert_int_equal(a.second, VL_CU_OPND_A);
  assert_int_equal(a.first_off, 3);
  assert_int_equal(a.second_off, 2);
  assert_int_equal(a.c_off, 4);
  assert_int_equal(a.lda, 6);
  assert_int_equal(a.ldb, 4);
  assert_int_equal(a.ldc, 8);
  assert_int_equal(a.stride_a, 200);
  assert_int_equal(a.stride_b, 100);
  assert_int_equal(a.stride_c, 300);
  assert_int_equal(a.batch, 9);
  vl_cublas_args s = vl_cublas_slice(&a, 2);
  assert_int_equal(s.batch, 1);
  assert_int_equal(s.first_off, 3 + 2 * 200);
  assert_int_equal(s.second_off, 2 + 2 * 100);
  assert_int_equal(s.c_off, 4 + 2 * 300);
}

/* Extents of the correct mapping: exactly the buffers fix_make sizes (the last element of
 * the last batch is used). */
static void test_extents(void **state) {
  (void)state;
  for (size_t i = 0; i < NSHAPES; i++) {
    gemm_fix f;
    fix_make(&f, &SHAPES[i], VL_F32, VL_F32, VL_F32);
    vl_cublas_args a = vl_cublas_map(&f.g);
    int64_t ef, es, ec;
    vl_cublas_extents(&a, &ef, &es, &ec);
    int64_t pad_a = SHAPES[i].lda_pad, pad_b = SHAPES[i].ldb_pad, pad_c = SHAPES[i].ldc_pad;
    assert_int_equal(ef, f.nb - pad_b); /* the padding after the last row is not read */
    assert_int_equal(es, f.na - pad_a);
    assert_int_equal(ec, f.nc - pad_c);
    fix_free(&f);
  }
  vl_cublas_args e = {.m = 0, .n = 3, .k = 2, .lda = 1, .ldb = 2, .ldc = 1, .batch = 1};
  int64_t ef, es, ec;
  vl_cublas_extents(&e, &ef, &es, &ec);
  assert_int_equal(ef, 0);
  assert_int_equal(es, 2 + 2 * 2);
  assert_int_equal(ec, 0);
}

static void test_cublas_check(void **state) {
  (void)state;
  vl_cublas_args a = {.transa = VL_CU_OP_N, .transb = VL_CU_OP_N, .m = 4, .n = 3, .k = 5,
                      .lda = 4, .ldb = 5, .ldc = 4, .batch = 1};
  const char *why = "unset";
  assert_int_equal(vl_cublas_check(&a, &why), VL_OK);
  assert_null(why);
  vl_cublas_args b = a; b.lda = 3;
  assert_int_equal(vl_cublas_check(&b, &why), VL_ERR_INVALID);
  assert_non_null(why);
  b = a; b.transa = VL_CU_OP_T; /* op(A) = A^T: stored (k, m), needs lda >= k = 5 */
  assert_int_equal(vl_cublas_check(&b, NULL), VL_ERR_INVALID);
  b.lda = 5;
  assert_int_equal(vl_cublas_check(&b, NULL), VL_OK);
  b = a; b.transb = VL_CU_OP_T; b.ldb = 2; /* stored (n, k): needs ldb >= n = 3 */
  assert_int_equal(vl_cublas_check(&b, NULL), VL_ERR_INVALID);
  b = a; b.ldc = 3;
  assert_int_equal(vl_cublas_check(&b, NULL), VL_ERR_INVALID);
  b = a; b.m = (int64_t)INT_MAX + 1; b.lda = b.m; b.ldc = b.m;
  assert_int_equal(vl_cublas_check(&b, NULL), VL_ERR_INVALID);
  b = a; b.stride_c = -1;
  assert_int_equal(vl_cublas_check(&b, NULL), VL_ERR_INVALID);
  b = a; b.m = 0; b.lda = 1; b.ldc = 1; /* empty output: ld of at least 1 */
  assert_int_equal(vl_cublas_check(&b, NULL), VL_OK);
}

/* beta = 0 must not read C (cuBLAS semantics): NaN garbage in C stays out of the result. */
static void test_ref_beta0_ignores_c(void **state) {
  (void)state;
  float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 0, 1, 1, 1}, C[4] = {NAN, NAN, NAN, NAN};
  vl_cublas_args a = {.transa = VL_CU_OP_N, .transb = VL_CU_OP_N, .m = 2, .n = 2, .k = 3,
                      .lda = 2, .ldb = 3, .ldc = 2, .batch = 1};
  assert_int_equal(vl_colmajor_ref_gemm(&a, A, B, C, 1.0f, 0.0f), VL_OK);
  /* column-major A (2x3) = [1 3 5; 2 4 6], B (3x2) = [1 1; 0 1; 0 1] */
  const float want[4] = {1, 2, 9, 12};
  tu_assert_close(C, want, 4, 0, 1e-6, "beta0");
}

/* ---- dtype selection ------------------------------------------------------------------- */

static void test_dtype_maps(void **state) {
  (void)state;
  assert_int_equal(vl_cu_dtype_of(VL_F32), VL_CU_R_32F);
  assert_int_equal(vl_cu_dtype_of(VL_F16), VL_CU_R_16F);
  assert_int_equal(vl_cu_dtype_of(VL_BF16), VL_CU_R_16BF);
  assert_int_equal(vl_cu_dtype_k(VL_CU_R_32F), VL_K_F32);
  assert_int_equal(vl_cu_dtype_k(VL_CU_R_16F), VL_K_F16);
  assert_int_equal(vl_cu_dtype_k(VL_CU_R_16BF), VL_K_BF16);
  assert_int_equal(vl_cu_dtype_size(VL_CU_R_32F), 4);
  assert_int_equal(vl_cu_dtype_size(VL_CU_R_16F), 2);
  assert_int_equal(vl_cu_dtype_size(VL_CU_R_16BF), 2);
  /* cuBLAS CUBLAS_COMPUTE_32F: C of the operand type, or fp32 from 16-bit operands */
  assert_true(vl_cublas_types_ok(VL_CU_R_32F, VL_CU_R_32F));
  assert_true(vl_cublas_types_ok(VL_CU_R_16F, VL_CU_R_16F));
  assert_true(vl_cublas_types_ok(VL_CU_R_16F, VL_CU_R_32F));
  assert_true(vl_cublas_types_ok(VL_CU_R_16BF, VL_CU_R_16BF));
  assert_true(vl_cublas_types_ok(VL_CU_R_16BF, VL_CU_R_32F));
  assert_false(vl_cublas_types_ok(VL_CU_R_32F, VL_CU_R_16F));
  assert_false(vl_cublas_types_ok(VL_CU_R_32F, VL_CU_R_16BF));
  assert_false(vl_cublas_types_ok(VL_CU_R_16F, VL_CU_R_16BF));
  assert_false(vl_cublas_types_ok(VL_CU_R_16BF, VL_CU_R_16F));
}

/* A plan for (ad, bd, cd) on a small shape; returns the status. */
static vl_status plan_for(vl_dtype ad, vl_dtype bd, vl_dtype cd, bool ta, bool tb,
                          vl_cuda_gemm_plan *p, size_t *rule) {
  vl_tensor A = {0}, B = {0}, C = {0};
  A.dtype = ad; B.dtype = bd; C.dtype = cd;
  int64_t M = 8, N = 64, K = 16;
  B.n = K * N;
  vl_gemm g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = 1, .A = &A,
               .lda = ta ? M : K, .B = &B, .ldb = tb ? K : N, .C = &C, .ldc = N, .batch = 2,
               .sa = M * K, .sb = bd == VL_NF4 ? 0 : K * N, .sc = M * N};
  if (rule) *rule = vl_gemm_ws_cuda(&g);
  return vl_cuda_gemm_plan_make(&g, p);
}

static void test_plan_selection(void **state) {
  (void)state;
  vl_cuda_gemm_plan p;
  size_t rule;
  /* equal types: straight to cuBLAS, no workspace */
  assert_int_equal(plan_for(VL_F16, VL_F16, VL_F16, false, false, &p, &rule), VL_OK);
  assert_int_equal(p.path, VL_CU_PATH_CUBLAS);
  assert_int_equal(p.a_src, VL_CU_SRC_DIRECT);
  assert_int_equal(p.b_src, VL_CU_SRC_DIRECT);
  assert_int_equal(p.a_type, VL_CU_R_16F);
  assert_int_equal(p.c_type, VL_CU_R_16F);
  assert_int_equal(p.compute, VL_CU_COMPUTE_32F);
  assert_int_equal(p.ws_need, 0);
  assert_false(p.per_batch);
  assert_int_equal(plan_for(VL_BF16, VL_BF16, VL_F32, true, true, &p, NULL), VL_OK);
  assert_int_equal(p.path, VL_CU_PATH_CUBLAS);
  assert_int_equal(p.b_type, VL_CU_R_16BF);
  assert_int_equal(p.c_type, VL_CU_R_32F);
  /* mixed: the 16-bit operand goes to fp32 in the workspace, one batch at a time */
  assert_int_equal(plan_for(VL_BF16, VL_F32, VL_F32, false, false, &p, &rule), VL_OK);
  assert_int_equal(p.path, VL_CU_PATH_CUBLAS);
  assert_int_equal(p.a_src, VL_CU_SRC_CONVERT);
  assert_int_equal(p.b_src, VL_CU_SRC_DIRECT);
  assert_int_equal(p.a_type, VL_CU_R_32F);
  assert_int_equal(p.b_type, VL_CU_R_32F);
  assert_true(p.per_batch);
  assert_int_equal(p.ws_need, 4 * 8 * 16);
  assert_int_equal(p.ws_need, rule);
  assert_int_equal(plan_for(VL_F16, VL_BF16, VL_F32, false, true, &p, &rule), VL_OK);
  assert_int_equal(p.b_ws, 4 * 8 * 16);
  assert_int_equal(p.ws_need, 4 * (8 * 16 + 16 * 64));
  assert_int_equal(p.ws_need, rule);
  /* NF4: dequantised to A's 16-bit type, or fp32 for an fp32 A; shared by the batches */
  assert_int_equal(plan_for(VL_BF16, VL_NF4, VL_BF16, false, false, &p, &rule), VL_OK);
  assert_int_equal(p.path, VL_CU_PATH_CUBLAS);
  assert_int_equal(p.b_src, VL_CU_SRC_NF4);
  assert_int_equal(p.b_type, VL_CU_R_16BF);
  assert_int_equal(p.ws_need, 2 * 16 * 64);
  assert_false(p.per_batch);
  assert_int_equal(plan_for(VL_F32, VL_NF4, VL_F32, false, true, &p, &rule), VL_OK);
  assert_int_equal(p.b_type, VL_CU_R_32F);
  assert_int_equal(p.ws_need, 4 * 16 * 64);
  assert_true(p.ws_need <= rule);
  /* C types cuBLAS cannot write from the operand type: the generic kernel, no copies */
  assert_int_equal(plan_for(VL_F32, VL_F32, VL_BF16, false, false, &p, NULL), VL_OK);
  assert_int_equal(p.path, VL_CU_PATH_KERNEL);
  assert_int_equal(p.ws_need, 0);
  assert_int_equal(plan_for(VL_BF16, VL_F32, VL_BF16, false, false, &p, NULL), VL_OK);
  assert_int_equal(p.path, VL_CU_PATH_KERNEL);
  assert_int_equal(p.a_src, VL_CU_SRC_DIRECT);
  assert_int_equal(p.a_type, VL_CU_R_16BF);
  assert_int_equal(p.b_type, VL_CU_R_32F);
  assert_false(p.per_batch);
  /* NF4 only as B */
  assert_int_equal(plan_for(VL_NF4, VL_F32, VL_F32, false, false, &p, NULL), VL_ERR_UNSUPPORTED);
  assert_non_null(p.why);
  assert_int_equal(plan_for(VL_F32, VL_F32, VL_NF4, false, false, &p, NULL), VL_ERR_UNSUPPORTED);
}

/* Every combination: the plan stays within the planner's workspace rule, and a cuBLAS plan
 * only asks cuBLAS for a type combination it has. */
static void test_plan_all_combos(void **state) {
  (void)state;
  const vl_dtype ops[] = {VL_F32, VL_F16, VL_BF16}, bs[] = {VL_F32, VL_F16, VL_BF16, VL_NF4};
  for (int t = 0; t < 4; t++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 4; j++)
        for (int k = 0; k < 3; k++) {
          vl_cuda_gemm_plan p;
          size_t rule;
          assert_int_equal(plan_for(ops[i], bs[j], ops[k], t & 1, t >> 1, &p, &rule), VL_OK);
          assert_true(p.ws_need <= rule);
          if (p.path == VL_CU_PATH_CUBLAS) {
            assert_int_equal(p.a_type, p.b_type);
            assert_true(vl_cublas_types_ok(p.a_type, p.c_type));
          }
          assert_true(p.c_type == vl_cu_dtype_of(ops[k]));
        }
}

static void test_plan_nf4_must_be_whole(void **state) {
  (void)state;
  vl_tensor A = {0}, B = {0}, C = {0};
  A.dtype = VL_F16; B.dtype = VL_NF4; C.dtype = VL_F16;
  B.n = 16 * 64;
  vl_gemm g = {.M = 4, .N = 64, .K = 16, .A = &A, .lda = 16, .B = &B, .ldb = 64, .C = &C,
               .ldc = 64, .batch = 1};
  vl_cuda_gemm_plan p;
  assert_int_equal(vl_cuda_gemm_plan_make(&g, &p), VL_OK);
  g.ldb = 65;
  assert_int_equal(vl_cuda_gemm_plan_make(&g, &p), VL_ERR_UNSUPPORTED);
  g.ldb = 64; g.b_off = 64;
  assert_int_equal(vl_cuda_gemm_plan_make(&g, &p), VL_ERR_UNSUPPORTED);
}

/* The CUDA GEMM path run on the host: plan, dequantise / pack into a workspace of exactly
 * vl_gemm_ws_cuda bytes with the same single-source bodies the kernels use, map, then the
 * reference GEMM per call as cu_gemm issues them. Must match the CPU backend. */
static float *host_cuda_gemm(gemm_fix *f) {
  const vl_gemm *g = &f->g;
  vl_cuda_gemm_plan p;
  assert_int_equal(vl_cuda_gemm_plan_make(g, &p), VL_OK);
  size_t rule = vl_gemm_ws_cuda(g);
  assert_true(p.ws_need <= rule);
  char *ws = malloc(rule + 1);
  assert_non_null(ws);
  memset(ws, 0x7f, rule + 1); /* garbage: every byte used must be written first */
  void *C = malloc(f->C.bytes);
  assert_non_null(C);
  memcpy(C, f->C.data, f->C.bytes);
  vl_cublas_args a = vl_cuda_gemm_args(g, &p);
  assert_int_equal(vl_cublas_check(&a, NULL), VL_OK);
  const void *pa = p.a_src == VL_CU_SRC_DIRECT ? g->A->data : (const void *)(ws + p.a_ws);
  const void *pb = p.b_src == VL_CU_SRC_DIRECT ? g->B->data : (const void *)(ws + p.b_ws);
  if (p.b_src == VL_CU_SRC_NF4)
    for (int64_t i = 0; i < g->B->n; i++)
      vl_kg_nf4(ws + p.b_ws, vl_cu_dtype_k(p.b_type), g->B->data, g->B->n, i);
  int64_t calls = p.per_batch ? g->batch : 1;
  for (int64_t b = 0; b < calls; b++) {
    vl_cublas_args one = p.per_batch ? vl_cublas_slice(&a, b) : a;
    if (p.per_batch && p.a_src == VL_CU_SRC_CONVERT)
      for (int64_t i = 0; i < p.a_rows * p.a_cols; i++)
        vl_kg_pack(ws + p.a_ws, VL_K_F32, g->A->data, (int)g->A->dtype, g->a_off + b * g->sa,
                   g->lda, p.a_cols, i);
    if (p.per_batch && p.b_src == VL_CU_SRC_CONVERT)
      for (int64_t i = 0; i < p.b_rows * p.b_cols; i++)
        vl_kg_pack(ws + p.b_ws, VL_K_F32, g->B->data, (int)g->B->dtype, g->b_off + b * g->sb,
                   g->ldb, p.b_cols, i);
    bool fa = one.first == VL_CU_OPND_A, sa = one.second == VL_CU_OPND_A;
    assert_int_equal(vl_colmajor_ref_gemm_ex(&one, fa ? pa : pb,
                                             vl_cu_dtype_k(fa ? p.a_type : p.b_type),
                                             sa ? pa : pb, vl_cu_dtype_k(sa ? p.a_type : p.b_type),
                                             C, vl_cu_dtype_k(p.c_type), g->alpha, g->beta),
                     VL_OK);
  }
  assert_int_equal((unsigned char)ws[rule], 0x7f); /* nothing written past the rule */
  float *out = malloc(sizeof(float) * (size_t)f->nc);
  assert_non_null(out);
  for (int64_t i = 0; i < f->nc; i++) out[i] = vl_ld(C, (int)f->C.dtype, i);
  free(C);
  free(ws);
  return out;
}

static double nmse(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return den > 0 ? num / den : num;
}

static void test_host_cuda_path_mixed(void **state) {
  (void)state;
  const vl_dtype ops[] = {VL_F32, VL_F16, VL_BF16}, bs[] = {VL_F32, VL_F16, VL_BF16, VL_NF4};
  const shape s[] = {
      {false, false, 9, 64, 24, 2, 3, 5, 2, 4, 6, 8, 7, 3, 5, 0.8f, 0.5f},
      {true, true, 9, 64, 24, 3, 1, 0, 0, 0, 2, 1, 0, 4, 2, -1.2f, 0.0f},
      {true, false, 5, 128, 4, 1, 0, 2, 3, 1, 1, 1, 0, 0, 0, 1.0f, 1.0f},
  };
  for (size_t si = 0; si < sizeof s / sizeof s[0]; si++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 4; j++)
        for (int k = 0; k < 3; k++) {
          gemm_fix f;
          fix_make(&f, &s[si], ops[i], bs[j], ops[k]);
          float *cu = host_cuda_gemm(&f);
          float *cpu = cpu_gemm_result(&f);
          double e = nmse(cu, cpu, f.nc);
          /* the paths differ only by rounding: 16-bit C, NF4 dequantised to 16 bits */
          double lim = (ops[k] == VL_BF16 || (bs[j] == VL_NF4 && ops[i] == VL_BF16)) ? 1e-4
                       : (ops[k] == VL_F16 || bs[j] == VL_NF4) ? 1e-6 : 1e-10;
          if (!(e <= lim))
            print_error("shape %zu A %s B %s C %s: nmse %g > %g\n", si, vl_dtype_name(ops[i]),
                        vl_dtype_name(bs[j]), vl_dtype_name(ops[k]), e, lim);
          assert_true(e <= lim);
          free(cu);
          free(cpu);
          fix_free(&f);
        }
}

/* ---- launch geometry and arena size ------------------------------------------------------ */

static void test_grid(void **state) {
  (void)state;
  int b = -1;
  vl_cuda_grid(0, 256, 100, &b);      assert_int_equal(b, 1);
  vl_cuda_grid(-5, 256, 100, &b);     assert_int_equal(b, 1);
  vl_cuda_grid(1, 256, 100, &b);      assert_int_equal(b, 1);
  vl_cuda_grid(256, 256, 100, &b);    assert_int_equal(b, 1);
  vl_cuda_grid(257, 256, 100, &b);    assert_int_equal(b, 2);
  vl_cuda_grid(25600, 256, 100, &b);  assert_int_equal(b, 100);
  vl_cuda_grid(25601, 256, 100, &b);  assert_int_equal(b, 100);
  vl_cuda_grid(INT64_MAX, 256, 4096, &b); assert_int_equal(b, 4096); /* no overflow */
  vl_cuda_grid((int64_t)1 << 40, 1, INT_MAX, &b); assert_int_equal(b, INT_MAX);
  vl_cuda_grid(10, 0, 100, &b);       assert_int_equal(b, 10); /* threads < 1 -> 1 */
  vl_cuda_grid(10, 3, 0, &b);         assert_int_equal(b, 1);  /* max_blocks < 1 -> 1 */
  vl_cuda_grid(10, 3, 100, &b);       assert_int_equal(b, 4);
}

static void test_arena_bytes(void **state) {
  (void)state;
  assert_int_equal(vl_cuda_arena_bytes((size_t)1 << 30, 0), (size_t)1 << 30); /* the cap */
  assert_int_equal(vl_cuda_arena_bytes(1000, 0), 768);                           /* aligned down */
  size_t free_b = ((size_t)40 << 30) + 100;
  size_t want = (free_b - VL_CUDA_UNCAPPED_RESERVE) / VL_ARENA_ALIGN * VL_ARENA_ALIGN;
  assert_int_equal(vl_cuda_arena_bytes(VL_NO_CAP, free_b), want);
  assert_int_equal(vl_cuda_arena_bytes(VL_NO_CAP, VL_CUDA_UNCAPPED_RESERVE), 0);
  assert_int_equal(vl_cuda_arena_bytes(VL_NO_CAP, 10), 0);
  assert_int_equal(vl_cuda_arena_bytes(VL_NO_CAP, 0), 0);
}

/* Without a CUDA build there is no backend and no device; with one, the backend has every
 * op (a CUDA-less machine still reports no device). */
static void test_backend_entry(void **state) {
  (void)state;
  const vl_backend *be = vl_backend_cuda();
#ifdef VRAMLAB_HAVE_CUDA
  assert_non_null(be);
  assert_int_equal(be->device, VL_DEV_CUDA);
  assert_non_null(be->init); assert_non_null(be->fini); assert_non_null(be->sync);
  assert_non_null(be->fixed_ws_bytes); assert_non_null(be->upload); assert_non_null(be->download);
  assert_non_null(be->timer_start); assert_non_null(be->timer_stop);
  assert_non_null(be->host_alloc); assert_non_null(be->host_free); assert_non_null(be->upload_async);
  for (int op = 0; op < VL_OP_COUNT; op++) /* every operation has a CUDA kernel */
    if (!be->ops[op]) {
      print_error("the cuda backend lacks %s\n", vl_op_name((vl_op)op));
      fail();
    }
  assert_int_equal(be->fixed_ws_bytes(NULL), VL_CUBLAS_WORKSPACE_BYTES);
#else
  assert_null(be);
  assert_false(vl_cuda_available());
#endif
}

/* ---- cuDNN convolution plan and descriptors ------------------------------------------- */

static void test_conv_plan(void **state) {
  (void)state;
  vl_conv cv;
  assert_true(vl_conv_init(&cv, 8, 256, 128, 128, 64, 1, 1, 1, 0, 1));
  vl_cuda_conv_plan p;
  /* fp32 everywhere: no copies; the budget is the larger activation, capped at 64 MiB */
  assert_int_equal(vl_cuda_conv_plan_make(&cv, VL_CONV_FWD, false, &p), VL_OK);
  assert_int_equal(p.io, VL_CU_R_32F);
  assert_false(p.tensor_op); /* fp32: cuDNN's default math, no TF32 */
  assert_int_equal(p.w_copy + p.dw_copy, 0);
  assert_int_equal(p.algo_ws, (size_t)VL_CUDNN_ALGO_WS_MAX); /* x is 128 MiB */
  assert_int_equal(p.ws_total, vl_conv_ws_cuda(&cv, VL_CONV_FWD, false));
  /* AMP: fp16 activations, fp32 master weights -> an fp16 weight copy for fwd and bwd data;
   * the fp32 weight gradient goes through an fp16 buffer */
  cv.xdt = VL_F16; cv.wdt = VL_F32; cv.gdt = VL_F32;
  assert_int_equal(vl_cuda_conv_plan_make(&cv, VL_CONV_BWD_DATA, false, &p), VL_OK);
  assert_int_equal(p.io, VL_CU_R_16F);
  assert_true(p.tensor_op); /* 16-bit io: tensor-core kernels asked for */
  assert_int_equal(p.w_copy, 64 * 256 * 2);
  assert_int_equal(p.dw_copy, 0);
  assert_int_equal(vl_cuda_conv_plan_make(&cv, VL_CONV_BWD_WEIGHT, true, &p), VL_OK);
  assert_int_equal(p.w_copy, 0);
  assert_int_equal(p.dw_copy, 64 * 256 * 2);
  cv.wdt = VL_F16; cv.gdt = VL_F16; /* gradient in the io dtype: cuDNN's beta accumulates */
  assert_int_equal(vl_cuda_conv_plan_make(&cv, VL_CONV_BWD_WEIGHT, true, &p), VL_OK);
  assert_int_equal(p.dw_copy, 0);
  /* small activations: the budget is the larger of x and y, rounded to 256 bytes */
  assert_true(vl_conv_init(&cv, 1, 3, 5, 5, 7, 3, 3, 2, 1, 1));
  assert_int_equal(vl_cuda_conv_plan_make(&cv, VL_CONV_FWD, false, &p), VL_OK);
  assert_int_equal(p.algo_ws, 512); /* max(x 3*5*5*4 = 300, y 7*3*3*4 = 252) -> 512 */
  cv.xdt = cv.wdt = cv.gdt = VL_BF16;
  assert_int_equal(vl_cuda_conv_plan_make(&cv, VL_CONV_FWD, false, &p), VL_OK);
  assert_true(p.tensor_op);
  cv.xdt = cv.gdt = VL_F32;
  cv.wdt = VL_NF4;
  assert_int_equal(vl_cuda_conv_plan_make(&cv, VL_CONV_FWD, false, &p), VL_ERR_INVALID);
  assert_int_equal(vl_conv_ws_cuda(&cv, VL_CONV_FWD, false), 0);
}

static void test_cudnn_descs(void **state) {
  (void)state;
  int d[4], s[4];
  vl_cudnn_nchw(2, 3, 5, 7, d, s);
  assert_int_equal(d[0], 2); assert_int_equal(d[3], 7);
  assert_int_equal(s[0], 105); assert_int_equal(s[1], 35); assert_int_equal(s[2], 7); assert_int_equal(s[3], 1);
  vl_conv cv;
  assert_true(vl_conv_init(&cv, 1, 4, 9, 9, 4, 3, 3, 2, 2, 2));
  int pad[2], st[2], dil[2];
  vl_cudnn_conv_params(&cv, pad, st, dil);
  assert_int_equal(pad[1], 2); assert_int_equal(st[0], 2); assert_int_equal(dil[1], 2);
  assert_true(vl_cudnn_fits_int(&cv));
  assert_true(vl_conv_init(&cv, 4096, 256, 1024, 1024, 8, 1, 1, 1, 0, 1));
  assert_false(vl_cudnn_fits_int(&cv));
}

/* The cuDNN algorithm cache: asked once per problem (every field of the problem and the
 * direction in its key), the answer is the algorithm with its math type, answers kept
 * across growth; 300 distinct problems (the table grows from 64 four times). */
static void test_algo_cache(void **state) {
  (void)state;
  vl_cuda_algo_cache c = {0};
  vl_conv cv;
  vl_cuda_algo a = {-1, -1};
  assert_true(vl_conv_init(&cv, 8, 64, 32, 32, 128, 3, 3, 1, 1, 1));
  assert_false(vl_cuda_algo_get(&c, &cv, VL_CONV_FWD, &a)); /* empty: no answer */
  assert_int_equal(vl_cuda_algo_put(&c, &cv, VL_CONV_FWD, (vl_cuda_algo){6, 1}), VL_OK);
  assert_true(vl_cuda_algo_get(&c, &cv, VL_CONV_FWD, &a));
  assert_int_equal(a.algo, 6);
  assert_int_equal(a.math, 1);
  /* any field of the problem, or the direction, is a different problem */
  vl_conv o = cv;
  o.xdt = VL_F16;
  assert_false(vl_cuda_algo_get(&c, &o, VL_CONV_FWD, &a));
  o = cv;
  o.pad = 0;
  assert_false(vl_cuda_algo_get(&c, &o, VL_CONV_FWD, &a));
  o = cv;
  o.gdt = VL_BF16;
  assert_false(vl_cuda_algo_get(&c, &o, VL_CONV_FWD, &a));
  assert_false(vl_cuda_algo_get(&c, &cv, VL_CONV_BWD_DATA, &a));
  /* overwrite keeps one entry, the math type with it */
  assert_int_equal(vl_cuda_algo_put(&c, &cv, VL_CONV_FWD, (vl_cuda_algo){1, 0}), VL_OK);
  assert_true(vl_cuda_algo_get(&c, &cv, VL_CONV_FWD, &a));
  assert_int_equal(a.algo, 1);
  assert_int_equal(a.math, 0);
  assert_int_equal((int)c.n, 1);
  for (int i = 0; i < 300; i++) {
    assert_true(vl_conv_init(&o, 1 + i % 7, 3 + i, 16, 16, 8 + i % 5, 3, 3, 1 + i % 2, 1, 1));
    assert_int_equal(vl_cuda_algo_put(&c, &o, i % 3, (vl_cuda_algo){i, i % 2}), VL_OK);
  }
  assert_int_equal((int)c.n, 301);
  assert_true(2 * c.n <= c.cap);
  for (int i = 0; i < 300; i++) {
    assert_true(vl_conv_init(&o, 1 + i % 7, 3 + i, 16, 16, 8 + i % 5, 3, 3, 1 + i % 2, 1, 1));
    assert_true(vl_cuda_algo_get(&c, &o, i % 3, &a));
    assert_int_equal(a.algo, i);
    assert_int_equal(a.math, i % 2);
  }
  assert_true(vl_cuda_algo_get(&c, &cv, VL_CONV_FWD, &a));
  assert_int_equal(a.algo, 1);
  vl_cuda_algo_cache_free(&c);
  assert_false(vl_cuda_algo_get(&c, &cv, VL_CONV_FWD, &a));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_map_matches_cpu),
      cmocka_unit_test(test_unswapped_map_fails),
      cmocka_unit_test(test_map_fields),
      cmocka_unit_test(test_extents),
      cmocka_unit_test(test_cublas_check),
      cmocka_unit_test(test_ref_beta0_ignores_c),
      cmocka_unit_test(test_dtype_maps),
      cmocka_unit_test(test_plan_selection),
      cmocka_unit_test(test_plan_all_combos),
      cmocka_unit_test(test_plan_nf4_must_be_whole),
      cmocka_unit_test(test_host_cuda_path_mixed),
      cmocka_unit_test(test_grid),
      cmocka_unit_test(test_arena_bytes),
      cmocka_unit_test(test_backend_entry),
      cmocka_unit_test(test_conv_plan),
      cmocka_unit_test(test_cudnn_descs),
      cmocka_unit_test(test_algo_cache),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
