/* Core: the arena (best fit, coalescing, alignment, cap, statistics, event log, virtual vs
 * host), dtypes and fp16/bf16 conversion, byte parsing, the RNG, status names and the NF4
 * storage format. References are computed here in double precision. */
#include "testutil.h"

#include <float.h>
#include <omp.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kcommon.h"
#include "kernels/nf4.h"
#include "vramlab/quant.h"

#define A VL_ARENA_ALIGN

/* ============================== arena ============================================== */

static vl_arena *mk_arena(vl_arena_mode mode, size_t cap) {
  vl_arena *a = NULL;
  assert_int_equal(vl_arena_create(&a, mode, cap, NULL), VL_OK);
  assert_non_null(a);
  return a;
}

static size_t xalloc(vl_arena *a, size_t bytes, vl_mem_cat cat) {
  size_t off = SIZE_MAX;
  assert_int_equal(vl_arena_alloc(a, bytes, cat, &off), VL_OK);
  return off;
}

/* Holes of 4, 2 and 2 units (in that address order) then requests of 2, 2 and 3 units:
 * best fit takes the smallest hole that holds the request, the lowest one on ties. */
static void test_arena_best_fit(void **state) {
  (void)state;
  vl_arena *a = mk_arena(VL_ARENA_HOST, VL_NO_CAP);
  size_t h4 = xalloc(a, 4 * A, VL_MEM_TEMP);
  size_t g1 = xalloc(a, A, VL_MEM_TEMP);
  size_t h2a = xalloc(a, 2 * A, VL_MEM_TEMP);
  size_t g2 = xalloc(a, A, VL_MEM_TEMP);
  size_t h2b = xalloc(a, 2 * A, VL_MEM_TEMP);
  size_t g3 = xalloc(a, A, VL_MEM_TEMP);
  /* A fresh arena packs from 0 upwards. */
  assert_int_equal(h4, 0);
  assert_int_equal(g1, 4 * A);
  assert_int_equal(h2a, 5 * A);
  assert_int_equal(g2, 7 * A);
  assert_int_equal(h2b, 8 * A);
  assert_int_equal(g3, 10 * A);
  vl_arena_free(a, h4);
  vl_arena_free(a, h2a);
  vl_arena_free(a, h2b);
  /* 2 units: both 2-unit holes fit exactly; the lower one wins, not the 4-unit hole. */
  assert_int_equal(xalloc(a, 2 * A, VL_MEM_ACTS), h2a);
  /* Next 2 units (asked as 1.5 units, rounded up): the other 2-unit hole. */
  assert_int_equal(xalloc(a, A + A / 2, VL_MEM_ACTS), h2b);
  /* 3 units: only the 4-unit hole (smaller than the tail) fits. */
  assert_int_equal(xalloc(a, 3 * A, VL_MEM_ACTS), h4);
  /* 2 units now: no hole holds it (one unit is left at 3A), so it goes to the tail. */
  assert_int_equal(xalloc(a, 2 * A, VL_MEM_ACTS), 11 * A);
  /* 1 unit: the leftover unit of the 4-unit hole. */
  assert_int_equal(xalloc(a, A, VL_MEM_ACTS), 3 * A);
  vl_arena_destroy(a);
}

/* Freeing three neighbours in the order left, right, middle merges them into one hole. */
static void test_arena_coalesce(void **state) {
  (void)state;
  vl_arena *a = mk_arena(VL_ARENA_HOST, VL_NO_CAP);
  size_t b0 = xalloc(a, A, VL_MEM_TEMP);
  size_t b1 = xalloc(a, 2 * A, VL_MEM_TEMP);
  size_t b2 = xalloc(a, 3 * A, VL_MEM_TEMP);
  size_t guard = xalloc(a, A, VL_MEM_TEMP);
  assert_int_equal(guard, 6 * A);
  vl_arena_free(a, b0);
  vl_arena_free(a, b2);
  vl_mem_stats s;
  vl_arena_stats(a, &s);
  assert_int_equal(s.free_bytes, 4 * A); /* holes of 1 and 3 units */
  assert_int_equal(s.largest_free, 3 * A);
  vl_arena_free(a, b1); /* merges with both neighbours */
  vl_arena_stats(a, &s);
  assert_int_equal(s.free_bytes, 6 * A);
  assert_int_equal(s.largest_free, 6 * A);
  assert_true(s.fragmentation == 0.0);
  /* 6 units fit only in the merged hole at 0 (otherwise it would go above the guard). */
  assert_int_equal(xalloc(a, 6 * A, VL_MEM_TEMP), 0);
  /* Freeing everything leaves one segment: a block of the whole used extent fits at 0. */
  vl_arena_free(a, 0);
  vl_arena_free(a, guard);
  assert_int_equal(vl_arena_live_blocks(a), 0);
  assert_int_equal(xalloc(a, 7 * A, VL_MEM_TEMP), 0);
  vl_arena_destroy(a);
}

