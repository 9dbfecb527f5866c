/* The SD U-Net's layers, forward and backward (llm.c style, over vl_op_run): the linear
 * layer with its optional LoRA path (sd_lora.c's, shared with the CLIP text encoder), the
 * time embedding, ResnetBlock2D, Transformer2DModel (GroupNorm, proj_in, one
 * BasicTransformerBlock, proj_out), the downsampler, the upsampler, conv_in and the head
 * (conv_norm_out, SiLU, conv_out).
 *
 * Every weight is frozen except the LoRA factors, so a backward computes input gradients
 * and LoRA gradients only, and a forward keeps only what those need: the inputs of the
 * norms and SiLUs, the inputs of LoRA-adapted linears, q, k, v and the attention output,
 * GEGLU's input. A 1x1 convolution (proj_in, proj_out) is a batched GEMM that reads NCHW and
 * writes the token layout (B, T, C) or back, so no permuted copy is made.
 *
 * Block modes: SD_KEEP keeps what backward reads (VL_MEM_ACTS), otherwise every
 * intermediate is a temporary freed as soon as it is read; SD_RERUN is a checkpointed
 * block's re-run inside backward: it stops once everything backward reads exists, without
 * recomputing the block output. Every tensor lives in a slot of the model (its blocks,
 * nodes, m->tmp), so a failed step frees everything (sd_unet.c). */
#include "sd_unet_internal.h"
#include "sd_lora.h"

#include <string.h>

/* ---- small helpers ------------------------------------------------------------------------ */

vl_param *sd_fz(vl_sd_unet *m, int i) { return &m->fz.p[i]; }
static const vl_tensor *fw(vl_sd_unet *m, int i) { return &m->fz.p[i].w; }

vl_status sd_act(vl_sd_unet *m, vl_tensor *t, vl_mem_cat cat, int64_t d0, int64_t d1, int64_t d2) {
  int64_t shape[3] = {d0, d1, d2};
  return vl_tensor_alloc(m->c, t, m->cfg.acts, cat, 3, shape);
}
/* (B, C, H, W) in the acts dtype */
static vl_status img(vl_sd_unet *m, vl_tensor *t, vl_mem_cat cat, int64_t C, int64_t H, int64_t W) {
  int64_t shape[4] = {m->B, C, H, W};
  return vl_tensor_alloc(m->c, t, m->cfg.acts, cat, 4, shape);
}
vl_status sd_f32(vl_sd_unet *m, vl_tensor *t, vl_mem_cat cat, int64_t n) {
  return vl_tensor_alloc(m->c, t, VL_F32, cat, 1, &n);
}
void sd_free(vl_sd_unet *m, vl_tensor *t) { vl_tensor_free(m->c, t); }
void sd_move(vl_tensor *dst, vl_tensor *src) {
  *dst = *src;
  memset(src, 0, sizeof *src);
}
static vl_mem_cat kcat(bool keep) { return keep ? VL_MEM_ACTS : VL_MEM_TEMP; }

/* x (B, C, T) -> x + b[c] (conv bias), or x (R, N) -> x + b[n] (linear bias, C = N, T = 1) */
static vl_status bias(vl_sd_unet *m, vl_tensor *y, int b, int64_t outer, int64_t C, int64_t inner) {
  return vl_bias_fwd_run(m->c, &(vl_bias_fwd_args){.y = y, .b = fw(m, b), .outer = outer, .C = C,
                                                   .inner = inner, .per_outer = false});
}

static vl_status gn_fwd(vl_sd_unet *m, vl_tensor *y, vl_tensor *mean, vl_tensor *rstd,
                        const vl_tensor *x, int w, int b, int64_t C, int64_t T, float eps) {
  return vl_groupnorm_fwd_run(m->c, &(vl_groupnorm_fwd_args){.y = y, .mean = mean, .rstd = rstd,
                                                            .x = x, .gamma = fw(m, w),
                                                            .beta = fw(m, b), .N = m->B, .C = C,
                                                            .HW = T, .G = m->cfg.groups,
                                                            .eps = eps});
}
/* dx (B, C, T) = (dx +) GroupNorm's input gradient; the norm is frozen */
static vl_status gn_bwd(vl_sd_unet *m, vl_tensor *dx, const vl_tensor *dy, const vl_tensor *x, int w,
                        const vl_tensor *mean, const vl_tensor *rstd, int64_t C, int64_t T,
                        bool accumulate) {
  return vl_groupnorm_bwd_run(m->c, &(vl_groupnorm_bwd_args){.dx = dx, .dgamma = NULL,
                                                            .dbeta = NULL, .dy = dy, .x = x,
                                                            .gamma = fw(m, w), .mean = mean,
                                                            .rstd = rstd, .N = m->B, .C = C,
                                                            .HW = T, .G = m->cfg.groups,
                                                            .accumulate = accumulate});
}
static vl_status silu(vl_sd_unet *m, vl_tensor *y, const vl_tensor *x) {
  return vl_act_fwd_run(m->c, &(vl_act_fwd_args){.y = y, .x = x, .n = x->n, .act = VL_ACT_SILU});
}
static vl_status silu_bwd(vl_sd_unet *m, vl_tensor *d, const vl_tensor *x) {
  return vl_act_bwd_run(m->c, &(vl_act_bwd_args){.dx = d, .dy = d, .x = x, .n = x->n,
                                                 .act = VL_ACT_SILU});
}

