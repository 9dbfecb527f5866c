/* dataloader's own pieces shared by its files: the setting and a rung's knobs as a loader
 * config, and the data set (config.c), one epoch through the loader with the modeled
 * consumer and the timed run (run.c), the case-wide sweep (sweep.c). Every function that
 * can fail returns vl_status with its message in env->err (vl_case_fail). */
#ifndef VRAMLAB_DATALOADER_H
#define VRAMLAB_DATALOADER_H

#include "kit/case.h"
#include "datasets/jpegset.h"
#include "vramlab/data.h"

typedef struct {
  vl_loader_cfg lc;
  bool pin;
  long images, data_seed, epochs, cores;
  double consumer_ms;
  char data_dir[VL_KNOB_VAL_LEN + 64]; /* the data_dir knob + "/n<images>-s<seed>" */
  long sweep_w[16], sweep_p[16];       /* the workers x prefetch sweep of extra */
  int n_sweep_w, n_sweep_p;
} vl_dl_cfg;

/* Every knob a rung may set and every setting the case reads (config.c). */
extern const vl_knob_decl vl_dl_knobs[];
/* The setting and a rung's knobs at `scale` into d (scales shrink the data set so CI runs
 * in seconds); VL_ERR_INVALID with a message naming the knob. */
vl_status vl_dl_parse(vl_case_env *env, const char *scale, const vl_knobs *k, vl_dl_cfg *d);
/* Open the data set, making it first when it is not there (seeded, so every run of the
 * same setting reads the same bytes). */
vl_status vl_dl_open_data(vl_case_env *env, const vl_dl_cfg *d, vl_jpegset **out);

/* The device side of a run: batches are uploaded to a VL_MEM_DATA tensor (from pinned
 * staging when pin is on). NULL ctx: CPU backend, where batches never leave host memory. */
typedef struct {
  vl_ctx *c;
  vl_tensor x;
} vl_dl_device;

/* One epoch's measurements (run.c). */
typedef struct {
  double wall, wait, load, transform, cpu, first_batch, h2d;
  int64_t batches, images, skipped;
} vl_dl_epoch;

/* One epoch through the loader with the modeled consumer (consumer_ms of wall time per
 * batch, no CPU); dev NULL or without a context: no upload. The loader's status (its
 * message in its stats), VL_ERR_INTERRUPTED when interrupted. */
vl_status vl_dl_run_epoch(vl_loader *l, int64_t epoch, double consumer_ms, vl_dl_device *dev, vl_dl_epoch *m);

/* One repetition of a rung (run.c): the case's run hook. */
vl_status vl_dl_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out);
/* The decode-only ceiling, the workers x prefetch sweep and the PyTorch reference after
 * the ladder (sweep.c): the case's extra hook. */
vl_status vl_dl_extra(vl_case_env *env, cJSON *res);
/* A finished sweep's best setting into cm (sweep.c): best_images_per_s, best_workers,
 * best_prefetch, or null with best_prefetch_tied when prefetch settings tie within one
 * measurement's 5% noise at the best worker count; *best_w the worker count. */
void vl_dl_sweep_best(const cJSON *sweep, cJSON *cm, long *best_w);

/* The case's report sections (the report hook). */
void vl_dataloader_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot);

#endif
