#!/usr/bin/env python3
"""Build tests/fixtures/mistral_parity.bin: a float64 PyTorch reference of one Mistral
forward + backward on a tiny config, read by tests/test_parity.c.

The reference is written from the Hugging Face Mistral architecture (not imported from
transformers):

  x = embed[tokens]
  per layer:  x = x + o(attn(rope(q(n1)), rope(k(n1)), v(n1)))      n1 = rmsnorm1(x)
              x = x + down(silu(gate(n2)) * up(n2))                  n2 = rmsnorm2(x)
  logits = lm_head(rmsnorm(x))            (untied: lm_head is its own (vocab, dim) matrix)
  loss = cross_entropy(logits, targets, ignore_index=-1), mean over the valid targets

  rmsnorm(x) = w * x / sqrt(mean(x^2) + eps)
  RoPE: HF rotate_half convention, inv_freq[i] = 1 / theta^(2i/D), the angle of position t
        is t * inv_freq, applied to (x[i], x[i + D/2]) pairs
  attention: causal softmax(q k^T / sqrt(D)) v; grouped-query: query head h reads kv head
        h // (H / KVH) (HF repeat_kv == repeat_interleave on the head dimension)
  every linear W is (out, in) as nn.Linear, no biases

Weights are drawn in float64, rounded to float32 (what the C model loads), and the
reference computes in float64 from those rounded values, so the only difference left
between the two is the C engine's float32 arithmetic.

Binary format (little-endian throughout), version 1:

  char[8]   magic "VLPARITY"
  uint32    version (1)
  uint32    n_params: number of parameter records below
  int64[8]  vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn, seq
  float32   rope_theta
  float32   norm_eps
  int64     B, T
  int32[B*T] tokens (row-major, b*T + t)
  int32[B*T] targets (-1 = ignored)
  n_params records, in the C model's parameter order without the (unused) LoRA slots:
      embed; per layer l: l{l}.norm1, l{l}.norm2, l{l}.q, l{l}.k, l{l}.v, l{l}.o,
      l{l}.gate, l{l}.up, l{l}.down; norm; lm_head
    char[48]  name, NUL-padded (the C model's vl_param.name)
    int64     rows, cols ((out, in) for matrices, (1, n) for norm weights)
    float32[rows*cols] weight
    float32[rows*cols] gradient of the mean loss with respect to the weight
  float64   loss
  char[8]   end marker "VLPAREND"

Families (--family; version 2 of the format): the same weights, batch and checks through
the real transformers class instead of the reference above, in float64, attention "eager",
logits from the model and the same mean cross-entropy over targets != -1:
  llama32  LlamaForCausalLM, tie_word_embeddings true (Llama 3.2 1B/3B): no lm_head record;
           the embedding (drawn at the head's std, 0.15) is the head, its gradient the sum
           of its two uses
           -> tests/fixtures/llama32_parity.bin
  qwen2    Qwen2ForCausalLM, tied as the small Qwen2.5 and with its q/k/v biases (drawn
           N(0, 0.1), so a missing bias moves the loss) -> tests/fixtures/qwen2_parity.bin
Version 2 adds, after norm_eps: int32 tie_embed, int32 qkv_bias; the records are the C
model's table order: as version 1 without lm_head when tied, then per layer
l{l}.q.bias, l{l}.k.bias, l{l}.v.bias (1, out) when qkv_bias.

Usage: python3 tests/torch/make_parity_fixture.py [--family llama32|qwen2] [output path]
Deterministic: the same torch version writes the same bytes. Before writing, the script
checks that deliberately wrong conventions (interleaved RoPE pairs, reversed rotation,
theta^(i/D) frequencies, no RoPE, tiled GQA head mapping, 1/D attention scale, RMSNorm
without its weight, LayerNorm, GELU MLP, no causal mask) each move the loss by > 1e-3
relative, i.e. that the fixture tells every one of them from the real model.
"""
import hashlib
import math
import os
import struct
import sys

import torch

SEED = 20240611
CFG = dict(vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn=48, seq=12)
ROPE_THETA = 10000.0
NORM_EPS = 1e-5
B, T = 2, 12
PAD_LEN = 8  # row 1 holds 8 real tokens, then right padding (token 0, target -1)
NAME_LEN = 48


