/* seg-ckpt's timed run: a rung's U-Net trained for the setting's epochs on the synthetic
 * training split through the engine's loader and timed loop, evaluated on the held-out split
 * after every epoch, with OOM triage and the planner's peak beside the measured one. */
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "interrupt.h"
#include "seg.h"

static void seg_after(void *user, long step, bool timed, const vl_step_info *info, double dt, double wait) {
  vl_seg_feed *L = user;
  if (!L->env->quiet && ((step + 1) % 10 == 0 || step + 1 == L->max_steps))
    vl_progress("  step %ld/%ld  loss %.4f  %.3f s (data wait %.3f s)", step + 1, L->max_steps, info->loss, dt, wait);
}

vl_status vl_seg_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out) {
  vl_seg_rung r;
  VL_TRY(vl_seg_parse_rung(env, env->scale, k, &r));
  if (env->device == VL_DEV_PLAN)
    return vl_case_fail(env, VL_ERR_INVALID, "run needs a compute device (cpu or cuda), not plan");
  if (r.batch == 0) { /* "max": the planner's answer at full scale */
    vl_seg_rung full;
    VL_TRY(vl_seg_parse_rung(env, "full", k, &full));
    int64_t mb = vl_seg_max_batch(&full);
    r.batch = mb > 0 ? mb : 2;
    /* at a reduced run scale the full-scale batch may not fit the data set: keep >= 2
     * micro-batches per epoch */
    if (r.batch * r.accum * 2 > r.train_images) r.batch = r.train_images / (2 * r.accum);
    if (r.batch < 2) r.batch = 2;
  }
  if (!strcasecmp(env->scale, "full") && env->device == VL_DEV_CPU)
    return vl_case_fail(env, VL_ERR_UNSUPPORTED, "a full-scale (512x512 ResNet-101) step is too slow for this CPU: "
                        "use --scale small or tiny, or --device plan");
  int64_t B = r.batch;
  long per_step = B * r.accum;
  if (per_step > r.train_images)
    return vl_case_fail(env, VL_ERR_INVALID, "batch %ld x accum %ld exceeds the %ld training images", B, r.accum,
                        r.train_images);
  vl_segset *ts = NULL, *es = NULL;
  vl_status s = vl_seg_open_split(env, &r, false, &ts);
  if (s == VL_OK) s = vl_seg_open_split(env, &r, true, &es);
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
  vl_seg_loader_cfg(&r, &lc, B, false, c);
  vl_dataset ds = vl_segset_dataset(ts);
  char lerr[VL_CASE_ERR_LEN] = ""; /* the data's or the evaluation's message, when one failed */
  long steps_per_epoch = r.train_images / per_step, HW = r.model.mc.image * r.model.mc.image;
  vl_seg_feed L = {env, &r, NULL, calloc((size_t)r.accum, sizeof(vl_batch_buf *)),
                   calloc((size_t)r.accum, sizeof(vl_batch)), malloc((size_t)(per_step * 3 * HW) * sizeof(float)),
                   malloc((size_t)(per_step * HW) * sizeof(int32_t)), steps_per_epoch * r.epochs};
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
    if (s == VL_OK && (s = vl_seg_evaluate(env, m, &r, es, &acc[e], &miou[e])) != VL_OK)
      snprintf(lerr, sizeof lerr, "%s", env->err);
    if (s == VL_OK && !env->quiet)
      vl_progress("  epoch %ld: held-out pixel accuracy %.4f, mIoU %.4f", e + 1, acc[e], miou[e]);
  }
  double run_wall = vl_now() - run_t0;
  if (s != VL_OK && L.l && !lerr[0]) {
    vl_loader_stats lst;
    vl_loader_stats_get(L.l, &lst);
    if (lst.last_error[0]) snprintf(lerr, sizeof lerr, "%s", lst.last_error);
  }
  bool ran;
  s = vl_case_triage(env, s, s == VL_ERR_OOM || !lerr[0] ? c->err : lerr, out, &ran);
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
    vl_step_spec spec = vl_seg_step_spec(&r, B, r.accum); /* the planner with this device's rules */
    vl_case_plan_check_json(out, env, &spec, ms.peak_total);
  }
  if (L.l) vl_loader_destroy(L.l);
  vl_loop_result_free(&res);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  vl_segset_close(ts);
  vl_segset_close(es);
  free(L.held); free(L.mb); free(L.xs); free(L.ys); free(acc); free(miou);
  return s;
}
