/* The arena: the measuring instrument of every device byte (docs/architecture.md "Memory accounting").
 * Best-fit over a sorted free list with coalescing, fixed alignment, one reservation.
 * The same code runs in VIRTUAL mode for the planner, so a planned allocation sequence
 * lands at the same offsets, with the same peak and the same fragmentation, as a real one. */
#include "vramlab/core.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct { size_t off, size; } seg;
typedef struct { size_t off, size; int cat; } blk;

struct vl_arena {
  vl_arena_mode mode;
  char *base;
  size_t limit;      /* bytes addressable: the cap, or the no-cap extent */
  size_t cap;        /* VL_NO_CAP when uncapped */
  size_t mapped;     /* bytes mmapped (HOST mode) */
  seg *fr; size_t nfr, cfr;   /* free segments sorted by offset */
  blk *bl; size_t nbl, cbl;   /* live blocks sorted by offset */
  vl_mem_stats stats;
  bool log_on; double log_t0;
  vl_mem_event *log; size_t nlog, clog;
  int64_t seq;
};

/* Address space used when no cap is given: large enough for any full-scale plan. */
#define VIRTUAL_NO_CAP_EXTENT ((size_t)1 << 50)
#define HOST_NO_CAP_EXTENT ((size_t)64 << 30)

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap * 2 : 64;
  while (nc < need) nc *= 2;
  void *q = realloc(*p, nc * elem);
  if (!q) return -1;
  *p = q; *cap = nc;
  return 0;
}

vl_status vl_arena_create(vl_arena **out, vl_arena_mode mode, size_t cap, void *external_base) {
  *out = NULL;
  vl_arena *a = calloc(1, sizeof *a);
  if (!a) return VL_ERR_OOM;
  a->mode = mode;
  a->cap = cap;
  a->stats.cap = cap;
  if (cap == VL_NO_CAP)
    a->limit = mode == VL_ARENA_VIRTUAL ? VIRTUAL_NO_CAP_EXTENT : HOST_NO_CAP_EXTENT;
  else
    a->limit = cap / VL_ARENA_ALIGN * VL_ARENA_ALIGN;
  if (mode == VL_ARENA_HOST && a->limit > 0) {
    /* Reserve address space only; pages are touched (and become RSS) lazily. */
    void *p = mmap(NULL, a->limit, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { free(a); return VL_ERR_OOM; }
    a->base = p;
    a->mapped = a->limit;
  } else if (mode == VL_ARENA_EXTERNAL) {
    a->base = external_base;
  }
  if (grow((void **)&a->fr, &a->cfr, 1, sizeof(seg))) { vl_arena_destroy(a); return VL_ERR_OOM; }
  if (a->limit > 0) { a->fr[0] = (seg){0, a->limit}; a->nfr = 1; }
  *out = a;
  return VL_OK;
}

void vl_arena_destroy(vl_arena *a) {
  if (!a) return;
  if (a->mode == VL_ARENA_HOST && a->base) munmap(a->base, a->mapped);
  free(a->fr); free(a->bl); free(a->log);
  free(a);
}

void *vl_arena_base(const vl_arena *a) { return a->base; }

static void log_event(vl_arena *a, int cat, int64_t delta) {
  a->seq++;
  if (!a->log_on) return;
  if (grow((void **)&a->log, &a->clog, a->nlog + 1, sizeof(vl_mem_event))) return;
  a->log[a->nlog++] = (vl_mem_event){vl_now() - a->log_t0, a->seq, cat, delta, a->stats.cur_total};
}

/* First block index with off >= key. */
static size_t blk_lower(const vl_arena *a, size_t key) {
  size_t lo = 0, hi = a->nbl;
  while (lo < hi) { size_t m = (lo + hi) / 2; if (a->bl[m].off < key) lo = m + 1; else hi = m; }
  return lo;
}
static size_t seg_lower(const vl_arena *a, size_t key) {
  size_t lo = 0, hi = a->nfr;
  while (lo < hi) { size_t m = (lo + hi) / 2; if (a->fr[m].off < key) lo = m + 1; else hi = m; }
  return lo;
}

vl_status vl_arena_alloc(vl_arena *a, size_t bytes, vl_mem_cat cat, size_t *off) {
  if (bytes == 0) bytes = 1;
  size_t need = (bytes + VL_ARENA_ALIGN - 1) / VL_ARENA_ALIGN * VL_ARENA_ALIGN;
  /* Best fit: the smallest free segment that holds `need`; ties go to the lowest offset. */
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < a->nfr; i++)
    if (a->fr[i].size >= need && (best == SIZE_MAX || a->fr[i].size < a->fr[best].size)) best = i;
  if (best == SIZE_MAX) { a->stats.n_oom++; return VL_ERR_OOM; }
  if (grow((void **)&a->bl, &a->cbl, a->nbl + 1, sizeof(blk))) return VL_ERR_OOM;
  size_t o = a->fr[best].off;
  if (a->fr[best].size == need) {
    memmove(&a->fr[best], &a->fr[best + 1], (a->nfr - best - 1) * sizeof(seg));
    a->nfr--;
  } else {
    a->fr[best].off += need;
    a->fr[best].size -= need;
  }
  size_t k = blk_lower(a, o);
  memmove(&a->bl[k + 1], &a->bl[k], (a->nbl - k) * sizeof(blk));
  a->bl[k] = (blk){o, need, (int)cat};
  a->nbl++;

  vl_mem_stats *s = &a->stats;
  s->cur[cat] += need;
  if (s->cur[cat] > s->peak[cat]) s->peak[cat] = s->cur[cat];
  s->cur_total += need;
  if (s->cur_total > s->peak_total) {
    s->peak_total = s->cur_total;
    memcpy(s->at_peak, s->cur, sizeof s->cur);
  }
  if (o + need > s->reserved) s->reserved = o + need;
  s->n_alloc++;
  log_event(a, (int)cat, (int64_t)need);
  *off = o;
  return VL_OK;
}

