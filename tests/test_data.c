/* Input pipeline (engine/data): sampler coverage and sharding, worker counts, prefetch,
 * persistent workers, in-order deterministic delivery, collate modes, corrupt samples,
 * stopping mid-epoch, the host-memory bound and cap, the transform, and segmentation
 * (masks). The dataset is an in-memory synthetic one: image i has a size and pixels that
 * are functions of i, label i % 10, and a configurable set of indices that read as corrupt;
 * in mask mode its pixels encode a per-pixel class mask (colour = function of the class). */
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vramlab/backend.h"
#include "vramlab/data.h"

/* ============================== synthetic dataset ==================================== */

#define MAXBAD 16

typedef struct {
  int64_t n;
  int64_t bad[MAXBAD];
  int nbad;
  int hard_fail;           /* index returning VL_ERR_BACKEND, or -1 */
  atomic_int delay_us;     /* reads of i % delay_mod == 0 sleep this long (jumbles finish */
  int delay_mod;           /* order; slows workers down), 3 by default */
  atomic_int scratch_live; /* scratch_new minus scratch_free */
  atomic_int scratch_made, limits_set; /* scratch_new calls; scratch_limit calls */
  atomic_long reads;
  bool masks;              /* give a mask with every image (seg_fill) */
  int seg_size;            /* masks: square images of this side; 0: img_w x img_h */
  int64_t no_mask;         /* masks: this index comes without one (mask freed), or -1 */
} synth;

static int img_w(int64_t i) { return 9 + (int)((i * 7) % 29); }
static int img_h(int64_t i) { return 7 + (int)((i * 5) % 23); }
static uint8_t img_px(int64_t i, int y, int x, int c) {
  return (uint8_t)((i * 31 + y * 7 + x * 3 + c * 50 + (x * y) % 11) & 255);
}

static int64_t syn_len(void *self) { return ((synth *)self)->n; }
/* A scratch's first 8 bytes: the largest "file" it may read (scratch_limit). */
static void *syn_scratch_new(void *self) {
  atomic_fetch_add(&((synth *)self)->scratch_live, 1);
  atomic_fetch_add(&((synth *)self)->scratch_made, 1);
  uint64_t *p = malloc(64);
  if (p) *p = UINT64_MAX; /* until the loader says */
  return p;
}
static void syn_scratch_limit(void *self, void *scratch, uint64_t max_file_bytes) {
  atomic_fetch_add(&((synth *)self)->limits_set, 1);
  *(uint64_t *)scratch = max_file_bytes;
}
static void syn_scratch_free(void *self, void *scratch) {
  atomic_fetch_sub(&((synth *)self)->scratch_live, 1);
  free(scratch);
}

static void sleep_us(int us) {
  struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* Runs on worker threads: no cmocka asserts here (they cannot unwind another thread);
 * failures come back as statuses the test checks. */

/* *buf holds at least need bytes (*cap, grown with realloc); false if out of memory. */
static bool reserve(uint8_t **buf, size_t *cap, size_t need) {
  if (*cap >= need) return true;
  uint8_t *p = realloc(*buf, need);
  if (!p) return false;
  *buf = p;
  *cap = need;
  return true;
}

static bool fill_image(int64_t i, vl_image *out) {
  int w = img_w(i), h = img_h(i);
  if (!reserve(&out->pix, &out->cap, (size_t)w * h * 3)) return false;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < 3; c++) out->pix[((size_t)y * w + x) * 3 + c] = img_px(i, y, x, c);
  out->w = w;
  out->h = h;
  out->c = 3;
  out->label = (int32_t)(i % 10);
  return true;
}

/* Mask mode: class ids in 4x4 blocks (block edges at even coordinates, so a 2x bilinear
 * downscale never mixes two blocks), and every pixel's colour a function of its class
 * alone: seg_col(m, c) tells the class back from the pixel. */
#define SEG_CLASSES 5
static uint8_t seg_mask(int64_t i, int y, int x) { return (uint8_t)((x / 4 + 2 * (y / 4) + i) % SEG_CLASSES); }
static uint8_t seg_col(int m, int c) { return (uint8_t)(c == 0 ? 30 + 50 * m : c == 1 ? 220 - 40 * m : 90 + 7 * m); }
static int seg_w(const synth *s, int64_t i) { return s->seg_size ? s->seg_size : img_w(i); }
static int seg_h(const synth *s, int64_t i) { return s->seg_size ? s->seg_size : img_h(i); }

static bool seg_fill(const synth *s, int64_t i, vl_image *out) {
  int w = seg_w(s, i), h = seg_h(s, i);
  if (!reserve(&out->pix, &out->cap, (size_t)w * h * 3)) return false;
  if (i == s->no_mask) { /* a dataset without a mask for this sample leaves it NULL */
    free(out->mask);
    out->mask = NULL;
    out->mask_cap = 0;
  } else if (!reserve(&out->mask, &out->mask_cap, (size_t)w * h)) {
    return false;
  }
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      uint8_t m = seg_mask(i, y, x);
      if (out->mask) out->mask[(size_t)y * w + x] = m;
      for (int c = 0; c < 3; c++) out->pix[((size_t)y * w + x) * 3 + c] = seg_col(m, c);
    }
  out->w = w;
  out->h = h;
  out->c = 3;
  out->label = (int32_t)(i % 10);
  return true;
}

static vl_status syn_read(void *self, void *scratch, int64_t i, vl_image *out, vl_err *err) {
  synth *s = self;
  atomic_fetch_add(&s->reads, 1);
  if (!scratch || i < 0 || i >= s->n) {
    return vl_err_set(err, VL_ERR_INVALID, "synthetic: bad call (scratch %p, index %lld)", scratch, (long long)i);
  }
  int d = atomic_load(&s->delay_us);
  if (d > 0 && i % s->delay_mod == 0) sleep_us(d);
  /* Image i as a "file" of w*h*3 bytes: larger than the scratch's limit, it is refused. */
  const uint64_t fb = (uint64_t)img_w(i) * (uint64_t)img_h(i) * 3;
  if (fb > *(uint64_t *)scratch) {
    return vl_err_set(err, VL_ERR_IO, "synthetic file of %llu bytes exceeds max_file_bytes (%llu)",
                      (unsigned long long)fb, (unsigned long long)*(uint64_t *)scratch);
  }
  for (int k = 0; k < s->nbad; k++)
    if (s->bad[k] == i) return vl_err_set(err, VL_ERR_IO, "synthetic corrupt image %lld", (long long)i);
  if (i == s->hard_fail) return vl_err_set(err, VL_ERR_BACKEND, "synthetic hard failure %lld", (long long)i);
  if (s->masks) return seg_fill(s, i, out) ? VL_OK : VL_ERR_OOM;
  return fill_image(i, out) ? VL_OK : VL_ERR_OOM;
}

static void syn_init(synth *s, int64_t n) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->hard_fail = -1;
  s->delay_mod = 3;
  s->no_mask = -1;
}

static vl_dataset syn_dataset(synth *s) {
  vl_dataset d;
  memset(&d, 0, sizeof d);
  d.self = s;
  d.len = syn_len;
  d.scratch_new = syn_scratch_new;
  d.scratch_free = syn_scratch_free;
  d.scratch_limit = syn_scratch_limit;
  d.read = syn_read;
  d.scratch_bytes = 64;
  d.max_image_bytes = (size_t)(9 + 28) * (7 + 22) * 3;
  return d;
}

/* ============================== helpers ============================================== */

static vl_loader_cfg small_cfg(void) {
  vl_loader_cfg c;
  vl_loader_cfg_default(&c);
  c.batch = 5;
  c.crop = 8;
  c.seed = 1234;
  return c;
}

/* vl_transform / vl_transform_seg of im with an rng freshly seeded with seed. */
static void xform(const vl_loader_cfg *c, const vl_image *im, uint64_t seed, float *x) {
  vl_rng r;
  vl_rng_seed(&r, seed);
  vl_transform(c, im, &r, x);
}
static void xform_seg(const vl_loader_cfg *c, const vl_image *im, uint64_t seed, float *x,
                      int32_t *y) {
  vl_rng r;
  vl_rng_seed(&r, seed);
  vl_transform_seg(c, im, &r, x, y);
}

static vl_loader *mk_loader(const vl_loader_cfg *c, synth *s) {
  vl_dataset d = syn_dataset(s);
  vl_loader *l = NULL;
  vl_err err = {""};
  vl_status st = vl_loader_create(&l, c, &d, &err);
  if (st != VL_OK) print_error("create: %s\n", err.msg);
  assert_int_equal(st, VL_OK);
  assert_non_null(l);
  return l;
}

