/* dataloader: input pipeline tuning (docs/cases.md §4). Synthetic photo-like JPEGs decoded with
 * TurboJPEG feed the engine's loader; the consumer is a modeled accelerator (each step takes
 * consumer_ms of wall time and no CPU), always labelled as modeled. Knobs map to a loader
 * config in config.c, the timed run is run.c, the case-wide sweep sweep.c; this file holds
 * the plan, the check and the case itself. */
#include "dl.h"

/* ---- plan: the pipeline's host memory without running it --------------------------------- */
static vl_status dl_plan(vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out) {
  vl_dl_cfg d;
  VL_TRY(vl_dl_parse(env, scale, k, &d));
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
  return VL_OK;
}

/* Every knob of a rung and the setting, the sweep lists included, without running. */
static vl_status dl_check(vl_case_env *env, const vl_knobs *k) {
  vl_dl_cfg d;
  return vl_dl_parse(env, env->scale, k, &d);
}

/* What plan, run and extra write (top level of a rung's plan or run, or case_metrics). */
static const char *const metrics[] = {
    "batch", "workers", "prefetch", "batch_bytes", "host_bytes_bound", "consumer_ms", "epoch_s", "images_per_s",
    "data_wait_frac", "accel_util", "wait_s_per_batch", "load_s_per_batch", "transform_s_per_batch", "cpu_util",
    "first_batch_s", "skipped", "host_bytes_peak", "pin_applies", "h2d_s_per_batch",
    "decode_images_per_s_per_core", "decode_ceiling_images_per_s", "cores", "best_images_per_s", "best_workers",
    "best_prefetch", "best_workers_share", "images_per_s_at_cores", "share_of_decode_ceiling", "torch_images_per_s",
    "speedup_vs_torch", "torch_decode_jpeg_images_per_s", "speedup_vs_torch_decode_jpeg", NULL};

static const char *const scales[] = {"tiny", "small", "full", NULL};

const vl_case vl_case_dataloader = {
    .id = "dataloader",
    .summary = "input pipeline tuning: workers, batched collate, pinning, prefetch, persistent workers",
    .knobs = vl_dl_knobs,
    .scales = scales,
    .metrics = metrics,
    .check = dl_check,
    .plan = dl_plan,
    .run = vl_dl_run,
    .extra = vl_dl_extra,
    .method = "Synthetic photo-like JPEGs (~500x375, quality 90) are decoded with TurboJPEG, "
              "random-resized-cropped to 224, flipped, normalised and collated by the engine's "
              "loader. The consumer is a **modeled accelerator**: each training step takes "
              "`consumer_ms` of wall time and no CPU, so the pipeline's effect on a GPU-like "
              "consumer can be studied on a CPU-only machine. Host-to-device copies do not "
              "exist on the CPU backend, so pinning is not measured here.",
    .report = vl_dataloader_report,
};
