#!/usr/bin/env python3
"""Writes Fashion-MNIST as an ImageFolder of upscaled RGB JPEGs (the JPEG path's real data run).

    python3 scripts/fashion_mnist_jpegs.py OUT [--size 112] [--quality 90] [--src DIR] [--limit N]
                                           [--jobs N]

Reads the IDX files (default /usr/share/datasets/fashion-mnist, from Debian's
dataset-fashion-mnist), upscales each 28x28 image to SIZE x SIZE with Pillow's bicubic filter,
and writes OUT/train/<class>/NNNNN.jpg (60,000) and OUT/val/<class>/NNNNN.jpg (10,000, the t10k
set) as RGB JPEGs, so the same images go through the decode and augmentation path that ImageNet
takes. Class directories are named 0_tshirt ... 9_boot so their sorted order is the label order.
Then e.g. `python3 scripts/make_shards.py OUT OUT-shards` for data.dataset = shards. Needs Pillow.
--jobs N writes with N processes (default: every core); the files are the same whatever N.
"""
import argparse
import gzip
import multiprocessing
import os

from PIL import Image

CLASSES = ["0_tshirt", "1_trouser", "2_pullover", "3_dress", "4_coat", "5_sandal", "6_shirt",
           "7_sneaker", "8_bag", "9_boot"]


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read()


def find(src, name):
    for candidate in (os.path.join(src, name), os.path.join(src, name + ".gz")):
        if os.path.exists(candidate):
            return candidate
    raise SystemExit(f"{src}/{name}(.gz) not found (apt-get install dataset-fashion-mnist)")


_split = None  # (images, labels, h, w, out, size, quality): what write_range's processes share


def write_range(first_end):
    images, labels, h, w, out, size, quality = _split
    for i in range(*first_end):
        pixels = images[16 + i * h * w:16 + (i + 1) * h * w]
        img = Image.frombytes("L", (w, h), pixels).resize((size, size), Image.BICUBIC)
        path = os.path.join(out, CLASSES[labels[8 + i]], f"{i:05d}.jpg")
        img.convert("RGB").save(path, "JPEG", quality=quality)


def write_split(src, prefix, out, size, quality, limit, jobs):
    global _split
    images = read_idx(find(src, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find(src, f"{prefix}-labels-idx1-ubyte"))
    n, h, w = (int.from_bytes(images[4 * i:4 * i + 4], "big") for i in (1, 2, 3))
    for c in CLASSES:
        os.makedirs(os.path.join(out, c), exist_ok=True)
    n = min(n, limit) if limit > 0 else n
    _split = (images, labels, h, w, out, size, quality)
    step = (n + jobs - 1) // jobs
    ranges = [(a, min(a + step, n)) for a in range(0, n, step)]
    if jobs == 1:
        for r in ranges:
            write_range(r)
    else:  # forked workers inherit _split instead of receiving it
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            pool.map(write_range, ranges)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--src", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--limit", type=int, default=0, help="only the first N images of each split")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes writing")
    args = ap.parse_args()
    if args.jobs < 1:
        raise SystemExit(f"--jobs {args.jobs}: want at least 1")
    for prefix, split in (("train", "train"), ("t10k", "val")):
        n = write_split(args.src, prefix, os.path.join(args.out, split), args.size, args.quality,
                        args.limit, args.jobs)
        print(f"{split}: {n} images at {args.size}x{args.size}")


if __name__ == "__main__":
    main()