static void test_arena_alignment(void **state) {
  (void)state;
  vl_arena *a = mk_arena(VL_ARENA_HOST, VL_NO_CAP);
  const size_t sizes[] = {1, 3, 255, 256, 257, 1000, 4096, 12345};
  size_t expect = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t off = xalloc(a, sizes[i], VL_MEM_DATA);
    assert_int_equal(off % A, 0);
    assert_int_equal(off, expect);
    assert_int_equal((uintptr_t)((char *)vl_arena_base(a) + off) % A, 0);
    expect += (sizes[i] + A - 1) / A * A;
  }
  vl_mem_stats s;
  vl_arena_stats(a, &s);
  assert_int_equal(s.cur_total, expect); /* live bytes count after alignment */
  /* A zero-byte request still takes one aligned unit (distinct offsets). */
  assert_int_equal(xalloc(a, 0, VL_MEM_DATA), expect);
  vl_arena_destroy(a);
}

static void test_arena_cap_oom(void **state) {
  (void)state;
  /* A cap that is not a multiple of the alignment is rounded down: 10.5 units -> 10. */
  vl_arena *a = mk_arena(VL_ARENA_HOST, 10 * A + A / 2);
  size_t off;
  assert_int_equal(vl_arena_alloc(a, 10 * A + 1, VL_MEM_ACTS, &off), VL_ERR_OOM);
  size_t b = xalloc(a, 6 * A, VL_MEM_ACTS);
  assert_int_equal(vl_arena_alloc(a, 5 * A, VL_MEM_ACTS, &off), VL_ERR_OOM);
  vl_mem_stats s;
  vl_arena_stats(a, &s);
  assert_int_equal(s.n_oom, 2);
  assert_int_equal(s.cap, 10 * A + A / 2);
  assert_int_equal(s.cur_total, 6 * A); /* failed requests leave no trace */
  assert_int_equal(s.n_alloc, 1);
  /* Still usable: what remains fits, and after a free the whole capped extent fits. */
  xalloc(a, 4 * A, VL_MEM_ACTS);
  vl_arena_free(a, b);
  assert_int_equal(xalloc(a, 6 * A, VL_MEM_ACTS), 0);
  vl_arena_destroy(a);

  /* Through a context: a status, an empty tensor, and a message naming the category. */
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, (size_t)64 << 10), VL_OK);
  vl_tensor t;
  assert_int_equal(vl_tensor_alloc2(c, &t, VL_F32, VL_MEM_GRADS, 1024, 1024), VL_ERR_OOM);
  assert_null(t.data);
  assert_false(t.owned);
  assert_non_null(strstr(c->err, "out of memory"));
  assert_non_null(strstr(c->err, "grads"));
  assert_int_equal(vl_tensor_alloc2(c, &t, VL_F32, VL_MEM_GRADS, 64, 64), VL_OK);
  assert_non_null(t.data);
  ((float *)t.data)[64 * 64 - 1] = 1.0f; /* the memory is real */
  vl_arena_stats(c->arena, &s);
  assert_int_equal(s.n_oom, 1);
  vl_tensor_free(c, &t);
  vl_ctx_destroy(c);
}

static void test_arena_categories_and_peaks(void **state) {
  (void)state;
  vl_arena *a = mk_arena(VL_ARENA_VIRTUAL, VL_NO_CAP);
  size_t p = xalloc(a, 4 * A, VL_MEM_PARAMS);
  size_t x = xalloc(a, 8 * A, VL_MEM_ACTS);
  vl_arena_free(a, x);
  xalloc(a, 2 * A, VL_MEM_TEMP); /* reuses the start of the freed activation block */
  vl_mem_stats s;
  vl_arena_stats(a, &s);
  assert_int_equal(s.cur[VL_MEM_PARAMS], 4 * A);
  assert_int_equal(s.cur[VL_MEM_ACTS], 0);
  assert_int_equal(s.cur[VL_MEM_TEMP], 2 * A);
  assert_int_equal(s.peak[VL_MEM_ACTS], 8 * A);
  assert_int_equal(s.peak_total, 12 * A);
  assert_int_equal(s.at_peak[VL_MEM_PARAMS], 4 * A);
  assert_int_equal(s.at_peak[VL_MEM_ACTS], 8 * A);
  assert_int_equal(s.at_peak[VL_MEM_TEMP], 0);
  assert_int_equal(s.reserved, 12 * A);
  /* A new total peak of 4 + 2 + 10 = 16 units replaces the breakdown. */
  size_t t2 = xalloc(a, 10 * A, VL_MEM_TEMP);
  vl_arena_stats(a, &s);
  assert_int_equal(s.peak_total, 16 * A);
  assert_int_equal(s.at_peak[VL_MEM_ACTS], 0);
  assert_int_equal(s.at_peak[VL_MEM_TEMP], 12 * A);
  assert_int_equal(s.peak[VL_MEM_ACTS], 8 * A); /* per-category peaks are independent */
  assert_int_equal(s.reserved, 16 * A);         /* temp [4,6) + the new block [6,16) */
  size_t sum = 0;
  for (int k = 0; k < VL_MEM_NCAT; k++) sum += s.at_peak[k];
  assert_int_equal(sum, s.peak_total);
  /* Frees do not lower peaks or the reservation; reset_peaks brings them to current. */
  vl_arena_free(a, t2);
  vl_arena_stats(a, &s);
  assert_int_equal(s.reserved, 16 * A);
  assert_int_equal(s.peak_total, 16 * A);
  vl_arena_reset_peaks(a);
  vl_arena_stats(a, &s);
  assert_int_equal(s.peak_total, 6 * A);
  assert_int_equal(s.peak[VL_MEM_ACTS], 0);
  assert_int_equal(s.reserved, 6 * A); /* top of the live blocks: temp at [4,6) units */
  assert_int_equal(s.n_alloc, 4);
  assert_int_equal(s.n_free, 2);
  (void)p;
  vl_arena_destroy(a);
}

