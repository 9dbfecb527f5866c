/* The operation descriptors (name, argument size, FLOPs and bytes, workspace on a target,
 * argument checks) and the one dispatch point, vl_op_run (vramlab/ops.h).
 *
 * Counting rules. FLOPs are model FLOPs: the arithmetic of the forward and backward ops
 * (a multiply-add is 2, an exp or a compare 1); the optimizer update, the gradient norm and
 * buffer zeroing/conversion are not model FLOPs (MLPerf) and count bytes only. Bytes are
 * what the op reads plus what it writes, each tensor once. GEMM, the convolutions, batch
 * norm, per-pixel cross-entropy and the optimizer updates keep the byte formulas they had
 * when the layers counted them (nn/linear.c, models/resunet.c, nn/param.c), so planned
 * numbers did not move when counting moved here. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "vramlab/backend.h"
#include "act_args.h"
#include "attn_args.h"
#include "embed_args.h"
#include "loss_args.h"
#include "norm_args.h"
#include "pool_args.h"

/* A missing tensor or a negative size counts nothing (an op with a check never gets here with
 * one). */
static double tb(const vl_tensor *t, int64_t n) {
  return t && n > 0 ? (double)vl_dtype_bytes(t->dtype, n) : 0;
}
static double sz(const vl_tensor *t) { return t ? (double)t->bytes : 0; }
static double db(vl_dtype d, int64_t n) { return (double)vl_dtype_bytes(d, n); }
static vl_op_cost cost(double flops, double bytes) {
  return (vl_op_cost){.flops = flops, .bytes = bytes};
}

/* ---- GEMM and convolutions ------------------------------------------------------------ */

static vl_op_cost c_gemm(const void *p) {
  const vl_gemm *g = p;
  double flops = 2.0 * (double)g->M * (double)g->N * (double)g->K * (double)g->batch;
  double bytes = (double)g->batch * (tb(g->A, g->M * g->K) + tb(g->C, g->M * g->N)) +
                 tb(g->B, g->K * g->N);
  return cost(flops, bytes);
}
static size_t w_gemm(const void *p, vl_device t) {
  return t == VL_DEV_CPU ? vl_gemm_ws_cpu(p) : vl_gemm_ws_cuda(p);
}

/* activations of one side of a convolution, in the activation dtype */
static double conv_act(const vl_conv *cv, bool out) {
  return db(cv->xdt, out ? cv->N * cv->K * cv->P * cv->Q : cv->N * cv->C * cv->H * cv->W);
}
static vl_op_cost c_conv_fwd(const void *p) {
  const vl_conv_fwd_args *a = p;
  return cost(vl_conv_flops(&a->cv), conv_act(&a->cv, false) + conv_act(&a->cv, true) +
                                         sz(a->w));
}
static vl_op_cost c_conv_bwd_data(const void *p) {
  const vl_conv_bwd_data_args *a = p;
  return cost(vl_conv_flops(&a->cv), conv_act(&a->cv, false) + conv_act(&a->cv, true) +
                                         sz(a->w));
}
static vl_op_cost c_conv_bwd_weight(const void *p) {
  const vl_conv_bwd_weight_args *a = p;
  return cost(vl_conv_flops(&a->cv), conv_act(&a->cv, false) + conv_act(&a->cv, true) +
                                         sz(a->dw));
}
static size_t conv_ws(const vl_conv *cv, vl_conv_dir dir, bool acc, vl_device t) {
  return t == VL_DEV_CPU ? vl_conv_ws_cpu(cv, dir, acc) : vl_conv_ws_cuda(cv, dir, acc);
}
static size_t w_conv_fwd(const void *p, vl_device t) {
  return conv_ws(&((const vl_conv_fwd_args *)p)->cv, VL_CONV_FWD, false, t);
}
static size_t w_conv_bwd_data(const void *p, vl_device t) {
  return conv_ws(&((const vl_conv_bwd_data_args *)p)->cv, VL_CONV_BWD_DATA, false, t);
}
static size_t w_conv_bwd_weight(const void *p, vl_device t) {
  const vl_conv_bwd_weight_args *a = p;
  return conv_ws(&a->cv, VL_CONV_BWD_WEIGHT, a->accumulate, t);
}

/* ---- element-wise, row-wise --------------------------------------------------------- */

