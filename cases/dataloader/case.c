/* dataloader: input pipeline tuning (CASES.md §4). Synthetic photo-like JPEGs decoded with
 * TurboJPEG feed the engine's loader; the consumer is a modeled accelerator (each step takes
 * consumer_ms of wall time and no CPU), always labelled as modeled. */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "case.h"
#include "interrupt.h"
#include "proc.h"
#include "report.h"
#include "datasets/jpegset.h"
#include "vramlab/backend.h"
#include "vramlab/data.h"

static const vl_knob_decl knobs[] = {
    {"workers", "0", "loader worker threads (PyTorch num_workers), or cores (one per core)", VL_KNOB_RUNG},
    {"prefetch", "2", "batches in flight per worker (prefetch_factor)", VL_KNOB_RUNG},
    {"pin", "false", "batches in pinned staging (pin_memory; applies on CUDA only)", VL_KNOB_RUNG},
    {"collate", "per_sample", "per_sample (PyTorch's default) or batched (transform into the batch)",
     VL_KNOB_RUNG},
    {"persistent", "false", "keep worker threads across epochs (persistent_workers)", VL_KNOB_RUNG},
    {"corrupt", "error", "a damaged file in the data: error (stop) or skip (leave it out, counted)",
     VL_KNOB_RUNG},
    {"max_file_bytes", "64MiB", "larger input files are corrupt samples, refused unread", VL_KNOB_RUNG},
    {"images", "384", "synthetic JPEGs in the set (at most 48 at tiny scale)", VL_KNOB_SETTING},
    {"data_seed", "7", "seed of the synthetic set", VL_KNOB_SETTING},
    {"data_dir", "data/jpegset", "where the set is made and read (in n<images>-s<seed>/)", VL_KNOB_SETTING},
    {"batch", "32", "samples per batch (at most 8 at tiny scale)", VL_KNOB_SETTING},
    {"crop", "224", "side of the random-resized crop", VL_KNOB_SETTING},
    {"epochs", "2", "epochs per rung and repetition (the last is reported)", VL_KNOB_SETTING},
    {"seed", "1", "seed of the loader's order and transforms", VL_KNOB_SETTING},
    {"consumer_ms", "40", "the modeled accelerator's step per batch (wall time, no CPU)", VL_KNOB_SETTING},
    {"sweep_workers", "0,1,2,4", "worker counts of the workers x prefetch sweep", VL_KNOB_SETTING},
    {"sweep_prefetch", "1,2,4", "prefetch depths of the sweep", VL_KNOB_SETTING},
    {"cores", "auto", "CPU cores the case assumes for workers=cores, the decode ceiling and CPU use "
     "(auto: this machine's)", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};
static const char *const scales[] = {"tiny", "small", "full", NULL};

#define FAIL(...) (snprintf(err, errn, __VA_ARGS__), -1)

typedef struct {
  vl_loader_cfg lc;
  bool pin;
  long images, data_seed, epochs, cores;
  double consumer_ms;
  char data_dir[VL_KNOB_VAL_LEN + 64]; /* the data_dir knob + "/n<images>-s<seed>" */
  long sweep_w[16], sweep_p[16];       /* the workers x prefetch sweep of extra */
  int n_sweep_w, n_sweep_p;
} dl_cfg;

static long n_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

/* Scales shrink the data set and the modeled step so CI runs in seconds. */
static int parse(const vl_case_env *env, const char *scale, const vl_knobs *k, dl_cfg *d,
                 char *err, size_t errn) {
  memset(d, 0, sizeof *d);
  const vl_knobs *s = env->setting;
  vl_loader_cfg_default(&d->lc);
  long v;
  /* pinned by the golden plan test, so a snapshot does not depend on the machine */
  const char *nc = vl_knob_str(s, "cores", knobs);
  if (!strcasecmp(nc, "auto")) d->cores = n_cores();
  else if (vl_knob_int(s, "cores", knobs, 1, 4096, &d->cores, err, errn)) return -1;
  if (vl_knob_int(s, "images", knobs, 1, 10000000, &d->images, err, errn)) return -1;
  if (!strcasecmp(scale, "tiny")) d->images = d->images < 48 ? d->images : 48;
  else if (strcasecmp(scale, "small") && strcasecmp(scale, "full"))
    return FAIL("unknown scale '%s' (tiny, small, full)", scale);
  if (vl_knob_int(s, "data_seed", knobs, 0, 1L << 40, &d->data_seed, err, errn)) return -1;
  if (vl_knob_int(s, "batch", knobs, 1, 65536, &v, err, errn)) return -1;
  d->lc.batch = v;
  if (!strcasecmp(scale, "tiny") && d->lc.batch > 8) d->lc.batch = 8;
  if (vl_knob_int(s, "crop", knobs, 8, 4096, &v, err, errn)) return -1;
  d->lc.crop = (int)v;
  if (vl_knob_int(s, "epochs", knobs, 1, 1000, &d->epochs, err, errn)) return -1;
  if (vl_knob_int(s, "seed", knobs, 0, 1L << 40, &v, err, errn)) return -1;
  d->lc.seed = (uint64_t)v;
  if (vl_knob_double(s, "consumer_ms", knobs, 0, 1e6, &d->consumer_ms, err, errn)) return -1;
  const char *dd = vl_knob_str(s, "data_dir", knobs);
  int dn = snprintf(d->data_dir, sizeof d->data_dir, "%s/n%ld-s%ld", dd, d->images, d->data_seed);
  if (dn < 0 || (size_t)dn >= sizeof d->data_dir)
    return FAIL("data_dir: path too long: %d characters with its n<images>-s<seed> folder (limit %zu)", dn,
                sizeof d->data_dir - 1);
  /* the sweep is run by extra after the whole ladder: parsed here so a bad list is refused
   * before the first rung runs */
  if (vl_knob_int_list(s, "sweep_workers", knobs, 0, VL_LOADER_WORKERS_MAX, d->sweep_w, 16, &d->n_sweep_w, err, errn) ||
      vl_knob_int_list(s, "sweep_prefetch", knobs, 1, 1024, d->sweep_p, 16, &d->n_sweep_p, err, errn))
    return -1;
  const char *w = vl_knob_get(k, "workers");
  if (w && !strcasecmp(w, "cores")) d->lc.workers = (int)d->cores;
  else {
    if (vl_knob_int(k, "workers", knobs, 0, 1024, &v, err, errn)) return -1;
    d->lc.workers = (int)v;
  }
  if (vl_knob_int(k, "prefetch", knobs, 1, 1024, &v, err, errn)) return -1;
  d->lc.prefetch = (int)v;
  int b;
  if (vl_knob_bool(k, "pin", knobs, &b, err, errn)) return -1;
  d->pin = b;
  if (vl_knob_bool(k, "persistent", knobs, &b, err, errn)) return -1;
  d->lc.persistent = b;
  const char *c = vl_knob_str(k, "collate", knobs);
  if (!strcasecmp(c, "per_sample")) d->lc.batched_collate = false;
  else if (!strcasecmp(c, "batched")) d->lc.batched_collate = true;
  else return FAIL("collate = '%s': expected per_sample or batched", c);
  /* A shared data set may hold damaged files: fail on the first (error, the default) or
   * leave them out and count them (skip). */
  const char *cp = vl_knob_str(k, "corrupt", knobs);
  if (vl_corrupt_policy_parse(cp, &d->lc.on_corrupt))
    return FAIL("corrupt = '%s': expected skip or error", cp);
  size_t mfb;
  if (vl_knob_bytes(k, "max_file_bytes", knobs, &mfb, err, errn)) return -1;
  d->lc.max_file_bytes = mfb; /* a larger file is a corrupt sample, refused unread */
  d->lc.drop_last = true;
  return 0;
}

/* Open the data set, making it first when it is not there (seeded, so every run of the
 * same setting reads the same bytes). */
static int open_data(const dl_cfg *d, vl_jpegset **out, char *err, size_t errn) {
  vl_jpegset_gen_cfg g;
  vl_jpegset_gen_cfg_default(&g);
  g.n = d->images;
  g.seed = (uint64_t)d->data_seed;
  g.quality = 90;
  g.progress = vl_case_gen_progress;
  /* Made only in a new or empty folder: a damaged or foreign one is refused, never
   * overwritten. */
  int u = vl_jpegset_first_use(out, d->data_dir, &g, err, errn);
  if (u <= 0) return u;
  vl_progress("generating %ld synthetic JPEGs in %s", d->images, d->data_dir);
  if (vl_jpegset_generate_ex(d->data_dir, &g, err, errn)) return -1;
  return vl_jpegset_open(out, d->data_dir, err, errn);
}

/* ---- plan: the pipeline's host memory without running it --------------------------------- */
static int dl_plan(const vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out,
                   char *err, size_t errn) {
  dl_cfg d;
  if (parse(env, scale, k, &d, err, errn)) return -1;
  size_t bb = vl_loader_batch_bytes(&d.lc);
  cJSON_AddNumberToObject(out, "batch", (double)d.lc.batch);
  cJSON_AddNumberToObject(out, "workers", d.lc.workers);
  cJSON_AddNumberToObject(out, "prefetch", d.lc.prefetch);
  cJSON_AddNumberToObject(out, "batch_bytes", (double)bb);
  /* the loader's own bound (batch buffers in flight: workers x prefetch, the memory blow-up
   * of 003; the one the caller holds; per-worker decode state; the epoch order) for the set
   * these settings make: the number the run's loader reports */
  size_t scratch, image;
  vl_jpegset_gen_bound(&scratch, &image);
  cJSON_AddNumberToObject(out, "host_bytes_bound",
                          (double)vl_loader_host_bytes_bound(&d.lc, d.images, scratch, image));
  return 0;
}

/* ---- run ---------------------------------------------------------------------------------- */
static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
         1e-6 * (double)ru.ru_stime.tv_usec;
}

