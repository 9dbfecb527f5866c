/* The mimic of Hugging Face's causal-LM training step (vramlab/mimic.h: vl_mimic_llm): the
 * code path of transformers 5 MistralForCausalLM / Qwen2ForCausalLM with SDPA, PEFT LoRA,
 * torch.autocast + GradScaler, clip_grad_norm_, AdamW / SGD and zero_grad(set_to_none=True),
 * written op by op as those Python files run it (the function names say which), over the
 * storage-level autograd model of tape.c. What each line allocates was read off
 * tools/peers/torch_trace.py's traces of that code on fake tensors (tests/fixtures/trace/). */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tape.h"

typedef struct {
  mt_id w, bias, a, b; /* base weight (an NF4 one: packed, n/2 bytes), its bias; LoRA A (r x in)
                          and B (out x r) */
  int64_t in, out;
} lin;

typedef struct {
  lin q, k, v, o, gate, up, down;
  mt_id in_norm, post_norm;
} layer;

typedef struct prog prog;
typedef struct {
  prog *p;
  const layer *y;
  mt_id cos, sin, mask;
} layer_call; /* a checkpointed layer's arguments, for its recomputation */

struct prog {
  const vl_mimic_llm_cfg *c;
  mt_tape *t;
  int64_t B, T, D, H, KV, hd, F, V, r;
  int pesz, aesz; /* the stored parameters' dtype size, the autocast dtype's (0: no autocast) */
  float lora_scale;
  bool lora, cuda, nf4; /* nf4: the layers' linears are bitsandbytes' Linear4bit */
  mt_id embed, norm, head, inv_freq, batch;
  layer *L;
  mt_optim opt; /* the trainable parameters in model.parameters() order, their state */
  int64_t end_fwd;
  layer_call *calls;
};

static int esz_of(vl_dtype d) { return d == VL_F32 ? 4 : 2; }

/* a parameter of numel elements whose last dimension is cols (0: one-dimensional) */
static mt_id param(prog *p, int64_t numel, int64_t cols, bool trainable) {
  int esz = trainable && p->lora ? 4 : p->pesz;
  mt_id x = mt_leaf(p->t, "param", numel, esz, VL_MC_PARAM, trainable);
  if (trainable) {
    p->opt.cols[p->opt.ntrain] = cols;
    p->opt.train[p->opt.ntrain++] = x;
  }
  return x;
}

static bool targeted(const prog *p, const char *name) {
  if (!p->lora) return false;
  if (p->c->model.tc.lora_targets == VL_LORA_ALL) return true;
  return name[0] == 'q' || name[0] == 'k' || name[0] == 'v' || name[0] == 'o';
}

/* bitsandbytes' Params4bit (NF4, double quantisation, blocks of 64) of n elements: the packed
 * weight (uint8, two per byte), then its QuantState: absmax quantised to uint8 (one a block),
 * the NF4 code (16 fp32), the absmax's offset (fp32), and state2: the absmax's own absmax (fp32,
 * one per 256 blocks) and its dynamic code (256 fp32) */
static mt_id nf4_param(prog *p, int64_t n) {
  mt_id w = mt_leaf(p->t, "param", n / 2, 1, VL_MC_PARAM, false);
  int64_t nb = n / 64;
  const int64_t qs[5][2] = {{nb, 1}, {16, 4}, {1, 4}, {(nb + 255) / 256, 4}, {256, 4}};
  for (int i = 0; i < 5; i++) (void)mt_leaf(p->t, "param", qs[i][0], (int)qs[i][1], VL_MC_PARAM, false);
  return w;
}

static lin linear_params(prog *p, const char *name, int64_t in, int64_t out, bool bias) {
  lin l = {.in = in, .out = out};
  bool full = !p->lora;
  l.w = p->nf4 ? nf4_param(p, in * out) : param(p, in * out, in, full);
  if (bias) l.bias = param(p, out, 0, full);
  if (targeted(p, name)) {
    l.a = param(p, p->r * in, in, true);
    l.b = param(p, out * p->r, p->r, true);
  }
  return l;
}