static vl_op_cost c_zero(const void *p) { return cost(0, sz(((const vl_zero_args *)p)->y)); }
static vl_op_cost c_convert(const void *p) {
  const vl_convert_args *a = p;
  return cost(0, tb(a->x, a->n) + tb(a->y, a->n));
}
static vl_op_cost c_axpby(const void *p) {
  const vl_axpby_args *a = p; /* y read only when b != 0 */
  return cost(3.0 * (double)a->n, tb(a->x, a->n) + tb(a->y, a->n) * (a->b != 0.0f ? 2 : 1));
}
static vl_op_cost c_embed_fwd(const void *p) {
  const vl_embed_fwd_args *a = p; /* ids, R gathered rows, R written rows */
  return cost(0, 4.0 * (double)a->R + tb(a->wte, a->R * a->C) + tb(a->out, a->R * a->C));
}
static vl_op_cost c_embed_bwd(const void *p) {
  const vl_embed_bwd_args *a = p; /* R rows of dwte read and written, one add each */
  int64_t n = a->R * a->C;
  return cost((double)n, 4.0 * (double)a->R + tb(a->dout, n) + 2.0 * tb(a->dwte, n));
}
static vl_op_cost c_rmsnorm_fwd(const void *p) {
  const vl_rmsnorm_fwd_args *a = p; /* sum of squares (2), then x * rstd * w (2) */
  int64_t n = a->R * a->C;
  return cost(4.0 * (double)n, tb(a->x, n) + tb(a->w, a->C) + tb(a->out, n) + 4.0 * (double)a->R);
}
static vl_op_cost c_rmsnorm_bwd(const void *p) {
  const vl_rmsnorm_bwd_args *a = p;
  int64_t n = a->R * a->C;
  /* dx: the row's dot(dout*w, x) (3) and dx += rstd*(w*dout - x*k) (4), read + written;
   * dw: a second pass over dout and x (3) */
  double flops = 7.0 * (double)n + (a->dw ? 3.0 * (double)n : 0);
  double bytes = tb(a->dout, n) + tb(a->x, n) + tb(a->w, a->C) + 4.0 * (double)a->R +
                 2.0 * tb(a->dx, n);
  if (a->dw) bytes += tb(a->dout, n) + tb(a->x, n) + 2.0 * tb(a->dw, a->C);
  return cost(flops, bytes);
}
static vl_op_cost c_rope(const void *p) {
  const vl_rope_args *a = p; /* per (d, d + D/2) pair: 4 multiplies, 2 adds; in place */
  int64_t n = a->B * a->T * a->H * a->D;
  return cost(3.0 * (double)n, 2.0 * tb(a->x, n));
}
static vl_op_cost c_permute(const void *p) {
  const vl_permute_args *a = p;
  int64_t n = a->B * a->T * a->H * a->D;
  return cost(0, tb(a->x, n) + tb(a->y, n));
}
/* Scores a softmax row sees: all T, or causal: row r holds r % T + 1 unmasked scores,
 * (T + 1) / 2 on average. */
static double seen(int64_t rows, int64_t T, bool causal) {
  return causal ? (double)rows * (double)(T + 1) / 2.0 : (double)rows * (double)T;
}
static vl_op_cost c_softmax_fwd(const void *p) {
  const vl_softmax_fwd_args *a = p; /* scale, max, exp, sum, divide */
  int64_t n = a->rows * a->T;
  return cost(5.0 * seen(a->rows, a->T, a->causal), tb(a->S, n) + tb(a->P, n));
}
static vl_op_cost c_softmax_bwd(const void *p) {
  const vl_softmax_bwd_args *a = p; /* dot(dP, P) (2), scale * P * (dP - s) (3) */
  int64_t n = a->rows * a->T;
  return cost(5.0 * seen(a->rows, a->T, a->causal), tb(a->dP, n) + tb(a->P, n) + tb(a->dS, n));
}
static vl_op_cost c_swiglu_fwd(const void *p) {
  const vl_swiglu_fwd_args *a = p; /* sigmoid (exp, add, divide), two multiplies */
  return cost(5.0 * (double)a->n, tb(a->g, a->n) + tb(a->u, a->n) + tb(a->out, a->n));
}
static vl_op_cost c_swiglu_bwd(const void *p) {
  const vl_swiglu_bwd_args *a = p;
  return cost(11.0 * (double)a->n, tb(a->dout, a->n) + tb(a->g, a->n) + tb(a->u, a->n) +
                                        tb(a->dg, a->n) + tb(a->du, a->n));
}
/* Cross-entropy per logit: max, exp, sum, then scale * (p - onehot) (2): 5. Bytes: the
 * logits read and rewritten in place, as per-pixel cross-entropy always counted. */
static vl_op_cost c_xent_fused(const void *p) {
  const vl_xent_fused_args *a = p;
  int64_t n = a->R * a->V;
  return cost(5.0 * (double)n, 2.0 * tb(a->logits, n));
}
static vl_op_cost c_sumsq(const void *p) {
  const vl_sumsq_args *a = p; /* the gradient norm: not a model FLOP */
  return cost(0, tb(a->x, a->n));
}

/* ---- optimizers: bytes only, 16 per element (what nn/param.c counted) ------------------- */
static vl_op_cost c_adamw(const void *p) { return cost(0, 16.0 * (double)((const vl_adamw_args *)p)->n); }
static vl_op_cost c_sgd(const void *p) { return cost(0, 16.0 * (double)((const vl_sgd_args *)p)->n); }
static vl_op_cost c_adafactor(const void *p) {
  const vl_adafactor_args *a = p;
  return cost(0, 16.0 * (double)(a->R * a->C));
}

/* ---- convolutional networks ------------------------------------------------------------- */

