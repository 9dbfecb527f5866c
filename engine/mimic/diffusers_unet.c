/* The mimic of the sd-lora step in PyTorch (vramlab/mimic.h: vl_mimic_sd_unet): diffusers'
 * UNet2DConditionModel at the engine's dimensions (tools/peers/sd_lora_peer.py), frozen,
 * PEFT LoRA on to_q / to_k / to_v / to_out.0 of every attention (factors in fp32), the
 * script's step on cached latents and text embeddings, or on an uncached rung first the
 * frozen VAE encoder's sample and CLIP's last_hidden_state under no_grad from images and
 * token ids: DDPMScheduler.add_noise, the U-Net's noise prediction,
 * F.mse_loss(pred.float(), noise), AdamW on the factors, the clip, gradients set to None; op
 * by op over tape.c, as tools/peers/torch_trace.py's traces (tests/fixtures/trace/sd-*.json)
 * show the step. The CUDA code path is the same program under CUDA's autocast and kernels,
 * not held to a trace (the tracer runs on the CPU) nor yet to a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tape.h"

typedef struct {
  mt_id a, b; /* LoRA factors (0: no LoRA) */
  int64_t in, out;
} lin;

typedef struct prog prog;
typedef struct ck ck;
struct prog {
  const vl_mimic_sd_unet_cfg *c;
  mt_tape *t;
  int64_t B, TE, G, H;
  int wesz; /* the frozen base's element size */
  int aesz; /* autocast's (fp16/bf16: 2), 0 without autocast */
  bool cuda; /* CUDA's code path: autocast runs the norms in fp32, flash attention, foreach AdamW */
  int64_t frozen;
  mt_id noise, steps, latents, context; /* context: the micro-batch's CLIP output when uncached */
  mt_id images, tokens;                 /* an uncached rung's batch */
  mt_id temb; /* the time embedding (B, TE) */
  mt_id w;    /* a frozen weight (no bytes: the base's are one leaf): what autograd saves of
                 the frozen weights, holders under checkpointing */
  mt_id ctx_held;  /* checkpointing, uncached: the transformer blocks' frames keep CLIP's output
                      (their encoder_hidden_states), which their recomputation reads; held to
                      the backward's end */
  mt_id temb_held; /* checkpointing: the resnets' frames keep temb (an argument) until the
                      backward has run them; held to the backward's end here */
  ck **cks;   /* the checkpointed blocks' contexts */
  int nck, cck;
  mt_optim opt;
};

static void frozen(prog *p, int64_t numel) { p->frozen += numel; }

static void lora(prog *p, lin *l, int64_t in, int64_t out, bool bias) {
  l->in = in;
  l->out = out;
  frozen(p, in * out + (bias ? out : 0));
  int64_t r = p->c->model.lora_rank;
  if (r <= 0) return;
  l->a = mt_leaf(p->t, "param", r * in, 4, VL_MC_PARAM, true);
  l->b = mt_leaf(p->t, "param", out * r, 4, VL_MC_PARAM, true);
  p->opt.train[p->opt.ntrain++] = l->a;
  p->opt.train[p->opt.ntrain++] = l->b;
}

/* ---- the frozen base's size and the LoRA factors, module by module ---------------------- */

static void resnet_params(prog *p, int64_t cin, int64_t cout) {
  frozen(p, 2 * cin + cin * cout * 9 + cout + p->TE * cout + cout + 2 * cout + cout * cout * 9 + cout);
  if (cin != cout) frozen(p, cin * cout + cout);
}

typedef struct {
  lin q1, k1, v1, o1, q2, k2, v2, o2;
} tblock;

static void transformer_params(prog *p, int64_t C, tblock *b) {
  int64_t D = p->c->model.ctx_dim;
  frozen(p, 2 * C + C * C + C); /* norm, proj_in */
  frozen(p, 2 * C);             /* norm1 */
  lora(p, &b->q1, C, C, false);
  lora(p, &b->k1, C, C, false);
  lora(p, &b->v1, C, C, false);
  lora(p, &b->o1, C, C, true);
  frozen(p, 2 * C); /* norm2 */
  lora(p, &b->q2, C, C, false);
  lora(p, &b->k2, D, C, false);
  lora(p, &b->v2, D, C, false);
  lora(p, &b->o2, C, C, true);
  frozen(p, 2 * C);                               /* norm3 */
  frozen(p, C * 8 * C + 8 * C + 4 * C * C + C);   /* GEGLU proj, ff.net.2 */
  frozen(p, C * C + C);                           /* proj_out */
}

/* The frozen encoders' elements (an uncached rung): AutoencoderKL's encoder and quant_conv,
 * CLIPTextModel (its position_ids are a buffer) */
static int64_t vae_resnet_params(int64_t cin, int64_t cout) {
  return 2 * cin + cin * cout * 9 + cout + 2 * cout + cout * cout * 9 + cout + (cin != cout ? cin * cout + cout : 0);
}

static int64_t vae_params(const vl_sd_vae_cfg *v) {
  int64_t C = v->ch[0], m = 2 * v->latent_ch, n = v->in_ch * C * 9 + C; /* conv_in */
  for (int i = 0; i < v->n_levels; i++) {
    for (int j = 0; j < v->layers_per_block; j++) n += vae_resnet_params(j == 0 ? C : v->ch[i], v->ch[i]);
    C = v->ch[i];
    if (i < v->n_levels - 1) n += C * C * 9 + C; /* Downsample2D's conv */
  }
  n += 2 * vae_resnet_params(C, C) + (v->mid_attn ? 2 * C + 4 * (C * C + C) : 0);
  return n + 2 * C + C * m * 9 + m + m * m + m; /* conv_norm_out, conv_out, quant_conv */
}

static int64_t clip_params(const vl_sd_clip_cfg *c) {
  int64_t D = c->dim, F = c->ffn;
  int64_t layer = 2 * D + 4 * (D * D + D) + 2 * D + D * F + F + F * D + D;
  return c->vocab * D + c->n_pos * D + c->n_layers * layer + 2 * D;
}

/* ---- forward ops ------------------------------------------------------------------------ */

static mt_id op1(prog *p, const char *op, mt_bw bw, int64_t numel, mt_id x) {
  return mt_op(p->t, op, bw, numel, mt_esz(p->t, x), x, 0, 0);
}

/* GroupNorm / LayerNorm in the input's dtype (CPU autocast leaves them alone), mean and rstd
 * in it too */
static mt_id norm(prog *p, bool group, mt_id x, int64_t stats) {
  /* CUDA's autocast lists group_norm and layer_norm as fp32 ops: the input cast up, the
   * output (and what follows it until the next matmul or conv casts down) in fp32 (the frozen
   * affine weights' fp32 casts, C elements each, left out) */
  mt_id xc = p->cuda && p->aesz ? mt_cast(p->t, x, 4, false) : (mt_ref(p->t, x), x);
  int e = mt_esz(p->t, xc);
  mt_id y = mt_op(p->t, group ? "native_group_norm" : "native_layer_norm", group ? MT_BW_GN : MT_BW_LN,
                  mt_numel(p->t, xc), e, xc, p->w, group ? 0 : p->w);
  mt_aux(p->t, y, group ? "native_group_norm" : "native_layer_norm", stats, e);
  mt_aux(p->t, y, group ? "native_group_norm" : "native_layer_norm", stats, e);
  mt_drop(p->t, xc);
  return y;
}

