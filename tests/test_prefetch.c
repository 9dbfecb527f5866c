/* The prefetching batch producer (engine/data/prefetch.c): batches arrive in order, each
 * once, with the same contents for any worker count and prefetch depth; a failed fill is
 * delivered at its batch and stays; misuse is refused; stopping mid-way joins the workers. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/prefetch.h"

typedef struct {
  int64_t fail_at;  /* -1: never */
  int64_t filled[4096];
} fill_user;

/* batch k: 16 int64 values k*1000 + i; batch fail_at fails */
static vl_status fill(void *user, int worker, int64_t k, void *buf, vl_err *err) {
  fill_user *u = user;
  (void)worker;
  if (k == u->fail_at) {
    return vl_err_set(err, VL_ERR_IO, "batch %lld: record 7 is corrupt", (long long)k);
  }
  int64_t *v = buf;
  for (int i = 0; i < 16; i++) v[i] = k * 1000 + i;
  __atomic_add_fetch(&u->filled[k], 1, __ATOMIC_RELAXED);
  return VL_OK;
}

static void in_order(int workers, int prefetch, int64_t n) {
  fill_user u = {.fail_at = -1};
  vl_prefetch_cfg cfg = {workers, prefetch, 16 * sizeof(int64_t), n, fill, &u};
  vl_prefetch *p;
  vl_err err;
  assert_int_equal(vl_prefetch_create(&p, &cfg, &err), VL_OK);
  int64_t seen = 0;
  for (;;) {
    void *buf;
    int64_t k;
    double wait;
    assert_int_equal(vl_prefetch_next(p, &buf, &k, &wait, &err), VL_OK);
    if (!buf) break;
    assert_int_equal(k, seen);
    const int64_t *v = buf;
    for (int i = 0; i < 16; i++) assert_int_equal(v[i], k * 1000 + i);
    assert_true(wait >= 0);
    vl_prefetch_release(p, buf);
    seen++;
  }
  assert_int_equal(seen, n);
  for (int64_t k = 0; k < n; k++) assert_int_equal(u.filled[k], 1); /* each filled once */
  vl_prefetch_destroy(p);
}

static void test_order_every_batch_once(void **state) {
  (void)state;
  const int w[] = {0, 1, 2, 5}, pf[] = {1, 2, 3};
  for (size_t i = 0; i < sizeof w / sizeof *w; i++)
    for (size_t j = 0; j < sizeof pf / sizeof *pf; j++) {
      in_order(w[i], pf[j], 97);
      in_order(w[i], pf[j], 1);
      in_order(w[i], pf[j], 0);
    }
}

static void test_failed_fill_delivered_in_place(void **state) {
  (void)state;
  for (int workers = 0; workers <= 3; workers += 3) {
    fill_user u = {.fail_at = 5};
    vl_prefetch_cfg cfg = {workers, 2, 128, 40, fill, &u};
    vl_prefetch *p;
    vl_err err;
    assert_int_equal(vl_prefetch_create(&p, &cfg, &err), VL_OK);
    void *buf;
    int64_t k;
    double wait;
    for (int64_t i = 0; i < 5; i++) {
      assert_int_equal(vl_prefetch_next(p, &buf, &k, &wait, &err), VL_OK);
      assert_int_equal(k, i);
      vl_prefetch_release(p, buf);
    }
    for (int again = 0; again < 2; again++) { /* sticky */
      err.msg[0] = 0;
      assert_int_equal(vl_prefetch_next(p, &buf, &k, &wait, &err), VL_ERR_IO);
      assert_null(buf);
      assert_non_null(strstr(err.msg, "batch 5: record 7 is corrupt"));
    }
    vl_prefetch_destroy(p);
  }
}

static void test_misuse_and_early_stop(void **state) {
  (void)state;
  fill_user u = {.fail_at = -1};
  vl_err err;
  vl_prefetch *p;
  vl_prefetch_cfg bad = {2, 0, 128, 10, fill, &u};
  assert_int_equal(vl_prefetch_create(&p, &bad, &err), VL_ERR_INVALID);
  assert_non_null(strstr(err.msg, "prefetch 0"));
  bad = (vl_prefetch_cfg){-1, 2, 128, 10, fill, &u};
  assert_int_equal(vl_prefetch_create(&p, &bad, &err), VL_ERR_INVALID);
  bad = (vl_prefetch_cfg){2, 2, 128, 10, NULL, &u};
  assert_int_equal(vl_prefetch_create(&p, &bad, &err), VL_ERR_INVALID);
  /* two batches taken without releasing the first: refused, not a deadlock */
  vl_prefetch_cfg cfg = {3, 2, 128, 1000, fill, &u};
  assert_int_equal(vl_prefetch_create(&p, &cfg, &err), VL_OK);
  void *buf;
  int64_t k;
  double wait;
  assert_int_equal(vl_prefetch_next(p, &buf, &k, &wait, &err), VL_OK);
  assert_int_equal(vl_prefetch_next(p, &buf, &k, &wait, &err), VL_ERR_INVALID);
  assert_non_null(strstr(err.msg, "not released"));
  /* stopped with 999 batches to go: the workers are joined, at most slots - 1 filled ahead */
  vl_prefetch_destroy(p);
  int64_t filled = 0;
  for (int i = 0; i < 1000; i++) filled += u.filled[i];
  assert_true(filled <= 3 * 2 + 1);
  assert_int_equal(vl_prefetch_host_bytes(&cfg), 7 * 128);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_every_batch_once),
      cmocka_unit_test(test_failed_fill_delivered_in_place),
      cmocka_unit_test(test_misuse_and_early_stop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
