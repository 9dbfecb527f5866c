/* seg-ckpt: ResNet-101 U-Net segmentation with activation checkpointing (CASES.md §2).
 * Memory, FLOPs, fit, largest batch and the memory-vs-batch line come from the plan backend
 * at the scale asked (full = the article's 512x512, batch 8); step time, images/s, the
 * data-wait share and held-out accuracy from real training at the run scale, fed by the
 * engine's loader from a synthetic JPEG segmentation set (decoded every epoch, data.c).
 * The scaffolding (plan, search, timed loop, OOM triage, planned-equals-measured,
 * interleaved repetitions) is the engine's (vramlab/run.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "interrupt.h"
#include "seg.h"

static const vl_knob_decl knobs[] = {
    {"compute", "fp32", "compute dtype: fp32, fp16 or bf16 (AMP with fp32 master weights)", VL_KNOB_RUNG},
    {"checkpoint", "false", "activation checkpointing per bottleneck block", VL_KNOB_RUNG},
    {"relu_inplace", "true", "ReLU overwrites its input (no separate output kept)", VL_KNOB_RUNG},
    {"accum", "1", "gradient accumulation micro-batches per step", VL_KNOB_RUNG},
    {"batch", "8", "micro-batch (>= 2, batch norm), or max (the largest under the cap at full scale)",
     VL_KNOB_RUNG},
    {"workers", "0", "loader worker threads, or cores (one per core)", VL_KNOB_RUNG},
    {"prefetch", "2", "batches in flight per worker", VL_KNOB_RUNG},
    {"pinned", "false", "batches in pinned host staging", VL_KNOB_RUNG},
    {"lr", "1e-3", "learning rate (Adam)", VL_KNOB_RUNG},
    {"corrupt", "error", "a damaged file in the data: error (stop) or skip (leave it out, counted)",
     VL_KNOB_RUNG},
    {"max_file_bytes", "64MiB", "larger input files are corrupt samples, refused unread", VL_KNOB_RUNG},
    VL_CASE_CARD_KNOBS,
    {"classes", "5", "segmentation classes, background included (2..255)", VL_KNOB_SETTING},
    {"seed", "1", "seed of weights, data order and the data sets", VL_KNOB_SETTING},
    {"epochs", "3", "training epochs per rung at the run scale", VL_KNOB_SETTING},
    {"train_images", "256", "training split at the run scale (made on first use)", VL_KNOB_SETTING},
    {"eval_images", "64", "held-out split for pixel accuracy and mIoU", VL_KNOB_SETTING},
    {"curve_points", "24", "planned batches for the memory-vs-batch line", VL_KNOB_SETTING},
    {"data_dir", "data/segset", "where the segmentation splits are made and read", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};
static const char *const scales[] = {"tiny", "small", "full", NULL};

typedef vl_seg_rung rung_cfg;

#define FAIL(...) (snprintf(err, errn, __VA_ARGS__), -1)

/* Every knob of a rung and the setting into r; 0, or -1 with a message naming the knob. */
int vl_seg_parse_rung(const vl_case_env *env, const char *scale, const vl_knobs *k, rung_cfg *r,
                      char *err, size_t errn) {
  memset(r, 0, sizeof *r);
  vl_resunet_cfg *mc = &r->model.mc;
  vl_seg_train_cfg *tc = &r->model.tc;
  if (vl_resunet_preset(scale, mc)) return FAIL("unknown scale '%s' (tiny, small, full)", scale);
  vl_seg_train_cfg_default(tc);
  const vl_knobs *s = env->setting;
  long v;
  if (vl_knob_int(s, "classes", knobs, 2, 255, &v, err, errn)) return -1;
  mc->classes = v;
  if (vl_case_card_parse(env, k, &r->card, err, errn)) return -1;
  if (vl_knob_int(s, "seed", knobs, 0, 1L << 40, &r->seed, err, errn)) return -1;
  if (vl_knob_int(s, "epochs", knobs, 1, 10000, &r->epochs, err, errn)) return -1;
  if (vl_knob_int(s, "train_images", knobs, 8, 1 << 24, &r->train_images, err, errn)) return -1;
  if (vl_knob_int(s, "eval_images", knobs, 1, 1 << 24, &r->eval_images, err, errn)) return -1;
  if (vl_knob_int(s, "curve_points", knobs, 4, 256, &r->curve_points, err, errn)) return -1;
  const char *dd = vl_knob_str(s, "data_dir", knobs);
  if (strlen(dd) >= sizeof r->data_dir)
    return FAIL("data_dir: path too long: %zu characters (limit %zu)", strlen(dd), sizeof r->data_dir - 1);
  snprintf(r->data_dir, sizeof r->data_dir, "%s", dd);
  const char *cs = vl_knob_str(k, "compute", knobs);
  if (vl_dtype_parse(cs, &tc->compute) || tc->compute == VL_NF4)
    return FAIL("compute = '%s': expected fp32, fp16 or bf16", cs);
  int b;
  if (vl_knob_bool(k, "checkpoint", knobs, &b, err, errn)) return -1;
  tc->checkpoint = b;
  if (vl_knob_bool(k, "relu_inplace", knobs, &b, err, errn)) return -1;
  tc->relu_inplace = b;
  if (vl_knob_int(k, "accum", knobs, 1, 4096, &r->accum, err, errn)) return -1;
  const char *w = vl_knob_get(k, "workers");
  if (w && !strcasecmp(w, "cores")) { /* PyTorch's usual advice: one worker per core */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    r->workers = n > 0 ? n : 1;
  } else if (vl_knob_int(k, "workers", knobs, 0, VL_LOADER_WORKERS_MAX, &r->workers, err, errn)) {
    return -1;
  }
  if (vl_knob_int(k, "prefetch", knobs, 1, 64, &r->prefetch, err, errn)) return -1;
  if (vl_knob_bool(k, "pinned", knobs, &r->pinned, err, errn)) return -1;
  /* Damaged files in the data: fail on the first (error, the default) or skip them. */
  const char *cp = vl_knob_str(k, "corrupt", knobs);
  if (vl_corrupt_policy_parse(cp, &r->corrupt)) return FAIL("corrupt = '%s': expected skip or error", cp);
  if (vl_knob_bytes(k, "max_file_bytes", knobs, &r->max_file_bytes, err, errn)) return -1;
  double d;
  if (vl_knob_double(k, "lr", knobs, 1e-12, 10, &d, err, errn)) return -1;
  tc->optim.hp.lr = (float)d;
  const char *bs = vl_knob_str(k, "batch", knobs);
  if (!strcasecmp(bs, "max")) r->batch = 0;
  else if (vl_knob_int(k, "batch", knobs, 2, 1 << 20, &r->batch, err, errn)) return -1;
  return 0;
}

