/* Multi-head scaled dot-product attention as a layer (vramlab/attention.h): the classic
 * implementation (batched GEMMs around a materialised (B, H, Tq, Tk) score tensor) and the
 * memory-efficient one (VL_OP_ATTN_FWD / VL_OP_ATTN_BWD).
 *
 * Both read q (B, Tq, H*D) and k, v (B, Tk, H*D) where the projections wrote them: a GEMM of
 * head h of batch b starts at column h*D with leading dimension H*D, and the H heads of one
 * batch are one batched GEMM (batch H, stride D). Batches are separate calls because the
 * head stride (D) and the batch stride (T*H*D) differ.
 *
 * Memory, in allocation order (the plan backend replays it to the byte):
 *   classic fwd    P (B, H, Tq, Tk), q's dtype: VL_MEM_ACTS when keep, else VL_MEM_TEMP freed
 *                  after o = P v.
 *   classic bwd    dP (B, H, Tq, Tk) temp; dv = P^T dout; dS in place of dP; P freed; dq, dk;
 *                  dS freed.
 *   efficient fwd  lse (B, H, Tq) fp32: VL_MEM_ACTS when keep, else temp freed at once.
 *   efficient bwd  the op's workspace (delta, from vl_op_run); lse freed.
 * Both check their arguments with the ops' checker (engine/backend/attn_args.h), on plan
 * contexts too, so a bad call is refused the same way whatever the device. */
#include <math.h>
#include <string.h>

#include "vramlab/attention.h"
#include "../backend/attn_args.h"

static const char *const IMPL[VL_ATTN_IMPL_COUNT] = {"classic", "efficient"};

const char *vl_attn_impl_name(vl_attn_impl impl) {
  return (unsigned)impl < VL_ATTN_IMPL_COUNT ? IMPL[impl] : "?";
}

int vl_attn_impl_parse(const char *s, vl_attn_impl *out) {
  for (int i = 0; s && i < VL_ATTN_IMPL_COUNT; i++)
    if (!strcmp(s, IMPL[i])) {
      *out = (vl_attn_impl)i;
      return 0;
    }
  return -1;
}

void vl_attn_saved_free(vl_ctx *c, vl_attn_saved *s) {
  if (!s) return;
  vl_tensor_free(c, &s->lse);
  vl_tensor_free(c, &s->P);
  memset(s, 0, sizeof *s);
}

/* ---- classic ------------------------------------------------------------------------------ */

/* One head-batched GEMM per batch b: C_bh = alpha op(A_bh) op(B_bh), h < H. Operands are given
 * by their per-batch offsets (elements per b), leading dimensions and per-head strides. */
typedef struct {
  const vl_tensor *t;
  int64_t per_b, ld, per_h;
} operand;

static vl_status head_gemms(vl_ctx *c, int64_t B, int64_t H, bool ta, bool tb, int64_t M,
                            int64_t N, int64_t K, operand a, operand b, vl_tensor *C,
                            int64_t c_per_b, int64_t ldc, int64_t c_per_h) {
  for (int64_t i = 0; i < B; i++) {
    vl_gemm g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = 1.0f, .beta = 0.0f,
                 .A = a.t, .a_off = i * a.per_b, .lda = a.ld, .sa = a.per_h,
                 .B = b.t, .b_off = i * b.per_b, .ldb = b.ld, .sb = b.per_h,
                 .C = C, .c_off = i * c_per_b, .ldc = ldc, .sc = c_per_h, .batch = H};
    VL_TRY(vl_gemm_run(c, &g));
  }
  return VL_OK;
}

/* Operands in the projections' layout: (B, T, H*D), head h at column h*D. */
static operand rows_of(const vl_tensor *t, int64_t T, int64_t H, int64_t D) {
  operand o = {t, T * H * D, H * D, D};
  return o;
}
/* Operands in the scores' layout: (B, H, Tq, Tk). */
static operand scores_of(const vl_tensor *t, int64_t H, int64_t Tq, int64_t Tk) {
  operand o = {t, H * Tq * Tk, Tk, Tq * Tk};
  return o;
}

