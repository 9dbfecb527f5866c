/* The input pipeline (engine/data): a dataset interface, a seeded sampler, worker threads
 * with per-worker prefetch, per-sample or batched collate (random-resized crop, flip,
 * normalise, HWC -> CHW into one contiguous batch; or Stable Diffusion's resize, crop,
 * flip and [-1, 1] scaling), host memory accounting with a cap, and corrupt-sample
 * handling. Generic: a dataset only has to decode sample i into an image
 * (and, for segmentation, its per-pixel class mask). */
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
 * realloc as needed; the loader owns and frees it.
 * Segmentation datasets also fill `mask`: h*w class ids (row-major, the image's size),
 * grown the same way (capacity `mask_cap` bytes) and owned and freed by the loader.
 * Datasets without masks leave it NULL. A dataset that gives masks gives one for every
 * sample (the loader keeps one vl_image per worker across samples, so it cannot tell a
 * stale mask from a fresh one). */
typedef struct {
  uint8_t *pix;
  size_t cap;
  int w, h, c;
  int32_t label;
  uint8_t *mask;
  size_t mask_cap;
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
  vl_status (*read)(void *self, void *scratch, int64_t i, vl_image *out, vl_err *err);
  /* Bytes of decoder scratch one worker holds (for the host-memory bound). */
  size_t scratch_bytes;
  /* Largest decoded image in bytes (max w*h*c), for the host-memory bound: each worker
   * keeps one vl_image. 0 when unknown; the bound then leaves decoded images out. With
   * masks, the bound counts max_image_bytes / 3 more per worker for the mask. */
  size_t max_image_bytes;
  /* Optional: the loader's cfg.max_file_bytes for one worker's scratch, called on the
   * worker's thread right after scratch_new (when it gave a scratch). A dataset that reads
   * files must then refuse a larger file before reading it, as a corrupt sample (VL_ERR_IO):
   * a file's size is the sharer's to choose, and reading a 40 GiB one whole would end the
   * run with an out-of-memory status that no corrupt-sample policy skips. */
  void (*scratch_limit)(void *self, void *scratch, uint64_t max_file_bytes);
} vl_dataset;

typedef enum { VL_CORRUPT_ERROR = 0, VL_CORRUPT_SKIP } vl_corrupt_policy;

/* "skip" or "error" (case-insensitive) into *out; 0, or -1 for anything else. */
int vl_corrupt_policy_parse(const char *s, vl_corrupt_policy *out);
const char *vl_corrupt_policy_name(vl_corrupt_policy p);

#define VL_LOADER_CROP_MAX 4096
#define VL_LOADER_WORKERS_MAX 1024
/* The default cap on one input file (cfg.max_file_bytes): 64 MiB, a hundred times a
 * large photo's JPEG. */
#define VL_LOADER_MAX_FILE_BYTES ((uint64_t)64 << 20)

/* The per-sample image transform (vl_loader_cfg.transform; cfg.masks takes
 * vl_transform_seg whatever this says). */
typedef enum {
  VL_TF_IMAGENET = 0, /* vl_transform: random-resized crop, flip, mean/std (the default) */
  VL_TF_SD = 1        /* vl_transform_sd: Stable Diffusion's resize, crop, flip, [-1, 1] */
} vl_transform_kind;

typedef struct {
  int64_t batch;           /* samples per batch */
  int workers;             /* 0: load in the caller's thread (PyTorch num_workers=0) */
  int prefetch;            /* batches in flight per worker (prefetch_factor), >= 1 */
  bool persistent;         /* keep worker threads across epochs */
  bool batched_collate;    /* transform straight into the batch buffer (else per-sample
                              tensors, then a copy into the batch: PyTorch's default) */
  bool drop_last;
  bool shuffle;
  int crop;                /* output side (224), 1..VL_LOADER_CROP_MAX */
  float scale_min, scale_max;   /* random-resized crop area range (0.08, 1.0) */
  float ratio_min, ratio_max;   /* aspect ratio range (3/4, 4/3) */
  float mean[3], std[3];   /* normalisation, on [0,1] pixel values */
  uint64_t seed;
  int rank, world;         /* shard of the epoch for data parallelism (world >= 1) */
  vl_corrupt_policy on_corrupt;
  /* Largest input file a dataset may read for one sample (>= 1; the dataset's
   * scratch_limit): a larger one is a corrupt sample, refused before it is read. */
  uint64_t max_file_bytes;
  size_t host_mem_cap;     /* 0: none; else loader creation fails if its bound exceeds it */
  /* Optional allocator for the batch images `x` (the bulk of a batch): pinned staging on
   * CUDA (vl_backend.host_alloc), so a batch uploads asynchronously without a bounce copy.
   * NULL: 64-byte aligned malloc. */
  void *(*x_alloc)(void *user, size_t bytes);
  void (*x_free)(void *user, void *p);
  void *x_user;
  /* Segmentation: every sample must come with a mask, the transform is vl_transform_seg
   * (whole image resized, no random crop: scale/ratio are ignored) and batches carry the
   * masks in `y`. A sample without a mask is VL_ERR_INVALID naming it, under any
   * on_corrupt policy (a wrong dataset, not a corrupt file). */
  bool masks;
  /* The transform (VL_TF_IMAGENET by default). VL_TF_SD is diffusers'
   * train_text_to_image_lora.py preprocessing at resolution `crop` (see vl_transform_sd):
   * scale, ratio, mean and std are not used, and masks must be off. */
  vl_transform_kind transform;
  bool sd_random_crop;     /* VL_TF_SD: RandomCrop instead of CenterCrop (--center_crop off) */
  bool sd_flip;            /* VL_TF_SD: RandomHorizontalFlip(p = 0.5) (--random_flip) */
} vl_loader_cfg;

/* batch 32, workers 0, prefetch 2, not persistent, per-sample collate, no drop_last,
 * shuffle, crop 224, scale (0.08, 1), ratio (3/4, 4/3), ImageNet mean/std, seed 0,
 * rank 0 of 1, VL_CORRUPT_ERROR, max_file_bytes VL_LOADER_MAX_FILE_BYTES, no cap, no
 * masks, VL_TF_IMAGENET (no SD random crop, no SD flip). */
void vl_loader_cfg_default(vl_loader_cfg *c);

/* One delivered batch: x (n, 3, crop, crop) fp32 contiguous, labels and sample indices;
 * with cfg.masks, y (n, crop, crop) class ids (int32, as PyTorch's cross-entropy targets,
 * which are int64 there), else NULL. n < batch only for the last batch of an epoch
 * without drop_last. */
typedef struct {
  int64_t n;
  float *x;
  int32_t *y;
  int32_t *labels;
  int64_t *index;
  double load_seconds;     /* time a worker spent producing it (read+decode+transform) */
  double transform_seconds; /* the crop/flip/normalise/collate part of load_seconds */
  int64_t skipped;         /* corrupt samples skipped while producing it */
} vl_batch_buf;

/* Counters are totals since vl_loader_create (all epochs); host_bytes_peak counts batch
 * buffers only (see "Host memory" below); last_error is the current epoch's error (or a
 * misuse of the API), cleared by vl_loader_start_epoch. */
typedef struct {
  int64_t batches, samples, skipped;
  size_t host_bytes_bound;  /* workers x prefetch x batch bytes + decode scratch */
  size_t host_bytes_peak;   /* batch buffers actually allocated, peak */
  double first_batch_seconds; /* epoch start -> first batch delivered, last epoch */
  char last_error[256];
} vl_loader_stats;

typedef struct vl_loader vl_loader;

/* Sampler. Epoch e's order is a Fisher-Yates shuffle of 0..n-1 drawn from a vl_rng seeded
 * by (seed, e) (the identity without shuffle). Like PyTorch's DistributedSampler
 * (drop_last=False): the order is padded by repeating its head to world*ceil(n/world)
 * (so at most world-1 samples appear twice in an epoch, and none when world divides n),
 * and rank r takes positions r, r+world, r+2*world, ...: every rank gets ceil(n/world)
 * samples, the shards are disjoint apart from that padding, and together they cover the
 * epoch. Batches are cut from the rank's shard in order.
 *
 * Workers. Batch k of the epoch is made by worker k % workers. At most workers x prefetch
 * batches are in flight (dispatched to a worker and not yet taken by vl_loader_next), as
 * with PyTorch's prefetch_factor; taking a batch dispatches the next one. Batches are
 * delivered in sampler order whichever worker finishes first. With workers = 0 every batch
 * is made inside vl_loader_next (prefetch then has no effect, as in PyTorch).
 *
 * Corrupt samples (read() gives VL_ERR_IO). VL_CORRUPT_SKIP: the sample is left out and
 * counted, and batches are refilled from the following samples of the epoch order: the
 * delivered stream is exactly the shard's order with the corrupt samples removed, cut into
 * batches of `batch`, so every batch is full except the epoch's last (dropped when short
 * under drop_last; with drop_last the samples past the last full batch are read only when
 * a skip makes them needed). A batch's `skipped` is the number of corrupt samples the loader
 * met since the previous batch was delivered (corrupt samples in a dropped tail are only
 * in the stats). Refilling moves samples between buffers in memory (one batch's worth per
 * batch after the first skip of an epoch). VL_CORRUPT_ERROR: vl_loader_next returns
 * VL_ERR_IO when it reaches the batch holding the sample (the batches before it are
 * delivered first), last_error is "sample <i>: <the dataset's message>", and every later
 * call in the epoch returns the same status until vl_loader_start_epoch. Any other status
 * from read() is returned the same way whatever the policy. The engine prints nothing.
 * What is corrupt is the dataset's to say; the sets in datasets/ say it of any file they
 * cannot decode, of one that is not a regular file (a FIFO is never waited on) and of one
 * larger than max_file_bytes (passed to each worker's scratch with scratch_limit).
 *
 * Random draws. Sample i's transform in epoch e draws from a vl_rng seeded by
 * vl_loader_sample_seed(seed, e, i), so batches are identical for every worker count,
 * prefetch depth and collate mode.
 *
 * Host memory (host_bytes_bound, what it counts):
 *   batch buffers: (workers x prefetch in flight, or 1 with workers = 0)
 *                  + 1 held by the caller + 1 for refilling under VL_CORRUPT_SKIP,
 *                  each vl_loader_batch_bytes (masks included);
 *   per worker (one with workers = 0): the dataset's scratch_bytes, one decoded image
 *                  (the dataset's max_image_bytes; with masks, its mask too:
 *                  max_image_bytes / 3), with VL_TF_SD the transform's working memory
 *                  (vl_transform_sd_scratch_bound for images of max_image_bytes / 3
 *                  pixels) and, with per-sample collate, the one sample tensor it holds at
 *                  a time (3*crop*crop floats, + crop*crop int32 with masks);
 *   the epoch order (8 bytes per dataset sample) and the in-flight task table.
 * Batch buffers are allocated on first need, reused through a free list (released batches
 * go back to it) and never exceed that count: the caller is expected to hold one batch at
 * a time; holding more shrinks the prefetch window, and if the caller holds every buffer
 * vl_loader_next returns VL_ERR_INVALID instead of waiting forever. */

/* Checks the config (clear message in err), computes the host-memory bound and applies the
 * cap (VL_ERR_OOM naming both numbers). Starts persistent workers now (they wait on a
 * condition variable between epochs); others start at each epoch and are joined when it
 * ends, so their start-up shows in first_batch_seconds. */
vl_status vl_loader_create(vl_loader **out, const vl_loader_cfg *cfg, const vl_dataset *ds, vl_err *err);
/* Begin epoch `epoch` (its shuffle is seeded by seed and epoch). An epoch in progress is
 * stopped first: workers stop before their next sample, are joined (or parked, when
 * persistent), and their buffers go back to the free list; nothing leaks. Batches the
 * caller still holds stay valid until released. */
vl_status vl_loader_start_epoch(vl_loader *l, int64_t epoch);
/* Next batch of the epoch, in sampler order whatever the worker count; *out = NULL at the
 * end of the epoch. The buffer stays valid until vl_loader_release. On a corrupt sample
 * with VL_CORRUPT_ERROR, returns VL_ERR_IO with the file named in the stats' last_error. */
vl_status vl_loader_next(vl_loader *l, vl_batch_buf **out);
void vl_loader_release(vl_loader *l, vl_batch_buf *b);
void vl_loader_stats_get(const vl_loader *l, vl_loader_stats *s);
/* Stops and joins every worker, frees every buffer (batches still held become invalid). */
void vl_loader_destroy(vl_loader *l);

/* Bytes of one batch buffer (x + labels + index, + y with masks). */
size_t vl_loader_batch_bytes(const vl_loader_cfg *c);
/* The host-memory bound (see "Host memory" above) of a loader with cfg c over a dataset of
 * n samples with these scratch_bytes and max_image_bytes: what vl_loader_create computes
 * and reports as host_bytes_bound, callable without a dataset, so a plan gives the same
 * number. SIZE_MAX when it does not fit a size_t. */
size_t vl_loader_host_bytes_bound(const vl_loader_cfg *c, int64_t n, size_t scratch_bytes,
                                  size_t max_image_bytes);
/* Samples per epoch on this loader's rank (ceil(n/world)), before any skip. */
int64_t vl_loader_shard_len(const vl_loader *l);
/* The seed of sample `index`'s transform RNG in epoch `epoch`. */
uint64_t vl_loader_sample_seed(uint64_t seed, int64_t epoch, int64_t index);

/* The per-sample transform both collate paths use, exposed for tests and the decode-only
 * ceiling: random-resized crop of img (bilinear), optional horizontal flip, normalise,
 * write CHW floats to dst (3*crop*crop). The random draws come from rng.
 * Crop box as torchvision's RandomResizedCrop.get_params (up to 10 draws of an area in
 * [scale_min, scale_max] x area and a log-uniform aspect ratio in [ratio_min, ratio_max],
 * then the center-crop fallback), then one uniform draw: flip when < 0.5. Resize is
 * bilinear with half-pixel centres (align_corners=False) and no antialiasing. Pixels are
 * (v/255 - mean[c]) / std[c]. img must be HWC with c = 3, w, h >= 1; c->crop must be in
 * 1..VL_LOADER_CROP_MAX. */
void vl_transform(const vl_loader_cfg *c, const vl_image *img, vl_rng *rng, float *dst);

/* The segmentation transform (cfg.masks): the whole image is resized to crop x crop
 * (bilinear with half-pixel centres, as vl_transform; an exact copy when the size already
 * matches) and its mask with nearest neighbour as PyTorch's 'nearest' mode does it:
 * src = min(floor(dst * scale), in - 1) with scale = (float)in / out in single precision
 * (src = dst when in == out, dst >> 1 when out == 2 * in). That is floor(dst * in / out)
 * except for rare (in, out, dst) where the float product rounds just below an integer
 * (e.g. in 2, out 82, dst 41 gives 0), kept so targets match PyTorch's bit for bit. Then
 * one uniform draw from rng: both are flipped horizontally when it is < 0.5. The image is
 * normalised into dst (3*crop*crop CHW floats) as vl_transform does, the mask's class ids
 * go to ydst (crop*crop int32). img must be HWC with c = 3, w, h >= 1 and a mask of h*w
 * bytes; cfg scale/ratio are not used. */
void vl_transform_seg(const vl_loader_cfg *c, const vl_image *img, vl_rng *rng, float *dst,
                      int32_t *ydst);

/* Stable Diffusion's training transform (cfg.transform = VL_TF_SD), as diffusers'
 * train_text_to_image_lora.py composes it on a PIL image, with resolution R = c->crop:
 *   1. transforms.Resize(R, BILINEAR): the short side to R, the long side to
 *      int(R * long / short) (torchvision's rounding down), resampled as Pillow's
 *      Image.resize(BILINEAR) does it, which torchvision calls for PIL images: a triangle
 *      filter whose support is scaled by the reduction factor when downscaling (so it
 *      antialiases: each output pixel averages every input pixel under the stretched
 *      triangle) and plain bilinear with half-pixel centres when upscaling; separable, in
 *      Pillow 13's order (vertical pass first when the height shrinks by more than twice as
 *      many pixels as the width, else horizontal first; older Pillow sources always go
 *      horizontal first, which rounds some pixels one level apart); 22-bit fixed-point
 *      weights; both passes rounded to uint8 as Pillow rounds them. Bit-identical to
 *      Pillow 13.0 + torch (tests/test_captions.c keeps hashes of their outputs).
 *   2. CenterCrop(R): top = round((h' - R) / 2), left = round((w' - R) / 2) with Python's
 *      round (half to even); or, with c->sd_random_crop, RandomCrop(R): top drawn in
 *      0..h'-R then left in 0..w'-R (vl_rng_below), no draws when the image is R x R.
 *   3. RandomHorizontalFlip(p = 0.5) when c->sd_flip: flipped when one uniform draw is < 0.5.
 *   4. ToTensor and Normalize([0.5], [0.5]): v -> (v / 255.0f - 0.5f) / 0.5f in float, so
 *      0 -> -1 and 255 -> 1 exactly, as torch computes it.
 * Only the R x R window that survives the crop is resampled (every output pixel is what the
 * whole resize would give there). dst gets (3, R, R) CHW floats. img must be HWC with
 * c = 3, w, h >= 1 and R * long / short below 2^29 (the loader refuses a longer image as
 * VL_ERR_INVALID); c->crop in 1..VL_LOADER_CROP_MAX. scratch holds at least
 * vl_transform_sd_scratch_bytes(c->crop, img->w, img->h) bytes, aligned as malloc aligns. */
void vl_transform_sd(const vl_loader_cfg *c, const vl_image *img, vl_rng *rng, float *dst,
                     void *scratch);
/* Working memory of vl_transform_sd for a w x h image at resolution crop: the filter's taps
 * and a few resampled rows (21 KiB for a 640x480 image at 512). */
size_t vl_transform_sd_scratch_bytes(int crop, int w, int h);
/* A bound on vl_transform_sd_scratch_bytes(crop, w, h) over every image of at most
 * max_pixels pixels (the host-memory bound's term). */
size_t vl_transform_sd_scratch_bound(int crop, size_t max_pixels);

#ifdef __cplusplus
}
#endif
#endif