/* A k x k convolution of stride s (padding k/2) on (B, C, H, W) -> K channels. */
static vl_conv conv_of(vl_sd_unet *m, int w, int64_t C, int64_t H, int64_t W, int64_t K, int k,
                       int stride) {
  vl_conv cv;
  vl_conv_init(&cv, m->B, C, H, W, K, k, k, stride, k / 2, 1);
  cv.xdt = m->cfg.acts;
  cv.wdt = fw(m, w)->dtype;
  cv.gdt = VL_F32;
  return cv;
}
/* y (B, K, P, Q) = conv(x) + bias */
static vl_status conv_fwd(vl_sd_unet *m, const vl_conv *cv, vl_tensor *y, const vl_tensor *x, int w,
                          int b) {
  VL_TRY(vl_conv_fwd_run(m->c, &(vl_conv_fwd_args){.cv = *cv, .y = y, .x = x, .w = fw(m, w)}));
  return bias(m, y, b, cv->N, cv->K, cv->P * cv->Q);
}
/* dx (B, C, H, W) = conv^T(dy), overwritten */
static vl_status conv_bwd_x(vl_sd_unet *m, const vl_conv *cv, vl_tensor *dx, const vl_tensor *dy,
                            int w) {
  return vl_conv_bwd_data_run(m->c,
                              &(vl_conv_bwd_data_args){.cv = *cv, .dx = dx, .dy = dy, .w = fw(m, w)});
}

/* ---- the linear layer with LoRA (sd_lora.c, shared with the CLIP text encoder) ---------- */

static sd_lora_lin lora_lin(vl_sd_unet *m, const sd_lin *L) {
  bool lora = L->la >= 0;
  return (sd_lora_lin){.w = fw(m, L->w), .b = L->b >= 0 ? fw(m, L->b) : NULL,
                       .A = lora ? &m->lora[L->la] : NULL, .B = lora ? &m->lora[L->lb] : NULL,
                       .in = L->in, .out = L->out, .r = m->cfg.lora_rank,
                       .scale = lora ? m->cfg.lora_alpha / (float)m->cfg.lora_rank : 0.0f,
                       .acts = m->cfg.acts};
}

/* y (R, out) (beta 0 overwrites, 1 accumulates: the residual) = x (R, in) W^T [+ b]
 * [+ s (x A^T) B^T]. keep: x A^T (R, r) stays in *xa (VL_MEM_ACTS) for dB, else it is freed. */
static vl_status lin_fwd(vl_sd_unet *m, const sd_lin *L, vl_tensor *y, const vl_tensor *x,
                         int64_t R, float beta, bool keep, vl_tensor *xa) {
  sd_lora_lin l = lora_lin(m, L);
  return sd_lora_lin_fwd(m->c, &l, y, x, R, beta, keep, xa);
}

/* From dy (R, out): LoRA gradients dB += s dy^T xa and dA += (s dy B)^T x (xa is freed);
 * with dx, dx (R, in) (beta 0 overwrites, 1 accumulates) = dy W + (s dy B) A. The frozen
 * weight and bias get no gradient. */
static vl_status lin_bwd(vl_sd_unet *m, const sd_lin *L, vl_tensor *dx, float beta,
                         const vl_tensor *dy, const vl_tensor *x, vl_tensor *xa, int64_t R) {
  sd_lora_lin l = lora_lin(m, L);
  return sd_lora_lin_bwd(m->c, &l, dx, beta, dy, x, xa, &m->lt, R);
}

/* ---- time embedding, conv_in ---------------------------------------------------------------- */

/* m->temb (B, 4 ch0) = SiLU(linear_2(SiLU(linear_1(sinusoidal(t))))): the outer SiLU is each
 * resnet's (they all apply it to the same embedding first). Forward only: nothing learns
 * here, so the SiLUs run in place. */
vl_status sd_time_embed(vl_sd_unet *m, const vl_tensor *t, vl_mem_cat cat) {
  vl_ctx *c = m->c;
  int64_t B = m->B, d0 = m->cfg.ch[0], d1 = 4 * d0;
  vl_tensor *te = &m->tmp[0], *t1 = &m->tmp[1];
  VL_TRY(vl_tensor_alloc2(c, te, m->cfg.acts, VL_MEM_TEMP, B, d0)); // (B, ch0)
  VL_TRY(vl_timestep_embed_run(c, &(vl_timestep_embed_args){.emb = te, .t = t, .B = B, .dim = d0,
                                                            .flip_sin_to_cos = true, .shift = 0.0f,
                                                            .max_period = 10000.0f}));
  sd_lin l1 = {m->t1w, m->t1b, -1, -1, d0, d1}, l2 = {m->t2w, m->t2b, -1, -1, d1, d1};
  VL_TRY(vl_tensor_alloc2(c, t1, m->cfg.acts, VL_MEM_TEMP, B, d1)); // (B, 4 ch0)
  VL_TRY(lin_fwd(m, &l1, t1, te, B, 0.0f, false, NULL));
  sd_free(m, te);
  VL_TRY(silu(m, t1, t1));
  VL_TRY(vl_tensor_alloc2(c, &m->temb, m->cfg.acts, cat, B, d1));
  VL_TRY(lin_fwd(m, &l2, &m->temb, t1, B, 0.0f, false, NULL));
  sd_free(m, t1);
  return silu(m, &m->temb, &m->temb);
}

vl_status sd_conv_in_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x) {
  vl_conv cv = conv_of(m, nd->w, nd->cin, nd->hin, nd->win, nd->C, 3, 1);
  VL_TRY(img(m, &nd->out, kcat(m->train), nd->C, nd->H, nd->W));
  return conv_fwd(m, &cv, &nd->out, x, nd->w, nd->b);
}

/* ---- ResnetBlock2D ------------------------------------------------------------------------ */

