/* CPU backend, AdamW, SGD, Adafactor and the gradient norm's sum of squares: OpenMP loops over the single-source bodies of
 * engine/kernels/optim.h. Arguments are checked by the operation's descriptor
 * (engine/backend/ops.c) before a kernel runs, on every backend. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "../../kernels/optim.h"

/* Sums over [0, n) in a fixed shape: SUM_PARTS parts of a size that depends on n only, each
 * summed in order by one thread, then the parts in order; so the sum does not depend on the
 * thread count. TERM(i) is the double term of element i. */
#define SUM_PARTS 64
#define FIXED_SUM(out, n, nt, TERM)                                                        \
  do {                                                                                     \
    double part_[SUM_PARTS];                                                               \
    int64_t len_ = ((n) + SUM_PARTS - 1) / SUM_PARTS;                                      \
    _Pragma("omp parallel for num_threads(nt) if (nt > 1)")                                \
    for (int p_ = 0; p_ < SUM_PARTS; p_++) {                                               \
      int64_t i0_ = p_ * len_, i1_ = i0_ + len_ < (n) ? i0_ + len_ : (n);                  \
      double acc_ = 0;                                                                     \
      _Pragma("omp simd reduction(+ : acc_)") for (int64_t i = i0_; i < i1_; i++) acc_ += TERM; \
      part_[p_] = acc_;                                                                    \
    }                                                                                      \
    double s_ = 0;                                                                         \
    for (int p_ = 0; p_ < SUM_PARTS; p_++) s_ += part_[p_];                                \
    (out) = s_;                                                                            \
  } while (0)

static inline double sq(double u) { return u * u; }

static vl_status cpu_sumsq(vl_ctx *c, const void *p) {
  const vl_sumsq_args *a = p;
  const vl_tensor *x = a->x;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_MEM);
  (void)c;
  /* A NaN or Inf element makes the double sum non-finite (a finite float squared cannot
   * overflow a double), so one check at the end finds it. */
  double acc = 0;
  if (x->dtype == VL_F32) {
    const float *px = x->data;
    FIXED_SUM(acc, n, nt, sq(px[i]));
  } else {
    const void *px = x->data;
    int xd = dt(x);
    FIXED_SUM(acc, n, nt, sq(vl_ld(px, xd, i)));
  }
  *a->nonfinite = !isfinite(acc);
  *a->out = *a->nonfinite ? 0 : acc;
  return VL_OK;
}
static vl_status cpu_adamw(vl_ctx *c, const void *args) {
  const vl_adamw_args *a = args;
  float *p = a->p->data, *m = a->m->data, *v = a->v->data;
  const float *g = a->g->data;
  const vl_optim_hp *h = a->hp;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_OPT);
  (void)c;
  float bc1 = 1.0f - powf(h->beta1, (float)h->t), bc2 = 1.0f - powf(h->beta2, (float)h->t);
  float lr = h->lr, b1 = h->beta1, b2 = h->beta2, eps = h->eps, wd = h->weight_decay;
  float gs = h->grad_scale;
#pragma omp parallel for simd num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; i++) vl_k_adamw(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2, gs, i);
  return VL_OK;
}
static vl_status cpu_sgd(vl_ctx *c, const void *args) {
  const vl_sgd_args *a = args;
  float *p = a->p->data, *mom = a->mom->data;
  const float *g = a->g->data;
  const vl_optim_hp *h = a->hp;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_MEM);
  float lr = h->lr, mu = h->momentum, wd = h->weight_decay, gs = h->grad_scale;
  (void)c;
#pragma omp parallel for simd num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; i++) vl_k_sgd(p, g, mom, lr, mu, wd, gs, i);
  return VL_OK;
}
static vl_status cpu_adafactor(vl_ctx *c, const void *args) {
  const vl_adafactor_args *a = args;
  vl_tensor *p = a->p, *vr = a->vr, *vc = a->vc, *m = a->m;
  const vl_tensor *g = a->g;
  const vl_optim_hp *h = a->hp;
  int64_t R = a->R, C = a->C;
  (void)c;
  float b2t = 1.0f - powf((float)h->t, -h->decay_pow);
  const float eps1 = 1e-30f;
  float *gp = g->data, *pp = p->data, *vrp = vr->data, *vcp = vc->data;
  int64_t n = R * C;
  int nt = vl_cpu_threads((double)n * NS_OPT);
  float vr_mean = 0.0f;
  if (R > 1) {
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < R; r++) vl_k_adafactor_row(vrp, gp, C, b2t, eps1, h->grad_scale, r);
    double s = 0;
    for (int64_t r = 0; r < R; r++) s += vrp[r];
    vr_mean = (float)(s / (double)R);
  }
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t k = 0; k < C; k++) vl_k_adafactor_col(vcp, gp, R, C, b2t, eps1, h->grad_scale, k);
  double ss = 0;
  float gs = h->grad_scale;
  FIXED_SUM(ss, n, nt, sq(vl_k_adafactor_u(gp, vrp, vcp, vr_mean, R, C, gs, i)));
  float rms = (float)sqrt(ss / (double)n);
  float div = rms / h->clip_thr > 1.0f ? rms / h->clip_thr : 1.0f;
  float *mp = m ? m->data : NULL;
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; i++)
    vl_k_adafactor_apply(pp, mp, gp, vrp, vcp, vr_mean, R, C, h->grad_scale, div, h->lr, h->beta1,
                         h->weight_decay, i);
  return VL_OK;
}

void vl_cpu_optim_ops(vl_backend *b) {
  b->ops[VL_OP_SUMSQ] = cpu_sumsq;
  b->ops[VL_OP_ADAMW] = cpu_adamw;
  b->ops[VL_OP_SGD] = cpu_sgd;
  b->ops[VL_OP_ADAFACTOR] = cpu_adafactor;
}