/* A step of accum micro-batches of B images at the model's size. */
static vl_step_spec step_spec(const rung_cfg *r, int64_t B, long accum) {
  vl_step_spec s = {&vl_model_resunet, &r->model, (uint64_t)r->seed, {0}, accum};
  vl_step_spec_set_batch(&s, B);
  return s;
}

/* ---- planning ---------------------------------------------------------------------------- */
/* Largest micro-batch (>= 2: batch norm needs two samples at 1/32 resolution) whose step of
 * one micro-batch fits under the cap; 0 when none does. */
static int64_t max_batch(const rung_cfg *r) {
  vl_step_spec s = step_spec(r, 2, 1);
  return vl_run_max_batch(&s, r->card.cap, 2);
}

/* Memory vs batch: planned peaks, the fitted line base + batch x per_sample, and the batch
 * that line predicts under the cap against the planner's exact answer (mb). */
static int curve_json(const rung_cfg *r, int64_t mb, cJSON *out, char *err, size_t errn) {
  int64_t top = mb > 8 ? mb + mb / 4 + 2 : 16;
  int np = (int)(top < r->curve_points ? top : r->curve_points);
  double *xs = calloc((size_t)np, sizeof *xs), *ys = calloc((size_t)np, sizeof *ys);
  if (!xs || !ys) { free(xs); free(ys); return FAIL("host memory"); }
  cJSON *curve = cJSON_AddArrayToObject(out, "batch_curve");
  int got = 0;
  for (int i = 0; i < np; i++) {
    int64_t b = 2 + (int64_t)((double)i * (double)(top - 2) / (double)(np > 1 ? np - 1 : 1));
    if (got && b <= (int64_t)xs[got - 1]) continue;
    vl_plan_result q;
    vl_step_spec s = step_spec(r, b, 1);
    if (vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &q) != VL_OK) break;
    xs[got] = (double)b;
    ys[got++] = (double)q.mem.peak_total;
    cJSON_AddItemToArray(curve, cJSON_CreateDoubleArray((double[2]){(double)b, (double)q.mem.peak_total}, 2));
  }
  double a = 0, bb = 0, r2 = 0;
  if (got >= 2) vl_case_linfit(xs, ys, got, &a, &bb, &r2);
  free(xs);
  free(ys);
  cJSON_AddNumberToObject(out, "fit_base_bytes", a);
  cJSON_AddNumberToObject(out, "fit_per_sample_bytes", bb);
  cJSON_AddNumberToObject(out, "fit_r2", r2);
  double pred = bb > 0 ? floor(((double)r->card.cap - a) / bb) : 0;
  cJSON_AddNumberToObject(out, "fit_predicted_max_batch", pred);
  cJSON_AddNumberToObject(out, "exact_vs_linear", pred > 0 ? (double)mb / pred : 0);
  return 0;
}

