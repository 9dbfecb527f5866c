/* The largest batch that fits: a monotone predicate searched by doubling then bisection. */
#include "vramlab/run.h"

int64_t vl_run_max_true(bool (*pred)(void *user, int64_t b), void *user, int64_t lo, int64_t limit) {
  if (!pred(user, lo)) return 0;
  int64_t hi = 2 * lo;
  while (hi <= limit && pred(user, hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > limit) return lo;
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) / 2;
    if (pred(user, mid)) lo = mid;
    else hi = mid;
  }
  return lo;
}

typedef struct {
  vl_step_spec spec; /* a copy: its batch is set per probe */
  size_t cap;
} batch_probe;

static bool fits_batch(void *user, int64_t B) {
  batch_probe *p = user;
  vl_step_spec_set_batch(&p->spec, B);
  return vl_run_fits(&p->spec, p->cap);
}

int64_t vl_run_max_batch(const vl_step_spec *s, size_t cap, int64_t lo) {
  batch_probe p = {*s, cap};
  return vl_run_max_true(fits_batch, &p, lo, VL_MAX_BATCH_SEARCH);
}