static void consume(double ms) {
  if (ms <= 0) return;
  struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
  while (nanosleep(&ts, &ts) != 0 && !vl_interrupted) {}
}

/* The device side of a run: batches are uploaded to a VL_MEM_DATA tensor (from pinned
 * staging when pin is on). NULL ctx: CPU backend, where batches never leave host memory. */
typedef struct {
  vl_ctx *c;
  vl_tensor x;
} device_side;

typedef struct {
  double wall, wait, load, transform, cpu, first_batch, h2d;
  int64_t batches, images, skipped;
  double *wait_samples; /* per batch */
  int nwait, cwait;
} epoch_m;

/* One epoch through the loader with the modeled consumer. */
static vl_status run_epoch(vl_loader *l, int64_t epoch, double consumer_ms, device_side *dev,
                           epoch_m *m) {
  memset(m, 0, sizeof *m);
  double c0 = cpu_seconds(), t0 = vl_now();
  vl_status s = vl_loader_start_epoch(l, epoch);
  while (s == VL_OK && !vl_interrupted) {
    double w0 = vl_now();
    vl_batch_buf *b = NULL;
    s = vl_loader_next(l, &b);
    double w = vl_now() - w0;
    if (s != VL_OK || !b) break;
    m->wait += w;
    m->batches++;
    m->images += b->n;
    m->load += b->load_seconds;
    m->transform += b->transform_seconds;
    m->skipped += b->skipped;
    if (dev && dev->c) { /* the host -> device copy, timed on the device */
      double dt = 0;
      size_t n = (size_t)b->n * 3 * (size_t)(dev->x.n / (dev->x.shape[0] * 3));
      s = dev->c->be->timer_start(dev->c);
      if (s == VL_OK) s = dev->c->be->upload_async(dev->c, &dev->x, 0, b->x, n * sizeof(float));
      if (s == VL_OK) s = dev->c->be->timer_stop(dev->c, &dt);
      m->h2d += dt;
    }
    vl_loader_release(l, b);
    if (s != VL_OK) break;
    consume(consumer_ms);
  }
  m->wall = vl_now() - t0;
  m->cpu = cpu_seconds() - c0;
  vl_loader_stats st;
  vl_loader_stats_get(l, &st);
  m->first_batch = st.first_batch_seconds;
  if (vl_interrupted && s == VL_OK) s = VL_ERR_INTERRUPTED;
  return s;
}

