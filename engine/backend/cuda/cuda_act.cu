/* CUDA backend, copies, conversions, axpby, activations, SwiGLU, GEGLU, bias and the Gaussian sample: grid-stride kernels over the
 * single-source bodies of engine/kernels/act.h, the same bodies the CPU backend loops over
 * (cpu_act.c). Arguments are checked by the operation's descriptor (engine/backend/ops.c)
 * before a kernel runs. */
#include <math.h>

#include "cuda_internal.h"
#include "cuda_reduce.h"
#include "../../kernels/act.h"

/* The operations are reached through the op table at the end (make_backend), whose entries
 * unpack each op's argument struct (vramlab/ops.h) into the cu_* functions below. */

/* ---- kernels: thin grid-stride wrappers over the single-source bodies -------------------- */

__global__ void k_convert(void *y, int ydt, const void *x, int xdt, int64_t n) {
  GRID_STRIDE(i, n) vl_k_convert(y, ydt, x, xdt, i);
}
__global__ void k_axpby(void *y, int ydt, float a, const void *x, int xdt, float b, int64_t n) {
  GRID_STRIDE(i, n) vl_k_axpby(y, ydt, a, x, xdt, b, i);
}

__global__ void k_swiglu_fwd(void *out, int odt, const void *g, const void *u, int gdt,
                             int64_t n) {
  GRID_STRIDE(i, n) vl_k_swiglu_fwd(out, odt, g, u, gdt, i);
}
__global__ void k_swiglu_bwd(void *dg, void *du, int ddt, const void *dout, int odt,
                             const void *g, const void *u, int gdt, int64_t n) {
  GRID_STRIDE(i, n) vl_k_swiglu_bwd(dg, du, ddt, dout, odt, g, u, gdt, i);
}

/* ---- element-wise and row-wise ops ------------------------------------------------------ */

static vl_status cu_zero(vl_ctx *c, vl_tensor *y) {
  CU_CHECK(c, cudaMemsetAsync(y->data, 0, y->bytes, st(c)->stream));
  return VL_OK;
}

static vl_status cu_convert(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n) {
  if (n > 0) LAUNCH(c, st(c), n, VL_THREADS, k_convert, y->data, dt(y), x->data, dt(x), n);
  return VL_OK;
}

static vl_status cu_axpby(vl_ctx *c, vl_tensor *y, float a, const vl_tensor *x, float b,
                          int64_t n) {
  if (n > 0) LAUNCH(c, st(c), n, VL_THREADS, k_axpby, y->data, dt(y), a, x->data, dt(x), b, n);
  return VL_OK;
}

static vl_status cu_swiglu_fwd(vl_ctx *c, vl_tensor *out, const vl_tensor *g, const vl_tensor *u,
                               int64_t n) {
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_swiglu_fwd, out->data, dt(out), g->data, u->data, dt(g), n);
  return VL_OK;
}

static vl_status cu_swiglu_bwd(vl_ctx *c, vl_tensor *dg, vl_tensor *du, const vl_tensor *dout,
                               const vl_tensor *g, const vl_tensor *u, int64_t n) {
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_swiglu_bwd, dg->data, du->data, dt(dg), dout->data,
           dt(dout), g->data, u->data, dt(g), n);
  return VL_OK;
}

static vl_status op_zero(vl_ctx *c, const void *p) { ARGS(vl_zero_args); return cu_zero(c, a->y); }
static vl_status op_convert(vl_ctx *c, const void *p) {
  ARGS(vl_convert_args);
  return cu_convert(c, a->y, a->x, a->n);
}
static vl_status op_axpby(vl_ctx *c, const void *p) {
  ARGS(vl_axpby_args);
  return cu_axpby(c, a->y, a->a, a->x, a->b, a->n);
}

static vl_status op_swiglu_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_swiglu_fwd_args);
  return cu_swiglu_fwd(c, a->out, a->g, a->u, a->n);
}
static vl_status op_swiglu_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_swiglu_bwd_args);
  return cu_swiglu_bwd(c, a->dg, a->du, a->dout, a->g, a->u, a->n);
}

/* ---- element / plane kernels ----------------------------------------------------------- */

