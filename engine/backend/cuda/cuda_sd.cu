/* CUDA backend, Stable Diffusion's ops: kernels over the single-source bodies of
 * engine/kernels/sd.h, the bodies the CPU backend loops over (cpu_sd.c; docs/architecture.md
 * "The CUDA backend must be verifiable without a GPU"). Arguments are checked by the
 * operation's descriptor (engine/backend/ops.c) before a kernel runs, on every backend.
 *
 * Reductions take one block per segment: a GroupNorm group (n, g), a LayerNorm row, a
 * channel's dgamma/dbeta or bias gradient, an MSE row (a grid-stride loop over segments at
 * block granularity). Each thread sums a strided subset of the segment with the sd.h
 * strided body, a fixed-shape tree in shared memory adds the partial sums (deterministic
 * for a given block size), and the block then writes the segment's outputs with the same
 * finish and apply bodies as the CPU. Column sums over rows (LayerNorm's dgamma/dbeta, a
 * linear layer's bias gradient) take 32 x 8 blocks: 32 adjacent columns (coalesced rows),
 * 8 row lanes added by a tree. No atomics, no scratch memory; test_sd_ops runs these
 * compositions on the CPU against the CPU forms, gpu-check compares on a device.
 *
 * Element-wise ops (activations, GEGLU, bias, padding, timestep embedding, the Gaussian
 * sample) are grid-stride kernels over the per-index bodies. Timesteps are a VL_I32 tensor
 * in device memory. */
#include "cuda_internal.h"
#include "../../kernels/sd.h"

#define SEG_THREADS VL_THREADS /* one block per norm segment / channel / MSE row */
#define COL_X 32               /* column kernels: columns per block ... */
#define COL_Y 8                /* ... and row lanes */

/* Sum a and b over the block (blockDim.x == NT, a power of two); the totals are returned to
 * every thread. Ends with a barrier, so sh may be reused at once. */
template <int NT>
__device__ static void block_sum2(double *a, double *b, double (*sh)[NT]) {
  int t = (int)threadIdx.x;
  sh[0][t] = *a;
  sh[1][t] = *b;
  __syncthreads();
  for (int k = NT / 2; k > 0; k >>= 1) {
    if (t < k) { sh[0][t] += sh[0][t + k]; sh[1][t] += sh[1][t + k]; }
    __syncthreads();
  }
  *a = sh[0][0];
  *b = sh[1][0];
  __syncthreads();
}

/* The same over the COL_Y row lanes (threadIdx.y) of a COL_X x COL_Y block, per column
 * threadIdx.x; the totals land in lane 0. */
__device__ static void lane_sum2(double *a, double *b, double (*sh)[COL_Y][COL_X]) {
  int x = (int)threadIdx.x, y = (int)threadIdx.y;
  sh[0][y][x] = *a;
  sh[1][y][x] = *b;
  __syncthreads();
  for (int k = COL_Y / 2; k > 0; k >>= 1) {
    if (y < k) { sh[0][y][x] += sh[0][y + k][x]; sh[1][y][x] += sh[1][y + k][x]; }
    __syncthreads();
  }
  *a = sh[0][0][x];
  *b = sh[1][0][x];
  __syncthreads();
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

/* One block per row: each element's square into the sum and its gradient in place. */
__global__ void k_mse(void *pred, int pdt, float *loss, const void *target, int tdt, int64_t R,
                      int64_t C, float scale) {
  __shared__ double sh[2][SEG_THREADS];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    double s = 0.0, unused = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += SEG_THREADS)
      s += vl_k_mse_elem(pred, pdt, target, tdt, scale, r * C + c);
    block_sum2<SEG_THREADS>(&s, &unused, sh);
    if (threadIdx.x == 0) loss[r] = (float)s;
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
__global__ void k_pad_fwd(void *y, int ydt, const void *x, int xdt, vl_k_pad g, int64_t n) {
  GRID_STRIDE(i, n) vl_k_pad_fwd(y, ydt, x, xdt, g, i);
}
__global__ void k_pad_bwd(void *dx, int dxdt, const void *dy, int dydt, vl_k_pad g, int64_t n) {
  GRID_STRIDE(i, n) vl_k_pad_bwd(dx, dxdt, dy, dydt, g, i);
}
__global__ void k_timestep(void *emb, int edt, const int32_t *t, int64_t dim, int flip,
                           float shift, float max_period, int64_t n) {
  GRID_STRIDE(i, n) vl_k_timestep_embed(emb, edt, t, dim, flip, shift, max_period, i);
}
__global__ void k_gauss(void *z, int zdt, const void *mom, int mdt, const void *noise, int ndt,
                        int64_t C, int64_t HW, float scale, int64_t n) {
  GRID_STRIDE(i, n) vl_k_gauss_sample(z, zdt, mom, mdt, noise, ndt, C, HW, scale, i);
}

/* ---- ops ------------------------------------------------------------------------------------ */

/* One block per segment, at most max_blocks (the kernels loop over segments). */
static int seg_blocks(const cu_state *s, int64_t S) {
  return S < (int64_t)s->max_blocks ? (int)S : s->max_blocks;
}
/* Column kernels: one block per COL_X columns, at most max_blocks. */
static int col_blocks(const cu_state *s, int64_t C) {
  return seg_blocks(s, (C + COL_X - 1) / COL_X);
}

#define ARGS(type) const type *a = (const type *)p

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

static vl_k_pad pad_geo(int64_t H, int64_t W, int top, int bottom, int left, int right) {
  vl_k_pad g = {H, W, H + top + bottom, W + left + right, top, left};
  return g;
}

static vl_status op_pad2d_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_pad2d_fwd_args);
  int64_t nin = a->planes * a->H * a->W;
  int64_t nout = a->planes * (a->H + a->top + a->bottom) * (a->W + a->left + a->right);
  if (nout > 0)
    LAUNCH(c, st(c), nout, VL_THREADS, k_pad_fwd, a->y->data, dt(a->y), nin ? a->x->data : NULL,
           dt(a->x), pad_geo(a->H, a->W, a->top, a->bottom, a->left, a->right), nout);
  return VL_OK;
}