/* Blocks of 1,2,1,4,1 units, free the 2- and 4-unit ones: 6 free units below the top of
 * which the largest is 4, so fragmentation = 1 - 4/6 = 1/3. */
static void test_arena_fragmentation(void **state) {
  (void)state;
  vl_arena *a = mk_arena(VL_ARENA_VIRTUAL, VL_NO_CAP);
  xalloc(a, A, VL_MEM_ACTS);
  size_t b = xalloc(a, 2 * A, VL_MEM_ACTS);
  xalloc(a, A, VL_MEM_ACTS);
  size_t d = xalloc(a, 4 * A, VL_MEM_ACTS);
  xalloc(a, A, VL_MEM_ACTS);
  vl_mem_stats s;
  vl_arena_stats(a, &s);
  assert_true(s.fragmentation == 0.0);
  assert_int_equal(s.free_bytes, 0); /* the tail above the top block is not counted */
  vl_arena_free(a, b);
  vl_arena_free(a, d);
  vl_arena_stats(a, &s);
  assert_int_equal(s.free_bytes, 6 * A);
  assert_int_equal(s.largest_free, 4 * A);
  assert_true(fabs(s.fragmentation - 1.0 / 3.0) < 1e-12);
  vl_arena_destroy(a);
}

static void test_arena_event_log(void **state) {
  (void)state;
  vl_arena *a = mk_arena(VL_ARENA_HOST, VL_NO_CAP);
  xalloc(a, 10, VL_MEM_TEMP); /* before the log: not recorded */
  vl_arena_log_enable(a, true);
  size_t x = xalloc(a, 300, VL_MEM_ACTS); /* 2 units */
  xalloc(a, A, VL_MEM_GRADS);
  vl_arena_free(a, x);
  size_t n = 0;
  const vl_mem_event *ev = vl_arena_log(a, &n);
  assert_int_equal(n, 3);
  const int64_t delta[3] = {2 * A, A, -2 * A};
  const int cat[3] = {VL_MEM_ACTS, VL_MEM_GRADS, VL_MEM_ACTS};
  const size_t total[3] = {3 * A, 4 * A, 2 * A}; /* live bytes after each event */
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(ev[i].seq, (int64_t)i + 1);
    assert_int_equal(ev[i].delta, delta[i]);
    assert_int_equal(ev[i].cat, cat[i]);
    assert_int_equal(ev[i].total, total[i]);
    assert_true(ev[i].t >= 0.0);
    if (i) assert_true(ev[i].t >= ev[i - 1].t);
  }
  vl_arena_log_enable(a, false);
  xalloc(a, A, VL_MEM_TEMP);
  vl_arena_log(a, &n);
  assert_int_equal(n, 3); /* disabled: nothing new */
  vl_arena_log_clear(a);
  vl_arena_log(a, &n);
  assert_int_equal(n, 0);
  vl_arena_destroy(a);
}

/* The planner's VIRTUAL arena must land the same sequence at the same offsets, with the
 * same statistics and the same OOMs, as a real HOST arena. */
static void test_arena_virtual_matches_host(void **state) {
  (void)state;
  const size_t cap = (size_t)4 << 20;
  vl_arena *v = mk_arena(VL_ARENA_VIRTUAL, cap), *h = mk_arena(VL_ARENA_HOST, cap);
  assert_null(vl_arena_base(v));
  assert_non_null(vl_arena_base(h));
  enum { NOPS = 2000 };
  size_t live[NOPS];
  int nlive = 0, noom = 0;
  vl_rng r;
  vl_rng_seed(&r, 42);
  for (int i = 0; i < NOPS; i++) {
    if (nlive == 0 || vl_rng_uniform(&r) < 0.55) {
      size_t bytes = 1 + (size_t)vl_rng_below(&r, 400000);
      vl_mem_cat cat = (vl_mem_cat)vl_rng_below(&r, VL_MEM_NCAT);
      size_t ov = SIZE_MAX, oh = SIZE_MAX;
      vl_status sv = vl_arena_alloc(v, bytes, cat, &ov), sh = vl_arena_alloc(h, bytes, cat, &oh);
      assert_int_equal(sv, sh);
      if (sv == VL_OK) {
        assert_int_equal(ov, oh);
        live[nlive++] = ov;
      } else {
        noom++;
      }
    } else {
      int k = (int)vl_rng_below(&r, (uint64_t)nlive);
      vl_arena_free(v, live[k]);
      vl_arena_free(h, live[k]);
      live[k] = live[--nlive];
    }
  }
  assert_true(noom > 0); /* the cap was actually exercised */
  vl_mem_stats sv, sh;
  vl_arena_stats(v, &sv);
  vl_arena_stats(h, &sh);
  assert_int_equal(sv.peak_total, sh.peak_total);
  assert_int_equal(sv.reserved, sh.reserved);
  assert_int_equal(sv.free_bytes, sh.free_bytes);
  assert_int_equal(sv.largest_free, sh.largest_free);
  assert_true(sv.fragmentation == sh.fragmentation);
  assert_int_equal(sv.n_oom, (uint64_t)noom);
  assert_int_equal(sh.n_oom, (uint64_t)noom);
  for (int k = 0; k < VL_MEM_NCAT; k++) {
    assert_int_equal(sv.peak[k], sh.peak[k]);
    assert_int_equal(sv.at_peak[k], sh.at_peak[k]);
  }
  assert_true(sv.reserved <= cap);
  vl_arena_destroy(v);
  vl_arena_destroy(h);
}