/* Batch norm keeps the bytes resunet.c counted: x and y (forward), x, dy and dx (backward). */
static vl_op_cost c_bn_fwd_train(const void *p) {
  const vl_bn_fwd_train_args *a = p; /* shifted sum and sum of squares (3), a*x + b (2) */
  int64_t n = a->N * a->C * a->HW;
  return cost(5.0 * (double)n, 2.0 * tb(a->x, n));
}
static vl_op_cost c_bn_fwd_eval(const void *p) {
  const vl_bn_fwd_eval_args *a = p;
  int64_t n = a->N * a->C * a->HW;
  return cost(2.0 * (double)n, 2.0 * tb(a->x, n));
}
static vl_op_cost c_bn_bwd(const void *p) {
  const vl_bn_bwd_args *a = p; /* two sums (4), then dx (4) */
  int64_t n = a->N * a->C * a->HW;
  return cost(8.0 * (double)n, 3.0 * tb(a->x, n));
}
static vl_op_cost c_relu_fwd(const void *p) {
  const vl_relu_fwd_args *a = p;
  return cost((double)a->n, tb(a->x, a->n) + tb(a->y, a->n));
}
static vl_op_cost c_relu_bwd(const void *p) {
  const vl_relu_bwd_args *a = p;
  return cost((double)a->n, tb(a->dy, a->n) + tb(a->y, a->n) + tb(a->dx, a->n));
}
static vl_op_cost c_maxpool_fwd(const void *p) {
  const vl_maxpool_fwd_args *a = p; /* k*k compares per output */
  double out = (double)(a->planes * a->P * a->Q);
  return cost(out * a->k * a->k, tb(a->x, a->planes * a->H * a->W) + tb(a->y, a->planes * a->P * a->Q));
}
static vl_op_cost c_maxpool_bwd(const void *p) {
  const vl_maxpool_bwd_args *a = p; /* the argmax recomputed, one add per output */
  int64_t nin = a->planes * a->H * a->W, nout = a->planes * a->P * a->Q;
  return cost((double)nout * (a->k * a->k + 1),
              tb(a->x, nin) + tb(a->dy, nout) + tb(a->dx, nin));
}
static vl_op_cost c_up2_fwd(const void *p) {
  const vl_upsample2x_fwd_args *a = p; /* bilinear: 4 weighted terms per output; nearest: a copy */
  int64_t lo = a->planes * a->H * a->W;
  return cost(a->nearest ? 0 : 7.0 * 4.0 * (double)lo, tb(a->x, lo) + tb(a->y, 4 * lo));
}
static vl_op_cost c_up2_bwd(const void *p) {
  const vl_upsample2x_bwd_args *a = p; /* nearest: 4 adds per input */
  int64_t lo = a->planes * a->H * a->W;
  return cost((a->nearest ? 4.0 : 7.0 * 4.0) * (double)lo, tb(a->dy, 4 * lo) + tb(a->dx, lo));
}
static vl_op_cost c_chan_copy(const void *p) {
  const vl_chan_copy_args *a = p;
  int64_t n = a->N * a->nc * a->HW;
  return cost(a->accumulate ? (double)n : 0,
              tb(a->x, n) + tb(a->y, n) * (a->accumulate ? 2 : 1));
}
static vl_op_cost c_xent_pix(const void *p) {
  const vl_xent_pix_args *a = p;
  int64_t n = a->N * a->K * a->HW;
  return cost(5.0 * (double)n, 2.0 * tb(a->logits, n));
}

/* ---- Stable Diffusion's operations ---------------------------------------------------------
 * Norms count as batch norm does: statistics (3) and the affine (2) forward, two sums (4)
 * and dx (4) backward. Activations per element: SiLU 4 (exp, add, divide, multiply), GELU 8
 * (erf as 5), quick-GELU 5; their derivatives 7, 12, 8. */