/* autocast's cast of an activation to its dtype (x itself without autocast or when it has it) */
static mt_id ac(prog *p, mt_id x) {
  if (!p->aesz) {
    mt_ref(p->t, x);
    return x;
  }
  return mt_cast(p->t, x, p->aesz, true);
}

static mt_id conv(prog *p, mt_id x, int64_t numel) {
  mt_id xc = ac(p, x);
  mt_id y = mt_op(p->t, "convolution", MT_BW_CONV, numel, mt_esz(p->t, xc), xc, p->w, 0);
  mt_drop(p->t, xc);
  return y;
}

/* x (rows, in) through a PEFT LoRA linear: base_layer(x) + lora_B(lora_A(x)) * scaling */
/* nc: its output's gradient arrives non-contiguous (the residual stream's, below), so each
 * mm's backward copies it first */
static mt_id linear(prog *p, mt_id x, const lin *l, int64_t rows, bool bias, bool nc) {
  mt_tape *t = p->t;
  mt_id xc = ac(p, x);
  mt_id y = mt_op(t, bias ? "addmm" : "mm", MT_BW_MM, rows * l->out, mt_esz(t, xc), xc, p->w, 0);
  mt_drop(t, xc);
  if (nc && mt_requires_grad(t, y)) mt_noncontig_grad(t, y);
  if (!l->a) return y;
  /* PEFT casts the input to the factors' dtype (fp32), then each factor's F.linear runs under
   * autocast: the weight's cast (cached), then the input's */
  mt_id x32 = mt_cast(t, x, 4, false);
  mt_id ac_a = p->aesz ? mt_cast(t, l->a, p->aesz, true) : (mt_ref(t, l->a), l->a);
  mt_id xa = ac(p, x32);
  int e = p->aesz ? p->aesz : 4;
  mt_id a = mt_op(t, "mm", MT_BW_MM, rows * p->c->model.lora_rank, e, xa, ac_a, 0);
  mt_drop(t, xa);
  mt_drop(t, ac_a);
  mt_id ac_b = p->aesz ? mt_cast(t, l->b, p->aesz, true) : (mt_ref(t, l->b), l->b);
  mt_id b = mt_op(t, "mm", MT_BW_MM, rows * l->out, e, a, ac_b, 0);
  mt_drop(t, ac_b);
  if (nc) mt_noncontig_grad(t, b);
  mt_drop(t, a);
  mt_id m = mt_op(t, "mul", MT_BW_MULS, rows * l->out, e, b, 0, 0);
  mt_drop(t, b);
  mt_id s = mt_op(t, "add", MT_BW_ADD, rows * l->out, mt_esz(t, y) > e ? mt_esz(t, y) : e, y, m, 0);
  mt_drop(t, m);
  mt_drop(t, y);
  mt_drop(t, x32);
  return s;
}

/* head_to_batch_dim / batch_to_head_dim: reshape, permute, reshape: a copy, whose gradient's
 * reshape back copies too */
static mt_id heads_copy(prog *p, mt_id x, bool nc) {
  mt_id y = op1(p, "clone", MT_BW_ADD, mt_numel(p->t, x), x);
  if (nc && mt_requires_grad(p->t, y)) mt_noncontig_grad(p->t, y);
  mt_drop(p->t, x);
  return y;
}

/* AttnProcessor ("classic"): the scores materialised, baddbmm(empty, q, k^T, beta=0,
 * alpha=scale), softmax (fp32 on CUDA's autocast), bmm with v; q, k, v are consumed */
static mt_id classic(prog *p, mt_id q, mt_id k, mt_id v, int64_t Lq, int64_t Lk) {
  mt_tape *t = p->t;
  int64_t n = p->B * p->H * Lq * Lk;
  /* k's gradient comes out of baddbmm transposed, which the reshape back takes as a view (no
   * copy here: the to_k linear's mm nodes copy it, marked by the caller); q's and v's copy */
  q = heads_copy(p, q, true);
  k = heads_copy(p, k, false);
  v = heads_copy(p, v, true);
  int e = mt_esz(t, q);
  mt_id em = mt_temp(t, "empty", n, e);
  mt_id s = mt_op(t, "baddbmm", MT_BW_BADDBMM, n, e, q, k, 0);
  mt_drop(t, em);
  mt_id sc = p->cuda && p->aesz ? mt_cast(t, s, 4, false) : (mt_ref(t, s), s);
  mt_drop(t, s);
  mt_id pr = op1(p, "_softmax", MT_BW_SOFTMAX, n, sc);
  mt_drop(t, sc);
  mt_id pc = ac(p, pr); /* bmm's autocast cast of fp32 probabilities (CUDA) */
  mt_drop(t, pr);
  mt_id o = mt_op(t, "bmm", MT_BW_BMM, mt_numel(t, q), mt_esz(t, pc), pc, v, 0);
  mt_drop(t, pc);
  mt_id oc = heads_copy(p, o, true);
  mt_drop(t, q); /* the processor's query, key and value: kept until it returns */
  mt_drop(t, k);
  mt_drop(t, v);
  return oc;
}

/* diffusers' Attention with AttnProcessor2_0: q from x, k and v from ctx (x for attn1), SDPA,
 * to_out.0, / rescale_output_factor */
static mt_id attention(prog *p, mt_id x, mt_id ctx, int64_t Lq, int64_t Lk, const lin *q, const lin *k,
                       const lin *v, const lin *o) {
  mt_tape *t = p->t;
  int64_t B = p->B, C = q->out;
  bool cl = p->c->model.attn == VL_ATTN_CLASSIC;
  mt_id qq = linear(p, x, q, B * Lq, false, false), kk = linear(p, ctx, k, B * Lk, false, cl && B > 1);
  mt_id vv = linear(p, ctx, v, B * Lk, false, false);
  mt_id a;
  if (p->c->model.attn == VL_ATTN_CLASSIC) {
    a = classic(p, qq, kk, vv, Lq, Lk);
  } else {
    /* CUDA: flash attention in fp16/bf16; in fp32 the memory-efficient kernel, whose
     * logsumexp pads the queries to a multiple of 32 */
    const char *op = !p->cuda ? "_scaled_dot_product_flash_attention_for_cpu"
                     : p->aesz ? "_scaled_dot_product_flash_attention"
                               : "_scaled_dot_product_efficient_attention";
    int64_t lq = p->cuda && !p->aesz ? (Lq + 31) / 32 * 32 : Lq;
    a = mt_sdpa(t, op, qq, kk, vv, 0, B * p->H * lq);
    if (p->cuda && p->aesz) mt_flash_bw_buffers(t, a, B, p->H, p->H, Lq, Lk, C / p->H);
  }
  mt_id y = linear(p, a, o, B * Lq, true, p->B > 1);
  mt_drop(t, a);
  mt_id d = op1(p, "div", MT_BW_DIVS, B * Lq * C, y);
  mt_drop(t, y);
  if (p->c->model.attn != VL_ATTN_CLASSIC) {
    mt_drop(t, qq); /* the processor's locals, at its return */
    mt_drop(t, kk);
    mt_drop(t, vv);
  }
  return d;
}

