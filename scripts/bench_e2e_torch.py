#!/usr/bin/env python3
"""PyTorch end to end on real JPEGs: timm's Swin trained from files with the official Swin recipe,
the run that `swin_train CONFIG bench=e2e` is compared against (scripts/bench_e2e.sh runs both).

    python3 scripts/bench_e2e_torch.py ROOT [--dataset imagefolder|shards] [--model NAME]
        [--num-classes 10] [--batch 128] [--workers 16] [--warmup 50] [--steps 500]
        [--compile reduce-overhead|default|none] [--device cuda|cpu]

ROOT/train is an ImageFolder (<class>/*.jpg) or, with --dataset shards, tar shards *.tar of
NNNNNNNN.jpg + NNNNNNNN.cls as scripts/make_shards.py writes them (the members are indexed once
here; each loader worker opens the tar files itself and reads a sample's bytes at its offset).
The recipe is configs/swin_tiny.ini's, as the official Swin code builds it: timm's
create_transform (RandomResizedCrop scale 0.08-1 ratio 3/4-4/3 bicubic, flip, RandAugment
rand-m9-mstd0.5-inc1, ToTensor, Normalize, random erasing 0.25 per-pixel) in --workers DataLoader
workers (pin_memory, persistent workers, drop_last; the sampler runs epoch after epoch without a
break, so a small folder puts reshuffles, not DataLoader restarts, inside the timed steps);
then on the device timm's Mixup/CutMix (0.8 / 1.0, switch 0.5, label smoothing 0.1),
SoftTargetCrossEntropy, bf16 autocast (CUDA), gradient clipping at 5.0, fused AdamW (lr 5e-4 x
batch/512, weight decay 0.05, betas 0.9/0.999), drop path as bench_pytorch.py sets it; the model
through torch.compile (mode reduce-overhead: CUDA graphs) with timm's fused SDPA attention, as
bench_pytorch.py's compile_fused_ro. The learning rate stays constant (a schedule costs nothing).

Measures: --warmup steps untimed (compilation included), then --steps steps between two
synchronizations: img/s and ms per step end to end, and the data wait, the host's time blocked
in next(loader) over those steps as a fraction of their wall time. Progress goes to stderr; the
last stdout line is one JSON object: {"bench": "e2e_torch", "dataset", "model", "batch",
"workers", "steps", "img_s", "ms_per_step", "data_wait", "compile", ...}.
Smoke test without a GPU: --device cpu --compile none --warmup 1 --steps 2 on a small folder.
"""
import argparse
import io
import json
import os
import sys
import tarfile
import time

from bench_pytorch import MODELS, timm_fused_attn

# timm reads TIMM_FUSED_ATTN when it is imported (bench_loader_torch imports it).
os.environ.setdefault("TIMM_FUSED_ATTN", timm_fused_attn("compile_fused_ro"))

import timm  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from timm.data import (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, Mixup,  # noqa: E402
                       create_transform)
from timm.loss import SoftTargetCrossEntropy  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

# Its import also installs the posterize workaround for Pillow >= 13 (the workers inherit it).
from bench_loader_torch import Epochs  # noqa: E402

IMAGE_EXTS = (".jpg", ".jpeg", ".png")


class TarShards(torch.utils.data.Dataset):
    """The samples of ROOT/*.tar as (shard, byte offset, size, label), in shard and member order.
    __getitem__ reads the bytes with its own file handles, opened in the worker that uses them."""

    def __init__(self, root, transform):
        self.transform = transform
        self.paths = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".tar"))
        if not self.paths:
            raise SystemExit(f"{root} holds no .tar shards (scripts/make_shards.py writes them)")
        self.samples = []  # (shard index, offset, size, label)
        for s, path in enumerate(self.paths):
            images, labels = {}, {}
            with tarfile.open(path) as tar:
                for m in tar:
                    key, ext = os.path.splitext(m.name)
                    if ext.lower() in IMAGE_EXTS:
                        images[key] = (m.offset_data, m.size)
                    elif ext == ".cls":
                        labels[key] = int(tar.extractfile(m).read())
            for key in sorted(images):
                if key not in labels:
                    raise SystemExit(f"{path}: {key} has an image but no .cls label")
                self.samples.append((s, *images[key], labels[key]))
        self.classes = sorted({label for *_, label in self.samples})
        self.files = {}  # shard index -> file, per process (each worker opens its own)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        s, offset, size, label = self.samples[i]
        f = self.files.get(s)
        if f is None:
            if len(self.files) >= 64:  # under the open-files limit on ImageNet's 1282 shards
                for g in self.files.values():
                    g.close()
                self.files.clear()
            f = self.files[s] = open(self.paths[s], "rb")
        f.seek(offset)
        image = Image.open(io.BytesIO(f.read(size))).convert("RGB")
        return self.transform(image), label


