/* Embedding kernels: token embedding (forward gather, deterministic column-wise backward)
 * and the diffusion timestep embedding. Single-source bodies (cpu_embed.c, cuda_embed.cu). */
#ifndef VRAMLAB_K_EMBED_H
#define VRAMLAB_K_EMBED_H
#include "kcommon.h"

/* ---- timestep embedding (diffusers' get_timestep_embedding) ----------------------------- */

/* Element i = b*dim + k of emb (B, dim), half = dim/2, j = k mod half:
 * e = t[b] exp(-ln(max_period) j / (half - shift)), in fp32 as diffusers computes it;
 * the first half is sin e and the second cos e, swapped when flip. */
VL_HD static inline void vl_k_timestep_embed(void *emb, int edt, const int32_t *t, int64_t dim,
                                             int flip, float shift, float max_period, int64_t i) {
  int64_t b = i / dim, k = i - b * dim, half = dim / 2;
  int second = k >= half;
  int64_t j = second ? k - half : k;
  float ex = -logf(max_period) * (float)j;
  ex = ex / ((float)half - shift);
  float e = (float)t[b] * expf(ex);
  int use_cos = second != (flip != 0);
  vl_st(emb, edt, i, use_cos ? cosf(e) : sinf(e));
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

#endif
