#!/usr/bin/env python3
"""PyTorch peer of the seg-ckpt step: the ResNet U-Net of tests/torch/make_resunet_fixture.py
(torchvision's own Bottleneck blocks, the engine-parity model; imported, its sizes set from
the case: image, width, blocks, decoder widths, classes, BN eps and momentum) trained on the
same batch shape: random images (B, 3, H, W) and per-pixel classes, pixel cross-entropy,
the rung's optimizer (AdamW: the engine's Adam with no weight decay), fp32 or autocast
(GradScaler for fp16), torch.utils.checkpoint (non-reentrant) around every bottleneck block
when the rung checkpoints (the engine's unit; PyTorch's re-run updates BN statistics once
more, the engine's does not), the bottlenecks' ReLU in place or not as the rung says (the
fixture's stem and decoder ReLUs are out of place either way), accumulation, the same
threads. NCHW, PyTorch's default. Protocol and memory: peer_common.py.

  python3 tools/peers/seg_peer.py --config '{"batch": 8, "model": {"image": 128, ...}}'"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "torch"))
import peer_common  # noqa: E402


def make(torch, mem, cfg):
    """The step of cfg, built on cfg's device (model, optimizer, batch; st.micro the loss of
    one micro-batch), nothing run: build() and tools/peers/memtracker_peer.py share it."""
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint
    import make_resunet_fixture as fx  # the engine-parity model, sized by its module constants

    m, t = cfg["model"], cfg["train"]
    fx.IN_CH, fx.WIDTH, fx.BLOCKS, fx.DEC = 3, m["width"], tuple(m["blocks"]), tuple(m["dec"])
    fx.CLASSES, fx.EPS, fx.MOM = m["classes"], m["bn_eps"], m["bn_momentum"]
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg["seed"])
    st = peer_common.Stepper(torch, mem, cfg)
    with torch.device(st.device):
        net = fx.Net()

    class Ckpt(torch.nn.Module):  # one bottleneck re-run in backward
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    for layer in net.layers:
        for i in range(len(layer)):
            layer[i].relu.inplace = bool(t["relu_inplace"])
            if t["checkpoint"]:
                layer[i] = Ckpt(layer[i])
    net = net.to(st.device).train()
    st.amp(t["compute"])
    st.trainable = [p for p in net.parameters() if p.requires_grad]
    st.opt = st.optimizer(st.trainable, t)
    g = torch.Generator().manual_seed(cfg["seed"] + 77)
    size = (cfg["batch"], 3, m["image"], m["image"])
    x = torch.randn(size, generator=g).to(st.device)
    y = torch.randint(0, m["classes"], (cfg["batch"], m["image"], m["image"]), generator=g).to(st.device)
    st.micro = lambda: F.cross_entropy(net(x).float(), y)
    st.model = net
    return st


def build(torch, mem, cfg):
    st = make(torch, mem, cfg)
    ready = st.ready(st.model)
    ready["images_per_step"] = cfg["batch"] * cfg["train"]["accum"]
    return st, ready


if __name__ == "__main__":
    peer_common.run(build, __doc__, needs=("torchvision",))
