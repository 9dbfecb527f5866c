#!/usr/bin/env python3
"""Build the Stable Diffusion 1.5 parity fixtures, float64 references computed by the REAL
classes (diffusers UNet2DConditionModel / AutoencoderKL, transformers CLIPTextModel, peft
LoRA) on tiny configurations, read by the C side through tests/sd_fixture.{h,c}:

  tests/fixtures/sd_unet_parity.bin  one LoRA training step of the U-Net, as diffusers'
                                     examples/text_to_image/train_text_to_image_lora.py does it
  tests/fixtures/sd_vae_parity.bin   the VAE encoder + quant_conv, latent sampling, * 0.18215
  tests/fixtures/sd_clip_parity.bin  the CLIP text encoder's last_hidden_state (after
                                     final_layer_norm: what SD feeds as encoder_hidden_states),
                                     then one LoRA step of it (the text encoder trained, as
                                     kohya's train_network.py does by default)

Usage (from the repository root; needs torch, diffusers, transformers, peft; CPU only, ~6 s):
  python3 tests/torch/make_sd_fixture.py [output directory, default tests/fixtures]

Configurations
--------------
U-Net: block_out_channels (32, 64), down (CrossAttnDownBlock2D, DownBlock2D), up (UpBlock2D,
  CrossAttnUpBlock2D), layers_per_block 1, cross_attention_dim 24, attention_head_dim 8,
  norm_num_groups 8, sample_size 8, in/out channels 4; everything else SD 1.5's defaults
  (flip_sin_to_cos True, freq_shift 0, GroupNorm eps 1e-5 in resnets, 1e-6 in the
  Transformer2DModel's norm, LayerNorm eps 1e-5, GEGLU feed-forward x4, 1x1-conv proj_in /
  proj_out, nearest-2x upsampling then conv, time embedding dim 4 * 32 = 128).
  HEADS QUIRK: diffusers' `attention_head_dim=8` is the NUMBER of heads, not the head size
  (UNet2DConditionModel passes it on as num_attention_heads; checked below on the built
  Attention modules): 8 heads everywhere, head dim = channels / 8 (here 4 at 32 channels,
  8 at 64; in SD 1.5 40, 80, 160). The config records config.heads.
  LoRA: peft LoraConfig(r=2, lora_alpha=2 (scale alpha/r = 1, as the diffusers script's
  lora_alpha=rank), target_modules ["to_k", "to_q", "to_v", "to_out.0"]) + unet.add_adapter,
  i.e. attn1 and attn2 of every transformer block; y = W x (+ b) + B (A x) * alpha / r.
VAE: AutoencoderKL block_out_channels (32, 64), DownEncoderBlock2D x 2, layers_per_block 1,
  norm_num_groups 8, latent_channels 4 (GroupNorm eps 1e-6 everywhere, Downsample2D pads
  (0, 1, 0, 1) = right and bottom only, then a stride-2 3x3 conv without padding; the mid
  block's attention has ONE head of dim 64). Input (2, 3, 16, 16) -> latents (2, 4, 8, 8).
  latent_dist: moments = quant_conv(encoder(x)); mean, logvar = moments.chunk(2, dim=1)
  (first 4 channels the mean); logvar clamped to [-30, 20]; std = exp(0.5 logvar);
  latents = (mean + std * noise) * 0.18215.
CLIP: vocab 100, hidden 32, intermediate 64, 2 layers, 4 heads, 7 positions, quick_gelu
  (x * sigmoid(1.702 x)), LayerNorm eps 1e-5, causal self-attention, pre-LN blocks.
  LoRA step, after the frozen records: peft LoraConfig(r=2, lora_alpha=2, target_modules
  ["q_proj", "k_proj", "v_proj", "out_proj"]) + text_encoder.add_adapter (A, B as the
  U-Net's below, B non-zero), loss = (last_hidden_state * R).sum() with R (2, 7, 32) N(0, 1)
  rounded to float32; gradients of every LoRA A / B.

Weights and inputs
------------------
Frozen weights are not stored value by value (the U-Net alone has 790k values): each is a
GEN record whose values the reader regenerates exactly (below): uniform in
base +- 2^e with 16-bit resolution. Weights of rank >= 2 (Linear, Conv2d, Embedding): base 0,
2^e the power of two nearest sqrt(3 / fan_in) (fan_in = prod(shape[1:]); std ~ 1/sqrt(fan_in),
so activations stay O(1)); GroupNorm / LayerNorm weights: base 1, 2^e = 1/8; biases: base 0,
1/8. Every generated value is exactly a float32. LoRA A and B (non-zero B, so neither
gradient is trivially zero): A ~ N(0, 1/in), B ~ N(0, 0.2^2), rounded to float32 and stored.
Inputs: N(0, 1) rounded to float32 (token ids uniform in [0, 100)). The reference is computed
in float64 (torch.set_default_dtype(torch.float64)) from exactly these float32 values; outputs
and gradients are stored in float64, the act.* activations rounded to float32.

Training step (U-Net file), as train_text_to_image_lora.py:
  noise_scheduler = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085,
                                  beta_end=0.012, num_train_timesteps=1000)
  noisy = noise_scheduler.add_noise(latents, noise, timesteps)
      (= sqrt(acp[t]) * latents + sqrt(1 - acp[t]) * noise, acp = alphas_cumprod: diffusers
       computes betas = linspace(sqrt(0.00085), sqrt(0.012), 1000, float32) ** 2 and
       alphas_cumprod in float32; add_noise converts those float32 values to float64)
  model_pred = unet(noisy, timesteps, encoder_hidden_states).sample
  loss = F.mse_loss(model_pred, noise, reduction="mean"); loss.backward()
  (the script's .float() casts are the identity for an fp32 model; here they are left out
  so the loss stays in float64.) Gradients are those of every LoRA A / B.
  One part is float32 even in this float64 model, because diffusers computes it so: the
  sinusoidal time embedding (get_timestep_embedding: exponent -ln(10000) * i / 16 and
  timesteps.float() * exp(exponent) in float32, [cos | sin] since flip_sin_to_cos, then cast
  to the model's dtype). The same expression in C float32 (expf(-logf(10000) * i / 16),
  t * that, cosf / sinf) matches act.time_proj to 6e-8 (glibc, measured); the formula in
  double differs from it by 1.5e-5 at t = 700.

Binary format (little-endian), version 1
----------------------------------------
  char[8]  magic "VLSDFIX1"
  uint32   version (1)
  uint32   n_records
  n_records records:
    uint32   name_len (1..255), char[name_len] name (ASCII, no terminating NUL)
    uint32   dtype: 1 float32, 2 float64, 3 int64, 4 GEN (generated float32)
    uint32   ndim (0..8; 0 = a scalar, one value)
    int64    dims[ndim] (each >= 1); n = prod(dims), row-major (C order, PyTorch's)
    payload: float32[n] | float64[n] | int64[n] | GEN: uint64 seed, float64 base, int32 e,
             uint32 0 (24 bytes)
  char[8]  "VLSDEND1"
  uint64   FNV-1a 64 of every byte before this end marker
GEN values, i = 0 .. n-1 (splitmix64's i-th output; all arithmetic exact):
  z = seed + (i + 1) * 0x9E3779B97F4A7C15            (mod 2^64)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB
  z = z ^ (z >> 31);  q = (int64)(z >> 48) - 32768   (in [-32768, 32767])
  value = (float)(base + q * 2^(e - 15))              (exact: base is 0 or 1, e >= -8 when 1)

Record names
------------
  config.*   int64: U-Net block_out_channels, layers_per_block, cross_attention_dim, heads
             (= 8 per attention layer), norm_num_groups, sample_size, in_channels,
             out_channels, lora_rank, lora_alpha, num_train_timesteps; VAE block_out_channels,
             layers_per_block, norm_num_groups, latent_channels; CLIP vocab_size,
             hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
             max_position_embeddings, lora_rank, lora_alpha.  float64: config.scaling_factor (VAE), config.*_eps.
  param.<name>   frozen weights, <name> = the diffusers / transformers state_dict name (the
                 same names and shapes as tests/fixtures/sd15_params_*.txt for SD 1.5; the
                 VAE file holds encoder.* and quant_conv.* only; CLIP names are transformers
                 5's, e.g. encoder.layers.0.self_attn.q_proj.weight, final_layer_norm.bias:
                 the checkpoint and transformers 4 put "text_model." in front), in
                 state_dict order.
  lora.<module>.lora_A.weight (rank, in), lora.<module>.lora_B.weight (out, rank), <module>
                 e.g. down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0 (CLIP:
                 encoder.layers.0.self_attn.q_proj): the names of diffusers' saved LoRA state
                 dict (get_peft_model_state_dict, without the "unet." / "text_encoder." and
                 "text_model." prefixes); in peft's live module tree they read
                 <module>.lora_A.default.weight.
  grad.<module>.lora_A.weight / lora_B.weight   d loss / d that LoRA matrix (float64).
  input.*    U-Net: latents (2,4,8,8), noise (2,4,8,8), timesteps int64 (2,),
             encoder_hidden_states (2,7,24); VAE: image (2,3,16,16), noise (2,4,8,8);
             CLIP: input_ids int64 (2,7), R (2,7,32) the LoRA step's loss weights.
  ddpm.alphas_cumprod (1000,) float32 (diffusers' values), ddpm.alphas_cumprod_t (2,)
             float64 at the two timesteps.
  out.*      U-Net: noisy_latents, model_pred (2,4,8,8), loss (scalar); VAE: mean, logvar,
             std (2,4,8,8), latents (2,4,8,8); CLIP: last_hidden_state (2,7,32) (frozen),
             lora_last_hidden_state (2,7,32) and lora_loss (scalar) of the LoRA step.
  act.<module>   outputs of a few modules, for localising a mismatch (U-Net: time_proj
             (2,32) sinusoidal embedding, time_embedding (2,128), conv_in, each down block's
             hidden states, mid_block, each up block, the first transformer, conv_norm_out;
             VAE: encoder.conv_in, encoder.down_blocks.*, encoder.mid_block, encoder (the
             8 moments before quant_conv); CLIP: embeddings, encoder.layers.*).
  check.param_sum, check.param_sumsq  float64: sum and sum of squares over all param.*
             values in record order (the C test recomputes them from the GEN records).

Before writing, wrong conventions are run in patched copies of the models and the move of the
output (max |alt - ref| / max |ref|) is printed; those expected to be caught must move it by
more than 1e-3 (the float32 parity tolerance of the C side is far below that), else the script
stops. Some slips (the GroupNorm eps) move it by less: the fixture cannot catch them, which
is printed as such.
"""
import copy
import math
import os
import struct
import sys
import types

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel  # noqa: E402
from diffusers.models.activations import GEGLU  # noqa: E402
from diffusers.models.attention_processor import Attention  # noqa: E402
from diffusers.models.downsampling import Downsample2D  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModel  # noqa: E402