static void build(prog *p) {
  const vl_mistral_cfg *m = &p->c->model.mc;
  bool qb = m->qkv_bias != 0;
  p->embed = param(p, p->V * p->D, p->D, !p->lora);
  for (int64_t i = 0; i < m->n_layers; i++) {
    layer *y = &p->L[i];
    y->q = linear_params(p, "q", p->D, p->H * p->hd, qb);
    y->k = linear_params(p, "k", p->D, p->KV * p->hd, qb);
    y->v = linear_params(p, "v", p->D, p->KV * p->hd, qb);
    y->o = linear_params(p, "o", p->H * p->hd, p->D, false);
    y->gate = linear_params(p, "gate", p->D, p->F, false);
    y->up = linear_params(p, "up", p->D, p->F, false);
    y->down = linear_params(p, "down", p->F, p->D, false);
    y->in_norm = param(p, p->D, 0, !p->lora);
    y->post_norm = param(p, p->D, 0, !p->lora);
  }
  p->norm = param(p, p->D, 0, !p->lora);
  p->head = m->tie_embed ? p->embed : param(p, p->V * p->D, p->D, !p->lora);
  /* inv_freq and original_inv_freq */
  p->inv_freq = mt_leaf(p->t, "buffer", p->hd, p->pesz, VL_MC_BUFFER, false);
  p->batch = mt_leaf(p->t, "input_ids", p->B * p->T, 8, VL_MC_OTH, false);
}

/* ---- forward ------------------------------------------------------------------------------ */

/* a binary op with PyTorch's type promotion (fp32 wins) */
static mt_id bin(prog *p, const char *op, mt_bw bw, mt_id a, mt_id b) {
  int64_t n = mt_numel(p->t, a) > mt_numel(p->t, b) ? mt_numel(p->t, a) : mt_numel(p->t, b);
  int e = mt_esz(p->t, a) > mt_esz(p->t, b) ? mt_esz(p->t, a) : mt_esz(p->t, b);
  return mt_op(p->t, op, bw, n, e, a, b, 0);
}

static void drop2(prog *p, mt_id a, mt_id b) {
  mt_drop(p->t, a);
  mt_drop(p->t, b);
}

/* F.linear under autocast: x and the weight cast to the autocast dtype (a weight that requires
 * grad through the cache), then mm / addmm. Returns a new tensor; x keeps its reference. */
static mt_id f_linear(prog *p, mt_id x, mt_id w, mt_id bias, int64_t rows, int64_t out) {
  mt_tape *t = p->t;
  bool ac = p->aesz != 0;
  mt_id wc = ac ? mt_cast(t, w, p->aesz, true) : (mt_ref(t, w), w); /* the weight's cast first (traced) */
  mt_id xc = ac ? mt_cast(t, x, p->aesz, true) : (mt_ref(t, x), x);
  mt_id bc = bias ? (ac ? mt_cast(t, bias, p->aesz, true) : (mt_ref(t, bias), bias)) : 0;
  mt_id y = mt_op(t, bias ? "addmm" : "mm", MT_BW_MM, rows * out, mt_esz(t, xc), xc, wc, bc);
  mt_drop(t, xc);
  mt_drop(t, wc);
  mt_drop(t, bc);
  return y;
}

/* bitsandbytes' Linear4bit.forward: x.to(compute_dtype) (the rung's: none), MatMul4Bit.apply,
 * whose gemm_4bit dequantises the weight for F.linear. On the CPU its default kernel: the
 * absmax dequantised (n/64 fp32) + offset, the first freed; the weight (n in x's dtype); linear;
 * both freed. On CUDA the same unfused fallback (_dequant_linear_fallback: all three freed when
 * it returns); bitsandbytes' fused kernel, which it picks for some shapes at up to 1536 rows by
 * the card's arch, allocates only the output: there this plans up to one weight's transient
 * copy too much in the forward (the backward dequantises either way). Its choice
 * (_gemm_4bit_use_custom_cuda, 0.50): never past 1536 rows, nor past 512 for a weight of 4 Mi
 * elements or more (every 7B weight), so a 7B step at 1024 rows or more is planned exactly. */
