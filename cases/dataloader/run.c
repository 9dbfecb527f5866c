/* dataloader's timed run: epochs through the engine's loader over the synthetic JPEG set,
 * each batch handed to the modeled accelerator (consumer_ms of wall time, no CPU) and, on
 * CUDA, uploaded; the last epoch's throughput, waits, CPU use and host memory reported. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "dl.h"
#include "kit/interrupt.h"
#include "vramlab/backend.h"

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

vl_status vl_dl_run_epoch(vl_loader *l, int64_t epoch, double consumer_ms, vl_dl_device *dev, vl_dl_epoch *m) {
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

vl_status vl_dl_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out) {
  vl_dl_cfg d;
  VL_TRY(vl_dl_parse(env, env->scale, k, &d));
  vl_jpegset *js = NULL;
  VL_TRY(vl_dl_open_data(env, &d, &js));
  vl_dataset ds = vl_jpegset_dataset(js);
  /* the set's description as the plan has it (the generator's bound, at least the set's own
   * sizes): the loader's host_bytes_bound is then the planned one, byte for byte */
  vl_jpegset_gen_bound(&ds.scratch_bytes, &ds.max_image_bytes);
  vl_dl_device dev = {0};
  vl_status s = VL_OK;
  if (env->device == VL_DEV_CUDA) {
    s = vl_ctx_create(&dev.c, VL_DEV_CUDA, VL_NO_CAP);
    if (s == VL_OK) {
      int64_t sh[4] = {d.lc.batch, 3, d.lc.crop, d.lc.crop};
      s = vl_tensor_alloc(dev.c, &dev.x, VL_F32, VL_MEM_DATA, 4, sh);
    }
    if (s != VL_OK) {
      vl_case_fail(env, s, "cuda: %s", dev.c ? dev.c->err : vl_status_name(s));
      vl_ctx_destroy(dev.c);
      vl_jpegset_close(js);
      return s;
    }
    if (d.pin) { /* batch images land in pinned staging: no bounce copy, async upload */
      d.lc.x_alloc = vl_case_pinned_alloc;
      d.lc.x_free = vl_case_pinned_free;
      d.lc.x_user = dev.c;
    }
  }
  vl_loader *l = NULL;
  vl_err lerr = {""};
  s = vl_loader_create(&l, &d.lc, &ds, &lerr);
  if (s != VL_OK) {
    vl_case_fail(env, s, "%s", lerr.msg);
    vl_ctx_destroy(dev.c);
    vl_jpegset_close(js);
    return s;
  }
  cJSON *ep = cJSON_CreateArray();
  vl_dl_epoch last = {0};
  for (long e = 0; s == VL_OK && e < d.epochs; e++) {
    vl_dl_epoch m;
    s = vl_dl_run_epoch(l, e + (int64_t)rep * 1000, d.consumer_ms, &dev, &m);
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
  if (s != VL_OK) {
    vl_case_fail(env, s, "%s: %s", vl_status_name(s), st.last_error[0] ? st.last_error : "loader failed");
    cJSON_AddStringToObject(out, "error", env->err.msg);
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
  return s;
}