/* out = conv2(SiLU(norm2(conv1(SiLU(norm1(x))) + time_emb_proj(temb)))) + shortcut(x), x the
 * input, or cat(x, skip) on channels in an up block. */
vl_status sd_resnet_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, const vl_tensor *skip,
                        int mode) {
  vl_ctx *c = m->c;
  sd_resnet *r = &m->res[nd->ix];
  bool keep = mode & SD_KEEP;
  vl_mem_cat kc = kcat(keep);
  int64_t B = m->B, H = nd->H, W = nd->W, T = H * W, G = m->cfg.groups;
  float eps = m->cfg.norm_eps;
  vl_tensor *t0 = &m->tmp[0], *t1 = &m->tmp[1];
  const vl_tensor *xin = x;
  if (skip) { /* torch.cat([hidden_states, res_hidden_states], dim=1) */
    int64_t cs = r->cin - nd->cin;
    VL_TRY(img(m, &r->cat, kc, r->cin, H, W));
    VL_TRY(vl_chan_copy_run(c, &(vl_chan_copy_args){.y = &r->cat, .yC = r->cin, .y_c0 = 0, .x = x,
                                                   .xC = nd->cin, .x_c0 = 0, .nc = nd->cin, .N = B,
                                                   .HW = T, .accumulate = false}));
    VL_TRY(vl_chan_copy_run(c, &(vl_chan_copy_args){.y = &r->cat, .yC = r->cin, .y_c0 = nd->cin,
                                                   .x = skip, .xC = cs, .x_c0 = 0, .nc = cs, .N = B,
                                                   .HW = T, .accumulate = false}));
    xin = &r->cat;
  }
  VL_TRY(sd_f32(m, &r->m1, kc, B * G));
  VL_TRY(sd_f32(m, &r->r1, kc, B * G));
  VL_TRY(img(m, &r->n1, kc, r->cin, H, W));
  VL_TRY(gn_fwd(m, &r->n1, &r->m1, &r->r1, xin, r->n1w, r->n1b, r->cin, T, eps));
  if (!keep) {
    sd_free(m, &r->r1);
    sd_free(m, &r->m1);
  }
  vl_tensor *s1 = &r->n1; /* SiLU in place unless backward reads its input */
  if (keep) {
    VL_TRY(img(m, t0, VL_MEM_TEMP, r->cin, H, W));
    s1 = t0;
  }
  VL_TRY(silu(m, s1, &r->n1));
  vl_conv c1 = conv_of(m, r->c1w, r->cin, H, W, r->cout, 3, 1);
  VL_TRY(img(m, &r->c1, kc, r->cout, H, W));
  VL_TRY(conv_fwd(m, &c1, &r->c1, s1, r->c1w, r->c1b));
  sd_free(m, s1);
  /* + time_emb_proj(SiLU(temb))[:, :, None, None]: (B, cout) added per sample and channel */
  sd_lin tl = {r->tw, r->tb, -1, -1, 4 * m->cfg.ch[0], r->cout};
  VL_TRY(vl_tensor_alloc2(c, t1, m->cfg.acts, VL_MEM_TEMP, B, r->cout));
  VL_TRY(lin_fwd(m, &tl, t1, &m->temb, B, 0.0f, false, NULL));
  VL_TRY(vl_bias_fwd_run(c, &(vl_bias_fwd_args){.y = &r->c1, .b = t1, .outer = B, .C = r->cout,
                                                .inner = T, .per_outer = true}));
  sd_free(m, t1);
  VL_TRY(sd_f32(m, &r->m2, kc, B * G));
  VL_TRY(sd_f32(m, &r->r2, kc, B * G));
  VL_TRY(img(m, &r->n2, kc, r->cout, H, W));
  VL_TRY(gn_fwd(m, &r->n2, &r->m2, &r->r2, &r->c1, r->n2w, r->n2b, r->cout, T, eps));
  if (!keep) {
    sd_free(m, &r->r2);
    sd_free(m, &r->m2);
    sd_free(m, &r->c1);
  }
  if (mode & SD_RERUN) return VL_OK; /* backward has what it reads */
  vl_tensor *s2 = &r->n2;
  if (keep) {
    VL_TRY(img(m, t0, VL_MEM_TEMP, r->cout, H, W));
    s2 = t0;
  }
  VL_TRY(silu(m, s2, &r->n2));
  vl_conv c2 = conv_of(m, r->c2w, r->cout, H, W, r->cout, 3, 1);
  VL_TRY(img(m, &nd->out, kcat(m->train), r->cout, H, W));
  VL_TRY(conv_fwd(m, &c2, &nd->out, s2, r->c2w, r->c2b));
  sd_free(m, s2);
  int64_t n = B * r->cout * T;
  if (r->scw >= 0) { /* conv_shortcut 1x1 when the channels change */
    vl_conv cs = conv_of(m, r->scw, r->cin, H, W, r->cout, 1, 1);
    VL_TRY(img(m, t0, VL_MEM_TEMP, r->cout, H, W));
    VL_TRY(conv_fwd(m, &cs, t0, xin, r->scw, r->scb));
    VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = &nd->out, .a = 1.0f, .x = t0, .b = 1.0f, .n = n}));
    sd_free(m, t0);
  } else {
    VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = &nd->out, .a = 1.0f, .x = xin, .b = 1.0f,
                                            .n = n}));
  }
  if (!keep) sd_free(m, &r->cat);
  return VL_OK;
}

/* m->g: the output's gradient in, the main input's out; an up resnet leaves the skip's
 * gradient in skip_node->dskip when that node needs it. */
