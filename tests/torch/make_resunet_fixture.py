#!/usr/bin/env python3
"""Build tests/fixtures/resunet_parity.bin: a float64 PyTorch reference of one ResNet U-Net
training forward + backward, read by tests/test_resunet.c (test_parity).

The encoder is made of torchvision's own Bottleneck blocks (torchvision.models.resnet,
v1.5: stride on the 3x3 conv, 1x1 downsample conv + BN), the stem is ResNet's (7x7/2 conv,
BN, ReLU, 3x3/2 max pool); the decoder is the U-Net of engine/include/vramlab/resunet.h:
per block, F.interpolate(scale_factor=2, mode='bilinear', align_corners=False), cat([up,
skip], dim=1), two conv3x3-BN-ReLU; head conv3x3 without bias; loss F.cross_entropy (mean
over pixels). Batch norm in training mode (eps 1e-5, momentum 0.1). A reduced depth
(blocks 2,1,2,1) and width keep the file small; 64x64 inputs keep batch norm at 1/32 resolution
over more than 2 values (over 2, float32 rounding in x1 - x2 is amplified without bound). The
C test builds the same configuration.

Weights (conv: kaiming-normal fan_out; BN gamma 1 + 0.1 N(0,1), beta 0.1 N(0,1)) and the
input are drawn in float64 and rounded to float32 (what the C model loads); the reference
computes in float64 from the rounded values.

Binary format (little-endian), version 1:
  char[8]   magic "VLRESUNT"
  uint32    version (1)
  uint32    n_params
  int64[12] image, in_ch, width, blocks[4], dec[5]
  int64     classes
  float32   bn_eps, bn_momentum
  int64     B
  float32[B*in_ch*image*image] x
  int32[B*image*image] y
  n_params records, in the C model's parameter order:
    char[48] name (the C model's vl_param.name), int64 rows, cols,
    float32[rows*cols] weight, float32[rows*cols] gradient of the mean loss
  uint32    n_bn; n_bn records in the same order (one per BN):
    char[48] name of its weight parameter, int64 channels,
    float32[channels] running_mean, float32[channels] running_var (after the step)
  float64   loss
  char[8]   "VLRESEND"

Usage: python3 tests/torch/make_resunet_fixture.py [output path]
Before writing, it checks that wrong conventions (align_corners=True, [skip, up] order,
the v1 stride on the first 1x1 conv) each move the loss by > 1e-4."""
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.resnet import Bottleneck

IMAGE, IN_CH, WIDTH, BLOCKS, DEC, CLASSES, B = 64, 3, 4, (2, 1, 2, 1), (16, 8, 4, 2, 2), 5, 2
EPS, MOM = 1e-5, 0.1


class Unit(nn.Module):  # conv3x3-BN-ReLU of the decoder
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=EPS, momentum=MOM)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self, align=False, skip_first=False, v1=False):
        super().__init__()
        self.align, self.skip_first = align, skip_first
        self.conv1 = nn.Conv2d(IN_CH, WIDTH, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(WIDTH, eps=EPS, momentum=MOM)
        self.layers = nn.ModuleList()
        cin = WIDTH
        for s, n in enumerate(BLOCKS):
            planes = WIDTH << s
            blocks = []
            for b in range(n):
                stride = 2 if (b == 0 and s > 0) else 1
                ds = None
                if b == 0:
                    ds = nn.Sequential(nn.Conv2d(cin, planes * 4, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * 4, eps=EPS, momentum=MOM))
                blk = Bottleneck(cin, planes, stride, ds)
                for bn in (blk.bn1, blk.bn2, blk.bn3):
                    bn.eps, bn.momentum = EPS, MOM
                if v1 and stride == 2:  # ResNet v1: the stride on the first 1x1 conv
                    blk.conv1.stride, blk.conv2.stride = (2, 2), (1, 1)
                blocks.append(blk)
                cin = planes * 4
            self.layers.append(nn.Sequential(*blocks))
        skips = [WIDTH * 16, WIDTH * 8, WIDTH * 4, WIDTH, 0]
        self.dec = nn.ModuleList()
        dcin = WIDTH * 32
        for d in range(5):
            self.dec.append(nn.Sequential(Unit(dcin + skips[d], DEC[d]), Unit(DEC[d], DEC[d])))
            dcin = DEC[d]
        self.head = nn.Conv2d(DEC[4], CLASSES, 3, 1, 1, bias=False)

    def forward(self, x):
        stem = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pool2d(stem, 3, 2, 1)
        feats = []
        for layer in self.layers:
            h = layer(h)
            feats.append(h)
        skips = [feats[2], feats[1], feats[0], stem, None]
        for d in range(5):
            h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=self.align)
            if skips[d] is not None:
                h = torch.cat([skips[d], h] if self.skip_first else [h, skips[d]], dim=1)
            h = self.dec[d](h)
        return self.head(h)


