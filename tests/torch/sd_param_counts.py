#!/usr/bin/env python3
"""Parameter counts of Stable Diffusion 1.5 (runwayml/stable-diffusion-v1-5 configs), built
from the real classes on torch's meta device (no weights, no download), and per-parameter
listings for the C models in tests/fixtures/sd15_params_{unet,vae_encoder,text_encoder}.txt
(one line per parameter, in state_dict order: "name d0 d1 ..."; U-Net and VAE names are
diffusers' state_dict names, the VAE listing holds encoder.* and quant_conv.* only; CLIP names
are transformers 5's (embeddings.*, encoder.layers.*, final_layer_norm.*): the SD 1.5
checkpoint file and transformers 4 put "text_model." in front of each).

Printed by `cd /work/main && python3 tests/torch/sd_param_counts.py`
(torch 2.15.0, diffusers 0.42.1, transformers 5.23.0, peft 0.21.2):

  unet                               859520964
  vae encoder + quant_conv            34163664   (the part SD training runs)
  vae total (for reference)           83653863
  text encoder (CLIPTextModel)       123060480
  unet attention heads                8 at every level (head dim 40 / 80 / 160)
  LoRA unet, peft (diffusers train_text_to_image_lora.py: to_q/to_k/to_v/to_out.0 of attn1
    and attn2 of all 16 transformer blocks, 128 Linear layers, no LoRA bias)
    r=4                                 797184
    r=8                                1594368
  LoRA unet, kohya default (every Linear and 1x1 Conv2d inside Transformer2DModel: also
    proj_in/proj_out (1x1 convs in SD1.5), ff.net.0.proj (GEGLU), ff.net.2: 192 layers)
    r=4                                1695744
    r=8                                3391488
  LoRA text encoder, q/k/v/out_proj (peft, 48 layers)
    r=4                                 294912
    r=8                                 589824
  LoRA text encoder, kohya default (every Linear in CLIPAttention and CLIPMLP: q/k/v/out_proj
    + fc1/fc2, 72 layers)
    r=4                                 663552
    r=8                                1327104

kohya's defaults (sd-scripts networks/lora.py): TEXT_ENCODER_TARGET_REPLACE_MODULE =
["CLIPAttention", "CLIPMLP"] and UNET_TARGET_REPLACE_MODULE = ["Transformer2DModel"]; every
Linear and 1x1 Conv2d below those modules gets lora_down (r x in) and lora_up (out x r), no
bias; its per-module `alpha` is a buffer, not a parameter. The peft counts are measured with
LoraConfig(r, lora_alpha=r, init_lora_weights="gaussian", target_modules=[...]) +
add_adapter / get_peft_model; the kohya counts are r * (in + out) summed over its targets
(computed here, kohya is not installed) and checked against peft on the same layer list.

The diffusers SD 1.5 config's `attention_head_dim=8` is the NUMBER of heads (a naming quirk of
UNet2DConditionModel: it is passed on as num_attention_heads), so heads = 8 at every level
and the head dimension grows with the width: 320/8 = 40, 640/8 = 80, 1280/8 = 160. Checked
below on the built modules (Attention.heads)."""
import os
import sys
import warnings

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel

try:
    from peft import LoraConfig, get_peft_model
except ImportError:  # pragma: no cover
    sys.exit("peft is missing: pip install peft")

UNET_CFG = dict(sample_size=64, in_channels=4, out_channels=4, block_out_channels=(320, 640, 1280, 1280),
                layers_per_block=2, cross_attention_dim=768, attention_head_dim=8,
                down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
                norm_num_groups=32, norm_eps=1e-5, act_fn="silu", flip_sin_to_cos=True, freq_shift=0,
                center_input_sample=False, downsample_padding=1, mid_block_scale_factor=1)
VAE_CFG = dict(in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
               down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
               latent_channels=4, norm_num_groups=32, act_fn="silu", sample_size=512)
CLIP_CFG = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
                projection_dim=768, layer_norm_eps=1e-5)
warnings.filterwarnings("ignore", category=FutureWarning)  # peft vs transformers 5 deprecations
PEFT_UNET_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]
PEFT_TE_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]
RANKS = (4, 8)


def build():
    with torch.device("meta"):
        unet = UNet2DConditionModel(**UNET_CFG)
        vae = AutoencoderKL(**VAE_CFG)
        te = CLIPTextModel(CLIPTextConfig(**CLIP_CFG))
    return unet, vae, te


def count(mod):
    return sum(p.numel() for p in mod.parameters())


def lora_peft(make_model, targets, r, on_unet):
    """Trainable LoRA parameters peft adds to a fresh model for these targets."""
    m = make_model()
    m.requires_grad_(False)
    cfg = LoraConfig(r=r, lora_alpha=r, init_lora_weights="gaussian", target_modules=targets)
    if on_unet:
        m.add_adapter(cfg)
    else:
        m = get_peft_model(m, cfg)
    n = sum(p.numel() for name, p in m.named_parameters() if p.requires_grad)
    names = [name for name, _ in m.named_parameters() if "lora_" in name]
    assert all(".lora_A." in s or ".lora_B." in s for s in names)
    return n, len(names) // 2