static mt_id nf4_linear(prog *p, mt_id x, const lin *l, int64_t rows) {
  mt_tape *t = p->t;
  int64_t n = l->in * l->out, e = mt_esz(t, x);
  mt_id a = mt_temp(t, "empty_like", n / 64, 4), am = mt_temp(t, "add", n / 64, 4);
  if (!p->cuda) mt_drop(t, a);
  mt_id w = mt_temp(t, "empty", n, (int)e);
  mt_id y = mt_op(t, "linear", MT_BW_NF4, rows * l->out, (int)e, x, l->w, l->bias);
  if (p->cuda) mt_drop(t, a);
  drop2(p, am, w);
  return y;
}

/* peft.tuners.lora.layer.Linear.forward: result = base_layer(x); x cast to lora_A's dtype;
 * result = result + lora_B(lora_A(x)) * scaling. Over an NF4 base, peft.tuners.lora.bnb
 * .Linear4bit.forward: result = base_layer(x).clone(), and x is cast only when
 * torch.is_autocast_enabled() is false: that asks about CUDA's autocast alone, so on the CPU
 * (and in an fp32 step) x is cast, on CUDA under autocast it is not. */
static mt_id lora_linear(prog *p, mt_id x, const lin *l) {
  mt_tape *t = p->t;
  int64_t rows = p->B * p->T;
  mt_id y = p->nf4 ? nf4_linear(p, x, l, rows) : f_linear(p, x, l->w, l->bias, rows, l->out);
  if (!l->a) return y;
  if (p->nf4) {
    mt_id c = mt_op(t, "clone", MT_BW_ADD, rows * l->out, mt_esz(t, y), y, 0, 0);
    mt_drop(t, y);
    y = c;
  }
  bool convert = !p->nf4 || !(p->cuda && p->aesz);
  mt_id x32 = convert ? mt_cast(t, x, 4, false) : (mt_ref(t, x), x); /* _cast_input_dtype */
  mt_id ya = f_linear(p, x32, l->a, 0, rows, p->r);
  mt_drop(t, x32);
  mt_id yb = f_linear(p, ya, l->b, 0, rows, l->out);
  mt_drop(t, ya);
  mt_id ys = mt_op(t, "mul", MT_BW_MULS, rows * l->out, mt_esz(t, yb), yb, 0, 0);
  mt_drop(t, yb);
  mt_id sum = bin(p, "add", MT_BW_ADD, y, ys);
  drop2(p, y, ys);
  return sum;
}

/* MistralRMSNorm.forward: h.to(fp32); h * rsqrt(h.pow(2).mean(-1) + eps); weight * h.to(dtype) */
static mt_id rmsnorm(prog *p, mt_id h, mt_id w) {
  mt_tape *t = p->t;
  int in_esz = mt_esz(t, h);
  int64_t n = mt_numel(t, h), rows = n / p->D;
  mt_id h32 = mt_cast(t, h, 4, false);
  mt_id sq = mt_op(t, "pow", MT_BW_POW2, n, 4, h32, 0, 0);
  mt_id var = mt_op(t, "mean", MT_BW_MEAN, rows, 4, sq, 0, 0);
  mt_drop(t, sq);
  mt_id ve = mt_op(t, "add", MT_BW_ADD, rows, 4, var, 0, 0);
  mt_drop(t, var);
  mt_id rs = mt_op(t, "rsqrt", MT_BW_RSQRT, rows, 4, ve, 0, 0);
  mt_drop(t, ve);
  mt_id hn = bin(p, "mul", MT_BW_MUL, h32, rs);
  drop2(p, h32, rs);
  mt_id hc = mt_cast(t, hn, in_esz, false);
  mt_drop(t, hn);
  mt_id y = bin(p, "mul", MT_BW_MUL, w, hc);
  mt_drop(t, hc);
  return y;
}