vl_status sd_resnet_bwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, sd_node *skip_node) {
  vl_ctx *c = m->c;
  sd_resnet *r = &m->res[nd->ix];
  int64_t B = m->B, H = nd->H, W = nd->W, T = H * W;
  vl_tensor *g = &m->g, *t0 = &m->tmp[0], *t1 = &m->tmp[1];
  const vl_tensor *xin = skip_node ? &r->cat : x;
  vl_conv c2 = conv_of(m, r->c2w, r->cout, H, W, r->cout, 3, 1);
  VL_TRY(img(m, t0, VL_MEM_TEMP, r->cout, H, W)); // (B, cout, H, W) d SiLU(n2), then d n2
  VL_TRY(conv_bwd_x(m, &c2, t0, g, r->c2w));
  VL_TRY(silu_bwd(m, t0, &r->n2));
  sd_free(m, &r->n2);
  VL_TRY(img(m, t1, VL_MEM_TEMP, r->cout, H, W)); // (B, cout, H, W) d c1
  VL_TRY(gn_bwd(m, t1, t0, &r->c1, r->n2w, &r->m2, &r->r2, r->cout, T, false));
  sd_free(m, t0);
  sd_free(m, &r->r2);
  sd_free(m, &r->m2);
  sd_free(m, &r->c1);
  vl_conv c1 = conv_of(m, r->c1w, r->cin, H, W, r->cout, 3, 1);
  VL_TRY(img(m, t0, VL_MEM_TEMP, r->cin, H, W)); // (B, cin, H, W) d SiLU(n1), then d n1
  VL_TRY(conv_bwd_x(m, &c1, t0, t1, r->c1w));
  sd_free(m, t1);
  VL_TRY(silu_bwd(m, t0, &r->n1));
  sd_free(m, &r->n1);
  if (r->scw >= 0) { // t1 (B, cin, H, W): d xin through the shortcut
    vl_conv cs = conv_of(m, r->scw, r->cin, H, W, r->cout, 1, 1);
    VL_TRY(img(m, t1, VL_MEM_TEMP, r->cin, H, W));
    VL_TRY(conv_bwd_x(m, &cs, t1, g, r->scw));
    sd_free(m, g);
  } else {
    sd_move(t1, g);
  }
  VL_TRY(gn_bwd(m, t1, t0, xin, r->n1w, &r->m1, &r->r1, r->cin, T, true));
  sd_free(m, t0);
  sd_free(m, &r->r1);
  sd_free(m, &r->m1);
  if (!skip_node) {
    sd_move(g, t1);
    return VL_OK;
  }
  int64_t cs = r->cin - nd->cin;
  VL_TRY(img(m, g, VL_MEM_TEMP, nd->cin, H, W));
  VL_TRY(vl_chan_copy_run(c, &(vl_chan_copy_args){.y = g, .yC = nd->cin, .y_c0 = 0, .x = t1,
                                                 .xC = r->cin, .x_c0 = 0, .nc = nd->cin, .N = B,
                                                 .HW = T, .accumulate = false}));
  if (skip_node->bwd) {
    VL_TRY(img(m, &skip_node->dskip, VL_MEM_TEMP, cs, H, W));
    VL_TRY(vl_chan_copy_run(c, &(vl_chan_copy_args){.y = &skip_node->dskip, .yC = cs, .y_c0 = 0,
                                                   .x = t1, .xC = r->cin, .x_c0 = nd->cin, .nc = cs,
                                                   .N = B, .HW = T, .accumulate = false}));
  }
  sd_free(m, t1);
  sd_free(m, &r->cat);
  return VL_OK;
}

void sd_resnet_clear(vl_sd_unet *m, sd_resnet *r) {
  vl_tensor *list[] = {&r->r2, &r->m2, &r->n2, &r->c1, &r->n1, &r->r1, &r->m1, &r->cat};
  for (size_t i = 0; i < sizeof list / sizeof *list; i++) sd_free(m, list[i]);
}

/* ---- Transformer2DModel --------------------------------------------------------------------- */

/* Attention sub-layer a (0 self, 1 cross): h[a+1] = h[a] + to_out(attn(norm(h[a]))). The
 * residual is written in place unless h[a] is kept for the norm's backward. */
