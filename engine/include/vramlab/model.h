/* One model interface (docs/architecture.md "Models"): every model is a table of
 * functions over an opaque state, made from a model-specific config behind a void *.
 * The training scaffolding (vramlab/run.h: plan a step, fits, largest batch, the timed
 * loop, OOM triage, planned-equals-measured) drives any model through it.
 *
 * A batch is a small set of named host tensors (dtype + shape + data): the model uploads
 * them into its one VL_MEM_DATA block. Token ids, targets and class masks are VL_I32. On
 * the plan device the data pointers are NULL: the shapes alone plan a step. */
#ifndef VRAMLAB_MODEL_H
#define VRAMLAB_MODEL_H

#include "vramlab/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- batches ------------------------------------------------------------------------- */
#define VL_BATCH_MAX_TENSORS 8

/* One named host tensor of a batch, row-major contiguous; data NULL when planning. */
typedef struct {
  const char *name; /* "tokens", "targets", "images", "masks" */
  vl_dtype dtype;
  int ndim;
  int64_t shape[VL_MAX_DIMS];
  const void *data;
} vl_batch_tensor;

/* One micro-batch, e.g. Mistral: tokens (B, T) i32 + targets (B, T) i32; the U-Net:
 * images (B, 3, H, W) f32 + masks (B, H, W) i32. */
typedef struct {
  int n;
  vl_batch_tensor t[VL_BATCH_MAX_TENSORS];
} vl_batch;

/* Append a tensor (asserts on more than VL_BATCH_MAX_TENSORS: a programmer error). */
void vl_batch_add(vl_batch *b, const char *name, vl_dtype dtype, int ndim, const int64_t *shape,
                  const void *data);
/* The tensor called `name`, or NULL. */
const vl_batch_tensor *vl_batch_get(const vl_batch *b, const char *name);
/* The tensor called `name` of that dtype and ndim dims, or NULL with the context's message
 * naming what is missing or mismatched (status VL_ERR_INVALID through *status). */
const vl_batch_tensor *vl_batch_want(vl_ctx *c, const vl_batch *b, const char *name,
                                     vl_dtype dtype, int ndim, vl_status *status);
/* Samples in the batch: dim 0 of its first tensor (0 when empty). */
int64_t vl_batch_samples(const vl_batch *b);

/* ---- what a step reports -------------------------------------------------------------- */
typedef struct {
  double loss;       /* mean over the step's valid targets (tokens, pixels) */
  int64_t n_targets; /* valid targets of the step */
  bool skipped;      /* fp16 overflow: step skipped, scale halved */
  float loss_scale;  /* scale used in this step */
  double grad_norm;  /* global norm of the unscaled gradients */
} vl_step_info;

/* Parameter counts: total, trainable, and by module (name/count pairs, e.g. the U-Net's
 * encoder / decoder / head; none for a model that does not split them). */
#define VL_MODEL_MAX_MODULES 8
typedef struct {
  int64_t total, trainable;
  int n_modules;
  const char *module_name[VL_MODEL_MAX_MODULES];
  int64_t module_count[VL_MODEL_MAX_MODULES];
} vl_param_counts;

/* What a model trains, for the code that drives training from outside the model: the
 * data-parallel wrapper (vramlab/ddp.h: bucketed allreduce, ZeRO-1's sharded update) and
 * checkpoint/resume. p: every parameter of the model in its creation order (the order of
 * PyTorch's model.parameters()); optim, clip and scaler: what the model's apply uses. */
typedef struct {
  vl_param *p;
  int n;
  const vl_optim_cfg *optim;
  float clip; /* global-norm clip (0: none) */
  vl_scaler *scaler;
  /* State that is not a parameter but that a resume must restore bit for bit (the U-Net's
   * batch-norm running statistics), as the model's own tensors; none for Mistral. */
  vl_tensor *const *buffers;
  int n_buffers;
} vl_train_state;

/* How a model is made, besides its own config (vl_model_create: all false). */
typedef struct {
  /* Someone else owns the optimizer state: the model allocates none (its optimizer config
   * gets state_elsewhere, vramlab/nn.h). The data-parallel wrapper sets it for ZeRO-1, which
   * allocates the shard its rank updates, and for a DataParallel replica, which never
   * updates. */
  bool optim_state_elsewhere;
} vl_model_opts;

/* ---- the interface ---------------------------------------------------------------------- */
typedef struct vl_model_type {
  const char *name;
  /* Make the model (parameters, optimizer state unless o says otherwise) in c's arena from
   * cfg (the model's own config struct), seeded. */
  vl_status (*create)(vl_ctx *c, const void *cfg, const vl_model_opts *o, uint64_t seed,
                      void **state);
  void (*destroy)(void *state);
  void (*params)(const void *state, vl_param_counts *out);
  /* The planned batch of B samples at the config's full size: shapes, data NULL. */
  void (*plan_batch)(const void *cfg, int64_t B, vl_batch *out);
  /* Forward + backward over n micro-batches, gradients summed, the loss normalised by the
   * valid targets of all of them. */
  vl_status (*fwd_bwd)(void *state, const vl_batch *mb, int n, vl_step_info *info);
  /* Unscale, overflow check, clip, update, zero gradients. */
  vl_status (*apply)(void *state, vl_step_info *info);
  /* Evaluation forward: per-position class ids into pred (host; the U-Net: (B, H, W)).
   * NULL: the model has none (vl_model_predict returns VL_ERR_UNSUPPORTED). */
  vl_status (*predict)(void *state, const vl_batch *b, int32_t *pred);
  /* Its parameters, optimizer and scaler (above). NULL: the model does not hand them out
   * (vl_model_train_state returns VL_ERR_UNSUPPORTED): no data parallelism, no resume. */
  vl_status (*train_state)(void *state, vl_train_state *out);
  /* The step's update was done outside the model (ZeRO-1's sharded update; a DataParallel
   * replica, which only receives parameters): reset what the model's apply resets besides
   * the update, e.g. the U-Net's per-step "gradient written" flags. NULL: nothing to do. */
  void (*step_end)(void *state);
} vl_model_type;

typedef struct vl_model {
  const vl_model_type *type;
  void *state;
  vl_ctx *c;
} vl_model;

vl_status vl_model_create(vl_ctx *c, const vl_model_type *type, const void *cfg, uint64_t seed,
                          vl_model **out);
vl_status vl_model_create_ex(vl_ctx *c, const vl_model_type *type, const void *cfg,
                             const vl_model_opts *o, uint64_t seed, vl_model **out);
void vl_model_destroy(vl_model *m); /* NULL is fine */
void vl_model_params(const vl_model *m, vl_param_counts *out);
vl_status vl_model_fwd_bwd(vl_model *m, const vl_batch *mb, int n, vl_step_info *info);
vl_status vl_model_apply(vl_model *m, vl_step_info *info);
/* fwd_bwd, then apply unless the step was skipped (fp16 overflow). */
vl_status vl_model_step(vl_model *m, const vl_batch *mb, int n, vl_step_info *info);
vl_status vl_model_predict(vl_model *m, const vl_batch *b, int32_t *pred);
vl_status vl_model_train_state(vl_model *m, vl_train_state *out);
void vl_model_step_end(vl_model *m);

#ifdef __cplusplus
}
#endif
#endif