/* BasicTransformerBlock; h keeps the caller's reference. Its output's gradient comes back
 * through Transformer2DModel's reshape(B, H, W, C).permute(0, 3, 1, 2): a permuted view, which
 * for B > 1 no (B * L, C) view can take, and the residual stream keeps that layout (each
 * accumulation's add follows its first operand's): the mm nodes fed from it (ff.net.2, both
 * to_out.0's base and lora_B) copy it first, as the traces show (five clones a block). */
static mt_id basic_block(prog *p, mt_id h, int64_t C, int64_t L, const tblock *b) {
  mt_tape *t = p->t;
  int64_t B = p->B, rows = B * L;
  mt_id n1 = norm(p, false, h, rows);
  mt_id a1 = attention(p, n1, n1, L, L, &b->q1, &b->k1, &b->v1, &b->o1);
  mt_id h2 = mt_op(t, "add", MT_BW_ADD, rows * C, mt_esz(t, h), a1, h, 0);
  mt_id n2 = norm(p, false, h2, rows);
  mt_drop(t, n1); /* norm_hidden_states rebound */
  mt_id a2 = attention(p, n2, p->context, L, p->c->model.ctx_len, &b->q2, &b->k2, &b->v2, &b->o2);
  mt_drop(t, a1);
  mt_id h3 = mt_op(t, "add", MT_BW_ADD, rows * C, mt_esz(t, h2), a2, h2, 0);
  mt_drop(t, h2);
  mt_id n3 = norm(p, false, h3, rows);
  mt_drop(t, n2);
  /* GEGLU: proj, chunk(2), hidden * gelu(gate); then ff.net.2 */
  mt_id pr = mt_op(t, "addmm", MT_BW_MM, rows * 8 * C, mt_esz(t, n3), n3, p->w, 0);
  mt_id hs, gate;
  mt_chunk2(t, pr, &hs, &gate);
  mt_drop(t, pr);
  mt_id g = op1(p, "gelu", MT_BW_GELU, rows * 4 * C, gate);
  mt_id m = mt_op(t, "mul", MT_BW_MUL, rows * 4 * C, mt_esz(t, hs), hs, g, 0);
  mt_drop(t, g);
  mt_drop(t, hs);
  mt_drop(t, gate);
  mt_id ff = mt_op(t, "addmm", MT_BW_MM, rows * C, mt_esz(t, m), m, p->w, 0);
  if (p->B > 1) mt_noncontig_grad(t, ff);
  mt_drop(t, m);
  mt_drop(t, n3);
  mt_id h4 = mt_op(t, "add", MT_BW_ADD, rows * C, mt_esz(t, h3), ff, h3, 0);
  mt_drop(t, ff);
  mt_drop(t, h3);
  mt_drop(t, a2);
  return h4;
}

static mt_id checkpointed_block(prog *p, mt_id x, int64_t C, int64_t L, const tblock *b);

/* Transformer2DModel (continuous input, 1x1 conv projections); x keeps the caller's reference */
static mt_id transformer(prog *p, mt_id x, int64_t C, int64_t S, const tblock *b) {
  mt_tape *t = p->t;
  int64_t n = p->B * C * S * S;
  mt_id g = norm(p, true, x, p->B * p->G);
  mt_id pi = conv(p, g, n);
  mt_drop(t, g);
  mt_id h = checkpointed_block(p, pi, C, S * S, b);
  mt_drop(t, pi);
  mt_id c = op1(p, "clone", MT_BW_ADD, n, h); /* permute(0, 3, 1, 2).contiguous() */
  mt_drop(t, h);
  mt_id po = conv(p, c, n);
  mt_drop(t, c);
  mt_id o = mt_op(t, "add", MT_BW_ADD, n, mt_esz(t, po), po, x, 0);
  mt_drop(t, po);
  return o;
}

/* ResnetBlock2D; x keeps the caller's reference */
static mt_id resnet(prog *p, mt_id x, int64_t cin, int64_t cout, int64_t S) {
  mt_tape *t = p->t;
  int64_t B = p->B, n = B * cout * S * S;
  mt_id g1 = norm(p, true, x, B * p->G);
  mt_id s1 = op1(p, "silu", MT_BW_SILU, B * cin * S * S, g1);
  mt_drop(t, g1);
  mt_id c1 = conv(p, s1, n);
  mt_drop(t, s1);
  mt_id st = op1(p, "silu", MT_BW_SILU, B * p->TE, p->temb);
  mt_id tp = mt_op(t, "addmm", MT_BW_MM, B * cout, mt_esz(t, st), st, p->w, 0);
  mt_drop(t, st);
  mt_id a = mt_op(t, "add", MT_BW_ADD, n, mt_esz(t, c1), c1, tp, 0);
  mt_drop(t, c1);
  mt_id g2 = norm(p, true, a, B * p->G);
  mt_drop(t, a);
  mt_id s2 = op1(p, "silu", MT_BW_SILU, n, g2);
  mt_drop(t, g2);
  mt_id c2 = conv(p, s2, n);
  mt_drop(t, s2);
  mt_id sc = x;
  if (cin != cout) sc = conv(p, x, n);
  else mt_ref(t, x);
  mt_id o = mt_op(t, "add", MT_BW_ADD, n, mt_esz(t, c2), sc, c2, 0);
  mt_id d = op1(p, "div", MT_BW_DIVS, n, o);
  mt_drop(t, o);
  mt_drop(t, tp);
  mt_drop(t, c2);
  mt_drop(t, sc);
  return d;
}

/* ---- checkpointing: torch.utils.checkpoint (non-reentrant) around every resnet and every
 * BasicTransformerBlock (unet.enable_gradient_checkpointing) ------------------------------- */

struct ck {
  prog *p;
  int64_t cin, cout, C, S, L;
  const tblock *b;
};

static mt_id resnet_fn(void *ctx, mt_id x) {
  ck *k = ctx;
  return resnet(k->p, x, k->cin, k->cout, k->S);
}
static mt_id block_fn(void *ctx, mt_id x) {
  ck *k = ctx;
  return basic_block(k->p, x, k->C, k->L, k->b);
}

/* a checkpointed block: fn's context lives as long as the tape's backward needs it */
static mt_id checkpointed(prog *p, mt_block_fn fn, const ck *k, mt_id x) {
  if (!p->c->model.checkpoint) return fn((void *)k, x);
  if (p->nck == p->cck) {
    p->cck = p->cck ? 2 * p->cck : 64;
    ck **q = realloc(p->cks, (size_t)p->cck * sizeof *q);
    if (!q) abort();
    p->cks = q;
  }
  ck *c = malloc(sizeof *c);
  if (!c) abort();
  *c = *k;
  p->cks[p->nck++] = c;
  mt_ckpt_begin(p->t, x);
  mt_id y = fn(c, x);
  mt_ckpt_end(p->t, fn, c);
  return y;
}

static mt_id checkpointed_block(prog *p, mt_id x, int64_t C, int64_t L, const tblock *b) {
  ck k = {.p = p, .C = C, .L = L, .b = b};
  return checkpointed(p, block_fn, &k, x);
}

static mt_id resnet_ck(prog *p, mt_id x, int64_t cin, int64_t cout, int64_t S) {
  ck k = {.p = p, .cin = cin, .cout = cout, .S = S};
  return checkpointed(p, resnet_fn, &k, x);
}

/* ---- the model ----------------------------------------------------------------------------- */

typedef struct {
  tblock *tb;
  int ntb;
} blocks;

/* in the order diffusers registers the modules (down_blocks, up_blocks, mid_block): the
 * parameters' order, which the optimizer's loop follows */