static vl_status attn_fwd(vl_sd_unet *m, sd_node *nd, sd_xformer *X, int a, int mode) {
  vl_ctx *c = m->c;
  bool keep = (mode & SD_KEEP) && X->bwd_sub[a];   /* what this sub-layer's backward reads */
  bool keep_in = (mode & SD_KEEP) && X->need_dh[a]; /* the norm's input and statistics */
  bool lora = m->cfg.lora_rank > 0;
  vl_mem_cat kc = kcat(keep);
  int64_t B = m->B, T = nd->H * nd->W, R = B * T, C = X->C;
  int64_t Tk = a ? m->L : T, Rk = B * Tk, H = m->cfg.heads, D = C / H;
  VL_TRY(sd_f32(m, &X->lm[a], kcat(keep_in), R));
  VL_TRY(sd_f32(m, &X->lr[a], kcat(keep_in), R));
  VL_TRY(sd_act(m, &X->ln[a], kcat(keep && lora), B, T, C));
  VL_TRY(vl_layernorm_fwd_run(c, &(vl_layernorm_fwd_args){.y = &X->ln[a], .mean = &X->lm[a],
                                                         .rstd = &X->lr[a], .x = &X->h[a],
                                                         .gamma = fw(m, X->lnw[a]),
                                                         .beta = fw(m, X->lnb[a]), .R = R, .C = C,
                                                         .eps = m->cfg.ln_eps}));
  if (!keep_in) {
    sd_free(m, &X->lr[a]);
    sd_free(m, &X->lm[a]);
  }
  /* q from the norm; k, v from the norm (self) or the context (cross) */
  const vl_tensor *src = a ? m->ctx : &X->ln[a];
  VL_TRY(sd_act(m, &X->q[a], kc, B, T, C));
  VL_TRY(lin_fwd(m, &X->at[a][0], &X->q[a], &X->ln[a], R, 0.0f, keep, &X->xa[a][0]));
  VL_TRY(sd_act(m, &X->k[a], kc, B, Tk, C));
  VL_TRY(lin_fwd(m, &X->at[a][1], &X->k[a], src, Rk, 0.0f, keep, &X->xa[a][1]));
  VL_TRY(sd_act(m, &X->v[a], kc, B, Tk, C));
  VL_TRY(lin_fwd(m, &X->at[a][2], &X->v[a], src, Rk, 0.0f, keep, &X->xa[a][2]));
  if (!(keep && lora)) sd_free(m, &X->ln[a]);
  VL_TRY(sd_act(m, &X->o[a], kc, B, T, C));
  VL_TRY(vl_attention_fwd(c, m->cfg.attn, &X->o[a], &X->q[a], &X->k[a], &X->v[a], B, H, T, Tk, D,
                          false, keep, &X->sv[a]));
  if (!keep) {
    sd_free(m, &X->v[a]);
    sd_free(m, &X->k[a]);
    sd_free(m, &X->q[a]);
  }
  if (keep_in) {
    VL_TRY(sd_act(m, &X->h[a + 1], kcat(mode & SD_KEEP), B, T, C));
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &X->h[a + 1], .x = &X->h[a], .n = R * C}));
  } else {
    sd_move(&X->h[a + 1], &X->h[a]);
  }
  VL_TRY(lin_fwd(m, &X->at[a][3], &X->h[a + 1], &X->o[a], R, 1.0f, keep, &X->xa[a][3]));
  if (!keep) sd_free(m, &X->o[a]);
  return VL_OK;
}

/* Feed-forward: h3 (m->tmp[1]) = h[2] + ff.net.2(GEGLU(ff.net.0.proj(norm3(h[2])))); a
 * re-run stops at GEGLU's input. */
static vl_status ff_fwd(vl_sd_unet *m, sd_node *nd, sd_xformer *X, int mode) {
  vl_ctx *c = m->c;
  bool keep = (mode & SD_KEEP) && X->bwd_sub[2];
  int64_t B = m->B, T = nd->H * nd->W, R = B * T, C = X->C;
  vl_tensor *t0 = &m->tmp[0], *h3 = &m->tmp[1];
  VL_TRY(sd_f32(m, &X->lm[2], kcat(keep), R));
  VL_TRY(sd_f32(m, &X->lr[2], kcat(keep), R));
  VL_TRY(sd_act(m, t0, VL_MEM_TEMP, B, T, C)); // (B, T, C) norm3 output
  VL_TRY(vl_layernorm_fwd_run(c, &(vl_layernorm_fwd_args){.y = t0, .mean = &X->lm[2],
                                                         .rstd = &X->lr[2], .x = &X->h[2],
                                                         .gamma = fw(m, X->lnw[2]),
                                                         .beta = fw(m, X->lnb[2]), .R = R, .C = C,
                                                         .eps = m->cfg.ln_eps}));
  if (!keep) {
    sd_free(m, &X->lr[2]);
    sd_free(m, &X->lm[2]);
  }
  VL_TRY(sd_act(m, &X->ffh, kcat(keep), B, T, 8 * C));
  VL_TRY(lin_fwd(m, &X->ff1, &X->ffh, t0, R, 0.0f, false, NULL));
  sd_free(m, t0);
  if (mode & SD_RERUN) return VL_OK;
  VL_TRY(sd_act(m, t0, VL_MEM_TEMP, B, T, 4 * C)); // (B, T, 4C) GEGLU output
  VL_TRY(vl_geglu_fwd_run(c, &(vl_geglu_fwd_args){.out = t0, .h = &X->ffh, .R = R, .F = 4 * C}));
  if (!keep) sd_free(m, &X->ffh);
  if (keep) {
    VL_TRY(sd_act(m, h3, VL_MEM_TEMP, B, T, C));
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = h3, .x = &X->h[2], .n = R * C}));
  } else {
    sd_move(h3, &X->h[2]);
  }
  VL_TRY(lin_fwd(m, &X->ff2, h3, t0, R, 1.0f, false, NULL));
  sd_free(m, t0);
  return VL_OK;
}

