/* CUDA backend, attention: softmax, rotary embedding and head permutes (at the end), and
 * memory-efficient attention (VL_OP_ATTN_FWD / VL_OP_ATTN_BWD): grid-stride
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

/* ---- softmax, rotary embedding, head permutes ------------------------------------------ */

__global__ void k_rope(void *x, int xdt, int64_t T, int64_t H, int64_t D, float theta,
                       int inverse, int64_t n) {
  GRID_STRIDE(i, n) vl_k_rope(x, xdt, T, H, D, theta, inverse, i);
}
__global__ void k_permute(void *y, const void *x, int xdt, int64_t T, int64_t H, int64_t D,
                          int back, int64_t n) {
  GRID_STRIDE(i, n) vl_k_permute(y, x, xdt, T, H, D, back, i);
}
__global__ void k_softmax_fwd(void *P, int pdt, const void *S, int sdt, int64_t T, float scale,
                              int causal, int64_t rows) {
  GRID_STRIDE(r, rows) vl_k_softmax_row(P, pdt, S, sdt, T, scale, causal, r);
}
__global__ void k_softmax_bwd(void *dS, int ddt, const void *dP, int dpdt, const void *P, int pdt,
                              int64_t T, float scale, int causal, int64_t rows) {
  GRID_STRIDE(r, rows) vl_k_softmax_bwd_row(dS, ddt, dP, dpdt, P, pdt, T, scale, causal, r);
}

static vl_status cu_rope(vl_ctx *c, vl_tensor *x, int64_t B, int64_t T, int64_t H, int64_t D,
                         float theta, bool inverse) {
  int64_t n = B * T * H * (D / 2);
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_rope, x->data, dt(x), T, H, D, theta, inverse ? 1 : 0, n);
  return VL_OK;
}

static vl_status cu_permute(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t B, int64_t T,
                            int64_t H, int64_t D, bool back) {
  if (y->dtype != x->dtype) return vl_fail(c, VL_ERR_INVALID, "permute: dtypes differ");
  int64_t n = B * T * H * D;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_permute, y->data, x->data, dt(x), T, H, D, back ? 1 : 0, n);
  return VL_OK;
}

static vl_status cu_softmax_fwd(vl_ctx *c, vl_tensor *P, const vl_tensor *S, int64_t rows,
                                int64_t T, float scale, bool causal) {
  if (rows > 0)
    LAUNCH(c, st(c), rows, VL_ROW_THREADS, k_softmax_fwd, P->data, dt(P), S->data, dt(S), T,
           scale, causal ? 1 : 0, rows);
  return VL_OK;
}

static vl_status cu_softmax_bwd(vl_ctx *c, vl_tensor *dS, const vl_tensor *dP, const vl_tensor *P,
                                int64_t rows, int64_t T, float scale, bool causal) {
  if (rows > 0)
    LAUNCH(c, st(c), rows, VL_ROW_THREADS, k_softmax_bwd, dS->data, dt(dS), dP->data, dt(dP),
           P->data, dt(P), T, scale, causal ? 1 : 0, rows);
  return VL_OK;
}

static vl_status op_rope(vl_ctx *c, const void *p) {
  ARGS(vl_rope_args);
  return cu_rope(c, a->x, a->B, a->T, a->H, a->D, a->theta, a->inverse);
}
static vl_status op_permute(vl_ctx *c, const void *p) {
  ARGS(vl_permute_args);
  return cu_permute(c, a->y, a->x, a->B, a->T, a->H, a->D, a->back);
}
static vl_status op_softmax_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_softmax_fwd_args);
  return cu_softmax_fwd(c, a->P, a->S, a->rows, a->T, a->scale, a->causal);
}
static vl_status op_softmax_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_softmax_bwd_args);
  return cu_softmax_bwd(c, a->dS, a->dP, a->P, a->rows, a->T, a->scale, a->causal);
}

void vl_cuda_attn_ops(vl_backend *b) {
  b->ops[VL_OP_ATTN_FWD] = op_attn_fwd;
  b->ops[VL_OP_ATTN_BWD] = op_attn_bwd;
  b->ops[VL_OP_ROPE] = op_rope;
  b->ops[VL_OP_PERMUTE] = op_permute;
  b->ops[VL_OP_SOFTMAX_FWD] = op_softmax_fwd;
  b->ops[VL_OP_SOFTMAX_BWD] = op_softmax_bwd;
}
