/* A generic prefetching batch producer: worker threads fill numbered batch buffers with a
 * caller's function, and the consumer takes them in order (the parallel map + prefetch of
 * PyTorch's DataLoader, for inputs that are not images to decode: records of a latent
 * cache). The image pipeline (vramlab/data.h) has its own loader with sampling, transforms
 * and corrupt-sample handling; this one only orders and overlaps the work.
 *
 * Batch k is filled by worker k % workers into slot k % slots, slots = workers x prefetch
 * + 1 (one held by the consumer while the others fill), so at most workers x prefetch
 * batches are filled ahead of the one in use. Delivery is in order whichever worker
 * finishes first, and the buffers a fill sees do not depend on timing: results are the
 * same for any worker count. With workers = 0 every batch is filled inside
 * vl_prefetch_next, in the caller's thread. */
#ifndef VRAMLAB_PREFETCH_H
#define VRAMLAB_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "vramlab/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VL_PREFETCH_MAX_WORKERS 256

/* Fill batch k into buf (buf_bytes bytes, 64-byte aligned) on worker `worker` (0 with
 * workers = 0). Called from several threads at once for different k. VL_OK, or a status
 * with a message in err (delivered to the consumer when it reaches batch k). */
typedef vl_status (*vl_prefetch_fill_fn)(void *user, int worker, int64_t k, void *buf, vl_err *err);

typedef struct {
  int workers;       /* 0: fill in the consumer's thread */
  int prefetch;      /* batches in flight per worker, >= 1 */
  size_t buf_bytes;  /* one batch buffer */
  int64_t n_batches; /* batches 0..n-1, then the end */
  vl_prefetch_fill_fn fill;
  void *user;
} vl_prefetch_cfg;

typedef struct vl_prefetch vl_prefetch;

/* Check the config, allocate the slots and start the workers (VL_ERR_INVALID /
 * VL_ERR_OOM with the message in err). */
vl_status vl_prefetch_create(vl_prefetch **out, const vl_prefetch_cfg *cfg, vl_err *err);
/* The next batch in order: *buf and its number *k; *buf = NULL after the last. *wait:
 * seconds spent waiting for it (0 with workers = 0: the fill time is then in the call).
 * The previous batch must have been released. A failed fill returns its status with its
 * message in err, and so does every later call. */
vl_status vl_prefetch_next(vl_prefetch *p, void **buf, int64_t *k, double *wait, vl_err *err);
/* Give the batch taken last back (its slot refills with batch k + slots). */
void vl_prefetch_release(vl_prefetch *p, void *buf);
/* Stops the workers (also mid-way) and frees everything; NULL is fine. */
void vl_prefetch_destroy(vl_prefetch *p);
/* Host bytes it holds: slots x buf_bytes. */
size_t vl_prefetch_host_bytes(const vl_prefetch_cfg *cfg);

#ifdef __cplusplus
}
#endif
#endif
