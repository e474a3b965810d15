#!/usr/bin/env python3
"""Images per second of PyTorch's DataLoader with timm's training transform for the Swin recipe.

    python3 scripts/bench_loader_torch.py ROOT WORKERS [--batches 40] [--batch 128] [--plain]

ROOT/train is an ImageFolder. The transform is timm's create_transform(224, is_training=True,
auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic', re_prob=0.25, re_mode='pixel'),
the one the official Swin code builds: RandomResizedCrop + flip + RandAugment on PIL images,
ToTensor, Normalize and RandomErasing in the workers (mixup runs later, on the batch). --plain
drops RandAugment and erasing (RandomResizedCrop + flip + ToTensor + Normalize). Prints one line
with img/s in the steady state, measured as scripts/bench_loader.c does: the DataLoader keeps
2 batches per worker in flight, so the clock starts after twice that many have come out and runs
over max(--batches, 20 x WORKERS) batches. The sampler runs epoch after epoch without a break
(shuffled each time), so a small folder does not add an epoch restart every few batches.
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


class Epochs(torch.utils.data.Sampler):
    """count indices: a new shuffle of range(n) each time the previous one is used up."""

    def __init__(self, n, count):
        self.n, self.count = n, count

    def __iter__(self):
        left = self.count
        while left > 0:
            for i in torch.randperm(self.n)[:left].tolist():
                yield i
            left -= min(left, self.n)

    def __len__(self):
        return self.count


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
    prefetch = 2  # DataLoader's prefetch_factor default: batches in flight per worker
    warmup = 2 * prefetch * max(args.workers, 1)
    measured = max(args.batches, 20 * args.workers)
    sampler = Epochs(len(ds), (warmup + measured) * args.batch)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=sampler, drop_last=True,
                                         num_workers=args.workers, prefetch_factor=prefetch if args.workers else None,
                                         pin_memory=torch.cuda.is_available())
    done, t0 = 0, None
    for i, (x, _) in enumerate(loader):
        if i == warmup - 1:
            t0 = time.perf_counter()
        elif i >= warmup:
            done += x.shape[0]
    dt = time.perf_counter() - t0
    recipe = "RRC+flip (bicubic)" if args.plain else "RRC+flip+RandAugment+erase (bicubic)"
    print(f"PyTorch+timm   imagefolder workers {args.workers:2d}  {recipe}  {done:5d} images  "
          f"{done / dt:8.1f} img/s")


if __name__ == "__main__":
    main()
