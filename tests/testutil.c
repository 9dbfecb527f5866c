#include "testutil.h"

#include <math.h>
#include <stdio.h>

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
