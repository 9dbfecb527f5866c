/* The CPU backend's ops that live outside cpu_backend.c: cpu_gemm.c (OpenBLAS sgemm),
 * cpu_conv.c (oneDNN convolutions), cpu_cnn.c (loops over engine/kernels/cnn.h), cpu_sd.c
 * and cpu_attn.c. Each kernel takes its op's argument struct (vramlab/ops.h); each file
 * registers its kernels in the table of vl_backend_cpu(). */
#ifndef VRAMLAB_CPU_INTERNAL_H
#define VRAMLAB_CPU_INTERNAL_H
#include "vramlab/backend.h"
#include "../be_common.h"

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

/* ---- the kernels ---------------------------------------------------------------------------
 * Each file puts its kernels in the backend's table itself, b->ops[VL_OP_...] = kernel, as
 * the CUDA backend's files do; vl_backend_cpu() (cpu_backend.c) builds the table once. */
void vl_cpu_gemm_ops(vl_backend *b); /* cpu_gemm.c: GEMM (OpenBLAS) */
void vl_cpu_conv_ops(vl_backend *b); /* cpu_conv.c: convolutions (oneDNN) */
void vl_cpu_cnn_ops(vl_backend *b);  /* cpu_cnn.c: batch norm, ReLU, pooling, upsampling, ... */
void vl_cpu_sd_ops(vl_backend *b);   /* cpu_sd.c: norms, activations, bias, padding, ... */
void vl_cpu_attn_ops(vl_backend *b); /* cpu_attn.c: memory-efficient attention */
#endif