/* apply_rotary_pos_emb for one of q, k: (x * cos) + (rotate_half(x) * sin); x is dropped */
static mt_id rope(prog *p, mt_id x, mt_id cos, mt_id sin) {
  mt_tape *t = p->t;
  int64_t n = mt_numel(t, x);
  mt_id xc = bin(p, "mul", MT_BW_MUL, x, cos);
  mt_id x1 = mt_slice(t, x, n / 2), x2 = mt_slice(t, x, n / 2);
  mt_id nx2 = mt_op(t, "neg", MT_BW_NEG, n / 2, mt_esz(t, x), x2, 0, 0);
  mt_drop(t, x2);
  mt_id rh = mt_op(t, "cat", MT_BW_CAT, n, mt_esz(t, x), nx2, x1, 0);
  drop2(p, nx2, x1);
  mt_id rs = bin(p, "mul", MT_BW_MUL, rh, sin);
  mt_drop(t, rh);
  mt_id y = bin(p, "add", MT_BW_ADD, xc, rs);
  drop2(p, xc, rs);
  mt_drop(t, x);
  return y;
}

/* SDPA's math kernel (_scaled_dot_product_attention_math, is_causal, enable_gqa), as the trace of
 * an fp32 step under sdpa_kernel(MATH) shows it: q scaled; the causal mask (ones, tril, then
 * where(mask, 0, -inf) in q's dtype); k and v repeated to every query head (repeat_interleave's
 * clones); k scaled; matmul's reshape copies q (its rope output is in (B, T, H, hd) order);
 * bmm; the mask added out of place; _safe_softmax; bmm with v; its locals (scaled q, repeated
 * k, the mask) freed at its return. The output, (B, H, T, hd) contiguous, is copied by
 * transformers' transpose(1, 2).contiguous(), so its gradient comes back transposed. */
static mt_id sdpa_math(prog *p, mt_id q, mt_id k, mt_id v) {
  mt_tape *t = p->t;
  int esz = mt_esz(t, q);
  int64_t n = p->B * p->H * p->T * p->hd, tt = p->T * p->T, s = p->B * p->H * tt;
  mt_id qs = mt_op(t, "mul", MT_BW_MULS, n, esz, q, 0, 0);
  mt_id ones = mt_temp(t, "ones", tt, 1), tril = mt_temp(t, "tril", tt, 1);
  mt_drop(t, ones);
  mt_id zero = mt_temp(t, "scalar_tensor", 1, esz), inf = mt_temp(t, "scalar_tensor", 1, esz);
  mt_id mask = mt_temp(t, "where", tt, esz);
  drop2(p, zero, inf);
  mt_drop(t, tril);
  mt_id ke = mt_op(t, "clone", MT_BW_EXPAND, n, esz, k, 0, 0), ve = mt_op(t, "clone", MT_BW_EXPAND, n, esz, v, 0, 0);
  mt_id ks = mt_op(t, "mul", MT_BW_MULS, n, esz, ke, 0, 0);
  mt_id qc = mt_op(t, "clone", MT_BW_ADD, n, esz, qs, 0, 0); /* CloneBackward: the gradient passes */
  mt_id sc = mt_op(t, "bmm", MT_BW_BMM, s, esz, qc, ks, 0);
  drop2(p, qc, ks);
  mt_id a = bin(p, "add", MT_BW_ADD, sc, mask);
  mt_drop(t, sc);
  mt_id pr = mt_op(t, "_safe_softmax", MT_BW_SOFTMAX, s, esz, a, 0, 0);
  mt_drop(t, a);
  mt_id o = mt_op(t, "bmm", MT_BW_BMM, n, esz, pr, ve, 0);
  drop2(p, pr, ve);
  drop2(p, qs, ke);
  mt_drop(t, mask);
  mt_noncontig_grad(t, o);
  mt_id oc = mt_op(t, "clone", MT_BW_ADD, n, esz, o, 0, 0);
  mt_drop(t, o);
  return oc;
}

