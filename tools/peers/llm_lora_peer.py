#!/usr/bin/env python3
"""PyTorch peer of the llm-lora step: Hugging Face's MistralForCausalLM with the engine's
dimensions (the case passes them: vocab, dim, layers, heads, kv_heads, head_dim, ffn,
rope_theta, norm_eps; tie_embed and qkv_bias for the families of --model-config: a tied
head, and Qwen2ForCausalLM for q/k/v biases; model_type, a --model-config's: LlamaForCausalLM
for "llama", Qwen2ForCausalLM for "qwen2"), SDPA attention, no sliding window (the engine
attends over the whole causal window); the rung's dtypes (fp32; fp16/bf16 as autocast with
fp32 master weights, GradScaler for fp16; a LoRA base stored in the frozen dtype), PEFT LoRA
on the same linears with the same rank and alpha (no dropout), per-layer gradient
checkpointing when the rung has it, the rung's optimizer (AdamW, SGD, Adafactor) with the
engine's hyper-parameters, clipping by global norm, the same threads, batch and fixed
sequence length (random tokens, the labels the inputs: HF shifts them). Gradients are set to
None after each step, as PyTorch does by default. Protocol and memory: peer_common.py.

  python3 tools/peers/llm_lora_peer.py --config '{"batch": 8, "seq": 128, ...}' --steps 5

An NF4 base (QLoRA) is bitsandbytes' Linear4bit in place of every linear of the layers (NF4,
double quantisation, blocks of 64, uint8 storage, the compute dtype the rung's: what
transformers' BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True) loads; the embedding, norms and head stay unquantised in the
compute dtype, as the engine keeps them; no prepare_model_for_kbit_training, whose fp32 casts
and checkpointing the engine's rung does not have). bitsandbytes >= 0.46 runs it on the CPU too.

train.sdpa "math" (for traces only: the case never sets it) runs the step under
sdpa_kernel(SDPBackend.MATH): SDPA's math kernel, which CUDA takes by itself for an fp32 step
with grouped KV heads (PyTorch 2.11), traced on the CPU (tests/fixtures/trace/llm-base-math-real).

Refused (an error reply, the case then says "not measured here"): an NF4 base without
bitsandbytes, and a half-precision base under fp32 compute."""
import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402