static vl_status classic_fwd(vl_ctx *c, vl_attn_saved *sv, vl_tensor *o, const vl_tensor *q,
                             const vl_tensor *k, const vl_tensor *v, bool keep) {
  int64_t B = sv->B, H = sv->H, Tq = sv->Tq, Tk = sv->Tk, D = sv->D, HD = H * D;
  int64_t shape[4] = {B, H, Tq, Tk};
  vl_tensor *P = &sv->P; // (B, H, Tq, Tk): the scores, then the probabilities in place
  VL_TRY(vl_tensor_alloc(c, P, q->dtype, keep ? VL_MEM_ACTS : VL_MEM_TEMP, 4, shape));
  vl_status s = head_gemms(c, B, H, false, true, Tq, Tk, D, rows_of(q, Tq, H, D),
                           rows_of(k, Tk, H, D), P, H * Tq * Tk, Tk, Tq * Tk);
  if (s == VL_OK)
    s = vl_softmax_fwd_run(c, &(vl_softmax_fwd_args){.P = P, .S = P, .rows = B * H * Tq, .T = Tk,
                                                     .scale = sv->scale, .causal = sv->causal});
  if (s == VL_OK) // o (B, Tq, H*D) = P v per head
    s = head_gemms(c, B, H, false, false, Tq, D, Tk, scores_of(P, H, Tq, Tk), rows_of(v, Tk, H, D),
                   o, Tq * HD, HD, D);
  if (s != VL_OK || !keep) vl_tensor_free(c, P);
  return s;
}

static vl_status classic_bwd(vl_ctx *c, vl_attn_saved *sv, vl_tensor *dq, vl_tensor *dk,
                             vl_tensor *dv, const vl_tensor *dout, const vl_tensor *q,
                             const vl_tensor *k, const vl_tensor *v) {
  int64_t B = sv->B, H = sv->H, Tq = sv->Tq, Tk = sv->Tk, D = sv->D, HD = H * D;
  int64_t shape[4] = {B, H, Tq, Tk};
  vl_tensor *P = &sv->P, dP; // (B, H, Tq, Tk) each
  operand pP = scores_of(P, H, Tq, Tk), pdS = scores_of(&dP, H, Tq, Tk);
  VL_TRY(vl_tensor_alloc(c, &dP, P->dtype, VL_MEM_TEMP, 4, shape));
  // dP = dout v^T; dv (B, Tk, H*D) = P^T dout
  vl_status s = head_gemms(c, B, H, false, true, Tq, Tk, D, rows_of(dout, Tq, H, D),
                           rows_of(v, Tk, H, D), &dP, H * Tq * Tk, Tk, Tq * Tk);
  if (s == VL_OK)
    s = head_gemms(c, B, H, true, false, Tk, D, Tq, pP, rows_of(dout, Tq, H, D), dv, Tk * HD, HD,
                   D);
  // dS = scale P (dP - rowsum(dP P)), in place of dP; P is read for the last time
  if (s == VL_OK)
    s = vl_softmax_bwd_run(c, &(vl_softmax_bwd_args){.dS = &dP, .dP = &dP, .P = P,
                                                      .rows = B * H * Tq, .T = Tk,
                                                      .scale = sv->scale, .causal = sv->causal});
  vl_tensor_free(c, P);
  // dq (B, Tq, H*D) = dS k; dk (B, Tk, H*D) = dS^T q
  if (s == VL_OK)
    s = head_gemms(c, B, H, false, false, Tq, D, Tk, pdS, rows_of(k, Tk, H, D), dq, Tq * HD, HD, D);
  if (s == VL_OK)
    s = head_gemms(c, B, H, true, false, Tk, D, Tq, pdS, rows_of(q, Tq, H, D), dk, Tk * HD, HD, D);
  vl_tensor_free(c, &dP);
  return s;
}

/* ---- efficient ------------------------------------------------------------------------------ */

static vl_status efficient_fwd(vl_ctx *c, vl_attn_saved *sv, vl_tensor *o, const vl_tensor *q,
                               const vl_tensor *k, const vl_tensor *v, bool keep) {
  int64_t shape[3] = {sv->B, sv->H, sv->Tq};
  vl_tensor *lse = &sv->lse; // (B, H, Tq) fp32
  VL_TRY(vl_tensor_alloc(c, lse, VL_F32, keep ? VL_MEM_ACTS : VL_MEM_TEMP, 3, shape));
  vl_status s = vl_attn_fwd_run(c, &(vl_attn_fwd_args){.o = o, .lse = lse, .q = q, .k = k, .v = v,
                                                       .B = sv->B, .H = sv->H, .Tq = sv->Tq,
                                                       .Tk = sv->Tk, .D = sv->D, .scale = sv->scale,
                                                       .causal = sv->causal});
  if (s != VL_OK || !keep) vl_tensor_free(c, lse);
  return s;
}

