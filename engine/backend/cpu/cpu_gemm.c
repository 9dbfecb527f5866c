/* The CPU backend's GEMM (VL_OP_GEMM): OpenBLAS sgemm on fp32 operands, threaded by us.
 *
 * Why not OpenBLAS's own threads: its threaded level-3 driver synchronises its threads
 * many times inside one call (per packed panel), and for this engine's shapes (1024 rows by
 * 64..4096 columns, head-batched attention products 512 x 128 x 32) those waits cost more
 * than the arithmetic, badly so when the cores are shared (2-thread OpenBLAS ran 1024 x 256
 * x 256 at 20-30% of its single-thread speed at load 4 on 2 cores). Here a call is cut into
 * a fixed number of slices (the team size, or 1 below SLICE_FLOPS): contiguous rows of C or
 * columns of C, or whole batches; each slice is one single-threaded sgemm (OpenBLAS's
 * OpenMP build runs single-threaded inside a parallel region), and the threads that run
 * (vl_cpu_threads: all of the team, or 1 when forking costs more than it saves) take
 * contiguous runs of slices: one fork and one join per call, no other synchronisation
 * unless an operand every slice reads needs converting. The slices depend only on the
 * shapes and the team size, so the result does not depend on how many threads ran them.
 *
 * Non-fp32 operands are converted into the fp32 workspace (sizes: vl_gemm_ws_cpu, the same
 * as before): each slice converts the part of an operand that only it reads (A's rows when
 * C's rows are split, B's columns when C's columns are; its part of C); an operand every
 * slice reads is converted by the threads together, behind one barrier. */
#include <cblas.h>
#include <stdio.h>
#include <omp.h>
#include <stdbool.h>

#include "vramlab/backend.h"
#include "cpu_internal.h"
#include "../../kernels/kcommon.h"
#include "../../kernels/nf4.h"

/* Below this many FLOPs a call is one slice (slicing would only repack operands). */
#define SLICE_FLOPS 2.0e6
/* Slices are multiples of this many rows or columns (OpenBLAS's micro-kernel tiles). */
#define GEMM_ALIGN 16

typedef struct {
  const vl_gemm *g;
  float *wa, *wb, *wc;          /* fp32 scratch of a non-fp32 operand; NULL: used in place */
  int64_t arows, acols;         /* A as stored: (K, M) when ta, else (M, K) */
  int64_t brows, bcols;         /* B as stored: (N, K) when tb, else (K, N) */
  bool split_m;                 /* slices are rows of C (else columns) */
  bool by_batch;                /* threads take whole batches (fp32 only) */
  int slices;                   /* of each batch, when not by_batch */
} gemm_plan;

/* dst[r * cols + k] = src[off + r * ld + k] as fp32 for r in [r0, r1), k in [k0, k1): part
 * of a (rows, cols) operand converted into its packed fp32 copy, in place in that copy. */
static void conv_rect(float *dst, const vl_tensor *t, int64_t off, int64_t ld, int64_t cols,
                      int64_t r0, int64_t r1, int64_t k0, int64_t k1) {
  int d = (int)t->dtype;
  if (t->dtype == VL_NF4) { /* whole contiguous matrix: element index = r * cols + k */
    const uint8_t *q = t->data;
    for (int64_t r = r0; r < r1; r++)
      for (int64_t k = k0; k < k1; k++) dst[r * cols + k] = vl_nf4_get(q, t->n, r * cols + k);
    return;
  }
  /* the dtype as a constant: the conversions vectorise (F16C / bf16 shifts) */
#define CONV_RECT(D)                                                                       \
  for (int64_t r = r0; r < r1; r++)                                                        \
    for (int64_t k = k0; k < k1; k++) dst[r * cols + k] = vl_ld(t->data, D, off + r * ld + k)
  if (d == VL_K_F16) CONV_RECT(VL_K_F16);
  else if (d == VL_K_BF16) CONV_RECT(VL_K_BF16);
  else CONV_RECT(d);
#undef CONV_RECT
}

/* C's rows [m0, m1) x columns [n0, n1) from the fp32 scratch wc (ld N) into its dtype. */
static void store_rect(const vl_gemm *g, const float *wc, int64_t coff, int64_t m0, int64_t m1,
                       int64_t n0, int64_t n1) {
  int dc = (int)g->C->dtype;
  void *cd = g->C->data;
#define STORE_RECT(D)                                                                      \
  for (int64_t r = m0; r < m1; r++)                                                        \
    for (int64_t k = n0; k < n1; k++) vl_st(cd, D, coff + r * g->ldc + k, wc[r * g->N + k])
  if (dc == VL_K_F16) STORE_RECT(VL_K_F16);
  else if (dc == VL_K_BF16) STORE_RECT(VL_K_BF16);
  else STORE_RECT(dc);
#undef STORE_RECT
}

