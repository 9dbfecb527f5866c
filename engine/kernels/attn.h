/* Attention kernels: memory-efficient attention (VL_OP_ATTN_FWD / VL_OP_ATTN_BWD), and at the
 * end the pieces around the materialised form (softmax of a score matrix, rotary embedding,
 * the (B,T,H,D) <-> (B,H,T,D) head permutes): the single-source bodies the CPU backend loops
 * over (cpu_attn.c) and the CUDA backend launches (cuda_attn.cu).
 *
 * Layout (vramlab/ops.h): q, o, dout, dq (B, Tq, H*D); k, v, dk, dv (B, Tk, H*D), head h in
 * columns [h*D, (h+1)*D); lse and delta (B, H, Tq) fp32. A query row is r = (b*H + h)*Tq + i
 * (the index of lse), a key row rk = (b*H + h)*Tk + j. causal (Tq == Tk): query i sees keys
 * 0..i.
 *
 *   forward   per query row: scores of key tiles of VL_K_ATTN_TILE, an online softmax (the
 *             running max m and sum l rescale the fp32 accumulator when the max grows),
 *             o = acc / l, lse = m + log l. No (Tq, Tk) row is ever stored.
 *   backward  delta_i = rowsum(dout_i * o_i) (per query row, into the workspace); then
 *             dq_i = scale sum_j p_ij (dp_ij - delta_i) k_j per query row, and
 *             dk_j = scale sum_i p_ij (dp_ij - delta_i) q_i, dv_j = sum_i p_ij dout_i per key
 *             row, each recomputing p_ij = exp(scale q_i.k_j - lse_i) and dp_ij = dout_i.v_j.
 * Every output element is written by one call, every sum is taken in a fixed order: results
 * do not depend on threads or scheduling. The score q_i.k_j (and dp_ij) is the same dot
 * product (same products, same order) in every pass, so the two backward passes recompute
 * bit-identical p_ij.
 *
 * Scratch: each call gets fp32 scratch w of VL_K_ATTN_WS_*(D) floats, element x at w[x * ws]:
 * the CPU passes a stack array with ws = 1, CUDA a slice of shared memory interleaved across
 * the block's threads (ws = blockDim.x, free of bank conflicts). */
#ifndef VRAMLAB_K_ATTN_H
#define VRAMLAB_K_ATTN_H
#include "kcommon.h"

/* The CPU backend calls the bodies with constant dtypes (cpu_attn.c): forced inlining folds
 * the dtype switches. nvcc inlines device functions on its own. */
#if defined(__CUDACC__)
#define VL_K_ATTN_INL
#else
#define VL_K_ATTN_INL __attribute__((always_inline))
#endif

/* The CPU vectorises the 8-lane loops (lanes independent: the same results as scalar). */
#if defined(_OPENMP) && !defined(__CUDACC__)
#define VL_K_ATTN_SIMD _Pragma("omp simd")
#else
#define VL_K_ATTN_SIMD
#endif

#define VL_K_ATTN_DMAX 512 /* head dim limit: SD's U-Net 40..160, its VAE's one head 512 */
#define VL_K_ATTN_TILE 32  /* keys per online-softmax step */
/* Scratch floats of one call per body, and the most any body needs. */
#define VL_K_ATTN_WS_FWD(D) (2 * (D) + VL_K_ATTN_TILE) /* q row, accumulator, tile scores */
#define VL_K_ATTN_WS_DQ(D) (3 * (D))                   /* q row, dout row, dq */
#define VL_K_ATTN_WS_DKDV(D) (4 * (D))                 /* k row, v row, dk, dv */
#define VL_K_ATTN_WS(D) (4 * (D) + VL_K_ATTN_TILE)

/* The shape of one call, passed by value to every body. */
typedef struct {
  int64_t H, Tq, Tk, D;
  float scale;
  int causal;
} vl_k_attn_dims;