try:
    from peft import LoraConfig
except ImportError:  # pragma: no cover
    sys.exit("peft is missing: pip install peft")

MAGIC, END, VERSION = b"VLSDFIX1", b"VLSDEND1", 1
F32, F64, I64, GEN = 1, 2, 3, 4
MOVE_MIN = 1e-3

UNET_CFG = dict(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
                cross_attention_dim=24, attention_head_dim=8, norm_num_groups=8,
                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
LORA_R, LORA_ALPHA = 2, 2
VAE_CFG = dict(in_channels=3, out_channels=3, block_out_channels=(32, 64), layers_per_block=1,
               down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
               latent_channels=4, norm_num_groups=8, sample_size=16)
SCALING = 0.18215
CLIP_CFG = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=7, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                bos_token_id=98, eos_token_id=99, pad_token_id=1)
CLIP_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]
B, T_TEXT, TIMESTEPS = 2, 7, (10, 700)


# ---- writer -----------------------------------------------------------------------------

class Writer:
    def __init__(self):
        self.recs = []  # (name, bytes)
        self.names = set()

    def _add(self, name, dtype, shape, payload):
        assert 0 < len(name) < 256 and name.isascii() and name not in self.names, name
        assert len(shape) <= 8 and all(d >= 1 for d in shape), (name, shape)
        self.names.add(name)
        head = struct.pack("<I", len(name)) + name.encode() + struct.pack("<II", dtype, len(shape))
        head += struct.pack(f"<{len(shape)}q", *shape)
        self.recs.append(head + payload)

    def f32(self, name, t):
        a = np.array(torch.as_tensor(t).detach().cpu().numpy(), dtype=np.float32, order="C")  # keeps 0-d
        assert np.isfinite(a).all(), name
        self._add(name, F32, a.shape, a.astype("<f4").tobytes())

    def f64(self, name, t):
        a = np.array(torch.as_tensor(t).detach().cpu().numpy(), dtype=np.float64, order="C")  # keeps 0-d
        assert np.isfinite(a).all(), name
        self._add(name, F64, a.shape, a.astype("<f8").tobytes())

    def i64(self, name, t):
        a = np.array(t, dtype=np.int64, order="C")
        self._add(name, I64, a.shape, a.astype("<i8").tobytes())

    def gen(self, name, shape, seed, base, e):
        self._add(name, GEN, tuple(shape), struct.pack("<QdiI", seed, base, e, 0))

    def write(self, path):
        body = MAGIC + struct.pack("<II", VERSION, len(self.recs)) + b"".join(self.recs)
        with open(path, "wb") as f:
            f.write(body + END + struct.pack("<Q", fnv1a(body)))
        return len(body) + 16


