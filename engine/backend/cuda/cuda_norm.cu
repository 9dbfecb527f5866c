/* CUDA backend, RMSNorm, LayerNorm, GroupNorm and batch norm: grid-stride kernels, or one block per segment or channel over the
 * single-source bodies of engine/kernels/norm.h, the same bodies the CPU backend loops over
 * (cpu_norm.c). Arguments are checked by the operation's descriptor (engine/backend/ops.c)
 * before a kernel runs. */
#include <math.h>

#include "cuda_internal.h"
#include "cuda_reduce.h"
#include "../../kernels/norm.h"

__global__ void k_rmsnorm_fwd(void *out, int odt, float *rstd, const void *x, int xdt,
                              const void *w, int wdt, int64_t R, int64_t C, float eps) {
  GRID_STRIDE(r, R) vl_k_rmsnorm_fwd_row(out, odt, rstd, x, xdt, w, wdt, C, eps, r);
}
__global__ void k_rmsnorm_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *x,
                              int xdt, const void *w, int wdt, const float *rstd, int64_t R,
                              int64_t C) {
  GRID_STRIDE(r, R) vl_k_rmsnorm_bwd_row(dx, dxdt, dy, dydt, x, xdt, w, wdt, rstd, C, r);
}
__global__ void k_rmsnorm_dw(void *dw, int dwdt, const void *dy, int dydt, const void *x,
                             int xdt, const float *rstd, int64_t R, int64_t C) {
  GRID_STRIDE(k, C) vl_k_rmsnorm_dw_col(dw, dwdt, dy, dydt, x, xdt, rstd, R, C, k);
}

static vl_status cu_rmsnorm_fwd(vl_ctx *c, vl_tensor *out, vl_tensor *rstd, const vl_tensor *x,
                                const vl_tensor *w, int64_t R, int64_t C, float eps) {
  if (R > 0)
    LAUNCH(c, st(c), R, VL_ROW_THREADS, k_rmsnorm_fwd, out->data, dt(out), (float *)rstd->data,
           x->data, dt(x), w->data, dt(w), R, C, eps);
  return VL_OK;
}

static vl_status cu_rmsnorm_bwd(vl_ctx *c, vl_tensor *dx, vl_tensor *dw, const vl_tensor *dout,
                                const vl_tensor *x, const vl_tensor *w, const vl_tensor *rstd,
                                int64_t R, int64_t C) {
  if (R <= 0 || C <= 0) return VL_OK;
  cu_state *s = st(c);
  LAUNCH(c, s, R, VL_ROW_THREADS, k_rmsnorm_bwd, dx->data, dt(dx), dout->data, dt(dout), x->data,
         dt(x), w->data, dt(w), (const float *)rstd->data, R, C);
  if (dw)
    LAUNCH(c, s, C, VL_ROW_THREADS, k_rmsnorm_dw, dw->data, dt(dw), dout->data, dt(dout), x->data,
           dt(x), (const float *)rstd->data, R, C);
  return VL_OK;
}

static vl_status op_rmsnorm_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_rmsnorm_fwd_args);
  return cu_rmsnorm_fwd(c, a->out, a->rstd, a->x, a->w, a->R, a->C, a->eps);
}
static vl_status op_rmsnorm_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_rmsnorm_bwd_args);
  return cu_rmsnorm_bwd(c, a->dx, a->dw, a->dout, a->x, a->w, a->rstd, a->R, a->C);
}

