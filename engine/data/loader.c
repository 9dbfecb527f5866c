/* The loader: sampler, worker threads with per-worker prefetch, in-order delivery, batch
 * buffer reuse and the host-memory bound, corrupt-sample policy (semantics in data.h).
 *
 * Tasks. The rank's shard is cut into tasks of `batch` positions; task k is made by worker
 * k % W into a batch buffer given to it when the task is dispatched. Dispatch happens in
 * task order, under the lock, whenever the window (tasks dispatched but not yet taken by
 * the consumer, at most R = W x prefetch) has room and a buffer can be had (free list, or
 * a new one while fewer than the cap S exist). In-order dispatch means a later task can
 * never hold the buffer an earlier one needs. Task k's state lives in ring slot k % R.
 *
 * Consumer (vl_loader_next). Takes task `consumed` when it is done (W = 0: makes it right
 * there), then merges: a full task is delivered as is; under VL_CORRUPT_SKIP a short one is
 * held and topped up from the following tasks (the `hold`), so the delivered stream is the
 * shard order minus the corrupt samples, cut into batches.
 *
 * Shutdown. One mutex, two condition variables (workers wait on cv_work, the consumer on
 * cv_done). `live_gen` (atomic) is the running epoch's generation, 0 when none: workers
 * read it between samples, so stopping an epoch (live_gen = 0, broadcast) stops them
 * before their next sample. Non-persistent workers then leave their loop and are joined;
 * persistent ones park on cv_work and the stopper waits until none is busy. Only then are
 * the buffers of unfinished tasks taken back, so no thread ever touches a reclaimed buffer.
 *
 * Masks (cfg.masks): every batch buffer also has y (batch x crop x crop int32), which the
 * transform, the per-sample copy and the SKIP refill move along with x.
 *
 * Transforms: vl_transform_seg with masks, else vl_transform (VL_TF_IMAGENET) or
 * vl_transform_sd (VL_TF_SD), whose working memory each worker keeps and grows.
 *
 * Per-worker state (dataset scratch, the decoded image) is made by the worker thread and
 * freed when it exits; with W = 0 the caller's copy lives until vl_loader_destroy. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "vramlab/data.h"

typedef struct bufnode {
  vl_batch_buf pub;         /* first member: a vl_batch_buf * is a bufnode * */
  struct bufnode *next_free;
  struct bufnode *next_all; /* every buffer ever allocated, for destroy */
} bufnode;

enum { T_FREE = 0, T_DISPATCHED, T_RUNNING, T_DONE };

typedef struct {
  int state;
  bufnode *buf;
  vl_status st;
  char err[256];
} task;

typedef struct {
  struct vl_loader *l;
  int id;
  pthread_t th;
  bool running;   /* thread created and not joined */
  void *scratch;
  bool has_scratch;
  vl_image img;
  void *tf;       /* VL_TF_SD: vl_transform_sd's scratch, grown to the largest image's */
  size_t tf_cap;
} worker;

struct vl_loader {
  vl_loader_cfg cfg;
  vl_dataset ds;
  int64_t n;            /* dataset samples */
  int64_t m;            /* shard samples: ceil(n/world) */
  int64_t nfull, tail;  /* full tasks, samples past them */
  int64_t F;            /* floats per sample: 3*crop*crop */
  int64_t P;            /* mask ids per sample: crop*crop with masks, else 0 */
  size_t batch_bytes;
  int W, R, S;          /* workers, window (ring size), batch buffer cap */

  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  worker *w;            /* W workers */
  worker self;          /* W == 0: the caller's state */
  bool shutdown;
  uint64_t gen;
  _Atomic uint64_t live_gen;
  int busy;             /* workers running a task */

  /* epoch */
  int64_t *perm;        /* n: the epoch order */
  task *ring;           /* R */
  int64_t epoch;
  bool started, ended;
  vl_status sticky;     /* an epoch error, returned until the next start_epoch */
  int64_t ntasks;       /* tasks that exist: nfull + (tail > 0) */
  int64_t limit;        /* tasks that may be dispatched (drop_last: the tail on demand) */
  int64_t ndispatched, consumed;
  bufnode *hold;        /* SKIP: a short batch being topped up */
  int64_t pending_skip;
  double pending_load, pending_transform, t0;
  bool first_done;

  /* buffers */
  bufnode *free_list, *all;
  int nalloc, held;
  bool alloc_failed;

  vl_loader_stats st;
};

/* ------------------------------------------------------------------ config ---------- */

