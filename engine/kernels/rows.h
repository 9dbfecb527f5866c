/* Row-wise kernels: one call per row r (norms, softmax, cross-entropy) or per column. */
#ifndef VRAMLAB_K_ROWS_H
#define VRAMLAB_K_ROWS_H
#include "kcommon.h"

/* RMSNorm (Mistral): out = x / sqrt(mean(x^2) + eps) * w ; rstd[r] kept for backward. */
VL_HD static inline void vl_k_rmsnorm_fwd_row(void *out, int odt, float *rstd, const void *x,
                                              int xdt, const void *w, int wdt, int64_t C,
                                              float eps, int64_t r) {
  float ss = 0.0f;
  for (int64_t c = 0; c < C; c++) { float v = vl_ld(x, xdt, r * C + c); ss += v * v; }
  float rs = 1.0f / sqrtf(ss / (float)C + eps);
  rstd[r] = rs;
  for (int64_t c = 0; c < C; c++)
    vl_st(out, odt, r * C + c, vl_ld(x, xdt, r * C + c) * rs * vl_ld(w, wdt, c));
}

/* dx[r] += rstd*w*dy - rstd^3/C * x * sum(dy*w*x) */
VL_HD static inline void vl_k_rmsnorm_bwd_row(void *dx, int dxdt, const void *dy, int dydt,
                                              const void *x, int xdt, const void *w, int wdt,
                                              const float *rstd, int64_t C, int64_t r) {
  float rs = rstd[r], dot = 0.0f;
  for (int64_t c = 0; c < C; c++)
    dot += vl_ld(dy, dydt, r * C + c) * vl_ld(w, wdt, c) * vl_ld(x, xdt, r * C + c);
  float k = rs * rs * rs * dot / (float)C;
  for (int64_t c = 0; c < C; c++) {
    int64_t i = r * C + c;
    float g = rs * vl_ld(w, wdt, c) * vl_ld(dy, dydt, i) - k * vl_ld(x, xdt, i);
    vl_st(dx, dxdt, i, vl_ld(dx, dxdt, i) + g);
  }
}

/* Row r's term of dw[c]. */
VL_HD static inline float vl_k_rmsnorm_dw_term(const void *dy, int dydt, const void *x, int xdt,
                                               const float *rstd, int64_t C, int64_t r,
                                               int64_t c) {
  return vl_ld(dy, dydt, r * C + c) * vl_ld(x, xdt, r * C + c) * rstd[r];
}

/* dw[c] += sum_r dy[r,c] * x[r,c] * rstd[r], the sum in row order from 0. (The CPU takes
 * blocks of columns row by row: the same sums in the same order.) */
VL_HD static inline void vl_k_rmsnorm_dw_col(void *dw, int dwdt, const void *dy, int dydt,
                                             const void *x, int xdt, const float *rstd,
                                             int64_t R, int64_t C, int64_t c) {
  float acc = 0.0f;
  for (int64_t r = 0; r < R; r++) acc += vl_k_rmsnorm_dw_term(dy, dydt, x, xdt, rstd, C, r, c);
  vl_st(dw, dwdt, c, vl_ld(dw, dwdt, c) + acc);
}

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

/* Cross-entropy on row r: loss[r] = logsumexp(l) - l[t]; logits := s*(softmax - onehot).
 * Ignored rows (t < 0) get loss 0 and zero gradient. */
VL_HD static inline void vl_k_xent_row(void *logits, int ldt, float *loss, const int32_t *tgt,
                                       int64_t V, float s, int64_t r) {
  int64_t base = r * V;
  int32_t t = tgt[r];
  if (t < 0) {
    loss[r] = 0.0f;
    for (int64_t c = 0; c < V; c++) vl_st(logits, ldt, base + c, 0.0f);
    return;
  }
  float mx = -INFINITY;
  for (int64_t c = 0; c < V; c++) { float v = vl_ld(logits, ldt, base + c); mx = v > mx ? v : mx; }
  /* fp32 logits keep each exp in place (exact), so the last pass does not recompute it;
   * the target's logit is read first */
  float lt = vl_ld(logits, ldt, base + t), sum = 0.0f;
  for (int64_t c = 0; c < V; c++) {
    float e = expf(vl_ld(logits, ldt, base + c) - mx);
    sum += e;
    if (ldt == VL_K_F32) ((float *)logits)[base + c] = e;
  }
  loss[r] = logf(sum) + mx - lt;
  float inv = 1.0f / sum;
  for (int64_t c = 0; c < V; c++) {
    float e = ldt == VL_K_F32 ? ((float *)logits)[base + c]
                              : expf(vl_ld(logits, ldt, base + c) - mx);
    vl_st(logits, ldt, base + c, s * (e * inv - (c == t ? 1.0f : 0.0f)));
  }
}

#endif
