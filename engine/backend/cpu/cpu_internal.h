/* The CPU backend's ops that live outside cpu_backend.c: cpu_conv.c (oneDNN convolutions)
 * cpu_cnn.c (loops over engine/kernels/cnn.h), cpu_sd.c and cpu_attn.c. Each takes its op's argument struct
 * (vramlab/ops.h) and sits in vl_backend_cpu.ops. */
#ifndef VRAMLAB_CPU_INTERNAL_H
#define VRAMLAB_CPU_INTERNAL_H
#include "vramlab/backend.h"

vl_status vl_cpu_conv_fwd(vl_ctx *c, const void *args);        /* vl_conv_fwd_args */
vl_status vl_cpu_conv_bwd_data(vl_ctx *c, const void *args);   /* vl_conv_bwd_data_args */
vl_status vl_cpu_conv_bwd_weight(vl_ctx *c, const void *args); /* vl_conv_bwd_weight_args */

vl_status vl_cpu_bn_fwd_train(vl_ctx *c, const void *args);
vl_status vl_cpu_bn_fwd_eval(vl_ctx *c, const void *args);
vl_status vl_cpu_bn_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_relu_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_relu_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_maxpool_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_maxpool_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_upsample2x_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_upsample2x_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_chan_copy(vl_ctx *c, const void *args);
vl_status vl_cpu_xent_pix(vl_ctx *c, const void *args);

/* cpu_sd.c: Stable Diffusion's norms, activations, bias, padding, timestep embedding, MSE,
 * Gaussian sample (engine/kernels/sd.h) */
vl_status vl_cpu_groupnorm_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_groupnorm_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_layernorm_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_layernorm_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_act_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_act_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_geglu_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_geglu_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_bias_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_bias_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_pad2d_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_pad2d_bwd(vl_ctx *c, const void *args);
vl_status vl_cpu_timestep_embed(vl_ctx *c, const void *args);
vl_status vl_cpu_mse_fused(vl_ctx *c, const void *args);
vl_status vl_cpu_gauss_sample(vl_ctx *c, const void *args);
/* cpu_attn.c: memory-efficient attention (engine/kernels/attn.h) */
vl_status vl_cpu_attn_fwd(vl_ctx *c, const void *args);
vl_status vl_cpu_attn_bwd(vl_ctx *c, const void *args);
#endif
