#!/usr/bin/env python3
"""Build tests/fixtures/ddp_buckets.json: PyTorch's own DDP bucket assignment for several
parameter lists, read by tests/test_ddp.c (vl_ddp_assign_buckets must equal it exactly).

What DDP does (torch/nn/parallel/distributed.py, _ddp_init_helper): it calls
torch.distributed._compute_bucket_assignment_by_size(parameters, [first_cap, cap], ...)
over model.parameters() (the trainable ones) in their order, then hands
list(reversed(bucket_indices)) to its Reducer, so the bucket holding the last parameters
(whose gradients backward produces first) is reduced first. The C function returns, per
tensor, its bucket in that reduced order. The assignment depends only on each tensor's
bytes (numel * element_size; one dtype and device here: fp32 gradients) and the limits:
a bucket closes as soon as its size reaches its limit, the first limit applies to the
first bucket only.

(In torch 2.x with the default find_unused_parameters=False, DDP's constructor starts
with one bucket and its Reducer rebuilds the buckets after the first iteration from the
order the gradients became ready, with the same [first_cap, cap] limits; the assignment
above is what DDP uses with find_unused_parameters=True, every iteration.)

Lists (bytes of fp32 tensors, in the C models' parameter order):
  - mistral-tiny, mistral-small: the trainable parameters of vl_model_mistral (full
    fine-tune): embed; per layer norm1, norm2, q, k, v, o, gate, up, down; norm; lm_head.
  - resunet-tiny, -small, -full: the trainable parameters of vl_model_resunet, read from a
    torch module tree that mirrors torchvision's ResNet-101 (Bottleneck attribute order
    conv1, bn1, conv2, bn2, conv3, bn3, downsample) and the U-Net decoder, on the meta
    device (no memory); the script checks that this is also the C model's creation order.
  - synthetic lists (seeded sizes, a tensor exactly at a limit, one larger than the cap).
Each with the default caps (1 MiB first, 25 MiB) and other caps.

Format: {"torch": version, "lists": {name: [bytes of each tensor]}, "cases": [{"list": name,
"first_cap": bytes, "cap": bytes, "buckets": [[tensor indices] in reduction order]}]}.

Usage: python3 tests/torch/make_ddp_buckets.py [output path]
"""
import json
import random
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

MiB = 1 << 20


# ---- Mistral: the C model's order (vl_model_mistral, engine/models/mistral.c) ----------------
MISTRAL = {  # vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn
    "tiny": (256, 64, 2, 4, 2, 16, 128),
    "small": (4096, 256, 4, 8, 2, 32, 896),
}


def mistral_numels(scale):
    V, C, L, H, KVH, D, F = MISTRAL[scale]
    out = [V * C]
    for _ in range(L):
        out += [C, C]  # norm1, norm2
        out += [H * D * C, KVH * D * C, KVH * D * C, C * H * D]  # q, k, v, o
        out += [F * C, F * C, C * F]  # gate, up, down
    out += [C, V * C]  # norm, lm_head
    return out


# ---- the ResNet-101 U-Net as torch modules (meta device) ---------------------------------------
RESUNET = {  # width, dec, classes (blocks 3, 4, 23, 3; 3 input channels)
    "tiny": (4, (16, 8, 4, 2, 2), 5),
    "small": (16, (64, 32, 16, 8, 4), 5),
    "full": (64, (256, 128, 64, 32, 16), 5),
}


class Bottleneck(nn.Module):  # torchvision's attribute order (v1.5)
    def __init__(self, cin, planes, stride, ds):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = ds


class Unit(nn.Module):  # the decoder's conv3x3-BN-ReLU
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(cout)