void vl_loader_cfg_default(vl_loader_cfg *c) {
  memset(c, 0, sizeof *c);
  c->batch = 32;
  c->workers = 0;
  c->prefetch = 2;
  c->persistent = false;
  c->batched_collate = false;
  c->drop_last = false;
  c->shuffle = true;
  c->crop = 224;
  c->scale_min = 0.08f;
  c->scale_max = 1.0f;
  c->ratio_min = 3.0f / 4.0f;
  c->ratio_max = 4.0f / 3.0f;
  c->mean[0] = 0.485f, c->mean[1] = 0.456f, c->mean[2] = 0.406f;
  c->std[0] = 0.229f, c->std[1] = 0.224f, c->std[2] = 0.225f;
  c->seed = 0;
  c->rank = 0;
  c->world = 1;
  c->on_corrupt = VL_CORRUPT_ERROR;
  c->max_file_bytes = VL_LOADER_MAX_FILE_BYTES;
  c->host_mem_cap = 0;
  c->transform = VL_TF_IMAGENET;
  c->sd_random_crop = false;
  c->sd_flip = false;
}

int vl_corrupt_policy_parse(const char *s, vl_corrupt_policy *out) {
  if (!s) return -1;
  if (!strcasecmp(s, "skip")) *out = VL_CORRUPT_SKIP;
  else if (!strcasecmp(s, "error")) *out = VL_CORRUPT_ERROR;
  else return -1;
  return 0;
}

const char *vl_corrupt_policy_name(vl_corrupt_policy p) {
  return p == VL_CORRUPT_SKIP ? "skip" : p == VL_CORRUPT_ERROR ? "error" : "?";
}

static size_t sample_floats(const vl_loader_cfg *c) { return (size_t)3 * c->crop * c->crop; }
static size_t sample_ids(const vl_loader_cfg *c) { return c->masks ? (size_t)c->crop * c->crop : 0; }

size_t vl_loader_batch_bytes(const vl_loader_cfg *c) {
  if (c->batch < 1 || c->crop < 1 || c->crop > VL_LOADER_CROP_MAX) return 0;
  size_t per = sample_floats(c) * sizeof(float) + sample_ids(c) * sizeof(int32_t) +
               sizeof(int32_t) + sizeof(int64_t);
  if ((uint64_t)c->batch > SIZE_MAX / per) return SIZE_MAX;
  return (size_t)c->batch * per;
}

/* A worker's decode state (see "Host memory" in data.h): the dataset's scratch, one decoded
 * image (+ its mask), the SD transform's working memory and, with per-sample collate, the
 * sample tensor it holds. */
static size_t worker_bytes(const vl_loader_cfg *c, size_t scratch_bytes, size_t max_image_bytes) {
  return scratch_bytes + max_image_bytes + (c->masks ? max_image_bytes / 3 : 0) +
         (c->transform == VL_TF_SD ? vl_transform_sd_scratch_bound(c->crop, max_image_bytes / 3) : 0) +
         (c->batched_collate ? 0 : sample_floats(c) * sizeof(float) + sample_ids(c) * sizeof(int32_t));
}

size_t vl_loader_host_bytes_bound(const vl_loader_cfg *c, int64_t n, size_t scratch_bytes,
                                  size_t max_image_bytes) {
  const int64_t R = c->workers > 0 ? (int64_t)c->workers * c->prefetch : 1;
  const int64_t S = R + 1 + (c->on_corrupt == VL_CORRUPT_SKIP ? 1 : 0);
  const int wc = c->workers > 0 ? c->workers : 1;
  const size_t bb = vl_loader_batch_bytes(c), pw = worker_bytes(c, scratch_bytes, max_image_bytes);
  /* in doubles first: a bound that does not fit a size_t is SIZE_MAX, never a wrapped one */
  const double d = (double)S * (double)bb + (double)wc * (double)pw + (double)n * sizeof(int64_t) +
                   (double)R * sizeof(task);
  if (bb == SIZE_MAX || n < 0 || d >= (double)SIZE_MAX) return SIZE_MAX;
  return (size_t)S * bb + (size_t)wc * pw + (size_t)n * sizeof(int64_t) + (size_t)R * sizeof(task);
}