static vl_status efficient_bwd(vl_ctx *c, vl_attn_saved *sv, vl_tensor *dq, vl_tensor *dk,
                               vl_tensor *dv, const vl_tensor *dout, const vl_tensor *o,
                               const vl_tensor *q, const vl_tensor *k, const vl_tensor *v) {
  vl_attn_bwd_args a = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .o = o, .lse = &sv->lse,
                        .q = q, .k = k, .v = v, .B = sv->B, .H = sv->H, .Tq = sv->Tq,
                        .Tk = sv->Tk, .D = sv->D, .scale = sv->scale, .causal = sv->causal};
  vl_status s = vl_attn_bwd_run(c, &a); // workspace: delta (B, H, Tq) fp32, from vl_op_run
  vl_tensor_free(c, &sv->lse);
  return s;
}

/* ---- the layer ------------------------------------------------------------------------------ */

vl_status vl_attention_fwd(vl_ctx *c, vl_attn_impl impl, vl_tensor *o, const vl_tensor *q,
                           const vl_tensor *k, const vl_tensor *v, int64_t B, int64_t H,
                           int64_t Tq, int64_t Tk, int64_t D, bool causal, bool keep,
                           vl_attn_saved *saved) {
  const char *op = "attention";
  if (saved) memset(saved, 0, sizeof *saved);
  if ((unsigned)impl >= VL_ATTN_IMPL_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "%s: implementation %d is not classic or efficient", op,
                   (int)impl);
  if (keep && !saved)
    return vl_fail(c, VL_ERR_INVALID, "%s: keep without a place to save the state", op);
  float scale = D > 0 ? 1.0f / sqrtf((float)D) : 0.0f;
  int64_t nq = 0, nk = 0, nr = 0;
  VL_TRY(vl_attn_check_dims(c, op, B, H, Tq, Tk, D, scale, causal, &nq, &nk, &nr));
  VL_TRY(vl_attn_check_io(c, op, o, q, k, v, nq, nk));
  const vl_tensor *in[3] = {q, k, v};
  const char *inn[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++)
    VL_TRY(vl_attn_disjoint(c, op, o, nq, "o", in[i], i ? nk : nq, inn[i]));
  vl_attn_saved sv;
  memset(&sv, 0, sizeof sv);
  sv.impl = impl;
  sv.B = B, sv.H = H, sv.Tq = Tq, sv.Tk = Tk, sv.D = D;
  sv.causal = causal;
  sv.scale = scale;
  vl_status s = impl == VL_ATTN_CLASSIC ? classic_fwd(c, &sv, o, q, k, v, keep)
                                        : efficient_fwd(c, &sv, o, q, k, v, keep);
  if (s == VL_OK && keep) *saved = sv;
  return s;
}

vl_status vl_attention_bwd(vl_ctx *c, vl_attn_saved *saved, vl_tensor *dq, vl_tensor *dk,
                           vl_tensor *dv, const vl_tensor *dout, const vl_tensor *o,
                           const vl_tensor *q, const vl_tensor *k, const vl_tensor *v) {
  const char *op = "attention backward";
  if (!saved) return vl_fail(c, VL_ERR_INVALID, "%s: no saved state", op);
  vl_attn_saved *sv = saved;
  vl_status s = VL_OK;
  int64_t nq = 0, nk = 0, nr = 0;
  if ((unsigned)sv->impl >= VL_ATTN_IMPL_COUNT ||
      !(sv->impl == VL_ATTN_CLASSIC ? sv->P.owned : sv->lse.owned)) {
    s = vl_fail(c, VL_ERR_INVALID,
                "%s: the forward kept nothing for it (keep was false, or it was freed)", op);
    goto done;
  }
  VL_TRY_GOTO(s, vl_attn_check_dims(c, op, sv->B, sv->H, sv->Tq, sv->Tk, sv->D, sv->scale,
                                    sv->causal, &nq, &nk, &nr), done);
  VL_TRY_GOTO(s, vl_attn_check_grads(c, op, dq, dk, dv, dout, o, q, k, v, nq, nk), done);
  if (sv->impl == VL_ATTN_CLASSIC) {
    s = classic_bwd(c, sv, dq, dk, dv, dout, q, k, v);
  } else {
    if (!o) {
      s = vl_fail(c, VL_ERR_INVALID, "%s: the efficient backward reads o, which is NULL", op);
      goto done;
    }
    s = efficient_bwd(c, sv, dq, dk, dv, dout, o, q, k, v);
  }
done:
  vl_attn_saved_free(c, saved);
  return s;
}