/* out (B, C, H, W) = x + proj_out(block(proj_in(norm(x)))), the block on tokens (B, T, C). */
vl_status sd_xformer_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, int mode) {
  vl_ctx *c = m->c;
  sd_xformer *X = &m->xf[nd->ix];
  bool keep_in = (mode & SD_KEEP) && X->need_dh[0];
  int64_t B = m->B, T = nd->H * nd->W, R = B * T, C = X->C, G = m->cfg.groups;
  vl_tensor *t0 = &m->tmp[0], *h3 = &m->tmp[1];
  VL_TRY(sd_f32(m, &X->gm, kcat(keep_in), B * G));
  VL_TRY(sd_f32(m, &X->gr, kcat(keep_in), B * G));
  VL_TRY(img(m, t0, VL_MEM_TEMP, C, nd->H, nd->W)); // (B, C, H, W) GroupNorm output
  VL_TRY(gn_fwd(m, t0, &X->gm, &X->gr, x, X->gnw, X->gnb, C, T, m->cfg.attn_norm_eps));
  if (!keep_in) {
    sd_free(m, &X->gr);
    sd_free(m, &X->gm);
  }
  /* proj_in (1x1 conv) into tokens: h0_b (T, C) = t0_b^T (T, C) W^T */
  VL_TRY(sd_act(m, &X->h[0], kcat(mode & SD_KEEP), B, T, C));
  vl_gemm pi = {.ta = true, .tb = true, .M = T, .N = C, .K = C, .alpha = 1.0f, .beta = 0.0f,
                .A = t0, .lda = T, .sa = C * T, .B = fw(m, X->piw), .ldb = C, .sb = 0,
                .C = &X->h[0], .ldc = C, .sc = T * C, .batch = B};
  VL_TRY(vl_gemm_run(c, &pi));
  sd_free(m, t0);
  VL_TRY(bias(m, &X->h[0], X->pib, R, C, 1));
  VL_TRY(attn_fwd(m, nd, X, 0, mode));
  VL_TRY(attn_fwd(m, nd, X, 1, mode));
  VL_TRY(ff_fwd(m, nd, X, mode));
  if (mode & SD_RERUN) return VL_OK;
  /* proj_out back to NCHW: out_b (C, T) = x_b + W (C, C) h3_b^T + b */
  VL_TRY(img(m, &nd->out, kcat(m->train), C, nd->H, nd->W));
  VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &nd->out, .x = x, .n = B * C * T}));
  vl_gemm po = {.ta = false, .tb = true, .M = C, .N = T, .K = C, .alpha = 1.0f, .beta = 1.0f,
                .A = fw(m, X->pow), .lda = C, .sa = 0, .B = h3, .ldb = C, .sb = T * C,
                .C = &nd->out, .ldc = T, .sc = C * T, .batch = B};
  VL_TRY(vl_gemm_run(c, &po));
  sd_free(m, h3);
  return bias(m, &nd->out, X->pob, B, C, T);
}

/* dh (m->tmp[0]) = d h[3] on entry, d h[2] on exit. */
static vl_status ff_bwd(vl_sd_unet *m, sd_node *nd, sd_xformer *X) {
  vl_ctx *c = m->c;
  int64_t B = m->B, T = nd->H * nd->W, R = B * T, C = X->C;
  vl_tensor *dh = &m->tmp[0], *t1 = &m->tmp[1], *t2 = &m->tmp[2];
  VL_TRY(sd_act(m, t1, VL_MEM_TEMP, B, T, 4 * C)); // (B, T, 4C) d GEGLU output
  VL_TRY(vl_linear_bwd_x(c, t1, dh, fw(m, X->ff2.w), R, 4 * C, C, 0.0f));
  VL_TRY(sd_act(m, t2, VL_MEM_TEMP, B, T, 8 * C)); // (B, T, 8C) d ffh
  VL_TRY(vl_geglu_bwd_run(c, &(vl_geglu_bwd_args){.dh = t2, .dout = t1, .h = &X->ffh, .R = R,
                                                  .F = 4 * C}));
  sd_free(m, t1);
  sd_free(m, &X->ffh);
  VL_TRY(sd_act(m, t1, VL_MEM_TEMP, B, T, C)); // (B, T, C) d norm3 output
  VL_TRY(vl_linear_bwd_x(c, t1, t2, fw(m, X->ff1.w), R, C, 8 * C, 0.0f));
  sd_free(m, t2);
  VL_TRY(vl_layernorm_bwd_run(c, &(vl_layernorm_bwd_args){.dx = dh, .dgamma = NULL, .dbeta = NULL,
                                                         .dy = t1, .x = &X->h[2],
                                                         .gamma = fw(m, X->lnw[2]),
                                                         .mean = &X->lm[2], .rstd = &X->lr[2],
                                                         .R = R, .C = C, .accumulate = true}));
  sd_free(m, t1);
  sd_free(m, &X->lr[2]);
  sd_free(m, &X->lm[2]);
  sd_free(m, &X->h[2]);
  return VL_OK;
}

/* dh (m->tmp[0]) = d h[a+1] on entry; d h[a] on exit when need_dh[a], else freed. LoRA
 * gradients of the four linears; dL/dcontext accumulates in m->dctx (cross, ctx_grad). */
