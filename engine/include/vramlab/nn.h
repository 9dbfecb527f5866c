/* Layers as explicit forward/backward functions over operations (llm.c style), plus the
 * parameter store and optimizers. Every operation goes through vl_op_run (vramlab/ops.h),
 * which counts FLOPs and bytes and, on a plan context, computes nothing. */
#ifndef VRAMLAB_NN_H
#define VRAMLAB_NN_H

#include "vramlab/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y (R, N) = x (R, K) @ W^T, W (N, K) as PyTorch's nn.Linear; beta=1 accumulates. */
vl_status vl_linear_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, const vl_tensor *W,
                        int64_t R, int64_t K, int64_t N, float beta);
/* dx (R,K) (+)= dy (R,N) @ W ; beta selects overwrite (0) or accumulate (1). */
vl_status vl_linear_bwd_x(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *W,
                          int64_t R, int64_t K, int64_t N, float beta);
/* dW (N,K) += scale * dy^T (N,R) @ x (R,K) */
vl_status vl_linear_bwd_w(vl_ctx *c, vl_tensor *dW, const vl_tensor *dy, const vl_tensor *x,
                          int64_t R, int64_t K, int64_t N, float scale);

/* ---- parameters ------------------------------------------------------------------- */
typedef enum { VL_OPT_ADAMW = 0, VL_OPT_ADAFACTOR, VL_OPT_SGD, VL_OPT_COUNT } vl_optimizer;
const char *vl_optimizer_name(vl_optimizer o);
int vl_optimizer_parse(const char *s, vl_optimizer *o);

typedef struct vl_param {
  vl_tensor w;       /* what compute reads: fp32 weights, the AMP working copy, or the
                        frozen storage (fp32/fp16/bf16/nf4) */
  vl_tensor master;  /* fp32 master of a trainable tensor under AMP (else unused) */
  vl_tensor grad;    /* fp32, trainable only */
  vl_tensor state[3]; /* optimizer state: AdamW (m, v); SGD (mom); Adafactor (vr, vc, m) */
  int64_t rows, cols; /* (out, in) for matrices, (1, n) for vectors */
  bool trainable;
  bool has_master;
  char name[96]; /* SD: the diffusers / transformers state_dict key */
} vl_param;

typedef struct {
  vl_optimizer opt;
  vl_optim_hp hp;    /* lr, betas, eps, wd, Adafactor and SGD knobs */
  bool adafactor_beta1; /* Adafactor keeps a first moment */
  /* The state is not allocated with the parameters (vl_param_alloc_optim allocates nothing):
   * its owner does (ZeRO-1's wrapper, the shard its rank updates), or nobody (a DataParallel
   * replica, which never updates). Set through vl_model_opts (vramlab/model.h). */
  bool state_elsewhere;
} vl_optim_cfg;

/* AdamW with betas (0.9, 0.999), eps 1e-8, no weight decay, at learning rate lr; the
 * Adafactor (eps2 1e-3, clip 1, decay 0.8) and SGD (momentum 0.9) knobs set too. */
void vl_optim_cfg_default(vl_optim_cfg *o, float lr);

/* Allocate a parameter: storage dtype `dtype` (compute copy), trainable -> grads + master
 * when dtype != fp32. Values are set by vl_param_load. */
vl_status vl_param_alloc(vl_ctx *c, vl_param *p, const char *name, int64_t rows, int64_t cols,
                         vl_dtype dtype, bool trainable);
/* A model calls this each time it has finished writing p's gradient for one micro-batch
 * (after the last operation that adds to p->grad in that micro-batch's backward), so a
 * data-parallel reducer (c->grad_hook, vramlab/ddp.h) can start the allreduce of a bucket
 * whose gradients are all final while backward goes on. A no-op without a hook. */
static inline void vl_grad_ready(vl_ctx *c, const vl_param *p) {
  if (c->grad_hook) c->grad_hook(c->grad_hook_user, p);
}
/* Allocate optimizer state for a trainable parameter (zeroed); nothing when
 * oc->state_elsewhere (ZeRO-1 allocates its shard itself). */
vl_status vl_param_alloc_optim(vl_ctx *c, vl_param *p, const vl_optim_cfg *oc);
/* Set values from host fp32 (quantising/converting into w, copying into master). */
vl_status vl_param_load(vl_ctx *c, vl_param *p, const float *host);
/* Read the fp32 value of the parameter (master when present) into host memory. */
vl_status vl_param_read(vl_ctx *c, const vl_param *p, float *host);
vl_status vl_param_read_grad(vl_ctx *c, const vl_param *p, float *host);
void vl_param_free(vl_ctx *c, vl_param *p);
/* One optimizer update; grad_scale multiplies gradients first (unscale, clip). Then the
 * AMP working copy is refreshed from the master. */
vl_status vl_param_update(vl_ctx *c, vl_param *p, const vl_optim_cfg *oc, int64_t t,
                          float grad_scale);
/* ---- the optimizer step shared by models (engine/nn/train.c) ----------------------- */
/* fp16 AMP's dynamic loss scale (PyTorch's GradScaler): the loss is multiplied by `scale`;
 * a step with a non-finite gradient is skipped and halves it; `window` good steps in a
 * row double it. Off (scale 1) for fp32/bf16. */
typedef struct {
  bool fp16;
  float scale;
  int window, good;
  int64_t t;          /* optimizer steps taken */
} vl_scaler;
void vl_scaler_init(vl_scaler *s, bool fp16, float init_scale, int window);
/* An overflow: halve the scale, drop the gradients. */
vl_status vl_scaler_skip(vl_ctx *c, vl_param *p, int n, vl_scaler *s);
vl_status vl_params_zero_grads(vl_ctx *c, vl_param *p, int n);
/* Global gradient norm (unscaled), overflow check (fp16: skip; otherwise VL_ERR_NUMERIC),
 * clip by global norm when clip > 0, update every trainable parameter, zero gradients. */
vl_status vl_params_apply(vl_ctx *c, vl_param *p, int n, const vl_optim_cfg *oc, float clip,
                          vl_scaler *s, bool *skipped, double *grad_norm);

/* Bytes of optimizer state per trainable element class, for reports. */
size_t vl_optim_state_bytes(const vl_optim_cfg *oc, int64_t rows, int64_t cols);

#ifdef __cplusplus
}
#endif
#endif