static int seg_plan(const vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out,
                    char *err, size_t errn) {
  rung_cfg r;
  if (vl_seg_parse_rung(env, scale, k, &r, err, errn)) return -1;
  double t0 = vl_now();
  int64_t mb = max_batch(&r);
  double t_search = vl_now() - t0;
  if (r.batch == 0) r.batch = mb > 0 ? mb : 2;
  int64_t B = r.batch;
  vl_plan_result p;
  vl_step_spec spec = step_spec(&r, B, r.accum), one = step_spec(&r, B, 1);
  double t1 = vl_now();
  vl_run_plan(&spec, VL_NO_CAP, VL_DEV_CUDA, false, &p);
  double t_plan = vl_now() - t1;
  if (p.status != VL_OK) return FAIL("planning failed: %s", p.err);
  const vl_mem_stats *ms = &p.mem;
  vl_case_plan_json(out, scale, &p, B, r.accum);
  cJSON_AddNumberToObject(out, "image", (double)r.model.mc.image);
  cJSON *pm = cJSON_AddObjectToObject(out, "params_by_module");
  for (int i = 0; i < p.params.n_modules; i++)
    cJSON_AddNumberToObject(pm, p.params.module_name[i], (double)p.params.module_count[i]);
  /* "model memory": what the weights cost to train (weights, masters, grads, optimizer) */
  double model = (double)(ms->at_peak[VL_MEM_PARAMS] + ms->at_peak[VL_MEM_FROZEN] +
                          ms->at_peak[VL_MEM_GRADS] + ms->at_peak[VL_MEM_OPTIM]);
  cJSON_AddNumberToObject(out, "model_bytes", model);
  cJSON_AddNumberToObject(out, "fragmentation_at_end", ms->fragmentation);
  /* allocator extent beyond the live peak: what fragmentation costs this step */
  cJSON_AddNumberToObject(out, "extent_overhead",
                          ms->peak_total ? (double)ms->reserved / (double)ms->peak_total - 1.0 : 0);
  cJSON_AddNumberToObject(out, "recompute_share", p.flops > 0 ? p.flops_recompute / p.flops : 0);
  vl_case_fit_json(out, &r.card, vl_run_fits(&one, r.card.cap), mb, t_plan, t_search);
  cJSON_AddNumberToObject(out, "max_effective_batch", (double)(mb * r.accum));
  return curve_json(&r, mb, out, err, errn);
}

/* ---- running ----------------------------------------------------------------------------- */
static void seg_after(void *user, long step, bool timed, const vl_step_info *info, double dt, double wait) {
  vl_seg_feed *L = user;
  if (!L->env->quiet && ((step + 1) % 10 == 0 || step + 1 == L->max_steps))
    vl_progress("  step %ld/%ld  loss %.4f  %.3f s (data wait %.3f s)", step + 1, L->max_steps, info->loss, dt, wait);
}