static vl_status attn_bwd(vl_sd_unet *m, sd_node *nd, sd_xformer *X, int a) {
  vl_ctx *c = m->c;
  int64_t B = m->B, T = nd->H * nd->W, R = B * T, C = X->C, Tk = a ? m->L : T, Rk = B * Tk;
  vl_tensor *dh = &m->tmp[0], *t1 = &m->tmp[1], *dq = &m->tmp[2], *dk = &m->tmp[3],
            *dv = &m->tmp[4];
  bool need = X->need_dh[a];
  VL_TRY(sd_act(m, t1, VL_MEM_TEMP, B, T, C)); // (B, T, C) d attention output
  VL_TRY(lin_bwd(m, &X->at[a][3], t1, 0.0f, dh, &X->o[a], &X->xa[a][3], R));
  if (!need) sd_free(m, dh);
  VL_TRY(sd_act(m, dq, VL_MEM_TEMP, B, T, C));
  VL_TRY(sd_act(m, dk, VL_MEM_TEMP, B, Tk, C));
  VL_TRY(sd_act(m, dv, VL_MEM_TEMP, B, Tk, C));
  VL_TRY(vl_attention_bwd(c, &X->sv[a], dq, dk, dv, t1, &X->o[a], &X->q[a], &X->k[a], &X->v[a]));
  sd_free(m, t1);
  sd_free(m, &X->o[a]);
  sd_free(m, &X->v[a]);
  sd_free(m, &X->k[a]);
  sd_free(m, &X->q[a]);
  vl_tensor *dln = need ? t1 : NULL; // (B, T, C) d norm output
  if (need) VL_TRY(sd_act(m, t1, VL_MEM_TEMP, B, T, C));
  const vl_tensor *src = a ? m->ctx : &X->ln[a];
  vl_tensor *dsrc = a ? (m->cfg.ctx_grad ? &m->dctx : NULL) : dln;
  float beta_src = a ? 1.0f : (need ? 1.0f : 0.0f); /* self: q wrote dln first */
  VL_TRY(lin_bwd(m, &X->at[a][0], dln, 0.0f, dq, &X->ln[a], &X->xa[a][0], R));
  VL_TRY(lin_bwd(m, &X->at[a][1], dsrc, beta_src, dk, src, &X->xa[a][1], Rk));
  VL_TRY(lin_bwd(m, &X->at[a][2], dsrc, beta_src, dv, src, &X->xa[a][2], Rk));
  sd_free(m, dv);
  sd_free(m, dk);
  sd_free(m, dq);
  sd_free(m, &X->ln[a]);
  if (need) {
    VL_TRY(vl_layernorm_bwd_run(c, &(vl_layernorm_bwd_args){.dx = dh, .dgamma = NULL, .dbeta = NULL,
                                                           .dy = t1, .x = &X->h[a],
                                                           .gamma = fw(m, X->lnw[a]),
                                                           .mean = &X->lm[a], .rstd = &X->lr[a],
                                                           .R = R, .C = C, .accumulate = true}));
    sd_free(m, t1);
    sd_free(m, &X->lr[a]);
    sd_free(m, &X->lm[a]);
    sd_free(m, &X->h[a]);
  }
  return VL_OK;
}

/* m->g (B, C, H, W): the output's gradient in; the input's out when nd->gin (the residual
 * plus the GroupNorm path), else freed. */
vl_status sd_xformer_bwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x) {
  vl_ctx *c = m->c;
  sd_xformer *X = &m->xf[nd->ix];
  int64_t B = m->B, T = nd->H * nd->W, C = X->C;
  vl_tensor *g = &m->g, *dh = &m->tmp[0], *t1 = &m->tmp[1];
  /* proj_out: dh_b (T, C) = g_b^T (T, C) W */
  VL_TRY(sd_act(m, dh, VL_MEM_TEMP, B, T, C));
  vl_gemm po = {.ta = true, .tb = false, .M = T, .N = C, .K = C, .alpha = 1.0f, .beta = 0.0f,
                .A = g, .lda = T, .sa = C * T, .B = fw(m, X->pow), .ldb = C, .sb = 0,
                .C = dh, .ldc = C, .sc = T * C, .batch = B};
  VL_TRY(vl_gemm_run(c, &po));
  if (!nd->gin) sd_free(m, g);
  VL_TRY(ff_bwd(m, nd, X));
  if (X->bwd_sub[1]) VL_TRY(attn_bwd(m, nd, X, 1));
  if (X->bwd_sub[0]) VL_TRY(attn_bwd(m, nd, X, 0));
  if (!nd->gin) {
    sd_free(m, dh);
    return VL_OK;
  }
  /* proj_in: dt_b (C, T) = W^T (C, C) dh_b^T; then g += GroupNorm's input gradient */
  VL_TRY(img(m, t1, VL_MEM_TEMP, C, nd->H, nd->W));
  vl_gemm pi = {.ta = true, .tb = true, .M = C, .N = T, .K = C, .alpha = 1.0f, .beta = 0.0f,
                .A = fw(m, X->piw), .lda = C, .sa = 0, .B = dh, .ldb = C, .sb = T * C,
                .C = t1, .ldc = T, .sc = C * T, .batch = B};
  VL_TRY(vl_gemm_run(c, &pi));
  sd_free(m, dh);
  VL_TRY(gn_bwd(m, g, t1, x, X->gnw, &X->gm, &X->gr, C, T, true));
  sd_free(m, t1);
  sd_free(m, &X->gr);
  sd_free(m, &X->gm);
  return VL_OK;
}

void sd_xformer_clear(vl_sd_unet *m, sd_xformer *X) {
  for (int a = 1; a >= 0; a--) {
    vl_attn_saved_free(m->c, &X->sv[a]);
    for (int i = 3; i >= 0; i--) sd_free(m, &X->xa[a][i]);
    vl_tensor *list[] = {&X->o[a], &X->v[a], &X->k[a], &X->q[a], &X->ln[a]};
    for (size_t i = 0; i < sizeof list / sizeof *list; i++) sd_free(m, list[i]);
  }
  sd_free(m, &X->ffh);
  for (int a = 2; a >= 0; a--) {
    sd_free(m, &X->lr[a]);
    sd_free(m, &X->lm[a]);
    sd_free(m, &X->h[a]);
  }
  sd_free(m, &X->gr);
  sd_free(m, &X->gm);
}

/* ---- samplers and the head -------------------------------------------------------------- */

/* Downsample2D: out (B, C, H/2, W/2) = conv3x3 stride 2 padding 1 (x) + b */
vl_status sd_down_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x) {
  vl_conv cv = conv_of(m, nd->w, nd->cin, nd->hin, nd->win, nd->C, 3, 2);
  VL_TRY(img(m, &nd->out, kcat(m->train), nd->C, nd->H, nd->W));
  return conv_fwd(m, &cv, &nd->out, x, nd->w, nd->b);
}

