#!/usr/bin/env python3
"""Writes an ImageFolder of synthetic ImageNet-like JPEGs for loader benchmarks.

Sizes follow ImageNet-1k's training set roughly: most images are about 500 x 375 or 375 x 500
(the long side 500 in ~75% of them), the rest drawn from a log-normal around 400 px with aspects
between 3/4 and 4/3 (a long tail to ~1000 px); quality 75-95 at 4:2:0 as cameras and web
re-encodes give: about 80 KB a file (the script prints the mean), in the range of ImageNet's. Pixels are photo-like:
smooth illumination, a few textured objects with hard edges, and sensor noise, so the entropy
coder sees realistic data (flat synthetic images decode several times faster than photos).

Usage:
    python3 scripts/make_jpegs.py OUT_DIR [--train 4000] [--val 500] [--classes 10] [--seed 0] [--jobs N]
writes OUT_DIR/train/<class>/NNNNNN.jpg and OUT_DIR/val/<class>/NNNNNN.jpg and prints the mean
file size and resolution. Needs numpy and Pillow.
"""
import argparse
import multiprocessing
import os

import numpy as np
from PIL import Image


def image_size(rng):
    if rng.random() < 0.75:
        return (500, 375) if rng.random() < 0.8 else (375, 500)
    long_side = int(np.clip(rng.lognormal(np.log(420), 0.35), 160, 1100))
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    w, h = (long_side, int(long_side / aspect)) if aspect >= 1 else (int(long_side * aspect), long_side)
    return max(w, 32), max(h, 32)


def photo(rng, w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    base = rng.uniform(60, 200, 3)
    gx, gy = rng.uniform(-0.3, 0.3, 2)
    for c in range(3):
        img[..., c] = base[c] + gx * (x - w / 2) + gy * (y - h / 2)
    for _ in range(int(rng.integers(3, 9))):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(w / 12, w / 3), rng.uniform(h / 12, h / 3)
        mask = ((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 < 1
        color = rng.uniform(0, 255, 3)
        freq = rng.uniform(0.05, 0.6, 2)
        texture = 25 * np.sin(x[mask] * freq[0]) * np.cos(y[mask] * freq[1])
        img[mask] = color + texture[:, None]
    # Background texture (foliage, fabric, gravel) and sensor noise: most of a photo's bits.
    f = rng.uniform(0.2, 1.2, 2)
    img += (18 * np.sin(x * f[0] + 3 * np.sin(y * 0.05)) * np.cos(y * f[1]))[..., None]
    img += rng.normal(0, rng.uniform(12, 22), img.shape).astype(np.float32)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def write_one(job):
    root, split, split_id, i, classes, seed = job
    # Each image has its own generator, so the files do not depend on how the work is split.
    rng = np.random.default_rng([seed, split_id, i])
    d = os.path.join(root, split, f"class{i % classes:03d}")
    os.makedirs(d, exist_ok=True)
    w, h = image_size(rng)
    path = os.path.join(d, f"{i:06d}.jpg")
    photo(rng, w, h).save(path, "JPEG", quality=int(rng.integers(75, 96)), subsampling=2)
    return os.path.getsize(path), w * h


def write_split(pool, root, split, split_id, count, classes, seed):
    jobs = [(root, split, split_id, i, classes, seed) for i in range(count)]
    done = pool.map(write_one, jobs, chunksize=16)
    sizes, pixels = sum(d[0] for d in done), sum(d[1] for d in done)
    print(f"{split}: {count} images, mean {sizes / max(count, 1) / 1024:.1f} KB, "
          f"mean {pixels / max(count, 1) / 1e3:.0f} kpixels")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=4000)
    ap.add_argument("--val", type=int, default=500)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="processes (default: all cores)")
    args = ap.parse_args()
    with multiprocessing.Pool(args.jobs) as pool:
        write_split(pool, args.out, "train", 0, args.train, args.classes, args.seed)
        write_split(pool, args.out, "val", 1, args.val, args.classes, args.seed)


if __name__ == "__main__":
    main()