#define MAXS 256
typedef struct {
  int64_t n, nb, skipped_sum;
  int64_t idx[MAXS];
  int32_t lab[MAXS];
  int64_t bsz[MAXS];
  float *x;   /* n * F */
  int32_t *y; /* n * crop * crop with masks, else NULL */
} epoch_out;

static void out_free(epoch_out *o) {
  free(o->x);
  free(o->y);
  o->x = NULL;
  o->y = NULL;
}

/* Runs epoch `e` to its end, releasing each batch, and collects what was delivered.
 * Returns the first non-OK status of vl_loader_next (what came before it is in o). */
static vl_status run_epoch(vl_loader *l, const vl_loader_cfg *c, int64_t e, epoch_out *o) {
  memset(o, 0, sizeof *o);
  const int64_t F = 3 * (int64_t)c->crop * c->crop, P = (int64_t)c->crop * c->crop;
  o->x = malloc((size_t)MAXS * F * sizeof(float));
  assert_non_null(o->x);
  if (c->masks) {
    o->y = malloc((size_t)MAXS * P * sizeof(int32_t));
    assert_non_null(o->y);
  }
  assert_int_equal(vl_loader_start_epoch(l, e), VL_OK);
  for (;;) {
    vl_batch_buf *b = NULL;
    vl_status st = vl_loader_next(l, &b);
    if (st != VL_OK) {
      assert_null(b);
      return st;
    }
    if (!b) break;
    assert_true(b->n >= 1 && b->n <= c->batch);
    assert_true(o->n + b->n <= MAXS);
    memcpy(o->x + o->n * F, b->x, (size_t)b->n * F * sizeof(float));
    if (c->masks) { /* y only with masks */
      assert_non_null(b->y);
      memcpy(o->y + o->n * P, b->y, (size_t)b->n * P * sizeof(int32_t));
    } else {
      assert_null(b->y);
    }
    memcpy(o->idx + o->n, b->index, (size_t)b->n * sizeof(int64_t));
    memcpy(o->lab + o->n, b->labels, (size_t)b->n * sizeof(int32_t));
    o->bsz[o->nb++] = b->n;
    o->skipped_sum += b->skipped;
    o->n += b->n;
    vl_loader_release(l, b);
  }
  /* After the end, next keeps saying "end". */
  vl_batch_buf *b = (vl_batch_buf *)1;
  assert_int_equal(vl_loader_next(l, &b), VL_OK);
  assert_null(b);
  return VL_OK;
}

static void assert_same_epoch(const epoch_out *a, const epoch_out *b, int64_t F) {
  assert_int_equal(a->n, b->n);
  assert_int_equal(a->nb, b->nb);
  assert_memory_equal(a->idx, b->idx, (size_t)a->n * sizeof(int64_t));
  assert_memory_equal(a->lab, b->lab, (size_t)a->n * sizeof(int32_t));
  assert_memory_equal(a->bsz, b->bsz, (size_t)a->nb * sizeof(int64_t));
  assert_memory_equal(a->x, b->x, (size_t)(a->n * F) * sizeof(float));
  assert_true(!a->y == !b->y);
  if (a->y) assert_memory_equal(a->y, b->y, (size_t)(a->n * (F / 3)) * sizeof(int32_t));
}

/* A fresh loader for c over s runs epoch e through (VL_OK) into o; st, if given, gets the
 * loader's stats after it. */
static void epoch_once(const vl_loader_cfg *c, synth *s, int64_t e, epoch_out *o,
                       vl_loader_stats *st) {
  vl_loader *l = mk_loader(c, s);
  assert_int_equal(run_epoch(l, c, e, o), VL_OK);
  if (st) vl_loader_stats_get(l, st);
  vl_loader_destroy(l);
}

/* A fresh loader for c over s delivers, for epoch e, exactly what ref holds; st as above. */
static void assert_epoch_is(const epoch_out *ref, const vl_loader_cfg *c, synth *s, int64_t e,
                            int64_t F, vl_loader_stats *st) {
  epoch_out o;
  epoch_once(c, s, e, &o, st);
  assert_same_epoch(ref, &o, F);
  out_free(&o);
}

/* o is `all` without the samples bad[0 .. nbad): the same order, pixels and masks. */
static void assert_all_but_bad(const epoch_out *o, const epoch_out *all, const int64_t *bad,
                               int nbad, int64_t F) {
  const int64_t P = F / 3;
  int64_t j = 0;
  for (int64_t i = 0; i < all->n; i++) {
    bool isbad = false;
    for (int k = 0; k < nbad; k++) isbad |= all->idx[i] == bad[k];
    if (isbad) continue;
    assert_true(j < o->n);
    assert_int_equal(o->idx[j], all->idx[i]);
    assert_memory_equal(o->x + j * F, all->x + i * F, (size_t)F * sizeof(float));
    if (o->y) assert_memory_equal(o->y + j * P, all->y + i * P, (size_t)P * sizeof(int32_t));
    j++;
  }
  assert_int_equal(j, o->n);
}

