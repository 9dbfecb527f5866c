/* CPU backend, attention: softmax, rotary embedding and head permutes (at the end), and
 * memory-efficient attention (VL_OP_ATTN_FWD / VL_OP_ATTN_BWD): OpenMP loops over
 * the single-source bodies of engine/kernels/attn.h, one call per query row (forward,
 * delta); the backward's dq and dk, dv run here per block of BLK query (key) rows of one
 * (batch, head), the same arithmetic as the bodies vl_k_attn_dq_row / vl_k_attn_dkdv_row,
 * bit for bit, with each k, v (q, dout) row converted once and reused across the block.
 * Arguments are checked by the operation's descriptor (engine/backend/ops.c) before a
 * kernel runs, on every backend; the backward's workspace here (attn_args.h).
 *
 * Scratch: each thread has a stack array, contiguous (stride 1): VL_K_ATTN_WS(VL_K_ATTN_DMAX)
 * floats (8 KiB) forward, BWD_SCRATCH (160 KiB) backward; the arena's workspace stays the
 * descriptor's (delta). Where all tensors share one dtype, the loops are written out with
 * that dtype as a literal inside the parallel region (OpenMP outlines the region, so a
 * constant must be spelled there), the bodies are force-inlined, the dtype switches fold away
 * and the fp32 math vectorises; mixed dtypes run the same code with the runtime dtypes.
 *
 * Determinism: each output row is written by one task and every sum is taken in a fixed
 * order, so results do not depend on the thread count or the (dynamic) schedule. */
#include <string.h>

#include "cpu_internal.h"
#include "../attn_args.h"
#include "../../kernels/attn.h"

#define SCRATCH VL_K_ATTN_WS(VL_K_ATTN_DMAX)
/* The loops hand a thread 8 rows at a time: causal rows differ in length, so the schedule
 * is dynamic (it changes who computes a row, never how). */

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
  _Pragma("omp parallel num_threads(nt)") {                                                \
    float w[SCRATCH];                                                                      \
    _Pragma("omp for schedule(dynamic, 8)") for (int64_t r = 0; r < rows; r++)         \
        vl_k_attn_fwd_row(o, OD, lse, q, QD, k, KD, v, VD, s, w, 1, r);                    \
  }