def fnv1a(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# ---- generated weights ---------------------------------------------------------------------

def gen_values(seed, n, base, e):
    i = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    q = (z >> np.uint64(48)).astype(np.int64) - 32768
    v = base + q.astype(np.float64) * 2.0 ** (e - 15)
    assert (v.astype(np.float32).astype(np.float64) == v).all(), "generated value not exact in float32"
    return v


def gen_spec(name, p, norm_params):
    """(base, e) of a frozen weight: see the docstring."""
    if name in norm_params:
        return 1.0, -3
    if p.dim() == 1:
        return 0.0, -3
    fan_in = p[0].numel()
    return 0.0, int(round(math.log2(math.sqrt(3.0 / fan_in))))


def norm_weight_names(model):
    out = set()
    for mname, m in model.named_modules():
        if isinstance(m, (nn.GroupNorm, nn.LayerNorm)) and m.weight is not None:
            out.add(f"{mname}.weight" if mname else "weight")
    return out


@torch.no_grad()
def init_generated(model, named, salt, w, norm_params):
    """Sets every parameter in `named` to its GEN values and records it; returns sum, sumsq."""
    s, ss = [], []
    for name, p in named:
        base, e = gen_spec(name, p, norm_params)
        seed = fnv1a(name.encode(), 0xCBF29CE484222325 ^ salt)
        v = gen_values(seed, p.numel(), base, e)
        p.copy_(torch.from_numpy(v).view(p.shape))
        w.gen("param." + name, p.shape, seed, base, e)
        s.append(v)
    allv = np.concatenate(s)
    return math.fsum(allv.tolist()), math.fsum((allv * allv).tolist())


def randn32(shape, g, scale=1.0):
    return (torch.randn(shape, generator=g) * scale).float().double()


def rel_move(alt, ref):
    return ((alt - ref).abs().max() / ref.abs().max()).item()


def report_moves(what, moves, must):
    ok = True
    for key, mv in moves.items():
        caught = mv > MOVE_MIN
        tag = "caught" if caught else "NOT caught by this fixture (below %.0e)" % MOVE_MIN
        print(f"  {what}: {key:<44} moves the output by {mv:.2e}: {tag}")
        if key in must and not caught:
            ok = False
    assert ok, f"{what}: a convention the fixture must pin does not move the reference"


class Acts:
    """Forward hooks storing the first tensor output of named modules."""

    def __init__(self, model, names):
        self.out, self.hooks = {}, []
        mods = dict(model.named_modules())
        for n in names:
            self.hooks.append(mods[n].register_forward_hook(self._hook(n)))

    def _hook(self, n):
        def f(mod, inp, out):
            if isinstance(out, (tuple, list)):
                out = out[0]
            if hasattr(out, "sample"):
                out = out.sample
            if not torch.is_tensor(out) and hasattr(out, "last_hidden_state"):
                out = out.last_hidden_state
            self.out[n] = out.detach().clone()
        return f

    def remove(self):
        for h in self.hooks:
            h.remove()


# ---- U-Net ------------------------------------------------------------------------------------

def unet_step(unet, sched, lat, noise, ts, ehs):
    noisy = sched.add_noise(lat, noise, ts)
    pred = unet(noisy, ts, ehs).sample
    loss = F.mse_loss(pred, noise, reduction="mean")
    return noisy, pred, loss


def make_unet():
    w = Writer()
    g = torch.Generator().manual_seed(1501)
    unet = UNet2DConditionModel(**UNET_CFG)
    heads = sorted({m.heads for m in unet.modules() if isinstance(m, Attention)})
    dims = sorted({m.inner_dim // m.heads for m in unet.modules() if isinstance(m, Attention)})
    print(f"unet: attention heads {heads}, head dims {dims} (attention_head_dim=8 is the head COUNT)")
    assert heads == [8] and dims == [4, 8]
    base_named = list(unet.named_parameters())
    norms = norm_weight_names(unet)
    psum, psumsq = init_generated(unet, base_named, 0x554E4554, w, norms)
    unet.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, init_lora_weights="gaussian",
                                target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
    lora = [(n, p) for n, p in unet.named_parameters() if "lora_" in n]
    assert all(p.requires_grad for _, p in lora) and len(lora) == 4 * 2 * 4 * 2, len(lora)  # 4 blocks x attn1/2 x q,k,v,out x A,B
    with torch.no_grad():
        for n, p in lora:
            if ".lora_A." in n:
                p.copy_(randn32(p.shape, g, 1.0 / math.sqrt(p.shape[1])))
            else:
                p.copy_(randn32(p.shape, g, 0.2))
    sched = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                          num_train_timesteps=1000)
    lat = randn32((B, 4, 8, 8), g)
    noise = randn32((B, 4, 8, 8), g)
    ts = torch.tensor(TIMESTEPS, dtype=torch.long)
    ehs = randn32((B, T_TEXT, 24), g)

    act_names = ["time_proj", "time_embedding", "conv_in", "down_blocks.0", "down_blocks.0.attentions.0",
                 "down_blocks.1", "mid_block", "up_blocks.0", "up_blocks.1", "conv_norm_out"]
    acts = Acts(unet, act_names)
    unet.zero_grad()
    noisy, pred, loss = unet_step(unet, sched, lat, noise, ts, ehs)
    loss.backward()
    acts.remove()
    print(f"unet: loss {loss.item():.12f}, |model_pred| max {pred.abs().max().item():.3f}")

    # conventions the C side could slip on, in patched copies (forward only)
    def alt(patch):
        u = copy.deepcopy(unet)
        patch(u)
        with torch.no_grad():
            return unet_step(u, sched, lat, noise, ts, ehs)[1]

    def geglu_swapped(u):
        for m in u.modules():
            if isinstance(m, GEGLU):
                def fwd(self, x, *a, **k):
                    h, gate = self.proj(x).chunk(2, dim=-1)
                    return gate * F.gelu(h)
                m.forward = types.MethodType(fwd, m)

    def geglu_tanh(u):
        for m in u.modules():
            if isinstance(m, GEGLU):
                def fwd(self, x, *a, **k):
                    h, gate = self.proj(x).chunk(2, dim=-1)
                    return h * F.gelu(gate, approximate="tanh")
                m.forward = types.MethodType(fwd, m)

    def head_dim_8(u):
        for m in u.modules():
            if isinstance(m, Attention):
                m.heads = m.inner_dim // 8

    def flip(u):
        u.time_proj.flip_sin_to_cos = False

    def shift(u):
        u.time_proj.downscale_freq_shift = 1

    def tf_gn_eps(u):
        for m in u.modules():
            if m.__class__.__name__ == "Transformer2DModel":
                m.norm.eps = 1e-5

    def no_lora_out(u):
        for n, m in u.named_modules():
            if n.endswith("to_out.0") and hasattr(m, "scaling"):
                m.scaling = {k: 0.0 for k in m.scaling}

    moves = {name: rel_move(alt(fn), pred) for name, fn in [
        ("GEGLU halves swapped (gate first)", geglu_swapped),
        ("GEGLU tanh-approximate GELU", geglu_tanh),
        ("heads = channels / 8 (head dim 8)", head_dim_8),
        ("flip_sin_to_cos=False (sin first)", flip),
        ("freq_shift=1", shift),
        ("LoRA left off to_out.0", no_lora_out),
        ("Transformer2D GroupNorm eps 1e-5, not 1e-6", tf_gn_eps)]}
    report_moves("unet", moves, must={"GEGLU halves swapped (gate first)", "heads = channels / 8 (head dim 8)",
                                      "flip_sin_to_cos=False (sin first)", "freq_shift=1",
                                      "LoRA left off to_out.0"})

    c = UNET_CFG
    w.i64("config.block_out_channels", list(c["block_out_channels"]))
    for k in ("layers_per_block", "cross_attention_dim", "norm_num_groups", "sample_size", "in_channels",
              "out_channels"):
        w.i64("config." + k, [c[k]])
    w.i64("config.heads", [8])
    w.i64("config.lora_rank", [LORA_R])
    w.i64("config.lora_alpha", [LORA_ALPHA])
    w.i64("config.num_train_timesteps", [1000])
    w.f64("config.resnet_norm_eps", [1e-5])
    w.f64("config.transformer_norm_eps", [1e-6])
    w.f64("config.layer_norm_eps", [1e-5])
    acp = sched.alphas_cumprod
    assert acp.dtype == torch.float32
    w.f32("ddpm.alphas_cumprod", acp)
    w.f64("ddpm.alphas_cumprod_t", acp[ts].double())
    w.f32("input.latents", lat)
    w.f32("input.noise", noise)
    w.i64("input.timesteps", ts.numpy())
    w.f32("input.encoder_hidden_states", ehs)
    # the GEN param.* records were added by init_generated
    for n, p in lora:
        w.f32("lora." + n.replace(".default.", "."), p)
    w.f64("out.noisy_latents", noisy)
    w.f64("out.model_pred", pred)
    w.f64("out.loss", loss.detach().reshape(()))
    for n, p in lora:
        assert p.grad is not None and p.grad.abs().max() > 0, n
        w.f64("grad." + n.replace(".default.", "."), p.grad)
    for n in act_names:
        w.f32("act." + n, acts.out[n])
    w.f64("check.param_sum", [psum])
    w.f64("check.param_sumsq", [psumsq])
    return w, len(base_named), len(lora)


# ---- VAE encoder ------------------------------------------------------------------------------

def vae_encode(vae, x, noise):
    dist = vae.encode(x).latent_dist
    lat = (dist.mean + dist.std * noise) * SCALING
    return dist, lat


def make_vae():
    w = Writer()
    g = torch.Generator().manual_seed(1502)
    vae = AutoencoderKL(**VAE_CFG)
    named = [("encoder." + n, p) for n, p in vae.encoder.named_parameters()] + \
            [("quant_conv." + n, p) for n, p in vae.quant_conv.named_parameters()]
    norms = {"encoder." + n for n in norm_weight_names(vae.encoder)}
    psum, psumsq = init_generated(vae, named, 0x56414500, w, norms)
    x = randn32((B, 3, 16, 16), g)
    noise = randn32((B, 4, 8, 8), g)
    act_names = ["encoder.conv_in", "encoder.down_blocks.0", "encoder.down_blocks.1", "encoder.mid_block", "encoder"]
    acts = Acts(vae, act_names)
    with torch.no_grad():
        dist, lat = vae_encode(vae, x, noise)
    acts.remove()
    print(f"vae: |mean| max {dist.mean.abs().max().item():.3f}, logvar in [{dist.logvar.min().item():.3f}, "
          f"{dist.logvar.max().item():.3f}], |latents| max {lat.abs().max().item():.3f}")
    assert lat.shape == (B, 4, 8, 8)

    def alt(patch):
        v = copy.deepcopy(vae)
        patch(v)
        with torch.no_grad():
            return vae_encode(v, x, noise)[1]

    def sym_pad(v):
        for m in v.modules():
            if isinstance(m, Downsample2D):
                m.padding = 1
                m.conv.padding = (1, 1)

    def gn_eps(v):
        for m in v.modules():
            if isinstance(m, nn.GroupNorm):
                m.eps = 1e-5

    def mid_heads(v):
        for m in v.modules():
            if isinstance(m, Attention):
                m.heads = m.inner_dim // 8

    def mean_logvar_swapped(v):
        orig = v.quant_conv.forward
        v.quant_conv.forward = lambda h: torch.cat(orig(h).chunk(2, dim=1)[::-1], dim=1)

    moves = {name: rel_move(alt(fn), lat) for name, fn in [
        ("Downsample2D symmetric padding, not (0,1,0,1)", sym_pad),
        ("mid-block attention with 8 heads, not 1", mid_heads),
        ("mean / logvar halves swapped", mean_logvar_swapped),
        ("GroupNorm eps 1e-5, not 1e-6", gn_eps)]}
    report_moves("vae", moves, must={"Downsample2D symmetric padding, not (0,1,0,1)",
                                     "mid-block attention with 8 heads, not 1", "mean / logvar halves swapped"})

    c = VAE_CFG
    w.i64("config.block_out_channels", list(c["block_out_channels"]))
    for k in ("layers_per_block", "norm_num_groups", "latent_channels", "in_channels"):
        w.i64("config." + k, [c[k]])
    w.f64("config.norm_eps", [1e-6])
    w.f64("config.scaling_factor", [SCALING])
    w.f32("input.image", x)
    w.f32("input.noise", noise)
    w.f64("out.mean", dist.mean)
    w.f64("out.logvar", dist.logvar)
    w.f64("out.std", dist.std)
    w.f64("out.latents", lat)
    for n in act_names:
        w.f32("act." + n, acts.out[n])
    w.f64("check.param_sum", [psum])
    w.f64("check.param_sumsq", [psumsq])
    return w, len(named)


# ---- CLIP text encoder --------------------------------------------------------------------------

def clip_core(te):
    """The CLIPTextTransformer part: te.text_model in transformers 4, te itself in 5."""
    return te.text_model if hasattr(te, "text_model") else te


def clip_name(n):
    """Parameter / module names as transformers 5's live CLIPTextModel has them (and
    tests/fixtures/sd15_params_text_encoder.txt): without the "text_model." prefix that the
    SD 1.5 checkpoint (text_encoder/model.safetensors) and transformers 4 use."""
    return n[len("text_model."):] if n.startswith("text_model.") else n


def make_clip():
    w = Writer()
    g = torch.Generator().manual_seed(1503)
    te = CLIPTextModel(CLIPTextConfig(**CLIP_CFG, attn_implementation="eager")).eval()
    named = [(clip_name(n), p) for n, p in te.named_parameters()]
    norms = {clip_name(n) for n in norm_weight_names(te)}
    psum, psumsq = init_generated(te, named, 0x434C4950, w, norms)
    ids = torch.randint(0, CLIP_CFG["vocab_size"], (B, T_TEXT), generator=g)
    core = clip_core(te)
    act_mods = {"embeddings": core.embeddings, "encoder.layers.0": core.encoder.layers[0],
                "encoder.layers.1": core.encoder.layers[1]}
    act_names = list(act_mods)
    acts = Acts(te, [])
    for n, m in act_mods.items():
        acts.hooks.append(m.register_forward_hook(acts._hook(n)))
    with torch.no_grad():
        out = te(input_ids=ids).last_hidden_state
    acts.remove()
    print(f"clip: |last_hidden_state| max {out.abs().max().item():.3f}")

    def alt(patch):
        t = copy.deepcopy(te)
        patch(clip_core(t))
        with torch.no_grad():
            return t(input_ids=ids).last_hidden_state

    def no_causal(t):
        for layer in t.encoder.layers:
            orig = layer.self_attn.forward
            def fwd(*a, _orig=orig, **k):
                h = a[0] if a else k["hidden_states"]
                return _orig(h, None)
            layer.self_attn.forward = fwd

    def gelu(t):
        for layer in t.encoder.layers:
            layer.mlp.activation_fn = nn.GELU()

    def no_final_ln(t):
        t.final_layer_norm = nn.Identity()

    moves = {name: rel_move(alt(fn), out) for name, fn in [
        ("no causal mask", no_causal), ("exact GELU, not quick_gelu", gelu),
        ("last_hidden_state before final_layer_norm", no_final_ln)]}
    report_moves("clip", moves, must=set(moves))

    c = CLIP_CFG
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "max_position_embeddings"):
        w.i64("config." + k, [c[k]])
    w.f64("config.layer_norm_eps", [c["layer_norm_eps"]])
    w.i64("input.input_ids", ids.numpy())
    w.f64("out.last_hidden_state", out)
    for n in act_names:
        w.f32("act." + n, acts.out[n])
    w.f64("check.param_sum", [psum])
    w.f64("check.param_sumsq", [psumsq])
    n_lora = clip_lora_step(te, ids, g, w)
    return w, len(named), n_lora


def clip_lora_step(te, ids, g, w):
    """The text encoder LoRA-trained (kohya trains it beside the U-Net): peft LoRA r=2, alpha 2
    on q/k/v/out_proj of every layer, non-zero random B, loss = (last_hidden_state * R).sum().
    Appends its records after the frozen encoder's (which it leaves as they were)."""
    te.requires_grad_(False)
    te.add_adapter(LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, init_lora_weights="gaussian",
                              target_modules=CLIP_LORA_TARGETS))
    lora = [(clip_name(n).replace(".default.", "."), p) for n, p in te.named_parameters() if "lora_" in n]
    assert all(p.requires_grad for _, p in lora) and len(lora) == CLIP_CFG["num_hidden_layers"] * 4 * 2, len(lora)
    with torch.no_grad():
        for n, p in lora:
            if ".lora_A." in n:
                p.copy_(randn32(p.shape, g, 1.0 / math.sqrt(p.shape[1])))
            else:
                p.copy_(randn32(p.shape, g, 0.2))
    R = randn32((B, T_TEXT, CLIP_CFG["hidden_size"]), g)
    te.zero_grad()
    out = te(input_ids=ids).last_hidden_state
    loss = (out * R).sum()
    loss.backward()
    print(f"clip LoRA: loss {loss.item():.12f}, |last_hidden_state| max {out.abs().max().item():.3f}")

    def no_lora_out(t):
        for n, m in t.named_modules():
            if n.endswith("out_proj") and hasattr(m, "scaling"):
                m.scaling = {k: 0.0 for k in m.scaling}

    t = copy.deepcopy(te)
    no_lora_out(t)
    with torch.no_grad():
        alt = t(input_ids=ids).last_hidden_state
    report_moves("clip LoRA", {"LoRA left off out_proj": rel_move(alt, out)}, must={"LoRA left off out_proj"})

    w.i64("config.lora_rank", [LORA_R])
    w.i64("config.lora_alpha", [LORA_ALPHA])
    w.f32("input.R", R)
    for n, p in lora:
        w.f32("lora." + n, p)
    w.f64("out.lora_last_hidden_state", out)
    w.f64("out.lora_loss", loss.detach().reshape(()))
    for n, p in lora:
        assert p.grad is not None and p.grad.abs().max() > 0, n
        w.f64("grad." + n, p.grad)
    return len(lora)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    os.makedirs(outdir, exist_ok=True)
    wu, n_unet, n_lora = make_unet()
    wv, n_vae = make_vae()
    wc, n_clip, n_clip_lora = make_clip()
    for fname, wr, what in (("sd_unet_parity.bin", wu, f"{n_unet} params, {n_lora} LoRA matrices"),
                            ("sd_vae_parity.bin", wv, f"{n_vae} params"),
                            ("sd_clip_parity.bin", wc, f"{n_clip} params, {n_clip_lora} LoRA matrices")):
        path = os.path.join(outdir, fname)
        size = wr.write(path)
        assert size < 600_000, f"{path}: {size} bytes"
        print(f"wrote {path}: {len(wr.recs)} records ({what}), {size} bytes")


if __name__ == "__main__":
    main()
