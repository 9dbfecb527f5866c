/* CPU backend, copies, conversions, axpby, activations (SiLU / GELU, ReLU, SwiGLU, GEGLU), bias and the VAE's Gaussian sample: OpenMP loops over the single-source bodies of
 * engine/kernels/act.h. Arguments are checked by the operation's descriptor
 * (engine/backend/ops.c) before a kernel runs, on every backend.
 *
 * Hot loops call the body with the storage dtype as a constant when their tensors share one
 * (fp32, fp16 or bf16: the dtype switches of vl_ld/vl_st fold away and the runs vectorise;
 * DISPATCH in cpu_internal.h), else with the runtime dtypes. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "../../kernels/act.h"

static vl_status cpu_zero(vl_ctx *c, const void *p) {
  const vl_zero_args *a = p;
  (void)c;
  memset(a->y->data, 0, a->y->bytes);
  return VL_OK;
}

static vl_status cpu_convert(vl_ctx *c, const void *p) {
  const vl_convert_args *a = p;
  vl_tensor *y = a->y;
  const vl_tensor *x = a->x;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_MEM);
  (void)c;
  if (y->dtype == x->dtype && y->data != x->data && n > 0) { /* a copy */
    memcpy(y->data, x->data, vl_dtype_bytes(y->dtype, n));
    return VL_OK;
  }
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; i++) vl_k_convert(y->data, dt(y), x->data, dt(x), i);
  return VL_OK;
}

#define AXPBY(YD, XD)                                                                      \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t i = 0; i < n; i++)  \
      vl_k_axpby(py, YD, fa, px, XD, fb, i)
static vl_status cpu_axpby(vl_ctx *c, const void *p) {
  const vl_axpby_args *a = p;
  void *py = a->y->data;
  const void *px = a->x->data;
  int64_t n = a->n;
  float fa = a->a, fb = a->b;
  int nt = vl_cpu_threads((double)n * NS_MEM);
  (void)c;
  if (a->y->dtype == VL_F32 && a->x->dtype == VL_F32) AXPBY(F32, F32);
  else AXPBY(dt(a->y), dt(a->x));
  return VL_OK;
}

#define SWIGLU_FWD(OD, GD)                                                                 \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t i = 0; i < n; i++)  \
      vl_k_swiglu_fwd(po, OD, pg, pu, GD, i)
static vl_status cpu_swiglu_fwd(vl_ctx *c, const void *p) {
  const vl_swiglu_fwd_args *a = p;
  void *po = a->out->data;
  const void *pg = a->g->data, *pu = a->u->data;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_EXP);
  (void)c;
  if (a->out->dtype == VL_F32 && a->g->dtype == VL_F32) SWIGLU_FWD(F32, F32);
  else SWIGLU_FWD(dt(a->out), dt(a->g));
  return VL_OK;
}

/* GD: the gradients' dtype, OD: dout's, XD: g's and u's (bf16 inputs may carry fp32 grads) */
#define SWIGLU_BWD(GD, OD, XD)                                                             \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t i = 0; i < n; i++)  \
      vl_k_swiglu_bwd(pdg, pdu, GD, pdo, OD, pg, pu, XD, i)
static vl_status cpu_swiglu_bwd(vl_ctx *c, const void *p) {
  const vl_swiglu_bwd_args *a = p;
  void *pdg = a->dg->data, *pdu = a->du->data;
  const void *pdo = a->dout->data, *pg = a->g->data, *pu = a->u->data;
  int64_t n = a->n;
  int nt = vl_cpu_threads((double)n * NS_EXP);
  (void)c;
  if (a->dg->dtype == VL_F32 && a->dout->dtype == VL_F32 && a->g->dtype == VL_F32)
    SWIGLU_BWD(F32, F32, F32);
  else
    SWIGLU_BWD(dt(a->dg), dt(a->dout), dt(a->g));
  return VL_OK;
}

/* ---- ReLU ----------------------------------------------------------------------------- */