static vl_status vl_cpu_attn_fwd(vl_ctx *c, const void *args) {
  const vl_attn_fwd_args *a = args;
  int64_t rows = a->B * a->H * a->Tq;
  vl_k_attn_dims s = dims_of(a->H, a->Tq, a->Tk, a->D, a->scale, a->causal);
  const vl_tensor *ts[4] = {a->o, a->q, a->k, a->v};
  void *o = a->o->data;
  float *lse = a->lse->data;
  const void *q = a->q->data, *k = a->k->data, *v = a->v->data;
  int nt = vl_cpu_threads((double)rows * (double)a->Tk * (double)a->D * NS_ROW);
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

/* The backward passes take a block of BLK query rows (dq) or key rows (dk, dv) of one (batch,
 * head) per task: each k, v (resp. q, dout) row is converted to fp32 once and reused across
 * the block, and the block's BLK scores against it are computed together, one vector lane per
 * row. The arithmetic is that of vl_k_attn_dq_row / vl_k_attn_dkdv_row, operation for
 * operation (the same products, partial sums, tree and order), so the results are theirs bit
 * for bit (test_attention checks the CUDA bodies against this backend). */
#define BLK 16

/* out[r] = vl_k_attn_dot(a_r, x) for the BLK rows a_r stored transposed, at[d*BLK + r]: the
 * dot's 32 partial sums (chain c, lane u in S[8c + u]: d = 32n + 8c + u, then the runs of 8
 * into chain 0), its lane sums (s0 + s1) + (s2 + s3), its 8-lane tree and its sequential tail,
 * each for all rows at once (one vector lane per row). */
static inline void dot_blk(float *restrict out, const float *restrict at,
                           const float *restrict x, int64_t D) {
  float S[32][BLK], t[BLK];
  for (int e = 0; e < 32; e++)
    for (int r = 0; r < BLK; r++) S[e][r] = 0.0f;
  for (int r = 0; r < BLK; r++) t[r] = 0.0f;
  int64_t d = 0;
  for (; d + 32 <= D; d += 32)
    for (int e = 0; e < 32; e++) {
      const float *a = at + (d + e) * BLK;
      float xe = x[d + e];
      VL_K_ATTN_SIMD for (int r = 0; r < BLK; r++) S[e][r] += a[r] * xe;
    }
  for (; d + 8 <= D; d += 8)
    for (int e = 0; e < 8; e++) {
      const float *a = at + (d + e) * BLK;
      float xe = x[d + e];
      VL_K_ATTN_SIMD for (int r = 0; r < BLK; r++) S[e][r] += a[r] * xe;
    }
  for (; d < D; d++) {
    const float *a = at + d * BLK;
    float xd = x[d];
    VL_K_ATTN_SIMD for (int r = 0; r < BLK; r++) t[r] += a[r] * xd;
  }
  float c[8][BLK];
  for (int u = 0; u < 8; u++)
    VL_K_ATTN_SIMD for (int r = 0; r < BLK; r++) c[u][r] =
        (S[u][r] + S[8 + u][r]) + (S[16 + u][r] + S[24 + u][r]);
  VL_K_ATTN_SIMD for (int r = 0; r < BLK; r++) out[r] =
      (((c[0][r] + c[1][r]) + (c[2][r] + c[3][r])) + ((c[4][r] + c[5][r]) + (c[6][r] + c[7][r]))) +
      t[r];
}

/* at[d*BLK + r] = row r of x (n rows from offset off, row stride HD) as fp32, 0 past n. */
static inline VL_K_ATTN_INL void load_t(float *restrict at, const void *x, int xdt, int64_t off,
                                        int64_t HD, int n, int64_t D) {
  for (int r = 0; r < BLK; r++)
    for (int64_t d = 0; d < D; d++)
      at[d * BLK + r] = r < n ? vl_ld(x, xdt, off + r * HD + d) : 0.0f;
}

/* dq of query rows i0 .. i0+n of (batch, head) bh. */
static inline VL_K_ATTN_INL void dq_blk(void *dq, int dqdt, const void *dout, int ddt,
                                        const float *lse, const float *delta, const void *q,
                                        int qdt, const void *k, int kdt, const void *v, int vdt,
                                        vl_k_attn_dims s, float *w, int64_t bh, int64_t i0,
                                        int n) {
  int64_t D = s.D, HD = s.H * s.D, h = bh % s.H, b = bh / s.H;
  int64_t qo = vl_k_attn_off(&s, b, h, s.Tq, i0), k0 = vl_k_attn_off(&s, b, h, s.Tk, 0);
  int64_t nk = s.causal ? i0 + n : s.Tk; /* keys the block's last row sees */
  float *qt = w, *dt_ = w + BLK * D, *acc = w + 2 * BLK * D, *kf = w + 3 * BLK * D,
        *vf = kf + D;
  load_t(qt, q, qdt, qo, HD, n, D);
  load_t(dt_, dout, ddt, qo, HD, n, D);
  for (int64_t x = 0; x < BLK * D; x++) acc[x] = 0.0f;
  float L[BLK], dl[BLK], sq[BLK], sv[BLK];
  for (int r = 0; r < BLK; r++) {
    L[r] = r < n ? lse[bh * s.Tq + i0 + r] : 0.0f;
    dl[r] = r < n ? delta[bh * s.Tq + i0 + r] : 0.0f;
  }
  for (int64_t j = 0; j < nk; j++) {
    int64_t ko = k0 + j * HD;
    for (int64_t d = 0; d < D; d++) {
      kf[d] = vl_ld(k, kdt, ko + d);
      vf[d] = vl_ld(v, vdt, ko + d);
    }
    dot_blk(sq, qt, kf, D);
    dot_blk(sv, dt_, vf, D);
    int r0 = s.causal && j > i0 ? (int)(j - i0) : 0; /* rows i0 + r >= j see key j */
    float ds[BLK];
    if (r0 == 0) { /* every row: all lanes (the padding rows' are never stored) */
      for (int r = 0; r < BLK; r++) {
        float p = expf(s.scale * sq[r] - L[r]);
        ds[r] = p * (sv[r] - dl[r]);
      }
      for (int64_t d = 0; d < D; d++) {
        float *ad = acc + d * BLK;
        float kd = kf[d];
        VL_K_ATTN_SIMD for (int r = 0; r < BLK; r++) ad[r] += ds[r] * kd;
      }
    } else {
      for (int r = r0; r < n; r++) {
        float p = expf(s.scale * sq[r] - L[r]);
        float g = p * (sv[r] - dl[r]);
        for (int64_t d = 0; d < D; d++) acc[d * BLK + r] += g * kf[d];
      }
    }
  }
  for (int r = 0; r < n; r++)
    for (int64_t d = 0; d < D; d++) vl_st(dq, dqdt, qo + r * HD + d, s.scale * acc[d * BLK + r]);
}

/* dk and dv of key rows j0 .. j0+n of (batch, head) bh. */
static inline VL_K_ATTN_INL void dkdv_blk(void *dk, int dkdt, void *dv, int dvdt, const void *dout,
                                          int ddt, const float *lse, const float *delta,
                                          const void *q, int qdt, const void *k, int kdt,
                                          const void *v, int vdt, vl_k_attn_dims s, float *w,
                                          int64_t bh, int64_t j0, int n) {
  int64_t D = s.D, HD = s.H * s.D, h = bh % s.H, b = bh / s.H;
  int64_t ko = vl_k_attn_off(&s, b, h, s.Tk, j0), q0 = vl_k_attn_off(&s, b, h, s.Tq, 0);
  float *kt = w, *vt = w + BLK * D, *gk = w + 2 * BLK * D, *gv = w + 3 * BLK * D,
        *qf = w + 4 * BLK * D, *df = qf + D;
  load_t(kt, k, kdt, ko, HD, n, D);
  load_t(vt, v, vdt, ko, HD, n, D);
  for (int64_t x = 0; x < 2 * BLK * D; x++) gk[x] = 0.0f;
  float sk[BLK], sv[BLK];
  for (int64_t i = s.causal ? j0 : 0; i < s.Tq; i++) {
    int64_t qo = q0 + i * HD, ri = bh * s.Tq + i;
    for (int64_t d = 0; d < D; d++) {
      qf[d] = vl_ld(q, qdt, qo + d);
      df[d] = vl_ld(dout, ddt, qo + d);
    }
    dot_blk(sk, kt, qf, D);
    dot_blk(sv, vt, df, D);
    int rn = s.causal && i - j0 + 1 < n ? (int)(i - j0 + 1) : n; /* rows j0 + r <= i */
    float L = lse[ri], dl = delta[ri];
    if (rn == n) { /* every row: all lanes (the padding rows' are never stored) */
      float p[BLK], ds[BLK];
      for (int r = 0; r < BLK; r++) {
        p[r] = expf(s.scale * sk[r] - L);
        ds[r] = p[r] * (sv[r] - dl);
      }
      for (int64_t d = 0; d < D; d++) {
        float *vd = gv + d * BLK, *kd = gk + d * BLK;
        float dd = df[d], qd = qf[d];
        VL_K_ATTN_SIMD for (int r = 0; r < BLK; r++) {
          vd[r] += p[r] * dd;
          kd[r] += ds[r] * qd;
        }
      }
    } else {
      for (int r = 0; r < rn; r++) {
        float p = expf(s.scale * sk[r] - L);
        float g = p * (sv[r] - dl);
        for (int64_t d = 0; d < D; d++) {
          gv[d * BLK + r] += p * df[d];
          gk[d * BLK + r] += g * qf[d];
        }
      }
    }
  }
  for (int r = 0; r < n; r++)
    for (int64_t d = 0; d < D; d++) {
      vl_st(dk, dkdt, ko + r * HD + d, s.scale * gk[d * BLK + r]);
      vl_st(dv, dvdt, ko + r * HD + d, gv[d * BLK + r]);
    }
}

/* Scratch floats of a backward block: q, dout (resp. k, v) of the block transposed, the
 * block's accumulators, one converted k, v (resp. q, dout) row. */
#define BWD_SCRATCH (5 * BLK * VL_K_ATTN_DMAX)

/* delta per query row, then (in a second region: both read delta) dq per block of query rows
 * and dk, dv per block of key rows, blocks inside one (batch, head). The dtypes of q, k, v,
 * o, dout, dq, dk, dv. */
#define BWD_LOOP(QD, KD, VD, OD, DD, DQD, DKD, DVD)                                        \
  _Pragma("omp parallel for schedule(static) num_threads(nt)")                             \
  for (int64_t r = 0; r < rows; r++) vl_k_attn_delta_row(delta, dout, DD, o, OD, s, r);   \
  _Pragma("omp parallel num_threads(nt)") {                                                \
    float w[BWD_SCRATCH];                                                                  \
    _Pragma("omp for schedule(dynamic, 1) nowait") for (int64_t t = 0; t < qblks; t++) {   \
      int64_t bh = t / qpb, i0 = (t % qpb) * BLK;                                          \
      int n = (int)(a->Tq - i0 < BLK ? a->Tq - i0 : BLK);                                  \
      dq_blk(dq, DQD, dout, DD, lse, delta, q, QD, k, KD, v, VD, s, w, bh, i0, n);         \
    }                                                                                      \
    _Pragma("omp for schedule(dynamic, 1)") for (int64_t t = 0; t < kblks; t++) {          \
      int64_t bh = t / kpb, j0 = (t % kpb) * BLK;                                          \
      int n = (int)(a->Tk - j0 < BLK ? a->Tk - j0 : BLK);                                  \
      dkdv_blk(dk, DKD, dv, DVD, dout, DD, lse, delta, q, QD, k, KD, v, VD, s, w, bh, j0,  \
               n);                                                                         \
    }                                                                                      \
  }

static vl_status vl_cpu_attn_bwd(vl_ctx *c, const void *args) {
  const vl_attn_bwd_args *a = args;
  VL_TRY(vl_attn_check_ws(c, a));
  int64_t rows = a->B * a->H * a->Tq;
  int64_t qpb = (a->Tq + BLK - 1) / BLK, kpb = (a->Tk + BLK - 1) / BLK; /* blocks per head */
  int64_t qblks = a->B * a->H * qpb, kblks = a->B * a->H * kpb;
  vl_k_attn_dims s = dims_of(a->H, a->Tq, a->Tk, a->D, a->scale, a->causal);
  void *dq = a->dq->data, *dk = a->dk->data, *dv = a->dv->data;
  const void *dout = a->dout->data, *o = a->o->data, *q = a->q->data, *k = a->k->data,
             *v = a->v->data;
  const float *lse = a->lse->data;
  float *delta = a->ws; /* (B, H, Tq) */
  const vl_tensor *ts[8] = {a->q, a->k, a->v, a->o, a->dout, a->dq, a->dk, a->dv};
  int nt = vl_cpu_threads((double)rows * (double)a->Tk * (double)a->D * NS_ROW * 2);
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

/* ---- softmax, rotary embedding, head permutes ------------------------------------------ */

/* Each (t, d) angle once (T*D/2 sines and cosines, not B*T*H*D/2), then every (b, h) row at
 * position t rotated with it; per element the same values as vl_k_rope. */
#define ROPE_MAX_HALF 256
#define ROPE(XD)                                                                           \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t t = 0; t < T; t++) { \
    float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];                                            \
    for (int64_t d = 0; d < half; d++)                                                     \
      vl_k_rope_angle(t, d, D, theta, inverse, &cs[d], &sn[d]);                            \
    for (int64_t b = 0; b < B; b++)                                                        \
      for (int64_t h = 0; h < H; h++) {                                                    \
        int64_t base = ((b * T + t) * H + h) * D;                                          \
        for (int64_t d = 0; d < half; d++) vl_k_rope_pair(px, XD, base, d, half, cs[d], sn[d]); \
      }                                                                                    \
  }