void vl_arena_free(vl_arena *a, size_t off) {
  size_t k = blk_lower(a, off);
  if (k >= a->nbl || a->bl[k].off != off) { a->stats.n_bad_free++; return; } /* double free */
  blk b = a->bl[k];
  memmove(&a->bl[k], &a->bl[k + 1], (a->nbl - k - 1) * sizeof(blk));
  a->nbl--;
  a->stats.cur[b.cat] -= b.size;
  a->stats.cur_total -= b.size;
  a->stats.n_free++;
  log_event(a, b.cat, -(int64_t)b.size);

  /* Insert the segment and coalesce with its neighbours. */
  size_t i = seg_lower(a, b.off);
  bool merge_prev = i > 0 && a->fr[i - 1].off + a->fr[i - 1].size == b.off;
  bool merge_next = i < a->nfr && b.off + b.size == a->fr[i].off;
  if (merge_prev && merge_next) {
    a->fr[i - 1].size += b.size + a->fr[i].size;
    memmove(&a->fr[i], &a->fr[i + 1], (a->nfr - i - 1) * sizeof(seg));
    a->nfr--;
  } else if (merge_prev) {
    a->fr[i - 1].size += b.size;
  } else if (merge_next) {
    a->fr[i].off = b.off;
    a->fr[i].size += b.size;
  } else {
    if (grow((void **)&a->fr, &a->cfr, a->nfr + 1, sizeof(seg))) return; /* leaks the range */
    memmove(&a->fr[i + 1], &a->fr[i], (a->nfr - i) * sizeof(seg));
    a->fr[i] = (seg){b.off, b.size};
    a->nfr++;
  }
}

void vl_arena_stats(const vl_arena *a, vl_mem_stats *s) {
  *s = a->stats;
  /* Fragmentation below the top live block: free holes that a large request can't use. */
  size_t top = a->nbl ? a->bl[a->nbl - 1].off + a->bl[a->nbl - 1].size : 0;
  size_t fb = 0, lf = 0;
  for (size_t i = 0; i < a->nfr && a->fr[i].off < top; i++) {
    fb += a->fr[i].size;
    if (a->fr[i].size > lf) lf = a->fr[i].size;
  }
  s->free_bytes = fb;
  s->largest_free = lf;
  s->fragmentation = fb ? 1.0 - (double)lf / (double)fb : 0.0;
}

void vl_arena_reset_peaks(vl_arena *a) {
  memcpy(a->stats.peak, a->stats.cur, sizeof a->stats.cur);
  memcpy(a->stats.at_peak, a->stats.cur, sizeof a->stats.cur);
  a->stats.peak_total = a->stats.cur_total;
  size_t top = a->nbl ? a->bl[a->nbl - 1].off + a->bl[a->nbl - 1].size : 0;
  a->stats.reserved = top;
}

size_t vl_arena_live_blocks(const vl_arena *a) { return a->nbl; }

void vl_arena_log_enable(vl_arena *a, bool on) {
  a->log_on = on;
  if (on) { a->log_t0 = vl_now(); a->seq = 0; }
}
const vl_mem_event *vl_arena_log(const vl_arena *a, size_t *n) { *n = a->nlog; return a->log; }
void vl_arena_log_clear(vl_arena *a) { a->nlog = 0; }
