/* seg-ckpt's timed run: a rung's U-Net trained for the setting's epochs on the synthetic
 * training split through the engine's loader and timed loop, evaluated on the held-out split
 * after every epoch, with OOM triage and the planner's peak beside the measured one.
 * Checkpoints (--save-every, --resume) hold, beside the model's state (batch-norm running
 * statistics included), the epoch in progress, the step it started at and the held-out
 * scores of the epochs done; a resume restarts that epoch's seeded order and skips the
 * batches its steps consumed (vl_segrung_skip), so the data stream is the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kit/interrupt.h"
#include "seg.h"

/* The run's state around the feed: what a checkpoint keeps beside the model. */
typedef struct {
  vl_segrung_feed f;
  vl_ctx *c;
  long steps_per_epoch, epochs_done, epoch_start; /* epoch_start: res.steps when epoch epochs_done began */
  double *acc, *miou;                              /* (epochs) held-out scores of the epochs done */
} seg_run;

static vl_status seg_next(void *user, long step, const vl_batch **mb, int *n, double *wait) {
  return vl_segrung_next(&((seg_run *)user)->f, step, mb, n, wait);
}

static void seg_after(void *user, long step, bool timed, const vl_step_info *info, double dt, double wait) {
  vl_segrung_feed *L = &((seg_run *)user)->f;
  if (!L->env->quiet && ((step + 1) % 10 == 0 || step + 1 == L->max_steps))
    vl_progress("  step %ld/%ld  loss %.4f  %.3f s (data wait %.3f s)", step + 1, L->max_steps, info->loss, dt, wait);
}

/* ---- checkpoint state --------------------------------------------------------------------- */
/* Words of the blob (host byte order): the settings that shape the data stream (a resume
 * with others is refused), the position, then acc and miou of each epoch done (as bits). */
enum { W_VERSION, W_BATCH, W_ACCUM, W_TRAIN, W_IMAGE, W_CLASSES, W_SEED, W_SPE, W_DONE, W_START, W_HEAD };
#define SEG_BLOB_VERSION 1
static const char *const seg_words[W_HEAD] = {"version", "batch",           "accum",       "train_images",
                                              "image",   "classes",         "seed",        "steps_per_epoch",
                                              "epochs_done", "epoch_start"};

static void seg_head(const seg_run *R, uint64_t *w) {
  const vl_segrung *r = R->f.r;
  w[W_VERSION] = SEG_BLOB_VERSION;
  w[W_BATCH] = (uint64_t)r->batch;
  w[W_ACCUM] = (uint64_t)r->accum;
  w[W_TRAIN] = (uint64_t)r->train_images;
  w[W_IMAGE] = (uint64_t)r->model.mc.image;
  w[W_CLASSES] = (uint64_t)r->model.mc.classes;
  w[W_SEED] = (uint64_t)r->seed;
  w[W_SPE] = (uint64_t)R->steps_per_epoch;
  w[W_DONE] = (uint64_t)R->epochs_done;
  w[W_START] = (uint64_t)R->epoch_start;
}

static vl_status seg_save_state(void *user, long step, void **blob, size_t *len) {
  (void)step;
  seg_run *R = user;
  size_t n = W_HEAD + 2 * (size_t)R->epochs_done;
  uint64_t *w = malloc(n * sizeof *w);
  if (!w) return vl_fail(R->c, VL_ERR_OOM, "host memory for the checkpoint's case state");
  seg_head(R, w);
  for (long e = 0; e < R->epochs_done; e++) {
    memcpy(&w[W_HEAD + 2 * e], &R->acc[e], 8);
    memcpy(&w[W_HEAD + 2 * e + 1], &R->miou[e], 8);
  }
  *blob = w;
  *len = n * sizeof *w;
  return VL_OK;
}

