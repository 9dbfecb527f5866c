/* The simulated PyTorch CUDA caching allocator (engine/core/cachealloc.c): rounding, the
 * small pool's 2 MiB segments, the large pool's 20 MiB / 2 MiB-rounded segments, the split
 * rule on both sides of its boundaries, merging on free, best fit, the capacity's release
 * of cached segments and its OOM, a sequence worked by hand, and 20k random events against
 * a plain reference model (linear scans over an address-sorted block list). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "vramlab/cachealloc.h"

#define KiB ((uint64_t)1024)
#define MiB ((uint64_t)1048576)

static vl_cachealloc *mk(uint64_t capacity) {
  vl_cachealloc *ca = NULL;
  assert_int_equal(vl_cachealloc_create(&ca, capacity), VL_OK);
  assert_non_null(ca);
  return ca;
}

static uint64_t xmalloc(vl_cachealloc *ca, uint64_t bytes) {
  uint64_t h = 12345;
  assert_int_equal(vl_cachealloc_malloc(ca, bytes, &h), VL_OK);
  assert_true(h != 0);
  return h;
}

static vl_ca_stats st(const vl_cachealloc *ca) {
  vl_ca_stats s;
  vl_cachealloc_stats(ca, &s);
  return s;
}

/* 1 -> 512, 513 -> 1024, multiples of 512 stay; allocated counts the rounded size and
 * requested the caller's; 0 bytes: the null handle and no stats at all. */
static void test_rounding(void **state) {
  (void)state;
  assert_int_equal(vl_cachealloc_round_size(1), 512);
  assert_int_equal(vl_cachealloc_round_size(511), 512);
  assert_int_equal(vl_cachealloc_round_size(512), 512);
  assert_int_equal(vl_cachealloc_round_size(513), 1024);
  assert_int_equal(vl_cachealloc_round_size(3 * MiB + 1), 3 * MiB + 512);
  vl_cachealloc *ca = mk(0);
  uint64_t h = 77;
  assert_int_equal(vl_cachealloc_malloc(ca, 0, &h), VL_OK);
  assert_int_equal(h, 0);
  vl_cachealloc_free(ca, 0);
  vl_ca_stats s = st(ca);
  assert_int_equal(s.allocated + s.reserved + s.requested + s.segments + s.n_alloc + s.n_free +
                       s.n_bad_free + s.n_segment_alloc, 0);
  uint64_t a = xmalloc(ca, 1);
  s = st(ca);
  assert_int_equal(s.allocated, 512);
  assert_int_equal(s.requested, 1);
  uint64_t b = xmalloc(ca, 513);
  s = st(ca);
  assert_int_equal(s.allocated, 512 + 1024);
  assert_int_equal(s.requested, 1 + 513);
  assert_int_equal(b, a + 512); /* packed behind the first block in the same segment */
  assert_int_equal(s.n_alloc, 2);
  assert_int_equal(vl_cachealloc_malloc(ca, VL_CA_MAX_REQUEST + 1, &h), VL_ERR_INVALID);
  assert_int_equal(h, 0);
  vl_cachealloc_destroy(ca);
}

/* One 2 MiB segment holds 4096 blocks of 512 B end to end (the 4095th leaves exactly 512 B,
 * which splits off: small pool remainders >= 512 split); the 4097th opens a second 2 MiB
 * segment. Exactly 1 MiB is still small. */