static vl_status cpu_relu_fwd(vl_ctx *c, vl_tensor *y, const vl_tensor *x, int64_t n) {
  void *py = y->data;
  const void *px = x->data;
  if (all_f32(y, x, NULL)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t i = 0; i < n; i++) vl_k_relu_fwd(py, F32, px, F32, i);
  } else {
    int ydt = dt(y), xdt = dt(x);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t i = 0; i < n; i++) vl_k_relu_fwd(py, ydt, px, xdt, i);
  }
  return VL_OK;
}

static vl_status cpu_relu_bwd(vl_ctx *c, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *y,
                          int64_t n) {
  void *pdx = dx->data;
  const void *pdy = dy->data, *py = y->data;
  if (all_f32(dx, dy, y)) {
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t i = 0; i < n; i++) vl_k_relu_bwd(pdx, F32, pdy, F32, py, F32, i);
  } else {
    int dxdt = dt(dx), dydt = dt(dy), ydt = dt(y);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
    for (int64_t i = 0; i < n; i++) vl_k_relu_bwd(pdx, dxdt, pdy, dydt, py, ydt, i);
  }
  return VL_OK;
}

static vl_status vl_cpu_relu_fwd(vl_ctx *c, const void *p) {
  const vl_relu_fwd_args *a = p;
  return cpu_relu_fwd(c, a->y, a->x, a->n);
}
static vl_status vl_cpu_relu_bwd(vl_ctx *c, const void *p) {
  const vl_relu_bwd_args *a = p;
  return cpu_relu_bwd(c, a->dx, a->dy, a->y, a->n);
}

/* ---- activations, GEGLU ----------------------------------------------------------------- */

static vl_status cpu_act_fwd(vl_ctx *c, const vl_act_fwd_args *a) {
  int64_t n = a->n;
  int act = (int)a->act;
  void *py = n ? a->y->data : NULL;
  const void *px = n ? a->x->data : NULL;
#define ACT_FWD_LOOP(YD, XD, _)                                                            \
  PAR_FOR for (int64_t i = 0; i < n; i++) vl_k_act_fwd(py, YD, px, XD, act, i)
  DISPATCH(a->y, a->x, NULL, ACT_FWD_LOOP);
#undef ACT_FWD_LOOP
  return VL_OK;
}

static vl_status cpu_act_bwd(vl_ctx *c, const vl_act_bwd_args *a) {
  int64_t n = a->n;
  int act = (int)a->act;
  void *pdx = n ? a->dx->data : NULL;
  const void *pdy = n ? a->dy->data : NULL, *px = n ? a->x->data : NULL;
#define ACT_BWD_LOOP(DXD, DYD, XD)                                                         \
  PAR_FOR for (int64_t i = 0; i < n; i++) vl_k_act_bwd(pdx, DXD, pdy, DYD, px, XD, act, i)
  DISPATCH(a->dx, a->dy, a->x, ACT_BWD_LOOP);
#undef ACT_BWD_LOOP
  return VL_OK;
}

INLINE void geglu_fwd_row(void *out, int odt, const void *h, int hdt, int64_t F, int64_t r) {
  for (int64_t f = 0; f < F; f++) vl_k_geglu_fwd_at(out, odt, h, hdt, F, r, f);
}
INLINE void geglu_bwd_row(void *dh, int dhdt, const void *dout, int ddt, const void *h, int hdt,
                          int64_t F, int64_t r) {
  for (int64_t f = 0; f < F; f++) vl_k_geglu_bwd_at(dh, dhdt, dout, ddt, h, hdt, F, r, f);
}

static vl_status cpu_geglu_fwd(vl_ctx *c, const vl_geglu_fwd_args *a) {
  int64_t n = a->R * a->F;
  if (n == 0) return VL_OK;
  void *po = a->out->data;
  const void *ph = a->h->data;
#define GEGLU_FWD_LOOP(OD, HD, _)                                                          \
  PAR_FOR for (int64_t r = 0; r < a->R; r++) geglu_fwd_row(po, OD, ph, HD, a->F, r)
  DISPATCH(a->out, a->h, NULL, GEGLU_FWD_LOOP);
#undef GEGLU_FWD_LOOP
  return VL_OK;
}