def make_loader(args, count):
    tf = create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
                          interpolation="bicubic", re_prob=0.25, re_mode="pixel", re_count=1,
                          scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5,
                          mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
    train = os.path.join(args.root, "train")
    ds = TarShards(train, tf) if args.dataset == "shards" else ImageFolder(train, transform=tf)
    if len(ds.classes) > args.num_classes:
        raise SystemExit(f"{train} has {len(ds.classes)} classes, over --num-classes "
                         f"{args.num_classes}")
    loader = torch.utils.data.DataLoader(
        ds, batch_size=args.batch, sampler=Epochs(len(ds), count * args.batch), drop_last=True,
        num_workers=args.workers, pin_memory=args.device == "cuda",
        persistent_workers=args.workers > 0)
    return loader, len(ds)


def make_model(args):
    # The recipe's drop path of the timm model (bench_pytorch.MODELS), 0 for another one.
    recipe = {name: rate for name, _, rate in MODELS.values()}
    drop_path = args.drop_path if args.drop_path is not None else recipe.get(args.model, 0.0)
    model = timm.create_model(args.model, num_classes=args.num_classes,
                              drop_path_rate=drop_path).to(args.device).train()
    lr = 5e-4 * args.batch / 512
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05, betas=(0.9, 0.999),
                            eps=1e-8, fused=args.device == "cuda")
    fwd = model if args.compile == "none" else torch.compile(
        model, mode=None if args.compile == "default" else args.compile)
    return model, fwd, opt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--dataset", choices=("imagefolder", "shards"), default="imagefolder")
    ap.add_argument("--model", default="swin_tiny_patch4_window7_224")
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--compile", choices=("none", "default", "reduce-overhead"),
                    default="reduce-overhead")
    ap.add_argument("--drop-path", type=float, default=None,
                    help="default: bench_pytorch.py's value for the Swin size, else 0")
    ap.add_argument("--device", choices=("cuda", "cpu"),
                    default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    loader, images = make_loader(args, args.warmup + args.steps)
    model, fwd, opt = make_model(args)
    mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode="batch",
                  label_smoothing=0.1, num_classes=args.num_classes)
    lossf = SoftTargetCrossEntropy()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(x, y):
        x = x.to(args.device, non_blocking=True)
        y = y.to(args.device, non_blocking=True)
        x, y = mixup(x, y)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=cuda):
            loss = lossf(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        return loss

    batches = iter(loader)
    t_start = time.perf_counter()
    for i in range(args.warmup):
        loss = step(*next(batches))
        if i == 0 or i == args.warmup - 1:
            print(f"warm-up step {i + 1}/{args.warmup}: loss {loss.item():.4f}, "
                  f"{time.perf_counter() - t_start:.1f} s", file=sys.stderr, flush=True)
    sync()
    every = max(args.steps // 10, 1)
    waited = 0.0
    t0 = time.perf_counter()
    for i in range(args.steps):
        t_wait = time.perf_counter()
        x, y = next(batches)
        waited += time.perf_counter() - t_wait
        loss = step(x, y)
        if (i + 1) % every == 0 and i + 1 < args.steps:
            dt = time.perf_counter() - t0  # loss.item() below waits for the GPU, rarely
            print(f"step {i + 1}/{args.steps}: loss {loss.item():.4f}, "
                  f"{(i + 1) * args.batch / dt:.1f} img/s, data wait {100 * waited / dt:.1f}%",
                  file=sys.stderr, flush=True)
    sync()
    seconds = time.perf_counter() - t0
    print(json.dumps({"bench": "e2e_torch", "dataset": args.dataset, "model": args.model,
                      "batch": args.batch, "workers": args.workers, "steps": args.steps,
                      "img_s": round(args.steps * args.batch / seconds, 1),
                      "ms_per_step": round(1e3 * seconds / args.steps, 3),
                      "data_wait": round(waited / seconds, 4), "compile": args.compile,
                      "device": args.device, "images": images,
                      "epochs": round(args.steps * args.batch / images, 2),
                      "torch": torch.__version__, "timm": timm.__version__}), flush=True)


if __name__ == "__main__":
    main()