static vl_status check_cfg(const vl_loader_cfg *c, const vl_dataset *ds, vl_err *err) {
  if (!c || !ds) return vl_err_set(err, VL_ERR_INVALID, "loader: cfg and dataset are required");
  if (c->batch < 1)
    return vl_err_set(err, VL_ERR_INVALID, "loader: batch must be >= 1 (got %lld)", (long long)c->batch);
  if (c->workers < 0 || c->workers > VL_LOADER_WORKERS_MAX)
    return vl_err_set(err, VL_ERR_INVALID, "loader: workers must be in 0..%d (got %d)", VL_LOADER_WORKERS_MAX,
                      c->workers);
  if (c->prefetch < 1)
    return vl_err_set(err, VL_ERR_INVALID, "loader: prefetch must be >= 1 (got %d)", c->prefetch);
  if (!c->x_alloc != !c->x_free)
    return vl_err_set(err, VL_ERR_INVALID, "loader: x_alloc and x_free go together");
  if ((int64_t)c->workers * c->prefetch > 1 << 20)
    return vl_err_set(err, VL_ERR_INVALID, "loader: workers x prefetch = %lld is too large",
                      (long long)c->workers * c->prefetch);
  if (c->crop < 1 || c->crop > VL_LOADER_CROP_MAX)
    return vl_err_set(err, VL_ERR_INVALID, "loader: crop must be in 1..%d (got %d)", VL_LOADER_CROP_MAX, c->crop);
  if (c->world < 1)
    return vl_err_set(err, VL_ERR_INVALID, "loader: world must be >= 1 (got %d)", c->world);
  if (c->rank < 0 || c->rank >= c->world)
    return vl_err_set(err, VL_ERR_INVALID, "loader: rank %d is out of range for world %d (0..%d)", c->rank,
                      c->world, c->world - 1);
  if (!(c->scale_min > 0) || !(c->scale_max >= c->scale_min) || !isfinite(c->scale_max))
    return vl_err_set(err, VL_ERR_INVALID, "loader: scale range must satisfy 0 < scale_min <= scale_max (got %g, %g)",
                      (double)c->scale_min, (double)c->scale_max);
  if (!(c->ratio_min > 0) || !(c->ratio_max >= c->ratio_min) || !isfinite(c->ratio_max))
    return vl_err_set(err, VL_ERR_INVALID, "loader: ratio range must satisfy 0 < ratio_min <= ratio_max (got %g, %g)",
                      (double)c->ratio_min, (double)c->ratio_max);
  for (int i = 0; i < 3; i++) {
    if (!isfinite(c->std[i]) || c->std[i] == 0)
      return vl_err_set(err, VL_ERR_INVALID, "loader: std[%d] must be finite and non-zero (got %g)", i,
                        (double)c->std[i]);
    if (!isfinite(c->mean[i]))
      return vl_err_set(err, VL_ERR_INVALID, "loader: mean[%d] must be finite (got %g)", i, (double)c->mean[i]);
  }
  if (c->on_corrupt != VL_CORRUPT_ERROR && c->on_corrupt != VL_CORRUPT_SKIP)
    return vl_err_set(err, VL_ERR_INVALID, "loader: on_corrupt must be VL_CORRUPT_ERROR or VL_CORRUPT_SKIP (got %d)",
                      (int)c->on_corrupt);
  if (c->max_file_bytes < 1)
    return vl_err_set(err, VL_ERR_INVALID, "loader: max_file_bytes must be >= 1 (got 0)");
  if (c->transform != VL_TF_IMAGENET && c->transform != VL_TF_SD)
    return vl_err_set(err, VL_ERR_INVALID, "loader: transform must be VL_TF_IMAGENET or VL_TF_SD (got %d)",
                      (int)c->transform);
  if (c->transform == VL_TF_SD && c->masks)
    return vl_err_set(err, VL_ERR_INVALID, "loader: masks take the segmentation transform, not VL_TF_SD");
  if (!ds->len || !ds->read)
    return vl_err_set(err, VL_ERR_INVALID, "loader: the dataset needs len() and read()");
  if ((ds->scratch_new == NULL) != (ds->scratch_free == NULL))
    return vl_err_set(err, VL_ERR_INVALID, "loader: the dataset has only one of scratch_new/scratch_free");
  if (vl_loader_batch_bytes(c) == SIZE_MAX)
    return vl_err_set(err, VL_ERR_INVALID, "loader: batch %lld x crop %d overflows a buffer size",
                      (long long)c->batch, c->crop);
  return VL_OK;
}

/* ------------------------------------------------------------------ sampler --------- */


static uint64_t seed3(uint64_t seed, uint64_t tag, int64_t a, int64_t b) {
  return vl_mix64(vl_mix64(vl_mix64(seed ^ tag) ^ (uint64_t)a) ^ (uint64_t)b);
}

#define TAG_SHUFFLE 0x5348554646ull /* "SHUFF" */
#define TAG_SAMPLE 0x5846524dull    /* "XFRM" */

uint64_t vl_loader_sample_seed(uint64_t seed, int64_t epoch, int64_t index) {
  return seed3(seed, TAG_SAMPLE, epoch, index);
}

static void build_order(vl_loader *l) {
  for (int64_t i = 0; i < l->n; i++) l->perm[i] = i;
  if (!l->cfg.shuffle) return;
  vl_rng r;
  vl_rng_seed(&r, seed3(l->cfg.seed, TAG_SHUFFLE, l->epoch, 0));
  for (int64_t i = l->n - 1; i > 0; i--) {
    int64_t j = (int64_t)vl_rng_below(&r, (uint64_t)i + 1);
    int64_t t = l->perm[i];
    l->perm[i] = l->perm[j];
    l->perm[j] = t;
  }
}

/* Position p of this rank's shard: position rank + p*world of the order padded by
 * repeating its head (DistributedSampler). */
static int64_t sample_at(const vl_loader *l, int64_t p) {
  return l->perm[(l->cfg.rank + p * l->cfg.world) % l->n];
}

int64_t vl_loader_shard_len(const vl_loader *l) { return l->m; }

/* ------------------------------------------------------------------ buffers --------- */

