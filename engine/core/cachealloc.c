/* A simulation of PyTorch's CUDA caching allocator (vramlab/cachealloc.h says what it
 * covers). The rules follow c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x), at default
 * settings: round_size, get_pool, get_allocation_size, get_free_block, should_split,
 * alloc_found_block, free_block/try_merge_blocks, and malloc's fallback chain
 * alloc_block -> release_cached_blocks -> alloc_block (release_available_cached_blocks is a
 * no-op while max_split_size is unlimited).
 *
 * Data structures, for millions of events a second:
 *  - blocks live in one array of slots (a stack of unused slot numbers), linked to their
 *    neighbours in the same segment by slot number (PyTorch's Block::prev/next);
 *  - each pool's free blocks are an array sorted by (size, address): best fit is a binary
 *    search for the first entry >= (rounded size, 0), as PyTorch's std::set lower_bound with
 *    BlockComparatorSize (stream, size, ptr) on one stream;
 *  - live blocks are found from their handle (address) in an open-addressing hash table.
 * A segment needs no record of its own: a free block without neighbours is a wholly free
 * segment, which is what release_cached_blocks looks for. */
#include "vramlab/cachealloc.h"

#include <stdlib.h>
#include <string.h>

#define NIL (-1)

typedef struct {
  uint64_t addr, size;
  uint64_t req;       /* the caller's unrounded bytes while allocated */
  int32_t prev, next; /* neighbours in the segment, NIL at its ends */
  uint8_t small, allocated;
} ca_block;

typedef struct {
  uint64_t size, addr;
  int32_t blk;
} ca_free;

typedef struct {
  ca_free *v;
  size_t n, cap;
} ca_freeset;

struct vl_cachealloc {
  uint64_t capacity;  /* 0: unlimited */
  uint64_t next_addr; /* base of the next segment */
  ca_block *bl;
  int32_t nbl, cbl;   /* slots used (high-water), slots allocated */
  int32_t *spare;     /* unused slot numbers below nbl */
  int32_t nspare, cspare;
  ca_freeset pool[2]; /* [0] large, [1] small */
  size_t pool_blocks[2]; /* blocks of each pool, free or not: the free set's capacity is
                          * kept above it, so a free never has to grow it */
  uint64_t *hkey;     /* address of a live block; 0: empty */
  int32_t *hval;
  size_t hcap, hn;    /* hcap a power of two, load <= 1/2 */
  vl_ca_stats st;
};

uint64_t vl_cachealloc_round_size(uint64_t bytes) {
  if (bytes < VL_CA_MIN_BLOCK) return VL_CA_MIN_BLOCK;
  return (bytes + VL_CA_MIN_BLOCK - 1) / VL_CA_MIN_BLOCK * VL_CA_MIN_BLOCK;
}

uint64_t vl_cachealloc_segment_size(uint64_t rounded) {
  if (rounded <= VL_CA_SMALL_SIZE) return VL_CA_SMALL_BUFFER;
  if (rounded < VL_CA_MIN_LARGE_ALLOC) return VL_CA_LARGE_BUFFER;
  return (rounded + VL_CA_ROUND_LARGE - 1) / VL_CA_ROUND_LARGE * VL_CA_ROUND_LARGE;
}

/* ---- growth: everything malloc may need is grown before anything changes ---------- */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap * 2 : 64;
  while (nc < need) nc *= 2;
  void *q = realloc(*p, nc * elem);
  if (!q) return -1;
  *p = q;
  *cap = nc;
  return 0;
}

static int grow32(void **p, int32_t *cap, size_t need, size_t elem) {
  size_t c = (size_t)*cap;
  if (need > (size_t)INT32_MAX) return -1;
  if (grow(p, &c, need, elem)) return -1;
  *cap = c > (size_t)INT32_MAX ? INT32_MAX : (int32_t)c;
  return 0;
}

/* ---- the live-block hash table (address -> slot) ------------------------------------ */

