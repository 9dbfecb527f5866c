#!/usr/bin/env python3
"""PyTorch DataLoader reference for the dataloader case: the same JPEG files, the same
transforms (RandomResizedCrop 224, horizontal flip, normalise) through torchvision/PIL.
Prints the images/s of the last epoch on stdout (nothing else), for `vramlab` to read."""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=2)
    a = ap.parse_args()

    import torch
    from PIL import Image
    from torchvision import transforms

    rows = []
    with open(os.path.join(a.dir, "manifest.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if not parts[1].lstrip("-").isdigit():
                continue  # column header
            rows.append((os.path.join(a.dir, parts[0]), int(parts[1])))

    tf = transforms.Compose([
        transforms.RandomResizedCrop(a.crop),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
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
    dl = torch.utils.data.DataLoader(Files(), **kw)
    rate = 0.0
    for _ in range(a.epochs):
        t0, n = time.perf_counter(), 0
        for x, _y in dl:
            n += x.shape[0]
        rate = n / (time.perf_counter() - t0)
    print(f"{rate:.3f}")


if __name__ == "__main__":
    sys.exit(main())