static vl_status cpu_rope(vl_ctx *c, const void *p) {
  const vl_rope_args *a = p;
  void *px = a->x->data;
  int64_t B = a->B, T = a->T, H = a->H, D = a->D, half = D / 2, n = B * T * H * half;
  float theta = a->theta;
  int inverse = a->inverse;
  (void)c;
  if (half > ROPE_MAX_HALF) { /* wider heads than the angle table: angle per element */
    int nt = vl_cpu_threads((double)n * NS_TRIG);
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t i = 0; i < n; i++) vl_k_rope(px, dt(a->x), T, H, D, theta, inverse, i);
    return VL_OK;
  }
  int nt = vl_cpu_threads((double)n * NS_MEM * 2 + (double)(T * half) * NS_TRIG);
  if (a->x->dtype == VL_F32) ROPE(F32)
  else ROPE(dt(a->x))
  return VL_OK;
}

static vl_status cpu_permute(vl_ctx *c, const void *p) {
  const vl_permute_args *a = p;
  vl_tensor *y = a->y;
  const vl_tensor *x = a->x;
  int64_t T = a->T, H = a->H, D = a->D, n = a->B * T * H * D, rows = a->B * T * H;
  int back = a->back;
  if (y->dtype != x->dtype) return vl_fail(c, VL_ERR_INVALID, "permute: dtypes differ");
  /* whole rows of D contiguous elements: one copy per row, same index map as the kernel */
  size_t rb = vl_dtype_bytes(y->dtype, D);
  int nt = vl_cpu_threads((double)n * NS_MEM);
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t r = 0; r < rows; r++)
    memcpy((char *)y->data + r * rb,
           (const char *)x->data + vl_k_permute_src_row(T, H, back, r) * rb, rb);
  return VL_OK;
}