static double act_flops(vl_act a, bool bwd) {
  static const double f[VL_ACT_COUNT][2] = {{4, 7}, {8, 12}, {5, 8}};
  return (unsigned)a < VL_ACT_COUNT ? f[a][bwd] : 0;
}
static vl_op_cost c_groupnorm_fwd(const void *p) {
  const vl_groupnorm_fwd_args *a = p;
  int64_t n = a->N * a->C * a->HW;
  return cost(5.0 * (double)n, tb(a->x, n) + tb(a->y, n) + 8.0 * (double)(a->N * a->G) +
                                   tb(a->gamma, a->C) + tb(a->beta, a->C));
}
static vl_op_cost c_groupnorm_bwd(const void *p) {
  const vl_groupnorm_bwd_args *a = p;
  int64_t n = a->N * a->C * a->HW;
  return cost(8.0 * (double)n, tb(a->dy, n) + tb(a->x, n) + tb(a->dx, n) * (a->accumulate ? 2 : 1) +
                                   8.0 * (double)(a->N * a->G) + tb(a->gamma, a->C) +
                                   2.0 * (tb(a->dgamma, a->C) + tb(a->dbeta, a->C)));
}
static vl_op_cost c_layernorm_fwd(const void *p) {
  const vl_layernorm_fwd_args *a = p;
  int64_t n = a->R * a->C;
  return cost(5.0 * (double)n, tb(a->x, n) + tb(a->y, n) + 8.0 * (double)a->R +
                                   tb(a->gamma, a->C) + tb(a->beta, a->C));
}
static vl_op_cost c_layernorm_bwd(const void *p) {
  const vl_layernorm_bwd_args *a = p;
  int64_t n = a->R * a->C;
  return cost(8.0 * (double)n, tb(a->dy, n) + tb(a->x, n) + tb(a->dx, n) * (a->accumulate ? 2 : 1) +
                                   8.0 * (double)a->R + tb(a->gamma, a->C) +
                                   2.0 * (tb(a->dgamma, a->C) + tb(a->dbeta, a->C)));
}
static vl_op_cost c_act_fwd(const void *p) {
  const vl_act_fwd_args *a = p;
  return cost(act_flops(a->act, false) * (double)a->n, tb(a->x, a->n) + tb(a->y, a->n));
}
static vl_op_cost c_act_bwd(const void *p) {
  const vl_act_bwd_args *a = p;
  return cost(act_flops(a->act, true) * (double)a->n,
              tb(a->dy, a->n) + tb(a->x, a->n) + tb(a->dx, a->n));
}
static vl_op_cost c_geglu_fwd(const void *p) {
  const vl_geglu_fwd_args *a = p; /* GELU of the gate, one multiply */
  int64_t n = a->R * a->F;
  return cost(9.0 * (double)n, tb(a->h, 2 * n) + tb(a->out, n));
}
static vl_op_cost c_geglu_bwd(const void *p) {
  const vl_geglu_bwd_args *a = p; /* GELU and its derivative of the gate, three multiplies */
  int64_t n = a->R * a->F;
  return cost(23.0 * (double)n, tb(a->dout, n) + tb(a->h, 2 * n) + tb(a->dh, 2 * n));
}
static vl_op_cost c_bias_fwd(const void *p) {
  const vl_bias_fwd_args *a = p; /* y read and written, one add */
  int64_t n = a->outer * a->C * a->inner;
  return cost((double)n, 2.0 * tb(a->y, n) + tb(a->b, a->per_outer ? a->outer * a->C : a->C));
}
static vl_op_cost c_bias_bwd(const void *p) {
  const vl_bias_bwd_args *a = p;
  int64_t n = a->outer * a->C * a->inner, nb = a->per_outer ? a->outer * a->C : a->C;
  return cost((double)n, tb(a->dy, n) + tb(a->db, nb) * (a->accumulate ? 2 : 1));
}
static int64_t padded(int64_t planes, int64_t H, int64_t W, int t, int b, int l, int r) {
  return planes * (H + t + b) * (W + l + r);
}
static vl_op_cost c_pad2d_fwd(const void *p) {
  const vl_pad2d_fwd_args *a = p;
  return cost(0, tb(a->x, a->planes * a->H * a->W) +
                     tb(a->y, padded(a->planes, a->H, a->W, a->top, a->bottom, a->left, a->right)));
}
static vl_op_cost c_pad2d_bwd(const void *p) {
  const vl_pad2d_bwd_args *a = p; /* the crop reads only what it keeps */
  return cost(0, tb(a->dy, a->planes * a->H * a->W) + tb(a->dx, a->planes * a->H * a->W));
}
static vl_op_cost c_timestep_embed(const void *p) {
  const vl_timestep_embed_args *a = p; /* per pair: exp, multiply, sin, cos */
  return cost(2.0 * (double)(a->B * a->dim), tb(a->t, a->B) + tb(a->emb, a->B * a->dim));
}
static vl_op_cost c_mse_fused(const void *p) {
  const vl_mse_fused_args *a = p; /* subtract, square-add, gradient (2) */
  int64_t n = a->R * a->C;
  return cost(4.0 * (double)n, 2.0 * tb(a->pred, n) + tb(a->target, n) + 4.0 * (double)a->R);
}
static vl_op_cost c_gauss_sample(const void *p) {
  const vl_gauss_sample_args *a = p; /* clamp, halve, exp, multiply-add, scale */
  int64_t n = a->N * a->C * a->HW;
  return cost(6.0 * (double)n, tb(a->moments, 2 * n) + tb(a->noise, n) + tb(a->z, n));
}
/* Attention counts model FLOPs, the same for both implementations: q k^T and p v (2 D each
 * per score) and the softmax (5) forward; dP, dV, dQ, dK (2 D each) and the softmax's
 * backward (5) backward. The efficient backward's recomputation of the scores (2 D + 5 per
 * score) is work the classic one does not do; it is not a model FLOP and shows in time. */