static int count_threads(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* A joined thread can still be listed in /proc/self/task for a moment: pthread_join
 * returns when the thread clears its tid, before the kernel reaps it. So a count is
 * polled (up to 2 s) until it reaches the expected value; a real leak stays. */
static int threads_settle(int expected) {
  int n = count_threads();
  for (int i = 0; i < 200 && n != expected; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    n = count_threads();
  }
  return n;
}

/* ============================== config =============================================== */

/* vl_loader_create refuses c over s with status want and leaves the loader NULL; its
 * message is in err. */
static void expect_refused(const vl_loader_cfg *c, synth *s, vl_status want, vl_err *err) {
  vl_dataset d = syn_dataset(s);
  vl_loader *l = (vl_loader *)1;
  err->msg[0] = '\0';
  assert_int_equal(vl_loader_create(&l, c, &d, err), want);
  assert_null(l);
}

static void expect_invalid(const vl_loader_cfg *c, synth *s, const char *needle) {
  vl_err err;
  expect_refused(c, s, VL_ERR_INVALID, &err);
  if (!strstr(err.msg, needle)) print_error("message '%s' lacks '%s'\n", err.msg, needle);
  assert_non_null(strstr(err.msg, needle));
}

static void test_config_validation(void **state) {
  (void)state;
  synth s;
  syn_init(&s, 20);
  vl_loader_cfg c;
  c = small_cfg(), c.batch = 0, expect_invalid(&c, &s, "batch");
  c = small_cfg(), c.prefetch = 0, expect_invalid(&c, &s, "prefetch");
  c = small_cfg(), c.workers = -1, expect_invalid(&c, &s, "workers");
  c = small_cfg(), c.crop = 0, expect_invalid(&c, &s, "crop");
  c = small_cfg(), c.crop = VL_LOADER_CROP_MAX + 1, expect_invalid(&c, &s, "crop");
  c = small_cfg(), c.world = 0, expect_invalid(&c, &s, "world");
  c = small_cfg(), c.world = 2, c.rank = 2, expect_invalid(&c, &s, "rank 2");
  c = small_cfg(), c.rank = -1, expect_invalid(&c, &s, "rank -1");
  c = small_cfg(), c.std[1] = 0, expect_invalid(&c, &s, "std[1]");
  c = small_cfg(), c.std[2] = NAN, expect_invalid(&c, &s, "std[2]");
  c = small_cfg(), c.mean[0] = INFINITY, expect_invalid(&c, &s, "mean[0]");
  c = small_cfg(), c.scale_min = 0.9f, c.scale_max = 0.5f, expect_invalid(&c, &s, "scale");
  c = small_cfg(), c.ratio_min = 0, expect_invalid(&c, &s, "ratio");
  c = small_cfg(), c.on_corrupt = (vl_corrupt_policy)7, expect_invalid(&c, &s, "on_corrupt");
  c = small_cfg(), c.max_file_bytes = 0, expect_invalid(&c, &s, "max_file_bytes");
  synth empty;
  syn_init(&empty, 0);
  c = small_cfg(), expect_invalid(&c, &empty, "empty");
  /* A dataset without read(). */
  vl_dataset d = syn_dataset(&s);
  d.read = NULL;
  vl_loader *l = NULL;
  vl_err err = {""};
  c = small_cfg();
  assert_int_equal(vl_loader_create(&l, &c, &d, &err), VL_ERR_INVALID);
  assert_non_null(strstr(err.msg, "read"));
  /* next before start_epoch is an error, not a crash. */
  l = mk_loader(&c, &s);
  vl_batch_buf *b = NULL;
  assert_int_equal(vl_loader_next(l, &b), VL_ERR_INVALID);
  assert_null(b);
  vl_loader_stats st;
  vl_loader_stats_get(l, &st);
  assert_non_null(strstr(st.last_error, "start_epoch"));
  vl_loader_destroy(l);
  assert_int_equal(atomic_load(&s.scratch_live), 0);
}

/* cfg.max_file_bytes (64 MiB by default) reaches every worker's scratch through
 * scratch_limit, once per scratch, whatever the worker count and persistence: a "file"
 * larger than it is a corrupt sample (skipped under SKIP, the epoch's error under ERROR). */
static void test_max_file_bytes(void **state) {
  (void)state;
  const int64_t N = 30;
  synth s;
  syn_init(&s, N);
  vl_loader_cfg c = small_cfg();
  assert_true(c.max_file_bytes == VL_LOADER_MAX_FILE_BYTES);
  assert_true(VL_LOADER_MAX_FILE_BYTES == 64u << 20);
  const uint64_t lim = 1500; /* the "files" are 189 .. 3219 bytes */
  int64_t nbig = 0;
  bool big[30];
  for (int64_t i = 0; i < N; i++) nbig += big[i] = (uint64_t)img_w(i) * img_h(i) * 3 > lim;
  assert_true(nbig > 3 && nbig < N - 3);
  for (int w = 0; w <= 3; w++)
    for (int pers = 0; pers < 2; pers++) {
      c = small_cfg();
      c.workers = w;
      c.persistent = pers;
      c.max_file_bytes = lim;
      c.on_corrupt = VL_CORRUPT_SKIP;
      atomic_store(&s.limits_set, 0);
      atomic_store(&s.scratch_made, 0);
      epoch_out o;
      vl_loader_stats st;
      epoch_once(&c, &s, 2, &o, &st);
      assert_int_equal(st.skipped, nbig);
      assert_int_equal(o.n, N - nbig);
      for (int64_t k = 0; k < o.n; k++) assert_false(big[o.idx[k]]);
      assert_true(atomic_load(&s.scratch_made) >= 1);
      assert_int_equal(atomic_load(&s.limits_set), atomic_load(&s.scratch_made));
      out_free(&o);
    }
  c = small_cfg();
  c.workers = 2;
  c.max_file_bytes = lim;
  vl_loader *l = mk_loader(&c, &s);
  epoch_out o;
  assert_int_equal(run_epoch(l, &c, 0, &o), VL_ERR_IO);
  vl_loader_stats st;
  vl_loader_stats_get(l, &st);
  assert_non_null(strstr(st.last_error, "exceeds max_file_bytes (1500)"));
  vl_loader_destroy(l);
  out_free(&o);
  assert_int_equal(atomic_load(&s.scratch_live), 0);

  /* The policy's names, as the cases' corrupt knob takes them. */
  vl_corrupt_policy p = VL_CORRUPT_ERROR;
  assert_int_equal(vl_corrupt_policy_parse("skip", &p), 0);
  assert_int_equal(p, VL_CORRUPT_SKIP);
  assert_int_equal(vl_corrupt_policy_parse("ERROR", &p), 0);
  assert_int_equal(p, VL_CORRUPT_ERROR);
  assert_int_equal(vl_corrupt_policy_parse("ignore", &p), -1);
  assert_int_equal(vl_corrupt_policy_parse("", &p), -1);
  assert_int_equal(vl_corrupt_policy_parse(NULL, &p), -1);
  assert_string_equal(vl_corrupt_policy_name(VL_CORRUPT_SKIP), "skip");
  assert_string_equal(vl_corrupt_policy_name(VL_CORRUPT_ERROR), "error");
}

/* ============================== coverage ============================================= */

/* Every sample exactly once per epoch (or, with drop_last, every sample but the order's
 * last n % batch), for every worker count, prefetch depth, persistence and drop_last. */
static void test_every_sample_once(void **state) {
  (void)state;
  const int64_t N = 53;
  const int workers[] = {0, 1, 2, 4}, prefetch[] = {1, 2, 4};
  synth s;
  syn_init(&s, N);
  for (int wi = 0; wi < 4; wi++)
    for (int pi = 0; pi < 3; pi++)
      for (int pers = 0; pers < 2; pers++)
        for (int dl = 0; dl < 2; dl++) {
          vl_loader_cfg c = small_cfg();
          c.workers = workers[wi];
          c.prefetch = prefetch[pi];
          c.persistent = pers;
          c.drop_last = dl;
          vl_loader *l = mk_loader(&c, &s);
          assert_int_equal(vl_loader_shard_len(l), N);
          for (int64_t e = 0; e < 2; e++) {
            epoch_out o;
            assert_int_equal(run_epoch(l, &c, e, &o), VL_OK);
            int64_t expect = dl ? (N / c.batch) * c.batch : N;
            assert_int_equal(o.n, expect);
            assert_int_equal(o.nb, dl ? N / c.batch : (N + c.batch - 1) / c.batch);
            for (int64_t b = 0; b + 1 < o.nb; b++) assert_int_equal(o.bsz[b], c.batch);
            int seen[53] = {0};
            for (int64_t i = 0; i < o.n; i++) {
              assert_true(o.idx[i] >= 0 && o.idx[i] < N);
              seen[o.idx[i]]++;
              assert_int_equal(o.lab[i], o.idx[i] % 10);
            }
            int64_t once = 0;
            for (int i = 0; i < N; i++) {
              assert_true(seen[i] <= 1);
              once += seen[i];
            }
            assert_int_equal(once, expect);
            out_free(&o);
          }
          vl_loader_stats st;
          vl_loader_stats_get(l, &st);
          assert_int_equal(st.samples, 2 * (dl ? (N / c.batch) * c.batch : N));
          assert_int_equal(st.skipped, 0);
          assert_true(st.host_bytes_peak > 0);
          assert_true(st.host_bytes_peak <= st.host_bytes_bound);
          vl_loader_destroy(l);
          assert_int_equal(atomic_load(&s.scratch_live), 0);
        }
}

/* world = 2: shards have equal length, together cover the epoch, and are disjoint apart
 * from the documented padding (world*ceil(n/world) - n repeats of the order's head). */
static void test_shards(void **state) {
  (void)state;
  const int64_t sizes[] = {54, 53};
  for (int si = 0; si < 2; si++) {
    const int64_t N = sizes[si];
    synth s;
    syn_init(&s, N);
    epoch_out o[2];
    for (int r = 0; r < 2; r++) {
      vl_loader_cfg c = small_cfg();
      c.world = 2;
      c.rank = r;
      c.workers = r + 1;
      vl_loader *l = mk_loader(&c, &s);
      assert_int_equal(vl_loader_shard_len(l), (N + 1) / 2);
      assert_int_equal(run_epoch(l, &c, 3, &o[r]), VL_OK);
      vl_loader_destroy(l);
    }
    assert_int_equal(o[0].n, (N + 1) / 2);
    assert_int_equal(o[1].n, (N + 1) / 2);
    int seen[2][64] = {{0}};
    for (int r = 0; r < 2; r++)
      for (int64_t i = 0; i < o[r].n; i++) seen[r][o[r].idx[i]]++;
    int64_t both = 0, covered = 0;
    for (int i = 0; i < N; i++) {
      assert_true(seen[0][i] <= 1 && seen[1][i] <= 1);
      if (seen[0][i] && seen[1][i]) both++;
      if (seen[0][i] || seen[1][i]) covered++;
    }
    assert_int_equal(covered, N);
    assert_int_equal(both, 2 * ((N + 1) / 2) - N);
    if (N % 2) /* the pad is the order's first sample, i.e. rank 0's first */
      assert_int_equal(o[1].idx[o[1].n - 1], o[0].idx[0]);
    out_free(&o[0]);
    out_free(&o[1]);
  }
}

/* ============================== determinism ========================================== */

/* Same seed and epoch: the same order and bit-identical batches for any worker count and
 * prefetch, even when workers finish out of order (some reads are slow). */
static void test_deterministic_across_workers(void **state) {
  (void)state;
  const int64_t N = 47;
  synth s;
  syn_init(&s, N);
  vl_loader_cfg c = small_cfg();
  const int64_t F = 3 * c.crop * c.crop;
  epoch_out ref;
  epoch_once(&c, &s, 5, &ref, NULL);
  s.delay_us = 300;
  const int workers[] = {1, 2, 3, 4};
  for (int wi = 0; wi < 4; wi++) {
    vl_loader_cfg c2 = c;
    c2.workers = workers[wi];
    c2.prefetch = 1 + wi % 2;
    c2.persistent = wi % 2;
    assert_epoch_is(&ref, &c2, &s, 5, F, NULL);
  }
  out_free(&ref);
}

/* Different epochs shuffle differently, the same epoch repeats, the seed matters, and
 * without shuffle the order is the identity. */
static void test_epochs_shuffle(void **state) {
  (void)state;
  const int64_t N = 40;
  synth s;
  syn_init(&s, N);
  vl_loader_cfg c = small_cfg();
  c.workers = 2;
  const int64_t F = 3 * c.crop * c.crop;
  vl_loader *l = mk_loader(&c, &s);
  epoch_out e0, e1, e0b;
  assert_int_equal(run_epoch(l, &c, 0, &e0), VL_OK);
  assert_int_equal(run_epoch(l, &c, 1, &e1), VL_OK);
  assert_int_equal(run_epoch(l, &c, 0, &e0b), VL_OK);
  assert_same_epoch(&e0, &e0b, F);
  assert_int_equal(e0.n, e1.n);
  assert_true(memcmp(e0.idx, e1.idx, (size_t)N * sizeof(int64_t)) != 0);
  int64_t same_pos = 0, identity = 0;
  for (int64_t i = 0; i < N; i++) {
    same_pos += e0.idx[i] == e1.idx[i];
    identity += e0.idx[i] == i;
  }
  assert_true(same_pos < N / 4); /* two shuffles agree in ~1 place on average */
  assert_true(identity < N / 4);
  vl_loader_destroy(l);

  vl_loader_cfg c2 = c;
  c2.seed = c.seed + 1;
  l = mk_loader(&c2, &s);
  epoch_out other;
  assert_int_equal(run_epoch(l, &c2, 0, &other), VL_OK);
  assert_true(memcmp(e0.idx, other.idx, (size_t)N * sizeof(int64_t)) != 0);
  vl_loader_destroy(l);

  c2 = c;
  c2.shuffle = false;
  l = mk_loader(&c2, &s);
  epoch_out ord;
  assert_int_equal(run_epoch(l, &c2, 9, &ord), VL_OK);
  for (int64_t i = 0; i < N; i++) assert_int_equal(ord.idx[i], i);
  vl_loader_destroy(l);
  out_free(&e0), out_free(&e1), out_free(&e0b), out_free(&other), out_free(&ord);
}

/* Batched collate is bit-identical to per-sample collate, and both equal vl_transform of
 * the sample with its documented seed. */
static void test_collate_bit_identical(void **state) {
  (void)state;
  const int64_t N = 23;
  synth s;
  syn_init(&s, N);
  vl_loader_cfg c = small_cfg();
  c.crop = 12;
  c.workers = 2;
  const int64_t F = 3 * c.crop * c.crop;
  epoch_out o[2];
  for (int m = 0; m < 2; m++) {
    vl_loader_cfg cm = c;
    cm.batched_collate = m;
    epoch_once(&cm, &s, 2, &o[m], NULL);
  }
  assert_same_epoch(&o[0], &o[1], F);
  vl_image img = {0};
  float *ref = malloc((size_t)F * sizeof(float));
  assert_non_null(ref);
  for (int64_t i = 0; i < o[0].n; i++) {
    assert_true(fill_image(o[0].idx[i], &img));
    xform(&c, &img, vl_loader_sample_seed(c.seed, 2, o[0].idx[i]), ref);
    assert_memory_equal(ref, o[0].x + i * F, (size_t)F * sizeof(float));
  }
  free(ref);
  free(img.pix);
  out_free(&o[0]);
  out_free(&o[1]);
}

/* ============================== corrupt samples ====================================== */

/* SKIP: corrupt samples are counted and never delivered; the stream is the order minus
 * them, cut into full batches (only the last may be short), the same for every worker
 * count. */
static void test_corrupt_skip(void **state) {
  (void)state;
  const int64_t N = 53;
  synth s;
  syn_init(&s, N);
  const int64_t bad[] = {3, 7, 8, 20, 52};
  s.nbad = 5;
  memcpy(s.bad, bad, sizeof bad);
  vl_loader_cfg c = small_cfg();
  c.on_corrupt = VL_CORRUPT_SKIP;
  const int64_t F = 3 * c.crop * c.crop;
  epoch_out ref;
  vl_loader_stats st;
  epoch_once(&c, &s, 1, &ref, &st);
  assert_int_equal(st.skipped, 5);
  assert_int_equal(ref.skipped_sum, 5);
  assert_int_equal(ref.n, N - 5);
  assert_true(st.host_bytes_peak <= st.host_bytes_bound);
  for (int64_t i = 0; i < ref.n; i++)
    for (int k = 0; k < 5; k++) assert_true(ref.idx[i] != bad[k]);
  for (int64_t b = 0; b + 1 < ref.nb; b++) assert_int_equal(ref.bsz[b], c.batch);
  /* The same stream as an unshuffled-order check would give: compare to the order of a
   * clean run minus the bad ones. */
  synth clean;
  syn_init(&clean, N);
  epoch_out all;
  epoch_once(&c, &clean, 1, &all, NULL);
  assert_all_but_bad(&ref, &all, bad, 5, F);
  out_free(&all);

  s.delay_us = 200;
  const int workers[] = {1, 2, 3};
  for (int wi = 0; wi < 3; wi++) {
    vl_loader_cfg c2 = c;
    c2.workers = workers[wi];
    c2.prefetch = 1 + wi;
    c2.persistent = wi == 1;
    c2.batched_collate = wi == 2;
    assert_epoch_is(&ref, &c2, &s, 1, F, &st);
    assert_int_equal(st.skipped, 5);
    assert_true(st.host_bytes_peak <= st.host_bytes_bound);
  }
  out_free(&ref);
}

/* SKIP with drop_last: samples past the last full batch top up batches shortened by
 * skips, so an epoch with one corrupt sample still gives every full batch it can. */
static void test_corrupt_skip_drop_last(void **state) {
  (void)state;
  const int64_t N = 53;
  synth s;
  syn_init(&s, N);
  s.bad[0] = 7;
  s.nbad = 1;
  for (int w = 0; w <= 2; w += 2) {
    vl_loader_cfg c = small_cfg();
    c.on_corrupt = VL_CORRUPT_SKIP;
    c.drop_last = true;
    c.shuffle = false;
    c.workers = w;
    vl_loader *l = mk_loader(&c, &s);
    epoch_out o;
    assert_int_equal(run_epoch(l, &c, 0, &o), VL_OK);
    assert_int_equal(o.nb, 10);
    assert_int_equal(o.n, 50);
    for (int64_t i = 0; i < o.n; i++) assert_int_equal(o.idx[i], i < 7 ? i : i + 1);
    assert_int_equal(o.skipped_sum, 1);
    out_free(&o);
    /* Two more corrupt samples: 50 good ones are left, the last full batch is 46..52. */
    s.bad[1] = 30, s.bad[2] = 31, s.nbad = 3;
    assert_int_equal(run_epoch(l, &c, 0, &o), VL_OK);
    assert_int_equal(o.n, 50);
    assert_int_equal(o.idx[49], 52);
    vl_loader_stats st;
    vl_loader_stats_get(l, &st);
    assert_int_equal(st.skipped, 4);
    vl_loader_destroy(l);
    out_free(&o);
    s.nbad = 1;
  }
}

/* ERROR: next returns VL_ERR_IO at the batch holding the sample, after delivering every
 * batch before it; last_error names the sample; the epoch stays failed; a later epoch
 * works again. A hard dataset failure is returned whatever the policy. */
static void test_corrupt_error(void **state) {
  (void)state;
  const int64_t N = 53;
  for (int w = 0; w <= 3; w += 3) {
    synth s;
    syn_init(&s, N);
    s.bad[0] = 17;
    s.nbad = 1;
    vl_loader_cfg c = small_cfg();
    c.workers = w;
    c.persistent = true;
    vl_loader *l = mk_loader(&c, &s);
    epoch_out o;
    assert_int_equal(run_epoch(l, &c, 4, &o), VL_ERR_IO);
    /* Everything before 17's batch was delivered, 17 never. */
    synth clean;
    syn_init(&clean, N);
    epoch_out all;
    epoch_once(&c, &clean, 4, &all, NULL);
    int64_t pos = -1;
    for (int64_t i = 0; i < all.n; i++)
      if (all.idx[i] == 17) pos = i;
    assert_true(pos >= 0);
    assert_int_equal(o.n, (pos / c.batch) * c.batch);
    assert_memory_equal(o.idx, all.idx, (size_t)o.n * sizeof(int64_t));
    vl_loader_stats st;
    vl_loader_stats_get(l, &st);
    assert_non_null(strstr(st.last_error, "sample 17"));
    assert_non_null(strstr(st.last_error, "synthetic corrupt image 17"));
    vl_batch_buf *b = NULL;
    assert_int_equal(vl_loader_next(l, &b), VL_ERR_IO); /* sticky */
    assert_null(b);
    out_free(&o);
    /* Fixed data: the next epoch runs through. */
    s.nbad = 0;
    assert_int_equal(run_epoch(l, &c, 5, &o), VL_OK);
    assert_int_equal(o.n, N);
    vl_loader_stats_get(l, &st);
    assert_int_equal(st.last_error[0], 0);
    out_free(&o);
    /* A hard failure is never skipped. */
    vl_loader_destroy(l);
    c.on_corrupt = VL_CORRUPT_SKIP;
    s.hard_fail = 11;
    l = mk_loader(&c, &s);
    assert_int_equal(run_epoch(l, &c, 5, &o), VL_ERR_BACKEND);
    vl_loader_stats_get(l, &st);
    assert_non_null(strstr(st.last_error, "sample 11"));
    vl_loader_destroy(l);
    assert_int_equal(atomic_load(&s.scratch_live), 0);
    out_free(&o);
    out_free(&all);
  }
}

/* ============================== stopping ============================================= */

/* Restarting an epoch after one batch, and destroying after one (unreleased) batch,
 * stop workers promptly, join every thread, free every scratch; the restarted epoch is
 * complete. LeakSanitizer checks the rest under the ASan build. */
static void test_stop_mid_epoch(void **state) {
  (void)state;
  const int64_t N = 60;
  const int base = threads_settle(1); /* earlier tests' joined threads may linger a moment */
  assert_true(base >= 1);
  const int workers[] = {0, 1, 3};
  for (int wi = 0; wi < 3; wi++)
    for (int pers = 0; pers < 2; pers++) {
      synth s;
      syn_init(&s, N);
      /* Slow reads (40 ms each, 320 ms a batch): workers are mid-batch when stopped. */
      s.delay_mod = 1;
      atomic_store(&s.delay_us, 40000);
      vl_loader_cfg c = small_cfg();
      c.batch = 8;
      c.workers = workers[wi];
      c.persistent = pers;
      c.prefetch = 2;
      vl_loader *l = mk_loader(&c, &s);
      if (pers) assert_int_equal(threads_settle(base + c.workers), base + c.workers);
      assert_int_equal(vl_loader_start_epoch(l, 0), VL_OK);
      vl_batch_buf *b = NULL;
      assert_int_equal(vl_loader_next(l, &b), VL_OK);
      assert_non_null(b);
      vl_loader_release(l, b);
      double t0 = vl_now();
      assert_int_equal(vl_loader_start_epoch(l, 1), VL_OK); /* stops epoch 0 mid-way */
      double stop_s = vl_now() - t0;
      /* A stop waits for at most one read per worker, not for the rest of its batch. */
      if (stop_s >= 0.16) print_error("stop took %.3f s\n", stop_s);
      assert_true(stop_s < 0.16);
      /* reads are still slow here, so epoch 1's workers are alive for this count */
      if (!pers) assert_int_equal(threads_settle(base + c.workers), base + c.workers);
      atomic_store(&s.delay_us, 0);
      int seen[60] = {0};
      int64_t got = 0, nb = 0;
      for (;;) {
        assert_int_equal(vl_loader_next(l, &b), VL_OK);
        if (!b) break;
        for (int64_t i = 0; i < b->n; i++) seen[b->index[i]]++;
        got += b->n;
        nb++;
        vl_loader_release(l, b);
      }
      assert_int_equal(got, N);
      assert_int_equal(nb, (N + c.batch - 1) / c.batch);
      for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);
      /* Non-persistent workers are joined at the end of the epoch. */
      assert_int_equal(threads_settle(base + (pers ? c.workers : 0)), base + (pers ? c.workers : 0));
      /* Destroy mid-epoch with a batch still held. */
      assert_int_equal(vl_loader_start_epoch(l, 2), VL_OK);
      assert_int_equal(vl_loader_next(l, &b), VL_OK);
      assert_non_null(b);
      vl_loader_destroy(l);
      assert_int_equal(threads_settle(base), base);
      assert_int_equal(atomic_load(&s.scratch_live), 0);
    }
}