static void buf_free(const vl_loader *l, bufnode *b) {
  if (b->pub.x && l->cfg.x_free) l->cfg.x_free(l->cfg.x_user, b->pub.x);
  else free(b->pub.x);
  free(b->pub.y);
  free(b->pub.labels);
  free(b->pub.index);
  free(b);
}

/* A buffer from the free list, or a new one while fewer than S exist; NULL otherwise.
 * Called with the lock held. */
static bufnode *buf_get(vl_loader *l) {
  if (l->free_list) {
    bufnode *b = l->free_list;
    l->free_list = b->next_free;
    return b;
  }
  if (l->nalloc >= l->S || l->alloc_failed) return NULL;
  bufnode *b = calloc(1, sizeof *b);
  size_t B = (size_t)l->cfg.batch;
  void *x = NULL;
  if (b && l->cfg.x_alloc) b->pub.x = l->cfg.x_alloc(l->cfg.x_user, B * (size_t)l->F * sizeof(float));
  else if (b && posix_memalign(&x, 64, B * (size_t)l->F * sizeof(float)) == 0) b->pub.x = x;
  if (b) {
    b->pub.labels = malloc(B * sizeof(int32_t));
    b->pub.index = malloc(B * sizeof(int64_t));
    if (l->P > 0) b->pub.y = malloc(B * (size_t)l->P * sizeof(int32_t));
  }
  if (!b || !b->pub.x || !b->pub.labels || !b->pub.index || (l->P > 0 && !b->pub.y)) {
    if (b) buf_free(l, b);
    l->alloc_failed = true;
    return NULL;
  }
  b->next_all = l->all;
  l->all = b;
  l->nalloc++;
  size_t bytes = (size_t)l->nalloc * l->batch_bytes;
  if (bytes > l->st.host_bytes_peak) l->st.host_bytes_peak = bytes;
  return b;
}

static void buf_put(vl_loader *l, bufnode *b) {
  b->next_free = l->free_list;
  l->free_list = b;
}

/* Dispatch tasks in order while the window has room and buffers can be had. Lock held. */
static void dispatch(vl_loader *l) {
  if (atomic_load(&l->live_gen) == 0) return;
  bool any = false;
  while (l->ndispatched < l->limit && l->ndispatched < l->consumed + l->R) {
    bufnode *b = buf_get(l);
    if (!b) break;
    task *t = &l->ring[l->ndispatched % l->R];
    t->state = T_DISPATCHED;
    t->buf = b;
    t->st = VL_OK;
    t->err[0] = 0;
    l->ndispatched++;
    any = true;
  }
  if (any && l->W > 0) pthread_cond_broadcast(&l->cv_work);
}

/* ------------------------------------------------------------------ producing ------- */

static void worker_state_init(vl_loader *l, worker *w) {
  if (!w->has_scratch) {
    w->scratch = l->ds.scratch_new ? l->ds.scratch_new(l->ds.self) : NULL;
    if (w->scratch && l->ds.scratch_limit)
      l->ds.scratch_limit(l->ds.self, w->scratch, l->cfg.max_file_bytes);
    w->has_scratch = true;
  }
}

static void worker_state_free(vl_loader *l, worker *w) {
  if (w->has_scratch && l->ds.scratch_free) l->ds.scratch_free(l->ds.self, w->scratch);
  w->scratch = NULL;
  w->has_scratch = false;
  free(w->img.pix);
  free(w->img.mask);
  memset(&w->img, 0, sizeof w->img);
  free(w->tf);
  w->tf = NULL;
  w->tf_cap = 0;
}

/* Sample idx's image im through the cfg's transform into dst (and ydst with masks), with
 * the worker's memory. VL_OK, or a status with a message in t->err. */
static vl_status transform_one(const vl_loader_cfg *c, worker *w, int64_t idx, const vl_image *im,
                               vl_rng *rng, float *dst, int32_t *ydst, task *t) {
  if (c->masks) {
    vl_transform_seg(c, im, rng, dst, ydst);
    return VL_OK;
  }
  if (c->transform != VL_TF_SD) {
    vl_transform(c, im, rng, dst);
    return VL_OK;
  }
  const int lo = im->w < im->h ? im->w : im->h, hi = im->w < im->h ? im->h : im->w;
  if ((int64_t)c->crop * hi / lo > INT32_MAX / 4) {
    snprintf(t->err, sizeof t->err, "sample %lld: a %dx%d image resized to a short side of %d is "
             "too long for the SD transform", (long long)idx, im->w, im->h, c->crop);
    return VL_ERR_INVALID;
  }
  const size_t need = vl_transform_sd_scratch_bytes(c->crop, im->w, im->h);
  if (need > w->tf_cap) {
    void *p = realloc(w->tf, need);
    if (!p) {
      snprintf(t->err, sizeof t->err, "sample %lld: could not allocate %zu bytes of transform scratch",
               (long long)idx, need);
      return VL_ERR_OOM;
    }
    w->tf = p;
    w->tf_cap = need;
  }
  vl_transform_sd(c, im, rng, dst, w->tf);
  return VL_OK;
}