def f32(t):
    """Round to float32 and back: the values the C model sees."""
    return t.to(torch.float32).to(torch.float64)


def make_params(gen):
    c = CFG
    C, H, KVH, D, F, V = c["dim"], c["n_heads"], c["n_kv_heads"], c["head_dim"], c["ffn"], c["vocab"]

    def randn(rows, cols, std):
        return f32(torch.randn(rows, cols, generator=gen, dtype=torch.float64) * std)

    def norm_w(n):  # around 1, so a wrong use of the norm weight shows
        return f32(1.0 + 0.2 * torch.randn(1, n, generator=gen, dtype=torch.float64))

    params = [("embed", randn(V, C, 1.0))]
    for l in range(c["n_layers"]):
        params += [
            (f"l{l}.norm1", norm_w(C)),
            (f"l{l}.norm2", norm_w(C)),
            # larger q/k so the attention pattern is far from uniform
            (f"l{l}.q", randn(H * D, C, 0.3)),
            (f"l{l}.k", randn(KVH * D, C, 0.3)),
            (f"l{l}.v", randn(KVH * D, C, 0.15)),
            (f"l{l}.o", randn(C, H * D, 0.15)),
            (f"l{l}.gate", randn(F, C, 0.15)),
            (f"l{l}.up", randn(F, C, 0.15)),
            (f"l{l}.down", randn(C, F, 0.15)),
        ]
    params += [("norm", norm_w(C)), ("lm_head", randn(V, C, 0.15))]
    return params


def make_batch(gen):
    V = CFG["vocab"]
    seq = torch.randint(1, V, (B, T + 1), generator=gen)
    tokens = seq[:, :T].clone()
    targets = seq[:, 1:].clone()
    targets[0, :2] = -1                 # row 0: a masked "prompt" at the start
    tokens[1, PAD_LEN:] = 0             # row 1: right padding
    targets[1, PAD_LEN - 1:] = -1       # the last real token has no next token either
    return tokens.to(torch.int32), targets.to(torch.int32)