static void test_small_segment_shared(void **state) {
  (void)state;
  vl_cachealloc *ca = mk(0);
  uint64_t h0 = xmalloc(ca, 300);
  for (uint64_t i = 1; i < 4096; i++) assert_int_equal(xmalloc(ca, 300), h0 + 512 * i);
  vl_ca_stats s = st(ca);
  assert_int_equal(s.reserved, 2 * MiB);
  assert_int_equal(s.segments, 1);
  assert_int_equal(s.allocated, 2 * MiB);
  assert_int_equal(s.requested, 4096 * 300);
  assert_int_equal(s.free_blocks, 0);
  assert_int_equal(s.live_blocks, 4096);
  uint64_t h = xmalloc(ca, 100);
  assert_true(h >= h0 + 2 * MiB);
  s = st(ca);
  assert_int_equal(s.reserved, 4 * MiB);
  assert_int_equal(s.segments, 2);
  assert_int_equal(s.n_segment_alloc, 2);
  /* 1 MiB exactly is still small: it takes the front of segment 2's 2 MiB - 512 rest */
  uint64_t m1 = xmalloc(ca, MiB);
  assert_int_equal(m1, h + 512);
  s = st(ca);
  assert_int_equal(s.reserved, 4 * MiB); /* it fitted segment 2's remainder */
  assert_int_equal(s.segments, 2);
  uint64_t m2 = xmalloc(ca, MiB); /* segment 2 has 1 MiB - 512 left: a new small segment */
  assert_int_equal(m2, h0 + 4 * MiB);
  s = st(ca);
  assert_int_equal(s.reserved, 6 * MiB);
  assert_int_equal(s.segments, 3);
  vl_cachealloc_destroy(ca);
}

/* 1.5 MiB: large pool, < 10 MiB: a 20 MiB segment, split (18.5 MiB > 1 MiB left); a second
 * 1.5 MiB takes the remainder's front. 1 MiB + 1 B rounds to 1 MiB + 512: large too. */
static void test_large_buffer_shared(void **state) {
  (void)state;
  vl_cachealloc *ca = mk(0);
  const uint64_t r = 3 * MiB / 2;
  uint64_t a = xmalloc(ca, r);
  vl_ca_stats s = st(ca);
  assert_int_equal(s.reserved, 20 * MiB);
  assert_int_equal(s.allocated, r);
  assert_int_equal(s.free_blocks, 1);
  uint64_t b = xmalloc(ca, r);
  assert_int_equal(b, a + r);
  s = st(ca);
  assert_int_equal(s.reserved, 20 * MiB);
  assert_int_equal(s.reserved_peak, 20 * MiB);
  assert_int_equal(s.segments, 1);
  assert_int_equal(s.allocated, 2 * r);
  uint64_t c = xmalloc(ca, MiB + 1);
  assert_int_equal(c, b + r);
  s = st(ca);
  assert_int_equal(s.reserved, 20 * MiB);
  assert_int_equal(s.allocated, 2 * r + MiB + 512);
  vl_cachealloc_destroy(ca);
}

/* >= 10 MiB: the segment is the size rounded up to 2 MiB. 12 MiB -> 12 MiB; 25.3 MiB ->
 * 26 MiB, and the 0.7 MiB left is not split off (<= 1 MiB): allocated counts 26 MiB.
 * 10 MiB - 512 is still below kMinLargeAlloc: a 20 MiB segment. */
static void test_large_segment_sizes(void **state) {
  (void)state;
  assert_int_equal(vl_cachealloc_segment_size(512), 2 * MiB);
  assert_int_equal(vl_cachealloc_segment_size(MiB), 2 * MiB);
  assert_int_equal(vl_cachealloc_segment_size(MiB + 512), 20 * MiB);
  assert_int_equal(vl_cachealloc_segment_size(10 * MiB - 512), 20 * MiB);
  assert_int_equal(vl_cachealloc_segment_size(10 * MiB), 10 * MiB);
  assert_int_equal(vl_cachealloc_segment_size(10 * MiB + 512), 12 * MiB);
  vl_cachealloc *ca = mk(0);
  xmalloc(ca, 12 * MiB);
  vl_ca_stats s = st(ca);
  assert_int_equal(s.reserved, 12 * MiB);
  assert_int_equal(s.allocated, 12 * MiB);
  assert_int_equal(s.free_blocks, 0);
  const uint64_t b253 = (uint64_t)(25.3 * (double)MiB); /* 26528972 B */
  xmalloc(ca, b253);
  s = st(ca);
  assert_int_equal(s.reserved, 12 * MiB + 26 * MiB);
  assert_int_equal(s.segments, 2);
  assert_int_equal(s.allocated, 12 * MiB + 26 * MiB); /* the unsplit 733696 B included */
  assert_int_equal(s.requested, 12 * MiB + b253);
  assert_int_equal(s.free_blocks, 0);
  xmalloc(ca, 10 * MiB - 512);
  s = st(ca);
  assert_int_equal(s.reserved, 58 * MiB);
  vl_cachealloc_destroy(ca);
}