vl_status sd_down_bwd(vl_sd_unet *m, sd_node *nd) {
  vl_conv cv = conv_of(m, nd->w, nd->cin, nd->hin, nd->win, nd->C, 3, 2);
  vl_tensor *t0 = &m->tmp[0]; // (B, cin, hin, win)
  VL_TRY(img(m, t0, VL_MEM_TEMP, nd->cin, nd->hin, nd->win));
  VL_TRY(conv_bwd_x(m, &cv, t0, &m->g, nd->w));
  sd_free(m, &m->g);
  sd_move(&m->g, t0);
  return VL_OK;
}

/* Upsample2D: out (B, C, 2H, 2W) = conv3x3(nearest 2x (x)) + b */
vl_status sd_up_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x) {
  vl_tensor *t0 = &m->tmp[0]; // (B, cin, 2 hin, 2 win)
  VL_TRY(img(m, t0, VL_MEM_TEMP, nd->cin, nd->H, nd->W));
  VL_TRY(vl_upsample2x_fwd_run(m->c, &(vl_upsample2x_fwd_args){.y = t0, .x = x,
                                                              .planes = m->B * nd->cin,
                                                              .H = nd->hin, .W = nd->win,
                                                              .nearest = true}));
  vl_conv cv = conv_of(m, nd->w, nd->cin, nd->H, nd->W, nd->C, 3, 1);
  VL_TRY(img(m, &nd->out, kcat(m->train), nd->C, nd->H, nd->W));
  VL_TRY(conv_fwd(m, &cv, &nd->out, t0, nd->w, nd->b));
  sd_free(m, t0);
  return VL_OK;
}

vl_status sd_up_bwd(vl_sd_unet *m, sd_node *nd) {
  vl_conv cv = conv_of(m, nd->w, nd->cin, nd->H, nd->W, nd->C, 3, 1);
  vl_tensor *t0 = &m->tmp[0]; // (B, cin, 2 hin, 2 win)
  VL_TRY(img(m, t0, VL_MEM_TEMP, nd->cin, nd->H, nd->W));
  VL_TRY(conv_bwd_x(m, &cv, t0, &m->g, nd->w));
  sd_free(m, &m->g);
  VL_TRY(img(m, &m->g, VL_MEM_TEMP, nd->cin, nd->hin, nd->win));
  VL_TRY(vl_upsample2x_bwd_run(m->c, &(vl_upsample2x_bwd_args){.dx = &m->g, .dy = t0,
                                                              .planes = m->B * nd->cin,
                                                              .H = nd->hin, .W = nd->win,
                                                              .nearest = true}));
  sd_free(m, t0);
  return VL_OK;
}

/* pred (B, out_ch, H, W) (VL_MEM_TEMP, the caller's) = conv_out(SiLU(conv_norm_out(x))) */
vl_status sd_out_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, vl_tensor *pred) {
  bool keep = nd->keep;
  int64_t T = nd->H * nd->W;
  VL_TRY(sd_f32(m, &nd->nm, kcat(keep), m->B * m->cfg.groups));
  VL_TRY(sd_f32(m, &nd->nr, kcat(keep), m->B * m->cfg.groups));
  VL_TRY(img(m, &nd->n, kcat(keep), nd->cin, nd->H, nd->W));
  VL_TRY(gn_fwd(m, &nd->n, &nd->nm, &nd->nr, x, nd->gw, nd->gb, nd->cin, T, m->cfg.norm_eps));
  if (!keep) {
    sd_free(m, &nd->nr);
    sd_free(m, &nd->nm);
  }
  vl_tensor *s = &nd->n;
  if (keep) {
    VL_TRY(img(m, &m->tmp[0], VL_MEM_TEMP, nd->cin, nd->H, nd->W));
    s = &m->tmp[0];
  }
  VL_TRY(silu(m, s, &nd->n));
  vl_conv cv = conv_of(m, nd->w, nd->cin, nd->H, nd->W, nd->C, 3, 1);
  VL_TRY(img(m, pred, VL_MEM_TEMP, nd->C, nd->H, nd->W));
  VL_TRY(conv_fwd(m, &cv, pred, s, nd->w, nd->b));
  sd_free(m, s);
  return VL_OK;
}

/* m->g (B, cin, H, W) = d x from dpred (B, out_ch, H, W) */
vl_status sd_out_bwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, const vl_tensor *dpred) {
  vl_ctx *c = m->c;
  int64_t T = nd->H * nd->W;
  vl_tensor *t0 = &m->tmp[0], *t1 = &m->tmp[1];
  if (dpred->dtype != m->cfg.acts) { // t1 (B, out_ch, H, W): dpred in the acts dtype
    VL_TRY(img(m, t1, VL_MEM_TEMP, nd->C, nd->H, nd->W));
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = t1, .x = dpred, .n = t1->n}));
    dpred = t1;
  }
  vl_conv cv = conv_of(m, nd->w, nd->cin, nd->H, nd->W, nd->C, 3, 1);
  VL_TRY(img(m, t0, VL_MEM_TEMP, nd->cin, nd->H, nd->W)); // (B, cin, H, W) d SiLU, then d n
  VL_TRY(conv_bwd_x(m, &cv, t0, dpred, nd->w));
  sd_free(m, t1);
  VL_TRY(silu_bwd(m, t0, &nd->n));
  sd_free(m, &nd->n);
  VL_TRY(img(m, &m->g, VL_MEM_TEMP, nd->cin, nd->H, nd->W));
  VL_TRY(gn_bwd(m, &m->g, t0, x, nd->gw, &nd->nm, &nd->nr, nd->cin, T, false));
  sd_free(m, t0);
  sd_free(m, &nd->nr);
  sd_free(m, &nd->nm);
  return VL_OK;
}