/* The blob of the checkpoint at path (resumed at `step`) back into R. */
static vl_status seg_restore(seg_run *R, const void *blob, size_t len, const char *path, long step) {
  uint64_t now[W_HEAD], w[W_HEAD];
  long epochs = R->f.r->epochs;
  if (len < sizeof w || (len - sizeof w) % 16)
    return vl_fail(R->c, VL_ERR_INVALID, "checkpoint %s: section 'case' holds %zu bytes, not seg-ckpt's state", path,
                   len);
  memcpy(w, blob, sizeof w);
  seg_head(R, now);
  for (int i = W_VERSION; i < W_DONE; i++)
    if (w[i] != now[i])
      return vl_fail(R->c, VL_ERR_INVALID, "checkpoint %s: case field '%s' is %llu, this run's %llu", path,
                     seg_words[i], (unsigned long long)w[i], (unsigned long long)now[i]);
  uint64_t done = w[W_DONE], start = w[W_START];
  if ((len - sizeof w) / 16 != done || start > (uint64_t)step || (uint64_t)step - start > (uint64_t)R->steps_per_epoch)
    return vl_fail(R->c, VL_ERR_INVALID, "checkpoint %s: case fields 'epochs_done' %llu and 'epoch_start' %llu do not "
                   "fit step %ld", path, (unsigned long long)done, (unsigned long long)start, step);
  if (done >= (uint64_t)epochs)
    return vl_fail(R->c, VL_ERR_INVALID, "checkpoint %s: %llu epoch(s) done, this run has %ld: nothing left to run",
                   path, (unsigned long long)done, epochs);
  const uint8_t *ev = (const uint8_t *)blob + sizeof w;
  for (uint64_t e = 0; e < done; e++) {
    memcpy(&R->acc[e], ev + 16 * e, 8);
    memcpy(&R->miou[e], ev + 16 * e + 8, 8);
  }
  R->epochs_done = (long)done;
  R->epoch_start = (long)start;
  return VL_OK;
}

/* The settings a checkpoint records and a resume must match (vl_ckpt_meta.settings): every
 * one that changes the loss trajectory or the held-out scores, or names the run in its
 * results. The model: every number of its config (sizes, blocks, decoder widths, classes,
 * batch norm's eps and momentum); training: compute dtype, optimizer, lr, weight decay,
 * clip; the data: batch, accum, train_images, eval_images, seed, corrupt, max_file_bytes;
 * the device (its kernels round differently). Not recorded, as they leave the trajectory
 * alone: epochs (how long the run goes), curve_points, checkpoint and relu_inplace
 * (bit-identical, test_resunet), workers, prefetch and pinned (the loader's order is
 * seeded; its threads only fetch), data_dir (the splits are made from the seed, sizes and
 * counts recorded here), card, cuda_context and cap_fraction (planning), and the harness's
 * reps, --save-every, --keep-last, --out, --quiet, --profile and the thread count. */
static vl_status seg_settings(vl_case_env *env, const vl_segrung *r, char *buf, size_t n) {
  const vl_resunet_cfg *mc = &r->model.mc;
  const vl_resunet_train_cfg *tc = &r->model.tc;
  buf[0] = 0;
  int e = vl_ckpt_setting(buf, n, "image", "%lld", (long long)mc->image);
  e |= vl_ckpt_setting(buf, n, "in_ch", "%lld", (long long)mc->in_ch);
  e |= vl_ckpt_setting(buf, n, "width", "%lld", (long long)mc->width);
  e |= vl_ckpt_setting(buf, n, "blocks", "%d,%d,%d,%d", mc->blocks[0], mc->blocks[1], mc->blocks[2], mc->blocks[3]);
  e |= vl_ckpt_setting(buf, n, "decoder", "%lld,%lld,%lld,%lld,%lld", (long long)mc->dec[0], (long long)mc->dec[1],
                       (long long)mc->dec[2], (long long)mc->dec[3], (long long)mc->dec[4]);
  e |= vl_ckpt_setting(buf, n, "classes", "%lld", (long long)mc->classes);
  e |= vl_ckpt_setting_f32(buf, n, "bn_eps", mc->bn_eps);
  e |= vl_ckpt_setting_f32(buf, n, "bn_momentum", mc->bn_momentum);
  e |= vl_ckpt_setting(buf, n, "compute", "%s", vl_dtype_name(tc->compute));
  e |= vl_ckpt_setting(buf, n, "optimizer", "%s", vl_optimizer_name(tc->optim.opt));
  e |= vl_ckpt_setting_f32(buf, n, "lr", tc->optim.hp.lr);
  e |= vl_ckpt_setting_f32(buf, n, "weight_decay", tc->optim.hp.weight_decay);
  e |= vl_ckpt_setting_f32(buf, n, "clip", tc->clip);
  e |= vl_ckpt_setting(buf, n, "batch", "%ld", r->batch);
  e |= vl_ckpt_setting(buf, n, "accum", "%ld", r->accum);
  e |= vl_ckpt_setting(buf, n, "train_images", "%ld", r->train_images);
  e |= vl_ckpt_setting(buf, n, "eval_images", "%ld", r->eval_images);
  e |= vl_ckpt_setting(buf, n, "seed", "%ld", r->seed);
  e |= vl_ckpt_setting(buf, n, "corrupt", "%s", vl_corrupt_policy_name(r->corrupt));
  e |= vl_ckpt_setting(buf, n, "max_file_bytes", "%zu", r->max_file_bytes);
  e |= vl_ckpt_setting(buf, n, "device", "%s", vl_device_name(env->device));
  if (e) return vl_case_fail(env, VL_ERR_INVALID, "the run's settings do not fit a checkpoint's %zu bytes", n);
  return VL_OK;
}