/* Large pool: a remainder of exactly 1 MiB stays with the block (allocated counts all 12
 * MiB); 1 MiB + 512 is split off and stays free. */
static void test_large_no_split_boundary(void **state) {
  (void)state;
  vl_cachealloc *ca = mk(0);
  uint64_t a = xmalloc(ca, 12 * MiB);
  vl_cachealloc_free(ca, a);
  uint64_t b = xmalloc(ca, 11 * MiB);
  assert_int_equal(b, a);
  vl_ca_stats s = st(ca);
  assert_int_equal(s.allocated, 12 * MiB);
  assert_int_equal(s.requested, 11 * MiB);
  assert_int_equal(s.free_blocks, 0);
  vl_cachealloc_free(ca, b);
  s = st(ca);
  assert_int_equal(s.allocated, 0);
  assert_int_equal(s.requested, 0);
  assert_int_equal(s.allocated_peak, 12 * MiB);
  uint64_t c = xmalloc(ca, 11 * MiB - 512);
  assert_int_equal(c, a);
  s = st(ca);
  assert_int_equal(s.allocated, 11 * MiB - 512);
  assert_int_equal(s.free_blocks, 1);
  /* the split-off 1 MiB + 512 serves a 1 MiB + 512 request without a new segment */
  uint64_t d = xmalloc(ca, MiB + 1);
  assert_int_equal(d, a + 11 * MiB - 512);
  s = st(ca);
  assert_int_equal(s.reserved, 12 * MiB);
  assert_int_equal(s.segments, 1);
  assert_int_equal(s.allocated, 12 * MiB);
  vl_cachealloc_destroy(ca);
}

/* Three 6 MiB blocks and a 2 MiB block fill one 20 MiB segment. Freed middle, last, first,
 * they merge into one 18 MiB block (the middle one merges with nothing, the last with its
 * left neighbour, the first with its right one), which takes a 17 MiB request: no new
 * segment, and the 1 MiB left is not split off. Without merging 17 MiB fits no 6 MiB hole. */
static void test_merge_on_free(void **state) {
  (void)state;
  vl_cachealloc *ca = mk(0);
  uint64_t a = xmalloc(ca, 6 * MiB), b = xmalloc(ca, 6 * MiB), c = xmalloc(ca, 6 * MiB);
  uint64_t d = xmalloc(ca, 2 * MiB);
  assert_int_equal(b, a + 6 * MiB);
  assert_int_equal(c, a + 12 * MiB);
  assert_int_equal(d, a + 18 * MiB);
  vl_ca_stats s = st(ca);
  assert_int_equal(s.reserved, 20 * MiB);
  assert_int_equal(s.free_blocks, 0);
  vl_cachealloc_free(ca, b);
  assert_int_equal(st(ca).free_blocks, 1);
  vl_cachealloc_free(ca, c);
  assert_int_equal(st(ca).free_blocks, 1);
  vl_cachealloc_free(ca, a);
  assert_int_equal(st(ca).free_blocks, 1);
  uint64_t e = xmalloc(ca, 17 * MiB);
  assert_int_equal(e, a);
  s = st(ca);
  assert_int_equal(s.reserved, 20 * MiB);
  assert_int_equal(s.segments, 1);
  assert_int_equal(s.allocated, 20 * MiB); /* 18 MiB unsplit + d */
  assert_int_equal(s.free_blocks, 0);
  /* everything freed: one free block, the whole segment */
  vl_cachealloc_free(ca, d);
  vl_cachealloc_free(ca, e);
  s = st(ca);
  assert_int_equal(s.free_blocks, 1);
  assert_int_equal(s.allocated, 0);
  assert_int_equal(xmalloc(ca, 19 * MiB), a);
  assert_int_equal(st(ca).allocated, 20 * MiB);
  /* a second free of a freed handle, and a handle never given: n_bad_free only */
  vl_cachealloc_free(ca, d);
  vl_cachealloc_free(ca, 12345);
  s = st(ca);
  assert_int_equal(s.n_bad_free, 2);
  assert_int_equal(s.allocated, 20 * MiB);
  vl_cachealloc_destroy(ca);
}