/* t[0..8) = x[off .. off + 8) as fp32. On F16C hosts fp16 takes one vector conversion
 * (exact, like the scalar one: the same values, 8x fewer instructions). */
VL_HD VL_K_ATTN_INL static inline void vl_k_attn_ld8(float *t, const void *x, int xdt,
                                                     int64_t off) {
#ifdef VL_HOST_F16C
  if (xdt == VL_K_F16) {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + off));
    _mm256_storeu_ps(t, _mm256_cvtph_ps(h));
    return;
  }
#endif
  for (int u = 0; u < 8; u++) t[u] = vl_ld(x, xdt, off + u);
}

/* s[u] += a[u*as] * x[off + u] for u < 8 */
VL_HD VL_K_ATTN_INL static inline void vl_k_attn_fma8(float *s, const float *a, int64_t as,
                                                      const void *x, int xdt, int64_t off) {
  float t[8];
  vl_k_attn_ld8(t, x, xdt, off);
  VL_K_ATTN_SIMD for (int u = 0; u < 8; u++) s[u] += a[u * as] * t[u];
}

/* sum_d a[d*as] * x[off + d] in fp32: 32 independent partial sums over runs of 32 (four
 * 8-wide vector chains on the CPU, so the adds do not wait on each other), a run of 8 into
 * the first 8, the last D % 8 on their own, then a fixed tree: the same order everywhere. */
