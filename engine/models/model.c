/* The generic side of vl_model (vramlab/model.h): batches of named host tensors and the
 * calls every model answers through its table. */
#include "vramlab/model.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

void vl_batch_add(vl_batch *b, const char *name, vl_dtype dtype, int ndim, const int64_t *shape,
                  const void *data) {
  assert(b->n < VL_BATCH_MAX_TENSORS && ndim >= 1 && ndim <= VL_MAX_DIMS);
  vl_batch_tensor *t = &b->t[b->n++];
  memset(t, 0, sizeof *t);
  t->name = name;
  t->dtype = dtype;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->data = data;
}

const vl_batch_tensor *vl_batch_get(const vl_batch *b, const char *name) {
  for (int i = 0; i < b->n; i++)
    if (!strcmp(b->t[i].name, name)) return &b->t[i];
  return NULL;
}

const vl_batch_tensor *vl_batch_want(vl_ctx *c, const vl_batch *b, const char *name,
                                     vl_dtype dtype, int ndim, vl_status *status) {
  const vl_batch_tensor *t = vl_batch_get(b, name);
  if (!t) {
    *status = vl_fail(c, VL_ERR_INVALID, "batch: no tensor '%s'", name);
    return NULL;
  }
  if (t->dtype != dtype || t->ndim != ndim) {
    *status = vl_fail(c, VL_ERR_INVALID, "batch: '%s' is %s with %d dims, expected %s with %d",
                      name, vl_dtype_name(t->dtype), t->ndim, vl_dtype_name(dtype), ndim);
    return NULL;
  }
  *status = VL_OK;
  return t;
}

int64_t vl_batch_samples(const vl_batch *b) { return b->n ? b->t[0].shape[0] : 0; }

vl_status vl_model_create(vl_ctx *c, const vl_model_type *type, const void *cfg, uint64_t seed,
                          vl_model **out) {
  return vl_model_create_ex(c, type, cfg, &(vl_model_opts){0}, seed, out);
}

vl_status vl_model_create_ex(vl_ctx *c, const vl_model_type *type, const void *cfg,
                             const vl_model_opts *o, uint64_t seed, vl_model **out) {
  *out = NULL;
  vl_model *m = calloc(1, sizeof *m);
  if (!m) return vl_fail(c, VL_ERR_OOM, "host memory for a %s model", type->name);
  m->type = type;
  m->c = c;
  vl_status s = type->create(c, cfg, o, seed, &m->state);
  if (s != VL_OK) {
    free(m);
    return s;
  }
  *out = m;
  return VL_OK;
}

void vl_model_destroy(vl_model *m) {
  if (!m) return;
  m->type->destroy(m->state);
  free(m);
}

void vl_model_params(const vl_model *m, vl_param_counts *out) {
  memset(out, 0, sizeof *out);
  m->type->params(m->state, out);
}

vl_status vl_model_fwd_bwd(vl_model *m, const vl_batch *mb, int n, vl_step_info *info) {
  return m->type->fwd_bwd(m->state, mb, n, info);
}

vl_status vl_model_apply(vl_model *m, vl_step_info *info) { return m->type->apply(m->state, info); }

vl_status vl_model_step(vl_model *m, const vl_batch *mb, int n, vl_step_info *info) {
  VL_TRY(vl_model_fwd_bwd(m, mb, n, info));
  if (info->skipped) return VL_OK;
  return vl_model_apply(m, info);
}

vl_status vl_model_predict(vl_model *m, const vl_batch *b, int32_t *pred) {
  if (!m->type->predict)
    return vl_fail(m->c, VL_ERR_UNSUPPORTED, "model %s has no predict", m->type->name);
  return m->type->predict(m->state, b, pred);
}

void vl_model_step_end(vl_model *m) {
  if (m->type->step_end) m->type->step_end(m->state);
}

vl_status vl_model_train_state(vl_model *m, vl_train_state *out) {
  memset(out, 0, sizeof *out);
  if (!m->type->train_state)
    return vl_fail(m->c, VL_ERR_UNSUPPORTED, "model %s does not hand out its parameters", m->type->name);
  return m->type->train_state(m->state, out);
}
