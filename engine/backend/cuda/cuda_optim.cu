/* CUDA backend, AdamW, SGD, Adafactor and the gradient norm's sum of squares: grid-stride kernels and block reductions over the
 * single-source bodies of engine/kernels/optim.h, the same bodies the CPU backend loops over
 * (cpu_optim.c). Arguments are checked by the operation's descriptor (engine/backend/ops.c)
 * before a kernel runs. */
#include <math.h>

#include "cuda_internal.h"
#include "cuda_reduce.h"
#include "../../kernels/optim.h"

__global__ void k_adamw(float *p, const float *g, float *m, float *v, float lr, float b1,
                        float b2, float eps, float wd, float bc1, float bc2, float gscale,
                        int64_t n) {
  GRID_STRIDE(i, n) vl_k_adamw(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2, gscale, i);
}
__global__ void k_sgd(float *p, const float *g, float *mom, float lr, float mu, float wd,
                      float gscale, int64_t n) {
  GRID_STRIDE(i, n) vl_k_sgd(p, g, mom, lr, mu, wd, gscale, i);
}
__global__ void k_adafactor_row(float *vr, const float *g, int64_t R, int64_t C, float b2t,
                                float eps1, float gscale) {
  GRID_STRIDE(r, R) vl_k_adafactor_row(vr, g, C, b2t, eps1, gscale, r);
}
__global__ void k_adafactor_col(float *vc, const float *g, int64_t R, int64_t C, float b2t,
                                float eps1, float gscale) {
  GRID_STRIDE(k, C) vl_k_adafactor_col(vc, g, R, C, b2t, eps1, gscale, k);
}

/* sum of x^2 over finite x, and whether a NaN/Inf was seen; the host reports 0 for the sum
 * when one was (as cpu_sumsq) */
__global__ void k_sumsq(const void *x, int xdt, int64_t n, double *part, int *bad) {
  __shared__ double sh[VL_THREADS];
  __shared__ int sbad;
  if (threadIdx.x == 0) sbad = 0;
  __syncthreads();
  double acc = 0.0;
  int b = 0;
  GRID_STRIDE(i, n) {
    float v = vl_ld(x, xdt, i);
    if (!isfinite(v)) b = 1;
    else acc += (double)v * v;
  }
  if (b) atomicOr(&sbad, 1); /* an OR: order-independent */
  double s = block_sum(acc, sh);
  if (threadIdx.x == 0) { part[blockIdx.x] = s; bad[blockIdx.x] = sbad; }
}

