#!/usr/bin/env python3
"""Writes WebDataset-style tar shards (data.dataset = shards) from an ImageFolder.

    python3 scripts/make_shards.py IMAGEFOLDER OUT [--samples-per-shard 1000] [--seed 0]

For each split (train, val) of IMAGEFOLDER (<split>/<class>/*.{jpg,jpeg,png}, classes sorted by
name, as swin.c's imagefolder reads them) it writes OUT/<split>/shard-NNNNNN.tar, each holding
consecutive samples NNNNNNNN.<ext> (the image file's bytes, not re-encoded) and NNNNNNNN.cls
(the class index as decimal text). Training samples are shuffled once (--seed) before they are
cut into shards, so every shard mixes the classes; val keeps the folder order. Shards are plain
ustar files: `tar tf` lists them. Uses only the Python standard library.
"""
import argparse
import io
import os
import random
import tarfile

EXTS = (".jpg", ".jpeg", ".png")


def list_split(root):
    classes = sorted(d for d in os.listdir(root)
                     if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))
    samples = []
    for label, cls in enumerate(classes):
        d = os.path.join(root, cls)
        for name in sorted(os.listdir(d)):
            if not name.startswith(".") and name.lower().endswith(EXTS):
                samples.append((os.path.join(d, name), label))
    return classes, samples


def add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_split(samples, out_dir, per_shard):
    os.makedirs(out_dir, exist_ok=True)
    shards = 0
    for start in range(0, len(samples), per_shard):
        path = os.path.join(out_dir, f"shard-{start // per_shard:06d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, (src, label) in enumerate(samples[start:start + per_shard], start):
                ext = os.path.splitext(src)[1].lower().lstrip(".")
                with open(src, "rb") as f:
                    add_bytes(tar, f"{i:08d}.{ext}", f.read())
                add_bytes(tar, f"{i:08d}.cls", f"{label}\n".encode())
        shards += 1
    return shards


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("imagefolder")
    ap.add_argument("out")
    ap.add_argument("--samples-per-shard", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    train_classes = None
    for split in ("train", "val"):
        root = os.path.join(args.imagefolder, split)
        if not os.path.isdir(root):
            raise SystemExit(f"{root} does not exist: expected an ImageFolder with train/ and val/")
        classes, samples = list_split(root)
        if split == "train":
            train_classes = classes
            random.Random(args.seed).shuffle(samples)
        elif classes != train_classes:
            raise SystemExit(f"{root}: the class directories differ from train/'s")
        n = write_split(samples, os.path.join(args.out, split), args.samples_per_shard)
        print(f"{split}: {len(samples)} samples, {len(classes)} classes, {n} shards")


if __name__ == "__main__":
    main()
