/* The input pipeline (engine/data): a dataset interface, a seeded sampler, worker threads
 * with per-worker prefetch, per-sample or batched collate (random-resized crop, flip,
 * normalise, HWC -> CHW into one contiguous batch), host memory accounting with a cap, and
 * corrupt-sample handling. Generic: a dataset only has to decode sample i into an image. */
#ifndef VRAMLAB_DATA_H
#define VRAMLAB_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "vramlab/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A decoded image: HWC uint8, c = 3. The dataset grows `pix` (capacity `cap` bytes) with
 * realloc as needed; the loader owns and frees it. */
typedef struct {
  uint8_t *pix;
  size_t cap;
  int w, h, c;
  int32_t label;
} vl_image;

/* What a dataset must provide. read() must be callable from several threads at once with
 * distinct `scratch` pointers (one per worker, from scratch_new). It returns VL_OK,
 * VL_ERR_IO for an unreadable/corrupt/truncated sample (with a message naming it in err),
 * or another status for a hard failure. */
typedef struct {
  void *self;
  int64_t (*len)(void *self);
  void *(*scratch_new)(void *self);          /* per-worker decoder state; may return NULL */
  void (*scratch_free)(void *self, void *scratch);
  vl_status (*read)(void *self, void *scratch, int64_t i, vl_image *out, char *err, size_t errn);
  /* Bytes of decoder scratch one worker holds (for the host-memory bound). */
  size_t scratch_bytes;
} vl_dataset;

typedef enum { VL_CORRUPT_ERROR = 0, VL_CORRUPT_SKIP } vl_corrupt_policy;

typedef struct {
  int64_t batch;           /* samples per batch */
  int workers;             /* 0: load in the caller's thread (PyTorch num_workers=0) */
  int prefetch;            /* batches in flight per worker (prefetch_factor), >= 1 */
  bool persistent;         /* keep worker threads across epochs */
  bool batched_collate;    /* transform straight into the batch buffer (else per-sample
                              tensors, then a copy into the batch: PyTorch's default) */
  bool drop_last;
  bool shuffle;
  int crop;                /* output side (224) */
  float scale_min, scale_max;   /* random-resized crop area range (0.08, 1.0) */
  float ratio_min, ratio_max;   /* aspect ratio range (3/4, 4/3) */
  float mean[3], std[3];   /* normalisation, on [0,1] pixel values */
  uint64_t seed;
  int rank, world;         /* shard of the epoch for data parallelism (world >= 1) */
  vl_corrupt_policy on_corrupt;
  size_t host_mem_cap;     /* 0: none; else loader creation fails if its bound exceeds it */
} vl_loader_cfg;

void vl_loader_cfg_default(vl_loader_cfg *c);

/* One delivered batch: x (n, 3, crop, crop) fp32 contiguous, labels and sample indices.
 * n < batch only for the last batch of an epoch without drop_last. */
typedef struct {
  int64_t n;
  float *x;
  int32_t *labels;
  int64_t *index;
  double load_seconds;     /* time a worker spent producing it (read+decode+transform) */
  int64_t skipped;         /* corrupt samples skipped while producing it */
} vl_batch_buf;

typedef struct {
  int64_t batches, samples, skipped;
  size_t host_bytes_bound;  /* workers x prefetch x batch bytes + decode scratch */
  size_t host_bytes_peak;   /* batch buffers actually allocated, peak */
  double first_batch_seconds; /* epoch start -> first batch delivered, last epoch */
  char last_error[256];
} vl_loader_stats;

typedef struct vl_loader vl_loader;

/* Checks the config (clear message in err), computes the host-memory bound and applies the
 * cap. Starts persistent workers now; others start at each epoch. */
vl_status vl_loader_create(vl_loader **out, const vl_loader_cfg *cfg, const vl_dataset *ds,
                           char *err, size_t errn);
/* Begin epoch `epoch` (its shuffle is seeded by seed and epoch). An epoch in progress is
 * stopped first (workers stop at the next batch; nothing leaks). */
vl_status vl_loader_start_epoch(vl_loader *l, int64_t epoch);
/* Next batch of the epoch, in sampler order whatever the worker count; *out = NULL at the
 * end of the epoch. The buffer stays valid until vl_loader_release. On a corrupt sample
 * with VL_CORRUPT_ERROR, returns VL_ERR_IO with the file named in the stats' last_error. */
vl_status vl_loader_next(vl_loader *l, vl_batch_buf **out);
void vl_loader_release(vl_loader *l, vl_batch_buf *b);
void vl_loader_stats_get(const vl_loader *l, vl_loader_stats *s);
/* Stops and joins every worker, frees every buffer. */
void vl_loader_destroy(vl_loader *l);

/* Bytes of one batch buffer (x + labels + index). */
size_t vl_loader_batch_bytes(const vl_loader_cfg *c);

/* The per-sample transform both collate paths use, exposed for tests and the decode-only
 * ceiling: random-resized crop of img (bilinear), optional horizontal flip, normalise,
 * write CHW floats to dst (3*crop*crop). The random draws come from rng. */
void vl_transform(const vl_loader_cfg *c, const vl_image *img, vl_rng *rng, float *dst);

#ifdef __cplusplus
}
#endif
#endif