/* Part k of n of an extent, in whole tiles of `al`: [lo, hi). */
static void share(int64_t extent, int64_t al, int k, int n, int64_t *lo, int64_t *hi) {
  int64_t tiles = (extent + al - 1) / al;
  int64_t t0 = tiles * k / n, t1 = tiles * (k + 1) / n;
  *lo = t0 * al < extent ? t0 * al : extent;
  *hi = t1 * al < extent ? t1 * al : extent;
}

static void sgemm(const vl_gemm *g, int64_t M, int64_t N, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *c, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
              (blasint)M, (blasint)N, (blasint)g->K, g->alpha, a, (blasint)lda, b, (blasint)ldb,
              g->beta, c, (blasint)ldc);
}

/* Batch b's slice [lo, hi) (rows of C when split_m, else columns) on this thread. The
 * operand that the slices share, when it needs converting, was converted by the team. */
static void slice(const gemm_plan *p, int64_t b, int64_t lo, int64_t hi) {
  const vl_gemm *g = p->g;
  if (hi <= lo) return;
  int64_t aoff = g->a_off + b * g->sa, boff = g->b_off + b * g->sb, coff = g->c_off + b * g->sc;
  const float *pa = p->wa ? p->wa : (const float *)g->A->data + aoff;
  const float *pb = p->wb ? p->wb : (const float *)g->B->data + boff;
  int64_t lda = p->wa ? p->acols : g->lda, ldb = p->wb ? p->bcols : g->ldb;
  int64_t ldc = p->wc ? g->N : g->ldc;
  float *pc = p->wc ? p->wc : (float *)g->C->data + coff;
  int64_t m0 = p->split_m ? lo : 0, m1 = p->split_m ? hi : g->M;
  int64_t n0 = p->split_m ? 0 : lo, n1 = p->split_m ? g->N : hi;
  /* this slice's own parts of the converted operands */
  if (p->wa && p->split_m) {
    if (g->ta) conv_rect(p->wa, g->A, aoff, g->lda, p->acols, 0, p->arows, m0, m1);
    else conv_rect(p->wa, g->A, aoff, g->lda, p->acols, m0, m1, 0, p->acols);
  }
  if (p->wb && !p->split_m && g->B->dtype != VL_NF4) { /* an NF4 B is converted whole */
    if (g->tb) conv_rect(p->wb, g->B, boff, g->ldb, p->bcols, n0, n1, 0, p->bcols);
    else conv_rect(p->wb, g->B, boff, g->ldb, p->bcols, 0, p->brows, n0, n1);
  }
  if (p->wc && g->beta != 0.0f) conv_rect(p->wc, g->C, coff, g->ldc, g->N, m0, m1, n0, n1);
  const float *a = g->ta ? pa + m0 : pa + m0 * lda;
  const float *bb = g->tb ? pb + n0 * ldb : pb + n0;
  float *c = pc + m0 * ldc + n0;
  sgemm(g, m1 - m0, n1 - n0, a, lda, bb, ldb, c, ldc);
  if (p->wc) store_rect(g, p->wc, coff, m0, m1, n0, n1);
}

static void team_barrier(int nt) {
  if (nt > 1) {
#pragma omp barrier
  }
}

/* The operand every slice reads whole, when it needs converting, for batch b: thread tid
 * of nt converts its share of the stored rows. Returns whether there was one. An NF4 B is
 * one matrix for every batch, dequantised before the first (team_part). */
static bool shared_convert(const gemm_plan *p, int64_t b, int tid, int nt) {
  const vl_gemm *g = p->g;
  int64_t lo, hi;
  if (p->wa && !p->split_m) {
    share(p->arows, 1, tid, nt, &lo, &hi);
    conv_rect(p->wa, g->A, g->a_off + b * g->sa, g->lda, p->acols, lo, hi, 0, p->acols);
    return true;
  }
  if (p->wb && p->split_m && g->B->dtype != VL_NF4) {
    share(p->brows, 1, tid, nt, &lo, &hi);
    conv_rect(p->wb, g->B, g->b_off + b * g->sb, g->ldb, p->bcols, lo, hi, 0, p->bcols);
    return true;
  }
  return false;
}