static double attn_scores(int64_t B, int64_t H, int64_t Tq, int64_t Tk, bool causal) {
  return (double)(B * H) * seen(Tq, Tk, causal);
}
static vl_op_cost c_attn_fwd(const void *p) {
  const vl_attn_fwd_args *a = p;
  int64_t C = a->H * a->D;
  double s = attn_scores(a->B, a->H, a->Tq, a->Tk, a->causal);
  return cost(s * (4.0 * (double)a->D + 5.0),
              tb(a->q, a->B * a->Tq * C) + tb(a->k, a->B * a->Tk * C) + tb(a->v, a->B * a->Tk * C) +
                  tb(a->o, a->B * a->Tq * C) + tb(a->lse, a->B * a->H * a->Tq));
}
static vl_op_cost c_attn_bwd(const void *p) {
  const vl_attn_bwd_args *a = p;
  int64_t C = a->H * a->D, nq = a->B * a->Tq * C, nk = a->B * a->Tk * C;
  double s = attn_scores(a->B, a->H, a->Tq, a->Tk, a->causal);
  return cost(s * (8.0 * (double)a->D + 5.0),
              tb(a->q, nq) + tb(a->k, nk) + tb(a->v, nk) + tb(a->o, nq) + tb(a->dout, nq) +
                  tb(a->lse, a->B * a->H * a->Tq) + tb(a->dq, nq) + tb(a->dk, nk) + tb(a->dv, nk));
}
static size_t w_attn_bwd(const void *p, vl_device t) {
  const vl_attn_bwd_args *a = p; /* delta = rowsum(dout * o), fp32, on every target */
  (void)t;
  return a->B > 0 && a->H > 0 && a->Tq > 0 ? (size_t)(a->B * a->H * a->Tq) * sizeof(float) : 0;
}

/* ---- argument checks ---------------------------------------------------------------------
 * One per operation that has any, run by vl_op_run before the operation is counted or
 * dispatched, on every backend, the plan backend included, so a plan refuses what a run
 * refuses with the same status and message. They look at shapes, dtypes, sizes and aliasing
 * (the shared checkers of args.h and the family headers norm_args.h, act_args.h, ...); what
 * only a backend knows (its workspace layout, cuBLAS's operand mapping, ids out of range in
 * device memory) the backend still checks. A plan's tensors have no storage, which the
 * checkers allow. */

/* ---- Mistral's ops with token ids or targets ---------------------------------------------- */

static vl_status ck_embed_fwd(vl_ctx *c, const void *args) {
  const vl_embed_fwd_args *a = args;
  return vl_check_ids(c, "embed_fwd", "token ids", a->tok, a->R);
}
static vl_status ck_embed_bwd(vl_ctx *c, const void *args) {
  const vl_embed_bwd_args *a = args;
  return vl_check_ids(c, "embed_bwd", "token ids", a->tok, a->R);
}
static vl_status ck_xent_fused(vl_ctx *c, const void *args) {
  const vl_xent_fused_args *a = args;
  return vl_check_ids(c, "xent_fused", "targets", a->tgt, a->R);
}

/* ---- the CNN's ops ------------------------------------------------------------------------ */

static vl_status ck_bn_fwd_train(vl_ctx *c, const void *args) {
  const vl_bn_fwd_train_args *a = args;
  int64_t n = 0;
  return vl_check_bn_train(c, a->y, a->mean, a->rstd, a->rmean, a->rvar, a->x, a->gamma,
                               a->beta, a->N, a->C, a->HW, a->eps, a->momentum, &n);
}
static vl_status ck_bn_fwd_eval(vl_ctx *c, const void *args) {
  const vl_bn_fwd_eval_args *a = args;
  int64_t n = 0;
  return vl_check_bn_eval(c, a->y, a->x, a->gamma, a->beta, a->rmean, a->rvar, a->N, a->C,
                              a->HW, a->eps, &n);
}
static vl_status ck_bn_bwd(vl_ctx *c, const void *args) {
  const vl_bn_bwd_args *a = args;
  int64_t n = 0;
  return vl_check_bn_bwd(c, a->dx, a->dgamma, a->dbeta, a->dy, a->x, a->gamma, a->mean,
                             a->rstd, a->N, a->C, a->HW, &n);
}
static vl_status ck_relu_fwd(vl_ctx *c, const void *args) {
  const vl_relu_fwd_args *a = args;
  return vl_check_relu(c, "relu_fwd", false, a->y, a->x, NULL, a->n);
}
static vl_status ck_relu_bwd(vl_ctx *c, const void *args) {
  const vl_relu_bwd_args *a = args;
  return vl_check_relu(c, "relu_bwd", true, a->dx, a->dy, a->y, a->n);
}
static vl_status ck_maxpool_fwd(vl_ctx *c, const void *args) {
  const vl_maxpool_fwd_args *a = args;
  int64_t n = 0;
  return vl_check_maxpool_fwd(c, a->y, a->x, a->planes, a->H, a->W, a->k, a->stride, a->pad,
                                  a->P, a->Q, &n);
}
static vl_status ck_maxpool_bwd(vl_ctx *c, const void *args) {
  const vl_maxpool_bwd_args *a = args;
  int64_t n = 0;
  return vl_check_maxpool_bwd(c, a->dx, a->dy, a->x, a->planes, a->H, a->W, a->k, a->stride,
                                  a->pad, a->P, a->Q, &n);
}
static vl_status ck_upsample2x_fwd(vl_ctx *c, const void *args) {
  const vl_upsample2x_fwd_args *a = args;
  int64_t lo = 0, hi = 0;
  return vl_check_up2(c, "upsample2x_fwd", a->x, a->y, a->planes, a->H, a->W, true, &lo, &hi);
}
static vl_status ck_upsample2x_bwd(vl_ctx *c, const void *args) {
  const vl_upsample2x_bwd_args *a = args;
  int64_t lo = 0, hi = 0;
  return vl_check_up2(c, "upsample2x_bwd", a->dx, a->dy, a->planes, a->H, a->W, false, &lo,
                          &hi);
}
static vl_status ck_chan_copy(vl_ctx *c, const void *args) {
  const vl_chan_copy_args *a = args;
  int64_t n = 0;
  return vl_check_chan_copy(c, a->y, a->yC, a->y_c0, a->x, a->xC, a->x_c0, a->nc, a->N, a->HW,
                                &n);
}
static vl_status ck_xent_pix(vl_ctx *c, const void *args) {
  const vl_xent_pix_args *a = args;
  int64_t n = 0;
  return vl_check_xent_pix(c, a->logits, a->loss, a->tgt, a->N, a->K, a->HW, a->dloss_scale,
                               &n);
}