/* ============================== host memory ========================================== */

static void test_host_mem_cap(void **state) {
  (void)state;
  synth s;
  syn_init(&s, 64);
  vl_dataset d = syn_dataset(&s);
  vl_loader_cfg c = small_cfg();
  c.workers = 3;
  c.prefetch = 2;
  const size_t bb = vl_loader_batch_bytes(&c);
  assert_int_equal(bb, (size_t)c.batch * (3 * c.crop * c.crop * 4 + 4 + 8));
  vl_loader *l = mk_loader(&c, &s);
  vl_loader_stats st;
  vl_loader_stats_get(l, &st);
  const size_t bound = st.host_bytes_bound;
  /* At least the in-flight batches, the caller's one, and each worker's decode state. */
  assert_true(bound >= (size_t)(3 * 2 + 1) * bb + 3 * (d.scratch_bytes + d.max_image_bytes));
  assert_true(bound <= (size_t)(3 * 2 + 2) * bb + 3 * (d.scratch_bytes + d.max_image_bytes +
                                                       3 * c.crop * c.crop * 4) + 64 * 8 + 4096);
  /* Hold the maximum the caller is expected to (one batch) while the workers run ahead. */
  for (int64_t e = 0; e < 2; e++) {
    assert_int_equal(vl_loader_start_epoch(l, e), VL_OK);
    vl_batch_buf *b;
    while (vl_loader_next(l, &b) == VL_OK && b) {
      sleep_us(300); /* workers fill the window meanwhile */
      vl_loader_release(l, b);
    }
  }
  vl_loader_stats_get(l, &st);
  assert_true(st.host_bytes_peak >= bb);
  assert_true(st.host_bytes_peak <= (size_t)(3 * 2 + 1) * bb);
  assert_true(st.host_bytes_peak <= st.host_bytes_bound);
  vl_loader_destroy(l);

  /* A cap one byte short is refused with both numbers; the bound itself is accepted. */
  c.host_mem_cap = bound - 1;
  vl_err err;
  expect_refused(&c, &s, VL_ERR_OOM, &err);
  char nb[32], nc[32];
  snprintf(nb, sizeof nb, "%zu", bound);
  snprintf(nc, sizeof nc, "%zu", bound - 1);
  assert_non_null(strstr(err.msg, nb));
  assert_non_null(strstr(err.msg, nc));
  c.host_mem_cap = bound;
  epoch_out o;
  epoch_once(&c, &s, 0, &o, &st);
  assert_int_equal(o.n, 64);
  assert_true(st.host_bytes_peak <= st.host_bytes_bound);
  out_free(&o);

  /* The blow-up to reproduce: the bound grows as workers x prefetch x batch bytes. */
  vl_loader_cfg big = c;
  big.host_mem_cap = 0;
  big.crop = 224;
  big.batch = 64;
  big.workers = 16;
  big.prefetch = 5;
  l = mk_loader(&big, &s);
  vl_loader_stats_get(l, &st);
  assert_true(st.host_bytes_bound >= (size_t)80 * vl_loader_batch_bytes(&big));
  vl_loader_destroy(l);
}