#define SOFTMAX_FWD(PD, SD)                                                                \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t r = 0; r < rows; r++) \
      vl_k_softmax_row(pP, PD, pS, SD, T, scale, causal, r)
static vl_status cpu_softmax_fwd(vl_ctx *c, const void *p) {
  const vl_softmax_fwd_args *a = p;
  void *pP = a->P->data;
  const void *pS = a->S->data;
  int64_t rows = a->rows, T = a->T;
  float scale = a->scale;
  int causal = a->causal;
  int nt = vl_cpu_threads((double)(rows * T) * (causal ? 0.5 : 1.0) * NS_EXP);
  (void)c;
  if (a->P->dtype == VL_F32 && a->S->dtype == VL_F32) SOFTMAX_FWD(F32, F32);
  else SOFTMAX_FWD(dt(a->P), dt(a->S));
  return VL_OK;
}

#define SOFTMAX_BWD(DD, PD)                                                                \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t r = 0; r < rows; r++) \
      vl_k_softmax_bwd_row(pdS, DD, pdP, DD, pP, PD, T, scale, causal, r)
static vl_status cpu_softmax_bwd(vl_ctx *c, const void *p) {
  const vl_softmax_bwd_args *a = p;
  void *pdS = a->dS->data;
  const void *pdP = a->dP->data, *pP = a->P->data;
  int64_t rows = a->rows, T = a->T;
  float scale = a->scale;
  int causal = a->causal;
  int nt = vl_cpu_threads((double)(rows * T) * NS_ROW);
  (void)c;
  if (all_f32(a->dS, a->dP, a->P)) {
    SOFTMAX_BWD(F32, F32);
  } else {
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < rows; r++)
      vl_k_softmax_bwd_row(pdS, dt(a->dS), pdP, dt(a->dP), pP, dt(a->P), T, scale, causal, r);
  }
  return VL_OK;
}

void vl_cpu_attn_ops(vl_backend *b) {
  b->ops[VL_OP_ATTN_FWD] = vl_cpu_attn_fwd;
  b->ops[VL_OP_ATTN_BWD] = vl_cpu_attn_bwd;
  b->ops[VL_OP_ROPE] = cpu_rope;
  b->ops[VL_OP_PERMUTE] = cpu_permute;
  b->ops[VL_OP_SOFTMAX_FWD] = cpu_softmax_fwd;
  b->ops[VL_OP_SOFTMAX_BWD] = cpu_softmax_bwd;
}