/* ============================== dtypes ============================================= */

static void test_dtype_bytes(void **state) {
  (void)state;
  assert_int_equal(vl_dtype_bytes(VL_F32, 1000), 4000);
  assert_int_equal(vl_dtype_bytes(VL_F16, 1000), 2000);
  assert_int_equal(vl_dtype_bytes(VL_BF16, 1000), 2000);
  /* NF4: 4*(1 + ngroups) (mean + group scales) + n/2 (codes) + n/64 (absmax codes), with
   * ngroups = ceil((n/64) / 256). */
  const int64_t ns[] = {64, 64 * 256, 64 * 257, 64 * 256 * 3 + 640, (int64_t)4096 * 4096};
  for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
    int64_t n = ns[i], nb = n / 64, ng = (nb + 255) / 256;
    assert_int_equal(vl_dtype_bytes(VL_NF4, n), (size_t)(4 * (1 + ng) + n / 2 + nb));
  }
  assert_int_equal(vl_dtype_bytes(VL_NF4, 64), 4 * 2 + 32 + 1);
  assert_string_equal(vl_dtype_name(VL_BF16), "bf16");
  vl_dtype d;
  assert_int_equal(vl_dtype_parse("nf4", &d), 0);
  assert_int_equal(d, VL_NF4);
  assert_int_equal(vl_dtype_parse("half", &d), 0);
  assert_int_equal(d, VL_F16);
  assert_int_not_equal(vl_dtype_parse("int8", &d), 0);
}

/* Round |x| to a binary format with `mbits` explicit significand bits and minimum normal
 * exponent `emin`, round-to-nearest-even, in double (exact: scaling by a power of two and
 * nearbyint in the default rounding mode). Results of 2^(emax+1) or more overflow to inf. */
static float ref_round(float x, int mbits, int emin, int emax) {
  if (isnan(x)) return x;
  double a = fabs((double)x);
  if (isinf(x) || a == 0.0) return x;
  int e;
  frexp(a, &e); /* a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1 */
  int E = e - 1 < emin ? emin : e - 1;
  double ulp = ldexp(1.0, E - mbits);
  double q = nearbyint(a / ulp) * ulp;
  if (q >= ldexp(1.0, emax + 1)) q = INFINITY;
  return (float)copysign(q, (double)x);
}
static float ref_f16(float x) { return ref_round(x, 10, -14, 15); }
static float ref_bf16(float x) { return ref_round(x, 7, -126, 127); }

static float bits_f(uint32_t u) { vl_fu32 v; v.u = u; return v.f; }
static uint32_t f_bits(float f) { vl_fu32 v; v.f = f; return v.u; }

/* The fp16 tests run twice: on the conversions kernels use on this host (F16C hardware on
 * capable x86) and on the portable code a CUDA device runs (vl_f2h_sw / vl_h2f_sw). */
static uint16_t (*F2H)(float) = vl_f2h;
static float (*H2F)(uint16_t) = vl_h2f;

static int use_portable_fp16(void **state) {
  (void)state;
  F2H = vl_f2h_sw;
  H2F = vl_h2f_sw;
  return 0;
}
static int use_host_fp16(void **state) {
  (void)state;
  F2H = vl_f2h;
  H2F = vl_h2f;
  return 0;
}