/* Make task k into t->buf: read, decode, transform and collate its samples, leaving out
 * corrupt ones under SKIP (the good ones are packed at the front, n says how many).
 * Runs without the lock. `gen` is the epoch it belongs to: when live_gen moves on, it
 * stops before the next sample and returns true (the task is abandoned). */
static bool run_task(vl_loader *l, worker *w, int64_t k, task *t, uint64_t gen, int64_t epoch) {
  const vl_loader_cfg *c = &l->cfg;
  bufnode *b = t->buf;
  const int64_t p0 = k * c->batch;
  const int64_t p1 = p0 + c->batch < l->m ? p0 + c->batch : l->m;
  const size_t sbytes = (size_t)l->F * sizeof(float);
  const size_t ybytes = (size_t)l->P * sizeof(int32_t);
  double t0 = vl_now(), tt = 0;
  int64_t g = 0, skipped = 0;
  t->st = VL_OK;
  for (int64_t p = p0; p < p1; p++) {
    if (atomic_load_explicit(&l->live_gen, memory_order_relaxed) != gen) return true;
    int64_t idx = sample_at(l, p);
    vl_err derr;
    derr.msg[0] = 0;
    vl_status s = l->ds.read(l->ds.self, w->scratch, idx, &w->img, &derr);
    if (s == VL_ERR_IO && c->on_corrupt == VL_CORRUPT_SKIP) {
      /* Corrupt: left out. A missing mask (below) is not corrupt but a wrong dataset. */
      skipped++;
      continue;
    }
    if (s != VL_OK) {
      t->st = s;
      /* %.199s: where the 200-byte message buffer of a dataset's read cut it before */
      snprintf(t->err, sizeof t->err, "sample %lld: %.199s", (long long)idx,
               derr.msg[0] ? derr.msg : vl_status_name(s));
      break;
    }
    const vl_image *im = &w->img;
    if (!im->pix || im->c != 3 || im->w < 1 || im->h < 1 ||
        im->cap < (size_t)im->w * (size_t)im->h * 3) {
      t->st = VL_ERR_INVALID;
      snprintf(t->err, sizeof t->err,
               "sample %lld: the dataset returned a %dx%dx%d image in %zu bytes (need HWC, c = 3)",
               (long long)idx, im->w, im->h, im->c, im->cap);
      break;
    }
    if (c->masks && (!im->mask || im->mask_cap < (size_t)im->w * (size_t)im->h)) {
      t->st = VL_ERR_INVALID;
      snprintf(t->err, sizeof t->err,
               "sample %lld: no %dx%d mask (the loader has masks = true, so the dataset must "
               "give every sample a per-pixel class mask)",
               (long long)idx, im->w, im->h);
      break;
    }
    double t1 = vl_now();
    vl_rng rng;
    vl_rng_seed(&rng, vl_loader_sample_seed(c->seed, epoch, idx));
    float *dst = b->pub.x + (size_t)g * (size_t)l->F;
    int32_t *ydst = c->masks ? b->pub.y + (size_t)g * (size_t)l->P : NULL;
    if (c->batched_collate) {
      if ((t->st = transform_one(c, w, idx, im, &rng, dst, ydst, t)) != VL_OK) break;
    } else {
      /* PyTorch's default path: one tensor per sample (image, then its mask), then stacked
       * into the batch. */
      float *one = malloc(sbytes + ybytes);
      if (!one) {
        t->st = VL_ERR_OOM;
        snprintf(t->err, sizeof t->err, "sample %lld: could not allocate a %zu-byte sample tensor",
                 (long long)idx, sbytes + ybytes);
        break;
      }
      _Static_assert(sizeof(float) == sizeof(int32_t) && _Alignof(float) == _Alignof(int32_t),
                     "the mask follows the image in one sample tensor");
      int32_t *yone = (int32_t *)(one + l->F);
      if ((t->st = transform_one(c, w, idx, im, &rng, one, c->masks ? yone : NULL, t)) != VL_OK) {
        free(one);
        break;
      }
      memcpy(dst, one, sbytes);
      if (c->masks) memcpy(ydst, yone, ybytes);
      free(one);
    }
    tt += vl_now() - t1;
    b->pub.labels[g] = im->label;
    b->pub.index[g] = idx;
    g++;
  }
  b->pub.n = g;
  b->pub.skipped = skipped;
  b->pub.load_seconds = vl_now() - t0;
  b->pub.transform_seconds = tt;
  return false;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  vl_loader *l = w->l;
  worker_state_init(l, w);
  uint64_t my_gen = 0;
  int64_t k = 0;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    if (l->shutdown) break;
    uint64_t g = atomic_load(&l->live_gen);
    if (g != 0 && g != my_gen) { /* a new epoch: my tasks are id, id+W, ... */
      my_gen = g;
      k = w->id;
    }
    if (g == 0 || g != my_gen || k >= l->ntasks) { /* nothing more for me this epoch */
      if (!l->cfg.persistent) break;
      pthread_cond_wait(&l->cv_work, &l->mu);
      continue;
    }
    if (k >= l->ndispatched) { /* my next task is not dispatched yet (window or buffers) */
      pthread_cond_wait(&l->cv_work, &l->mu);
      continue;
    }
    task *t = &l->ring[k % l->R];
    t->state = T_RUNNING;
    l->busy++;
    int64_t epoch = l->epoch;
    pthread_mutex_unlock(&l->mu);
    bool abandoned = run_task(l, w, k, t, my_gen, epoch);
    pthread_mutex_lock(&l->mu);
    l->busy--;
    if (!abandoned && atomic_load(&l->live_gen) == my_gen) t->state = T_DONE;
    k += l->W;
    pthread_cond_broadcast(&l->cv_done);
  }
  pthread_mutex_unlock(&l->mu);
  worker_state_free(l, w);
  return NULL;
}