static void build(prog *p, blocks *bl) {
  const vl_sd_unet_cfg *m = &p->c->model;
  int nb = m->n_blocks;
  int64_t C0 = m->ch[0];
  frozen(p, m->in_ch * C0 * 9 + C0);                          /* conv_in */
  frozen(p, C0 * p->TE + p->TE + p->TE * p->TE + p->TE);      /* time_embedding */
  int k = 0;
  int64_t prev = C0;
  for (int i = 0; i < nb; i++) { /* down blocks */
    for (int j = 0; j < m->layers; j++) {
      resnet_params(p, j == 0 ? prev : m->ch[i], m->ch[i]);
      if (m->down_attn[i]) transformer_params(p, m->ch[i], &bl->tb[k++]);
    }
    if (i < nb - 1) frozen(p, m->ch[i] * m->ch[i] * 9 + m->ch[i]);
    prev = m->ch[i];
  }
  int64_t Cm = m->ch[nb - 1];
  prev = Cm;
  for (int i = 0; i < nb; i++) { /* up blocks (reversed channels) */
    int64_t out = m->ch[nb - 1 - i], in = m->ch[nb - 1 - (i + 1 < nb ? i + 1 : nb - 1)];
    for (int j = 0; j <= m->layers; j++) {
      int64_t skip = j == m->layers ? in : out, rin = j == 0 ? prev : out;
      resnet_params(p, rin + skip, out);
      if (m->up_attn[i]) transformer_params(p, out, &bl->tb[k++]);
    }
    if (i < nb - 1) frozen(p, out * out * 9 + out);
    prev = out;
  }
  resnet_params(p, Cm, Cm); /* mid_block: resnets[0], attentions[0], resnets[1] */
  transformer_params(p, Cm, &bl->tb[k++]);
  resnet_params(p, Cm, Cm);
  frozen(p, 2 * C0 + C0 * m->out_ch * 9 + m->out_ch); /* conv_norm_out, conv_out */
  bl->ntb = k;
  bool enc = p->c->encoders_in_step;
  if (enc) frozen(p, vae_params(&p->c->vae) + clip_params(&p->c->text));
  (void)mt_leaf(p->t, "param", p->frozen, p->wesz, VL_MC_PARAM, false);
  p->w = mt_leaf(p->t, "param", 0, p->wesz, VL_MC_PARAM, false);
  if (enc) (void)mt_leaf(p->t, "buffer", p->c->text.n_pos, 8, VL_MC_BUFFER, false); /* CLIP's position_ids */
  int64_t lat = p->B * m->in_ch * m->sample * m->sample;
  p->noise = mt_leaf(p->t, "input", lat, 4, VL_MC_OTH, false);
  p->steps = mt_leaf(p->t, "input", p->B, 8, VL_MC_OTH, false);
  if (enc) { /* images (B, 3, H, W) in the frozen dtype, token ids (B, L) int64 */
    int64_t side = p->c->vae.image;
    p->images = mt_leaf(p->t, "input", p->B * p->c->vae.in_ch * side * side, p->wesz, VL_MC_OTH, false);
    p->tokens = mt_leaf(p->t, "input", p->B * m->ctx_len, 8, VL_MC_OTH, false);
    return;
  }
  p->latents = mt_leaf(p->t, "input", lat, 4, VL_MC_OTH, false);
  p->context = mt_leaf(p->t, "input", p->B * m->ctx_len * m->ctx_dim, 4, VL_MC_OTH, false);
}

/* ---- the frozen encoders in the step (an uncached rung), under torch.no_grad() -----------
 * Nothing in them requires grad (frozen weights, images, token ids), so no op records a node
 * or saves anything: each output lives while a Python name holds it and goes when the last one
 * is rebound or its frame returns, as the traces show (tests/fixtures/trace/sd-*-enc*.json).
 * They run in the frozen dtype (the peer casts both models and the images to it); CPU
 * autocast keeps every op of theirs in it, CUDA's runs the norms and exp in fp32. */

/* an op without autograd history: its output only */
static mt_id ng(prog *p, const char *op, int64_t numel, int esz) {
  return mt_op(p->t, op, MT_BW_ADD, numel, esz, 0, 0, 0);
}

/* diffusers' ResnetBlock2D without a time embedding (the VAE encoder's); x keeps the caller's
 * reference: the sum's temporary, then hidden_states and a shortcut's output at the return */
static mt_id vae_resnet(prog *p, mt_id x, int64_t cin, int64_t cout, int64_t S) {
  mt_tape *t = p->t;
  int64_t n = p->B * cout * S * S, st = p->B * p->c->vae.groups;
  mt_id g1 = norm(p, true, x, st);
  mt_id s1 = op1(p, "silu", MT_BW_SILU, mt_numel(t, g1), g1);
  mt_drop(t, g1);
  mt_id c1 = conv(p, s1, n);
  mt_drop(t, s1);
  mt_id g2 = norm(p, true, c1, st);
  mt_drop(t, c1);
  mt_id s2 = op1(p, "silu", MT_BW_SILU, n, g2);
  mt_drop(t, g2);
  mt_id c2 = conv(p, s2, n);
  mt_drop(t, s2);
  mt_id sc = x;
  if (cin != cout) sc = conv(p, x, n); /* conv_shortcut (1x1) */
  else mt_ref(t, x);
  mt_id o = mt_op(t, "add", MT_BW_ADD, n, mt_esz(t, c2), sc, c2, 0);
  mt_id d = op1(p, "div", MT_BW_DIVS, n, o); /* / output_scale_factor */
  mt_drop(t, o);
  mt_drop(t, c2);
  mt_drop(t, sc);
  return d;
}

/* F.linear on the (B, HW, C) transposed view of a feature map: not foldable into one mm
 * without a copy, so matmul's bmm against the expanded weight, then the bias added */
static mt_id linear3d(prog *p, mt_id x, int64_t n) {
  mt_tape *t = p->t;
  mt_id xc = ac(p, x);
  mt_id m = mt_op(t, "bmm", MT_BW_BMM, n, mt_esz(t, xc), xc, p->w, 0);
  mt_drop(t, xc);
  mt_id y = mt_op(t, "add", MT_BW_ADD, n, mt_esz(t, m), m, 0, 0);
  mt_drop(t, m);
  return y;
}

/* attention_probs = softmax(scores) as AttnProcessor's get_attention_scores runs it for the
 * VAE (upcast_softmax): scores.float(), softmax, `del attention_scores`, .to(q's dtype) */
static mt_id vae_probs(prog *p, mt_id s, int esz) {
  mt_tape *t = p->t;
  int64_t n = mt_numel(t, s);
  mt_id f = mt_cast(t, s, 4, false);
  mt_drop(t, s);
  mt_id pr = ng(p, "_softmax", n, 4);
  mt_drop(t, f);
  mt_id o = mt_cast(t, pr, esz, false);
  mt_drop(t, pr);
  return o;
}

/* SDPA under no_grad (is_causal for CLIP, no mask): the kernel PyTorch picks and its
 * logsumexp (fp32, a row per batch, head and query), which only the kernel keeps. The CPU's
 * flash kernel always returns one. CUDA (unverified on a GPU): flash attention for fp16/bf16
 * with a head dim of at most 256, else the memory-efficient kernel, which computes no
 * logsumexp when nothing requires grad (the VAE's one head of 512 channels at full scale). */