static int dl_run(const vl_case_env *env, const vl_knobs *k, int rep, cJSON *out, char *err,
                  size_t errn) {
  dl_cfg d;
  if (parse(env, env->scale, k, &d, err, errn)) return -1;
  vl_jpegset *js = NULL;
  if (open_data(&d, &js, err, errn)) return -1;
  vl_dataset ds = vl_jpegset_dataset(js);
  /* the set's description as the plan has it (the generator's bound, at least the set's own
   * sizes): the loader's host_bytes_bound is then the planned one, byte for byte */
  vl_jpegset_gen_bound(&ds.scratch_bytes, &ds.max_image_bytes);
  device_side dev = {0};
  vl_status s = VL_OK;
  if (env->device == VL_DEV_CUDA) {
    s = vl_ctx_create(&dev.c, VL_DEV_CUDA, VL_NO_CAP);
    if (s == VL_OK) {
      int64_t sh[4] = {d.lc.batch, 3, d.lc.crop, d.lc.crop};
      s = vl_tensor_alloc(dev.c, &dev.x, VL_F32, VL_MEM_DATA, 4, sh);
    }
    if (s != VL_OK) {
      snprintf(err, errn, "cuda: %s", dev.c ? dev.c->err : vl_status_name(s));
      vl_ctx_destroy(dev.c);
      vl_jpegset_close(js);
      return -1;
    }
    if (d.pin) { /* batch images land in pinned staging: no bounce copy, async upload */
      d.lc.x_alloc = vl_case_pinned_alloc;
      d.lc.x_free = vl_case_pinned_free;
      d.lc.x_user = dev.c;
    }
  }
  vl_loader *l = NULL;
  s = vl_loader_create(&l, &d.lc, &ds, err, errn);
  if (s != VL_OK) { vl_ctx_destroy(dev.c); vl_jpegset_close(js); return -1; }
  cJSON *ep = cJSON_CreateArray();
  epoch_m last = {0};
  for (long e = 0; s == VL_OK && e < d.epochs; e++) {
    epoch_m m;
    s = run_epoch(l, e + (int64_t)rep * 1000, d.consumer_ms, &dev, &m);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "epoch_s", m.wall);
    cJSON_AddNumberToObject(o, "wait_s", m.wait);
    cJSON_AddNumberToObject(o, "first_batch_s", m.first_batch);
    cJSON_AddNumberToObject(o, "images", (double)m.images);
    cJSON_AddItemToArray(ep, o);
    last = m;
  }
  vl_loader_stats st;
  vl_loader_stats_get(l, &st);
  int rc = 0;
  if (s != VL_OK) {
    rc = FAIL("%s: %s", vl_status_name(s), st.last_error[0] ? st.last_error : "loader failed");
    cJSON_AddStringToObject(out, "error", err);
    if (s == VL_ERR_INTERRUPTED) cJSON_AddBoolToObject(out, "interrupted", 1);
  } else {
    /* the last epoch is reported: its workers are warm when persistent */
    double nb = last.batches > 0 ? (double)last.batches : 1;
    cJSON_AddStringToObject(out, "device", vl_device_name(env->device));
    cJSON_AddStringToObject(out, "consumer", "modeled accelerator");
    cJSON_AddNumberToObject(out, "consumer_ms", d.consumer_ms);
    cJSON_AddNumberToObject(out, "workers", d.lc.workers);
    cJSON_AddNumberToObject(out, "prefetch", d.lc.prefetch);
    cJSON_AddNumberToObject(out, "batch", (double)d.lc.batch);
    cJSON_AddNumberToObject(out, "epoch_s", last.wall);
    cJSON_AddNumberToObject(out, "images_per_s", (double)last.images / last.wall);
    cJSON_AddNumberToObject(out, "data_wait_frac", last.wait / last.wall);
    cJSON_AddNumberToObject(out, "accel_util", 1.0 - last.wait / last.wall);
    cJSON_AddNumberToObject(out, "wait_s_per_batch", last.wait / nb);
    cJSON_AddNumberToObject(out, "load_s_per_batch", last.load / nb);
    cJSON_AddNumberToObject(out, "transform_s_per_batch", last.transform / nb);
    cJSON_AddNumberToObject(out, "cpu_util", last.cpu / (last.wall * (double)d.cores));
    cJSON_AddNumberToObject(out, "first_batch_s", last.first_batch);
    cJSON_AddNumberToObject(out, "skipped", (double)st.skipped);
    cJSON_AddNumberToObject(out, "host_bytes_bound", (double)st.host_bytes_bound);
    cJSON_AddNumberToObject(out, "host_bytes_peak", (double)st.host_bytes_peak);
    /* CPU backend: batches stay in host memory, so there is no host-to-device copy for
     * pinning to speed up; on CUDA this is where the pinned staging copy would be timed. */
    cJSON_AddBoolToObject(out, "pin_applies", env->device == VL_DEV_CUDA);
    if (dev.c) cJSON_AddNumberToObject(out, "h2d_s_per_batch", last.h2d / nb);
    cJSON_AddItemToObject(out, "epochs", ep);
    ep = NULL;
  }
  cJSON_Delete(ep);
  vl_loader_destroy(l); /* frees the pinned buffers through the context: before it */
  vl_tensor_free(dev.c, &dev.x);
  vl_ctx_destroy(dev.c);
  vl_jpegset_close(js);
  return rc;
}