static int seg_run(const vl_case_env *env, const vl_knobs *k, int rep, cJSON *out, char *err,
                   size_t errn) {
  rung_cfg r;
  if (vl_seg_parse_rung(env, env->scale, k, &r, err, errn)) return -1;
  if (env->device == VL_DEV_PLAN) return FAIL("run needs a compute device (cpu or cuda), not plan");
  if (r.batch == 0) { /* "max": the planner's answer at full scale */
    rung_cfg full;
    if (vl_seg_parse_rung(env, "full", k, &full, err, errn)) return -1;
    int64_t mb = max_batch(&full);
    r.batch = mb > 0 ? mb : 2;
    /* at a reduced run scale the full-scale batch may not fit the data set: keep >= 2
     * micro-batches per epoch */
    if (r.batch * r.accum * 2 > r.train_images) r.batch = r.train_images / (2 * r.accum);
    if (r.batch < 2) r.batch = 2;
  }
  if (!strcasecmp(env->scale, "full") && env->device == VL_DEV_CPU)
    return FAIL("a full-scale (512x512 ResNet-101) step is too slow for this CPU: use --scale small or tiny, or --device plan");
  int64_t B = r.batch;
  long per_step = B * r.accum;
  if (per_step > r.train_images) return FAIL("batch %ld x accum %ld exceeds the %ld training images", B, r.accum, r.train_images);
  vl_segset *ts = NULL, *es = NULL;
  if (vl_seg_open_split(&r, false, &ts, err, errn) || vl_seg_open_split(&r, true, &es, err, errn)) {
    vl_segset_close(ts);
    return -1;
  }
  vl_ctx *c = NULL;
  vl_status s = vl_ctx_create(&c, env->device, VL_NO_CAP);
  if (s != VL_OK) {
    vl_segset_close(ts);
    vl_segset_close(es);
    return FAIL("cannot create a %s context: %s", vl_device_name(env->device), vl_status_name(s));
  }
  vl_model *m = NULL;
  s = vl_model_create(c, &vl_model_resunet, &r.model, (uint64_t)r.seed, &m);
  vl_loader_cfg lc;
  vl_seg_loader_cfg(&r, &lc, B, false, c);
  vl_dataset ds = vl_segset_dataset(ts);
  char lerr[512] = "";
  long steps_per_epoch = r.train_images / per_step, HW = r.model.mc.image * r.model.mc.image;
  vl_seg_feed L = {env, &r, NULL, calloc((size_t)r.accum, sizeof(vl_batch_buf *)), calloc((size_t)r.accum, sizeof(vl_batch)),
                malloc((size_t)(per_step * 3 * HW) * sizeof(float)), malloc((size_t)(per_step * HW) * sizeof(int32_t)),
                steps_per_epoch * r.epochs};
  if (s == VL_OK) s = vl_loader_create(&L.l, &lc, &ds, lerr, sizeof lerr);
  double *acc = calloc((size_t)r.epochs, sizeof(double)), *miou = calloc((size_t)r.epochs, sizeof(double));
  if (!L.held || !L.mb || !L.xs || !L.ys || !acc || !miou) s = VL_ERR_OOM;
  vl_loop_result res = {0};
  /* the first step (primitive creation, page faults) is warm-up */
  vl_loop_cfg cfg = {.warmup = 1, .next = vl_seg_next, .after = seg_after, .user = &L, .stop = &vl_interrupted,
                     .profile = env->profile};
  double run_t0 = vl_now();
  for (long e = 0; s == VL_OK && e < r.epochs; e++) {
    s = vl_loader_start_epoch(L.l, e);
    cfg.total = res.steps + steps_per_epoch;
    if (s == VL_OK) s = vl_run_loop(m, &cfg, &res);
    if (s == VL_OK) s = vl_seg_evaluate(m, &r, es, &acc[e], &miou[e], lerr, sizeof lerr);
    if (s == VL_OK && !env->quiet)
      vl_progress("  epoch %ld: held-out pixel accuracy %.4f, mIoU %.4f", e + 1, acc[e], miou[e]);
  }
  double run_wall = vl_now() - run_t0;
  if (s != VL_OK && L.l && !lerr[0]) {
    vl_loader_stats lst;
    vl_loader_stats_get(L.l, &lst);
    if (lst.last_error[0]) snprintf(lerr, sizeof lerr, "%s", lst.last_error);
  }
  int rc = vl_case_triage(env, s, s == VL_ERR_OOM || !lerr[0] ? c->err : lerr, out, err, errn);
  if (rc > 0 && res.timed < 1) {
    rc = FAIL("no timed step: %ld training images give %ld step(s) of %ld x %ld", r.train_images, res.steps, B,
              r.accum);
  } else if (rc > 0) {
    rc = 0;
    vl_mem_stats ms;
    vl_arena_stats(c->arena, &ms);
    vl_stats st;
    vl_case_run_json(out, env, &res, &ms, B, r.accum, &st);
    double images = (double)(res.timed * per_step);
    cJSON_AddNumberToObject(out, "effective_batch", (double)per_step);
    cJSON_AddNumberToObject(out, "workers", (double)r.workers);
    cJSON_AddNumberToObject(out, "step_seconds", st.median);
    cJSON_AddNumberToObject(out, "sec_per_image", res.wall / images);
    cJSON_AddNumberToObject(out, "images_per_s", images / res.wall);
    cJSON_AddNumberToObject(out, "data_wait_share", res.wait / res.wall);
    cJSON_AddNumberToObject(out, "compute_share", 1.0 - res.wait / res.wall);
    cJSON_AddNumberToObject(out, "sec_per_batch_data", res.wait / (double)(res.timed * r.accum));
    cJSON_AddNumberToObject(out, "optimizer_steps", (double)res.steps);
    cJSON_AddNumberToObject(out, "images_seen", (double)(res.steps * per_step));
    cJSON_AddNumberToObject(out, "run_seconds", run_wall);
    cJSON_AddItemToObject(out, "pixel_accuracy_per_epoch", cJSON_CreateDoubleArray(acc, (int)r.epochs));
    cJSON_AddItemToObject(out, "miou_per_epoch", cJSON_CreateDoubleArray(miou, (int)r.epochs));
    cJSON_AddNumberToObject(out, "pixel_accuracy", acc[r.epochs - 1]);
    cJSON_AddNumberToObject(out, "miou", miou[r.epochs - 1]);
    cJSON_AddNumberToObject(out, "skipped_steps", (double)res.skipped);
    cJSON_AddNumberToObject(out, "measured_acts_bytes", (double)ms.peak[VL_MEM_ACTS]);
    cJSON_AddNumberToObject(out, "measured_fragmentation", ms.fragmentation);
    vl_step_spec spec = step_spec(&r, B, r.accum); /* the planner with this device's rules */
    vl_case_plan_check_json(out, env, &spec, ms.peak_total);
  }
  if (L.l) vl_loader_destroy(L.l);
  vl_loop_result_free(&res);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  vl_segset_close(ts);
  vl_segset_close(es);
  free(L.held); free(L.mb); free(L.xs); free(L.ys); free(acc); free(miou);
  return rc;
}