static vl_status cpu_geglu_bwd(vl_ctx *c, const vl_geglu_bwd_args *a) {
  int64_t n = a->R * a->F;
  if (n == 0) return VL_OK;
  void *pdh = a->dh->data;
  const void *pd = a->dout->data, *ph = a->h->data;
#define GEGLU_BWD_LOOP(DHD, DD, HD)                                                        \
  PAR_FOR for (int64_t r = 0; r < a->R; r++) geglu_bwd_row(pdh, DHD, pd, DD, ph, HD, a->F, r)
  DISPATCH(a->dh, a->dout, a->h, GEGLU_BWD_LOOP);
#undef GEGLU_BWD_LOOP
  return VL_OK;
}

/* ---- bias ------------------------------------------------------------------------------- */

/* Planes of `inner` elements (convolutions: the bias read once per plane), or rows of C
 * when inner is 1 (linear layers: the bias read per element, a constant dtype when it
 * shares y's), so the inner loop is the long contiguous one. */
static vl_status cpu_bias_fwd(vl_ctx *c, const vl_bias_fwd_args *a) {
  int64_t n = a->outer * a->C * a->inner;
  if (n == 0) return VL_OK;
  void *py = a->y->data;
  const void *pb = a->b->data;
  int bdt = dt(a->b), po = a->per_outer ? 1 : 0;
  int64_t C = a->C, inner = a->inner;
  if (inner == 1) {
#define ROWS(YD, BD)                                                                       \
  PAR_FOR for (int64_t o = 0; o < a->outer; o++) vl_k_bias_fwd_row(py, YD, pb, BD, C, po, o)
#define BIAS_ROWS_LOOP(YD, _a, _b)                                                         \
  if (bdt == VL_K_F32) ROWS(YD, VL_K_F32);                                                 \
  else if (bdt == YD) ROWS(YD, YD);                                                        \
  else ROWS(YD, bdt)
    DISPATCH(a->y, a->y, NULL, BIAS_ROWS_LOOP);
#undef BIAS_ROWS_LOOP
#undef ROWS
  } else {
#define BIAS_PLANES_LOOP(YD, _a, _b)                                                       \
  PAR_FOR for (int64_t p = 0; p < a->outer * C; p++)                                       \
      vl_k_bias_fwd_plane(py, YD, pb, bdt, C, inner, po, p)
    DISPATCH(a->y, a->y, NULL, BIAS_PLANES_LOOP);
#undef BIAS_PLANES_LOOP
  }
  return VL_OK;
}

/* Column block [c0, c0 + COLS) of (outer, C) (inner 1) summed over every row. */
INLINE void bias_bwd_cols(void *db, int dbdt, const void *dy, int dydt, int64_t R, int64_t C,
                          int acc, int64_t c0) {
  double s[COLS] = {0};
  int nc = (int)(C - c0 < COLS ? C - c0 : COLS);
  vl_k_colsum(dy, dydt, R, C, c0, nc, 0, 1, s);
  for (int k = 0; k < nc; k++) vl_k_bias_bwd_store(db, dbdt, c0 + k, s[k], acc);
}

/* Channel c of (outer, C, inner): outer contiguous planes. */
INLINE void bias_bwd_chan(void *db, int dbdt, const void *dy, int dydt, int64_t outer, int64_t C,
                          int64_t inner, int acc, int64_t c) {
  double s = 0.0;
  for (int64_t o = 0; o < outer; o++) s += vl_k_sum_run(dy, dydt, (o * C + c) * inner, inner);
  vl_k_bias_bwd_store(db, dbdt, c, s, acc);
}