/* ------------------------------------------------------------------ lifecycle ------- */

/* Start `count` threads (from 0) for W workers. On failure the started ones keep running;
 * the caller stops them. */
static vl_status start_threads(vl_loader *l, vl_err *err) {
  for (int i = 0; i < l->W; i++) {
    worker *w = &l->w[i];
    memset(w, 0, sizeof *w);
    w->l = l;
    w->id = i;
    int rc = pthread_create(&w->th, NULL, worker_main, w);
    if (rc != 0)
      return vl_err_set(err, VL_ERR_OOM, "loader: could not start worker thread %d of %d (%s)", i, l->W,
                        strerror(rc));
    w->running = true;
  }
  return VL_OK;
}

static void join_threads(vl_loader *l) {
  for (int i = 0; i < l->W; i++)
    if (l->w[i].running) {
      pthread_join(l->w[i].th, NULL);
      l->w[i].running = false;
    }
}

/* Stop the running epoch (if any): workers stop before their next sample and are joined
 * (non-persistent) or parked (persistent); buffers of unfinished tasks and the hold go
 * back to the free list. Lock NOT held on entry. */
static void stop_epoch(vl_loader *l) {
  pthread_mutex_lock(&l->mu);
  atomic_store(&l->live_gen, 0);
  pthread_cond_broadcast(&l->cv_work);
  if (l->W > 0 && !l->cfg.persistent) {
    pthread_mutex_unlock(&l->mu);
    join_threads(l);
    pthread_mutex_lock(&l->mu);
  } else {
    while (l->busy > 0) pthread_cond_wait(&l->cv_done, &l->mu);
  }
  for (int64_t k = l->consumed; k < l->ndispatched; k++) {
    task *t = &l->ring[k % l->R];
    if (t->buf) buf_put(l, t->buf);
    t->buf = NULL;
    t->state = T_FREE;
  }
  l->ndispatched = l->consumed;
  if (l->hold) buf_put(l, l->hold);
  l->hold = NULL;
  l->ended = true;
  pthread_mutex_unlock(&l->mu);
}

vl_status vl_loader_create(vl_loader **out, const vl_loader_cfg *cfg, const vl_dataset *ds,
                           vl_err *err) {
  if (!out) return vl_err_set(err, VL_ERR_INVALID, "loader: out is NULL");
  *out = NULL;
  vl_status s = check_cfg(cfg, ds, err);
  if (s != VL_OK) return s;
  int64_t n = ds->len(ds->self);
  if (n < 1) return vl_err_set(err, VL_ERR_INVALID, "loader: the dataset is empty (len %lld)", (long long)n);
  if ((uint64_t)n > SIZE_MAX / sizeof(int64_t) / 2)
    return vl_err_set(err, VL_ERR_INVALID, "loader: the dataset is too large (%lld samples)", (long long)n);

  vl_loader *l = calloc(1, sizeof *l);
  if (!l) return vl_err_set(err, VL_ERR_OOM, "loader: out of host memory");
  l->cfg = *cfg;
  l->ds = *ds;
  l->n = n;
  l->m = (n + cfg->world - 1) / cfg->world;
  l->nfull = l->m / cfg->batch;
  l->tail = l->m % cfg->batch;
  l->F = (int64_t)sample_floats(cfg);
  l->P = (int64_t)sample_ids(cfg);
  l->batch_bytes = vl_loader_batch_bytes(cfg);
  l->W = cfg->workers;
  l->R = l->W > 0 ? l->W * cfg->prefetch : 1;
  l->S = l->R + 1 + (cfg->on_corrupt == VL_CORRUPT_SKIP ? 1 : 0);

  /* The bound (see data.h): one definition, which a plan calls too. */
  const int wc = l->W > 0 ? l->W : 1;
  const size_t per_worker = worker_bytes(cfg, ds->scratch_bytes, ds->max_image_bytes);
  l->st.host_bytes_bound = vl_loader_host_bytes_bound(cfg, n, ds->scratch_bytes, ds->max_image_bytes);
  if (l->st.host_bytes_bound == SIZE_MAX) {
    vl_err_set(err, VL_ERR_INVALID, "loader: the host-memory bound overflows (batch %lld, %d buffers)",
               (long long)cfg->batch, l->S);
    free(l);
    return VL_ERR_INVALID;
  }
  if (cfg->host_mem_cap > 0 && l->st.host_bytes_bound > cfg->host_mem_cap) {
    char a[32], b[32];
    vl_err_set(err, VL_ERR_OOM,
               "loader: host-memory bound %zu bytes (%s: %d batch buffers of %zu bytes, %d x %zu "
               "bytes per worker, order and tasks) exceeds host_mem_cap %zu bytes (%s)",
               l->st.host_bytes_bound, vl_fmt_bytes(l->st.host_bytes_bound, a, sizeof a), l->S,
               l->batch_bytes, wc, per_worker, cfg->host_mem_cap,
               vl_fmt_bytes(cfg->host_mem_cap, b, sizeof b));
    free(l);
    return VL_ERR_OOM;
  }

  l->perm = malloc((size_t)n * sizeof(int64_t));
  l->ring = calloc((size_t)l->R, sizeof(task));
  l->w = l->W > 0 ? calloc((size_t)l->W, sizeof(worker)) : NULL;
  if (!l->perm || !l->ring || (l->W > 0 && !l->w)) {
    free(l->perm);
    free(l->ring);
    free(l->w);
    free(l);
    return vl_err_set(err, VL_ERR_OOM, "loader: out of host memory");
  }
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv_work, NULL);
  pthread_cond_init(&l->cv_done, NULL);
  atomic_init(&l->live_gen, 0);
  l->self.l = l;
  l->ended = true;
  if (l->W > 0 && cfg->persistent) {
    s = start_threads(l, err);
    if (s != VL_OK) {
      vl_loader_destroy(l);
      return s;
    }
  }
  *out = l;
  return VL_OK;
}