/* The checkpoint keys of a run's results: where it resumed, what it saved. */
static void seg_ckpt_json(cJSON *out, const vl_loop_result *res) {
  if (res->resumed_from) cJSON_AddNumberToObject(out, "resumed_from_step", (double)res->resumed_from);
  if (!res->saves) return;
  cJSON_AddNumberToObject(out, "checkpoints_saved", (double)res->saves);
  cJSON_AddNumberToObject(out, "checkpoint_step", (double)res->saved_step);
  cJSON_AddStringToObject(out, "checkpoint", res->saved_path);
  cJSON_AddNumberToObject(out, "checkpoint_seconds", res->save_seconds);
}

vl_status vl_segcase_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out) {
  vl_segrung r;
  VL_TRY(vl_segrung_parse(env, env->scale, k, &r));
  if (env->device == VL_DEV_PLAN)
    return vl_case_fail(env, VL_ERR_INVALID, "run needs a compute device (cpu or cuda), not plan");
  if (r.batch == 0) { /* "max": the planner's answer at full scale */
    vl_segrung full;
    VL_TRY(vl_segrung_parse(env, "full", k, &full));
    int64_t mb = vl_segrung_max_batch(&full);
    r.batch = mb > 0 ? mb : 2;
    /* at a reduced run scale the full-scale batch may not fit the data set: keep >= 2
     * micro-batches per epoch */
    if (r.batch * r.accum * 2 > r.train_images) r.batch = r.train_images / (2 * r.accum);
    if (r.batch < 2) r.batch = 2;
  }
  if (!strcasecmp(env->scale, "full") && env->device == VL_DEV_CPU)
    return vl_case_fail(env, VL_ERR_UNSUPPORTED, "a full-scale (512x512 ResNet-101) step is too slow for this CPU: "
                        "use --scale small or tiny, or --device plan");
  char settings[1024];
  VL_TRY(seg_settings(env, &r, settings, sizeof settings));
  int64_t B = r.batch;
  long per_step = B * r.accum;
  if (per_step > r.train_images)
    return vl_case_fail(env, VL_ERR_INVALID, "batch %ld x accum %ld exceeds the %ld training images", B, r.accum,
                        r.train_images);
  vl_segset *ts = NULL, *es = NULL;
  vl_status s = vl_segrung_open_split(env, &r, false, &ts);
  if (s == VL_OK) s = vl_segrung_open_split(env, &r, true, &es);
  if (s != VL_OK) {
    vl_segset_close(ts);
    return s;
  }
  vl_ctx *c = NULL;
  s = vl_ctx_create(&c, env->device, VL_NO_CAP);
  if (s != VL_OK) {
    vl_segset_close(ts);
    vl_segset_close(es);
    return vl_case_fail(env, s, "cannot create a %s context: %s", vl_device_name(env->device), vl_status_name(s));
  }
  vl_model *m = NULL;
  s = vl_model_create(c, &vl_model_resunet, &r.model, (uint64_t)r.seed, &m);
  vl_loader_cfg lc;
  vl_segrung_loader_cfg(&r, &lc, B, false, c);
  vl_dataset ds = vl_segset_dataset(ts);
  char lerr[VL_CASE_ERR_LEN] = ""; /* the data's or the evaluation's message, when one failed */
  long steps_per_epoch = r.train_images / per_step, HW = r.model.mc.image * r.model.mc.image;
  seg_run R = {{env, &r, NULL, calloc((size_t)r.accum, sizeof(vl_batch_buf *)),
                calloc((size_t)r.accum, sizeof(vl_batch)), malloc((size_t)(per_step * 3 * HW) * sizeof(float)),
                malloc((size_t)(per_step * HW) * sizeof(int32_t)), steps_per_epoch * r.epochs},
               c, steps_per_epoch, 0, 0, calloc((size_t)r.epochs, sizeof(double)),
               calloc((size_t)r.epochs, sizeof(double))};
  vl_segrung_feed *L = &R.f;
  double *acc = R.acc, *miou = R.miou;
  if (s == VL_OK) {
    vl_err le = {""};
    s = vl_loader_create(&L->l, &lc, &ds, &le);
    snprintf(lerr, sizeof lerr, "%s", le.msg);
  }
  if (!L->held || !L->mb || !L->xs || !L->ys || !acc || !miou) s = VL_ERR_OOM;
  vl_loop_result res = {0};
  /* the first step (primitive creation, page faults) is warm-up */
  vl_loop_cfg cfg = {.warmup = 1, .next = seg_next, .after = seg_after, .user = &R, .stop = &vl_interrupted, .stop_now = &vl_terminated,
                     .profile = env->profile, .save_every = env->save_every, .save_dir = env->ckpt_dir,
                     .ckpt_tag = "seg-ckpt", .ckpt_settings = settings, .keep_last = env->keep_last,
                     .save_state = seg_save_state};
  if (s == VL_OK && env->resume) {
    vl_ckpt_meta meta;
    s = vl_run_resume(m, env->resume, "seg-ckpt", settings, &res, &meta);
    if (s == VL_OK) s = seg_restore(&R, meta.blob, meta.blob_len, env->resume, res.steps);
    if (s == VL_OK && !env->quiet)
      vl_progress("  resumed from %s at step %ld (epoch %ld)", env->resume, res.steps, R.epochs_done + 1);
    vl_ckpt_meta_free(&meta);
  }
  double run_t0 = vl_now();
  bool resumed_epoch = env->resume != NULL; /* the first epoch continues the checkpoint's */
  for (long e = R.epochs_done; s == VL_OK && e < r.epochs; e++, resumed_epoch = false) {
    s = vl_loader_start_epoch(L->l, e);
    if (!resumed_epoch) R.epoch_start = res.steps;
    /* after a resume: the batches of this epoch that the saved steps consumed */
    long consumed = (res.steps - R.epoch_start) * r.accum;
    if (s == VL_OK && consumed > 0 && (s = vl_segrung_skip(L, consumed)) != VL_OK) {
      vl_loader_stats lst;
      vl_loader_stats_get(L->l, &lst);
      snprintf(lerr, sizeof lerr, "skipping the %ld batches consumed before the resume: %s", consumed,
               lst.last_error);
    }
    cfg.total = R.epoch_start + steps_per_epoch;
    if (s == VL_OK) s = vl_run_loop(m, &cfg, &res);
    if (s == VL_OK && (s = vl_segrung_evaluate(env, m, &r, es, &acc[e], &miou[e])) != VL_OK)
      snprintf(lerr, sizeof lerr, "%s", env->err.msg);
    if (s == VL_OK) R.epochs_done = e + 1;
    if (s == VL_OK && !env->quiet)
      vl_progress("  epoch %ld: held-out pixel accuracy %.4f, mIoU %.4f", e + 1, acc[e], miou[e]);
  }
  double run_wall = vl_now() - run_t0;
  if (s != VL_OK && L->l && !lerr[0]) {
    vl_loader_stats lst;
    vl_loader_stats_get(L->l, &lst);
    if (lst.last_error[0]) snprintf(lerr, sizeof lerr, "%s", lst.last_error);
  }
  bool ran;
  s = vl_case_triage(env, s, s == VL_ERR_OOM || !lerr[0] ? c->err : lerr, out, &ran);
  seg_ckpt_json(out, &res);
  if (ran && res.timed < 1) {
    s = vl_case_fail(env, VL_ERR_INVALID, "no timed step: %ld training images give %ld step(s) of %ld x %ld",
                     r.train_images, res.steps, B, r.accum);
  } else if (ran) {
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
    vl_step_spec spec = vl_segrung_step_spec(&r, B, r.accum); /* the planner with this device's rules */
    vl_case_plan_check_json(out, env, &spec, ms.peak_total);
  }
  if (L->l) vl_loader_destroy(L->l);
  vl_loop_result_free(&res);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  vl_segset_close(ts);
  vl_segset_close(es);
  free(L->held); free(L->mb); free(L->xs); free(L->ys); free(acc); free(miou);
  return s;
}
