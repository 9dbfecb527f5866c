/* The argument checks of the operation descriptors (ops.c): one per operation that has
 * any, run by vl_op_run before the operation is counted or dispatched, on every backend,
 * the plan backend included, so a plan refuses what a run refuses with the same status
 * and message. They look at shapes, dtypes, sizes and aliasing; what only a backend knows
 * (its workspace layout, cuBLAS's operand mapping, ids out of range in device memory) the
 * backend still checks. A plan's tensors have no storage, which these allow. */
#ifndef VRAMLAB_OP_CHECKS_H
#define VRAMLAB_OP_CHECKS_H
#include "vramlab/ops.h"

vl_status vl_ck_embed_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_embed_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_xent_fused(vl_ctx *c, const void *args);
vl_status vl_ck_bn_fwd_train(vl_ctx *c, const void *args);
vl_status vl_ck_bn_fwd_eval(vl_ctx *c, const void *args);
vl_status vl_ck_bn_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_relu_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_relu_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_maxpool_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_maxpool_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_upsample2x_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_upsample2x_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_chan_copy(vl_ctx *c, const void *args);
vl_status vl_ck_xent_pix(vl_ctx *c, const void *args);
vl_status vl_ck_groupnorm_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_groupnorm_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_layernorm_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_layernorm_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_act_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_act_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_geglu_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_geglu_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_bias_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_bias_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_pad2d_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_pad2d_bwd(vl_ctx *c, const void *args);
vl_status vl_ck_timestep_embed(vl_ctx *c, const void *args);
vl_status vl_ck_mse_fused(vl_ctx *c, const void *args);
vl_status vl_ck_gauss_sample(vl_ctx *c, const void *args);
vl_status vl_ck_attn_fwd(vl_ctx *c, const void *args);
vl_status vl_ck_attn_bwd(vl_ctx *c, const void *args);

#endif