vl_status vl_loader_start_epoch(vl_loader *l, int64_t epoch) {
  if (!l->ended) stop_epoch(l);
  /* No worker is busy now: the epoch state is ours until live_gen is published. */
  l->epoch = epoch;
  build_order(l);
  l->sticky = VL_OK;
  l->st.last_error[0] = 0;
  l->ntasks = l->nfull + (l->tail > 0 ? 1 : 0);
  l->limit = l->cfg.drop_last ? l->nfull : l->ntasks;
  l->ndispatched = l->consumed = 0;
  l->hold = NULL;
  l->pending_skip = 0;
  l->pending_load = 0;
  l->pending_transform = 0;
  l->first_done = false;
  l->started = true;
  l->ended = false;
  l->t0 = vl_now();
  for (int r = 0; r < l->R; r++) l->ring[r].state = T_FREE, l->ring[r].buf = NULL;
  pthread_mutex_lock(&l->mu);
  l->gen++;
  atomic_store(&l->live_gen, l->gen);
  dispatch(l);
  pthread_cond_broadcast(&l->cv_work);
  pthread_mutex_unlock(&l->mu);
  if (l->W > 0 && !l->cfg.persistent) {
    vl_err e;
    vl_status s = start_threads(l, &e);
    if (s != VL_OK) {
      stop_epoch(l);
      snprintf(l->st.last_error, sizeof l->st.last_error, "%s", e.msg);
      l->sticky = s;
      return s;
    }
  }
  return VL_OK;
}

/* Hand `b` to the caller as the next batch. Lock held. */
static void deliver(vl_loader *l, bufnode *b, vl_batch_buf **out) {
  b->pub.skipped = l->pending_skip;
  b->pub.load_seconds = l->pending_load;
  b->pub.transform_seconds = l->pending_transform;
  l->pending_skip = 0;
  l->pending_load = 0;
  l->pending_transform = 0;
  l->st.batches++;
  l->st.samples += b->pub.n;
  l->held++;
  if (!l->first_done) {
    l->first_done = true;
    l->st.first_batch_seconds = vl_now() - l->t0;
  }
  *out = &b->pub;
}

/* Move samples [from, from+cnt) of src to dst's end. */
static void move_samples(vl_loader *l, bufnode *dst, bufnode *src, int64_t from, int64_t cnt) {
  size_t F = (size_t)l->F;
  int64_t d = dst->pub.n;
  memmove(dst->pub.x + (size_t)d * F, src->pub.x + (size_t)from * F, (size_t)cnt * F * sizeof(float));
  memmove(dst->pub.labels + d, src->pub.labels + from, (size_t)cnt * sizeof(int32_t));
  memmove(dst->pub.index + d, src->pub.index + from, (size_t)cnt * sizeof(int64_t));
  if (l->P > 0)
    memmove(dst->pub.y + (size_t)d * (size_t)l->P, src->pub.y + (size_t)from * (size_t)l->P,
            (size_t)cnt * (size_t)l->P * sizeof(int32_t));
  dst->pub.n += cnt;
}

