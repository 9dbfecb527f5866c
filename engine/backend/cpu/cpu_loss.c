/* CPU backend, fused cross-entropy (token rows, pixels) and fused MSE: OpenMP loops over the single-source bodies of
 * engine/kernels/loss.h. Arguments are checked by the operation's descriptor
 * (engine/backend/ops.c) before a kernel runs, on every backend. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "../../kernels/loss.h"

static vl_status cpu_xent(vl_ctx *c, const void *p) {
  const vl_xent_fused_args *a = p;
  int64_t R = a->R, V = a->V;
  float s = a->dloss_scale;
  void *pl = a->logits->data;
  float *loss = a->loss->data;
  const int32_t *tgt = a->tgt ? a->tgt->data : NULL;
  int nt = vl_cpu_threads((double)(R * V) * NS_EXP);
  if (a->logits->dtype == VL_F32) {
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < R; r++) vl_k_xent_row(pl, F32, loss, tgt, V, s, r);
  } else {
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < R; r++) vl_k_xent_row(pl, dt(a->logits), loss, tgt, V, s, r);
  }
  return VL_OK;
}

/* ---- per-pixel cross-entropy ----------------------------------------------------------- */

/* Targets are in host memory here, so a label >= K is reported as an error before anything is
 * written (the CUDA backend cannot see them cheaply: its kernel gives that pixel a NaN loss). */
static vl_status cpu_xent_pix(vl_ctx *c, vl_tensor *logits, vl_tensor *loss, const vl_tensor *tt,
                          int64_t N, int64_t K, int64_t HW, float dloss_scale) {
  int64_t n = N * HW;
  const int32_t *tgt = tt ? tt->data : NULL;
  for (int64_t p = 0; p < n; p++)
    if (tgt[p] >= K)
      return vl_fail(c, VL_ERR_INVALID, "xent_pix: pixel %lld has target %d, only %lld classes",
                     (long long)p, (int)tgt[p], (long long)K);
  void *pl = logits->data;
  float *ploss = loss->data;
  int ldt = dt(logits), nt = vl_cpu_threads((double)(n * K) * NS_EXP);
  if (ldt == F32) {
#pragma omp parallel for num_threads(nt)
    for (int64_t p = 0; p < n; p++) vl_k_xent_pix(pl, F32, ploss, tgt, K, HW, dloss_scale, p);
  } else {
#pragma omp parallel for num_threads(nt)
    for (int64_t p = 0; p < n; p++) vl_k_xent_pix(pl, ldt, ploss, tgt, K, HW, dloss_scale, p);
  }
  return VL_OK;
}

static vl_status vl_cpu_xent_pix(vl_ctx *c, const void *p) {
  const vl_xent_pix_args *a = p;
  return cpu_xent_pix(c, a->logits, a->loss, a->tgt, a->N, a->K, a->HW, a->dloss_scale);
}

static vl_status cpu_mse_fused(vl_ctx *c, const vl_mse_fused_args *a) {
  int64_t n = a->R * a->C;
  if (a->R == 0) return VL_OK;
  void *pp = n ? a->pred->data : NULL;
  const void *pt = n ? a->target->data : NULL;
  float *pl = a->loss->data;
  int pdt = dt(a->pred), tdt = dt(a->target);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
  for (int64_t r = 0; r < a->R; r++) vl_k_mse_row(pp, pdt, pl, pt, tdt, a->C, a->dloss_scale, r);
  return VL_OK;
}

CPU_ENTRY(mse_fused, vl_mse_fused_args)

void vl_cpu_loss_ops(vl_backend *b) {
  b->ops[VL_OP_XENT_FUSED] = cpu_xent;
  b->ops[VL_OP_XENT_PIX] = vl_cpu_xent_pix;
  b->ops[VL_OP_MSE_FUSED] = vl_cpu_mse_fused;
}