def kohya_layers(model, classes):
    """(name, in, out) of each Linear / 1x1 Conv2d below a module whose class is in classes."""
    out, seen = [], set()
    for name, mod in model.named_modules():
        if mod.__class__.__name__ not in classes:
            continue
        for cname, child in mod.named_modules():
            full = f"{name}.{cname}"
            if full in seen:
                continue
            if isinstance(child, torch.nn.Linear):
                seen.add(full)
                out.append((full, child.in_features, child.out_features))
            elif isinstance(child, torch.nn.Conv2d) and child.kernel_size == (1, 1):
                seen.add(full)
                out.append((full, child.in_channels, child.out_channels))
    return out


def clip_name(n):
    """CLIP names as transformers 5's live CLIPTextModel has them: without the "text_model."
    prefix that the SD 1.5 checkpoint (text_encoder/model.safetensors) and transformers 4 use."""
    return n[len("text_model."):] if n.startswith("text_model.") else n


def write_listing(path, named):
    with open(path, "w") as f:
        for name, p in named:
            f.write(name + " " + " ".join(str(d) for d in p.shape) + "\n")
    return os.path.getsize(path)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    unet, vae, te = build()
    n_unet, n_te = count(unet), count(te)
    n_venc = count(vae.encoder) + count(vae.quant_conv)
    print(f"unet                           {n_unet:>13}")
    print(f"vae encoder + quant_conv       {n_venc:>13}")
    print(f"vae total (for reference)      {count(vae):>13}")
    print(f"text encoder (CLIPTextModel)   {n_te:>13}")
    assert n_unet == 859520964 and n_venc == 34163664 and n_te == 123060480, "counts moved"

    heads = []
    for blk in list(unet.down_blocks) + [unet.mid_block] + list(unet.up_blocks):
        for at in getattr(blk, "attentions", None) or []:
            for tb in at.transformer_blocks:
                for a in (tb.attn1, tb.attn2):
                    heads.append((a.heads, a.inner_dim // a.heads))
    hs = sorted(set(heads))
    print("unet attention (heads, head_dim) seen:", hs)
    assert all(h == 8 for h, _ in hs), "attention_head_dim=8 is not the number of heads here"

    mk_unet = lambda: build()[0]  # noqa: E731
    mk_te = lambda: build()[2]  # noqa: E731
    unet_peft_layers = [(n, m.in_features, m.out_features) for n, m in unet.named_modules()
                        if isinstance(m, torch.nn.Linear) and any(n.endswith("." + t) for t in PEFT_UNET_TARGETS)]
    te_peft_layers = [(n, m.in_features, m.out_features) for n, m in te.named_modules()
                      if isinstance(m, torch.nn.Linear) and any(n.endswith("." + t) for t in PEFT_TE_TARGETS)]
    unet_kohya = kohya_layers(unet, {"Transformer2DModel"})
    te_kohya = kohya_layers(te, {"CLIPAttention", "CLIPSdpaAttention", "CLIPFlashAttention2", "CLIPMLP"})
    assert len(unet_peft_layers) == 128 and len(te_peft_layers) == 48, (len(unet_peft_layers), len(te_peft_layers))
    assert len(unet_kohya) == 192 and len(te_kohya) == 72, (len(unet_kohya), len(te_kohya))
    for r in RANKS:
        n_u, k_u = lora_peft(mk_unet, PEFT_UNET_TARGETS, r, True)
        n_t, k_t = lora_peft(mk_te, PEFT_TE_TARGETS, r, False)
        assert k_u == len(unet_peft_layers) and n_u == sum(r * (i + o) for _, i, o in unet_peft_layers)
        assert k_t == len(te_peft_layers) and n_t == sum(r * (i + o) for _, i, o in te_peft_layers)
        n_uk = sum(r * (i + o) for _, i, o in unet_kohya)
        n_tk = sum(r * (i + o) for _, i, o in te_kohya)
        # the same layers through peft (full module names as targets; 1x1 convs get 1x1 LoRA convs)
        assert lora_peft(mk_unet, [n for n, _, _ in unet_kohya], r, True) == (n_uk, len(unet_kohya))
        assert lora_peft(mk_te, [n for n, _, _ in te_kohya], r, False) == (n_tk, len(te_kohya))
        print(f"r={r}: LoRA unet peft {len(unet_peft_layers)} layers {n_u:>9} | unet kohya {len(unet_kohya)} layers "
              f"{n_uk:>9} | text q/k/v/out peft {len(te_peft_layers)} layers {n_t:>8} | text kohya "
              f"{len(te_kohya)} layers {n_tk:>8}")

    os.makedirs(outdir, exist_ok=True)
    venc = [("encoder." + n, p) for n, p in vae.encoder.named_parameters()] + \
           [("quant_conv." + n, p) for n, p in vae.quant_conv.named_parameters()]
    for tag, named in (("unet", list(unet.named_parameters())), ("vae_encoder", venc),
                       ("text_encoder", [(clip_name(n), p) for n, p in te.named_parameters()])):
        path = os.path.join(outdir, f"sd15_params_{tag}.txt")
        size = write_listing(path, named)
        total = sum(p.numel() for _, p in named)
        print(f"wrote {path}: {len(named)} parameters, {total} values, {size} bytes")


if __name__ == "__main__":
    main()
