/* Argument checks of the memory-efficient attention ops (VL_OP_ATTN_FWD / VL_OP_ATTN_BWD),
 * run by the operation descriptors (ops.c) through vl_op_run on every backend, the
 * plan backend included, and by the attention layer (engine/nn/attention.c, both
 * implementations), so all of them refuse the same calls with the same message; the
 * backward's workspace check is the kernels' (vl_attn_check_ws); plus the CUDA launch
 * geometry as a pure function (tested on the CPU). Host code only; plain C that also compiles
 * as the host side of a .cu file. Every check returns VL_OK or VL_ERR_INVALID with a message
 * naming the op and the argument. */
#ifndef VRAMLAB_ATTN_ARGS_H
#define VRAMLAB_ATTN_ARGS_H
#include <math.h>

#include "vramlab/backend.h"
#include "args.h"
#include "../kernels/attn.h"

/* *x = a*b; false when a factor is negative or the product overflows int64. */
static inline bool vl_attn_mul(int64_t *x, int64_t a, int64_t b) {
  *x = 0;
  if (a < 0 || b < 0 || (a != 0 && b > INT64_MAX / a)) return false;
  *x = a * b;
  return true;
}

/* The shape: every size >= 1, D <= VL_K_ATTN_DMAX, causal only with Tq == Tk, a finite scale;
 * *nq = B*Tq*H*D (q, o, dout, dq), *nk = B*Tk*H*D (k, v, dk, dv), *nr = B*H*Tq (lse). */
static inline vl_status vl_attn_check_dims(vl_ctx *c, const char *op, int64_t B, int64_t H,
                                           int64_t Tq, int64_t Tk, int64_t D, float scale,
                                           bool causal, int64_t *nq, int64_t *nk, int64_t *nr) {
  *nq = *nk = *nr = 0;
  if (B < 1 || H < 1 || Tq < 1 || Tk < 1 || D < 1)
    return vl_fail(c, VL_ERR_INVALID,
                   "%s: B %lld, H %lld, Tq %lld, Tk %lld, D %lld must all be >= 1", op,
                   (long long)B, (long long)H, (long long)Tq, (long long)Tk, (long long)D);
  if (D > VL_K_ATTN_DMAX)
    return vl_fail(c, VL_ERR_INVALID, "%s: head dim D %lld above the supported %d", op,
                   (long long)D, VL_K_ATTN_DMAX);
  if (causal && Tq != Tk)
    return vl_fail(c, VL_ERR_INVALID,
                   "%s: causal attention needs as many queries as keys (Tq %lld, Tk %lld)", op,
                   (long long)Tq, (long long)Tk);
  if (!isfinite(scale))
    return vl_fail(c, VL_ERR_INVALID, "%s: scale %g is not finite", op, (double)scale);
  int64_t bh = 0, bhq = 0, bhk = 0;
  if (!vl_attn_mul(&bh, B, H) || !vl_attn_mul(nr, bh, Tq) || !vl_attn_mul(&bhq, *nr, D) ||
      !vl_attn_mul(&bhk, bh, Tk) || !vl_attn_mul(nk, bhk, D))
    return vl_fail(c, VL_ERR_INVALID, "%s: sizes B %lld x H %lld x T %lld x D %lld overflow", op,
                   (long long)B, (long long)H, (long long)(Tq > Tk ? Tq : Tk), (long long)D);
  *nq = bhq;
  return VL_OK;
}

/* An output's first n elements must not overlap an input's (other rows read it while the
 * output is written). */
static inline vl_status vl_attn_disjoint(vl_ctx *c, const char *op, const vl_tensor *out,
                                         int64_t nout, const char *oname, const vl_tensor *in,
                                         int64_t nin, const char *iname) {
  if (!out->data || !in->data) return VL_OK;
  uintptr_t a = (uintptr_t)out->data, b = (uintptr_t)in->data;
  uintptr_t ae = a + vl_dtype_bytes(out->dtype, nout), be = b + vl_dtype_bytes(in->dtype, nin);
  if (a < be && b < ae) return vl_fail(c, VL_ERR_INVALID, "%s: %s overlaps %s", op, oname, iname);
  return VL_OK;
}

/* The forward's o, q, k, v (both implementations of the layer check this much). */
static inline vl_status vl_attn_check_io(vl_ctx *c, const char *op, const vl_tensor *o,
                                         const vl_tensor *q, const vl_tensor *k, const vl_tensor *v,
                                         int64_t nq, int64_t nk) {
  VL_TRY(vl_arg_tensor(c, op, "q", q, nq, false));
  VL_TRY(vl_arg_tensor(c, op, "k", k, nk, false));
  VL_TRY(vl_arg_tensor(c, op, "v", v, nk, false));
  VL_TRY(vl_arg_tensor(c, op, "o", o, nq, false));
  return VL_OK;
}

/* The backward's q, k, v, dout and gradients dq, dk, dv; no output over an input (o
 * included when given: the classic backward does not read it) or over another output. */