static mt_id sdpa_ng(prog *p, mt_id q, mt_id k, mt_id v, int64_t heads, int64_t hd, int64_t L) {
  const char *op = "_scaled_dot_product_flash_attention_for_cpu";
  int64_t lse = p->B * heads * L;
  if (p->cuda) {
    bool flash = p->aesz && hd <= 256;
    op = flash ? "_scaled_dot_product_flash_attention" : "_scaled_dot_product_efficient_attention";
    if (!flash) lse = 0;
  }
  return mt_sdpa(p->t, op, q, k, v, 0, lse);
}

/* The VAE's mid-block Attention (one head of all C channels, group_norm, residual
 * connection, rescale 1): group_norm, to_q / to_k / to_v, SDPA (AttnProcessor2_0) or
 * baddbmm + softmax + bmm (AttnProcessor: with one head, head_to_batch_dim is a view),
 * to_out.0, + residual, / 1. x keeps the caller's reference; query, key, value, the normed
 * input (encoder_hidden_states) and the probabilities are the processor's until it returns. */
static mt_id vae_attention(prog *p, mt_id x, int64_t C, int64_t S) {
  mt_tape *t = p->t;
  int64_t L = S * S, n = p->B * C * L;
  mt_id g = norm(p, true, x, p->B * p->c->vae.groups);
  mt_id q = linear3d(p, g, n), k = linear3d(p, g, n), v = linear3d(p, g, n), pr = 0, a;
  int e = mt_esz(t, q);
  if (p->c->model.attn == VL_ATTN_CLASSIC) {
    mt_id em = ng(p, "empty", p->B * L * L, e);
    mt_id s = mt_op(t, "baddbmm", MT_BW_BADDBMM, p->B * L * L, e, q, k, 0);
    mt_drop(t, em);
    pr = vae_probs(p, s, e);
    a = mt_op(t, "bmm", MT_BW_BMM, n, e, pr, v, 0);
  } else {
    a = sdpa_ng(p, q, k, v, 1, C, L);
  }
  mt_id ac_a = ac(p, a);
  mt_id y = mt_op(t, "addmm", MT_BW_MM, n, mt_esz(t, ac_a), ac_a, p->w, 0); /* to_out.0 */
  mt_drop(t, ac_a);
  mt_drop(t, a);
  mt_id r = mt_op(t, "add", MT_BW_ADD, n, mt_esz(t, y), y, x, 0);
  mt_drop(t, y);
  mt_id d = op1(p, "div", MT_BW_DIVS, n, r);
  mt_drop(t, r);
  mt_drop(t, q);
  mt_drop(t, k);
  mt_drop(t, v);
  mt_drop(t, g);
  mt_drop(t, pr);
  return d;
}

/* a block's input rebound to its output (the caller's reference handed over) */
static mt_id then(prog *p, mt_id x, mt_id y) {
  mt_drop(p->t, x);
  return y;
}

/* AutoencoderKL's Encoder + quant_conv: the moments (B, 2 latent_ch, h, w). The Encoder's
 * `sample` keeps each block's input until the block returns. */
static mt_id vae_moments(prog *p) {
  mt_tape *t = p->t;
  const vl_sd_vae_cfg *v = &p->c->vae;
  int64_t B = p->B, S = v->image, C = v->ch[0];
  mt_id x = conv(p, p->images, B * C * S * S); /* conv_in */
  for (int i = 0; i < v->n_levels; i++) {      /* DownEncoderBlock2D */
    mt_id h = x;
    mt_ref(t, h);
    for (int j = 0; j < v->layers_per_block; j++) {
      int64_t cin = j == 0 ? C : v->ch[i];
      h = then(p, h, vae_resnet(p, h, cin, v->ch[i], S));
    }
    C = v->ch[i];
    if (i < v->n_levels - 1) { /* Downsample2D (padding 0): F.pad (0, 1, 0, 1), 3x3 conv stride 2 */
      mt_id pd = ng(p, "constant_pad_nd", B * C * (S + 1) * (S + 1), mt_esz(t, h));
      S /= 2;
      mt_id y = conv(p, pd, B * C * S * S);
      mt_drop(t, pd);
      h = then(p, h, y);
    }
    x = then(p, x, h);
  }
  /* UNetMidBlock2D: resnets[0], then attention and resnets[1] */
  mt_id h = vae_resnet(p, x, C, C, S);
  if (v->mid_attn) h = then(p, h, vae_attention(p, h, C, S));
  h = then(p, h, vae_resnet(p, h, C, C, S));
  x = then(p, x, h);
  mt_id g = norm(p, true, x, B * v->groups); /* conv_norm_out, conv_act, conv_out */
  mt_drop(t, x);
  mt_id s = op1(p, "silu", MT_BW_SILU, mt_numel(t, g), g);
  mt_drop(t, g);
  int64_t m = B * 2 * v->latent_ch * S * S;
  mt_id h2 = conv(p, s, m);
  mt_drop(t, s);
  mt_id q = conv(p, h2, m); /* quant_conv: _encode's `enc` rebound */
  mt_drop(t, h2);
  return q;
}

/* exp under autocast: CUDA's lists it as an fp32 op (its input cast up), CPU's does not */
static mt_id ac_exp(prog *p, mt_id x) {
  mt_id xc = p->cuda && p->aesz ? mt_cast(p->t, x, 4, false) : (mt_ref(p->t, x), x);
  mt_id y = op1(p, "exp", MT_BW_ADD, mt_numel(p->t, xc), xc);
  mt_drop(p->t, xc);
  return y;
}

/* vae.encode(images).latent_dist.sample() * scaling_factor: DiagonalGaussianDistribution
 * chunks the moments (views), clamps the log-variance, keeps std = exp(0.5 logvar) and
 * var = exp(logvar); sample() draws randn in the moments' dtype, mean + std * sample; the
 * distribution (moments, logvar, std, var) goes once sample() has returned */
static mt_id vae_sample(prog *p) {
  mt_tape *t = p->t;
  mt_id mo = vae_moments(p);
  int e = mt_esz(t, mo);
  int64_t n = mt_numel(t, mo) / 2;
  mt_id lv = ng(p, "clamp", n, e);
  mt_id h = ng(p, "mul", n, e);
  mt_id sd = ac_exp(p, h);
  mt_drop(t, h);
  mt_id var = ac_exp(p, lv);
  mt_id r = ng(p, "randn", n, e);
  int es = mt_esz(t, sd) > e ? mt_esz(t, sd) : e; /* type promotion: fp32 std on CUDA */
  mt_id m = ng(p, "mul", n, es);
  mt_id x = ng(p, "add", n, es);
  mt_drop(t, m);
  mt_drop(t, mo);
  mt_drop(t, lv);
  mt_drop(t, sd);
  mt_drop(t, var);
  mt_drop(t, r);
  mt_id z = ng(p, "mul", n, es); /* * scaling_factor */
  mt_drop(t, x);
  return z;
}

/* transformers' eager causal mask (create_causal_mask for attn_implementation "eager"): the
 * index aranges, kv_idx <= q_idx, then where(mask, 0, min) expanded to (B, 1, L, L) in the
 * model's dtype; SDPA needs none (is_causal) */
