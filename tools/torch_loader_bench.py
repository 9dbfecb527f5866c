#!/usr/bin/env python3
"""PyTorch DataLoader reference for the dataloader case: the same JPEG files, the same
transforms (RandomResizedCrop 224, horizontal flip, normalise). Prints the images/s of the
last epoch on stdout (nothing else), for `vramlab` to read.

--decoder pil (default): torchvision's classic pipeline, one sample per __getitem__: PIL
  decodes, transforms.Compose on the PIL image, ToTensor, default collate.
--decoder decode_jpeg: the strongest CPU pipeline PyTorch offers: a worker takes a whole
  batch of indices (a BatchSampler as the sampler, batch_size=None), reads the files' bytes
  into uint8 tensors, decodes them with torchvision.io.decode_jpeg (libjpeg-turbo) in one
  call, applies the same transforms as transforms.v2 on the uint8 tensors (crop and resize
  with antialiasing, flip, then to float and normalise) and stacks the batch."""
import argparse
import os
import sys
import time

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def read_manifest(d):
    rows = []
    with open(os.path.join(d, "manifest.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if not parts[1].lstrip("-").isdigit():
                continue  # column header
            rows.append((os.path.join(d, parts[0]), int(parts[1])))
    return rows


def pil_loader(torch, a, rows):
    from PIL import Image
    from torchvision import transforms

    tf = transforms.Compose([
        transforms.RandomResizedCrop(a.crop),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            path, label = rows[i]
            with Image.open(path) as im:
                return tf(im.convert("RGB")), label

    kw = dict(batch_size=a.batch, shuffle=True, num_workers=a.workers, drop_last=True)
    if a.workers > 0:
        kw.update(persistent_workers=True, prefetch_factor=2)
    return torch.utils.data.DataLoader(Files(), **kw)


def decode_jpeg_loader(torch, a, rows):
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import v2

    tf = v2.Compose([
        v2.RandomResizedCrop(a.crop, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(MEAN, STD),
    ])

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, idx):  # a batch of indices from the BatchSampler
            data = []
            for i in idx:
                with open(rows[i][0], "rb") as f:
                    data.append(torch.frombuffer(bytearray(f.read()), dtype=torch.uint8))
            images = decode_jpeg(data, mode=ImageReadMode.RGB)
            x = torch.stack([tf(im) for im in images])
            return x, torch.tensor([rows[i][1] for i in idx])

    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(range(len(rows))), a.batch, drop_last=True)
    kw = dict(batch_size=None, sampler=sampler, num_workers=a.workers)
    if a.workers > 0:
        kw.update(persistent_workers=True, prefetch_factor=2)
    return torch.utils.data.DataLoader(Batches(), **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--decoder", choices=("pil", "decode_jpeg"), default="pil")
    a = ap.parse_args()

    import torch

    rows = read_manifest(a.dir)
    make = pil_loader if a.decoder == "pil" else decode_jpeg_loader
    dl = make(torch, a, rows)
    rate = 0.0
    for _ in range(a.epochs):
        t0, n = time.perf_counter(), 0
        for x, _y in dl:
            n += x.shape[0]
        rate = n / (time.perf_counter() - t0)
    print(f"{rate:.3f}")


if __name__ == "__main__":
    sys.exit(main())