/* Thread tid of nt: every batch, its run of slices; or its run of whole batches. */
static void team_part(const gemm_plan *p, int tid, int nt) {
  const vl_gemm *g = p->g;
  if (p->by_batch) {
    int64_t b0 = g->batch * tid / nt, b1 = g->batch * (tid + 1) / nt;
    for (int64_t b = b0; b < b1; b++) slice(p, b, 0, p->split_m ? g->M : g->N);
    return;
  }
  if (p->wb && g->B->dtype == VL_NF4) {
    int64_t lo, hi;
    share(p->brows, 1, tid, nt, &lo, &hi);
    conv_rect(p->wb, g->B, 0, p->bcols, p->bcols, lo, hi, 0, p->bcols);
    team_barrier(nt);
  }
  int s0 = p->slices * tid / nt, s1 = p->slices * (tid + 1) / nt;
  for (int64_t b = 0; b < g->batch; b++) {
    bool shared = shared_convert(p, b, tid, nt);
    if (shared) team_barrier(nt);
    for (int k = s0; k < s1; k++) {
      int64_t lo, hi;
      share(p->split_m ? g->M : g->N, GEMM_ALIGN, k, p->slices, &lo, &hi);
      slice(p, b, lo, hi);
    }
    /* the shared copy is rewritten for the next batch once every slice has read it */
    if (shared && b + 1 < g->batch) team_barrier(nt);
  }
}

/* Whether the batches write disjoint parts of C (so threads may take whole batches): C
 * blocks one after another, or heads interleaved within rows ((B, T, H*D) outputs). */
static bool batches_disjoint(const vl_gemm *g) {
  if (g->batch <= 1) return true;
  int64_t span = (g->M - 1) * g->ldc + g->N;
  return g->sc >= span || (g->sc >= g->N && (g->batch - 1) * g->sc + g->N <= g->ldc);
}

static vl_status vl_cpu_gemm(vl_ctx *c, const void *args) {
  const vl_gemm *g = args;
  if (g->ws_bytes < vl_gemm_ws_cpu(g))
    return vl_fail(c, VL_ERR_INVALID, "gemm workspace %zu < %zu", g->ws_bytes, vl_gemm_ws_cpu(g));
  if (g->B->dtype == VL_NF4 && (g->b_off != 0 || g->ldb != (g->tb ? g->K : g->N) ||
                                (size_t)(g->K * g->N) != (size_t)g->B->n))
    return vl_fail(c, VL_ERR_UNSUPPORTED, "nf4 gemm operand must be a whole contiguous matrix");
  if (g->batch <= 0 || g->M <= 0 || g->N <= 0) return VL_OK;
  gemm_plan p = {.g = g, .arows = g->ta ? g->K : g->M, .acols = g->ta ? g->M : g->K,
                 .brows = g->tb ? g->N : g->K, .bcols = g->tb ? g->K : g->N};
  float *ws = g->ws;
  if (g->A->dtype != VL_F32) { p.wa = ws; ws += p.arows * p.acols; }
  if (g->B->dtype != VL_F32) {
    p.wb = ws;
    ws += g->B->dtype == VL_NF4 ? g->B->n : p.brows * p.bcols;
  }
  if (g->C->dtype != VL_F32) p.wc = ws;
  int team = vl_cpu_team();
  double flops = 2.0 * (double)g->M * (double)g->N * (double)g->K * (double)g->batch;
  bool converts = p.wa || p.wb || p.wc;
  /* whole batches per thread when they divide evenly enough and nothing is converted
   * (the scratch holds one batch); else slices of the larger side of C, or of the side
   * whose operand needs converting, so that each slice converts only its own part */
  p.by_batch = !converts && team > 1 && (g->batch % team == 0 || g->batch >= 4 * team) &&
               batches_disjoint(g);
  p.slices = flops < SLICE_FLOPS ? 1 : team;
  if (p.wa && !p.wb) p.split_m = true;
  else if (p.wb && !p.wa) p.split_m = false;
  else p.split_m = g->M >= g->N;
  int nt = p.by_batch || p.slices > 1 ? vl_cpu_threads(flops * NS_FLOP) : 1;
  if (nt == 1) {
    /* outside a parallel region OpenBLAS's OpenMP build would thread the call itself (over
     * omp_get_max_threads()): one thread means one here */
    int team_icv = omp_get_max_threads();
    if (team_icv > 1) omp_set_num_threads(1);
    team_part(&p, 0, 1);
    if (team_icv > 1) omp_set_num_threads(team_icv);
    return VL_OK;
  }
  double t0 = vl_now(), own = 0;
#pragma omp parallel num_threads(nt)
  {
    int tid = omp_get_thread_num();
    team_part(&p, tid, omp_get_num_threads());
    if (tid == 0) own = vl_now() - t0;
  }
  vl_cpu_par_observe(vl_now() - t0, own);
  return VL_OK;
}

/* OpenBLAS picks its sgemm kernel by CPU core type ("Haswell", "Zen", "SkylakeX"): two
 * hosts whose cores differ may round a GEMM differently. */
void vl_cpu_blas_key(char *out, size_t n) {
  const char *core = openblas_get_corename();
  snprintf(out, n, "openblas-%s", core && *core ? core : "unknown");
}

void vl_cpu_gemm_ops(vl_backend *b) {
  b->ops[VL_OP_GEMM] = vl_cpu_gemm;
}
