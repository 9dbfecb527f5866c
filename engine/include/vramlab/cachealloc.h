/* A deterministic simulation of PyTorch's CUDA caching allocator (the native
 * DeviceCachingAllocator of c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.x) at its default
 * settings: one device, one stream, no expandable segments, max_split_size unlimited, no
 * roundup_power2_divisions, no garbage_collection_threshold, no CUDA graphs. It answers
 * what torch.cuda.max_memory_allocated() and max_memory_reserved() would read for a
 * sequence of tensor allocations and frees, without a GPU.
 *
 * The rules (engine/core/cachealloc.c holds them, with where they come from):
 *  - a request of n bytes is rounded up to a multiple of 512 (at least 512); 0 bytes gets
 *    the null handle and counts nothing, as PyTorch's allocate(0) does;
 *  - rounded sizes <= 1 MiB go to the small pool, larger ones to the large pool;
 *  - best fit in the request's pool: the smallest free block that holds the rounded size,
 *    the lowest address among equal sizes;
 *  - on a miss a new segment ("cudaMalloc") of 2 MiB (small), 20 MiB (large, < 10 MiB) or
 *    the size rounded up to 2 MiB (>= 10 MiB);
 *  - the found block is split when the remainder is >= 512 B (small pool) or > 1 MiB (large
 *    pool); otherwise the whole block is handed out and counted as allocated;
 *  - a freed block merges with free neighbours of its own segment;
 *  - segments are kept (no empty_cache) unless a capacity is set: a new segment that would
 *    take reserved bytes past it first releases every wholly free segment of both pools
 *    (release_cached_blocks), then is tried once more; still over: out of memory. This is
 *    torch.cuda.set_per_process_memory_fraction's check (allowed_memory_maximum).
 *
 * Simulated addresses: segment bases are handed out in creation order from 2 MiB upwards
 * and never reused (a released segment's range stays unused), so "lowest address" means
 * the earliest-made segment, then the lowest offset in it. Real cudaMalloc addresses are
 * the driver's; only ties between equal-size free blocks can differ from a real run. */
#ifndef VRAMLAB_CACHEALLOC_H
#define VRAMLAB_CACHEALLOC_H

#include <stdint.h>

#include "vramlab/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vl_cachealloc vl_cachealloc;

/* The constants of CUDACachingAllocator.cpp, in bytes. */
#define VL_CA_MIN_BLOCK 512u               /* kMinBlockSize: sizes round to multiples of it */
#define VL_CA_SMALL_SIZE 1048576u          /* kSmallSize: largest small-pool request */
#define VL_CA_SMALL_BUFFER 2097152u        /* kSmallBuffer: a small-pool segment */
#define VL_CA_MIN_LARGE_ALLOC 10485760u    /* kMinLargeAlloc: below it a 20 MiB segment */
#define VL_CA_LARGE_BUFFER 20971520u       /* kLargeBuffer */
#define VL_CA_ROUND_LARGE 2097152u         /* kRoundLarge: larger segments round to it */
/* Largest request accepted (bytes); more is VL_ERR_INVALID, not a simulated OOM. */
#define VL_CA_MAX_REQUEST ((uint64_t)1 << 62)

typedef struct {
  /* torch.cuda.memory_stats() "allocated_bytes.all": sizes of handed-out blocks (rounded,
   * plus any unsplit remainder). peak: max_memory_allocated(). */
  uint64_t allocated, allocated_peak;
  /* "reserved_bytes.all": bytes in segments. peak: max_memory_reserved(). */
  uint64_t reserved, reserved_peak;
  /* "requested_bytes.all": the callers' unrounded byte counts of live allocations. */
  uint64_t requested, requested_peak;
  uint64_t segments, segments_peak; /* "segment.all": segments held */
  uint64_t live_blocks;             /* "allocation.all" current: blocks handed out */
  uint64_t free_blocks;             /* cached free blocks, both pools */
  uint64_t n_alloc;                 /* successful mallocs of > 0 bytes */
  uint64_t n_free;                  /* frees of live handles */
  uint64_t n_oom;                   /* mallocs that failed for the capacity ("num_ooms") */
  uint64_t n_retries;               /* capacity misses that released cached segments
                                     * and tried again ("num_alloc_retries") */
  uint64_t n_segment_alloc;         /* segments made ("num_device_alloc") */
  uint64_t n_segment_free;          /* segments released ("num_device_free") */
  uint64_t n_bad_free;              /* frees of handles that are not live (caller bugs) */
} vl_ca_stats;

/* capacity: bytes the reserved total may reach; 0: unlimited. VL_ERR_OOM when the
 * simulator's own host memory cannot be had. */
vl_status vl_cachealloc_create(vl_cachealloc **out, uint64_t capacity);
void vl_cachealloc_destroy(vl_cachealloc *ca);
/* Allocate `bytes`; *handle is the block's simulated device address (0 for 0 bytes, and
 * on failure). VL_OK; VL_ERR_OOM: over the capacity even after releasing every wholly free
 * segment (the caller reports "out of memory"; the state is as PyTorch leaves it: the
 * released segments stay released); VL_ERR_INVALID: bytes > VL_CA_MAX_REQUEST;
 * VL_ERR_BACKEND: the simulator's host memory ran out (nothing changed). */
vl_status vl_cachealloc_malloc(vl_cachealloc *ca, uint64_t bytes, uint64_t *handle);
/* Free a handle from vl_cachealloc_malloc. 0 does nothing; a handle that is not live
 * counts in n_bad_free and changes nothing else. */
void vl_cachealloc_free(vl_cachealloc *ca, uint64_t handle);
void vl_cachealloc_stats(const vl_cachealloc *ca, vl_ca_stats *out);
/* Peaks := current values (torch.cuda.reset_peak_memory_stats()). */
void vl_cachealloc_reset_peaks(vl_cachealloc *ca);
/* The rounded size (round_size) and the segment size a miss of that rounded size makes
 * (get_allocation_size), for callers that reason about them. */
uint64_t vl_cachealloc_round_size(uint64_t bytes);
uint64_t vl_cachealloc_segment_size(uint64_t rounded);

#ifdef __cplusplus
}
#endif
#endif