__global__ void k_relu_fwd(void *y, int ydt, const void *x, int xdt, int64_t n) {
  GRID_STRIDE(i, n) vl_k_relu_fwd(y, ydt, x, xdt, i);
}
__global__ void k_relu_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *y, int ydt,
                           int64_t n) {
  GRID_STRIDE(i, n) vl_k_relu_bwd(dx, dxdt, dy, dydt, y, ydt, i);
}

static vl_status cu_relu_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n) {
  if (n > 0) LAUNCH(c, st(c), n, VL_THREADS, k_relu_fwd, y->data, dt(y), x->data, dt(x), n);
  return VL_OK;
}

static vl_status cu_relu_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *y,
                             int64_t n) {
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_relu_bwd, dx->data, dt(dx), dy->data, dt(dy), y->data, dt(y),
           n);
  return VL_OK;
}

static vl_status op_relu_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_relu_fwd_args);
  return cu_relu_fwd(c, a->y, a->x, a->n);
}
static vl_status op_relu_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_relu_bwd_args);
  return cu_relu_bwd(c, a->dx, a->dy, a->y, a->n);
}

/* ---- bias gradient, MSE ------------------------------------------------------------------- */

/* db[q], one block each: per_outer plane q = (o, c) of `inner` elements, else channel q over
 * its outer*inner positions. */
__global__ void k_bias_bwd(void *db, int dbdt, const void *dy, int dydt, int64_t outer, int64_t C,
                           int64_t inner, int per_outer, int acc, int64_t nb) {
  __shared__ double sh[2][SEG_THREADS];
  for (int64_t q = blockIdx.x; q < nb; q += gridDim.x) {
    double s = per_outer ? vl_k_bias_sum_strided(dy, dydt, q * inner, 1, inner, inner, 0,
                                                 threadIdx.x, SEG_THREADS)
                         : vl_k_bias_sum_strided(dy, dydt, 0, C, inner, outer * inner, q,
                                                 threadIdx.x, SEG_THREADS);
    double unused = 0.0;
    block_sum2<SEG_THREADS>(&s, &unused, sh);
    if (threadIdx.x == 0) vl_k_bias_bwd_store(db, dbdt, q, s, acc);
  }
}

/* db (C) of a (R, C) gradient (a linear layer's bias): the column kernel. */
__global__ void k_bias_bwd_cols(void *db, int dbdt, const void *dy, int dydt, int64_t R, int64_t C,
                                int acc) {
  __shared__ double sh[2][COL_Y][COL_X];
  for (int64_t t0 = (int64_t)blockIdx.x * COL_X; t0 < C; t0 += (int64_t)gridDim.x * COL_X) {
    int64_t c = t0 + threadIdx.x;
    double s = 0.0, unused = 0.0;
    if (c < C) vl_k_colsum(dy, dydt, R, C, c, 1, threadIdx.y, COL_Y, &s);
    lane_sum2(&s, &unused, sh);
    if (threadIdx.y == 0 && c < C) vl_k_bias_bwd_store(db, dbdt, c, s, acc);
  }
}

/* ---- element-wise ------------------------------------------------------------------------- */

__global__ void k_act_fwd(void *y, int ydt, const void *x, int xdt, int act, int64_t n) {
  GRID_STRIDE(i, n) vl_k_act_fwd(y, ydt, x, xdt, act, i);
}
__global__ void k_act_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *x, int xdt,
                          int act, int64_t n) {
  GRID_STRIDE(i, n) vl_k_act_bwd(dx, dxdt, dy, dydt, x, xdt, act, i);
}
__global__ void k_geglu_fwd(void *out, int odt, const void *h, int hdt, int64_t F, int64_t n) {
  GRID_STRIDE(i, n) vl_k_geglu_fwd(out, odt, h, hdt, F, i);
}
__global__ void k_geglu_bwd(void *dh, int dhdt, const void *dout, int ddt, const void *h, int hdt,
                            int64_t F, int64_t n) {
  GRID_STRIDE(i, n) vl_k_geglu_bwd(dh, dhdt, dout, ddt, h, hdt, F, i);
}
__global__ void k_bias_fwd(void *y, int ydt, const void *b, int bdt, int64_t C, int64_t inner,
                           int per_outer, int64_t n) {
  GRID_STRIDE(i, n) vl_k_bias_fwd(y, ydt, b, bdt, C, inner, per_outer, i);
}