static vl_status cpu_bias_bwd(vl_ctx *c, const vl_bias_bwd_args *a) {
  int64_t n = a->outer * a->C * a->inner, nb = (a->per_outer ? a->outer : 1) * a->C;
  if (nb == 0) return VL_OK;
  void *pdb = a->db->data;
  const void *pdy = n ? a->dy->data : NULL;
  int dbdt = dt(a->db), acc = a->accumulate ? 1 : 0;
  int64_t C = a->C, inner = a->inner, outer = a->outer;
  int64_t nblk = (C + COLS - 1) / COLS;
  if (a->per_outer) { /* db[o, c]: one plane each */
#define DB_PLANES_LOOP(DYD, _a, _b)                                                        \
  PAR_FOR for (int64_t p = 0; p < nb; p++)                                                 \
      vl_k_bias_bwd_store(pdb, dbdt, p, vl_k_sum_run(pdy, DYD, p * inner, inner), acc)
    DISPATCH(a->dy, a->dy, NULL, DB_PLANES_LOOP);
#undef DB_PLANES_LOOP
  } else if (inner == 1) {
#define DB_COLS_LOOP(DYD, _a, _b)                                                          \
  PAR_FOR for (int64_t q = 0; q < nblk; q++)                                               \
      bias_bwd_cols(pdb, dbdt, pdy, DYD, outer, C, acc, q * COLS)
    DISPATCH(a->dy, a->dy, NULL, DB_COLS_LOOP);
#undef DB_COLS_LOOP
  } else {
#define DB_CHANS_LOOP(DYD, _a, _b)                                                         \
  PAR_FOR for (int64_t k = 0; k < C; k++)                                                  \
      bias_bwd_chan(pdb, dbdt, pdy, DYD, outer, C, inner, acc, k)
    DISPATCH(a->dy, a->dy, NULL, DB_CHANS_LOOP);
#undef DB_CHANS_LOOP
  }
  return VL_OK;
}

static vl_status cpu_gauss_sample(vl_ctx *c, const vl_gauss_sample_args *a) {
  int64_t n = a->N * a->C * a->HW;
  if (n == 0) return VL_OK;
  void *pz = a->z->data;
  const void *pm = a->moments->data, *pn = a->noise->data;
  int zdt = dt(a->z), mdt = dt(a->moments), ndt = dt(a->noise);
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
  for (int64_t i = 0; i < n; i++)
    vl_k_gauss_sample(pz, zdt, pm, mdt, pn, ndt, a->C, a->HW, a->scale, i);
  return VL_OK;
}

CPU_ENTRY(act_fwd, vl_act_fwd_args)
CPU_ENTRY(act_bwd, vl_act_bwd_args)
CPU_ENTRY(geglu_fwd, vl_geglu_fwd_args)
CPU_ENTRY(geglu_bwd, vl_geglu_bwd_args)
CPU_ENTRY(bias_fwd, vl_bias_fwd_args)
CPU_ENTRY(bias_bwd, vl_bias_bwd_args)

CPU_ENTRY(gauss_sample, vl_gauss_sample_args)

void vl_cpu_act_ops(vl_backend *b) {
  b->ops[VL_OP_ZERO] = cpu_zero;
  b->ops[VL_OP_CONVERT] = cpu_convert;
  b->ops[VL_OP_AXPBY] = cpu_axpby;
  b->ops[VL_OP_SWIGLU_FWD] = cpu_swiglu_fwd;
  b->ops[VL_OP_SWIGLU_BWD] = cpu_swiglu_bwd;
  b->ops[VL_OP_RELU_FWD] = vl_cpu_relu_fwd;
  b->ops[VL_OP_RELU_BWD] = vl_cpu_relu_bwd;
  b->ops[VL_OP_ACT_FWD] = vl_cpu_act_fwd;
  b->ops[VL_OP_ACT_BWD] = vl_cpu_act_bwd;
  b->ops[VL_OP_GEGLU_FWD] = vl_cpu_geglu_fwd;
  b->ops[VL_OP_GEGLU_BWD] = vl_cpu_geglu_bwd;
  b->ops[VL_OP_BIAS_FWD] = vl_cpu_bias_fwd;
  b->ops[VL_OP_BIAS_BWD] = vl_cpu_bias_bwd;
  b->ops[VL_OP_GAUSS_SAMPLE] = vl_cpu_gauss_sample;
}