/* ---- case-wide: decode ceiling, workers x prefetch sweep, PyTorch reference ---------------- */
static double torch_reference(const dl_cfg *d, int workers, char *why, size_t wn) {
  char out[256];
  char *probe[] = {"python3", "-c", "import torch, torchvision, PIL", NULL};
  if (vl_run_capture(probe, out, sizeof out) != 0) {
    snprintf(why, wn, "PyTorch with torchvision and Pillow is not installed (pip install torch torchvision pillow)");
    return NAN;
  }
  /* no shell: the data folder is passed as it is, whatever characters it holds */
  char script[600], w[16], b[24], crop[16];
  snprintf(script, sizeof script, "%s/tools/torch_loader_bench.py", VRAMLAB_SOURCE_DIR);
  snprintf(w, sizeof w, "%d", workers);
  snprintf(b, sizeof b, "%lld", (long long)d->lc.batch);
  snprintf(crop, sizeof crop, "%d", d->lc.crop);
  char *argv[] = {"python3", script, "--dir", (char *)d->data_dir, "--workers", w, "--batch", b,
                  "--crop", crop, "--epochs", "2", NULL};
  double v = NAN;
  char *end;
  if (vl_run_capture(argv, out, sizeof out) == 0) {
    v = strtod(out, &end);
    if (end == out) v = NAN;
  }
  if (isnan(v)) snprintf(why, wn, "tools/torch_loader_bench.py failed");
  return v;
}