/* ---- Stable Diffusion's ops --------------------------------------------------------------- */

static vl_status ck_groupnorm_fwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_groupnorm_fwd(c, args, &n);
}
static vl_status ck_groupnorm_bwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_groupnorm_bwd(c, args, &n);
}
static vl_status ck_layernorm_fwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_layernorm_fwd(c, args, &n);
}
static vl_status ck_layernorm_bwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_layernorm_bwd(c, args, &n);
}
static vl_status ck_act_fwd(vl_ctx *c, const void *args) { return vl_check_act_fwd(c, args); }
static vl_status ck_act_bwd(vl_ctx *c, const void *args) { return vl_check_act_bwd(c, args); }
static vl_status ck_geglu_fwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_geglu_fwd(c, args, &n);
}
static vl_status ck_geglu_bwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_geglu_bwd(c, args, &n);
}
static vl_status ck_bias_fwd(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_bias_fwd(c, args, &n);
}
static vl_status ck_bias_bwd(vl_ctx *c, const void *args) {
  int64_t n = 0, nb = 0;
  return vl_check_bias_bwd(c, args, &n, &nb);
}
static vl_status ck_pad2d_fwd(vl_ctx *c, const void *args) {
  const vl_pad2d_fwd_args *a = args;
  int64_t nin = 0, nout = 0;
  return vl_check_pad(c, "pad2d_fwd", a->x, a->y, a->planes, a->H, a->W, a->top, a->bottom,
                         a->left, a->right, true, &nin, &nout);
}
static vl_status ck_pad2d_bwd(vl_ctx *c, const void *args) {
  const vl_pad2d_bwd_args *a = args;
  int64_t nin = 0, nout = 0;
  return vl_check_pad(c, "pad2d_bwd", a->dx, a->dy, a->planes, a->H, a->W, a->top, a->bottom,
                         a->left, a->right, false, &nin, &nout);
}
static vl_status ck_timestep_embed(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_timestep(c, args, &n);
}
static vl_status ck_mse_fused(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_mse(c, args, &n);
}
static vl_status ck_gauss_sample(vl_ctx *c, const void *args) {
  int64_t n = 0;
  return vl_check_gauss(c, args, &n);
}

/* ---- attention ------------------------------------------------------------------------------ */

static vl_status ck_attn_fwd(vl_ctx *c, const void *args) {
  int64_t rows = 0;
  return vl_attn_check_fwd(c, args, &rows);
}
static vl_status ck_attn_bwd(vl_ctx *c, const void *args) {
  int64_t rows = 0;
  return vl_attn_check_bwd(c, args, &rows);
}

/* ---- the table -------------------------------------------------------------------------- */

