/* The CPU backend's ops that live outside cpu_backend.c: cpu_gemm.c (OpenBLAS sgemm),
 * cpu_conv.c (oneDNN convolutions), cpu_cnn.c (loops over engine/kernels/cnn.h), cpu_sd.c
 * and cpu_attn.c. Each takes its op's argument struct
 * (vramlab/ops.h) and sits in vl_backend_cpu.ops. */
#ifndef VRAMLAB_CPU_INTERNAL_H
#define VRAMLAB_CPU_INTERNAL_H
#include "vramlab/backend.h"

/* ---- threads (cpu_par.c) ----------------------------------------------------------------
 * A parallel region costs a fork and a join: microseconds on idle cores, up to a scheduler
 * time slice (milliseconds) when the cores are shared and a worker is not running. So an
 * op's loop forks only when its estimated serial time, the element count times a rough cost
 * per element of the loop's kind (one Zen 4 core, from the per-op profile; only the order
 * of magnitude matters), saves more than forking costs on this machine now (cpu_par.c). */
#define NS_MEM 0.2   /* copy, conversion, axpby, sum of squares: memory-bound */
#define NS_ROW 0.5   /* one pass of a row-wise norm or a softmax backward */
#define NS_EXP 3.0   /* an exp (softmax, SiLU, cross-entropy) per element */
#define NS_OPT 3.0   /* an optimizer update: four arrays streamed, a square root, a divide */
#define NS_TRIG 25.0 /* a powf, a sinf and a cosf (a rotary angle) */
#define NS_FLOP 0.01 /* a GEMM: about 100 GFLOP/s on one core */
/* Loops shorter than this never fork (idle-machine fork and join: a few microseconds). */
#define VL_CPU_PAR_NS 30e3
/* The team size (omp_get_max_threads, 1 inside a parallel region). */
int vl_cpu_team(void);
/* Threads for a loop whose serial run takes about ns nanoseconds: the team or 1. */
int vl_cpu_threads(double ns);
/* A forked region's wall time and its master thread's own share of it, in seconds: what
 * the fork cost, for the next decisions. */
void vl_cpu_par_observe(double wall, double own);
/* A library (oneDNN) just ran its own parallel region: its workers are awake. */
void vl_cpu_par_warm(void);
/* Tests: every later decision is min(n, team) threads; 0 restores the measured policy. */
void vl_cpu_threads_force(int n);

vl_status vl_cpu_gemm(vl_ctx *c, const void *args);            /* vl_gemm (cpu_gemm.c) */
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