static vl_status op_pad2d_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_pad2d_bwd_args);
  int64_t nin = a->planes * a->H * a->W;
  if (nin > 0)
    LAUNCH(c, st(c), nin, VL_THREADS, k_pad_bwd, a->dx->data, dt(a->dx), a->dy->data, dt(a->dy),
           pad_geo(a->H, a->W, a->top, a->bottom, a->left, a->right), nin);
  return VL_OK;
}

static vl_status op_timestep_embed(vl_ctx *c, const void *p) {
  ARGS(vl_timestep_embed_args);
  int64_t n = a->B * a->dim;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_timestep, a->emb->data, dt(a->emb),
           (const int32_t *)a->t->data, a->dim, a->flip_sin_to_cos ? 1 : 0, a->shift,
           a->max_period, n);
  return VL_OK;
}

static vl_status op_mse_fused(vl_ctx *c, const void *p) {
  ARGS(vl_mse_fused_args);
  int64_t n = a->R * a->C;
  if (a->R == 0) return VL_OK;
  cu_state *s = st(c);
  k_mse<<<seg_blocks(s, a->R), SEG_THREADS, 0, s->stream>>>(
      n ? a->pred->data : NULL, dt(a->pred), (float *)a->loss->data, n ? a->target->data : NULL,
      dt(a->target), a->R, a->C, a->dloss_scale);
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

void vl_cuda_sd_ops(vl_backend *b) {
  b->ops[VL_OP_GROUPNORM_FWD] = op_groupnorm_fwd;
  b->ops[VL_OP_GROUPNORM_BWD] = op_groupnorm_bwd;
  b->ops[VL_OP_LAYERNORM_FWD] = op_layernorm_fwd;
  b->ops[VL_OP_LAYERNORM_BWD] = op_layernorm_bwd;
  b->ops[VL_OP_ACT_FWD] = op_act_fwd;
  b->ops[VL_OP_ACT_BWD] = op_act_bwd;
  b->ops[VL_OP_GEGLU_FWD] = op_geglu_fwd;
  b->ops[VL_OP_GEGLU_BWD] = op_geglu_bwd;
  b->ops[VL_OP_BIAS_FWD] = op_bias_fwd;
  b->ops[VL_OP_BIAS_BWD] = op_bias_bwd;
  b->ops[VL_OP_PAD2D_FWD] = op_pad2d_fwd;
  b->ops[VL_OP_PAD2D_BWD] = op_pad2d_bwd;
  b->ops[VL_OP_TIMESTEP_EMBED] = op_timestep_embed;
  b->ops[VL_OP_MSE_FUSED] = op_mse_fused;
  b->ops[VL_OP_GAUSS_SAMPLE] = op_gauss_sample;
}