class ResUNet(nn.Module):
    def __init__(self, width, dec, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        cin = width
        for s, n in enumerate((3, 4, 23, 3)):
            planes, blocks = width << s, []
            for b in range(n):
                stride = 2 if (b == 0 and s > 0) else 1
                ds = None
                if b == 0:
                    ds = nn.Sequential(nn.Conv2d(cin, planes * 4, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
                blocks.append(Bottleneck(cin, planes, stride, ds))
                cin = planes * 4
            setattr(self, "layer%d" % (s + 1), nn.Sequential(*blocks))
        skips = (width * 16, width * 8, width * 4, width, 0)
        self.decoder = nn.ModuleList()
        for d in range(5):
            self.decoder.append(nn.Sequential(Unit(cin + skips[d], dec[d]), Unit(dec[d], dec[d])))
            cin = dec[d]
        self.head = nn.Conv2d(cin, classes, 3, 1, 1, bias=False)


def resunet_numels(scale):
    with torch.device("meta"):
        net = ResUNet(*RESUNET[scale])
    return [p.numel() for p in net.parameters() if p.requires_grad]


def resunet_numels_c_order(scale):
    """engine/models/resunet.c build(): per unit conv (cout, cin k k), bn weight, bn bias."""
    width, dec, classes = RESUNET[scale]
    out = []

    def unit(cin, cout, k):
        out.extend([cout * cin * k * k, cout, cout])

    unit(3, width, 7)
    cin = width
    for s, n in enumerate((3, 4, 23, 3)):
        planes = width << s
        for b in range(n):
            unit(cin, planes, 1)
            unit(planes, planes, 3)
            unit(planes, planes * 4, 1)
            if b == 0:
                unit(cin, planes * 4, 1)
            cin = planes * 4
    skips = (width * 16, width * 8, width * 4, width, 0)
    for d in range(5):
        unit(cin + skips[d], dec[d], 3)
        unit(dec[d], dec[d], 3)
        cin = dec[d]
    out.append(classes * cin * 9)
    return out


# ---- PyTorch's assignment ---------------------------------------------------------------------
def ddp_buckets(numels, first_cap, cap):
    """The buckets DDP's Reducer gets, in reduction order (lists of tensor indices)."""
    tensors = [torch.empty(n, dtype=torch.float32, device="meta") for n in numels]
    limits = [first_cap, cap]  # as DDP passes them (torch 2.x: [cap] alone when first == cap)
    indices, _ = dist._compute_bucket_assignment_by_size(tensors, limits)
    return [list(b) for b in reversed(indices)]


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/ddp_buckets.json"
    for scale in RESUNET:
        if resunet_numels(scale) != resunet_numels_c_order(scale):
            sys.exit("resunet-%s: torch parameters() order differs from the C model's" % scale)
    lists = {"mistral-%s" % s: mistral_numels(s) for s in MISTRAL}
    lists.update({"resunet-%s" % s: resunet_numels(s) for s in RESUNET})
    rng = random.Random(12)
    lists["synthetic-mixed"] = [rng.choice([1, 7, 64, 1000, 65536, 262144, 300000, 2000000,
                                            7000000]) for _ in range(60)]
    lists["synthetic-at-limits"] = [MiB // 4, 1, MiB // 4 - 1, 25 * MiB // 4, 8 * MiB, 3,
                                    40 * MiB // 4, 5, 25 * MiB // 4 - 1, 1, 2]
    caps = [(1 * MiB, 25 * MiB), (25 * MiB, 25 * MiB), (256 << 10, 4 * MiB),
            (64 << 10, 64 << 10), (4 << 10, 16 << 10), (100000, 333333), (4 * MiB, 1 * MiB)]
    cases = []
    for name, numels in lists.items():
        for first_cap, cap in caps:
            cases.append({"list": name, "first_cap": first_cap, "cap": cap,
                          "buckets": ddp_buckets(numels, first_cap, cap)})
    with open(out_path, "w") as f:
        f.write('{"torch": "%s",\n"lists": {\n' % torch.__version__)
        f.write(",\n".join('"%s": %s' % (name, json.dumps([4 * n for n in numels],
                                                          separators=(",", ":")))
                           for name, numels in lists.items()))
        f.write('},\n"cases": [\n')
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")
    print("%s: %d cases" % (out_path, len(cases)))


if __name__ == "__main__":
    main()