/* Best fit, not first fit and not lowest address: free 14 MiB (lower address) and 12 MiB
 * blocks; 11 MiB takes the 12 MiB one. Small pool too: free 4 KiB then 2 KiB holes; a 2 KiB
 * request takes the later, smaller hole. Equal sizes: the lower address. */
static void test_best_fit(void **state) {
  (void)state;
  vl_cachealloc *ca = mk(0);
  uint64_t y = xmalloc(ca, 14 * MiB), x = xmalloc(ca, 12 * MiB);
  assert_true(y < x);
  vl_cachealloc_free(ca, y);
  vl_cachealloc_free(ca, x);
  assert_int_equal(xmalloc(ca, 11 * MiB), x);
  assert_int_equal(xmalloc(ca, 11 * MiB), y); /* 3 MiB left > 1 MiB: split */
  vl_ca_stats s = st(ca);
  assert_int_equal(s.reserved, 26 * MiB);
  assert_int_equal(s.allocated, 12 * MiB + 11 * MiB);

  uint64_t h4 = xmalloc(ca, 4 * KiB), g1 = xmalloc(ca, 512), h2 = xmalloc(ca, 2 * KiB);
  uint64_t g2 = xmalloc(ca, 512), h2b = xmalloc(ca, 2 * KiB), g3 = xmalloc(ca, 512);
  (void)g1; (void)g2; (void)g3;
  vl_cachealloc_free(ca, h4);
  vl_cachealloc_free(ca, h2b);
  vl_cachealloc_free(ca, h2);
  assert_int_equal(xmalloc(ca, 2 * KiB), h2);  /* lowest of the two 2 KiB holes */
  assert_int_equal(xmalloc(ca, 1500), h2b);    /* 2 KiB hole, not the 4 KiB one */
  assert_int_equal(xmalloc(ca, 3 * KiB), h4);  /* split: 1 KiB stays free at h4 + 3 KiB */
  assert_int_equal(xmalloc(ca, 1024), h4 + 3 * KiB);
  s = st(ca);
  assert_int_equal(s.segments, 3);
  vl_cachealloc_destroy(ca);
}

/* Capacity 30 MiB: a small 2 MiB segment and two 12 MiB segments (26 MiB). With the small
 * one and one 12 MiB segment wholly free, 14 MiB would make 40 MiB: both are released
 * (both pools), 12 + 14 = 26 MiB fits. Then 6 MiB (a 20 MiB segment: 46 MiB) finds nothing
 * wholly free to release: out of memory, nothing else changes. A segment that is partly in
 * use is never released. */