/* The caller holding every buffer gets an error instead of a deadlock; releasing one
 * lets the epoch continue. Buffers are reused, not allocated per batch. */
static void test_buffer_reuse_and_holding(void **state) {
  (void)state;
  const int64_t N = 40;
  const int workers[] = {0, 2};
  for (int wi = 0; wi < 2; wi++) {
    synth s;
    syn_init(&s, N);
    vl_loader_cfg c = small_cfg();
    c.workers = workers[wi];
    c.prefetch = 1;
    vl_loader *l = mk_loader(&c, &s);
    const int cap = (c.workers ? c.workers * c.prefetch : 1) + 1;
    assert_int_equal(vl_loader_start_epoch(l, 0), VL_OK);
    vl_batch_buf *held[8];
    for (int i = 0; i < cap; i++) {
      assert_int_equal(vl_loader_next(l, &held[i]), VL_OK);
      assert_non_null(held[i]);
    }
    vl_batch_buf *b = (vl_batch_buf *)1;
    assert_int_equal(vl_loader_next(l, &b), VL_ERR_INVALID);
    assert_null(b);
    vl_loader_stats st;
    vl_loader_stats_get(l, &st);
    assert_non_null(strstr(st.last_error, "release"));
    int64_t got = 0;
    for (int i = 0; i < cap; i++) {
      got += held[i]->n;
      vl_loader_release(l, held[i]);
    }
    while (vl_loader_next(l, &b) == VL_OK && b) {
      got += b->n;
      vl_loader_release(l, b);
    }
    assert_int_equal(got, N);
    /* Five more epochs allocate nothing new. */
    vl_loader_stats_get(l, &st);
    size_t peak = st.host_bytes_peak;
    assert_true(peak <= (size_t)cap * vl_loader_batch_bytes(&c));
    for (int64_t e = 1; e <= 5; e++) {
      epoch_out o;
      assert_int_equal(run_epoch(l, &c, e, &o), VL_OK);
      out_free(&o);
    }
    vl_loader_stats_get(l, &st);
    assert_int_equal(st.host_bytes_peak, peak);
    assert_int_equal(st.batches, 6 * (N / c.batch));
    assert_true(st.first_batch_seconds > 0);
    vl_loader_destroy(l);
  }
}