__global__ void k_gauss(void *z, int zdt, const void *mom, int mdt, const void *noise, int ndt,
                        int64_t C, int64_t HW, float scale, int64_t n) {
  GRID_STRIDE(i, n) vl_k_gauss_sample(z, zdt, mom, mdt, noise, ndt, C, HW, scale, i);
}

static vl_status op_act_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_act_fwd_args);
  if (a->n > 0)
    LAUNCH(c, st(c), a->n, VL_THREADS, k_act_fwd, a->y->data, dt(a->y), a->x->data, dt(a->x),
           (int)a->act, a->n);
  return VL_OK;
}

static vl_status op_act_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_act_bwd_args);
  if (a->n > 0)
    LAUNCH(c, st(c), a->n, VL_THREADS, k_act_bwd, a->dx->data, dt(a->dx), a->dy->data, dt(a->dy),
           a->x->data, dt(a->x), (int)a->act, a->n);
  return VL_OK;
}

static vl_status op_geglu_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_geglu_fwd_args);
  int64_t n = a->R * a->F;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_geglu_fwd, a->out->data, dt(a->out), a->h->data, dt(a->h),
           a->F, n);
  return VL_OK;
}

static vl_status op_geglu_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_geglu_bwd_args);
  int64_t n = a->R * a->F;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_geglu_bwd, a->dh->data, dt(a->dh), a->dout->data,
           dt(a->dout), a->h->data, dt(a->h), a->F, n);
  return VL_OK;
}

static vl_status op_bias_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_bias_fwd_args);
  int64_t n = a->outer * a->C * a->inner;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_bias_fwd, a->y->data, dt(a->y), a->b->data, dt(a->b), a->C,
           a->inner, a->per_outer ? 1 : 0, n);
  return VL_OK;
}

static vl_status op_bias_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_bias_bwd_args);
  int64_t n = a->outer * a->C * a->inner, nb = (a->per_outer ? a->outer : 1) * a->C;
  if (nb == 0) return VL_OK;
  cu_state *s = st(c);
  const void *pdy = n ? a->dy->data : NULL;
  int acc = a->accumulate ? 1 : 0;
  if (!a->per_outer && a->inner == 1)
    k_bias_bwd_cols<<<col_blocks(s, a->C), dim3(COL_X, COL_Y), 0, s->stream>>>(
        a->db->data, dt(a->db), pdy, dt(a->dy), a->outer, a->C, acc);
  else
    k_bias_bwd<<<seg_blocks(s, nb), SEG_THREADS, 0, s->stream>>>(
        a->db->data, dt(a->db), pdy, dt(a->dy), a->outer, a->C, a->inner, a->per_outer ? 1 : 0,
        acc, nb);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

static vl_status op_gauss_sample(vl_ctx *c, const void *p) {
  ARGS(vl_gauss_sample_args);
  int64_t n = a->N * a->C * a->HW;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_gauss, a->z->data, dt(a->z), a->moments->data,
           dt(a->moments), a->noise->data, dt(a->noise), a->C, a->HW, a->scale, n);
  return VL_OK;
}

void vl_cuda_act_ops(vl_backend *b) {
  b->ops[VL_OP_ZERO] = op_zero;
  b->ops[VL_OP_CONVERT] = op_convert;
  b->ops[VL_OP_AXPBY] = op_axpby;
  b->ops[VL_OP_SWIGLU_FWD] = op_swiglu_fwd;
  b->ops[VL_OP_SWIGLU_BWD] = op_swiglu_bwd;
  b->ops[VL_OP_RELU_FWD] = op_relu_fwd;
  b->ops[VL_OP_RELU_BWD] = op_relu_bwd;
  b->ops[VL_OP_ACT_FWD] = op_act_fwd;
  b->ops[VL_OP_ACT_BWD] = op_act_bwd;
  b->ops[VL_OP_GEGLU_FWD] = op_geglu_fwd;
  b->ops[VL_OP_GEGLU_BWD] = op_geglu_bwd;
  b->ops[VL_OP_BIAS_FWD] = op_bias_fwd;
  b->ops[VL_OP_BIAS_BWD] = op_bias_bwd;
  b->ops[VL_OP_GAUSS_SAMPLE] = op_gauss_sample;
}
