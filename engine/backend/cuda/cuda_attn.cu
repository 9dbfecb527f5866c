/* CUDA backend, memory-efficient attention (VL_OP_ATTN_FWD / VL_OP_ATTN_BWD): grid-stride
 * kernels over the single-source bodies of engine/kernels/attn.h, the bodies the CPU backend
 * loops over (docs/architecture.md "The CUDA backend must be verifiable without a GPU").
 * Arguments are checked by the operation's descriptor (engine/backend/ops.c) before a kernel
 * runs, on every backend; the backward's workspace here (attn_args.h).
 *
 * One thread per query row (forward, delta, dq) or key row (dk, dv): straightforward, not
 * fast (no tensor cores, no tiling across threads). Each thread's fp32 scratch (the body's
 * VL_K_ATTN_WS_* floats) lives in dynamic shared memory, interleaved across the block's
 * threads (element x of thread t at sh[x * blockDim.x + t]: no bank conflicts), so nothing
 * spills to local memory, which the driver would reserve for every resident thread outside
 * the arena. The block size is the pure vl_attn_cuda_threads (attn_args.h, CPU-tested): as
 * many threads as 48 KiB of shared memory holds, at most 128.
 *
 * Determinism: one thread writes each output row, every sum in the body's fixed order. */
#include "cuda_internal.h"
#include "../attn_args.h"
#include "../../kernels/attn.h"

/* ---- kernels ---------------------------------------------------------------------------- */

__global__ void k_attn_fwd(void *o, int odt, float *lse, const void *q, int qdt, const void *k,
                           int kdt, const void *v, int vdt, vl_k_attn_dims s, int64_t rows) {
  extern __shared__ float attn_sh[];
  float *w = attn_sh + threadIdx.x;
  GRID_STRIDE(r, rows)
  vl_k_attn_fwd_row(o, odt, lse, q, qdt, k, kdt, v, vdt, s, w, (int64_t)blockDim.x, r);
}

__global__ void k_attn_delta(float *delta, const void *dout, int ddt, const void *o, int odt,
                             vl_k_attn_dims s, int64_t rows) {
  GRID_STRIDE(r, rows) vl_k_attn_delta_row(delta, dout, ddt, o, odt, s, r);
}

__global__ void k_attn_dq(void *dq, int dqdt, const void *dout, int ddt, const float *lse,
                          const float *delta, const void *q, int qdt, const void *k, int kdt,
                          const void *v, int vdt, vl_k_attn_dims s, int64_t rows) {
  extern __shared__ float attn_sh[];
  float *w = attn_sh + threadIdx.x;
  GRID_STRIDE(r, rows)
  vl_k_attn_dq_row(dq, dqdt, dout, ddt, lse, delta, q, qdt, k, kdt, v, vdt, s, w,
                   (int64_t)blockDim.x, r);
}

__global__ void k_attn_dkdv(void *dk, int dkdt, void *dv, int dvdt, const void *dout, int ddt,
                            const float *lse, const float *delta, const void *q, int qdt,
                            const void *k, int kdt, const void *v, int vdt, vl_k_attn_dims s,
                            int64_t krows) {
  extern __shared__ float attn_sh[];
  float *w = attn_sh + threadIdx.x;
  GRID_STRIDE(r, krows)
  vl_k_attn_dkdv_row(dk, dkdt, dv, dvdt, dout, ddt, lse, delta, q, qdt, k, kdt, v, vdt, s, w,
                     (int64_t)blockDim.x, r);
}

/* ---- ops --------------------------------------------------------------------------------- */

/* Launch geometry of a kernel whose threads each keep `floats` of scratch in shared memory. */
typedef struct {
  int blocks, threads;
  size_t smem;
} geom;

static geom geom_of(const cu_state *s, int64_t n, int64_t floats) {
  geom g;
  g.threads = vl_attn_cuda_threads(floats);
  g.smem = (size_t)g.threads * (size_t)floats * sizeof(float);
  vl_cuda_grid(n, g.threads, s->max_blocks, &g.blocks);
  return g;
}

static vl_k_attn_dims dims_of(int64_t H, int64_t Tq, int64_t Tk, int64_t D, float scale,
                              bool causal) {
  vl_k_attn_dims s = {H, Tq, Tk, D, scale, causal ? 1 : 0};
  return s;
}

static vl_status op_attn_fwd(vl_ctx *c, const void *p) {
  const vl_attn_fwd_args *a = (const vl_attn_fwd_args *)p;
  int64_t rows = a->B * a->H * a->Tq;
  cu_state *s = st(c);
  vl_k_attn_dims d = dims_of(a->H, a->Tq, a->Tk, a->D, a->scale, a->causal);
  geom g = geom_of(s, rows, VL_K_ATTN_WS_FWD(a->D));
  k_attn_fwd<<<g.blocks, g.threads, g.smem, s->stream>>>(
      a->o->data, dt(a->o), (float *)a->lse->data, a->q->data, dt(a->q), a->k->data, dt(a->k),
      a->v->data, dt(a->v), d, rows);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

static vl_status op_attn_bwd(vl_ctx *c, const void *p) {
  const vl_attn_bwd_args *a = (const vl_attn_bwd_args *)p;
  VL_TRY(vl_attn_check_ws(c, a));
  int64_t rows = a->B * a->H * a->Tq;
  cu_state *s = st(c);
  int64_t krows = a->B * a->H * a->Tk;
  vl_k_attn_dims d = dims_of(a->H, a->Tq, a->Tk, a->D, a->scale, a->causal);
  float *delta = (float *)a->ws; /* (B, H, Tq) */
  const float *lse = (const float *)a->lse->data;
  LAUNCH(c, s, rows, VL_ROW_THREADS, k_attn_delta, delta, a->dout->data, dt(a->dout),
         a->o->data, dt(a->o), d, rows);
  geom g = geom_of(s, rows, VL_K_ATTN_WS_DQ(a->D));
  k_attn_dq<<<g.blocks, g.threads, g.smem, s->stream>>>(
      a->dq->data, dt(a->dq), a->dout->data, dt(a->dout), lse, delta, a->q->data, dt(a->q),
      a->k->data, dt(a->k), a->v->data, dt(a->v), d, rows);
  CU_CHECK(c, cudaGetLastError());
  g = geom_of(s, krows, VL_K_ATTN_WS_DKDV(a->D));
  k_attn_dkdv<<<g.blocks, g.threads, g.smem, s->stream>>>(
      a->dk->data, dt(a->dk), a->dv->data, dt(a->dv), a->dout->data, dt(a->dout), lse, delta,
      a->q->data, dt(a->q), a->k->data, dt(a->k), a->v->data, dt(a->v), d, krows);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

void vl_cuda_attn_ops(vl_backend *b) {
  b->ops[VL_OP_ATTN_FWD] = op_attn_fwd;
  b->ops[VL_OP_ATTN_BWD] = op_attn_bwd;
}