static size_t hslot(uint64_t addr, size_t cap) {
  return (size_t)(((addr >> 9) * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static void hput_raw(uint64_t *key, int32_t *val, size_t cap, uint64_t addr, int32_t b) {
  size_t i = hslot(addr, cap);
  while (key[i]) i = (i + 1) & (cap - 1);
  key[i] = addr;
  val[i] = b;
}

static int hreserve(vl_cachealloc *ca, size_t n) {
  if (2 * n <= ca->hcap) return 0;
  size_t nc = ca->hcap ? ca->hcap : 256;
  while (2 * n > nc) nc *= 2;
  uint64_t *k = calloc(nc, sizeof *k);
  int32_t *v = malloc(nc * sizeof *v);
  if (!k || !v) { free(k); free(v); return -1; }
  for (size_t i = 0; i < ca->hcap; i++)
    if (ca->hkey[i]) hput_raw(k, v, nc, ca->hkey[i], ca->hval[i]);
  free(ca->hkey);
  free(ca->hval);
  ca->hkey = k;
  ca->hval = v;
  ca->hcap = nc;
  return 0;
}

static size_t hfind(const vl_cachealloc *ca, uint64_t addr) {
  if (!ca->hcap) return SIZE_MAX;
  size_t i = hslot(addr, ca->hcap);
  while (ca->hkey[i]) {
    if (ca->hkey[i] == addr) return i;
    i = (i + 1) & (ca->hcap - 1);
  }
  return SIZE_MAX;
}

/* Remove entry i, shifting back the entries of its probe run (no tombstones). */
static void hdel(vl_cachealloc *ca, size_t i) {
  size_t m = ca->hcap - 1, j = i;
  for (;;) {
    j = (j + 1) & m;
    if (!ca->hkey[j]) break;
    size_t h = hslot(ca->hkey[j], ca->hcap);
    /* entry j may move to i unless its home lies cyclically in (i, j] */
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      ca->hkey[i] = ca->hkey[j];
      ca->hval[i] = ca->hval[j];
      i = j;
    }
  }
  ca->hkey[i] = 0;
  ca->hn--;
}

/* ---- the free sets, sorted by (size, address) ------------------------------------- */

static inline int fs_less(const ca_free *e, uint64_t size, uint64_t addr) {
  return (e->size < size) | ((e->size == size) & (e->addr < addr));
}

/* First entry >= (size, addr), by branch-free halving: the comparisons are unpredictable,
 * and this ran a random 2M-event replay about a fifth faster than a branchy search. */
static size_t fs_lower(const ca_freeset *f, uint64_t size, uint64_t addr) {
  size_t n = f->n, base = 0;
  if (!n) return 0;
  while (n > 1) {
    size_t half = n / 2;
    base = fs_less(&f->v[base + half], size, addr) ? base + half : base;
    n -= half;
  }
  return base + (size_t)fs_less(&f->v[base], size, addr);
}

/* Room for the insert: malloc keeps each free set's capacity above its pool's block count. */
static void fs_insert(vl_cachealloc *ca, int32_t b) {
  const ca_block *k = &ca->bl[b];
  ca_freeset *f = &ca->pool[k->small];
  size_t i = fs_lower(f, k->size, k->addr);
  memmove(&f->v[i + 1], &f->v[i], (f->n - i) * sizeof *f->v);
  f->v[i] = (ca_free){k->size, k->addr, b};
  f->n++;
}

static void fs_erase_at(ca_freeset *f, size_t i) {
  memmove(&f->v[i], &f->v[i + 1], (f->n - i - 1) * sizeof *f->v);
  f->n--;
}

static void fs_erase(vl_cachealloc *ca, int32_t b) {
  const ca_block *k = &ca->bl[b];
  ca_freeset *f = &ca->pool[k->small];
  size_t i = fs_lower(f, k->size, k->addr);
  if (i < f->n && f->v[i].blk == b) fs_erase_at(f, i);
}

static int fs_reserve(ca_freeset *f, size_t n) {
  return grow((void **)&f->v, &f->cap, n, sizeof *f->v);
}

/* ---- block slots ------------------------------------------------------------------ */

static int slots_reserve(vl_cachealloc *ca, int32_t n) {
  if (ca->nspare >= n) return 0;
  int64_t need = (int64_t)ca->nbl + (n - ca->nspare);
  if (need > INT32_MAX) return -1;
  if (grow32((void **)&ca->bl, &ca->cbl, (size_t)need, sizeof *ca->bl)) return -1;
  /* a slot freed later goes on the stack: room for every slot there is */
  return grow32((void **)&ca->spare, &ca->cspare, (size_t)need, sizeof *ca->spare);
}

static int32_t slot_new(vl_cachealloc *ca) {
  return ca->nspare ? ca->spare[--ca->nspare] : ca->nbl++;
}

static void slot_drop(vl_cachealloc *ca, int32_t b) { ca->spare[ca->nspare++] = b; }

/* ---- create / destroy ---------------------------------------------------------------- */

vl_status vl_cachealloc_create(vl_cachealloc **out, uint64_t capacity) {
  *out = NULL;
  vl_cachealloc *ca = calloc(1, sizeof *ca);
  if (!ca) return VL_ERR_OOM;
  ca->capacity = capacity;
  ca->next_addr = VL_CA_SMALL_BUFFER; /* address 0 stays the null handle */
  *out = ca;
  return VL_OK;
}

void vl_cachealloc_destroy(vl_cachealloc *ca) {
  if (!ca) return;
  free(ca->bl);
  free(ca->spare);
  free(ca->pool[0].v);
  free(ca->pool[1].v);
  free(ca->hkey);
  free(ca->hval);
  free(ca);
}

/* ---- malloc ------------------------------------------------------------------------ */

static void bump(uint64_t *cur, uint64_t *peak, uint64_t add) {
  *cur += add;
  if (*cur > *peak) *peak = *cur;
}

/* release_cached_blocks: every free block without neighbours is a whole segment: give it
 * back ("cudaFree"). Both pools, as PyTorch releases large then small. */
static void release_cached(vl_cachealloc *ca) {
  for (int p = 0; p < 2; p++) {
    ca_freeset *f = &ca->pool[p];
    size_t w = 0;
    for (size_t i = 0; i < f->n; i++) {
      int32_t b = f->v[i].blk;
      if (ca->bl[b].prev == NIL && ca->bl[b].next == NIL) {
        ca->st.reserved -= ca->bl[b].size;
        ca->st.segments--;
        ca->st.n_segment_free++;
        ca->pool_blocks[p]--;
        slot_drop(ca, b);
      } else {
        f->v[w++] = f->v[i];
      }
    }
    f->n = w;
  }
}

vl_status vl_cachealloc_malloc(vl_cachealloc *ca, uint64_t bytes, uint64_t *handle) {
  *handle = 0;
  if (bytes == 0) return VL_OK; /* allocate(0): a null pointer, no stats */
  if (bytes > VL_CA_MAX_REQUEST) return VL_ERR_INVALID;
  const uint64_t size = vl_cachealloc_round_size(bytes);
  const int small = size <= VL_CA_SMALL_SIZE;
  ca_freeset *f = &ca->pool[small];
  /* at most two more blocks (a new segment's, a split remainder) and one more live one */
  if (slots_reserve(ca, 2) || fs_reserve(f, ca->pool_blocks[small] + 2) ||
      hreserve(ca, ca->hn + 1))
    return VL_ERR_BACKEND;

  int32_t b;
  size_t i = fs_lower(f, size, 0);
  if (i < f->n) { /* get_free_block */
    b = f->v[i].blk;
    fs_erase_at(f, i);
  } else { /* alloc_block: a new segment */
    const uint64_t seg = vl_cachealloc_segment_size(size);
    if (ca->capacity && ca->st.reserved + seg > ca->capacity) {
      /* alloc_block failed; release_cached_blocks, then alloc_block once more */
      ca->st.n_retries++;
      release_cached(ca);
      if (ca->st.reserved + seg > ca->capacity) {
        ca->st.n_oom++;
        return VL_ERR_OOM;
      }
    }
    b = slot_new(ca);
    ca->bl[b] = (ca_block){.addr = ca->next_addr, .size = seg, .prev = NIL, .next = NIL,
                           .small = (uint8_t)small};
    ca->next_addr += seg;
    ca->pool_blocks[small]++;
    bump(&ca->st.reserved, &ca->st.reserved_peak, seg);
    bump(&ca->st.segments, &ca->st.segments_peak, 1);
    ca->st.n_segment_alloc++;
  }

  /* should_split, then alloc_found_block: the front is handed out, the rest stays free */
  const uint64_t remaining = ca->bl[b].size - size;
  if (small ? remaining >= VL_CA_MIN_BLOCK : remaining > VL_CA_SMALL_SIZE) {
    int32_t r = slot_new(ca);
    ca_block *k = &ca->bl[b];
    ca->bl[r] = (ca_block){.addr = k->addr + size, .size = remaining, .prev = b,
                           .next = k->next, .small = k->small};
    if (k->next != NIL) ca->bl[k->next].prev = r;
    k->next = r;
    k->size = size;
    ca->pool_blocks[small]++;
    fs_insert(ca, r);
  }
  ca_block *k = &ca->bl[b];
  k->allocated = 1;
  k->req = bytes;
  hput_raw(ca->hkey, ca->hval, ca->hcap, k->addr, b);
  ca->hn++;
  bump(&ca->st.allocated, &ca->st.allocated_peak, k->size);
  bump(&ca->st.requested, &ca->st.requested_peak, bytes);
  ca->st.live_blocks++;
  ca->st.n_alloc++;
  *handle = k->addr;
  return VL_OK;
}

/* ---- free -------------------------------------------------------------------------- */

/* try_merge_blocks: absorb neighbour src into dst when src is free. */
static void merge(vl_cachealloc *ca, int32_t dst, int32_t src) {
  if (src == NIL || ca->bl[src].allocated) return;
  fs_erase(ca, src);
  ca_block *d = &ca->bl[dst], *s = &ca->bl[src];
  if (d->prev == src) { /* [src dst] */
    d->addr = s->addr;
    d->prev = s->prev;
    if (d->prev != NIL) ca->bl[d->prev].next = dst;
  } else { /* [dst src] */
    d->next = s->next;
    if (d->next != NIL) ca->bl[d->next].prev = dst;
  }
  d->size += s->size;
  ca->pool_blocks[d->small]--;
  slot_drop(ca, src);
}

void vl_cachealloc_free(vl_cachealloc *ca, uint64_t handle) {
  if (handle == 0) return;
  size_t h = hfind(ca, handle);
  if (h == SIZE_MAX) { ca->st.n_bad_free++; return; }
  int32_t b = ca->hval[h];
  hdel(ca, h);
  ca_block *k = &ca->bl[b];
  k->allocated = 0;
  ca->st.allocated -= k->size;
  ca->st.requested -= k->req;
  k->req = 0;
  ca->st.live_blocks--;
  ca->st.n_free++;
  merge(ca, b, ca->bl[b].prev); /* free_block: merge, then back into the pool */
  merge(ca, b, ca->bl[b].next);
  fs_insert(ca, b); /* room: the free set's capacity exceeds its pool's block count */
}

/* ---- stats --------------------------------------------------------------------------- */

void vl_cachealloc_stats(const vl_cachealloc *ca, vl_ca_stats *out) {
  *out = ca->st;
  out->free_blocks = ca->pool[0].n + ca->pool[1].n;
}

void vl_cachealloc_reset_peaks(vl_cachealloc *ca) {
  ca->st.allocated_peak = ca->st.allocated;
  ca->st.reserved_peak = ca->st.reserved;
  ca->st.requested_peak = ca->st.requested;
  ca->st.segments_peak = ca->st.segments;
}