__global__ void k_bn_train(void *y, int ydt, float *mean, float *rstd, float *rmean, float *rvar,
                           const void *x, int xdt, const void *gamma, int gdt, const void *beta,
                           int bdt, int64_t N, int64_t C, int64_t HW, float eps, float momentum) {
  __shared__ double sh[2][VL_THREADS];
  __shared__ vl_k_bn_affine aff;
  int64_t M = N * HW;
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    float K = vl_k_bn_shift(x, xdt, HW, c);
    double s1 = 0.0, s2 = 0.0;
    vl_k_bn_sums_strided(x, xdt, C, HW, M, c, K, threadIdx.x, blockDim.x, &s1, &s2);
    block_sum2(&s1, &s2, sh);
    if (threadIdx.x == 0)
      aff = vl_k_bn_train_finish(mean, rstd, rmean, rvar, gamma, gdt, beta, bdt, c, s1, s2, K, M,
                                 eps, momentum);
    __syncthreads();
    vl_k_bn_affine a = aff;
    vl_k_cpos p = vl_k_cpos_at(HW, threadIdx.x, blockDim.x);
    for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
      vl_k_bn_apply(y, ydt, x, xdt, a, vl_k_cpos_off(&p, C, HW, c));
      vl_k_cpos_next(&p, HW);
    }
    __syncthreads(); /* aff is rewritten by the next channel */
  }
}

__global__ void k_bn_bwd(void *dx, int dxdt, void *dgamma, int dgdt, void *dbeta, int dbdt,
                         const void *dy, int dydt, const void *x, int xdt, const void *gamma,
                         int gdt, const float *mean, const float *rstd, int64_t N, int64_t C,
                         int64_t HW) {
  __shared__ double sh[2][VL_THREADS];
  __shared__ vl_k_bn_grad grad;
  int64_t M = N * HW;
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double sg = 0.0, sgx = 0.0;
    vl_k_bn_bwd_sums_strided(dy, dydt, x, xdt, C, HW, M, c, mean[c], threadIdx.x, blockDim.x,
                             &sg, &sgx);
    block_sum2(&sg, &sgx, sh);
    if (threadIdx.x == 0)
      grad = vl_k_bn_bwd_finish(dgamma, dgdt, dbeta, dbdt, gamma, gdt, mean, rstd, c, sg, sgx, M);
    __syncthreads();
    vl_k_bn_grad k = grad;
    vl_k_cpos p = vl_k_cpos_at(HW, threadIdx.x, blockDim.x);
    for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
      vl_k_bn_bwd_apply(dx, dxdt, dy, dydt, x, xdt, k, vl_k_cpos_off(&p, C, HW, c));
      vl_k_cpos_next(&p, HW);
    }
    __syncthreads();
  }
}

__global__ void k_bn_eval(void *y, int ydt, const void *x, int xdt, const float *rmean,
                          const float *rvar, const void *gamma, int gdt, const void *beta, int bdt,
                          int64_t C, int64_t HW, float eps, int64_t n) {
  GRID_STRIDE(i, n)
  vl_k_bn_eval_elem(y, ydt, x, xdt, rmean, rvar, gamma, gdt, beta, bdt, C, HW, eps, i);
}

static vl_status cu_bn_fwd_train(vl_ctx *c, vl_tensor *y, vl_tensor *mean, vl_tensor *rstd,
                                 vl_tensor *rmean, vl_tensor *rvar, const vl_tensor *x,
                                 const vl_tensor *gamma, const vl_tensor *beta, int64_t N,
                                 int64_t C, int64_t HW, float eps, float momentum) {
  int64_t n = N * C * HW;
  if (n == 0) return VL_OK;
  cu_state *s = st(c);
  k_bn_train<<<chan_blocks(s, C), VL_THREADS, 0, s->stream>>>(
      y->data, dt(y), (float *)mean->data, (float *)rstd->data,
      rmean ? (float *)rmean->data : NULL, rvar ? (float *)rvar->data : NULL, x->data, dt(x),
      gamma->data, dt(gamma), beta->data, dt(beta), N, C, HW, eps, momentum);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

static vl_status cu_bn_fwd_eval(vl_ctx *c, vl_tensor *y, const vl_tensor *x, const vl_tensor *gamma,
                                const vl_tensor *beta, const vl_tensor *rmean,
                                const vl_tensor *rvar, int64_t N, int64_t C, int64_t HW,
                                float eps) {
  int64_t n = N * C * HW;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_bn_eval, y->data, dt(y), x->data, dt(x),
           (const float *)rmean->data, (const float *)rvar->data, gamma->data, dt(gamma),
           beta->data, dt(beta), C, HW, eps, n);
  return VL_OK;
}