TARGETS = {"qkvo": ["q_proj", "k_proj", "v_proj", "o_proj"],
           "all": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def family(m):
    """The transformers family of the model: its model_type (a --model-config's), else Qwen2
    when the case says qkv_bias (q/k/v biases), else Mistral (the scales' presets)."""
    return m.get("model_type") or ("qwen2" if m.get("qkv_bias") else "mistral")


def classes(m):
    """(config class, model class) of the model's family."""
    import transformers as tf
    return {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
            "mistral": (tf.MistralConfig, tf.MistralForCausalLM)}[family(m)]


def mistral_config(m, seq):
    """The model's transformers config in its family's class (Llama's: no q/k/v/o or MLP
    biases; Qwen2's: q/k/v biases), no sliding window; tie_embed: the head is the embedding
    (Llama 3.2, the small Qwen2.5). A config's rope scaling (Llama 3.1's "llama3") is not
    passed: it changes the rotary frequencies at build time, not a step's tensors."""
    fam = family(m)
    Config = classes(m)[0]
    kw = dict(vocab_size=m["vocab"], hidden_size=m["dim"], intermediate_size=m["ffn"],
              num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
              num_key_value_heads=m["kv_heads"], head_dim=m["head_dim"], hidden_act="silu",
              max_position_embeddings=max(seq, 32), rms_norm_eps=m["norm_eps"],
              tie_word_embeddings=bool(m.get("tie_embed")), use_cache=False, attention_dropout=0.0)
    if fam == "qwen2":
        kw.update(use_sliding_window=False, sliding_window=None)
    elif fam == "llama":
        kw.update(attention_bias=False, mlp_bias=False)
    else:
        kw["sliding_window"] = None
    if "rope_parameters" in inspect.signature(Config.__init__).parameters:  # transformers >= 5
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": m["rope_theta"]}
    else:
        kw["rope_theta"] = m["rope_theta"]
    return Config(**kw)


def quantize_nf4(torch, model, dtype, dev):
    """Every linear of the layers as bitsandbytes' Linear4bit (NF4, double quantisation): the
    weight quantised from the model's own values when it moves to dev, as from_pretrained with
    BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype) loads it."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise ValueError("unsupported: an NF4 base (QLoRA) needs bitsandbytes (pip install bitsandbytes)")
    for layer in model.model.layers:
        for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                              (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for n in names:
                lin = getattr(parent, n)
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                      compute_dtype=dtype, compress_statistics=True, quant_type="nf4",
                                      quant_storage=torch.uint8, device="meta")
                q.weight = bnb.nn.Params4bit(lin.weight.data.to(dtype), requires_grad=False,
                                             compress_statistics=True, quant_type="nf4",
                                             quant_storage=torch.uint8, module=q)
                if lin.bias is not None:
                    q.bias = torch.nn.Parameter(lin.bias.data.to(dtype), requires_grad=False)
                setattr(parent, n, q.to(dev))
    # what transformers' Bnb4BitHfQuantizer sets on the model it loads: PEFT reads
    # is_loaded_in_4bit to put its bitsandbytes LoRA layer (lora.bnb.Linear4bit) on these
    model.is_quantized = True
    model.quantization_method = "bitsandbytes"
    model.is_loaded_in_4bit = True
    return model


def make(torch, mem, cfg):
    """The step of cfg, built on cfg's device (model, optimizer, batch; st.micro the loss of
    one micro-batch), nothing run: build() and tools/peers/memtracker_peer.py share it."""
    t = cfg["train"]
    if t["lora_rank"] > 0 and t["frozen"] in ("fp16", "bf16") and t["compute"] == "fp32":
        raise ValueError(f"unsupported: a {t['frozen']} base under fp32 compute")
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg["seed"])
    st = peer_common.Stepper(torch, mem, cfg)
    dev = st.device
    with torch.device(dev):  # built where it trains: a 7B model initialised on a GPU, not the host
        Model = classes(cfg["model"])[1]
        model = Model._from_config(mistral_config(cfg["model"], cfg["seq"]), attn_implementation="sdpa")
    if t["lora_rank"] > 0 and t["frozen"] in ("fp16", "bf16"):
        model = model.to(torch.float16 if t["frozen"] == "fp16" else torch.bfloat16)
    if t["frozen"] == "nf4":  # the rest of the base in the compute dtype
        dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[t["compute"]]
        model = quantize_nf4(torch, model.to(dt), dt, dev)
    model = model.to(dev)
    if t["checkpoint"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if t["lora_rank"] > 0:
        from peft import LoraConfig, get_peft_model
        lc = LoraConfig(r=t["lora_rank"], lora_alpha=t["lora_alpha"], lora_dropout=0.0, bias="none",
                        target_modules=TARGETS[t["lora_targets"]], task_type="CAUSAL_LM")
        model = get_peft_model(model, lc)  # adapters in fp32 (autocast_adapter_dtype)
    model.train()
    st.amp(t["compute"])
    st.trainable = [p for p in model.parameters() if p.requires_grad]
    st.opt = st.optimizer(st.trainable, t)
    g = torch.Generator().manual_seed(cfg["seed"] + 1000)
    x = torch.randint(0, cfg["model"]["vocab"], (cfg["batch"], cfg["seq"]), generator=g).to(dev)
    st.micro = lambda: model(input_ids=x, labels=x).loss
    if t.get("sdpa") == "math":  # SDPA's math kernel: what CUDA runs for an fp32 step with grouped KV heads
        from torch.nn.attention import SDPBackend, sdpa_kernel  # (PyTorch 2.11), traced on the CPU

        def micro():  # closes over the batch, as peer_common.before_step reads it
            with sdpa_kernel(SDPBackend.MATH):
                return model(input_ids=x, labels=x).loss
        st.micro = micro
    st.model = model
    return st


def build(torch, mem, cfg):
    st = make(torch, mem, cfg)
    ready = st.ready(st.model)
    ready["tokens_per_step"] = cfg["batch"] * cfg["seq"] * cfg["train"]["accum"]
    return st, ready


if __name__ == "__main__":
    peer_common.run(build, __doc__, needs=("transformers", "peft"))