/* Every knob of a rung and the setting, without planning or running. */
static int seg_check(const vl_case_env *env, const vl_knobs *k, char *err, size_t errn) {
  rung_cfg r;
  return vl_seg_parse_rung(env, env->scale, k, &r, err, errn);
}

/* What plan, run and extra write at the top level of a rung's plan or run. */
static const char *const metrics[] = {
    "image", "params_total", "params_trainable", "batch", "accum", "effective_batch", "peak_bytes", "acts_bytes",
    "model_bytes", "weight_bytes", "fragmentation_at_end", "reserved_bytes", "extent_overhead", "flops_per_step",
    "flops_recompute", "recompute_share", "card_bytes", "cap_bytes", "cuda_context_bytes", "fits", "max_batch",
    "max_effective_batch", "max_batch_at_search_limit", "plan_seconds", "max_batch_search_seconds",
    "fit_base_bytes", "fit_per_sample_bytes", "fit_r2", "fit_predicted_max_batch", "exact_vs_linear", "oom",
    "workers", "step_seconds", "sec_per_image", "images_per_s", "data_wait_share", "compute_share",
    "sec_per_batch_data", "model_flops_per_step", "flops_per_s", "optimizer_steps", "images_seen", "run_seconds",
    "pixel_accuracy", "miou", "skipped_steps", "loss_scale_end", "measured_peak_bytes", "measured_acts_bytes",
    "measured_fragmentation", "planned_peak_bytes", "plan_matches_measured", "interleaved_step_seconds", NULL};

const vl_case vl_case_seg_ckpt = {
    .id = "seg-ckpt",
    .summary = "ResNet-101 U-Net segmentation, 512x512 batch 8 on 24 GB: checkpointing -> ReLU in-place off -> accumulation 4 -> AMP -> loader -> largest batch",
    .knobs = knobs,
    .scales = scales,
    .metrics = metrics,
    .check = seg_check,
    .plan = seg_plan,
    .run = seg_run,
    .extra = vl_seg_interleaved,
    .method = "Memory, FLOPs, fit, largest batch and the memory-vs-batch line are **planned at full "
              "scale** (512x512 images, torchvision-exact ResNet-101 encoder, U-Net decoder) by the "
              "plan backend, which runs a training step's exact allocation sequence through the "
              "arena with a CUDA card's workspace rules. Step time, images/s, the data-wait share "
              "and held-out pixel accuracy / mIoU are measured by training each rung for the same "
              "number of epochs (the same images, in the same seeded order) at the run scale, fed "
              "by the engine's loader, which decodes the synthetic JPEG set every epoch.",
    .report = vl_seg_ckpt_report,
};