static vl_status cu_bn_bwd(vl_ctx *c, vl_tensor *dx, vl_tensor *dgamma, vl_tensor *dbeta,
                           const vl_tensor *dy, const vl_tensor *x, const vl_tensor *gamma,
                           const vl_tensor *mean, const vl_tensor *rstd, int64_t N, int64_t C,
                           int64_t HW) {
  int64_t n = N * C * HW;
  if (n == 0) return VL_OK;
  cu_state *s = st(c);
  k_bn_bwd<<<chan_blocks(s, C), VL_THREADS, 0, s->stream>>>(
      dx->data, dt(dx), dgamma ? dgamma->data : NULL, dgamma ? dt(dgamma) : VL_K_F32,
      dbeta ? dbeta->data : NULL, dbeta ? dt(dbeta) : VL_K_F32, dy->data, dt(dy), x->data, dt(x),
      gamma->data, dt(gamma), (const float *)mean->data, (const float *)rstd->data, N, C, HW);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

static vl_status op_bn_fwd_train(vl_ctx *c, const void *p) {
  ARGS(vl_bn_fwd_train_args);
  return cu_bn_fwd_train(c, a->y, a->mean, a->rstd, a->rmean, a->rvar, a->x, a->gamma, a->beta,
                         a->N, a->C, a->HW, a->eps, a->momentum);
}
static vl_status op_bn_fwd_eval(vl_ctx *c, const void *p) {
  ARGS(vl_bn_fwd_eval_args);
  return cu_bn_fwd_eval(c, a->y, a->x, a->gamma, a->beta, a->rmean, a->rvar, a->N, a->C, a->HW,
                        a->eps);
}
static vl_status op_bn_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_bn_bwd_args);
  return cu_bn_bwd(c, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean, a->rstd, a->N,
                   a->C, a->HW);
}

/* ---- norms -------------------------------------------------------------------------------- */

/* A norm's segments: segment s is M contiguous elements at base(s), element j of channel
 * c0(s) + j/HW. GroupNorm: s = n*G + g, M = cpg*HW; LayerNorm: s = r, cpg = C, HW = 1. */
struct seg_geo {
  int64_t C, HW, G, cpg;
  __device__ int64_t base(int64_t s) const {
    int64_t n = s / G;
    return (n * C + (s - n * G) * cpg) * HW;
  }
  __device__ int64_t c0(int64_t s) const { return (s % G) * cpg; }
  __device__ int64_t M() const { return cpg * HW; }
};

__global__ void k_norm_fwd(void *y, int ydt, float *mean, float *rstd, const void *x, int xdt,
                           const void *gamma, int gdt, const void *beta, int bdt, seg_geo g,
                           int64_t S, float eps) {
  __shared__ double sh[2][SEG_THREADS];
  __shared__ vl_k_stat stat;
  int64_t M = g.M();
  for (int64_t s = blockIdx.x; s < S; s += gridDim.x) {
    int64_t base = g.base(s);
    float K = vl_ld(x, xdt, base);
    double s1 = 0.0, s2 = 0.0;
    vl_k_seg_sums_strided(x, xdt, base, M, K, threadIdx.x, SEG_THREADS, &s1, &s2);
    block_sum2<SEG_THREADS>(&s1, &s2, sh);
    if (threadIdx.x == 0) stat = vl_k_seg_finish(mean, rstd, s, s1, s2, K, M, eps);
    __syncthreads();
    vl_k_norm_fwd_strided(y, ydt, x, xdt, stat, gamma, gdt, beta, bdt, base, M, g.HW, g.c0(s),
                          threadIdx.x, SEG_THREADS);
    __syncthreads(); /* stat is rewritten by the next segment */
  }
}

