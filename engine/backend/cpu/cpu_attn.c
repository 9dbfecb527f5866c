/* CPU backend, memory-efficient attention (VL_OP_ATTN_FWD / VL_OP_ATTN_BWD): OpenMP loops over
 * the single-source bodies of engine/kernels/attn.h, one call per query row (forward, delta,
 * dq) or key row (dk, dv), the rows of all (batch, head) pairs in one parallel loop.
 * Arguments are checked by engine/backend/attn_args.h, the same checks as the CUDA backend.
 *
 * Scratch: each thread has a stack array of VL_K_ATTN_WS(VL_K_ATTN_DMAX) floats (8 KiB),
 * contiguous (stride 1). Where all tensors share one dtype, the loops are written out with
 * that dtype and the stride as literals inside the parallel region (OpenMP outlines the
 * region, so a constant must be spelled there), the bodies are force-inlined, the dtype
 * switches fold away and the fp32 dot products vectorise; mixed dtypes run the same bodies
 * with the runtime dtypes.
 *
 * Determinism: each output row is written by one call and every sum is taken in a fixed
 * order, so results do not depend on the thread count or the (dynamic) schedule. */
#include "cpu_internal.h"
#include "../attn_args.h"
#include "../../kernels/attn.h"

#define SCRATCH VL_K_ATTN_WS(VL_K_ATTN_DMAX)
/* The loops hand a thread 8 rows at a time: causal rows differ in length, so the schedule
 * is dynamic (it changes who computes a row, never how). */

static int dt(const vl_tensor *t) { return (int)t->dtype; }

/* The dtype every tensor shares, or -1 when they differ. */
static int common_dt(const vl_tensor *const *ts, int n) {
  for (int i = 1; i < n; i++)
    if (ts[i]->dtype != ts[0]->dtype) return -1;
  return dt(ts[0]);
}

static vl_k_attn_dims dims_of(int64_t H, int64_t Tq, int64_t Tk, int64_t D, float scale,
                              bool causal) {
  vl_k_attn_dims s = {H, Tq, Tk, D, scale, causal ? 1 : 0};
  return s;
}

/* ---- forward ---------------------------------------------------------------------------- */

/* rows query rows, dtypes OD (o), QD, KD, VD */
#define FWD_LOOP(OD, QD, KD, VD)                                                           \
  _Pragma("omp parallel") {                                                                \
    float w[SCRATCH];                                                                      \
    _Pragma("omp for schedule(dynamic, 8)") for (int64_t r = 0; r < rows; r++)         \
        vl_k_attn_fwd_row(o, OD, lse, q, QD, k, KD, v, VD, s, w, 1, r);                    \
  }

vl_status vl_cpu_attn_fwd(vl_ctx *c, const void *args) {
  const vl_attn_fwd_args *a = args;
  int64_t rows = 0;
  VL_TRY(vl_attn_check_fwd(c, a, &rows));
  vl_k_attn_dims s = dims_of(a->H, a->Tq, a->Tk, a->D, a->scale, a->causal);
  const vl_tensor *ts[4] = {a->o, a->q, a->k, a->v};
  void *o = a->o->data;
  float *lse = a->lse->data;
  const void *q = a->q->data, *k = a->k->data, *v = a->v->data;
  switch (common_dt(ts, 4)) {
  case VL_K_F32: FWD_LOOP(VL_K_F32, VL_K_F32, VL_K_F32, VL_K_F32) break;
  case VL_K_F16: FWD_LOOP(VL_K_F16, VL_K_F16, VL_K_F16, VL_K_F16) break;
  case VL_K_BF16: FWD_LOOP(VL_K_BF16, VL_K_BF16, VL_K_BF16, VL_K_BF16) break;
  default: {
    int od = dt(a->o), qd = dt(a->q), kd = dt(a->k), vd = dt(a->v);
    FWD_LOOP(od, qd, kd, vd)
  } break;
  }
  return VL_OK;
}

/* ---- backward --------------------------------------------------------------------------- */

/* delta per query row, then (in a second region: both read delta) dq per query row and dk,
 * dv per key row. The dtypes of q, k, v, o, dout, dq, dk, dv. */
#define BWD_LOOP(QD, KD, VD, OD, DD, DQD, DKD, DVD)                                        \
  _Pragma("omp parallel for schedule(static)") for (int64_t r = 0; r < rows; r++)          \
      vl_k_attn_delta_row(delta, dout, DD, o, OD, s, r);                                   \
  _Pragma("omp parallel") {                                                                \
    float w[SCRATCH];                                                                      \
    _Pragma("omp for schedule(dynamic, 8) nowait") for (int64_t r = 0; r < rows; r++)  \
        vl_k_attn_dq_row(dq, DQD, dout, DD, lse, delta, q, QD, k, KD, v, VD, s, w, 1, r);  \
    _Pragma("omp for schedule(dynamic, 8)") for (int64_t r = 0; r < krows; r++)        \
        vl_k_attn_dkdv_row(dk, DKD, dv, DVD, dout, DD, lse, delta, q, QD, k, KD, v, VD, s, \
                           w, 1, r);                                                       \
  }

vl_status vl_cpu_attn_bwd(vl_ctx *c, const void *args) {
  const vl_attn_bwd_args *a = args;
  int64_t rows = 0;
  VL_TRY(vl_attn_check_bwd(c, a, &rows));
  int64_t krows = a->B * a->H * a->Tk;
  vl_k_attn_dims s = dims_of(a->H, a->Tq, a->Tk, a->D, a->scale, a->causal);
  void *dq = a->dq->data, *dk = a->dk->data, *dv = a->dv->data;
  const void *dout = a->dout->data, *o = a->o->data, *q = a->q->data, *k = a->k->data,
             *v = a->v->data;
  const float *lse = a->lse->data;
  float *delta = a->ws; /* (B, H, Tq) */
  const vl_tensor *ts[8] = {a->q, a->k, a->v, a->o, a->dout, a->dq, a->dk, a->dv};
  switch (common_dt(ts, 8)) {
  case VL_K_F32:
    BWD_LOOP(VL_K_F32, VL_K_F32, VL_K_F32, VL_K_F32, VL_K_F32, VL_K_F32, VL_K_F32, VL_K_F32)
    break;
  case VL_K_F16:
    BWD_LOOP(VL_K_F16, VL_K_F16, VL_K_F16, VL_K_F16, VL_K_F16, VL_K_F16, VL_K_F16, VL_K_F16)
    break;
  case VL_K_BF16:
    BWD_LOOP(VL_K_BF16, VL_K_BF16, VL_K_BF16, VL_K_BF16, VL_K_BF16, VL_K_BF16, VL_K_BF16,
             VL_K_BF16)
    break;
  default: {
    int qd = dt(a->q), kd = dt(a->k), vd = dt(a->v), od = dt(a->o), dd = dt(a->dout);
    int dqd = dt(a->dq), dkd = dt(a->dk), dvd = dt(a->dv);
    BWD_LOOP(qd, kd, vd, od, dd, dqd, dkd, dvd)
  } break;
  }
  return VL_OK;
}
