/* A U-Net segmentation rung's knobs and what they mean (seg-ckpt's and multi-gpu's): the
 * knob table, a rung's knobs and the setting mapped to a ResNet-101 U-Net model, training and loader config, and the step (spec) a
 * rung plans and runs. The model: the scale's preset, then each size knob given (image,
 * width_div, blocks) over it. */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "segrung.h"

const vl_knob_decl vl_segrung_knobs[] = {
    VL_SEGRUNG_MODEL_KNOBS,
    {"encoder", "resnet101", "encoder depth: resnet101 (3,4,23,3) or resnet50 (3,4,6,3); a blocks setting wins",
     VL_KNOB_RUNG},
    {"accum", "1", "gradient accumulation micro-batches per step", VL_KNOB_RUNG},
    {"batch", "8", "micro-batch (>= 2, batch norm), or max (the largest under the cap at full scale)",
     VL_KNOB_RUNG},
    VL_SEGRUNG_LOADER_KNOBS,
    VL_CASE_CARD_KNOBS,
    VL_SEGRUNG_SIZE_SETTINGS,
    {"epochs", "3", "training epochs per rung at the run scale", VL_KNOB_SETTING},
    {"train_images", "256", "training split at the run scale (made on first use)", VL_KNOB_SETTING},
    {"eval_images", "64", "held-out split for pixel accuracy and mIoU", VL_KNOB_SETTING},
    {"curve_points", "24", "planned batches for the memory-vs-batch line", VL_KNOB_SETTING},
    {"data_dir", "data/segset", "where the segmentation splits are made and read", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};

/* The model's sizes: the scale's preset, then image, width_div and blocks when given (not
 * "preset"). Dividing the full widths by d gives every preset (small d = 4, tiny d = 16:
 * decoder widths floor(w / d), at least 2). */
static vl_status parse_model(vl_case_env *env, const char *scale, const vl_knobs *k, vl_resunet_cfg *mc) {
  if (vl_resunet_preset(scale, mc))
    return vl_case_fail(env, VL_ERR_INVALID, "unknown scale '%s' (tiny, small, full)", scale);
  const vl_knobs *s = env->setting;
  long v;
  /* the encoder's depth (000 §1.1 compares ResNet-101 with ResNet-50); widths stay the scale's */
  const char *enc = vl_knob_str(k, "encoder", vl_segrung_knobs);
  if (!strcasecmp(enc, "resnet50")) mc->blocks[2] = 6;
  else if (strcasecmp(enc, "resnet101"))
    return vl_case_fail(env, VL_ERR_INVALID, "encoder = '%s': expected resnet101 or resnet50", enc);
  if (strcasecmp(vl_knob_str(s, "image", vl_segrung_knobs), "preset")) {
    VL_TRY(vl_knob_int(s, "image", vl_segrung_knobs, 32, VL_SEGSET_SIZE_MAX, &v, &env->err));
    if (v % 32) return vl_case_fail(env, VL_ERR_INVALID, "image = %ld: expected a multiple of 32 (the encoder's stride)", v);
    mc->image = v;
  }
  if (strcasecmp(vl_knob_str(s, "width_div", vl_segrung_knobs), "preset")) {
    VL_TRY(vl_knob_int(s, "width_div", vl_segrung_knobs, 1, 64, &v, &env->err));
    vl_resunet_cfg full;
    vl_resunet_preset("full", &full);
    if (full.width % v)
      return vl_case_fail(env, VL_ERR_INVALID, "width_div = %ld: expected 1, 2, 4, 8, 16, 32 or 64 (dividing %lld)", v,
                          (long long)full.width);
    mc->width = full.width / v;
    for (int i = 0; i < 5; i++) mc->dec[i] = full.dec[i] / v > 2 ? full.dec[i] / v : 2;
  }
  if (strcasecmp(vl_knob_str(s, "blocks", vl_segrung_knobs), "preset")) {
    long b[4];
    int n = 0;
    VL_TRY(vl_knob_int_list(s, "blocks", vl_segrung_knobs, 1, 64, b, 4, &n, &env->err));
    if (n != 4)
      return vl_case_fail(env, VL_ERR_INVALID, "blocks: expected 4 numbers (one per stage), got %d", n);
    for (int i = 0; i < 4; i++) mc->blocks[i] = (int)b[i];
  }
  return VL_OK;
}

vl_status vl_segrung_parse(vl_case_env *env, const char *scale, const vl_knobs *k, vl_segrung *r) {
  memset(r, 0, sizeof *r);
  vl_resunet_cfg *mc = &r->model.mc;
  vl_resunet_train_cfg *tc = &r->model.tc;
  VL_TRY(parse_model(env, scale, k, mc));
  vl_resunet_train_cfg_default(tc);
  const vl_knobs *s = env->setting;
  long v;
  VL_TRY(vl_knob_int(s, "classes", vl_segrung_knobs, 2, VL_SEGSET_CLASSES_MAX, &v, &env->err));
  mc->classes = v;
  VL_TRY(vl_case_card_parse(env, k, &r->card));
  VL_TRY(vl_knob_int(s, "seed", vl_segrung_knobs, 0, 1L << 40, &r->seed, &env->err));
  VL_TRY(vl_knob_int(s, "epochs", vl_segrung_knobs, 1, 10000, &r->epochs, &env->err));
  VL_TRY(vl_knob_int(s, "train_images", vl_segrung_knobs, 8, 1 << 24, &r->train_images, &env->err));
  VL_TRY(vl_knob_int(s, "eval_images", vl_segrung_knobs, 1, 1 << 24, &r->eval_images, &env->err));
  VL_TRY(vl_knob_int(s, "curve_points", vl_segrung_knobs, 4, 256, &r->curve_points, &env->err));
  const char *dd = vl_knob_str(s, "data_dir", vl_segrung_knobs);
  if (strlen(dd) >= sizeof r->data_dir)
    return vl_case_fail(env, VL_ERR_INVALID, "data_dir: path too long: %zu characters (limit %zu)", strlen(dd),
                        sizeof r->data_dir - 1);
  snprintf(r->data_dir, sizeof r->data_dir, "%s", dd);
  const char *cs = vl_knob_str(k, "compute", vl_segrung_knobs);
  if (vl_dtype_parse(cs, &tc->compute) || tc->compute == VL_NF4)
    return vl_case_fail(env, VL_ERR_INVALID, "compute = '%s': expected fp32, fp16 or bf16", cs);
  int b;
  VL_TRY(vl_knob_bool(k, "checkpoint", vl_segrung_knobs, &b, &env->err));
  tc->checkpoint = b;
  VL_TRY(vl_knob_bool(k, "relu_inplace", vl_segrung_knobs, &b, &env->err));
  tc->relu_inplace = b;
  VL_TRY(vl_knob_int(k, "accum", vl_segrung_knobs, 1, 4096, &r->accum, &env->err));
  const char *w = vl_knob_get(k, "workers");
  if (w && !strcasecmp(w, "cores")) { /* PyTorch's usual advice: one worker per core */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    r->workers = n > 0 ? n : 1;
  } else {
    VL_TRY(vl_knob_int(k, "workers", vl_segrung_knobs, 0, VL_LOADER_WORKERS_MAX, &r->workers, &env->err));
  }
  VL_TRY(vl_knob_int(k, "prefetch", vl_segrung_knobs, 1, 64, &r->prefetch, &env->err));
  VL_TRY(vl_knob_bool(k, "pinned", vl_segrung_knobs, &r->pinned, &env->err));
  /* Damaged files in the data: fail on the first (error, the default) or skip them. */
  const char *cp = vl_knob_str(k, "corrupt", vl_segrung_knobs);
  if (vl_corrupt_policy_parse(cp, &r->corrupt))
    return vl_case_fail(env, VL_ERR_INVALID, "corrupt = '%s': expected skip or error", cp);
  VL_TRY(vl_knob_bytes(k, "max_file_bytes", vl_segrung_knobs, &r->max_file_bytes, &env->err));
  double d;
  VL_TRY(vl_knob_double(k, "lr", vl_segrung_knobs, 1e-12, 10, &d, &env->err));
  tc->optim.hp.lr = (float)d;
  const char *bs = vl_knob_str(k, "batch", vl_segrung_knobs);
  if (!strcasecmp(bs, "max")) r->batch = 0;
  else VL_TRY(vl_knob_int(k, "batch", vl_segrung_knobs, 2, 1 << 20, &r->batch, &env->err));
  return VL_OK;
}

vl_step_spec vl_segrung_step_spec(const vl_segrung *r, int64_t B, long accum) {
  vl_step_spec s = {.type = &vl_model_resunet, .cfg = &r->model, .seed = (uint64_t)r->seed, .batch = {0}, .accum = accum};
  vl_step_spec_set_batch(&s, B);
  return s;
}

int64_t vl_segrung_max_batch(const vl_segrung *r) {
  vl_step_spec s = vl_segrung_step_spec(r, 2, 1);
  return vl_run_max_batch(&s, r->card.cap, 2);
}
