/* What the CPU backend's files share. cpu_backend.c holds the backend itself (memory, timers,
 * the op table); the operations live one family per file: cpu_gemm.c (OpenBLAS sgemm),
 * cpu_conv.c (oneDNN convolutions), and cpu_<family>.c looping over the single-source bodies
 * of engine/kernels/<family>.h. Each kernel takes its op's argument struct (vramlab/ops.h);
 * each file registers its kernels in the table of vl_backend_cpu(). */
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

/* ---- what the kernel files share ----------------------------------------------------------- */

#define F32 VL_K_F32
#define INLINE static inline __attribute__((always_inline))
#define COLS 16 /* columns per column block (norms, bias, embedding dw): a cache line of fp32 */

static inline bool all_f32(const vl_tensor *a, const vl_tensor *b, const vl_tensor *c) {
  return a->dtype == VL_F32 && b->dtype == VL_F32 && (!c || c->dtype == VL_F32);
}

/* The dtype a, b and c (c may be NULL) share, or -1. */
static inline int same_dt(const vl_tensor *a, const vl_tensor *b, const vl_tensor *c) {
  return a->dtype == b->dtype && (!c || c->dtype == a->dtype) ? dt(a) : -1;
}

/* LOOP(A, B, C) with the dtypes of three tensors (the third may be NULL: C is then A):
 * compile-time constants when they share fp32, fp16 or bf16, else their runtime values. Each
 * op names its loop after itself (GN_FWD_LOOP, DB_COLS_LOOP, ...) and parallelises it with
 * PAR_FOR, over a count named n. */
#define PAR_FOR _Pragma("omp parallel for num_threads(vl_cpu_threads((double)n * NS_ROW))")
#define DISPATCH(ta, tb, tc, LOOP)                                                         \
  do {                                                                                     \
    switch (same_dt((ta), (tb), (tc))) {                                                   \
    case VL_K_F32: LOOP(VL_K_F32, VL_K_F32, VL_K_F32); break;                              \
    case VL_K_F16: LOOP(VL_K_F16, VL_K_F16, VL_K_F16); break;                              \
    case VL_K_BF16: LOOP(VL_K_BF16, VL_K_BF16, VL_K_BF16); break;                          \
    default: LOOP(dt(ta), dt(tb), ((tc) ? dt(tc) : dt(ta))); break;                        \
    }                                                                                      \
  } while (0)

/* An op table entry that hands its argument struct (vramlab/ops.h) to cpu_<name>. */
#define CPU_ENTRY(name, type)                                                              \
  static vl_status vl_cpu_##name(vl_ctx *c, const void *p) {                               \
    return cpu_##name(c, (const type *)p);                                                 \
  }

/* ---- the kernels ---------------------------------------------------------------------------
 * Each file puts its kernels in the backend's table itself, b->ops[VL_OP_...] = kernel, as
 * the CUDA backend's files do; vl_backend_cpu() (cpu_backend.c) builds the table once. */
void vl_cpu_gemm_ops(vl_backend *b);  /* cpu_gemm.c: GEMM (OpenBLAS) */
void vl_cpu_conv_ops(vl_backend *b);  /* cpu_conv.c: convolutions (oneDNN) */
void vl_cpu_norm_ops(vl_backend *b);  /* cpu_norm.c: RMSNorm, LayerNorm, GroupNorm, batch norm */
void vl_cpu_act_ops(vl_backend *b);   /* cpu_act.c: copies, axpby, activations, bias, ... */
void vl_cpu_attn_ops(vl_backend *b);  /* cpu_attn.c: attention, softmax, RoPE, permutes */
void vl_cpu_pool_ops(vl_backend *b);  /* cpu_pool.c: pooling, upsampling, padding, concat */
void vl_cpu_loss_ops(vl_backend *b);  /* cpu_loss.c: cross-entropies, MSE */
void vl_cpu_embed_ops(vl_backend *b); /* cpu_embed.c: token and timestep embeddings */
void vl_cpu_optim_ops(vl_backend *b); /* cpu_optim.c: optimizers, sum of squares */
#endif
