/* A ResNet-101 U-Net segmentation training rung, the pieces shared by the cases that train
 * one (seg-ckpt, multi-gpu): its knobs and what they mean, the step it plans and runs
 * (segrung.c); its data, the synthetic segmentation splits fed through the engine's
 * loader, and held-out evaluation (segrung_data.c). Every function that can fail returns
 * vl_status with its message in env->err (vl_case_fail). */
#ifndef VRAMLAB_KIT_SEGRUNG_H
#define VRAMLAB_KIT_SEGRUNG_H

#include "case.h"
#include "datasets/segset.h"
#include "vramlab/data.h"
#include "vramlab/resunet.h"

/* Knob declarations shared by the cases built on this rung (seg-ckpt, multi-gpu): each
 * default written once (knobs.h). */
#define VL_SEGRUNG_MODEL_KNOBS                                                                        \
  {"compute", "fp32", "compute dtype: fp32, fp16 or bf16 (AMP with fp32 master weights)", VL_KNOB_RUNG}, \
  {"checkpoint", "false", "activation checkpointing per bottleneck block", VL_KNOB_RUNG},        \
  {"relu_inplace", "true", "ReLU overwrites its input (no separate output kept)", VL_KNOB_RUNG}
#define VL_SEGRUNG_LOADER_KNOBS                                                                       \
  {"workers", "0", "loader worker threads, or cores (one per core)", VL_KNOB_RUNG},              \
  {"prefetch", "2", "batches in flight per worker", VL_KNOB_RUNG},                                \
  {"pinned", "false", "batches in pinned host staging", VL_KNOB_RUNG},                            \
  {"lr", "1e-3", "learning rate (Adam)", VL_KNOB_RUNG},                                           \
  {"corrupt", "error", "a damaged file in the data: error (stop) or skip (leave it out, counted)", \
   VL_KNOB_RUNG},                                                                                 \
  {"max_file_bytes", "64MiB", "larger input files are corrupt samples, refused unread", VL_KNOB_RUNG}
#define VL_SEGRUNG_SIZE_SETTINGS                                                                      \
  {"classes", "5", "segmentation classes, background included (2..255)", VL_KNOB_SETTING},      \
  {"image", "preset",                                                                             \
   "image side, a multiple of 32 (32..2048); preset: the scale's (512 full, 128 small, 32 tiny)", \
   VL_KNOB_SETTING},                                                                              \
  {"width_div", "preset",                                                                         \
   "widths of ResNet-101 and the decoder divided by 1, 2, 4 .. 64 (decoder >= 2); preset: 1 full, 4 small, 16 tiny", \
   VL_KNOB_SETTING},                                                                              \
  {"blocks", "preset", "bottlenecks per stage, 4 comma-separated (ResNet-101: 3,4,23,3); preset: the scale's", \
   VL_KNOB_SETTING},                                                                              \
  {"seed", "1", "seed of weights, data order and the data sets", VL_KNOB_SETTING}

typedef struct {
  vl_resunet_model_cfg model;
  long batch;            /* micro-batch; 0 = "max" */
  long accum, workers, prefetch;
  int pinned;
  vl_corrupt_policy corrupt;
  size_t max_file_bytes;
  vl_case_card card;
  long seed, epochs, train_images, eval_images, curve_points;
  char data_dir[VL_KNOB_VAL_LEN]; /* the data_dir knob (its length checked by vl_knob_set) */
} vl_segrung;

/* Every knob a rung may set and every setting it reads (segrung.c): seg-ckpt's knob table,
 * and the defaults multi-gpu's rungs fall back on. */
extern const vl_knob_decl vl_segrung_knobs[];
/* Every knob of a rung and the setting at `scale` into r; VL_ERR_INVALID with a message
 * naming the knob. */
vl_status vl_segrung_parse(vl_case_env *env, const char *scale, const vl_knobs *k, vl_segrung *r);
/* A step of accum micro-batches of B images at the model's size. */
vl_step_spec vl_segrung_step_spec(const vl_segrung *r, int64_t B, long accum);
/* Largest micro-batch (>= 2: batch norm needs two samples at 1/32 resolution) whose step of
 * one micro-batch fits under the cap; 0 when none does. */
int64_t vl_segrung_max_batch(const vl_segrung *r);

/* The train or eval split at this scale's image size, made on first use (seeded). */
vl_status vl_segrung_open_split(vl_case_env *env, const vl_segrung *r, bool eval, vl_segset **out);
/* The loader of a split: batches of B, training (shuffled, workers) or evaluation. */
void vl_segrung_loader_cfg(const vl_segrung *r, vl_loader_cfg *lc, int64_t B, bool eval, vl_ctx *c);
/* Pixel accuracy and mean IoU (over classes present in the labels or predictions) on the
 * held-out split, BN in evaluation mode. */
vl_status vl_segrung_evaluate(vl_case_env *env, vl_model *m, const vl_segrung *r, vl_segset *es, double *acc,
                          double *miou);

/* The training loop's data (vl_loop_cfg.next): a step's accum micro-batches from the loader. */
typedef struct {
  const vl_case_env *env;
  const vl_segrung *r;
  vl_loader *l;
  vl_batch_buf **held;
  vl_batch *mb;  /* accum micro-batches: images (B, 3, H, W), masks (B, H, W) */
  float *xs;     /* (accum, B, 3, H, W) */
  int32_t *ys;   /* (accum, B, H, W) */
  long max_steps;
} vl_segrung_feed;
vl_status vl_segrung_next(void *user, long step, const vl_batch **mb, int *n, double *wait);
/* Take and release the next n batches of the loader's epoch unused (a resume's position:
 * the epoch's seeded order restarted, the batches its saved steps consumed passed over,
 * so corrupt-sample skips fall as they did). The end of the epoch stops it early. */
vl_status vl_segrung_skip(vl_segrung_feed *L, long n);

#endif