def rmsnorm(x, w):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, variant=None):
    """x (B, heads, T, D): HF Mistral rotary embedding, positions 0..T-1."""
    D = x.shape[-1]
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    if variant == "rope_freq_i_over_D":  # wrong exponent: theta^(i/D) instead of theta^(2i/D)
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, D // 2, dtype=torch.float64) / D))
    pos = torch.arange(x.shape[-2], dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)
    if variant == "rope_reversed":  # rotation the other way (the inverse rotation)
        freqs = -freqs
    if variant == "rope_interleaved":  # GPT-J / original Meta pairing (2i, 2i+1): wrong for HF
        x2 = x.unflatten(-1, (D // 2, 2))
        a, b = x2[..., 0], x2[..., 1]
        cs, sn = freqs.cos(), freqs.sin()
        return torch.stack((a * cs - b * sn, b * cs + a * sn), dim=-1).flatten(-2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


# Deliberately wrong variants: the fixture must tell each of them from the real model.
WRONG_VARIANTS = ["rope_interleaved", "rope_reversed", "rope_freq_i_over_D", "no_rope", "gqa_tiled", "scale_1_over_D",
                  "rmsnorm_no_weight", "layernorm", "gelu_mlp", "no_causal_mask"]


def forward(P, tokens, targets, variant=None):
    c = CFG
    H, KVH, D = c["n_heads"], c["n_kv_heads"], c["head_dim"]
    Bn, Tn = tokens.shape
    F = torch.nn.functional

    def norm(x, w):
        if variant == "rmsnorm_no_weight":
            return rmsnorm(x, torch.ones_like(w))
        if variant == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), w, None, NORM_EPS)
        return rmsnorm(x, w)

    x = P["embed"][tokens.long()]
    causal = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    if variant == "no_causal_mask":
        causal = torch.ones(Tn, Tn, dtype=torch.bool)
    for l in range(c["n_layers"]):
        p = lambda n: P[f"l{l}.{n}"]
        h = norm(x, p("norm1")[0])
        q = (h @ p("q").T).view(Bn, Tn, H, D).transpose(1, 2)
        k = (h @ p("k").T).view(Bn, Tn, KVH, D).transpose(1, 2)
        v = (h @ p("v").T).view(Bn, Tn, KVH, D).transpose(1, 2)
        if variant != "no_rope":
            q, k = rope(q, variant), rope(k, variant)
        if variant == "gqa_tiled":  # wrong: query head h -> kv head h % KVH
            k, v = k.repeat(1, H // KVH, 1, 1), v.repeat(1, H // KVH, 1, 1)
        else:  # HF repeat_kv: query head h -> kv head h // (H/KVH)
            k = k.repeat_interleave(H // KVH, dim=1)
            v = v.repeat_interleave(H // KVH, dim=1)
        s = (q @ k.transpose(-1, -2)) / (D if variant == "scale_1_over_D" else math.sqrt(D))
        s = s.masked_fill(~causal, float("-inf"))
        att = torch.softmax(s, dim=-1) @ v
        att = att.transpose(1, 2).reshape(Bn, Tn, H * D)
        x = x + att @ p("o").T
        h = norm(x, p("norm2")[0])
        act = F.gelu if variant == "gelu_mlp" else F.silu
        x = x + (act(h @ p("gate").T) * (h @ p("up").T)) @ p("down").T
    logits = norm(x, P["norm"][0]) @ P["lm_head"].T
    return F.cross_entropy(logits.view(-1, c["vocab"]), targets.view(-1).long(),
                           ignore_index=-1, reduction="mean")


FAMILIES = {"llama32": dict(tie=True, bias=False, out="llama32_parity.bin"),
            "qwen2": dict(tie=True, bias=True, out="qwen2_parity.bin")}


def family_model(family, params):
    """The transformers class of `family` at CFG's sizes in float64, holding params (the C
    model's names) and, for qwen2, random q/k/v biases (added to params)."""
    import inspect
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    c, fam = CFG, FAMILIES[family]
    Config, Model = (Qwen2Config, Qwen2ForCausalLM) if fam["bias"] else (LlamaConfig, LlamaForCausalLM)
    kw = dict(vocab_size=c["vocab"], hidden_size=c["dim"], intermediate_size=c["ffn"], num_hidden_layers=c["n_layers"],
              num_attention_heads=c["n_heads"], num_key_value_heads=c["n_kv_heads"], head_dim=c["head_dim"],
              hidden_act="silu", max_position_embeddings=c["seq"], rms_norm_eps=NORM_EPS,
              tie_word_embeddings=fam["tie"], use_cache=False, attention_dropout=0.0)
    if "rope_parameters" in inspect.signature(Config.__init__).parameters:  # transformers >= 5
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": ROPE_THETA}
    else:
        kw["rope_theta"] = ROPE_THETA
    model = Model._from_config(Config(**kw), attn_implementation="eager", dtype=torch.float64)
    hf = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}
    sub = {"norm1": "input_layernorm.weight", "norm2": "post_attention_layernorm.weight",
           "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
           "o": "self_attn.o_proj.weight", "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
           "down": "mlp.down_proj.weight", "q.bias": "self_attn.q_proj.bias", "k.bias": "self_attn.k_proj.bias",
           "v.bias": "self_attn.v_proj.bias"}
    if fam["tie"]:  # the embedding is the head too: at the head's scale (std 0.15), not 1
        params = [(n, f32(w * 0.15) if n == "embed" else w) for n, w in params if n != "lm_head"]
    if fam["bias"]:
        gen = torch.Generator().manual_seed(SEED + 1)
        H, KVH, D = c["n_heads"], c["n_kv_heads"], c["head_dim"]
        for l in range(c["n_layers"]):
            for n, out in (("q", H * D), ("k", KVH * D), ("v", KVH * D)):
                params.append((f"l{l}.{n}.bias", f32(0.1 * torch.randn(1, out, generator=gen, dtype=torch.float64))))
    sd, keys = model.state_dict(), []
    for n, w in params:
        layer, _, rest = n[1:].partition(".")
        key = hf[n] if n in hf else f"model.layers.{layer}.{sub[rest]}"
        assert sd[key].numel() == w.numel(), (n, key)
        sd[key] = w.reshape(sd[key].shape)
        keys.append((n, key))
    model.load_state_dict(sd)
    if fam["tie"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model, keys


def family_loss(model, tokens, targets, drop_bias=False):
    F = torch.nn.functional
    if drop_bias:  # the discrimination check: the same model without its q/k/v biases
        saved = {}
        for n, p in model.named_parameters():
            if n.endswith("_proj.bias"):
                saved[n] = p.detach().clone()
                p.data.zero_()
    logits = model(input_ids=tokens.long()).logits
    loss = F.cross_entropy(logits.reshape(-1, CFG["vocab"]), targets.reshape(-1).long(), ignore_index=-1)
    if drop_bias:
        for n, p in model.named_parameters():
            if n in saved:
                p.data.copy_(saved[n])
    return loss


def pack_f32(t):
    flat = t.detach().to(torch.float32).reshape(-1).tolist()
    return struct.pack(f"<{len(flat)}f", *flat)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    argv = sys.argv[1:]
    family = None
    if argv[:1] == ["--family"]:
        family, argv = argv[1], argv[2:]
        assert family in FAMILIES, f"--family: one of {sorted(FAMILIES)}"
    out = argv[0] if argv else os.path.join(root, "tests", "fixtures",
                                            FAMILIES[family]["out"] if family else "mistral_parity.bin")
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(SEED)
    params = make_params(gen)
    tokens, targets = make_batch(gen)
    if family:
        model, keys = family_model(family, params)
        with torch.no_grad():  # the family's mark: its loss moves without it
            base = family_loss(model, tokens, targets).item()
            if FAMILIES[family]["bias"]:
                rel = abs(family_loss(model, tokens, targets, drop_bias=True).item() - base) / base
                print(f"  without the q/k/v biases: loss rel diff {rel:.3e}")
                assert rel > 1e-3
        loss = family_loss(model, tokens, targets)
        loss.backward()
        params = []
        for n, key in keys:  # each record: the model's own parameter and its gradient, (rows, cols)
            p = model.get_parameter(key)
            w = p.detach().clone().reshape(1, -1) if p.dim() == 1 else p.detach().clone()
            w.grad = p.grad.reshape(w.shape)
            params.append((n, w))
        version, flags = 2, (int(FAMILIES[family]["tie"]), int(FAMILIES[family]["bias"]))
    else:
        for _, w in params:
            w.requires_grad_(True)
        loss = forward(dict(params), tokens, targets)
        loss.backward()
        version, flags = 1, None

    # The fixture must discriminate: every plausible convention mistake has to move the loss
    # far beyond the C test's tolerance (rel 1e-5 on the loss).
    P = {n: w.detach() for n, w in params}
    with torch.no_grad():
        for v in WRONG_VARIANTS if not family else []:
            rel = abs(forward(P, tokens, targets, v).item() - loss.item()) / loss.item()
            print(f"  wrong variant {v:18s}: loss rel diff {rel:.3e}")
            assert rel > 1e-3, f"the fixture cannot tell the {v} variant from the real model"

    buf = bytearray()
    buf += b"VLPARITY"
    buf += struct.pack("<II", version, len(params))
    c = CFG
    buf += struct.pack("<8q", c["vocab"], c["dim"], c["n_layers"], c["n_heads"], c["n_kv_heads"],
                       c["head_dim"], c["ffn"], c["seq"])
    buf += struct.pack("<ff", ROPE_THETA, NORM_EPS)
    if flags:
        buf += struct.pack("<ii", *flags)
    buf += struct.pack("<qq", B, T)
    buf += struct.pack(f"<{B * T}i", *tokens.reshape(-1).tolist())
    buf += struct.pack(f"<{B * T}i", *targets.reshape(-1).tolist())
    for name, w in params:
        nb = name.encode()
        assert len(nb) < NAME_LEN
        buf += nb + b"\0" * (NAME_LEN - len(nb))
        buf += struct.pack("<qq", w.shape[0], w.shape[1])
        buf += pack_f32(w)
        buf += pack_f32(w.grad)
    buf += struct.pack("<d", loss.item())
    buf += b"VLPAREND"

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "wb") as f:
        f.write(buf)
    n_tok = int((targets >= 0).sum())
    print(f"wrote {out}: {len(buf)} bytes, {len(params)} params, loss {loss.item():.12f} "
          f"over {n_tok} targets, sha256 {hashlib.sha256(buf).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