/* dx of each segment; every thread finishes the same totals itself. */
__global__ void k_norm_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *x, int xdt,
                           const void *gamma, int gdt, const float *mean, const float *rstd,
                           seg_geo g, int64_t S, int acc) {
  __shared__ double sh[2][SEG_THREADS];
  int64_t M = g.M();
  for (int64_t s = blockIdx.x; s < S; s += gridDim.x) {
    int64_t base = g.base(s), c0 = g.c0(s);
    double sg = 0.0, sgx = 0.0;
    vl_k_norm_bwd_sums_strided(dy, dydt, x, xdt, gamma, gdt, base, M, g.HW, c0, mean[s],
                               threadIdx.x, SEG_THREADS, &sg, &sgx);
    block_sum2<SEG_THREADS>(&sg, &sgx, sh);
    vl_k_norm_grad k = vl_k_norm_bwd_finish(mean[s], rstd[s], sg, sgx, M);
    vl_k_norm_bwd_strided(dx, dxdt, dy, dydt, x, xdt, gamma, gdt, k, acc, base, M, g.HW, c0,
                          threadIdx.x, SEG_THREADS);
  }
}

/* GroupNorm's dgamma/dbeta: one block per channel over its N*HW positions. */
__global__ void k_gn_dgb(void *dgamma, int dgdt, void *dbeta, int dbdt, const void *dy, int dydt,
                         const void *x, int xdt, const float *mean, const float *rstd, int64_t N,
                         int64_t C, int64_t HW, int64_t G) {
  __shared__ double sh[2][SEG_THREADS];
  int64_t cpg = C / G, M = N * HW;
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double sb = 0.0, sgm = 0.0;
    vl_k_gn_dgb_strided(dy, dydt, x, xdt, mean, rstd, C, HW, M, G, cpg, c, threadIdx.x,
                        SEG_THREADS, &sb, &sgm);
    block_sum2<SEG_THREADS>(&sb, &sgm, sh);
    if (threadIdx.x == 0) vl_k_norm_dgb_finish(dgamma, dgdt, dbeta, dbdt, c, sb, sgm);
  }
}

/* LayerNorm's dgamma/dbeta: a column per threadIdx.x, rows strided over the lanes. */
__global__ void k_ln_dgb(void *dgamma, int dgdt, void *dbeta, int dbdt, const void *dy, int dydt,
                         const void *x, int xdt, const float *mean, const float *rstd, int64_t R,
                         int64_t C) {
  __shared__ double sh[2][COL_Y][COL_X];
  for (int64_t t0 = (int64_t)blockIdx.x * COL_X; t0 < C; t0 += (int64_t)gridDim.x * COL_X) {
    int64_t c = t0 + threadIdx.x;
    double sb = 0.0, sgm = 0.0;
    if (c < C)
      vl_k_ln_dgb_cols(dy, dydt, x, xdt, mean, rstd, R, C, c, 1, threadIdx.y, COL_Y, &sb, &sgm);
    lane_sum2(&sb, &sgm, sh);
    if (threadIdx.y == 0 && c < C) vl_k_norm_dgb_finish(dgamma, dgdt, dbeta, dbdt, c, sb, sgm);
  }
}

static vl_status op_groupnorm_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_groupnorm_fwd_args);
  int64_t n = a->N * a->C * a->HW;
  if (n == 0) return VL_OK;
  cu_state *s = st(c);
  seg_geo g = {a->C, a->HW, a->G, a->C / a->G};
  int64_t S = a->N * a->G;
  k_norm_fwd<<<seg_blocks(s, S), SEG_THREADS, 0, s->stream>>>(
      a->y->data, dt(a->y), (float *)a->mean->data, (float *)a->rstd->data, a->x->data, dt(a->x),
      a->gamma->data, dt(a->gamma), a->beta->data, dt(a->beta), g, S, a->eps);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

