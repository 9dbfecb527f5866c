/* Element-wise kernels: one call per element index i. */
#ifndef VRAMLAB_K_ELEM_H
#define VRAMLAB_K_ELEM_H
#include "kcommon.h"

VL_HD static inline void vl_k_convert(void *y, int ydt, const void *x, int xdt, int64_t i) {
  vl_st(y, ydt, i, vl_ld(x, xdt, i));
}

VL_HD static inline void vl_k_axpby(void *y, int ydt, float a, const void *x, int xdt, float b,
                                    int64_t i) {
  float yv = b == 0.0f ? 0.0f : b * vl_ld(y, ydt, i); /* b=0 ignores NaN garbage in y */
  vl_st(y, ydt, i, a * vl_ld(x, xdt, i) + yv);
}

/* out = silu(g) * u */
VL_HD static inline void vl_k_swiglu_fwd(void *out, int odt, const void *g, const void *u,
                                         int dt, int64_t i) {
  float gv = vl_ld(g, dt, i), uv = vl_ld(u, dt, i);
  float s = 1.0f / (1.0f + expf(-gv));
  vl_st(out, odt, i, gv * s * uv);
}

VL_HD static inline void vl_k_swiglu_bwd(void *dg, void *du, int gdt, const void *dout, int odt,
                                         const void *g, const void *u, int dt, int64_t i) {
  float gv = vl_ld(g, dt, i), uv = vl_ld(u, dt, i), d = vl_ld(dout, odt, i);
  float s = 1.0f / (1.0f + expf(-gv));
  vl_st(dg, gdt, i, d * uv * s * (1.0f + gv * (1.0f - s)));
  vl_st(du, gdt, i, d * gv * s);
}

/* out[r, c] = wte[tok[r], c] ; i = r*C + c */
VL_HD static inline void vl_k_embed_fwd(void *out, int odt, const void *wte, int wdt,
                                        const int32_t *tok, int64_t C, int64_t i) {
  int64_t r = i / C, c = i % C;
  vl_st(out, odt, i, vl_ld(wte, wdt, (int64_t)tok[r] * C + c));
}

/* Row r's contribution to column c of dwte. */
VL_HD static inline void vl_k_embed_bwd_add(void *dwte, int wdt, const void *dout, int odt,
                                            const int32_t *tok, int64_t C, int64_t r, int64_t c) {
  int64_t j = (int64_t)tok[r] * C + c;
  vl_st(dwte, wdt, j, vl_ld(dwte, wdt, j) + vl_ld(dout, odt, r * C + c));
}

/* Column c of dwte accumulates over all rows in row order: deterministic, no atomics. (The
 * CPU takes blocks of columns row by row: the same adds in the same order per column.) */
VL_HD static inline void vl_k_embed_bwd_col(void *dwte, int wdt, const void *dout, int odt,
                                            const int32_t *tok, int64_t R, int64_t C, int64_t c) {
  for (int64_t r = 0; r < R; r++) vl_k_embed_bwd_add(dwte, wdt, dout, odt, tok, C, r, c);
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