/* ============================== transform ============================================ */

static vl_image mk_img(int w, int h, uint8_t (*f)(int y, int x, int c)) {
  vl_image im = {0};
  im.w = w, im.h = h, im.c = 3;
  im.cap = (size_t)w * h * 3;
  im.pix = malloc(im.cap);
  assert_non_null(im.pix);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < 3; c++) im.pix[((size_t)y * w + x) * 3 + c] = f(y, x, c);
  return im;
}
static uint8_t px_const(int y, int x, int c) { return (uint8_t)(200 - 30 * c); }
static uint8_t px_xgrad(int y, int x, int c) { return (uint8_t)(x * 4 + c); }
static uint8_t px_ygrad(int y, int x, int c) { return (uint8_t)(y * 6); }
static uint8_t px_mixed(int y, int x, int c) { return (uint8_t)(x * 13 + y * 7 + c * 40 + (x * y) % 17); }

static void test_transform_properties(void **state) {
  (void)state;
  vl_loader_cfg c = small_cfg();
  c.crop = 16;
  const int64_t F = 3 * 16 * 16;
  float *out = malloc((size_t)(F + 8) * sizeof(float));
  float *out2 = malloc((size_t)F * sizeof(float));
  assert_non_null(out);
  assert_non_null(out2);

  /* Shape: exactly 3*crop*crop values written, all within the normalised pixel range. */
  vl_image im = mk_img(37, 29, px_mixed);
  for (int i = 0; i < F + 8; i++) out[i] = -12345.0f;
  xform(&c, &im, 1, out);
  for (int i = F; i < F + 8; i++) assert_true(out[i] == -12345.0f);
  for (int ch = 0; ch < 3; ch++)
    for (int i = 0; i < 256; i++) {
      float v = out[ch * 256 + i];
      float lo = (0 - c.mean[ch]) / c.std[ch], hi = (1 - c.mean[ch]) / c.std[ch];
      assert_true(v >= lo - 1e-5f && v <= hi + 1e-5f);
    }
  /* Determinism per seed; another seed gives another crop. */
  xform(&c, &im, 1, out2);
  assert_memory_equal(out, out2, (size_t)F * sizeof(float));
  xform(&c, &im, 2, out2);
  assert_true(memcmp(out, out2, (size_t)F * sizeof(float)) != 0);
  free(im.pix);

  /* A constant image normalises to (v/255 - mean)/std in every pixel, whatever the crop. */
  im = mk_img(31, 23, px_const);
  for (uint64_t seed = 0; seed < 8; seed++) {
    xform(&c, &im, seed, out);
    for (int ch = 0; ch < 3; ch++) {
      float want = ((float)(200 - 30 * ch) / 255.0f - c.mean[ch]) / c.std[ch];
      for (int i = 0; i < 256; i++) assert_float_equal(out[ch * 256 + i], want, 1e-5);
    }
  }
  free(im.pix);

  /* Flip: with the crop pinned to the whole image, a horizontal gradient comes out either
   * as is or exactly mirrored, each about half the time. */
  vl_loader_cfg cf = c;
  cf.scale_min = cf.scale_max = 1.0f;
  cf.ratio_min = cf.ratio_max = 32.0f / 24.0f;
  im = mk_img(32, 24, px_xgrad);
  int flips = 0;
  for (uint64_t seed = 0; seed < 64; seed++) {
    xform(&cf, &im, seed, out);
    bool increasing = out[1] > out[0];
    if (!increasing) flips++;
    for (int ch = 0; ch < 3; ch++)
      for (int y = 0; y < 16; y++)
        for (int x = 0; x + 1 < 16; x++) {
          float a = out[ch * 256 + y * 16 + x], b = out[ch * 256 + y * 16 + x + 1];
          assert_true(increasing ? b > a : b < a);
        }
    /* The same seed again gives the same flip. */
    xform(&cf, &im, seed, out2);
    assert_memory_equal(out, out2, (size_t)F * sizeof(float));
  }
  assert_true(flips >= 16 && flips <= 48);
  /* A flipped output is the exact mirror of an unflipped one. */
  float *nf = NULL, *fl = NULL;
  float *keep = malloc((size_t)F * sizeof(float));
  assert_non_null(keep);
  for (uint64_t seed = 0; seed < 64 && !(nf && fl); seed++) {
    xform(&cf, &im, seed, out);
    bool increasing = out[1] > out[0];
    if (increasing && !nf) memcpy(nf = keep, out, (size_t)F * sizeof(float));
    if (!increasing && !fl) memcpy(fl = out2, out, (size_t)F * sizeof(float));
  }
  assert_non_null(nf);
  assert_non_null(fl);
  for (int ch = 0; ch < 3; ch++)
    for (int y = 0; y < 16; y++)
      for (int x = 0; x < 16; x++)
        assert_true(nf[ch * 256 + y * 16 + x] == fl[ch * 256 + y * 16 + (15 - x)]);
  free(keep);
  free(im.pix);

  /* Center-crop fallback: no crop of area 1 has ratio 2..3 in a square image, so the 10
   * draws fail and the crop is the centred 40x20 band (rows 10..29), resized 1:1 in y. */
  vl_loader_cfg cc = c;
  cc.crop = 20;
  cc.scale_min = cc.scale_max = 1.0f;
  cc.ratio_min = 2.0f, cc.ratio_max = 3.0f;
  im = mk_img(40, 40, px_ygrad);
  float *o3 = malloc((size_t)3 * 20 * 20 * sizeof(float));
  assert_non_null(o3);
  for (uint64_t seed = 0; seed < 4; seed++) {
    xform(&cc, &im, seed, o3);
    for (int ch = 0; ch < 3; ch++)
      for (int y = 0; y < 20; y++) {
        float want = ((float)((10 + y) * 6) / 255.0f - cc.mean[ch]) / cc.std[ch];
        for (int x = 0; x < 20; x++) assert_float_equal(o3[ch * 400 + y * 20 + x], want, 1e-5);
      }
  }
  free(o3);
  free(im.pix);

  /* Random crops stay inside the image: a 1-pixel image (a degenerate case) works. */
  im = mk_img(1, 1, px_const);
  xform(&c, &im, 3, out);
  assert_float_equal(out[0], (200.0f / 255.0f - c.mean[0]) / c.std[0], 1e-5);
  free(im.pix);
  free(out);
  free(out2);
}

/* ============================== staging allocator ==================================== */

/* Batch images come from the x_alloc hook (pinned staging on CUDA) and go back through
 * x_free; the CPU backend's host_alloc/upload_async are the plain versions. */
typedef struct { int allocs, frees; } hook_count;
static void *hook_alloc(void *user, size_t n) {
  ((hook_count *)user)->allocs++;
  return malloc(n);
}
static void hook_free(void *user, void *p) {
  ((hook_count *)user)->frees++;
  free(p);
}

