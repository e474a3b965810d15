#!/usr/bin/env python3
"""Images per second of PyTorch's DataLoader with timm's training transform for the Swin recipe.

    python3 scripts/bench_loader_torch.py ROOT WORKERS [--batches 40] [--batch 128] [--plain]

ROOT/train is an ImageFolder. The transform is timm's create_transform(224, is_training=True,
auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic', re_prob=0.25, re_mode='pixel'),
the one the official Swin code builds: RandomResizedCrop + flip + RandAugment on PIL images,
ToTensor, Normalize and RandomErasing in the workers (mixup runs later, on the batch). --plain
drops RandAugment and erasing (RandomResizedCrop + flip + ToTensor + Normalize). Prints one line
with img/s over --batches batches after 2 warm-up batches (worker start-up excluded).
"""
import argparse
import os
import time

import torch
from PIL import ImageOps
from timm.data import create_transform
from torchvision.datasets import ImageFolder

_posterize = ImageOps.posterize


def posterize_any_bits(image, bits):
    """Pillow >= 13 refuses bits = 0, which timm's PosterizeIncreasing asks for at magnitude 10
    (magnitude 9 + N(0, 0.5) noise, clamped, reaches it); older Pillow gave black, as swin.c does."""
    return image.point(lambda v: 0) if bits == 0 else _posterize(image, bits)


ImageOps.posterize = posterize_any_bits  # inherited by the forked workers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("workers", type=int)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--plain", action="store_true")
    args = ap.parse_args()
    tf = create_transform(224, is_training=True, interpolation="bicubic",
                          auto_augment=None if args.plain else "rand-m9-mstd0.5-inc1",
                          re_prob=0.0 if args.plain else 0.25, re_mode="pixel", re_count=1)
    ds = ImageFolder(os.path.join(args.root, "train"), transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=torch.cuda.is_available(),
                                         persistent_workers=args.workers > 0)
    done, t0 = 0, None
    it = iter(loader)
    for i in range(args.batches + 2):
        try:
            x, _ = next(it)
        except StopIteration:
            it = iter(loader)
            x, _ = next(it)
        if i == 1:
            t0 = time.perf_counter()
        if i >= 2:
            done += x.shape[0]
    dt = time.perf_counter() - t0
    recipe = "RRC+flip (bicubic)" if args.plain else "RRC+flip+RandAugment+erase (bicubic)"
    print(f"PyTorch+timm   imagefolder workers {args.workers:2d}  {recipe}  {done:5d} images  "
          f"{done / dt:8.1f} img/s")


if __name__ == "__main__":
    main()