/* MistralAttention.forward + sdpa_attention_forward; h keeps its reference */
static mt_id attention(prog *p, mt_id h, const layer *y, mt_id cos, mt_id sin, mt_id mask) {
  mt_tape *t = p->t;
  mt_id q = lora_linear(p, h, &y->q);
  mt_id k = lora_linear(p, h, &y->k);
  mt_id v = lora_linear(p, h, &y->v);
  int64_t rep = p->H / p->KV, n = p->B * p->T * p->H * p->hd;
  /* repeat_kv only with a mask: with none (and head_dim <= 256), transformers' use_gqa_in_sdpa
   * passes enable_gqa to SDPA, on the CPU as on CUDA, which takes k and v at their own heads */
  bool repeat = rep > 1 && mask;
  /* the math kernel: forced (the traces), or CUDA's choice for fp32 with grouped KV heads
   * (flash takes fp16/bf16 only; PyTorch 2.11's memory-efficient kernel no grouped heads) */
  bool math = !repeat && (p->c->sdpa_math || (p->cuda && rep > 1 && !p->aesz && mt_esz(t, q) == 4));
  /* .view(hidden_shape).transpose(1, 2): a gradient that comes back in (B, heads, T, hd) order
   * is copied before its projection's mm. q's and k's come from rope's backward; v's from SDPA's
   * backward, which gives it in v's own strides (no copy), unless the mask's path expanded v
   * (repeat_kv's sum gives it in head order) */
  mt_noncontig_grad(t, q);
  mt_noncontig_grad(t, k);
  if (mask || (math && rep > 1)) mt_noncontig_grad(t, v); /* repeated: its sum gives head order */
  q = rope(p, q, cos, sin);
  k = rope(p, k, cos, sin);
  if (repeat) {
    mt_id k2 = mt_op(t, "clone", MT_BW_EXPAND, n, mt_esz(t, k), k, 0, 0);
    mt_drop(t, k);
    mt_id v2 = mt_op(t, "clone", MT_BW_EXPAND, n, mt_esz(t, v), v, 0, 0);
    mt_drop(t, v);
    k = k2;
    v = v2;
  }
  if (p->aesz) { /* SDPA is an autocast op; its casts come in the order v, k, q (the real traces
                   show it: k's before q's where v needs none) */
    mt_id v2 = mt_cast(t, v, p->aesz, true), k2 = mt_cast(t, k, p->aesz, true), q2 = mt_cast(t, q, p->aesz, true);
    drop2(p, q, k);
    mt_drop(t, v);
    q = q2, k = k2, v = v2;
  }
  if (math) {
    mt_id o = sdpa_math(p, q, k, v);
    mt_id out = lora_linear(p, o, &y->o);
    mt_drop(t, o);
    drop2(p, q, k); /* the forward's locals, at its return: not saved by the math kernel's ops */
    mt_drop(t, v);
    return out;
  }
  mt_id fmask = 0;
  if (mask) /* SDPA's CPU path turns the boolean mask into an additive one of q's dtype */
    fmask = mt_temp(t, "where", p->B * p->T * p->T, mt_esz(t, q));
  mt_id o = mt_sdpa(t, p->cuda ? "_scaled_dot_product_flash_attention" : "_scaled_dot_product_flash_attention_for_cpu",
                    q, k, v, fmask, p->B * p->H * p->T);
  if (p->cuda && mt_esz(t, q) == 2) /* flash attention proper (fp32 runs another kernel: mimic.h) */
    mt_flash_bw_buffers(t, o, p->B, p->H, repeat ? p->H : p->KV, p->T, p->T, p->hd);
  drop2(p, q, k);
  drop2(p, v, fmask);
  mt_id out = lora_linear(p, o, &y->o);
  mt_drop(t, o);
  return out;
}