static void test_capacity_release_then_oom(void **state) {
  (void)state;
  vl_cachealloc *ca = mk(30 * MiB);
  uint64_t sm = xmalloc(ca, 1000), x = xmalloc(ca, 12 * MiB), y = xmalloc(ca, 12 * MiB);
  vl_ca_stats s = st(ca);
  assert_int_equal(s.reserved, 26 * MiB);
  assert_int_equal(s.segments, 3);
  vl_cachealloc_free(ca, sm);
  vl_cachealloc_free(ca, x);
  assert_int_equal(st(ca).reserved, 26 * MiB); /* cached, not released */
  uint64_t z = xmalloc(ca, 14 * MiB);
  s = st(ca);
  assert_int_equal(s.reserved, 26 * MiB);
  assert_int_equal(s.reserved_peak, 26 * MiB); /* never 40 */
  assert_int_equal(s.segments, 2);
  assert_int_equal(s.n_segment_free, 2);
  assert_int_equal(s.n_retries, 1);
  assert_int_equal(s.free_blocks, 0);
  assert_int_equal(s.allocated, 26 * MiB);
  assert_int_equal(s.n_oom, 0);

  uint64_t h = 99;
  assert_int_equal(vl_cachealloc_malloc(ca, 6 * MiB, &h), VL_ERR_OOM);
  assert_int_equal(h, 0);
  s = st(ca);
  assert_int_equal(s.n_oom, 1);
  assert_int_equal(s.n_retries, 2);
  assert_int_equal(s.reserved, 26 * MiB);
  assert_int_equal(s.allocated, 26 * MiB);
  assert_int_equal(s.segments, 2);
  assert_int_equal(s.n_alloc, 4);
  /* z's 14 MiB segment freed whole: 6 MiB reuses it (best fit, split: 8 MiB left) */
  vl_cachealloc_free(ca, z);
  uint64_t w = xmalloc(ca, 6 * MiB);
  s = st(ca);
  assert_int_equal(s.reserved, 26 * MiB);
  assert_int_equal(s.n_oom, 1);
  /* 9 MiB: the 8 MiB remainder is too small, a 20 MiB segment would make 46 MiB and the
   * partly used 14 MiB segment may not be released: OOM */
  assert_int_equal(vl_cachealloc_malloc(ca, 9 * MiB, &h), VL_ERR_OOM);
  s = st(ca);
  assert_int_equal(s.n_oom, 2);
  assert_int_equal(s.segments, 2);
  assert_int_equal(s.reserved, 26 * MiB);
  /* freeing w makes z's segment whole again: 20 MiB (a 20 MiB segment) releases it, is
   * still over (12 + 20 = 32 > 30): OOM, and the release stays done: reserved 12 MiB */
  vl_cachealloc_free(ca, w);
  assert_int_equal(vl_cachealloc_malloc(ca, 20 * MiB, &h), VL_ERR_OOM);
  s = st(ca);
  assert_int_equal(s.reserved, 12 * MiB);
  assert_int_equal(s.segments, 1);
  /* 8 MiB: a 20 MiB segment, 12 + 20 = 32 > 30: OOM; 18 MiB: an 18 MiB segment fits */
  assert_int_equal(vl_cachealloc_malloc(ca, 8 * MiB, &h), VL_ERR_OOM);
  assert_int_equal(st(ca).n_oom, 4);
  uint64_t v = xmalloc(ca, 18 * MiB);
  s = st(ca);
  assert_int_equal(s.reserved, 30 * MiB);
  assert_int_equal(s.allocated, 30 * MiB);
  vl_cachealloc_free(ca, v);
  vl_cachealloc_free(ca, y);
  vl_cachealloc_destroy(ca);
}

/* A sequence worked by hand from the rules (S0, S1, S2: the segments, in the order made).
 *  1. malloc(1000): rounds to 1024, small pool, no free block: S0 = 2 MiB small segment;
 *     2 MiB - 1024 left >= 512: split. allocated 1024, reserved 2 MiB, requested 1000.
 *  2. malloc(3 MiB + 1): rounds to 3 MiB + 512 = 3146240, large; < 10 MiB: S1 = 20 MiB;
 *     left 17 MiB - 512 = 17825280 > 1 MiB: split. allocated 1024 + 3146240 = 3147264,
 *     reserved 22 MiB.
 *  3. malloc(16 MiB + 100): rounds to 16 MiB + 512 = 16777728; best fit: S1's free
 *     17825280 block; left 1047552 = 1 MiB - 1024, not > 1 MiB: not split, all 17825280
 *     handed out. allocated 3147264 + 17825280 = 20972544 (peak so far), reserved 22 MiB;
 *     requested 1000 + 3145729 + 16777316 = 19924045.
 *  4. free(#2): neighbours #3 (allocated) and none: no merge. allocated 17826304.
 *  5. malloc(2 MiB): 2097152, large; best fit #2's 3146240 block (same address as #2);
 *     left 1049088 = 1 MiB + 512 > 1 MiB: split. allocated 19923456.
 *  6. free(#3): its left neighbour (the 1049088 remainder of step 5) is free: merged into
 *     one 18 MiB block at S1 + 2 MiB. allocated 19923456 - 17825280 = 2098176.
 *  7. malloc(614400): 600 KiB, a multiple of 512, small; S0's 2 MiB - 1024 block, split;
 *     handle = #1 + 1024. allocated 2712576.
 *  8. malloc(30 MiB): large, >= 10 MiB; the 18 MiB block is too small: S2 = 30 MiB, left
 *     0: not split. allocated 2712576 + 31457280 = 34169856 (the peak), reserved 52 MiB,
 *     requested 1000 + 2097152 + 614400 + 31457280 = 34169832 (the peak; step 3's
 *     19924045 was lower).
 *  9. free(#8): allocated 2712576, reserved 52 MiB (kept), peaks unchanged; free blocks:
 *     S0's rest, S1's 18 MiB, S2 whole = 3.
 * 10. reset peaks: allocated_peak 2712576, reserved_peak 52 MiB, requested_peak 1000 +
 *     2097152 + 614400 = 2712552 (#1, #5, #7 live). */