/* D: no workspace, no check; DC: a check; DW: a workspace (and a check when ck is not NULL). */
#define D(id, nm, type, cf) [VL_OP_##id] = {#nm, sizeof(type), cf, NULL, 0, 0, NULL}
#define DC(id, nm, type, cf, ck) [VL_OP_##id] = {#nm, sizeof(type), cf, NULL, 0, 0, ck}
#define DW(id, nm, type, cf, wf, ck)                                                       \
  [VL_OP_##id] = {#nm, sizeof(type), cf, wf, offsetof(type, ws), offsetof(type, ws_bytes), ck}

static const vl_op_desc DESC[VL_OP_COUNT] = {
    DW(GEMM, gemm, vl_gemm, c_gemm, w_gemm, NULL),
    DW(CONV_FWD, conv_fwd, vl_conv_fwd_args, c_conv_fwd, w_conv_fwd, NULL),
    DW(CONV_BWD_DATA, conv_bwd_data, vl_conv_bwd_data_args, c_conv_bwd_data, w_conv_bwd_data,
       NULL),
    DW(CONV_BWD_WEIGHT, conv_bwd_weight, vl_conv_bwd_weight_args, c_conv_bwd_weight,
       w_conv_bwd_weight, NULL),
    D(ZERO, zero, vl_zero_args, c_zero),
    D(CONVERT, convert, vl_convert_args, c_convert),
    D(AXPBY, axpby, vl_axpby_args, c_axpby),
    DC(EMBED_FWD, embed_fwd, vl_embed_fwd_args, c_embed_fwd, ck_embed_fwd),
    DC(EMBED_BWD, embed_bwd, vl_embed_bwd_args, c_embed_bwd, ck_embed_bwd),
    D(RMSNORM_FWD, rmsnorm_fwd, vl_rmsnorm_fwd_args, c_rmsnorm_fwd),
    D(RMSNORM_BWD, rmsnorm_bwd, vl_rmsnorm_bwd_args, c_rmsnorm_bwd),
    D(ROPE, rope, vl_rope_args, c_rope),
    D(PERMUTE, permute, vl_permute_args, c_permute),
    D(SOFTMAX_FWD, softmax_fwd, vl_softmax_fwd_args, c_softmax_fwd),
    D(SOFTMAX_BWD, softmax_bwd, vl_softmax_bwd_args, c_softmax_bwd),
    D(SWIGLU_FWD, swiglu_fwd, vl_swiglu_fwd_args, c_swiglu_fwd),
    D(SWIGLU_BWD, swiglu_bwd, vl_swiglu_bwd_args, c_swiglu_bwd),
    DC(XENT_FUSED, xent_fused, vl_xent_fused_args, c_xent_fused, ck_xent_fused),
    D(SUMSQ, sumsq, vl_sumsq_args, c_sumsq),
    D(ADAMW, adamw, vl_adamw_args, c_adamw),
    D(SGD, sgd, vl_sgd_args, c_sgd),
    D(ADAFACTOR, adafactor, vl_adafactor_args, c_adafactor),
    DC(BN_FWD_TRAIN, bn_fwd_train, vl_bn_fwd_train_args, c_bn_fwd_train, ck_bn_fwd_train),
    DC(BN_FWD_EVAL, bn_fwd_eval, vl_bn_fwd_eval_args, c_bn_fwd_eval, ck_bn_fwd_eval),
    DC(BN_BWD, bn_bwd, vl_bn_bwd_args, c_bn_bwd, ck_bn_bwd),
    DC(RELU_FWD, relu_fwd, vl_relu_fwd_args, c_relu_fwd, ck_relu_fwd),
    DC(RELU_BWD, relu_bwd, vl_relu_bwd_args, c_relu_bwd, ck_relu_bwd),
    DC(MAXPOOL_FWD, maxpool_fwd, vl_maxpool_fwd_args, c_maxpool_fwd, ck_maxpool_fwd),
    DC(MAXPOOL_BWD, maxpool_bwd, vl_maxpool_bwd_args, c_maxpool_bwd, ck_maxpool_bwd),
    DC(UPSAMPLE2X_FWD, upsample2x_fwd, vl_upsample2x_fwd_args, c_up2_fwd, ck_upsample2x_fwd),
    DC(UPSAMPLE2X_BWD, upsample2x_bwd, vl_upsample2x_bwd_args, c_up2_bwd, ck_upsample2x_bwd),
    DC(CHAN_COPY, chan_copy, vl_chan_copy_args, c_chan_copy, ck_chan_copy),
    DC(XENT_PIX, xent_pix, vl_xent_pix_args, c_xent_pix, ck_xent_pix),
    DC(GROUPNORM_FWD, groupnorm_fwd, vl_groupnorm_fwd_args, c_groupnorm_fwd, ck_groupnorm_fwd),
    DC(GROUPNORM_BWD, groupnorm_bwd, vl_groupnorm_bwd_args, c_groupnorm_bwd, ck_groupnorm_bwd),
    DC(LAYERNORM_FWD, layernorm_fwd, vl_layernorm_fwd_args, c_layernorm_fwd, ck_layernorm_fwd),
    DC(LAYERNORM_BWD, layernorm_bwd, vl_layernorm_bwd_args, c_layernorm_bwd, ck_layernorm_bwd),
    DC(ACT_FWD, act_fwd, vl_act_fwd_args, c_act_fwd, ck_act_fwd),
    DC(ACT_BWD, act_bwd, vl_act_bwd_args, c_act_bwd, ck_act_bwd),
    DC(GEGLU_FWD, geglu_fwd, vl_geglu_fwd_args, c_geglu_fwd, ck_geglu_fwd),
    DC(GEGLU_BWD, geglu_bwd, vl_geglu_bwd_args, c_geglu_bwd, ck_geglu_bwd),
    DC(BIAS_FWD, bias_fwd, vl_bias_fwd_args, c_bias_fwd, ck_bias_fwd),
    DC(BIAS_BWD, bias_bwd, vl_bias_bwd_args, c_bias_bwd, ck_bias_bwd),
    DC(PAD2D_FWD, pad2d_fwd, vl_pad2d_fwd_args, c_pad2d_fwd, ck_pad2d_fwd),
    DC(PAD2D_BWD, pad2d_bwd, vl_pad2d_bwd_args, c_pad2d_bwd, ck_pad2d_bwd),
    DC(TIMESTEP_EMBED, timestep_embed, vl_timestep_embed_args, c_timestep_embed,
       ck_timestep_embed),
    DC(MSE_FUSED, mse_fused, vl_mse_fused_args, c_mse_fused, ck_mse_fused),
    DC(GAUSS_SAMPLE, gauss_sample, vl_gauss_sample_args, c_gauss_sample, ck_gauss_sample),
    DC(ATTN_FWD, attn_fwd, vl_attn_fwd_args, c_attn_fwd, ck_attn_fwd),
    DW(ATTN_BWD, attn_bwd, vl_attn_bwd_args, c_attn_bwd, w_attn_bwd, ck_attn_bwd),
};

/* The dispatch copies the arguments to hand the kernel its workspace: room for the largest. */
#define ARGS_MAX 256
#define VL_OP_FITS_(id, name, type) _Static_assert(sizeof(type) <= ARGS_MAX, #type " too big");
VL_OPS(VL_OP_FITS_)
#undef VL_OP_FITS_

const vl_op_desc *vl_op_describe(vl_op op) {
  return (unsigned)op < VL_OP_COUNT ? &DESC[op] : NULL;
}

const char *vl_op_name(vl_op op) { return (unsigned)op < VL_OP_COUNT ? DESC[op].name : "?"; }

int vl_op_parse(const char *name, vl_op *out) {
  for (int i = 0; i < VL_OP_COUNT; i++)
    if (DESC[i].name && !strcasecmp(name, DESC[i].name)) { *out = (vl_op)i; return 0; }
  return -1;
}

vl_device vl_ctx_target(const vl_ctx *c) {
  return c->device == VL_DEV_PLAN ? c->plan_target : c->device;
}

size_t vl_op_ws_bytes(const vl_ctx *c, vl_op op, const void *args) {
  const vl_op_desc *d = vl_op_describe(op);
  return d && d->ws_bytes ? d->ws_bytes(args, vl_ctx_target(c)) : 0;
}

static void **ws_ptr(void *args, const vl_op_desc *d) { return (void **)((char *)args + d->ws_ptr_off); }
static size_t *ws_len(void *args, const vl_op_desc *d) { return (size_t *)((char *)args + d->ws_len_off); }

vl_status vl_op_run(vl_ctx *c, vl_op op, const void *args) {
  const vl_op_desc *d = vl_op_describe(op);
  if (!d || !args) return vl_fail(c, VL_ERR_INVALID, "vl_op_run: operation %d, args %p", (int)op, args);
  if (c->stop_ops && *c->stop_ops)
    return vl_fail(c, VL_ERR_INTERRUPTED, "terminated between operations (before %s): the step in flight is lost",
                   d->name);
  if (d->check) VL_TRY(d->check(c, args)); /* before anything is counted or taken */
  vl_op_cost k = d->cost(args);
  vl_count(c, k.flops, k.bytes);
  vl_op_profile *pr = c->profile && c->prof ? &c->prof[op] : NULL;
  if (pr) { pr->calls++; pr->flops += k.flops; pr->bytes += k.bytes; }

  /* The workspace, unless the caller brought one: taken from the arena for this call. */
  _Alignas(max_align_t) unsigned char copy[ARGS_MAX];
  vl_tensor ws = {0};
  if (d->ws_bytes && !*ws_ptr((void *)args, d) && !*ws_len((void *)args, d)) {
    size_t b = d->ws_bytes(args, vl_ctx_target(c));
    if (b) {
      int64_t n = (int64_t)((b + 3) / 4);
      vl_status s = vl_tensor_alloc(c, &ws, VL_F32, VL_MEM_WORKSPACE, 1, &n);
      if (s != VL_OK) return s;
      memcpy(copy, args, d->args_size);
      *ws_ptr(copy, d) = ws.data;
      *ws_len(copy, d) = b;
      args = copy;
    }
  }
  vl_status s = VL_OK;
  if (!c->plan) {
    vl_op_fn fn = c->be->ops[op];
    if (!fn) {
      s = vl_fail(c, VL_ERR_UNSUPPORTED, "operation %s has no kernel in the %s backend",
                  d->name, c->be->name);
    } else if (pr && c->be->op_timer_begin && c->be->op_timer_end) {
      /* the device clock around the kernel (CUDA events): nothing waits here */
      s = c->be->op_timer_begin(c);
      if (s == VL_OK) {
        s = fn(c, args);
        vl_status e = c->be->op_timer_end(c, op);
        if (s == VL_OK) s = e;
      }
    } else if (pr) {
      /* the kernel's own time: what was queued before is finished first, and it is */
      if (c->be->sync) s = c->be->sync(c);
      double t0 = vl_now();
      if (s == VL_OK) s = fn(c, args);
      if (s == VL_OK && c->be->sync) s = c->be->sync(c);
      pr->seconds += vl_now() - t0;
    } else {
      s = fn(c, args);
    }
  }
  if (ws.owned) vl_tensor_free(c, &ws);
  return s;
}

const vl_op_profile *vl_ctx_profile(vl_ctx *c) {
  /* device-clock intervals still in the backend's pool are added first */
  if (c->prof && c->be && c->be->op_timer_collect) (void)c->be->op_timer_collect(c, c->prof);
  return c->prof;
}

void vl_ctx_profile_reset(vl_ctx *c) {
  if (c->prof) memset(c->prof, 0, VL_OP_COUNT * sizeof *c->prof);
}