static mt_id clip_mask(prog *p, int64_t L, int e) {
  mt_tape *t = p->t;
  mt_id ba = ng(p, "arange", p->B, 8), ha = ng(p, "arange", 1, 8);
  mt_id a1 = ng(p, "arange", L, 8), k1 = ng(p, "add", L, 8);
  mt_drop(t, a1);
  mt_id a2 = ng(p, "arange", L, 8), k2 = ng(p, "add", L, 8);
  mt_drop(t, a2);
  mt_id le = ng(p, "le", L * L, 1);
  mt_drop(t, ba);
  mt_drop(t, ha);
  mt_drop(t, k1);
  mt_drop(t, k2);
  mt_id z = ng(p, "zeros", 1, e), mn = ng(p, "scalar_tensor", 1, e);
  mt_id w = ng(p, "where", p->B * L * L, e);
  mt_drop(t, z);
  mt_drop(t, mn);
  mt_drop(t, le);
  return w;
}

/* a (B, L, H, d) tensor viewed as (B, H, L, d) reshaped for matmul's bmm: a copy */
static mt_id heads_clone(prog *p, mt_id x) { return op1(p, "clone", MT_BW_ADD, mt_numel(p->t, x), x); }

/* eager_attention_forward: matmul(q, k^T) * scaling (+ mask), softmax(dtype=float32) then
 * .to(q's dtype) (on the CPU an fp16 input is cast up first; CUDA's kernel takes it as it
 * is), matmul with v, transpose(1, 2).contiguous(). *probs: the attention weights, which the
 * encoder layer's `_` keeps until it returns. */
static mt_id clip_eager(prog *p, mt_id q, mt_id k, mt_id v, mt_id mask, int64_t L, mt_id *probs) {
  mt_tape *t = p->t;
  int64_t n = p->B * p->c->text.n_heads * L * L;
  int e = mt_esz(t, q);
  mt_id qc = heads_clone(p, q), kc = heads_clone(p, k);
  mt_id s = mt_op(t, "bmm", MT_BW_BMM, n, e, qc, kc, 0);
  mt_drop(t, qc);
  mt_drop(t, kc);
  mt_id sc = ng(p, "mul", n, e);
  mt_drop(t, s);
  mt_id w = mt_op(t, "add", MT_BW_ADD, n, e, sc, mask, 0);
  mt_drop(t, sc);
  mt_id in = !p->cuda && e != 4 ? mt_cast(t, w, 4, false) : (mt_ref(t, w), w);
  mt_id sm = ng(p, "_softmax", n, 4);
  mt_drop(t, in);
  mt_id pr = mt_cast(t, sm, e, false);
  mt_drop(t, sm);
  mt_drop(t, w);
  mt_id vc = heads_clone(p, v);
  mt_id o = mt_op(t, "bmm", MT_BW_BMM, mt_numel(t, q), e, pr, vc, 0);
  mt_drop(t, vc);
  mt_id oc = heads_clone(p, o);
  mt_drop(t, o);
  *probs = pr;
  return oc;
}

/* a frozen nn.Linear on rows x in: addmm (autocast's cast of x first) */
static mt_id dense(prog *p, mt_id x, int64_t numel) {
  mt_id xc = ac(p, x);
  mt_id y = mt_op(p->t, "addmm", MT_BW_MM, numel, mt_esz(p->t, xc), xc, p->w, 0);
  mt_drop(p->t, xc);
  return y;
}

/* CLIPEncoderLayer: layer_norm1, self-attention, + residual, layer_norm2, the MLP (fc1,
 * quick_gelu: x * sigmoid(1.702 x), fc2), + residual; x keeps the caller's reference */
static mt_id clip_layer(prog *p, mt_id x, mt_id mask, int64_t L) {
  mt_tape *t = p->t;
  const vl_sd_clip_cfg *c = &p->c->text;
  int64_t rows = p->B * L, n = rows * c->dim, f = rows * c->ffn;
  mt_id n1 = norm(p, false, x, rows);
  mt_id q = dense(p, n1, n), k = dense(p, n1, n), v = dense(p, n1, n), pr = 0, a;
  if (p->c->model.attn == VL_ATTN_CLASSIC) {
    a = clip_eager(p, q, k, v, mask, L, &pr);
  } else {
    a = sdpa_ng(p, q, k, v, c->n_heads, c->dim / c->n_heads, L);
  }
  mt_id y = dense(p, a, n); /* out_proj; attn_output rebound */
  mt_drop(t, a);
  mt_drop(t, q); /* CLIPAttention's locals at its return */
  mt_drop(t, k);
  mt_drop(t, v);
  mt_drop(t, n1);
  mt_id r = mt_op(t, "add", MT_BW_ADD, n, mt_esz(t, y), x, y, 0);
  mt_drop(t, y);
  mt_id n2 = norm(p, false, r, rows);
  mt_id f1 = dense(p, n2, f);
  mt_id m = op1(p, "mul", MT_BW_MULS, f, f1);
  mt_id sg = op1(p, "sigmoid", MT_BW_ADD, f, m);
  mt_drop(t, m);
  mt_id g = mt_op(t, "mul", MT_BW_MUL, f, mt_esz(t, f1), f1, sg, 0);
  mt_drop(t, sg);
  mt_drop(t, f1);
  mt_id f2 = dense(p, g, n);
  mt_drop(t, g);
  mt_drop(t, n2);
  mt_id o = mt_op(t, "add", MT_BW_ADD, n, mt_esz(t, f2), r, f2, 0);
  mt_drop(t, f2);
  mt_drop(t, r); /* the layer's residual and `_` at its return */
  mt_drop(t, pr);
  return o;
}

/* clip(tokens).last_hidden_state: token + position embeddings, the causal mask (eager only),
 * the encoder layers, final_layer_norm, then the pooled output's legacy argmax gather (eos
 * token id 2), which goes with the model's output object */
static mt_id clip_hidden(prog *p) {
  mt_tape *t = p->t;
  const vl_sd_clip_cfg *c = &p->c->text;
  int64_t L = p->c->model.ctx_len, rows = p->B * L;
  int e = p->wesz;
  mt_id te = ng(p, "embedding", rows * c->dim, e), pe = ng(p, "embedding", L * c->dim, e);
  mt_id h0 = ng(p, "add", rows * c->dim, e);
  mt_drop(t, te);
  mt_drop(t, pe);
  mt_id mask = p->c->model.attn == VL_ATTN_CLASSIC ? clip_mask(p, L, e) : 0;
  mt_id h = h0; /* CLIPTextTransformer's hidden_states keeps the embeddings to its return */
  mt_ref(t, h);
  for (int64_t l = 0; l < c->n_layers; l++) h = then(p, h, clip_layer(p, h, mask, L));
  mt_id fl = norm(p, false, h, rows);
  mt_id ar = ng(p, "arange", p->B, 8), ids = ng(p, "_to_copy", rows, 4), am = ng(p, "argmax", p->B, 8);
  mt_drop(t, ids);
  mt_id pooled = ng(p, "index", p->B * c->dim, mt_esz(t, fl));
  mt_drop(t, ar);
  mt_drop(t, am);
  mt_drop(t, mask);
  mt_drop(t, h0);
  mt_drop(t, h);
  mt_drop(t, pooled);
  return fl;
}

/* DDPMScheduler.add_noise: alphas_cumprod cast to the latents' dtype (a copy of its 1000
 * steps when they are not fp32: the VAE's fp16/bf16 sample), alphas_cumprod[t] ** 0.5 and
 * (1 - alphas_cumprod[t]) ** 0.5, then sqrt_a * latents + sqrt_1m * noise (fp32 noise: the
 * second product and the sum in fp32) */