/* MistralMLP.forward: down(silu(gate(x)) * up(x)) */
static mt_id mlp(prog *p, mt_id x, const layer *y) {
  mt_tape *t = p->t;
  mt_id g = lora_linear(p, x, &y->gate);
  mt_id a = mt_op(t, "silu", MT_BW_SILU, mt_numel(t, g), mt_esz(t, g), g, 0, 0);
  mt_drop(t, g);
  mt_id u = lora_linear(p, x, &y->up);
  mt_id au = bin(p, "mul", MT_BW_MUL, a, u);
  drop2(p, a, u);
  mt_id d = lora_linear(p, au, &y->down);
  mt_drop(t, au);
  return d;
}

/* MistralDecoderLayer.forward; h is dropped */
static mt_id decoder_layer(prog *p, mt_id h, const layer *y, mt_id cos, mt_id sin, mt_id mask) {
  mt_tape *t = p->t;
  mt_id x = rmsnorm(p, h, y->in_norm);
  mt_id a = attention(p, x, y, cos, sin, mask);
  mt_drop(t, x);
  mt_id h2 = bin(p, "add", MT_BW_ADD, h, a);
  drop2(p, h, a);
  x = rmsnorm(p, h2, y->post_norm);
  mt_id m = mlp(p, x, y);
  mt_drop(t, x);
  mt_id h3 = bin(p, "add", MT_BW_ADD, h2, m);
  drop2(p, h2, m);
  return h3;
}

/* a decoder layer run again by the checkpoint's recomputation (x keeps the frame's reference) */
static mt_id layer_again(void *ctx, mt_id x) {
  layer_call *c = ctx;
  mt_ref(c->p->t, x);
  return decoder_layer(c->p, x, c->y, c->cos, c->sin, c->mask);
}

