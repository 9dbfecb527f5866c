#!/usr/bin/env python3
"""What PyTorch's SDPA does on this GPU, measured: for a 7B-like attention (batch 4, length 512,
32 query heads of 128, causal) in fp16 and fp32, with 8 KV heads (enable_gqa) and with 32, the
kernel PyTorch picks (torch._fused_sdp_choice) and the bytes its forward keeps and its backward
makes beyond the three gradients (torch.cuda.max_memory_allocated, on the second of two steps:
cuBLAS's workspace is taken on the first). The mimic's assumptions beside them
(engine/mimic/hf_llm.c, tape.c):
  fp16: flash attention; its backward makes softmax_d (B*H*Tq rounded up to 128, fp32), dq_accum
        (B*Tq rounded*H*hd, fp32) and, with grouped KV heads, dK and dV at every query head
        (`mimic_bw_extra_bytes`, mt_flash_bw_buffers, read from PyTorch's FlashAttention-2 source)
  fp32 with grouped KV heads: the math kernel (PyTorch 2.11: flash takes fp16/bf16 only, the
        memory-efficient kernel no grouped heads)
Prints one JSON object; without a CUDA device {"not_measured": ...} (exit 0).

  python3 tools/gpu/sdpa_probe.py > results/sdpa-probe.json
"""
import json
import sys


def main():
    try:
        import torch
    except ImportError:
        print(json.dumps({"not_measured": "no PyTorch"}))
        return 0
    out = {"torch": torch.__version__}
    if not torch.cuda.is_available():
        out["not_measured"] = "no CUDA device"
        print(json.dumps(out))
        return 0
    out["device"] = torch.cuda.get_device_name()
    out["capability"] = list(torch.cuda.get_device_capability())
    names = {int(v): k for k, v in torch.nn.attention.SDPBackend.__members__.items()}
    B, T, H, hd = 4, 512, 32, 128
    rows = []
    for dtype in (torch.float16, torch.float32):
        for kv in (8, 32):
            row = {"dtype": str(dtype).replace("torch.", ""), "B": B, "T": T, "H": H, "KV": kv, "hd": hd}
            try:
                q = torch.randn(B, H, T, hd, device="cuda", dtype=dtype, requires_grad=True)
                k = torch.randn(B, kv, T, hd, device="cuda", dtype=dtype, requires_grad=True)
                v = torch.randn(B, kv, T, hd, device="cuda", dtype=dtype, requires_grad=True)
                gqa = kv != H
                choice = torch._fused_sdp_choice(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                                                 enable_gqa=gqa)
                row["backend"] = names.get(int(choice), str(choice))
                esz = q.element_size()
                grads = (q.numel() + k.numel() + v.numel()) * esz
                for _ in range(2):  # the second step is measured
                    q.grad = k.grad = v.grad = None
                    torch.cuda.synchronize()
                    m0 = torch.cuda.memory_allocated()
                    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
                    g = torch.ones_like(o)
                    torch.cuda.synchronize()
                    kept = torch.cuda.memory_allocated() - m0 - 2 * o.numel() * esz  # less o and g
                    torch.cuda.reset_peak_memory_stats()
                    m1 = torch.cuda.memory_allocated()
                    o.backward(g)
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated() - m1
                    del o, g
                row["fwd_kept_bytes"] = kept  # what autograd keeps beyond the output (lse, ...)
                row["bw_peak_bytes"] = peak  # the backward's highest, above what existed before it
                row["bw_extra_bytes"] = peak - grads  # beyond dq, dk, dv
                tq, hdr = (T + 127) // 128 * 128, (hd + 31) // 32 * 32
                extra = B * H * tq * 4 + B * tq * H * hdr * 4 + (2 * B * T * H * hd * esz if gqa else 0)
                row["mimic_bw_extra_bytes"] = extra if dtype == torch.float16 else None
            except Exception as e:  # a finding, not the end of the probe
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            torch.cuda.empty_cache()
    out["cases"] = rows
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