VL_HD VL_K_ATTN_INL static inline float vl_k_attn_dot(const float *a, int64_t as, const void *x,
                                                      int xdt, int64_t off, int64_t D) {
  float s0[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  float s1[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  float s2[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  float s3[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t d = 0;
  for (; d + 32 <= D; d += 32) {
    vl_k_attn_fma8(s0, a + d * as, as, x, xdt, off + d);
    vl_k_attn_fma8(s1, a + (d + 8) * as, as, x, xdt, off + d + 8);
    vl_k_attn_fma8(s2, a + (d + 16) * as, as, x, xdt, off + d + 16);
    vl_k_attn_fma8(s3, a + (d + 24) * as, as, x, xdt, off + d + 24);
  }
  for (; d + 8 <= D; d += 8) vl_k_attn_fma8(s0, a + d * as, as, x, xdt, off + d);
  float r = 0.0f;
  for (; d < D; d++) r += a[d * as] * vl_ld(x, xdt, off + d);
  for (int u = 0; u < 8; u++) s0[u] = (s0[u] + s1[u]) + (s2[u] + s3[u]);
  return (((s0[0] + s0[1]) + (s0[2] + s0[3])) + ((s0[4] + s0[5]) + (s0[6] + s0[7]))) + r;
}

/* acc[d*as] += p * x[off + d] for d < D */
VL_HD VL_K_ATTN_INL static inline void
vl_k_attn_axpy(float *acc, int64_t as, float p, const void *x, int xdt, int64_t off, int64_t D) {
  float t[8];
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) {
    vl_k_attn_ld8(t, x, xdt, off + d);
    VL_K_ATTN_SIMD for (int u = 0; u < 8; u++) acc[(d + u) * as] += p * t[u];
  }
  for (; d < D; d++) acc[d * as] += p * vl_ld(x, xdt, off + d);
}

/* a[d*as] = x[off + d] for d < D */
VL_HD VL_K_ATTN_INL static inline void vl_k_attn_load(float *a, int64_t as, const void *x, int xdt,
                                                      int64_t off, int64_t D) {
  for (int64_t d = 0; d < D; d++) a[d * as] = vl_ld(x, xdt, off + d);
}

/* Offset of row t of head h in batch b of a (B, T, H*D) tensor. */
VL_HD VL_K_ATTN_INL static inline int64_t vl_k_attn_off(const vl_k_attn_dims *s, int64_t b,
                                                        int64_t h, int64_t T, int64_t t) {
  return (b * T + t) * s->H * s->D + h * s->D;
}

/* Forward of query row r: o row and lse[r]. Scratch: q row, accumulator, the tile's scores. */
VL_HD VL_K_ATTN_INL static inline void
vl_k_attn_fwd_row(void *o, int odt, float *lse, const void *q, int qdt, const void *k, int kdt,
                  const void *v, int vdt, vl_k_attn_dims s, float *w, int64_t ws, int64_t r) {
  int64_t D = s.D, HD = s.H * s.D;
  int64_t i = r % s.Tq, bh = r / s.Tq, h = bh % s.H, b = bh / s.H;
  int64_t qo = vl_k_attn_off(&s, b, h, s.Tq, i), k0 = vl_k_attn_off(&s, b, h, s.Tk, 0);
  int64_t nk = s.causal ? i + 1 : s.Tk;
  float *qf = w, *acc = w + D * ws, *sc = w + 2 * D * ws;
  vl_k_attn_load(qf, ws, q, qdt, qo, D);
  for (int64_t d = 0; d < D; d++) acc[d * ws] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = 0; j0 < nk; j0 += VL_K_ATTN_TILE) {
    int64_t nt = nk - j0 < VL_K_ATTN_TILE ? nk - j0 : VL_K_ATTN_TILE;
    float tm = -INFINITY;
    for (int64_t t = 0; t < nt; t++) {
      float x = s.scale * vl_k_attn_dot(qf, ws, k, kdt, k0 + (j0 + t) * HD, D);
      sc[t * ws] = x;
      tm = x > tm ? x : tm;
    }
    float mn = tm > m ? tm : m;
    float corr = expf(m - mn); /* 0 on the first tile (m = -inf): acc and l are 0 */
    l *= corr;
    for (int64_t d = 0; d < D; d++) acc[d * ws] *= corr;
    for (int64_t t = 0; t < nt; t++) {
      float p = expf(sc[t * ws] - mn);
      int64_t vo = k0 + (j0 + t) * HD;
      l += p;
      vl_k_attn_axpy(acc, ws, p, v, vdt, vo, D);
    }
    m = mn;
  }
  float inv = 1.0f / l;
  for (int64_t d = 0; d < D; d++) vl_st(o, odt, qo + d, acc[d * ws] * inv);
  lse[r] = m + logf(l);
}

/* delta[r] = sum_d dout * o over query row r. */
VL_HD VL_K_ATTN_INL static inline void vl_k_attn_delta_row(float *delta, const void *dout, int ddt,
                                                           const void *o, int odt, vl_k_attn_dims s,
                                                           int64_t r) {
  int64_t i = r % s.Tq, bh = r / s.Tq, h = bh % s.H, b = bh / s.H;
  int64_t qo = vl_k_attn_off(&s, b, h, s.Tq, i);
  float acc = 0.0f;
  for (int64_t d = 0; d < s.D; d++) acc += vl_ld(dout, ddt, qo + d) * vl_ld(o, odt, qo + d);
  delta[r] = acc;
}

/* dq of query row r. Scratch: q row, dout row, dq accumulator. */
VL_HD VL_K_ATTN_INL static inline void
vl_k_attn_dq_row(void *dq, int dqdt, const void *dout, int ddt, const float *lse,
                 const float *delta, const void *q, int qdt, const void *k, int kdt, const void *v,
                 int vdt, vl_k_attn_dims s, float *w, int64_t ws, int64_t r) {
  int64_t D = s.D, HD = s.H * s.D;
  int64_t i = r % s.Tq, bh = r / s.Tq, h = bh % s.H, b = bh / s.H;
  int64_t qo = vl_k_attn_off(&s, b, h, s.Tq, i), k0 = vl_k_attn_off(&s, b, h, s.Tk, 0);
  int64_t nk = s.causal ? i + 1 : s.Tk;
  float *qf = w, *df = w + D * ws, *acc = w + 2 * D * ws;
  vl_k_attn_load(qf, ws, q, qdt, qo, D);
  vl_k_attn_load(df, ws, dout, ddt, qo, D);
  for (int64_t d = 0; d < D; d++) acc[d * ws] = 0.0f;
  float L = lse[r], dl = delta[r];
  for (int64_t j = 0; j < nk; j++) {
    int64_t ko = k0 + j * HD;
    float p = expf(s.scale * vl_k_attn_dot(qf, ws, k, kdt, ko, D) - L);
    float ds = p * (vl_k_attn_dot(df, ws, v, vdt, ko, D) - dl);
    vl_k_attn_axpy(acc, ws, ds, k, kdt, ko, D);
  }
  for (int64_t d = 0; d < D; d++) vl_st(dq, dqdt, qo + d, s.scale * acc[d * ws]);
}

/* dk and dv of key row rk. Scratch: k row, v row, dk and dv accumulators. */
VL_HD VL_K_ATTN_INL static inline void
vl_k_attn_dkdv_row(void *dk, int dkdt, void *dv, int dvdt, const void *dout, int ddt,
                   const float *lse, const float *delta, const void *q, int qdt, const void *k,
                   int kdt, const void *v, int vdt, vl_k_attn_dims s, float *w, int64_t ws,
                   int64_t rk) {
  int64_t D = s.D, HD = s.H * s.D;
  int64_t j = rk % s.Tk, bh = rk / s.Tk, h = bh % s.H, b = bh / s.H;
  int64_t ko = vl_k_attn_off(&s, b, h, s.Tk, j), q0 = vl_k_attn_off(&s, b, h, s.Tq, 0);
  float *kf = w, *vf = w + D * ws, *gk = w + 2 * D * ws, *gv = w + 3 * D * ws;
  vl_k_attn_load(kf, ws, k, kdt, ko, D);
  vl_k_attn_load(vf, ws, v, vdt, ko, D);
  for (int64_t d = 0; d < D; d++) gk[d * ws] = gv[d * ws] = 0.0f;
  for (int64_t i = s.causal ? j : 0; i < s.Tq; i++) {
    int64_t qo = q0 + i * HD, ri = bh * s.Tq + i;
    float p = expf(s.scale * vl_k_attn_dot(kf, ws, q, qdt, qo, D) - lse[ri]);
    float ds = p * (vl_k_attn_dot(vf, ws, dout, ddt, qo, D) - delta[ri]);
    vl_k_attn_axpy(gv, ws, p, dout, ddt, qo, D);
    vl_k_attn_axpy(gk, ws, ds, q, qdt, qo, D);
  }
  for (int64_t d = 0; d < D; d++) {
    vl_st(dk, dkdt, ko + d, s.scale * gk[d * ws]);
    vl_st(dv, dvdt, ko + d, gv[d * ws]);
  }
}

/* ---- around the attention: softmax of a score matrix, rotary embedding, head permutes --- */

/* Softmax of scale*S over row r of T columns; causal: query position r % T sees columns
 * 0..r % T and the masked ones get 0. */
VL_HD static inline void vl_k_softmax_row(void *P, int pdt, const void *S, int sdt, int64_t T,
                                          float scale, int causal, int64_t r) {
  int64_t q = causal ? r % T : T - 1, base = r * T;
  float mx = -INFINITY;
  for (int64_t c = 0; c <= q; c++) { float v = scale * vl_ld(S, sdt, base + c); mx = v > mx ? v : mx; }
  /* An fp32 P keeps each exp where its probability goes (exact: the same value the last
   * pass would recompute; S[c] is not read again if P is S): one exp per score, not two. */
  float sum = 0.0f;
  for (int64_t c = 0; c <= q; c++) {
    float e = expf(scale * vl_ld(S, sdt, base + c) - mx);
    sum += e;
    if (pdt == VL_K_F32) ((float *)P)[base + c] = e;
  }
  float inv = 1.0f / sum;
  for (int64_t c = 0; c <= q; c++) {
    float e = pdt == VL_K_F32 ? ((float *)P)[base + c] : expf(scale * vl_ld(S, sdt, base + c) - mx);
    vl_st(P, pdt, base + c, e * inv);
  }
  for (int64_t c = q + 1; c < T; c++) vl_st(P, pdt, base + c, 0.0f);
}

VL_HD static inline void vl_k_softmax_bwd_row(void *dS, int ddt, const void *dP, int dpdt,
                                              const void *P, int pdt, int64_t T, float scale,
                                              int causal, int64_t r) {
  int64_t q = causal ? r % T : T - 1, base = r * T;
  float dot = 0.0f;
  for (int64_t c = 0; c <= q; c++) dot += vl_ld(P, pdt, base + c) * vl_ld(dP, dpdt, base + c);
  for (int64_t c = 0; c <= q; c++) {
    float p = vl_ld(P, pdt, base + c);
    vl_st(dS, ddt, base + c, scale * p * (vl_ld(dP, dpdt, base + c) - dot));
  }
  for (int64_t c = q + 1; c < T; c++) vl_st(dS, ddt, base + c, 0.0f);
}

/* Source row (of D elements) of destination row r for (B,T,H,D) <-> (B,H,T,D). */
VL_HD static inline int64_t vl_k_permute_src_row(int64_t T, int64_t H, int back, int64_t r) {
  if (!back) { /* y is (B,H,T,D): r = (b*H + h)*T + t */
    int64_t t = r % T, h = (r / T) % H, b = r / (T * H);
    return (b * T + t) * H + h;
  }
  /* y is (B,T,H,D): r = (b*T + t)*H + h */
  int64_t h = r % H, t = (r / H) % T, b = r / (T * H);
  return (b * H + h) * T + t;
}

/* (B,T,H,D) <-> (B,H,T,D); i indexes the destination. */
VL_HD static inline void vl_k_permute(void *y, const void *x, int dt, int64_t T, int64_t H,
                                      int64_t D, int back, int64_t i) {
  int64_t src = vl_k_permute_src_row(T, H, back, i / D) * D + i % D;
  vl_st(y, dt, i, vl_ld(x, dt, src));
}

/* Rotary embedding, HF "rotate_half" layout: pairs (d, d + D/2). The angle of pair d at
 * position t, as its cosine and sine (the sine negated for the inverse rotation). */
VL_HD static inline void vl_k_rope_angle(int64_t t, int64_t d, int64_t D, float theta, int inverse,
                                         float *cs, float *sn) {
  float inv_freq = 1.0f / powf(theta, (float)(2 * d) / (float)D);
  float ang = (float)t * inv_freq;
  *cs = cosf(ang);
  *sn = inverse ? -sinf(ang) : sinf(ang);
}

/* Rotates the pair (d, d + half) of the row of D = 2*half elements starting at base. */
VL_HD static inline void vl_k_rope_pair(void *x, int dt, int64_t base, int64_t d, int64_t half,
                                        float cs, float sn) {
  float x1 = vl_ld(x, dt, base + d), x2 = vl_ld(x, dt, base + d + half);
  vl_st(x, dt, base + d, x1 * cs - x2 * sn);
  vl_st(x, dt, base + d + half, x2 * cs + x1 * sn);
}

/* One pair; i indexes (B,T,H,D/2). (The CPU computes each (t, d) angle once and rotates
 * every (b, h) row with it: the same values.) */
VL_HD static inline void vl_k_rope(void *x, int dt, int64_t T, int64_t H, int64_t D,
                                   float theta, int inverse, int64_t i) {
  int64_t half = D / 2;
  int64_t d = i % half, r = i / half; /* r = (b*T + t)*H + h */
  int64_t t = (r / H) % T;
  float cs, sn;
  vl_k_rope_angle(t, d, D, theta, inverse, &cs, &sn);
  vl_k_rope_pair(x, dt, r * D, d, half, cs, sn);
}

#endif