/* MistralForCausalLM.forward(input_ids, labels) / accum (and * GradScaler's scale) */
static mt_id forward(prog *p) {
  mt_tape *t = p->t;
  const vl_mistral_cfg *m = &p->c->model.mc;
  mt_id h = mt_op(t, "embedding", MT_BW_EMBED, p->B * p->T * p->D, mt_esz(t, p->embed), p->embed, p->batch, 0);
  /* PEFT with gradient checkpointing calls enable_input_require_grads: a forward hook makes
   * the (frozen) embedding's output require grad */
  if (p->lora && p->c->model.tc.checkpoint && !mt_requires_grad(t, h)) mt_input_requires_grad(t, h);
  mt_id mask = 0, pos = 0;
  if (p->c->traced) {
    mask = mt_temp(t, "bitwise_and", p->B * p->T * p->T, 1); /* create_causal_mask */
  } else {
    /* position_ids = arange(T) + 0, then create_causal_mask's find_packed_sequence_indices on
     * them expanded to (B, T): diff with a prepended first - 1 (sub, cat, sub), (diff != 1)
     * .cumsum(-1), (mask[:, -1] == 0).all() read back: one sequence per row, so no mask (SDPA
     * is_causal); position_ids live until the model's forward returns */
    const int64_t B = p->B, T = p->T;
    mt_id ar = mt_temp(t, "arange", T, 8);
    pos = mt_temp(t, "add", T, 8);
    mt_drop(t, ar);
    mt_id first = mt_temp(t, "sub", B, 8), cat = mt_temp(t, "cat", B * (T + 1), 8);
    mt_id diff = mt_temp(t, "sub", B * T, 8);
    mt_drop(t, cat);
    mt_id ne = mt_temp(t, "ne", B * T, 1), cum = mt_temp(t, "cumsum", B * T, 8);
    mt_drop(t, ne);
    mt_id eq = mt_temp(t, "eq", B, 1), all = mt_temp(t, "all", 1, 1);
    mt_drop(t, eq);
    mt_drop(t, all);
    mt_drop(t, first);
    drop2(p, diff, cum);
  }
  /* MistralRotaryEmbedding.forward (one row of positions, fp32): freqs = inv_freq @ positions,
   * emb = cat(freqs, freqs), cos = emb.cos() * scaling, sin likewise; then .to(x.dtype) */
  int64_t cs = p->T * p->hd;
  mt_id pf = mt_temp(t, "_to_copy", p->T, 4); /* position_ids[..., None].float() */
  mt_id freqs = mt_temp(t, "mul", cs / 2, 4);
  mt_drop(t, pf);
  mt_id emb = mt_temp(t, "cat", cs, 4);
  mt_id c0 = mt_temp(t, "cos", cs, 4), cos = mt_temp(t, "mul", cs, 4);
  mt_drop(t, c0);
  mt_id s0 = mt_temp(t, "sin", cs, 4), sin = mt_temp(t, "mul", cs, 4);
  mt_drop(t, s0);
  drop2(p, freqs, emb);
  int xe = mt_esz(t, h);
  if (xe != 4) {
    mt_id c2 = mt_cast(t, cos, xe, false), s2 = mt_cast(t, sin, xe, false);
    drop2(p, cos, sin);
    cos = c2, sin = s2;
  }
  for (int64_t i = 0; i < m->n_layers; i++) {
    if (!p->c->model.tc.checkpoint) {
      h = decoder_layer(p, h, &p->L[i], cos, sin, mask);
      continue;
    }
    /* gradient_checkpointing_enable(use_reentrant=False): torch.utils.checkpoint around each
     * decoder layer, its arguments kept by the frame */
    layer_call *lc = &p->calls[i];
    *lc = (layer_call){p, &p->L[i], cos, sin, mask};
    mt_ckpt_begin(t, h);
    h = decoder_layer(p, h, &p->L[i], cos, sin, mask);
    mt_ckpt_end(t, layer_again, lc);
  }
  drop2(p, cos, sin);
  mt_drop(t, mask);
  mt_id x = rmsnorm(p, h, p->norm);
  mt_drop(t, h);
  mt_drop(t, pos); /* MistralModel.forward returns */
  int64_t bt = p->B * p->T;
  mt_id logits = f_linear(p, x, p->head, 0, bt, p->V);
  mt_drop(t, x);
  /* ForCausalLMLoss: logits.float(), labels padded and shifted, cross_entropy (mean) */
  mt_id lf = mt_cast(t, logits, 4, false);
  mt_id pad = mt_temp(t, "constant_pad_nd", p->B * (p->T + 1), 8);
  mt_id shift = mt_temp(t, "clone", bt, 8);
  mt_drop(t, pad);
  mt_id ls = mt_op(t, "_log_softmax", MT_BW_LOGSOFTMAX, bt * p->V, 4, lf, 0, 0);
  mt_drop(t, lf);
  mt_id loss = mt_op(t, "nll_loss_forward", MT_BW_NLL, 1, 4, ls, shift, 0);
  mt_id tw = mt_temp(t, "nll_loss_forward", 1, 4); /* total_weight */
  drop2(p, tw, shift);
  mt_drop(t, ls);
  mt_drop(t, logits); /* the output's logits, dropped with the output once .loss is read */
  mt_id l2 = mt_op(t, "div", MT_BW_MULS, 1, 4, loss, 0, 0); /* / accum */
  mt_drop(t, loss);
  return l2;
}

static void one_step(prog *p) {
  mt_tape *t = p->t;
  int64_t accum = mt_micro_batches(p->c->accum);
  for (int64_t a = 0; a < accum; a++) {
    mt_phase(t, 'f');
    int mark = mt_graph_mark(t);
    mt_id loss = forward(p);
    mt_release_graph(t, mark); /* the previous micro-batch's loss, rebound */
    if (p->aesz) mt_autocast_exit(t);
    p->end_fwd = mt_live(t);
    mt_id root = loss;
    if (p->c->model.tc.compute == VL_F16) { /* GradScaler.scale(loss) */
      root = mt_op(t, "mul", MT_BW_MULS, 1, 4, loss, 0, 0);
      mt_drop(t, loss);
    }
    mt_phase(t, 'b');
    mt_backward(t, root);
    mt_drop(t, root);
    mt_phase(t, 'o'); /* until the next forward (as tools/peers/torch_trace.py phases it) */
  }
  mt_step_tail(t, &p->opt, p->c->model.tc.clip > 0);
}

