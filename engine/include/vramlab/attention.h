/* Multi-head scaled dot-product attention as a layer, two implementations behind one knob
 * (`attention=classic|efficient`), for Stable Diffusion's U-Net (self-attention over image
 * tokens, cross-attention to 77 text tokens), its VAE (one head) and CLIP (causal).
 *
 * Layout: q (B, Tq, H*D), k and v (B, Tk, H*D), o (B, Tq, H*D), as the projections write
 * them (head h in columns [h*D, (h+1)*D)); no permute copies. scale = 1/sqrt(D).
 *
 *   classic   materialises the scores: S = scale q k^T per head (B, H, Tq, Tk) in q's dtype,
 *             softmax in place (fp32 arithmetic), o = P v. Keeps P (B, H, Tq, Tk) in
 *             VL_MEM_ACTS for backward (diffusers' AttnProcessor, what SD 1.5 ran before
 *             SDPA): gigabytes at 64x64 latents.
 *   efficient one op (VL_OP_ATTN_FWD), tiled with an online softmax; keeps only the
 *             log-sum-exp (B, H, Tq) fp32 in VL_MEM_ACTS; backward recomputes the
 *             probabilities (SDPA's efficient / flash kernels, xformers).
 * Both give the same o, dq, dk, dv up to rounding (tests/test_attention.c). */
#ifndef VRAMLAB_ATTENTION_H
#define VRAMLAB_ATTENTION_H

#include "vramlab/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { VL_ATTN_CLASSIC = 0, VL_ATTN_EFFICIENT, VL_ATTN_IMPL_COUNT } vl_attn_impl;
const char *vl_attn_impl_name(vl_attn_impl impl); /* "classic", "efficient" */
int vl_attn_impl_parse(const char *s, vl_attn_impl *out); /* 0 on success */

/* What a forward keeps for its backward (all zero when it kept nothing). */
typedef struct {
  vl_attn_impl impl;
  int64_t B, H, Tq, Tk, D;
  bool causal;
  float scale;
  vl_tensor P;   /* classic: (B, H, Tq, Tk) probabilities, q's dtype, VL_MEM_ACTS */
  vl_tensor lse; /* efficient: (B, H, Tq) fp32 log-sum-exp, VL_MEM_ACTS */
} vl_attn_saved;

/* o (B, Tq, H*D), allocated by the caller, = attention(q, k, v). causal needs Tq == Tk;
 * 1 <= D <= 512; o must not overlap q, k or v. keep: store what the backward needs in `saved`
 * (VL_MEM_ACTS); otherwise everything the forward made is freed before it returns (frozen
 * encoders, a checkpointed block's first forward) and saved (may then be NULL) is zeroed.
 * Arguments are checked as the ops check theirs (engine/backend/attn_args.h), on plan
 * contexts too; on failure nothing stays allocated. */
vl_status vl_attention_fwd(vl_ctx *c, vl_attn_impl impl, vl_tensor *o, const vl_tensor *q,
                           const vl_tensor *k, const vl_tensor *v, int64_t B, int64_t H,
                           int64_t Tq, int64_t Tk, int64_t D, bool causal, bool keep,
                           vl_attn_saved *saved);
/* dq, dk, dv (overwritten; same layouts as q, k, v; none over an input or another) from dout
 * (B, Tq, H*D); o, q, k, v are the forward's (the efficient backward reads o, the classic one
 * accepts NULL). Frees what `saved` holds, also when it fails. */
vl_status vl_attention_bwd(vl_ctx *c, vl_attn_saved *saved, vl_tensor *dq, vl_tensor *dk,
                           vl_tensor *dv, const vl_tensor *dout, const vl_tensor *o,
                           const vl_tensor *q, const vl_tensor *k, const vl_tensor *v);
void vl_attn_saved_free(vl_ctx *c, vl_attn_saved *s); /* idempotent */

#ifdef __cplusplus
}
#endif
#endif
