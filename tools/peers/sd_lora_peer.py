#!/usr/bin/env python3
"""PyTorch peer of the sd-lora step: diffusers' UNet2DConditionModel with the engine's
dimensions at the scale (the case passes them: block_out_channels, which down and up blocks
have cross-attention, layers_per_block, heads, norm_num_groups, sample_size, in/out channels,
the context's length and width = cross_attention_dim; the rest SD 1.5's config:
flip_sin_to_cos, freq_shift 0, GroupNorm eps 1e-5 in the resnets and 1e-6 in the
transformers, 1x1-conv proj_in/proj_out), frozen in the rung's precision, PEFT LoRA
(LoraConfig(r, lora_alpha, init_lora_weights="gaussian", target_modules ["to_q", "to_k",
"to_v", "to_out.0"]) + unet.add_adapter: attn1 and attn2 of every transformer block, as
diffusers' train_text_to_image_lora.py), the LoRA factors in fp32 (the script's
cast_training_params), fp16/bf16 as autocast with GradScaler for fp16. The step is the
script's: DDPMScheduler(scaled_linear, 0.00085 -> 0.012, 1000 steps).add_noise of the
latents at random timesteps, the U-Net's noise prediction, F.mse_loss(pred.float(), noise)
over the batch, AdamW on the LoRA factors with the engine's hyper-parameters, the gradient
norm clipped; per-resnet and per-transformer-block checkpointing
(unet.enable_gradient_checkpointing) when the rung checkpoints; attention: the rung's
"efficient" is diffusers' default AttnProcessor2_0 (SDPA), "classic" AttnProcessor
(materialised scores, baddbmm + softmax).

Inputs (random, fixed for the run, as the engine's side gets them): a cached rung's latents
(B, 4, h, w) and text embeddings (B, L, D), as the engine reads them from its caches; an
uncached rung (model.encoders_in_step) runs the frozen encoders in every step, like the
engine: diffusers' AutoencoderKL encoder + quant_conv at the engine's VAE scale (decoder and
post_quant_conv deleted: the engine has none), latent_dist.sample() x scaling factor, and
transformers' CLIPTextModel (quick_gelu, causal) last_hidden_state, both under no_grad, on
images (B, 3, H, W) in [-1, 1) and token ids (B, L). Gradients are set to None after each
step, as PyTorch does by default. Protocol and memory: peer_common.py.

  python3 tools/peers/sd_lora_peer.py --config "$(vramlab peer-config sd-lora --step disk_cache | ...)" --steps 2

Refused (an error reply, the case then says "not measured here"): LoRA on the text encoder
(text_lora_rank > 0; no rung of the ladder trains it) and a frozen base whose dtype is not
the compute dtype (the engine's `precision` sets both)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def unet_config(u):
    """UNet2DConditionModel's config for the engine's vl_sd_unet_cfg (as the case passes it).
    `attention_head_dim` is the NUMBER of heads in this class (SD 1.5's naming quirk: passed
    on as num_attention_heads; tests/torch/sd_param_counts.py checks it)."""
    down = tuple("CrossAttnDownBlock2D" if a else "DownBlock2D" for a in u["down_attn"])
    up = tuple("CrossAttnUpBlock2D" if a else "UpBlock2D" for a in u["up_attn"])
    return dict(sample_size=u["sample"], in_channels=u["in_ch"], out_channels=u["out_ch"],
                block_out_channels=tuple(u["block_out_channels"]), layers_per_block=u["layers"],
                cross_attention_dim=u["ctx_dim"], attention_head_dim=u["heads"], down_block_types=down,
                up_block_types=up, norm_num_groups=u["groups"], norm_eps=u["norm_eps"], act_fn="silu",
                flip_sin_to_cos=True, freq_shift=0, center_input_sample=False, downsample_padding=1,
                mid_block_scale_factor=1)


def vae_encoder(torch, v):
    """AutoencoderKL at the engine's VAE scale, its decoder side removed (the engine builds
    the encoder and quant_conv only)."""
    from diffusers import AutoencoderKL
    n = len(v["block_out_channels"])
    vae = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=tuple(v["block_out_channels"]),
                        layers_per_block=v["layers_per_block"], down_block_types=("DownEncoderBlock2D",) * n,
                        up_block_types=("UpDecoderBlock2D",) * n, latent_channels=v["latent_ch"],
                        norm_num_groups=v["groups"], act_fn="silu", sample_size=v["image"],
                        scaling_factor=v["scale"], mid_block_add_attention=bool(v["mid_attn"]))
    del vae.decoder, vae.post_quant_conv
    return vae


def text_encoder(c, attention):
    from transformers import CLIPTextConfig, CLIPTextModel
    cfg = CLIPTextConfig(vocab_size=c["vocab"], hidden_size=c["dim"], intermediate_size=c["ffn"],
                         num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                         max_position_embeddings=c["n_pos"], hidden_act="quick_gelu", layer_norm_eps=c["eps"],
                         attention_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    # eos_token_id 2: the pooled output's legacy argmax (no output of it is used here); token
    # ids inside the scale's vocabulary
    return CLIPTextModel._from_config(cfg, attn_implementation="sdpa" if attention == "efficient" else "eager")


def make(torch, mem, cfg):
    """The step of cfg, built on cfg's device (model, optimizer, batch; st.micro the loss of
    one micro-batch), nothing run: build() and tools/peers/memtracker_peer.py share it."""
    import torch.nn.functional as F
    from diffusers import DDPMScheduler, UNet2DConditionModel
    from diffusers.models.attention_processor import AttnProcessor
    from peft import LoraConfig

    m, t = cfg["model"], cfg["train"]
    if t.get("text_lora_rank", 0) > 0:
        raise ValueError("unsupported: LoRA on the text encoder (text_lora_rank > 0)")
    if t["frozen"] != t["compute"]:
        raise ValueError(f"unsupported: a {t['frozen']} base under {t['compute']} compute")
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg["seed"])
    st = peer_common.Stepper(torch, mem, cfg)
    dev = st.device
    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[t["frozen"]]
    classic = t["attention"] == "classic"
    enc = bool(m["encoders_in_step"])
    with torch.device(dev):
        unet = UNet2DConditionModel(**unet_config(m["unet"]))
        vae = vae_encoder(torch, m["vae"]) if enc else None
        clip = text_encoder(m["clip"], t["attention"]) if enc else None
    frozen = [x for x in (unet, vae, clip) if x is not None]
    for x in frozen:
        x.requires_grad_(False)
        if dt != torch.float32:
            x.to(dt)
    if classic:  # diffusers' default is AttnProcessor2_0 (SDPA)
        unet.set_attn_processor(AttnProcessor())
        if vae is not None:
            vae.set_attn_processor(AttnProcessor())
    if t["checkpoint"]:
        unet.enable_gradient_checkpointing()
    unet.add_adapter(LoraConfig(r=t["lora_rank"], lora_alpha=t["lora_alpha"], init_lora_weights="gaussian",
                                target_modules=TARGETS, lora_dropout=0.0, bias="none"))
    st.trainable = [p for p in unet.parameters() if p.requires_grad]
    if dt != torch.float32:  # the script's cast_training_params: LoRA masters in fp32
        for p in st.trainable:
            p.data = p.data.float()
    unet.train()
    st.amp(t["compute"])
    st.opt = st.optimizer(st.trainable, t)
    sched = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                          num_train_timesteps=1000)
    u, B = m["unet"], cfg["batch"]
    g = torch.Generator().manual_seed(cfg["seed"] + 1000)
    lat_shape = (B, u["in_ch"], u["sample"], u["sample"])
    noise = torch.randn(lat_shape, generator=g).to(dev)
    steps = torch.randint(0, sched.config.num_train_timesteps, (B,), generator=g).to(dev)
    if enc:
        side = m["vae"]["image"]
        images = (torch.rand((B, 3, side, side), generator=g) * 2 - 1).to(device=dev, dtype=dt)
        tokens = torch.randint(0, m["clip"]["vocab"], (B, u["ctx_len"]), generator=g).to(dev)
    else:
        latents = torch.randn(lat_shape, generator=g).to(dev)
        context = torch.randn((B, u["ctx_len"], u["ctx_dim"]), generator=g).to(dev)

    def micro():
        if enc:  # the frozen encoders in the step (no cache): nothing kept for backward
            with torch.no_grad():
                lat = vae.encode(images).latent_dist.sample() * vae.config.scaling_factor
                ctx = clip(tokens).last_hidden_state
        else:
            lat, ctx = latents, context
        noisy = sched.add_noise(lat, noise, steps)
        pred = unet(noisy, steps, ctx).sample
        return F.mse_loss(pred.float(), noise.float(), reduction="mean")

    class Whole(torch.nn.Module):  # the step's modules as one (parameter counts, MemTracker)
        def __init__(self):
            super().__init__()
            self.unet = unet
            if enc:
                self.vae, self.clip = vae, clip

    st.micro = micro
    st.model = Whole()
    return st


def build(torch, mem, cfg):
    st = make(torch, mem, cfg)
    ready = st.ready(st.model)
    ready["images_per_step"] = cfg["batch"] * cfg["train"]["accum"]
    return st, ready


if __name__ == "__main__":
    peer_common.run(build, __doc__, needs=("diffusers", "transformers", "peft"))