/* ---- entry ---------------------------------------------------------------------------------- */

vl_status vl_mimic_llm(const vl_mimic_llm_cfg *c, vl_mimic_result *out, vl_mimic_sink sink, void *user, char *why,
                       size_t whyn) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  memset(out, 0, sizeof *out);
  const vl_mistral_cfg *m = &c->model.mc;
  const vl_train_cfg *tc = &c->model.tc;
  if (tc->frozen == VL_NF4 && (tc->lora_rank < 1 || (m->dim * m->ffn) % 64 || (m->dim * m->head_dim) % 64)) {
    snprintf(why, whyn, "an NF4 base needs LoRA and weight sizes divisible by 64");
    return VL_ERR_INVALID;
  }
  if (c->batch < 1 || c->seq < 1 || c->accum < 1 || c->steps < 1 || m->n_layers < 1 || m->n_kv_heads < 1) {
    snprintf(why, whyn, "batch, seq, accum, steps, layers and kv heads must be >= 1");
    return VL_ERR_INVALID;
  }
  prog p = {.c = c, .B = c->batch, .T = c->seq, .D = m->dim, .H = m->n_heads, .KV = m->n_kv_heads,
            .hd = m->head_dim, .F = m->ffn, .V = m->vocab, .r = tc->lora_rank, .lora = tc->lora_rank > 0,
            .cuda = c->device == VL_MIMIC_CUDA};
  p.aesz = tc->compute == VL_F32 ? 0 : 2;
  p.nf4 = tc->frozen == VL_NF4; /* the rest of the base in the compute dtype */
  p.pesz = !p.lora ? 4 : p.nf4 ? (p.aesz ? p.aesz : 4) : esz_of(tc->frozen);
  p.lora_scale = p.lora ? tc->lora_alpha / (float)tc->lora_rank : 1.f;
  int64_t max_train = 2 + m->n_layers * 24;
  p.t = mt_new(sink, user);
  p.L = calloc((size_t)m->n_layers, sizeof *p.L);
  p.calls = calloc((size_t)m->n_layers, sizeof *p.calls);
  p.opt = (mt_optim){.train = calloc((size_t)max_train, sizeof(mt_id)),
                     .state = calloc((size_t)max_train * MT_OPT_STATE, sizeof(mt_id)),
                     .cols = calloc((size_t)max_train, sizeof(int64_t)), .opt = tc->optim.opt,
                     .beta1 = tc->optim.adafactor_beta1, .cuda = p.cuda};
  vl_status st = VL_OK;
  if (!p.t || !p.L || !p.calls || !p.opt.train || !p.opt.state || !p.opt.cols) {
    snprintf(why, whyn, "out of host memory");
    st = VL_ERR_OOM;
    goto done;
  }
  if (p.cuda) mt_blas_workspace(p.t, vl_mimic_cublas_workspace(c->cuda_cc_major ? c->cuda_cc_major : 8));
  build(&p);
  mt_result(p.t, out);
  int64_t base = mt_live(p.t);
  for (int s = 0; s < c->steps; s++) {
    mt_step(p.t, s);
    one_step(&p);
  }
  mt_result(p.t, out);
  out->base_bytes = base;
  out->end_forward_bytes = p.end_fwd;
  if (p.cuda) st = mt_replay_cuda(p.t, c->capacity, out, why, whyn);
done:
  mt_free(p.t);
  free(p.L);
  free(p.calls);
  free(p.opt.train);
  free(p.opt.state);
  free(p.opt.cols);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return st;
}

int64_t vl_mimic_cublas_workspace(int cc_major) {
  return cc_major == 9 ? (int64_t)32 << 20 : 2 * ((int64_t)4096 << 10) + 8 * ((int64_t)16 << 10);
}

const char *vl_mimic_cat_name(int cat) {
  static const char *n[] = {"PARAM", "BUFFER", "GRAD", "ACT", "TEMP", "OPT", "OTH"};
  return cat >= 0 && cat < VL_MC_N ? n[cat] : "?";
}
