/* Shared helpers for the cmocka tests. */
#ifndef VRAMLAB_TESTUTIL_H
#define VRAMLAB_TESTUTIL_H
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "vramlab/core.h"

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
#endif