static int dl_extra(const vl_case_env *env, cJSON *res, char *err, size_t errn) {
  /* every knob of the last rung (the corrupt-sample policy and file-size limit included),
   * batched collate; the sweep then varies workers and prefetch */
  vl_knobs k = {0};
  const cJSON *last = cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"),
                                         cJSON_GetArraySize(cJSON_GetObjectItem(res, "rungs")) - 1), *it;
  cJSON_ArrayForEach(it, cJSON_GetObjectItem(last, "knobs"))
    if (cJSON_IsString(it) && vl_knob_set_err(&k, it->string, it->valuestring, err, errn)) return -1;
  if (vl_knob_set_err(&k, "collate", "batched", err, errn)) return -1;
  dl_cfg d;
  if (parse(env, env->scale, &k, &d, err, errn)) return -1;
  vl_jpegset *js = NULL;
  if (open_data(&d, &js, err, errn)) return -1;
  cJSON *cm = cJSON_AddObjectToObject(res, "case_metrics");
  vl_progress("decode-only ceiling (one core)");
  double rate = vl_jpegset_decode_rate(js, d.images < 128 ? d.images : 128, err, errn);
  if (!(rate > 0)) { vl_jpegset_close(js); return -1; }
  cJSON_AddNumberToObject(cm, "decode_images_per_s_per_core", rate);
  cJSON_AddNumberToObject(cm, "decode_ceiling_images_per_s", rate * (double)d.cores);
  cJSON_AddNumberToObject(cm, "cores", (double)d.cores);
  /* Interrupted: keep what was measured, write nothing derived from a measurement that did
   * not happen (the report then says which are missing instead of judging zeros). */
  if (vl_interrupted) { vl_jpegset_close(js); return 0; }

  const long *ws = d.sweep_w, *ps = d.sweep_p;
  int nw = d.n_sweep_w, np = d.n_sweep_p;
  cJSON *sweep = cJSON_AddArrayToObject(res, "sweep");
  double best = 0, at_cores = 0;
  long best_w = 0, best_p = 0;
  vl_dataset ds = vl_jpegset_dataset(js);
  for (int i = 0; i < nw && !vl_interrupted; i++)
    for (int j = 0; j < np && !vl_interrupted; j++) {
      if (ws[i] == 0 && j > 0) continue; /* prefetch has no meaning without workers */
      d.lc.workers = (int)ws[i];
      d.lc.prefetch = (int)ps[j];
      d.lc.persistent = true;
      vl_loader *l = NULL;
      if (vl_loader_create(&l, &d.lc, &ds, err, errn) != VL_OK) { vl_jpegset_close(js); return -1; }
      epoch_m m;
      vl_progress("sweep workers=%ld prefetch=%ld", ws[i], ps[j]);
      /* one warm-up epoch, one measured; the consumer takes no time: pipeline throughput */
      vl_status s = run_epoch(l, 0, 0, NULL, &m);
      if (s == VL_OK) s = run_epoch(l, 1, 0, NULL, &m);
      vl_loader_destroy(l);
      if (s == VL_ERR_INTERRUPTED) break;
      if (s != VL_OK) { vl_jpegset_close(js); return FAIL("sweep: %s", vl_status_name(s)); }
      double ips = (double)m.images / m.wall;
      cJSON *o = cJSON_CreateObject();
      cJSON_AddNumberToObject(o, "workers", (double)ws[i]);
      cJSON_AddNumberToObject(o, "prefetch", (double)ps[j]);
      cJSON_AddNumberToObject(o, "images_per_s", ips);
      cJSON_AddNumberToObject(o, "cpu_util", m.cpu / (m.wall * (double)d.cores));
      cJSON_AddItemToArray(sweep, o);
      if (ips > best) best = ips;
      if (ws[i] == d.cores && ips > at_cores) at_cores = ips;
    }
  if (vl_interrupted) { /* a partial sweep has no best setting: the sweep table keeps its rows */
    cJSON_AddStringToObject(cm, "sweep_incomplete", "the run was interrupted during the sweep");
    vl_jpegset_close(js);
    return 0;
  }
  /* the best setting: the fewest workers, then the smallest prefetch, within 2% of the top */
  cJSON *o;
  long min_w = 1L << 30;
  cJSON_ArrayForEach(o, sweep) {
    double ips = vl_rep_num(o, "images_per_s");
    long w = (long)vl_rep_num(o, "workers"), p = (long)vl_rep_num(o, "prefetch");
    if (ips >= 0.98 * best && (w < min_w || (w == min_w && p < best_p))) { min_w = w; best_w = w; best_p = p; }
  }
  cJSON_AddNumberToObject(cm, "best_images_per_s", best);
  cJSON_AddNumberToObject(cm, "best_workers", (double)best_w);
  cJSON_AddNumberToObject(cm, "best_prefetch", (double)best_p);
  cJSON_AddNumberToObject(cm, "best_workers_share", (double)best_w / (double)d.cores);
  cJSON_AddNumberToObject(cm, "images_per_s_at_cores", at_cores);
  cJSON_AddNumberToObject(cm, "share_of_decode_ceiling", at_cores / (rate * (double)d.cores));
  char why[256] = "";
  vl_progress("PyTorch DataLoader reference");
  double t = torch_reference(&d, (int)d.cores, why, sizeof why);
  if (isnan(t)) cJSON_AddStringToObject(cm, "torch_not_measured", why);
  else {
    cJSON_AddNumberToObject(cm, "torch_images_per_s", t);
    cJSON_AddNumberToObject(cm, "speedup_vs_torch", at_cores / t);
  }
  vl_jpegset_close(js);
  return 0;
}

