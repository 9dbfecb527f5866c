/* seg-ckpt's interleaved step timing: the before, ckpt and relu_off rungs' models stepped in
 * turn on one batch (the extra hook). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/interrupt.h"
#include "seg.h"

/* ---- checkpointing's time cost, interleaved ------------------------------------------------
 * The ladder's rungs run one after another, so a noisy neighbour on a shared machine can move
 * one rung's median by tens of percent. The cost of checkpointing (and of in-place ReLU off)
 * is therefore also measured with the three models side by side, one step of each in turn on
 * the same batch (the engine's interleaved repetitions). */

static double median_of(double *t, int n) { /* n small: insertion sort */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && t[j - 1] > t[j]; j--) { double x = t[j]; t[j] = t[j - 1]; t[j - 1] = x; }
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

vl_status vl_segcase_interleaved(vl_case_env *env, cJSON *res) {
  static const char *const names[3] = {"before", "ckpt", "relu_off"};
  enum { ROUNDS = 9, WARM = 2 };
  cJSON *rung[3] = {0}, *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs"))
    for (int i = 0; i < 3; i++)
      if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), names[i])) rung[i] = r;
  if (!rung[0] || !rung[1] || !rung[2]) return VL_OK; /* a ladder without them: nothing to compare */
  vl_segrung cfg[3];
  for (int i = 0; i < 3; i++) {
    vl_knobs k;
    VL_TRY(vl_case_knobs_of(env, rung[i], &k));
    VL_TRY(vl_segrung_parse(env, env->scale, &k, &cfg[i]));
    if (cfg[i].batch == 0) return VL_OK;
  }
  vl_ctx *c;
  vl_status s = vl_ctx_create(&c, env->device, VL_NO_CAP);
  if (s != VL_OK) return vl_case_fail(env, s, "interleaved timing: no %s context", vl_device_name(env->device));
  vl_model *m[3] = {0};
  const vl_resunet_cfg *mc = &cfg[0].model.mc;
  int64_t B = cfg[0].batch, HW = mc->image * mc->image;
  float *x = malloc((size_t)(B * 3 * HW) * sizeof *x);
  int32_t *y = malloc((size_t)(B * HW) * sizeof *y);
  s = x && y ? VL_OK : VL_ERR_OOM;
  for (int i = 0; s == VL_OK && i < 3; i++)
    s = vl_model_create(c, &vl_model_resunet, &cfg[i].model, (uint64_t)cfg[i].seed, &m[i]);
  vl_rng g;
  vl_rng_seed(&g, (uint64_t)cfg[0].seed + 77);
  for (int64_t i = 0; s == VL_OK && i < B * 3 * HW; i++) x[i] = vl_rng_normal(&g);
  for (int64_t i = 0; s == VL_OK && i < B * HW; i++) y[i] = (int32_t)vl_rng_below(&g, (uint64_t)mc->classes);
  double t[3][ROUNDS];
  vl_batch mb = {0};
  vl_batch_add(&mb, "images", VL_F32, 4, (int64_t[4]){B, 3, mc->image, mc->image}, x);
  vl_batch_add(&mb, "masks", VL_I32, 3, (int64_t[3]){B, mc->image, mc->image}, y);
  if (!env->quiet) vl_progress("interleaved step timing: before / ckpt / relu_off, %d rounds", ROUNDS);
  if (s == VL_OK) s = vl_run_interleaved(m, 3, &mb, WARM, ROUNDS, &vl_interrupted, &t[0][0]);
  if (s != VL_OK) {
    vl_case_fail(env, s, "interleaved timing: %s (%s)", vl_status_name(s), c->err);
  } else {
    cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
    if (!cm) cm = cJSON_AddObjectToObject(res, "case_metrics");
    cJSON *o = cJSON_AddObjectToObject(cm, "interleaved_steps");
    cJSON_AddNumberToObject(o, "rounds", ROUNDS);
    cJSON_AddNumberToObject(o, "batch", (double)B);
    for (int i = 0; i < 3; i++) {
      cJSON_AddItemToObject(o, names[i], cJSON_CreateDoubleArray(t[i], ROUNDS));
      double med = median_of(t[i], ROUNDS);
      /* on the rung, so claims and the report read it like any run metric */
      cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(rung[i], "runs"), 0);
      if (r0) cJSON_AddNumberToObject(r0, "interleaved_step_seconds", med);
    }
  }
  for (int i = 2; i >= 0; i--) vl_model_destroy(m[i]);
  vl_ctx_destroy(c);
  free(x);
  free(y);
  return s;
}