vl_status vl_loader_next(vl_loader *l, vl_batch_buf **out) {
  *out = NULL;
  if (!l->started) {
    snprintf(l->st.last_error, sizeof l->st.last_error, "loader: call vl_loader_start_epoch first");
    return VL_ERR_INVALID;
  }
  if (l->sticky != VL_OK) return l->sticky;
  if (l->ended) return VL_OK;
  const int64_t B = l->cfg.batch;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    if (l->consumed == l->limit) {
      /* drop_last: the samples past the last full batch are read only to top up a hold. */
      if (l->limit < l->ntasks && l->hold) {
        l->limit = l->ntasks;
        continue;
      }
      bufnode *last = l->hold;
      l->hold = NULL;
      if (last && last->pub.n > 0 && !l->cfg.drop_last) deliver(l, last, out);
      else if (last) buf_put(l, last);
      pthread_mutex_unlock(&l->mu);
      stop_epoch(l); /* the epoch is over: joins non-persistent workers */
      return VL_OK;
    }
    const int64_t k = l->consumed;
    task *t = &l->ring[k % l->R];
    for (;;) {
      dispatch(l);
      if (k < l->ndispatched && (l->W == 0 || t->state == T_DONE)) break;
      if (k >= l->ndispatched) { /* no buffer can be had: only the caller can free one */
        vl_status s = l->alloc_failed ? VL_ERR_OOM : VL_ERR_INVALID;
        if (l->alloc_failed)
          snprintf(l->st.last_error, sizeof l->st.last_error,
                   "loader: could not allocate a %zu-byte batch buffer", l->batch_bytes);
        else
          snprintf(l->st.last_error, sizeof l->st.last_error,
                   "loader: all %d batch buffers are in use (the caller holds %d): release "
                   "batches before asking for more", l->S, l->held);
        pthread_mutex_unlock(&l->mu);
        return s; /* not sticky: releasing a batch and calling again works */
      }
      pthread_cond_wait(&l->cv_done, &l->mu);
    }
    if (l->W == 0) {
      t->state = T_RUNNING;
      pthread_mutex_unlock(&l->mu);
      worker_state_init(l, &l->self);
      run_task(l, &l->self, k, t, atomic_load(&l->live_gen), l->epoch);
      pthread_mutex_lock(&l->mu);
      t->state = T_DONE;
    }
    bufnode *p = t->buf;
    t->buf = NULL;
    t->state = T_FREE;
    l->consumed++;
    l->st.skipped += p->pub.skipped;
    if (t->st != VL_OK) {
      buf_put(l, p);
      l->sticky = t->st;
      snprintf(l->st.last_error, sizeof l->st.last_error, "%s", t->err);
      pthread_mutex_unlock(&l->mu);
      stop_epoch(l);
      return l->sticky;
    }
    l->pending_skip += p->pub.skipped;
    l->pending_load += p->pub.load_seconds;
    l->pending_transform += p->pub.transform_seconds;
    dispatch(l); /* the window moved */
    if (!l->hold) {
      if (p->pub.n == B) {
        deliver(l, p, out);
        break;
      }
      if (p->pub.n == 0) buf_put(l, p);
      else l->hold = p;
      continue;
    }
    bufnode *h = l->hold;
    int64_t take = B - h->pub.n < p->pub.n ? B - h->pub.n : p->pub.n;
    move_samples(l, h, p, 0, take);
    int64_t rest = p->pub.n - take;
    if (rest > 0) { /* pack the rest at the front of p */
      p->pub.n = 0;
      move_samples(l, p, p, take, rest);
    }
    if (h->pub.n == B) {
      l->hold = rest > 0 ? p : NULL;
      if (rest == 0) buf_put(l, p);
      deliver(l, h, out);
      break;
    }
    buf_put(l, p); /* h is not full, so p gave all it had */
  }
  pthread_mutex_unlock(&l->mu);
  return VL_OK;
}

void vl_loader_release(vl_loader *l, vl_batch_buf *b) {
  if (!l || !b) return;
  pthread_mutex_lock(&l->mu);
  buf_put(l, (bufnode *)b);
  l->held--;
  dispatch(l);
  pthread_mutex_unlock(&l->mu);
}

void vl_loader_stats_get(const vl_loader *l, vl_loader_stats *s) {
  vl_loader *m = (vl_loader *)l;
  pthread_mutex_lock(&m->mu);
  *s = l->st;
  pthread_mutex_unlock(&m->mu);
}

void vl_loader_destroy(vl_loader *l) {
  if (!l) return;
  if (!l->ended) stop_epoch(l);
  pthread_mutex_lock(&l->mu);
  l->shutdown = true;
  pthread_cond_broadcast(&l->cv_work);
  pthread_mutex_unlock(&l->mu);
  if (l->w) join_threads(l);
  worker_state_free(l, &l->self);
  for (bufnode *b = l->all, *nx; b; b = nx) {
    nx = b->next_all;
    buf_free(l, b);
  }
  pthread_cond_destroy(&l->cv_done);
  pthread_cond_destroy(&l->cv_work);
  pthread_mutex_destroy(&l->mu);
  free(l->perm);
  free(l->ring);
  free(l->w);
  free(l);
}