/* dx per segment, then dgamma/dbeta per channel (GroupNorm) or column (LayerNorm). */
static vl_status norm_bwd(vl_ctx *c, vl_tensor *dx, vl_tensor *dgamma, vl_tensor *dbeta,
                          const vl_tensor *dy, const vl_tensor *x, const vl_tensor *gamma,
                          const vl_tensor *mean, const vl_tensor *rstd, seg_geo g, int64_t N,
                          int64_t S, bool acc, bool layernorm) {
  cu_state *s = st(c);
  const float *pm = (const float *)mean->data, *pr = (const float *)rstd->data;
  k_norm_bwd<<<seg_blocks(s, S), SEG_THREADS, 0, s->stream>>>(
      dx->data, dt(dx), dy->data, dt(dy), x->data, dt(x), gamma->data, dt(gamma), pm, pr, g, S,
      acc ? 1 : 0);
  CU_CHECK(c, cudaGetLastError());
  if (!dgamma && !dbeta) return VL_OK;
  if (layernorm)
    k_ln_dgb<<<col_blocks(s, g.C), dim3(COL_X, COL_Y), 0, s->stream>>>(
        data_or_null(dgamma), dt_or_f32(dgamma), data_or_null(dbeta), dt_or_f32(dbeta), dy->data,
        dt(dy), x->data, dt(x), pm, pr, S, g.C);
  else
    k_gn_dgb<<<seg_blocks(s, g.C), SEG_THREADS, 0, s->stream>>>(
        data_or_null(dgamma), dt_or_f32(dgamma), data_or_null(dbeta), dt_or_f32(dbeta), dy->data,
        dt(dy), x->data, dt(x), pm, pr, N, g.C, g.HW, g.G);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

static vl_status op_groupnorm_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_groupnorm_bwd_args);
  int64_t n = a->N * a->C * a->HW;
  if (n == 0) return VL_OK;
  seg_geo g = {a->C, a->HW, a->G, a->C / a->G};
  return norm_bwd(c, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean, a->rstd, g, a->N,
                  a->N * a->G, a->accumulate, false);
}

static vl_status op_layernorm_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_layernorm_fwd_args);
  int64_t n = a->R * a->C;
  if (n == 0) return VL_OK;
  cu_state *s = st(c);
  seg_geo g = {a->C, 1, 1, a->C};
  k_norm_fwd<<<seg_blocks(s, a->R), SEG_THREADS, 0, s->stream>>>(
      a->y->data, dt(a->y), (float *)a->mean->data, (float *)a->rstd->data, a->x->data, dt(a->x),
      a->gamma->data, dt(a->gamma), a->beta->data, dt(a->beta), g, a->R, a->eps);
  CU_CHECK(c, cudaGetLastError());
  return VL_OK;
}

static vl_status op_layernorm_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_layernorm_bwd_args);
  int64_t n = a->R * a->C;
  if (n == 0) return VL_OK;
  seg_geo g = {a->C, 1, 1, a->C};
  return norm_bwd(c, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean, a->rstd, g, a->R,
                  a->R, a->accumulate, true);
}

void vl_cuda_norm_ops(vl_backend *b) {
  b->ops[VL_OP_RMSNORM_FWD] = op_rmsnorm_fwd;
  b->ops[VL_OP_RMSNORM_BWD] = op_rmsnorm_bwd;
  b->ops[VL_OP_BN_FWD_TRAIN] = op_bn_fwd_train;
  b->ops[VL_OP_BN_FWD_EVAL] = op_bn_fwd_eval;
  b->ops[VL_OP_BN_BWD] = op_bn_bwd;
  b->ops[VL_OP_GROUPNORM_FWD] = op_groupnorm_fwd;
  b->ops[VL_OP_GROUPNORM_BWD] = op_groupnorm_bwd;
  b->ops[VL_OP_LAYERNORM_FWD] = op_layernorm_fwd;
  b->ops[VL_OP_LAYERNORM_BWD] = op_layernorm_bwd;
}