static void test_hand_worked_sequence(void **state) {
  (void)state;
  vl_cachealloc *ca = mk(0);
  uint64_t h1 = xmalloc(ca, 1000);
  uint64_t h2 = xmalloc(ca, 3 * MiB + 1);
  assert_int_equal(h2, h1 + 2 * MiB); /* S1 follows S0 */
  uint64_t h3 = xmalloc(ca, 16 * MiB + 100);
  assert_int_equal(h3, h2 + 3146240);
  vl_ca_stats s = st(ca);
  assert_int_equal(s.allocated, 20972544);
  assert_int_equal(s.requested, 19924045);
  assert_int_equal(s.reserved, 22 * MiB);
  vl_cachealloc_free(ca, h2);
  assert_int_equal(st(ca).allocated, 17826304);
  uint64_t h5 = xmalloc(ca, 2 * MiB);
  assert_int_equal(h5, h2);
  assert_int_equal(st(ca).allocated, 19923456);
  vl_cachealloc_free(ca, h3);
  assert_int_equal(st(ca).allocated, 2098176);
  uint64_t h7 = xmalloc(ca, 614400);
  assert_int_equal(h7, h1 + 1024);
  assert_int_equal(st(ca).allocated, 2712576);
  uint64_t h8 = xmalloc(ca, 30 * MiB);
  assert_int_equal(h8, h1 + 22 * MiB); /* S2 follows S1 */
  s = st(ca);
  assert_int_equal(s.allocated, 34169856);
  assert_int_equal(s.allocated_peak, 34169856);
  assert_int_equal(s.reserved, 52 * MiB);
  assert_int_equal(s.requested, 34169832);
  assert_int_equal(s.requested_peak, 34169832);
  assert_int_equal(s.segments, 3);
  vl_cachealloc_free(ca, h8);
  s = st(ca);
  assert_int_equal(s.allocated, 2712576);
  assert_int_equal(s.allocated_peak, 34169856);
  assert_int_equal(s.reserved, 52 * MiB);
  assert_int_equal(s.reserved_peak, 52 * MiB);
  assert_int_equal(s.free_blocks, 3);
  assert_int_equal(s.live_blocks, 3);
  assert_int_equal(s.n_alloc, 6);
  assert_int_equal(s.n_free, 3);
  vl_cachealloc_reset_peaks(ca);
  s = st(ca);
  assert_int_equal(s.allocated_peak, 2712576);
  assert_int_equal(s.reserved_peak, 52 * MiB);
  assert_int_equal(s.requested_peak, 2712552);
  assert_int_equal(s.segments_peak, 3);
  /* the merged 18 MiB block at S1 + 2 MiB takes 17 MiB */
  assert_int_equal(xmalloc(ca, 17 * MiB), h2 + 2 * MiB);
  vl_cachealloc_destroy(ca);
}

/* ---- a reference model: every block in one array sorted by address; linear scans --- */