/* Every knob of a rung and the setting, the sweep lists included, without running. */
static int dl_check(const vl_case_env *env, const vl_knobs *k, char *err, size_t errn) {
  dl_cfg d;
  return parse(env, env->scale, k, &d, err, errn);
}

/* What plan, run and extra write (top level of a rung's plan or run, or case_metrics). */
static const char *const metrics[] = {
    "batch", "workers", "prefetch", "batch_bytes", "host_bytes_bound", "consumer_ms", "epoch_s", "images_per_s",
    "data_wait_frac", "accel_util", "wait_s_per_batch", "load_s_per_batch", "transform_s_per_batch", "cpu_util",
    "first_batch_s", "skipped", "host_bytes_peak", "pin_applies", "h2d_s_per_batch",
    "decode_images_per_s_per_core", "decode_ceiling_images_per_s", "cores", "best_images_per_s", "best_workers",
    "best_prefetch", "best_workers_share", "images_per_s_at_cores", "share_of_decode_ceiling", "torch_images_per_s",
    "speedup_vs_torch", NULL};

const vl_case vl_case_dataloader = {
    .id = "dataloader",
    .summary = "input pipeline tuning: workers, batched collate, pinning, prefetch, persistent workers",
    .knobs = knobs,
    .scales = scales,
    .metrics = metrics,
    .check = dl_check,
    .plan = dl_plan,
    .run = dl_run,
    .extra = dl_extra,
    .method = "Synthetic photo-like JPEGs (~500x375, quality 90) are decoded with TurboJPEG, "
              "random-resized-cropped to 224, flipped, normalised and collated by the engine's "
              "loader. The consumer is a **modeled accelerator**: each training step takes "
              "`consumer_ms` of wall time and no CPU, so the pipeline's effect on a GPU-like "
              "consumer can be studied on a CPU-only machine. Host-to-device copies do not "
              "exist on the CPU backend, so pinning is not measured here.",
    .report = vl_dataloader_report,
};
