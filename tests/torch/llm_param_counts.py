#!/usr/bin/env python3
"""Parameter counts of llm-lora's model configs (cases/llm-lora/configs/*.json) from the real
transformers classes (AutoModelForCausalLM.from_config on torch's meta device: no weights,
no download), full fine-tune and PEFT LoRA as the ladder's lora rung (r = 8 on q, k, v, o,
bias "none"), into tests/fixtures/llm_param_counts.json, which test_llm_config compares with
the engine's counts at full size (a tied head is one parameter: counted once, as
model.parameters() yields it once).

  /work/venv-torch/bin/python tests/torch/llm_param_counts.py [output]"""
import json
import os
import sys

import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = ["mistral-7b", "llama-3-8b", "llama-3.2-1b", "llama-3.2-3b", "qwen2.5-0.5b", "qwen2.5-7b"]


def counts(model):
    ps = list(model.parameters())  # a tied parameter once
    return sum(p.numel() for p in ps), sum(p.numel() for p in ps if p.requires_grad)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "llm_param_counts.json")
    res = {"generator": "tests/torch/llm_param_counts.py", "torch": torch.__version__,
           "transformers": transformers.__version__, "lora": {"r": 8, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
           "configs": {}}
    for name in CONFIGS:
        with open(os.path.join(ROOT, "cases", "llm-lora", "configs", name + ".json")) as f:
            d = json.load(f)
        cfg = AutoConfig.for_model(**d)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        total, _ = counts(model)
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        lc = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, bias="none",
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
        lt, ltr = counts(get_peft_model(model, lc))
        res["configs"][name] = {"class": type(model).__name__, "tied": tied, "params_total": total,
                                "lora_params_total": lt, "lora_params_trainable": ltr}
        print(f"{name:14s} {type(model).__name__:20s} tied={tied!s:5s} {total:>12d}  lora {lt:>12d} / {ltr:>9d}")
    with open(out, "w") as f:
        f.write(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