static mt_id add_noise(prog *p, mt_id lat) {
  mt_tape *t = p->t;
  int64_t B = p->B, n = mt_numel(t, lat);
  int e = mt_esz(t, lat);
  mt_id cp = e != 4 ? mt_temp(t, "_to_copy", 1000, e) : 0; /* num_train_timesteps */
  mt_id i1 = mt_temp(t, "index", B, e), sa = mt_temp(t, "pow", B, e);
  mt_drop(t, i1);
  mt_id i2 = mt_temp(t, "index", B, e), rs = mt_temp(t, "rsub", B, e);
  mt_drop(t, i2);
  mt_id sb = mt_temp(t, "pow", B, e);
  mt_drop(t, rs);
  mt_id m1 = mt_temp(t, "mul", n, e), m2 = mt_temp(t, "mul", n, 4), y = mt_temp(t, "add", n, 4);
  mt_drop(t, m1);
  mt_drop(t, m2);
  mt_drop(t, cp);
  mt_drop(t, sa);
  mt_drop(t, sb);
  return y;
}

/* get_timestep_embedding (flip_sin_to_cos, shift 0) and TimestepEmbedding: no gradient */
static mt_id time_embedding(prog *p, mt_id *t_emb) {
  mt_tape *t = p->t;
  int64_t B = p->B, h = p->c->model.ch[0] / 2;
  mt_id ar = mt_temp(t, "arange", h, 4), e = mt_temp(t, "mul", h, 4);
  mt_drop(t, ar);
  mt_id dv = mt_temp(t, "div", h, 4);
  mt_drop(t, e);
  mt_id ex = mt_temp(t, "exp", h, 4), tf = mt_temp(t, "_to_copy", B, 4), em = mt_temp(t, "mul", B * h, 4);
  mt_drop(t, tf);
  mt_drop(t, ex);
  mt_id sc = mt_temp(t, "mul", B * h, 4);
  mt_drop(t, em);
  mt_id s = mt_temp(t, "sin", B * h, 4), c = mt_temp(t, "cos", B * h, 4), ct = mt_temp(t, "cat", 2 * B * h, 4);
  mt_drop(t, s);
  mt_drop(t, c);
  mt_drop(t, sc);
  mt_id fl = mt_temp(t, "cat", 2 * B * h, 4);
  mt_drop(t, ct);
  mt_drop(t, dv);
  *t_emb = fl;
  mt_id tc = p->aesz ? mt_temp(t, "_to_copy", 2 * B * h, p->aesz) : 0; /* autocast's cast for linear_1 */
  mt_id l1 = mt_temp(t, "addmm", B * p->TE, p->wesz);
  mt_drop(t, tc);
  mt_id si = mt_temp(t, "silu", B * p->TE, p->wesz);
  mt_drop(t, l1);
  mt_id l2 = mt_temp(t, "addmm", B * p->TE, p->wesz);
  mt_drop(t, si);
  return l2;
}

static mt_id cat2(prog *p, mt_id a, mt_id b) {
  return mt_op(p->t, "cat", MT_BW_CAT, mt_numel(p->t, a) + mt_numel(p->t, b), mt_esz(p->t, a), a, b, 0);
}

static mt_id unet(prog *p, const blocks *bl, mt_id noisy) {
  mt_tape *t = p->t;
  const vl_sd_unet_cfg *m = &p->c->model;
  int nb = m->n_blocks;
  int64_t B = p->B, S = m->sample;
  mt_id t_emb;
  p->temb = time_embedding(p, &t_emb);
  if (m->checkpoint) {
    p->temb_held = p->temb;
    mt_ref(t, p->temb);
  }
  mt_id x = conv(p, noisy, B * m->ch[0] * S * S);
  mt_id res[64];
  int nres = 0;
  res[nres++] = x;
  mt_ref(t, x);
  int k = 0;
  int64_t prev = m->ch[0];
  for (int i = 0; i < nb; i++) {
    int64_t C = m->ch[i];
    mt_id in = x; /* the caller's `sample` keeps each block's input until the block returns */
    mt_ref(t, in);
    for (int j = 0; j < m->layers; j++) {
      mt_id y = resnet_ck(p, x, j == 0 ? prev : C, C, S);
      mt_drop(t, x);
      x = y;
      if (m->down_attn[i]) {
        y = transformer(p, x, C, S, &bl->tb[k++]);
        mt_drop(t, x);
        x = y;
      }
      res[nres++] = x;
      mt_ref(t, x);
    }
    if (i < nb - 1) { /* Downsample2D: a stride-2 conv */
      S /= 2;
      mt_id y = conv(p, x, B * C * S * S);
      mt_drop(t, x);
      x = y;
      res[nres++] = x;
      mt_ref(t, x);
    }
    mt_drop(t, in);
    prev = C;
  }
  int kup = k;
  k = bl->ntb - 1; /* the mid block's transformer */
  int64_t Cm = m->ch[nb - 1];
  mt_id in = x;
  mt_id y = resnet(p, x, Cm, Cm, S); /* UNetMidBlock2DCrossAttn runs resnets[0] outside any checkpoint */
  x = transformer(p, y, Cm, S, &bl->tb[k]);
  mt_drop(t, y);
  y = resnet_ck(p, x, Cm, Cm, S);
  mt_drop(t, x);
  mt_drop(t, in);
  x = y;
  k = kup;
  prev = Cm;
  mt_id held[64]; /* res_samples: the current up block's skips, until the next one's */
  int nheld = 0;
  for (int i = 0; i < nb; i++) {
    int64_t out = m->ch[nb - 1 - i];
    int n = m->layers + 1;
    for (int h = 0; h < nheld; h++) mt_drop(t, held[h]);
    nheld = 0;
    for (int h = 0; h < n; h++) held[nheld++] = res[nres - n + h];
    nres -= n;
    mt_id in = x;
    mt_ref(t, in);
    for (int j = 0; j <= m->layers; j++) {
      mt_id skip = held[n - 1 - j];
      int64_t rin = j == 0 ? prev : out, sk = mt_numel(t, skip) / (B * S * S);
      mt_id c = cat2(p, x, skip);
      mt_drop(t, x);
      x = resnet_ck(p, c, rin + sk, out, S);
      mt_drop(t, c);
      if (m->up_attn[i]) {
        y = transformer(p, x, out, S, &bl->tb[k++]);
        mt_drop(t, x);
        x = y;
      }
    }
    if (i < nb - 1) { /* Upsample2D: nearest x2, conv */
      S *= 2;
      mt_id u = op1(p, "upsample_nearest2d", MT_BW_NEAREST, B * out * S * S, x);
      mt_drop(t, x);
      x = conv(p, u, B * out * S * S);
      mt_drop(t, u);
    }
    mt_drop(t, in);
    prev = out;
  }
  mt_id g = norm(p, true, x, B * p->G);
  mt_drop(t, x);
  mt_id s = op1(p, "silu", MT_BW_SILU, mt_numel(t, g), g);
  mt_drop(t, g);
  mt_id pred = conv(p, s, B * m->out_ch * S * S);
  mt_drop(t, s);
  /* forward returns: its locals go */
  mt_drop(t, t_emb);
  mt_drop(t, p->temb);
  for (int h = 0; h < nheld; h++) mt_drop(t, held[h]);
  return pred;
}

