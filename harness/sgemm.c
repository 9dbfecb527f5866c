/* The sgemm benchmark (sgemm.h): a harness measurement, not a case's. */
#include "sgemm.h"

#include "vramlab/backend.h"
#include "vramlab/nn.h"

#include <stdlib.h>
#include <string.h>

double vl_bench_sgemm(int n, int reps) {
  vl_ctx *c;
  if (vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP)) return 0;
  vl_tensor a, b, d;
  double best = 0;
  if (!vl_tensor_alloc2(c, &a, VL_F32, VL_MEM_TEMP, n, n) &&
      !vl_tensor_alloc2(c, &b, VL_F32, VL_MEM_TEMP, n, n) &&
      !vl_tensor_alloc2(c, &d, VL_F32, VL_MEM_TEMP, n, n)) {
    vl_rng r;
    vl_rng_seed(&r, 3);
    float *pa = a.data, *pb = b.data;
    for (int64_t i = 0; i < (int64_t)n * n; i++) { pa[i] = vl_rng_normal(&r); pb[i] = vl_rng_normal(&r); }
    for (int i = 0; i < reps + 1; i++) {
      vl_gemm g = {.M = n, .N = n, .K = n, .alpha = 1, .beta = 0, .A = &a, .lda = n, .B = &b,
                   .ldb = n, .C = &d, .ldc = n, .batch = 1};
      double t0 = vl_now();
      vl_gemm_run(c, &g);
      double dt = vl_now() - t0;
      double f = 2.0 * n * (double)n * n / dt;
      if (i > 0 && f > best) best = f; /* first call warms up threads and pages */
    }
  }
  vl_ctx_destroy(c);
  return best;
}

/* Best of reps copies of a bytes-sized buffer (after one warm-up copy): bytes read plus bytes
 * written per second; 0 when the buffers cannot be had. */
double vl_bench_copy_bw(size_t bytes, int reps) {
  char *src = malloc(bytes), *dst = malloc(bytes);
  double best = 0;
  if (src && dst) {
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    for (int i = 0; i < reps + 1; i++) {
      double t0 = vl_now();
      memcpy(dst, src, bytes);
      double dt = vl_now() - t0;
      /* keep the copy observable: a compiler may not drop it */
      __asm__ volatile("" : : "r"(dst) : "memory");
      if (i > 0 && dt > 0 && 2.0 * (double)bytes / dt > best) best = 2.0 * (double)bytes / dt;
    }
  }
  free(src);
  free(dst);
  return best;
}