def units(net):
    """(name, conv, bn) in the C model's order."""
    out = [("conv1", net.conv1, net.bn1)]
    for s, layer in enumerate(net.layers):
        for b, blk in enumerate(layer):
            p = f"layer{s + 1}.{b}"
            out += [(p + ".1", blk.conv1, blk.bn1), (p + ".2", blk.conv2, blk.bn2),
                    (p + ".3", blk.conv3, blk.bn3)]
            if blk.downsample is not None:
                out.append((p + ".downsample", blk.downsample[0], blk.downsample[1]))
    for d, seq in enumerate(net.dec):
        out += [(f"decoder.{d}.1", seq[0].conv, seq[0].bn), (f"decoder.{d}.2", seq[1].conv, seq[1].bn)]
    return out


def init(net, g):
    for _, conv, bn in units(net):
        fan_out = conv.out_channels * conv.kernel_size[0] * conv.kernel_size[1]
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g, dtype=torch.float64) * (2.0 / fan_out) ** 0.5)
        bn.weight.copy_(1 + 0.1 * torch.randn(bn.weight.shape, generator=g, dtype=torch.float64))
        bn.bias.copy_(0.1 * torch.randn(bn.bias.shape, generator=g, dtype=torch.float64))
    net.head.weight.copy_(torch.randn(net.head.weight.shape, generator=g, dtype=torch.float64) * (2.0 / (CLASSES * 9)) ** 0.5)
    for p in net.parameters():
        p.copy_(p.float().double())  # what the C model loads


def run(net, x, y):
    net.zero_grad()
    net.train()
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    return loss


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/resunet_parity.bin"
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(B, IN_CH, IMAGE, IMAGE, generator=g, dtype=torch.float64).float().double()
    y = torch.randint(0, CLASSES, (B, IMAGE, IMAGE), generator=g)
    nets = {}
    for key, kw in {"ref": {}, "align": {"align": True}, "order": {"skip_first": True}, "v1": {"v1": True}}.items():
        net = Net(**kw).double()
        with torch.no_grad():
            init(net, torch.Generator().manual_seed(99))
        nets[key] = net
    ref = run(nets["ref"], x, y)
    for key in ("align", "order", "v1"):
        alt = run(nets[key], x, y)
        assert abs(alt.item() - ref.item()) > 1e-4, f"{key}: loss moves only {abs(alt.item() - ref.item()):.2e}"
    net = nets["ref"]
    us = units(net)
    params = []
    for name, conv, bn in us:
        params.append((name + ".conv", conv.weight))
        params.append((name + ".bn.weight", bn.weight))
        params.append((name + ".bn.bias", bn.bias))
    params.append(("head.conv", net.head.weight))
    with open(out, "wb") as f:
        f.write(b"VLRESUNT")
        f.write(struct.pack("<II", 1, len(params)))
        f.write(struct.pack("<12q", IMAGE, IN_CH, WIDTH, *BLOCKS, *DEC))
        f.write(struct.pack("<q", CLASSES))
        f.write(struct.pack("<ff", EPS, MOM))
        f.write(struct.pack("<q", B))
        f.write(x.float().numpy().tobytes())
        f.write(y.to(torch.int32).numpy().tobytes())
        for name, p in params:
            rows = p.shape[0]
            cols = p.numel() // rows if p.dim() > 1 else p.numel()
            if p.dim() == 1:
                rows, cols = 1, p.numel()
            f.write(name.encode().ljust(48, b"\0"))
            f.write(struct.pack("<qq", rows, cols))
            f.write(p.detach().float().numpy().tobytes())
            f.write(p.grad.float().numpy().tobytes())
        f.write(struct.pack("<I", len(us)))
        for name, _, bn in us:
            f.write((name + ".bn.weight").encode().ljust(48, b"\0"))
            f.write(struct.pack("<q", bn.num_features))
            f.write(bn.running_mean.float().numpy().tobytes())
            f.write(bn.running_var.float().numpy().tobytes())
        f.write(struct.pack("<d", ref.item()))
        f.write(b"VLRESEND")
    print(f"wrote {out}: {len(params)} parameters, loss {ref.item():.10f}")


if __name__ == "__main__":
    main()