static mt_id forward(prog *p, const blocks *bl) {
  mt_tape *t = p->t;
  bool enc = p->c->encoders_in_step;
  mt_id lat = p->latents;
  if (enc) { /* under no_grad: lat, then ctx (the U-Net's context for this micro-batch) */
    lat = vae_sample(p);
    p->context = clip_hidden(p);
  }
  mt_id noisy = add_noise(p, lat);
  mt_id pred = unet(p, bl, noisy);
  mt_id pf = mt_cast(t, pred, 4, false); /* pred.float() */
  mt_drop(t, pred);
  /* F.mse_loss(reduction="mean"): on real tensors the 0-dim loss lives in the unreduced
   * (squared difference) buffer, which it keeps until it is divided (`unred`: its bytes; the
   * loss's 4 counted beside them); on fake ones a 4-byte storage (vl_mimic_sd_unet_cfg.traced) */
  mt_id unred = p->c->traced ? 0 : mt_temp(t, "mse_loss", mt_numel(t, pf), 4);
  mt_id loss = mt_op(t, "mse_loss", MT_BW_MSE, 1, 4, pf, p->noise, 0);
  mt_drop(t, pf);
  mt_drop(t, noisy);
  if (enc) { /* micro()'s lat and ctx at its return (ctx lives on where the LoRA mm saved it) */
    mt_drop(t, lat);
    if (p->c->model.checkpoint) p->ctx_held = p->context; /* the frames' reference instead */
    else mt_drop(t, p->context);
  }
  mt_id l2 = mt_op(t, "div", MT_BW_DIVS, 1, 4, loss, 0, 0); /* / accum */
  mt_drop(t, loss);
  mt_drop(t, unred);
  return l2;
}

static void one_step(prog *p, const blocks *bl) {
  mt_tape *t = p->t;
  for (int64_t a = 0; a < mt_micro_batches(p->c->accum); a++) {
    mt_phase(t, 'f');
    int mark = mt_graph_mark(t);
    mt_id loss = forward(p, bl);
    mt_release_graph(t, mark);
    if (p->aesz) mt_autocast_exit(t);
    if (p->c->model.acts == VL_F16) { /* GradScaler.scale(loss) */
      mt_id sc = mt_op(t, "mul", MT_BW_MULS, 1, 4, loss, 0, 0);
      mt_drop(t, loss);
      loss = sc;
    }
    mt_phase(t, 'b');
    mt_backward(t, loss);
    mt_drop(t, loss);
    mt_drop(t, p->temb_held);
    p->temb_held = 0;
    mt_drop(t, p->ctx_held);
    p->ctx_held = 0;
    mt_phase(t, 'o');
  }
  mt_step_tail(t, &p->opt, p->c->clip > 0);
}

/* the VAE's latents and CLIP's output are what the U-Net takes */
static bool encoders_fit(const vl_mimic_sd_unet_cfg *c) {
  const vl_sd_vae_cfg *v = &c->vae;
  const vl_sd_clip_cfg *x = &c->text;
  if (v->n_levels < 1 || v->n_levels > VL_SD_VAE_MAX_LEVELS || v->layers_per_block < 1 || v->groups < 1 ||
      v->latent_ch < 1 || v->in_ch < 1 || x->n_heads < 1 || x->n_layers < 0)
    return false;
  int64_t f = (int64_t)1 << (v->n_levels - 1);
  return v->image % f == 0 && v->image / f == c->model.sample && v->latent_ch == c->model.in_ch &&
         x->dim == c->model.ctx_dim && x->dim % x->n_heads == 0 && c->model.ctx_len <= x->n_pos;
}

vl_status vl_mimic_sd_unet(const vl_mimic_sd_unet_cfg *c, vl_mimic_result *out, vl_mimic_sink sink, void *user,
                           char *why, size_t whyn) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  memset(out, 0, sizeof *out);
  const vl_sd_unet_cfg *m = &c->model;
  if (c->optim != VL_OPT_ADAMW) {
    snprintf(why, whyn, "not mimicked: an optimizer other than AdamW for sd-lora");
    return VL_ERR_UNSUPPORTED;
  }
  if (m->acts != m->weights || (m->acts != VL_F32 && m->acts != VL_F16 && m->acts != VL_BF16)) {
    snprintf(why, whyn, "not mimicked: a %s base under %s compute (the peer refuses it too)", vl_dtype_name(m->weights),
             vl_dtype_name(m->acts));
    return VL_ERR_UNSUPPORTED;
  }
  if (c->batch < 1 || c->accum < 1 || c->steps < 1 || m->n_blocks < 1 || m->n_blocks > 8 || m->layers < 1 ||
      m->lora_rank < 1 || m->heads < 1 || m->groups < 1 || m->sample % (1 << (m->n_blocks - 1)) ||
      1 + m->n_blocks * (m->layers + 1) > 64) {
    snprintf(why, whyn, "batch, accum, steps, layers, heads, groups and the LoRA rank must be >= 1, the sample "
                        "a multiple of 2^(blocks-1), at most 63 skip connections");
    return VL_ERR_INVALID;
  }
  if (c->encoders_in_step && !encoders_fit(c)) {
    snprintf(why, whyn, "the encoders in the step: the VAE's levels, resnets, groups and latent channels must be "
                        ">= 1, its latent side the U-Net's sample, CLIP's width the context's, its heads dividing "
                        "it, the context no longer than its positions");
    return VL_ERR_INVALID;
  }
  int ntb = 0;
  for (int i = 0; i < m->n_blocks; i++) ntb += (m->down_attn[i] ? m->layers : 0) + (m->up_attn[i] ? m->layers + 1 : 0);
  ntb += 1;
  prog p = {.c = c, .B = c->batch, .TE = 4 * m->ch[0], .G = m->groups, .H = m->heads,
            .wesz = m->weights == VL_F32 ? 4 : 2, .aesz = m->acts == VL_F32 ? 0 : 2,
            .cuda = c->device == VL_MIMIC_CUDA};
  blocks bl = {.tb = calloc((size_t)ntb, sizeof(tblock))};
  p.t = mt_new(sink, user);
  p.opt = (mt_optim){.train = calloc((size_t)ntb * 16, sizeof(mt_id)), .state = calloc((size_t)ntb * 32, sizeof(mt_id)),
                     .opt = c->optim, .cuda = p.cuda};
  vl_status st = VL_OK;
  if (!p.t || !bl.tb || !p.opt.train || !p.opt.state) {
    snprintf(why, whyn, "out of host memory");
    st = VL_ERR_OOM;
    goto done;
  }
  if (p.cuda) mt_blas_workspace(p.t, vl_mimic_cublas_workspace(c->cuda_cc_major ? c->cuda_cc_major : 8));
  build(&p, &bl);
  int64_t base = mt_live(p.t);
  for (int s = 0; s < c->steps; s++) {
    mt_step(p.t, s);
    one_step(&p, &bl);
  }
  mt_result(p.t, out);
  out->base_bytes = base;
  if (p.cuda) st = mt_replay_cuda(p.t, c->capacity, out, why, whyn);
done:
  mt_free(p.t);
  free(bl.tb);
  for (int i = 0; i < p.nck; i++) free(p.cks[i]);
  free(p.cks);
  free(p.opt.train);
  free(p.opt.state);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return st;
}