static void test_fp16_exact_values(void **state) {
  (void)state;
  assert_int_equal(F2H(1.0f), 0x3c00);
  assert_int_equal(F2H(-2.0f), 0xc000);
  assert_int_equal(F2H(0.0f), 0x0000);
  assert_int_equal(F2H(-0.0f), 0x8000);
  assert_int_equal(F2H(65504.0f), 0x7bff);            /* largest finite half */
  assert_int_equal(F2H(65519.99f), 0x7bff);           /* just below the midpoint */
  assert_int_equal(F2H(65520.0f), 0x7c00);            /* the midpoint ties to "even" inf */
  assert_int_equal(F2H(-1e6f), 0xfc00);
  assert_int_equal(F2H(INFINITY), 0x7c00);
  assert_int_equal(F2H(ldexpf(1.0f, -24)), 0x0001);   /* smallest subnormal */
  assert_int_equal(F2H(ldexpf(1.0f, -25)), 0x0000);   /* half of it: tie to even 0 */
  assert_int_equal(F2H(ldexpf(1.5f, -25)), 0x0001);   /* above the tie */
  assert_int_equal(F2H(ldexpf(3.0f, -25)), 0x0002);   /* 1.5 ulp: tie to even 2 */
  assert_int_equal(F2H(ldexpf(1.0f, -14)), 0x0400);   /* smallest normal */
  assert_int_equal(F2H(ldexpf(1023.5f, -24)), 0x0400); /* subnormal rounding up to normal */
  assert_int_equal(F2H(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie: down to even */
  assert_int_equal(F2H(1.0f + ldexpf(3.0f, -11)), 0x3c02); /* tie: up to even */
  assert_true(H2F(0x0001) == ldexpf(1.0f, -24));
  assert_true(H2F(0x7bff) == 65504.0f);
  assert_true(H2F(0x3555) == 0.333251953125f);
  assert_true(isinf(H2F(0xfc00)) && H2F(0xfc00) < 0);
  assert_true(signbit(H2F(0x8000)) && H2F(0x8000) == 0.0f);
  /* NaN stays NaN, including a signalling NaN whose payload sits in the low bits. */
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7fffffffu};
  for (int i = 0; i < 4; i++) {
    uint16_t h = F2H(bits_f(nans[i]));
    assert_int_equal(h & 0x7c00, 0x7c00);
    assert_int_not_equal(h & 0x03ff, 0);
    assert_true(isnan(H2F(h)));
  }
}

/* Every half value decodes exactly and round-trips; every midpoint between neighbouring
 * halves ties to the even one and its float neighbours go to the nearer one. */
static void test_fp16_exhaustive(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x10000u; h++) {
    uint32_t e = (h >> 10) & 31, m = h & 1023;
    double want = e == 0 ? ldexp((double)m, -24) : ldexp(1.0 + m / 1024.0, (int)e - 15);
    if (h & 0x8000) want = -want;
    float got = H2F((uint16_t)h);
    if (e == 31) {
      assert_true(m ? isnan(got) : isinf(got));
      if (m) continue;
    } else {
      assert_true((double)got == want);
    }
    assert_int_equal(F2H(got), h); /* round trip, signed zeros included */
  }
  for (uint32_t h = 0; h < 0x7c00u; h++) { /* positive finite; 0x7bff's upper is inf */
    double lo = H2F((uint16_t)h), hi = h == 0x7bff ? 65536.0 : H2F((uint16_t)(h + 1));
    float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
    uint32_t even = (h & 1) ? h + 1 : h;
    assert_int_equal(F2H(mid), even);
    assert_int_equal(F2H(-mid), even | 0x8000);
    assert_int_equal(F2H(nextafterf(mid, 0.0f)), h);
    assert_int_equal(F2H(nextafterf(mid, INFINITY)), h + 1);
  }
}

/* Random float bit patterns against the double-precision reference and, where the
 * compiler has it, against _Float16 (hardware/libgcc conversion). */
static void test_fp16_random_vs_reference(void **state) {
  (void)state;
  vl_rng r;
  vl_rng_seed(&r, 7);
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)vl_rng_u64(&r);
    if (i & 1) u = (u & 0x80000000u) | ((u & 0x1fffffffu) + (96u << 23)); /* 2^-31..2^33 */
    float f = bits_f(u);
    uint16_t h = F2H(f);
    float want = ref_f16(f);
    if (isnan(f)) { assert_true(isnan(H2F(h))); continue; }
    if (!(H2F(h) == want && signbit(H2F(h)) == signbit(want))) {
      print_error("f2h(%a) = 0x%04x (%a), want %a\n", (double)f, h, (double)H2F(h), (double)want);
      fail();
    }
#ifdef __FLT16_MAX__
    _Float16 hf = (_Float16)f;
    uint16_t hb;
    memcpy(&hb, &hf, 2);
    assert_int_equal(h, hb);
#endif
  }
}

static void test_bf16(void **state) {
  (void)state;
  assert_int_equal(vl_f2bf(1.0f), 0x3f80);
  assert_int_equal(vl_f2bf(-2.0f), 0xc000);
  assert_int_equal(vl_f2bf(1.0f + ldexpf(1.0f, -8)), 0x3f80); /* tie: down to even */
  assert_int_equal(vl_f2bf(1.0f + ldexpf(3.0f, -8)), 0x3f82); /* tie: up to even */
  assert_int_equal(vl_f2bf(FLT_MAX), 0x7f80);                  /* above the last midpoint */
  assert_int_equal(vl_f2bf(-INFINITY), 0xff80);
  assert_true(vl_bf2f(0x4049) == 3.140625f);
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu};
  for (int i = 0; i < 4; i++) assert_true(isnan(vl_bf2f(vl_f2bf(bits_f(nans[i])))));
  /* bf16 is the top half of a float: decoding is a shift, and for every bf16 value b the
   * float bits (b<<16)|low round by the low half: < 0x8000 down, > 0x8000 up, == 0x8000
   * to the even of b and b+1. */
  for (uint32_t b = 0; b < 0x10000u; b++) {
    uint32_t e = (b >> 7) & 0xff;
    float f = vl_bf2f((uint16_t)b);
    assert_int_equal(f_bits(f), b << 16);
    if (e == 0xff) continue;
    assert_int_equal(vl_f2bf(f), b);
    uint32_t up = b + 1, even = (b & 1) ? up : b; /* b+1 of 0x7f7f is inf 0x7f80: correct */
    assert_int_equal(vl_f2bf(bits_f((b << 16) | 0x7fffu)), b);
    assert_int_equal(vl_f2bf(bits_f((b << 16) | 0x8000u)), even);
    assert_int_equal(vl_f2bf(bits_f((b << 16) | 0x8001u)), up);
  }
  vl_rng r;
  vl_rng_seed(&r, 8);
  for (int i = 0; i < 1000000; i++) {
    float f = bits_f((uint32_t)vl_rng_u64(&r));
    float got = vl_bf2f(vl_f2bf(f)), want = ref_bf16(f);
    if (isnan(f)) assert_true(isnan(got));
    else assert_int_equal(f_bits(got), f_bits(want));
  }
}