typedef struct { uint64_t addr, size, req; int seg; int small, used; } rblk;
typedef struct {
  rblk *b; size_t n, cap;
  uint64_t capacity, next_addr;
  vl_ca_stats s;
  int nseg;
} rmodel;

static void r_insert(rmodel *m, size_t i, rblk x) {
  if (m->n == m->cap) {
    m->cap = m->cap ? 2 * m->cap : 256;
    m->b = realloc(m->b, m->cap * sizeof *m->b);
    assert_non_null(m->b);
  }
  memmove(&m->b[i + 1], &m->b[i], (m->n - i) * sizeof *m->b);
  m->b[i] = x;
  m->n++;
}
static void r_erase(rmodel *m, size_t i) {
  memmove(&m->b[i], &m->b[i + 1], (m->n - i - 1) * sizeof *m->b);
  m->n--;
}
static int r_whole(const rmodel *m, size_t i) {
  return (i == 0 || m->b[i - 1].seg != m->b[i].seg) &&
         (i + 1 == m->n || m->b[i + 1].seg != m->b[i].seg);
}
static void r_peak(uint64_t *cur, uint64_t *peak, uint64_t add) {
  *cur += add;
  if (*cur > *peak) *peak = *cur;
}

static vl_status r_malloc(rmodel *m, uint64_t bytes, uint64_t *h) {
  *h = 0;
  if (!bytes) return VL_OK;
  uint64_t size = bytes < 512 ? 512 : (bytes + 511) / 512 * 512;
  int small = size <= MiB;
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < m->n; i++)
    if (!m->b[i].used && m->b[i].small == small && m->b[i].size >= size &&
        (best == SIZE_MAX || m->b[i].size < m->b[best].size))
      best = i;
  if (best == SIZE_MAX) {
    uint64_t seg = small ? 2 * MiB : size < 10 * MiB ? 20 * MiB : (size + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
    if (m->capacity && m->s.reserved + seg > m->capacity) {
      m->s.n_retries++;
      for (size_t i = 0; i < m->n;) {
        if (!m->b[i].used && r_whole(m, i)) {
          m->s.reserved -= m->b[i].size;
          m->s.segments--;
          m->s.n_segment_free++;
          r_erase(m, i);
        } else {
          i++;
        }
      }
      if (m->s.reserved + seg > m->capacity) { m->s.n_oom++; return VL_ERR_OOM; }
    }
    best = m->n;
    r_insert(m, best, (rblk){m->next_addr, seg, 0, m->nseg++, small, 0});
    m->next_addr += seg;
    r_peak(&m->s.reserved, &m->s.reserved_peak, seg);
    r_peak(&m->s.segments, &m->s.segments_peak, 1);
    m->s.n_segment_alloc++;
  }
  uint64_t rest = m->b[best].size - size;
  if (small ? rest >= 512 : rest > MiB) {
    rblk r = m->b[best];
    r.addr += size;
    r.size = rest;
    m->b[best].size = size;
    r_insert(m, best + 1, r);
  }
  m->b[best].used = 1;
  m->b[best].req = bytes;
  r_peak(&m->s.allocated, &m->s.allocated_peak, m->b[best].size);
  r_peak(&m->s.requested, &m->s.requested_peak, bytes);
  m->s.live_blocks++;
  m->s.n_alloc++;
  *h = m->b[best].addr;
  return VL_OK;
}

static void r_free(rmodel *m, uint64_t h) {
  size_t i = 0;
  while (i < m->n && m->b[i].addr != h) i++;
  assert_true(i < m->n && m->b[i].used);
  m->b[i].used = 0;
  m->s.allocated -= m->b[i].size;
  m->s.requested -= m->b[i].req;
  m->s.live_blocks--;
  m->s.n_free++;
  if (i + 1 < m->n && !m->b[i + 1].used && m->b[i + 1].seg == m->b[i].seg) {
    m->b[i].size += m->b[i + 1].size;
    r_erase(m, i + 1);
  }
  if (i > 0 && !m->b[i - 1].used && m->b[i - 1].seg == m->b[i].seg) {
    m->b[i - 1].size += m->b[i].size;
    r_erase(m, i);
  }
}