static inline vl_status vl_attn_check_grads(vl_ctx *c, const char *op, const vl_tensor *dq,
                                            const vl_tensor *dk, const vl_tensor *dv,
                                            const vl_tensor *dout, const vl_tensor *o,
                                            const vl_tensor *q, const vl_tensor *k,
                                            const vl_tensor *v, int64_t nq, int64_t nk) {
  VL_TRY(vl_arg_tensor(c, op, "q", q, nq, false));
  VL_TRY(vl_arg_tensor(c, op, "k", k, nk, false));
  VL_TRY(vl_arg_tensor(c, op, "v", v, nk, false));
  if (o) VL_TRY(vl_arg_tensor(c, op, "o", o, nq, false));
  VL_TRY(vl_arg_tensor(c, op, "dout", dout, nq, false));
  VL_TRY(vl_arg_tensor(c, op, "dq", dq, nq, false));
  VL_TRY(vl_arg_tensor(c, op, "dk", dk, nk, false));
  VL_TRY(vl_arg_tensor(c, op, "dv", dv, nk, false));
  const vl_tensor *out[3] = {dq, dk, dv}, *in[5] = {q, k, v, o, dout};
  const char *on[3] = {"dq", "dk", "dv"}, *inn[5] = {"q", "k", "v", "o", "dout"};
  int64_t onn[3] = {nq, nk, nk}, inl[5] = {nq, nk, nk, nq, nq};
  for (int a = 0; a < 3; a++) {
    for (int b = 0; b < 5; b++)
      if (in[b]) VL_TRY(vl_attn_disjoint(c, op, out[a], onn[a], on[a], in[b], inl[b], inn[b]));
    for (int b = a + 1; b < 3; b++)
      VL_TRY(vl_attn_disjoint(c, op, out[a], onn[a], on[a], out[b], onn[b], on[b]));
  }
  return VL_OK;
}

static inline vl_status vl_attn_check_fwd(vl_ctx *c, const vl_attn_fwd_args *a, int64_t *nr) {
  const char *op = "attn_fwd";
  int64_t nq = 0, nk = 0;
  VL_TRY(
      vl_attn_check_dims(c, op, a->B, a->H, a->Tq, a->Tk, a->D, a->scale, a->causal, &nq, &nk, nr));
  VL_TRY(vl_attn_check_io(c, op, a->o, a->q, a->k, a->v, nq, nk));
  VL_TRY(vl_arg_tensor(c, op, "lse", a->lse, *nr, true));
  const vl_tensor *in[3] = {a->q, a->k, a->v};
  const char *inn[3] = {"q", "k", "v"};
  int64_t inl[3] = {nq, nk, nk};
  for (int b = 0; b < 3; b++) {
    VL_TRY(vl_attn_disjoint(c, op, a->o, nq, "o", in[b], inl[b], inn[b]));
    VL_TRY(vl_attn_disjoint(c, op, a->lse, *nr, "lse", in[b], inl[b], inn[b]));
  }
  return vl_attn_disjoint(c, op, a->lse, *nr, "lse", a->o, nq, "o");
}

static inline vl_status vl_attn_check_bwd(vl_ctx *c, const vl_attn_bwd_args *a, int64_t *nr) {
  const char *op = "attn_bwd";
  int64_t nq = 0, nk = 0;
  VL_TRY(
      vl_attn_check_dims(c, op, a->B, a->H, a->Tq, a->Tk, a->D, a->scale, a->causal, &nq, &nk, nr));
  VL_TRY(vl_arg_tensor(c, op, "o", a->o, nq, false));
  VL_TRY(vl_attn_check_grads(c, op, a->dq, a->dk, a->dv, a->dout, a->o, a->q, a->k, a->v, nq, nk));
  VL_TRY(vl_arg_tensor(c, op, "lse", a->lse, *nr, true));
  const vl_tensor *out[3] = {a->dq, a->dk, a->dv};
  const char *on[3] = {"dq", "dk", "dv"};
  int64_t onn[3] = {nq, nk, nk};
  for (int b = 0; b < 3; b++)
    VL_TRY(vl_attn_disjoint(c, op, out[b], onn[b], on[b], a->lse, *nr, "lse"));
  return VL_OK;
}

/* The backward's workspace, checked by the kernels (a plan's has no storage): delta (B*H*Tq
 * fp32), at least what the op's descriptor asks for. */
static inline vl_status vl_attn_check_ws(vl_ctx *c, const vl_attn_bwd_args *a) {
  size_t need = vl_op_ws_bytes(c, VL_OP_ATTN_BWD, a);
  if (!a->ws || a->ws_bytes < need)
    return vl_fail(c, VL_ERR_INVALID, "attn_bwd: workspace %zu bytes at %p, %zu needed",
                   a->ws_bytes, a->ws, need);
  return VL_OK;
}

/* ---- CUDA launch geometry (pure: tested on the CPU) ---------------------------------------- */

/* Each CUDA thread keeps its scratch (`floats` fp32 values, VL_K_ATTN_WS_*) in the block's
 * shared memory, at most VL_ATTN_SMEM bytes a block (the limit that needs no opt-in). */
#define VL_ATTN_SMEM (48 * 1024)
#define VL_ATTN_MAX_THREADS 128

/* Threads per block: as many as the shared memory holds, a multiple of 32 when there are
 * 32 or more, at most VL_ATTN_MAX_THREADS, at least 1 (D <= VL_K_ATTN_DMAX always fits). */
static inline int vl_attn_cuda_threads(int64_t floats) {
  int64_t t = VL_ATTN_SMEM / (floats * (int64_t)sizeof(float));
  if (t >= VL_ATTN_MAX_THREADS) return VL_ATTN_MAX_THREADS;
  if (t >= 32) return (int)(t / 32 * 32);
  return t < 1 ? 1 : (int)t;
}

#endif