static void test_round_to(void **state) {
  (void)state;
  assert_true(vl_round_to(VL_K_F32, 0.1f) == 0.1f);
  assert_true(vl_round_to(VL_K_F16, 0.1f) == vl_h2f(vl_f2h(0.1f)));
  assert_true(vl_round_to(VL_K_BF16, 0.1f) == vl_bf2f(vl_f2bf(0.1f)));
  assert_true(vl_round_to(VL_K_F16, 0.1f) != 0.1f);
  /* kernel dtype codes equal the public enum */
  assert_int_equal(VL_K_F16, VL_F16);
  assert_int_equal(VL_K_BF16, VL_BF16);
}

/* ============================== parsing, RNG, status =============================== */

static void test_parse_bytes(void **state) {
  (void)state;
  struct { const char *s; size_t v; } ok[] = {
      {"24GiB", (size_t)24 << 30},  {"22.08GB", 22080000000ull}, {"512MiB", (size_t)512 << 20},
      {"1e9", 1000000000ull},       {"100", 100},                {"1.5KiB", 1536},
      {"2 GB", 2000000000ull},      {"80gib", (size_t)80 << 30}, {"1TiB", (size_t)1 << 40},
      {"0", 0},                     {"7b", 7},
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    size_t v = 0;
    if (vl_parse_bytes(ok[i].s, &v) != 0 || v != ok[i].v) {
      print_error("vl_parse_bytes(\"%s\") = %zu, want %zu\n", ok[i].s, v, ok[i].v);
      fail();
    }
  }
  const char *bad[] = {"", "GiB", "12XB", "-1GB", "nan", "inf", "1e30", "12GiB extra", "abc", "1 2"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    size_t v = 0;
    if (vl_parse_bytes(bad[i], &v) == 0) {
      print_error("vl_parse_bytes(\"%s\") accepted (%zu)\n", bad[i], v);
      fail();
    }
  }
  size_t v;
  assert_int_not_equal(vl_parse_bytes(NULL, &v), 0);
  char buf[32];
  assert_string_equal(vl_fmt_bytes((size_t)3 << 30, buf, sizeof buf), "3.00 GiB");
  assert_string_equal(vl_fmt_bytes(100, buf, sizeof buf), "100 B");
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static void test_rng(void **state) {
  (void)state;
  vl_rng a, b;
  /* Seeding is splitmix64 (published outputs for seed 0); the first output is
   * xoshiro256**'s rotl(s1 * 5, 7) * 9. */
  vl_rng_seed(&a, 0);
  assert_true(a.s[0] == 0xe220a8397b1dcdafull);
  assert_true(a.s[1] == 0x6e789e6aa1b965f4ull);
  assert_true(a.s[2] == 0x06c45d188009454full);
  assert_true(a.s[3] == 0xf88bb8a8724c81ecull);
  uint64_t first = rotl64(a.s[1] * 5, 7) * 9;
  assert_true(vl_rng_u64(&a) == first);
  /* Same seed, same stream; another seed, another stream. */
  vl_rng_seed(&a, 1234);
  vl_rng_seed(&b, 1234);
  for (int i = 0; i < 1000; i++) assert_true(vl_rng_u64(&a) == vl_rng_u64(&b));
  vl_rng_seed(&b, 1235);
  int same = 0;
  for (int i = 0; i < 1000; i++) same += vl_rng_u64(&a) == vl_rng_u64(&b);
  assert_true(same == 0);
  /* Distributions: uniform in [0,1), normal with mean 0 and variance 1 (n = 200000: the
   * standard errors are 0.0022 for the mean and 0.0032 for the variance; 5 sigma). */
  vl_rng_seed(&a, 99);
  double s1 = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; i++) {
    double u = vl_rng_uniform(&a);
    assert_true(u >= 0.0 && u < 1.0);
    double z = vl_rng_normal(&a);
    s1 += z; s2 += z * z;
  }
  assert_true(fabs(s1 / n) < 0.011);
  assert_true(fabs(s2 / n - 1.0) < 0.016);
  for (int i = 0; i < 1000; i++) assert_true(vl_rng_below(&a, 7) < 7);
  assert_true(vl_rng_below(&a, 0) == 0);
  /* tu_randn is deterministic for a seed */
  float x[16], y[16];
  tu_randn(x, 16, 1.0f, 5);
  tu_randn(y, 16, 1.0f, 5);
  assert_memory_equal(x, y, sizeof x);
}

static void test_status_names(void **state) {
  (void)state;
  assert_string_equal(vl_status_name(VL_OK), "ok");
  assert_string_equal(vl_status_name(VL_ERR_OOM), "out of memory");
  const char *names[VL_ERR_INTERRUPTED + 1];
  for (int s = VL_OK; s <= VL_ERR_INTERRUPTED; s++) {
    names[s] = vl_status_name((vl_status)s);
    assert_non_null(names[s]);
    assert_string_not_equal(names[s], "unknown status");
    for (int k = 0; k < s; k++) assert_string_not_equal(names[s], names[k]);
  }
  assert_string_equal(vl_status_name((vl_status)99), "unknown status");
  assert_string_equal(vl_mem_cat_name(VL_MEM_WORKSPACE), "workspace");
  assert_string_equal(vl_device_name(VL_DEV_PLAN), "plan");
}