__global__ void k_sum_f32(const float *x, int64_t n, double *part) {
  __shared__ double sh[VL_THREADS];
  double acc = 0.0;
  GRID_STRIDE(i, n) acc += x[i];
  double s = block_sum(acc, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* Partial sums of the squared unscaled Adafactor update (its RMS clips it). */
__global__ void k_adafactor_ss(const float *g, const float *vr, const float *vc, float vr_mean,
                               int64_t R, int64_t C, float gscale, double *part) {
  __shared__ double sh[VL_THREADS];
  double acc = 0.0;
  GRID_STRIDE(i, R * C) {
    float ui = vl_k_adafactor_u(g, vr, vc, vr_mean, R, C, gscale, i);
    acc += (double)ui * ui;
  }
  double s = block_sum(acc, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* The final Adafactor pass: the same single-source body as the CPU backend. */
__global__ void k_adafactor_apply(float *p, float *m, const float *g, const float *vr,
                                  const float *vc, float vr_mean, int64_t R, int64_t C,
                                  float gscale, float div, float lr, float b1, float wd) {
  GRID_STRIDE(i, R * C) vl_k_adafactor_apply(p, m, g, vr, vc, vr_mean, R, C, gscale, div, lr, b1, wd, i);
}

static vl_status cu_sumsq(vl_ctx *c, const vl_tensor *x, int64_t n, double *out, bool *nonfinite) {
  *out = 0.0;
  *nonfinite = false;
  if (n <= 0) return VL_OK;
  cu_state *s = st(c);
  int blocks = red_blocks(n);
  k_sumsq<<<blocks, VL_THREADS, 0, s->stream>>>(x->data, dt(x), n, s->red_dev, s->bad_dev);
  CU_CHECK(c, cudaGetLastError());
  int bad = 0;
  vl_status r = reduce_finish(c, s, blocks, out, &bad);
  *nonfinite = bad != 0;
  if (*nonfinite) *out = 0.0; /* the contract (vramlab/ops.h): no sum once a NaN/Inf is seen */
  return r;
}

/* ---- optimizers ----------------------------------------------------------------------- */

static vl_status cu_adamw(vl_ctx *c, vl_tensor *p, const vl_tensor *g, vl_tensor *m, vl_tensor *v,
                          int64_t n, const vl_optim_hp *h) {
  if (n <= 0) return VL_OK;
  /* bias corrections on the host, in float, exactly as cpu_adamw */
  float bc1 = 1.0f - powf(h->beta1, (float)h->t), bc2 = 1.0f - powf(h->beta2, (float)h->t);
  LAUNCH(c, st(c), n, VL_THREADS, k_adamw, (float *)p->data, (const float *)g->data,
         (float *)m->data, (float *)v->data, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
         bc1, bc2, h->grad_scale, n);
  return VL_OK;
}

static vl_status cu_sgd(vl_ctx *c, vl_tensor *p, const vl_tensor *g, vl_tensor *mom, int64_t n,
                        const vl_optim_hp *h) {
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_sgd, (float *)p->data, (const float *)g->data,
           (float *)mom->data, h->lr, h->momentum, h->weight_decay, h->grad_scale, n);
  return VL_OK;
}

/* Four passes, as cpu_adafactor: row moments and their mean (R > 1), column moments, the
 * RMS of the update (two-pass reduction through the host), then the clipped update. */
static vl_status cu_adafactor(vl_ctx *c, vl_tensor *p, const vl_tensor *g, vl_tensor *vr,
                              vl_tensor *vc, vl_tensor *m, int64_t R, int64_t C,
                              const vl_optim_hp *h) {
  int64_t n = R * C;
  if (n <= 0) return VL_OK;
  cu_state *s = st(c);
  float b2t = 1.0f - powf((float)h->t, -h->decay_pow);
  const float eps1 = 1e-30f;
  float *gp = (float *)g->data, *vrp = (float *)vr->data, *vcp = (float *)vc->data;
  float *mp = m ? (float *)m->data : NULL;
  float vr_mean = 0.0f;
  vl_status r;
  if (R > 1) {
    LAUNCH(c, s, R, VL_ROW_THREADS, k_adafactor_row, vrp, gp, R, C, b2t, eps1, h->grad_scale);
    int blocks = red_blocks(R);
    k_sum_f32<<<blocks, VL_THREADS, 0, s->stream>>>(vrp, R, s->red_dev);
    CU_CHECK(c, cudaGetLastError());
    double sum = 0.0;
    if ((r = reduce_finish(c, s, blocks, &sum, NULL)) != VL_OK) return r;
    vr_mean = (float)(sum / (double)R);
  }
  LAUNCH(c, s, C, VL_ROW_THREADS, k_adafactor_col, vcp, gp, R, C, b2t, eps1, h->grad_scale);
  int blocks = red_blocks(n);
  k_adafactor_ss<<<blocks, VL_THREADS, 0, s->stream>>>(gp, vrp, vcp, vr_mean, R, C,
                                                        h->grad_scale, s->red_dev);
  CU_CHECK(c, cudaGetLastError());
  double ss = 0.0;
  if ((r = reduce_finish(c, s, blocks, &ss, NULL)) != VL_OK) return r;
  float rms = (float)sqrt(ss / (double)n);
  float div = rms / h->clip_thr > 1.0f ? rms / h->clip_thr : 1.0f;
  LAUNCH(c, s, n, VL_THREADS, k_adafactor_apply, (float *)p->data, mp, gp, vrp, vcp, vr_mean, R,
         C, h->grad_scale, div, h->lr, h->beta1, h->weight_decay);
  return VL_OK;
}

static vl_status op_sumsq(vl_ctx *c, const void *p) {
  ARGS(vl_sumsq_args);
  return cu_sumsq(c, a->x, a->n, a->out, a->nonfinite);
}
static vl_status op_adamw(vl_ctx *c, const void *p) {
  ARGS(vl_adamw_args);
  return cu_adamw(c, a->p, a->g, a->m, a->v, a->n, a->hp);
}
static vl_status op_sgd(vl_ctx *c, const void *p) {
  ARGS(vl_sgd_args);
  return cu_sgd(c, a->p, a->g, a->mom, a->n, a->hp);
}
static vl_status op_adafactor(vl_ctx *c, const void *p) {
  ARGS(vl_adafactor_args);
  return cu_adafactor(c, a->p, a->g, a->vr, a->vc, a->m, a->R, a->C, a->hp);
}

void vl_cuda_optim_ops(vl_backend *b) {
  b->ops[VL_OP_SUMSQ] = op_sumsq;
  b->ops[VL_OP_ADAMW] = op_adamw;
  b->ops[VL_OP_SGD] = op_sgd;
  b->ops[VL_OP_ADAFACTOR] = op_adafactor;
}