static void check_same(const rmodel *m, const vl_cachealloc *ca, int step) {
  vl_ca_stats s = st(ca), r = m->s;
  size_t nfree = 0;
  for (size_t i = 0; i < m->n; i++) nfree += !m->b[i].used;
  r.free_blocks = nfree;
  if (memcmp(&s, &r, sizeof s)) {
    print_error("step %d: allocated %llu/%llu reserved %llu/%llu segments %llu/%llu "
                "free blocks %llu/%llu\n", step,
                (unsigned long long)s.allocated, (unsigned long long)r.allocated,
                (unsigned long long)s.reserved, (unsigned long long)r.reserved,
                (unsigned long long)s.segments, (unsigned long long)r.segments,
                (unsigned long long)s.free_blocks, (unsigned long long)r.free_blocks);
    fail();
  }
}

/* 20000 random events (sizes from 0 B to 48 MiB, most small, frees of random live
 * handles), unlimited and with a 256 MiB capacity (releases and OOMs happen): every
 * handle, status and statistic equals the reference model's, and at the end, everything
 * freed, each segment is one free block again. */
static void run_random(uint64_t capacity, uint64_t seed) {
  vl_cachealloc *ca = mk(capacity);
  rmodel m = {.capacity = capacity, .next_addr = 2 * MiB};
  vl_rng rng;
  vl_rng_seed(&rng, seed);
  uint64_t live[600];
  int nlive = 0, ooms = 0;
  for (int step = 0; step < 20000; step++) {
    int do_free = nlive == 600 || (nlive > 0 && vl_rng_below(&rng, 100) < 45);
    if (do_free) {
      int k = (int)vl_rng_below(&rng, (uint64_t)nlive);
      vl_cachealloc_free(ca, live[k]);
      r_free(&m, live[k]);
      live[k] = live[--nlive];
    } else {
      uint64_t kind = vl_rng_below(&rng, 100), bytes;
      if (kind < 3) bytes = 0;
      else if (kind < 60) bytes = 1 + vl_rng_below(&rng, 64 * KiB);
      else if (kind < 75) bytes = 1 + vl_rng_below(&rng, MiB + 4 * KiB);
      else if (kind < 95) bytes = 1 + vl_rng_below(&rng, 12 * MiB);
      else bytes = 1 + vl_rng_below(&rng, 48 * MiB);
      uint64_t h, hr;
      vl_status a = vl_cachealloc_malloc(ca, bytes, &h);
      vl_status b = r_malloc(&m, bytes, &hr);
      assert_int_equal(a, b);
      assert_int_equal(h, hr);
      ooms += a == VL_ERR_OOM;
      if (h) live[nlive++] = h;
    }
    check_same(&m, ca, step);
  }
  if (capacity) assert_true(ooms > 0);
  while (nlive) {
    vl_cachealloc_free(ca, live[nlive - 1]);
    r_free(&m, live[--nlive]);
  }
  check_same(&m, ca, -1);
  vl_ca_stats s = st(ca);
  assert_int_equal(s.allocated, 0);
  assert_int_equal(s.requested, 0);
  assert_int_equal(s.free_blocks, s.segments);
  free(m.b);
  vl_cachealloc_destroy(ca);
}

static void test_random_vs_reference(void **state) {
  (void)state;
  run_random(0, 1);
  run_random(256 * MiB, 2);
  run_random(96 * MiB, 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounding),
      cmocka_unit_test(test_small_segment_shared),
      cmocka_unit_test(test_large_buffer_shared),
      cmocka_unit_test(test_large_segment_sizes),
      cmocka_unit_test(test_large_no_split_boundary),
      cmocka_unit_test(test_merge_on_free),
      cmocka_unit_test(test_best_fit),
      cmocka_unit_test(test_capacity_release_then_oom),
      cmocka_unit_test(test_hand_worked_sequence),
      cmocka_unit_test(test_random_vs_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