/* ============================== NF4 ================================================= */

static double nf4_half_max_gap(void) {
  const float lv[16] = VL_NF4_LEVELS;
  double g = 0;
  for (int q = 0; q < 15; q++) g = fmax(g, (double)lv[q + 1] - lv[q]);
  return g / 2; /* 0.152: between -1 and -0.696 */
}

/* Round-trip error on N(0,1) data. Per element, with a the block absmax and a' the
 * dequantised (double-quantised) absmax:
 *   - |x| <= a': x/a' lies in [-1,1] and goes to the nearest level, so the error is at most
 *     (half the largest gap) * a' <= hg * (a + d);
 *   - |x| > a' (a' rounded below a): the code saturates at +-1, error |x| - a' <= a - a'.
 * d bounds |a - a'|: the absmax goes through a linear int8 map (a - mean)/s*127 with s the
 * group's max |a - mean|, so rounding costs at most half a step, s/254. Hence
 *   err <= hg * (a + d) + d, plus fp32 slop (1e-5 * a) for the float arithmetic.
 * mean and s are recomputed here from the data, independently of the stored buffer. */
static void test_nf4_roundtrip(void **state) {
  (void)state;
  const int64_t nb = 256 * 3 + 5, n = nb * 64; /* three full groups and a partial one */
  float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
  size_t bytes = vl_dtype_bytes(VL_NF4, n);
  uint8_t *q = malloc(bytes + 64);
  tu_randn(x, n, 1.0f, 2024);
  for (int k = 0; k < 64; k++) x[100 * 64 + k] = 0.0f; /* an all-zero block */
  memset(q, 0xab, bytes + 64);
  assert_int_equal(vl_nf4_quantize_host(q, x, n), 0);
  for (int k = 0; k < 64; k++) assert_int_equal(q[bytes + k], 0xab); /* stays in its bytes */
  vl_nf4_dequantize_host(y, q, n);

  double *amax = malloc((size_t)nb * sizeof *amax), mean = 0;
  for (int64_t b = 0; b < nb; b++) {
    double m = 0;
    for (int k = 0; k < 64; k++) m = fmax(m, fabs((double)x[b * 64 + k]));
    amax[b] = m;
    mean += m;
  }
  mean /= (double)nb;
  const double hg = nf4_half_max_gap();
  double se = 0, sx = 0, worst = 0;
  for (int64_t g = 0; g * 256 < nb; g++) {
    int64_t b0 = g * 256, b1 = b0 + 256 < nb ? b0 + 256 : nb;
    double s = 0;
    for (int64_t b = b0; b < b1; b++) s = fmax(s, fabs(amax[b] - mean));
    double d = s / 254.0;
    for (int64_t b = b0; b < b1; b++) {
      double bound = hg * (amax[b] + d) + d + 1e-5 * amax[b];
      for (int k = 0; k < 64; k++) {
        int64_t i = b * 64 + k;
        double e = fabs((double)x[i] - (double)y[i]);
        if (e > bound) {
          print_error("nf4 element %lld: |%g - %g| = %g > bound %g\n", (long long)i, x[i], y[i], e, bound);
          fail();
        }
        worst = fmax(worst, e / (hg * amax[b] + 1e-30));
        se += e * e;
        sx += (double)x[i] * x[i];
      }
    }
  }
  for (int k = 0; k < 64; k++) assert_true(y[100 * 64 + k] == 0.0f);
  /* The bound is attained up to the absmax error: the worst element sits near a widest
   * gap's midpoint (ratio close to 1, not far below). */
  assert_true(worst > 0.9 && worst < 1.1);
  /* RMS error relative to the data's RMS (std 1): NF4 with 64-blocks gives about 0.09. */
  double rel_rms = sqrt(se / sx);
  print_message("nf4: rms error / std = %.4f, worst error / (hg*absmax) = %.4f\n", rel_rms, worst);
  assert_true(rel_rms < 0.1);
  assert_true(rel_rms > 0.01); /* 4-bit storage cannot be near-lossless: the test measures */
  free(x); free(y); free(q); free(amax);
}

static void test_nf4_format(void **state) {
  (void)state;
  /* 4096x4096: (4*(1+1024) + 2^23 + 2^18) bytes * 8 / 2^24 = 4.127 bits per weight. */
  int64_t n = (int64_t)4096 * 4096;
  double bits = 8.0 * (double)vl_dtype_bytes(VL_NF4, n) / (double)n;
  assert_true(fabs(bits - (4.0 + 8.0 / 64 + 32.0 * 1025 / (double)n)) < 1e-12);
  assert_true(fabs(bits - 4.127) < 0.001);
  /* n must be a positive multiple of 64 */
  float x[128] = {0};
  uint8_t buf[256];
  assert_int_not_equal(vl_nf4_quantize_host(buf, x, 100), 0);
  assert_int_not_equal(vl_nf4_quantize_host(buf, x, 0), 0);
  assert_int_equal(vl_nf4_quantize_host(buf, x, 128), 0);
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_tensor t;
  assert_int_equal(vl_tensor_alloc2(c, &t, VL_NF4, VL_MEM_FROZEN, 10, 10), VL_ERR_INVALID);
  assert_int_equal(vl_tensor_alloc2(c, &t, VL_NF4, VL_MEM_FROZEN, 4, 64), VL_OK);
  assert_int_equal(t.bytes, vl_dtype_bytes(VL_NF4, 256));
  vl_tensor_free(c, &t);
  vl_ctx_destroy(c);
  /* Levels: 16, increasing, from -1 to 1 with an exact 0; nearest() inverts level(). */
  for (int k = 0; k < 16; k++) {
    if (k) assert_true(vl_nf4_level(k) > vl_nf4_level(k - 1));
    assert_int_equal(vl_nf4_nearest(vl_nf4_level(k)), k);
  }
  assert_true(vl_nf4_level(0) == -1.0f && vl_nf4_level(7) == 0.0f && vl_nf4_level(15) == 1.0f);
  assert_int_equal(vl_nf4_nearest(2.0f), 15);
  assert_int_equal(vl_nf4_nearest(-2.0f), 0);
}