static void test_staging_allocator(void **state) {
  (void)state;
  synth s;
  syn_init(&s, 40);
  vl_loader_cfg c = small_cfg();
  c.workers = 2;
  c.prefetch = 2;
  hook_count hc = {0, 0};
  c.x_alloc = hook_alloc;
  vl_dataset d = syn_dataset(&s);
  vl_loader *l = NULL;
  vl_err err;
  assert_int_equal(vl_loader_create(&l, &c, &d, &err), VL_ERR_INVALID); /* no x_free */
  assert_non_null(strstr(err.msg, "x_free"));
  c.x_free = hook_free;
  c.x_user = &hc;
  l = mk_loader(&c, &s);
  int64_t got = 0;
  for (int e = 0; e < 2; e++) {
    assert_int_equal(vl_loader_start_epoch(l, e), VL_OK);
    vl_batch_buf *b;
    for (;;) {
      assert_int_equal(vl_loader_next(l, &b), VL_OK);
      if (!b) break;
      got += b->n;
      vl_loader_release(l, b);
    }
  }
  assert_int_equal(got, 2 * 40);
  assert_true(hc.allocs > 0);
  vl_loader_destroy(l);
  assert_int_equal(hc.frees, hc.allocs);
  /* the CPU backend: host_alloc is malloc, upload_async a copy */
  vl_ctx *cx;
  assert_int_equal(vl_ctx_create(&cx, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  float *h = cx->be->host_alloc(cx, 64 * sizeof(float), true);
  assert_non_null(h);
  for (int i = 0; i < 64; i++) h[i] = (float)i * 0.5f;
  vl_tensor t;
  assert_int_equal(vl_tensor_alloc2(cx, &t, VL_F32, VL_MEM_DATA, 8, 8), VL_OK);
  assert_int_equal(cx->be->upload_async(cx, &t, 0, h, 64 * sizeof(float)), VL_OK);
  assert_int_equal(cx->be->sync(cx), VL_OK);
  assert_memory_equal(t.data, h, 64 * sizeof(float));
  cx->be->host_free(cx, h, true);
  vl_ctx_destroy(cx);
}

/* ============================== segmentation (masks) ================================= */

/* De-normalised channel value of an output pixel (the inverse of (v/255 - mean)/std). */
static float denorm(const vl_loader_cfg *c, float v, int ch) { return (v * c->std[ch] + c->mean[ch]) * 255.0f; }

/* PyTorch's nearest index computed exactly, for the hand references: floor(o * in / out). */
static int near_exact(int o, int in, int out) { return (int)((int64_t)o * in / out); }

/* The flip vl_transform_seg takes for a sample: its rng's first uniform draw. */
static bool seg_flip(uint64_t seed) {
  vl_rng r;
  vl_rng_seed(&r, seed);
  return vl_rng_uniform(&r) < 0.5;
}

static vl_image mk_seg_img(int w, int h, uint8_t (*f)(int y, int x, int c), uint8_t (*m)(int y, int x)) {
  vl_image im = mk_img(w, h, f);
  im.mask_cap = (size_t)w * h;
  im.mask = malloc(im.mask_cap);
  assert_non_null(im.mask);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) im.mask[(size_t)y * w + x] = m(y, x);
  return im;
}
static uint8_t mask_ids(int y, int x) { return (uint8_t)(y * 16 + x); } /* distinct ids up to 16 wide */

/* vl_transform_seg by hand: the mask resized by nearest neighbour (against floor(o*in/out)
 * and PyTorch's float rounding where they differ), the image as vl_transform's whole-image
 * crop, an exact copy at the same size, one flip draw for both. */
static void test_seg_transform(void **state) {
  (void)state;
  vl_loader_cfg c = small_cfg();
  float *x = malloc((size_t)3 * 82 * 82 * sizeof(float)), *ref = malloc((size_t)3 * 82 * 82 * sizeof(float));
  int32_t *y = malloc((size_t)82 * 82 * sizeof(int32_t));
  assert_non_null(x);
  assert_non_null(ref);
  assert_non_null(y);

  /* Nearest resize of a 7x5 mask of distinct ids: down, up, non-integer, non-square, 2x. */
  vl_image im = mk_seg_img(7, 5, px_mixed, mask_ids);
  const int crops[] = {3, 4, 5, 7, 11, 14};
  int flips = 0, total = 0;
  for (int k = 0; k < 6; k++) {
    c.crop = crops[k];
    for (uint64_t seed = 0; seed < 6; seed++) {
      xform_seg(&c, &im, seed, x, y);
      bool flip = seg_flip(seed);
      flips += flip, total++;
      for (int yy = 0; yy < c.crop; yy++)
        for (int xx = 0; xx < c.crop; xx++) {
          int sx = near_exact(flip ? c.crop - 1 - xx : xx, 7, c.crop), sy = near_exact(yy, 5, c.crop);
          assert_int_equal(y[yy * c.crop + xx], mask_ids(sy, sx));
        }
    }
  }
  assert_true(flips > 0 && flips < total);
  tu_image_free(&im);

  /* PyTorch computes the scale in float: 2 -> 82, output 41 reads input 0 (exactly 1.0
   * would read input 1). F.interpolate(mode='nearest') gives 0 there too. */
  im = mk_seg_img(2, 2, px_mixed, mask_ids);
  c.crop = 82;
  for (uint64_t seed = 0; seed < 4; seed++) {
    xform_seg(&c, &im, seed, x, y);
    int xx = seg_flip(seed) ? 81 - 41 : 41;
    assert_int_equal(y[xx], mask_ids(0, 0));
    assert_int_equal(y[seg_flip(seed) ? 81 - 42 : 42], mask_ids(0, 1));
  }
  tu_image_free(&im);

  /* The image: vl_transform with the crop pinned to the whole (square) image, or its
   * mirror, and mirrored exactly when the mask is. */
  im = mk_seg_img(20, 20, px_mixed, mask_ids);
  vl_loader_cfg cw = small_cfg();
  cw.crop = 12;
  cw.scale_min = cw.scale_max = 1.0f;
  cw.ratio_min = cw.ratio_max = 1.0f;
  const int64_t F = 3 * 12 * 12;
  float *plain = NULL, *mirror = malloc((size_t)F * sizeof(float)), *keep = malloc((size_t)F * sizeof(float));
  assert_non_null(mirror);
  assert_non_null(keep);
  for (uint64_t seed = 0; seed < 64 && !plain; seed++) { /* an unflipped vl_transform */
    xform(&cw, &im, seed, keep);
    if (keep[1] != keep[0] && keep[1] > keep[0]) plain = keep; /* px_mixed grows with x */
  }
  assert_non_null(plain);
  for (int ch = 0; ch < 3; ch++)
    for (int yy = 0; yy < 12; yy++)
      for (int xx = 0; xx < 12; xx++) mirror[ch * 144 + yy * 12 + xx] = plain[ch * 144 + yy * 12 + 11 - xx];
  for (uint64_t seed = 0; seed < 16; seed++) {
    xform_seg(&cw, &im, seed, x, y);
    bool flip = seg_flip(seed);
    assert_memory_equal(x, flip ? mirror : plain, (size_t)F * sizeof(float));
    int32_t y0 = y[0];
    assert_int_equal(y0, mask_ids(0, flip ? near_exact(11, 20, 12) : 0));
  }
  tu_image_free(&im);

  /* Same size: an exact copy of pixels and mask (or their mirror). */
  im = mk_seg_img(9, 9, px_mixed, mask_ids);
  c.crop = 9;
  for (uint64_t seed = 0; seed < 8; seed++) {
    xform_seg(&c, &im, seed, x, y);
    bool flip = seg_flip(seed);
    for (int yy = 0; yy < 9; yy++)
      for (int xx = 0; xx < 9; xx++) {
        int sx = flip ? 8 - xx : xx;
        assert_int_equal(y[yy * 9 + xx], mask_ids(yy, sx));
        for (int ch = 0; ch < 3; ch++)
          assert_float_equal(denorm(&c, x[ch * 81 + yy * 9 + xx], ch), px_mixed(yy, sx, ch), 1e-3);
      }
  }
  tu_image_free(&im);
  free(mirror);
  free(keep);
  free(x);
  free(ref);
  free(y);
}

/* Through the loader, image and mask stay aligned under the flip: every pixel's class (told
 * back from its de-normalised colour) equals y there, and y is the hand-made nearest
 * downscale of the sample's mask, flipped exactly when the sample's draw says so. */
static void test_seg_loader_aligned(void **state) {
  (void)state;
  const int64_t N = 29;
  synth s;
  syn_init(&s, N);
  s.masks = true;
  s.seg_size = 32;
  for (int m = 0; m < 2; m++) {
    vl_loader_cfg c = small_cfg();
    c.masks = true;
    c.crop = 16; /* 32 -> 16: bilinear taps 2x, 2x+1 never straddle a 4x4 block */
    c.workers = 2;
    c.batched_collate = m;
    const int64_t F = 3 * 16 * 16, P = 16 * 16;
    epoch_out o;
    epoch_once(&c, &s, 3, &o, NULL);
    assert_int_equal(o.n, N);
    int flips = 0;
    for (int64_t k = 0; k < o.n; k++) {
      const int64_t i = o.idx[k];
      const float *x = o.x + k * F;
      const int32_t *y = o.y + k * P;
      const bool flip = seg_flip(vl_loader_sample_seed(c.seed, 3, i));
      flips += flip;
      for (int yy = 0; yy < 16; yy++)
        for (int xx = 0; xx < 16; xx++) {
          int32_t id = y[yy * 16 + xx];
          assert_true(id >= 0 && id < SEG_CLASSES);
          int sx = near_exact(flip ? 15 - xx : xx, 32, 16), sy = near_exact(yy, 32, 16);
          assert_int_equal(id, seg_mask(i, sy, sx));
          for (int ch = 0; ch < 3; ch++)
            assert_float_equal(denorm(&c, x[ch * P + yy * 16 + xx], ch), seg_col(id, ch), 1e-3);
        }
    }
    assert_true(flips > 0 && flips < N); /* both ways happen */
    out_free(&o);
  }
}

/* Batches (x, y, order) are bit-identical for every worker count, prefetch depth and
 * collate mode, and equal vl_transform_seg of each sample with its documented seed. */
static void test_seg_deterministic(void **state) {
  (void)state;
  const int64_t N = 37;
  synth s;
  syn_init(&s, N);
  s.masks = true; /* sizes vary with i (9..37 x 7..29), crop 12: up- and downscales */
  vl_loader_cfg c = small_cfg();
  c.masks = true;
  c.crop = 12;
  const int64_t F = 3 * 12 * 12, P = 12 * 12;
  epoch_out ref;
  epoch_once(&c, &s, 7, &ref, NULL);
  vl_image img = {0};
  float *x = malloc((size_t)F * sizeof(float));
  int32_t *y = malloc((size_t)P * sizeof(int32_t));
  assert_non_null(x);
  assert_non_null(y);
  for (int64_t k = 0; k < ref.n; k++) {
    assert_true(seg_fill(&s, ref.idx[k], &img));
    xform_seg(&c, &img, vl_loader_sample_seed(c.seed, 7, ref.idx[k]), x, y);
    assert_memory_equal(x, ref.x + k * F, (size_t)F * sizeof(float));
    assert_memory_equal(y, ref.y + k * P, (size_t)P * sizeof(int32_t));
  }
  free(x);
  free(y);
  tu_image_free(&img);
  s.delay_us = 200;
  for (int w = 1; w <= 3; w++)
    for (int m = 0; m < 2; m++) {
      vl_loader_cfg c2 = c;
      c2.workers = w;
      c2.prefetch = 1 + (w + m) % 2;
      c2.persistent = m;
      c2.batched_collate = m;
      assert_epoch_is(&ref, &c2, &s, 7, F, NULL);
    }
  out_free(&ref);
}

/* SKIP with masks: refilled batches carry each sample's mask along with its image. */
static void test_seg_skip(void **state) {
  (void)state;
  const int64_t N = 41;
  const int64_t bad[] = {2, 9, 10, 33};
  synth clean, s;
  syn_init(&clean, N);
  clean.masks = true;
  s = clean;
  s.nbad = 4;
  memcpy(s.bad, bad, sizeof bad);
  vl_loader_cfg c = small_cfg();
  c.masks = true;
  c.crop = 10;
  c.on_corrupt = VL_CORRUPT_SKIP;
  const int64_t F = 3 * 10 * 10;
  epoch_out all;
  epoch_once(&c, &clean, 2, &all, NULL);
  for (int w = 0; w <= 3; w += 3)
    for (int m = 0; m < 2; m++) {
      vl_loader_cfg c2 = c;
      c2.workers = w;
      c2.batched_collate = m;
      epoch_out o;
      vl_loader_stats st;
      epoch_once(&c2, &s, 2, &o, &st);
      assert_int_equal(o.n, N - 4);
      assert_int_equal(o.skipped_sum, 4);
      for (int64_t b = 0; b + 1 < o.nb; b++) assert_int_equal(o.bsz[b], c.batch);
      assert_all_but_bad(&o, &all, bad, 4, F);
      assert_true(st.host_bytes_peak <= st.host_bytes_bound);
      out_free(&o);
    }
  out_free(&all);
}

/* masks = true with a sample that has no mask: VL_ERR_INVALID naming the sample, under
 * either policy (a wrong dataset is not a corrupt file), for a dataset without masks at
 * all and for one that leaves one sample's mask out. */
static void test_seg_missing_mask(void **state) {
  (void)state;
  const int64_t N = 30;
  for (int pol = 0; pol < 2; pol++)
    for (int w = 0; w <= 2; w += 2) {
      synth plain;
      syn_init(&plain, N); /* no masks */
      vl_loader_cfg c = small_cfg();
      c.masks = true;
      c.shuffle = false;
      c.workers = w;
      c.on_corrupt = pol ? VL_CORRUPT_SKIP : VL_CORRUPT_ERROR;
      vl_loader *l = mk_loader(&c, &plain);
      epoch_out o;
      assert_int_equal(run_epoch(l, &c, 0, &o), VL_ERR_INVALID);
      assert_int_equal(o.n, 0);
      vl_loader_stats st;
      vl_loader_stats_get(l, &st);
      assert_non_null(strstr(st.last_error, "sample 0"));
      assert_non_null(strstr(st.last_error, "mask"));
      vl_batch_buf *b = (vl_batch_buf *)1;
      assert_int_equal(vl_loader_next(l, &b), VL_ERR_INVALID); /* sticky */
      assert_null(b);
      vl_loader_destroy(l);
      out_free(&o);

      synth s;
      syn_init(&s, N);
      s.masks = true;
      s.no_mask = 17;
      l = mk_loader(&c, &s);
      assert_int_equal(run_epoch(l, &c, 0, &o), VL_ERR_INVALID);
      assert_int_equal(o.n, 15); /* the batches before 17's (batch 5, in order) */
      vl_loader_stats_get(l, &st);
      if (!strstr(st.last_error, "sample 17")) print_error("last_error: %s\n", st.last_error);
      assert_non_null(strstr(st.last_error, "sample 17"));
      assert_int_equal(st.skipped, 0);
      vl_loader_destroy(l);
      out_free(&o);
      assert_int_equal(atomic_load(&s.scratch_live), 0);
    }
}

/* The host-memory bound counts masks: y in every batch buffer, and per worker the decoded
 * mask and (per-sample collate) the sample's mask tensor. */
static void test_seg_bound(void **state) {
  (void)state;
  synth s;
  syn_init(&s, 64);
  s.masks = true;
  vl_dataset d = syn_dataset(&s);
  vl_loader_cfg c = small_cfg();
  c.workers = 3;
  c.prefetch = 2;
  const size_t P = (size_t)c.crop * c.crop, bb0 = vl_loader_batch_bytes(&c);
  c.masks = true;
  const size_t bb = vl_loader_batch_bytes(&c);
  assert_int_equal(bb, bb0 + (size_t)c.batch * P * sizeof(int32_t));
  assert_int_equal(bb, (size_t)c.batch * (3 * P * 4 + P * 4 + 4 + 8));
  for (int m = 0; m < 2; m++) {
    vl_loader_cfg cm = c;
    cm.batched_collate = m;
    vl_loader_cfg cn = cm;
    cn.masks = false;
    vl_loader *l = mk_loader(&cn, &s);
    vl_loader_stats st;
    vl_loader_stats_get(l, &st);
    const size_t without = st.host_bytes_bound;
    vl_loader_destroy(l);
    l = mk_loader(&cm, &s);
    vl_loader_stats_get(l, &st);
    const size_t S = 3 * 2 + 1; /* in flight + the caller's */
    const size_t want = without + S * (size_t)c.batch * P * sizeof(int32_t) +
                        3 * (d.max_image_bytes / 3 + (m ? 0 : P * sizeof(int32_t)));
    assert_int_equal(st.host_bytes_bound, want);
    const size_t bound = st.host_bytes_bound;
    epoch_out o;
    assert_int_equal(run_epoch(l, &cm, 0, &o), VL_OK);
    out_free(&o);
    vl_loader_stats_get(l, &st);
    assert_true(st.host_bytes_peak <= st.host_bytes_bound);
    vl_loader_destroy(l);
    /* A cap one byte short of the bound with masks is refused. */
    cm.host_mem_cap = bound - 1;
    vl_err err;
    expect_refused(&cm, &s, VL_ERR_OOM, &err);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_validation),
      cmocka_unit_test(test_max_file_bytes),
      cmocka_unit_test(test_every_sample_once),
      cmocka_unit_test(test_shards),
      cmocka_unit_test(test_deterministic_across_workers),
      cmocka_unit_test(test_epochs_shuffle),
      cmocka_unit_test(test_collate_bit_identical),
      cmocka_unit_test(test_corrupt_skip),
      cmocka_unit_test(test_corrupt_skip_drop_last),
      cmocka_unit_test(test_corrupt_error),
      cmocka_unit_test(test_stop_mid_epoch),
      cmocka_unit_test(test_host_mem_cap),
      cmocka_unit_test(test_buffer_reuse_and_holding),
      cmocka_unit_test(test_transform_properties),
      cmocka_unit_test(test_staging_allocator),
      cmocka_unit_test(test_seg_transform),
      cmocka_unit_test(test_seg_loader_aligned),
      cmocka_unit_test(test_seg_deterministic),
      cmocka_unit_test(test_seg_skip),
      cmocka_unit_test(test_seg_missing_mask),
      cmocka_unit_test(test_seg_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