/* The parallel normal fill draws the numbers the one-at-a-time loop draws, bit for bit, on
 * any thread count, and leaves the stream where the loop leaves it (more than one chunk, a
 * remainder, a small tensor). */
static void test_rng_normal_fill_equals_loop(void **state) {
  (void)state;
  const int64_t sizes[] = {7, 1 << 20, 3 * (1 << 20) + 123};
  for (int k = 0; k < 3; k++) {
    int64_t n = sizes[k];
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    for (int threads = 1; threads <= 2; threads++) {
      omp_set_num_threads(threads);
      vl_rng r1, r2;
      vl_rng_seed(&r1, 42 + (uint64_t)k);
      vl_rng_seed(&r2, 42 + (uint64_t)k);
      for (int64_t i = 0; i < n; i++) a[i] = 0.02f * vl_rng_normal(&r1);
      vl_rng_normal_fill(&r2, b, n, 0.02f);
      assert_memory_equal(a, b, (size_t)n * sizeof *a);
      assert_true(vl_rng_u64(&r1) == vl_rng_u64(&r2)); /* the stream goes on alike */
    }
    free(a);
    free(b);
  }
}

/* A jump of n equals n draws. */
static void test_rng_jump_equals_draws(void **state) {
  (void)state;
  const uint64_t ns[] = {0, 1, 2, 63, 64, 1000, 123457};
  for (int k = 0; k < 7; k++) {
    vl_rng a, b;
    vl_rng_seed(&a, 9);
    vl_rng_seed(&b, 9);
    for (uint64_t i = 0; i < ns[k]; i++) (void)vl_rng_u64(&a);
    assert_int_equal(vl_rng_jump(&b, ns[k]), 0);
    assert_memory_equal(a.s, b.s, sizeof a.s);
  }
}

/* NF4 quantisation runs its blocks on every thread: the same bytes on 1 and 2 threads. */
static void test_nf4_threads_same_bytes(void **state) {
  (void)state;
  const int64_t n = 64 * 9000; /* above the blocks that start threads */
  float *x = malloc((size_t)n * sizeof *x);
  size_t nb = vl_dtype_bytes(VL_NF4, n);
  uint8_t *q1 = malloc(nb), *q2 = malloc(nb);
  assert_non_null(x);
  assert_non_null(q1);
  assert_non_null(q2);
  vl_rng r;
  vl_rng_seed(&r, 5);
  vl_rng_normal_fill(&r, x, n, 0.02f);
  omp_set_num_threads(1);
  assert_int_equal(vl_nf4_quantize_host(q1, x, n), 0);
  omp_set_num_threads(2);
  assert_int_equal(vl_nf4_quantize_host(q2, x, n), 0);
  assert_memory_equal(q1, q2, nb);
  free(x);
  free(q1);
  free(q2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arena_best_fit),
      cmocka_unit_test(test_arena_coalesce),
      cmocka_unit_test(test_arena_alignment),
      cmocka_unit_test(test_arena_cap_oom),
      cmocka_unit_test(test_arena_categories_and_peaks),
      cmocka_unit_test(test_arena_fragmentation),
      cmocka_unit_test(test_arena_event_log),
      cmocka_unit_test(test_arena_virtual_matches_host),
      cmocka_unit_test(test_dtype_bytes),
      cmocka_unit_test(test_fp16_exact_values),
      cmocka_unit_test(test_fp16_exhaustive),
      cmocka_unit_test(test_fp16_random_vs_reference),
      cmocka_unit_test_setup_teardown(test_fp16_exact_values, use_portable_fp16, use_host_fp16),
      cmocka_unit_test_setup_teardown(test_fp16_exhaustive, use_portable_fp16, use_host_fp16),
      cmocka_unit_test_setup_teardown(test_fp16_random_vs_reference, use_portable_fp16, use_host_fp16),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_round_to),
      cmocka_unit_test(test_parse_bytes),
      cmocka_unit_test(test_rng),
      cmocka_unit_test(test_rng_normal_fill_equals_loop),
      cmocka_unit_test(test_rng_jump_equals_draws),
      cmocka_unit_test(test_nf4_threads_same_bytes),
      cmocka_unit_test(test_status_names),
      cmocka_unit_test(test_nf4_roundtrip),
      cmocka_unit_test(test_nf4_format),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
