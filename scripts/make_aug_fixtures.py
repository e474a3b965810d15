#!/usr/bin/env python3
"""Reference fixtures for swin.c's augmentation parity test (tests/test_aug_parity.c).

What: timm, torchvision and Pillow applied to real pixels (two Fashion-MNIST training images, L
mode) and to synthetic photo-like RGB images (smooth gradients, edges, texture and noise), written
to one safetensors file:
  img/<name>                        the input images, uint8 (H, W, C)
  ra/<img>/<Op>/<m>/<sign>/<interp> each RandAugment op of timm's increasing set (and the plain
                                    set's Posterize/Solarize/enhancers) at fixed magnitudes, both
                                    signs and both interpolations; metadata <name> = the op's
                                    argument as timm's level function gives it (repr)
  rrc/<img>/<interp>/<t>,<l>,<h>,<w>/<oh>x<ow>  torchvision resized_crop (RandomResizedCrop's
                                    resize) of a given box: up- and downscaling
  eval/<img>/<interp>/<oh>x<ow>/<crop_pct>       timm's eval transform (Resize + CenterCrop)
  jitter/<img>/<order>/<b>,<c>,<s>  ColorJitter's adjustments in a given order with given factors
  erase/...                         timm RandomErasing('pixel') driven to given boxes, with the
                                    per-pixel fill swin.c generates (src/base/rng.h, ported below)
  mixup/..., cutmix/...             timm Mixup('batch') with a given lambda (and cutmix center):
                                    the mixed batch, the corrected lambda and the soft targets
  loss/...                          timm SoftTargetCrossEntropy in float64: loss and gradient

Layout: swin.c is channels-last, so float batches are stored (B, H, W, C).

Regenerate (CPU is enough, a few seconds):
    python3 -m venv /tmp/venv-aug && /tmp/venv-aug/bin/pip install torch torchvision timm pillow \
        numpy safetensors
    /tmp/venv-aug/bin/python scripts/make_aug_fixtures.py --out tests/fixtures/augment/aug_parity.safetensors
Needs Fashion-MNIST in /usr/share/datasets/fashion-mnist (apt-get install dataset-fashion-mnist).
"""
import argparse
import gzip
import math
import os
import random

import numpy as np
import PIL
import timm
import timm.data.auto_augment as aa
import timm.data.mixup as mixup_mod
import timm.data.random_erasing as re_mod
import torch
import torchvision
import torchvision.transforms.functional as TF
from PIL import Image
from safetensors.numpy import save_file
from timm.data import create_transform
from timm.loss import SoftTargetCrossEntropy

FASHION = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
MAX_BYTES = 2_000_000
IMAGENET_MEAN = (0.485, 0.456, 0.406)
# timm's RandAugment fill: min(255, round(255 * mean)); gray images take the first channel's.
FILL_RGB = tuple(min(255, round(255 * x)) for x in IMAGENET_MEAN)
FILL_L = FILL_RGB[0]
# swin.c stores label smoothing as fp32 (a config float); timm gets the same value as a double.
SMOOTHING = float(np.float32(0.1))

INTERP = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"}
SIGNED = GEOMETRIC | {"ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                      "SharpnessIncreasing"}


def fashion_images(count):
    with gzip.open(FASHION, "rb") as f:
        data = f.read()
    n, h, w = (int.from_bytes(data[4 * i:4 * i + 4], "big") for i in (1, 2, 3))
    pixels = np.frombuffer(data, np.uint8, offset=16).reshape(n, h, w)
    return [pixels[i].copy() for i in range(count)]


def synthetic_photo(h, w, seed):
    """Smooth shading, a few hard-edged shapes, fine texture and sensor noise, in RGB."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 120 + 60 * np.sin(a * x / 7 + b * y / 9 + p) + 30 * (y / h - 0.5)
    for _ in range(3):
        cy, cx, ry, rx = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(3, h / 3), rng.uniform(3, w / 3)
        mask = ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 < 1
        img[mask] = rng.uniform(0, 255, 3)
    img += 12 * (np.sin(x * 1.7) * np.cos(y * 2.3))[..., None]
    img += rng.normal(0, 6, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def as_array(pil):
    a = np.asarray(pil, dtype=np.uint8)
    return a[..., None].copy() if a.ndim == 2 else a.copy()


def as_pil(a):
    return Image.fromarray(a[..., 0] if a.shape[2] == 1 else a, "L" if a.shape[2] == 1 else "RGB")


# ---- RandAugment ops ----

def randaugment_cases(images, tensors, meta):
    ops = list(aa._RAND_INCREASING_TRANSFORMS) + ["Posterize", "Solarize", "Color", "Contrast",
                                                   "Brightness", "Sharpness"]
    for name, img in images.items():
        # Every op on the real and the first synthetic image; the second synthetic image (odd
        # sides) gets the geometric ops, where rounding at the borders matters most.
        mags = [3.7, 9.0] if name != "syn1" else [6.3]
        for op in ops:
            if name == "syn1" and op not in GEOMETRIC:
                continue
            for m in mags:
                for negate in ([False, True] if op in SIGNED else [False]):
                    aa._randomly_negate = (lambda v: -v) if negate else (lambda v: v)
                    level_fn = aa.LEVEL_TO_ARG[op]
                    args = level_fn(m, {}) if level_fn is not None else ()
                    for interp in (["bilinear", "bicubic"] if op in GEOMETRIC else ["bilinear"]):
                        fill = FILL_L if img.shape[2] == 1 else FILL_RGB
                        out = aa.NAME_TO_OP[op](as_pil(img), *args, fillcolor=fill,
                                                resample=INTERP[interp])
                        key = f"ra/{name}/{op}/{m}/{'neg' if negate else 'pos'}/{interp}"
                        tensors[key] = as_array(out)
                        meta[key] = repr(float(args[0])) if args else "none"


# ---- resizing ----

def resize_cases(images, tensors):
    big = images["big"]
    cases = [
        ("fm0", (3, 2, 21, 24), (32, 32)),      # RRC upscaling a gray crop
        ("syn0", (5, 7, 20, 31), (24, 24)),     # mixed: up in y, down in x
        ("big", (11, 9, 80, 100), (24, 24)),    # strong downscale: antialiasing
        ("big", (0, 0, big.shape[0], big.shape[1]), (40, 56)),
    ]
    for name, (t, l, h, w), (oh, ow) in cases:
        for interp in ("bilinear", "bicubic"):
            mode = TF.InterpolationMode.BILINEAR if interp == "bilinear" else TF.InterpolationMode.BICUBIC
            out = TF.resized_crop(as_pil(images[name]), t, l, h, w, [oh, ow], interpolation=mode)
            tensors[f"rrc/{name}/{interp}/{t},{l},{h},{w}/{oh}x{ow}"] = as_array(out)
    for name, (oh, ow), crop_pct in [("big", (32, 32), 0.875), ("big", (24, 40), 0.9),
                                     ("fm1", (32, 32), 1.0), ("syn0", (28, 28), 0.875)]:
        for interp in ("bilinear", "bicubic"):
            tf = create_transform(input_size=(3, oh, ow), is_training=False, interpolation=interp,
                                  crop_pct=crop_pct)
            pil = as_pil(images[name])
            for t in tf.transforms:  # Resize, CenterCrop, then the tensor steps (skipped)
                if type(t).__name__ in ("ToTensor", "MaybeToTensor", "Normalize"):
                    break
                pil = t(pil)
            tensors[f"eval/{name}/{interp}/{oh}x{ow}/{crop_pct}"] = as_array(pil)


# ---- ColorJitter (torchvision's adjust_* on PIL images) with given order and factors ----

def jitter_cases(images, tensors):
    adjust = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation]
    cases = [((2, 0, 3, 1), (0.71, 1.33, 0.62)), ((1, 2, 0, 3), (1.38, 0.64, 1.25))]
    for name in ("syn0", "fm0"):
        for order, factors in cases:
            pil = as_pil(images[name])
            for fn in order:
                if fn < 3:
                    pil = adjust[fn](pil, factors[fn])
            key = f"jitter/{name}/{''.join(map(str, order))}/{','.join(map(str, factors))}"
            tensors[key] = as_array(pil)


# ---- swin.c's per-pixel erase fill (src/base/rng.h), ported to numpy fp32 ----

M32 = 0xFFFFFFFF


def philox(c, k):
    c0, c1, c2, c3 = c
    k0, k1 = k
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        n0, n2 = ((p1 >> 32) ^ c1 ^ k0) & M32, ((p0 >> 32) ^ c3 ^ k1) & M32
        c1, c3, c0, c2 = p1 & M32, p0 & M32, n0, n2
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def rng_key(seed, stream, a, b):
    stream = (stream ^ (((a >> 32) * 0x85EBCA6B) & M32) ^ (((b >> 32) * 0xC2B2AE35) & M32)) & M32
    return (a & M32, b & M32, stream, seed & M32, (seed >> 32) & M32)


F = np.float32


def log_unit(u):
    bits = int(np.array([u], F).view(np.uint32)[0])
    e = ((bits >> 23) & 0xFF) - 127
    m = np.array([(bits & 0x007FFFFF) | 0x3F800000], np.uint32).view(F)[0]
    if m > F(1.41421356):
        m, e = m * F(0.5), e + 1
    s = (m - F(1)) / (m + F(1))
    s2 = s * s
    p = F(1) / F(7) + s2 * (F(1) / F(9))
    p = F(1) / F(5) + s2 * p
    p = F(1) / F(3) + s2 * p
    p = F(1) + s2 * p
    ln_m = (F(2) * s) * p
    return F(e) * F(0.693145752) + (F(e) * F(1.42860677e-6) + ln_m)


def sincos_turn(k):
    q = k >> 22
    r = F(k & 0x3FFFFF) * (F(1) / F(4194304))
    t = (r - F(0.5)) * F(1.57079633)
    t2 = t * t
    sp = F(1) / F(120) - t2 * (F(1) / F(5040) - t2 * (F(1) / F(362880)))
    sin_t = t * (F(1) - t2 * (F(1) / F(6) - t2 * sp))
    cp = F(1) / F(720) - t2 * (F(1) / F(40320) - t2 * (F(1) / F(3628800)))
    cos_t = F(1) - t2 * (F(0.5) - t2 * (F(1) / F(24) - t2 * cp))
    h = F(0.707106781)
    sa, ca = h * (cos_t + sin_t), h * (cos_t - sin_t)
    return [(ca, sa), (-sa, ca), (-ca, -sa), (sa, -ca)][q]


def normal_at(key, i):
    a, b, stream, k0, k1 = key
    x = philox((a, b, i >> 2, stream), (k0, k1))
    pair = (i & 3) >> 1
    u = F((x[2 * pair] >> 8) + 1) * (F(1) / F(16777216))
    radius = np.sqrt(F(-2) * log_unit(u), dtype=F)
    c, s = sincos_turn(x[2 * pair + 1] >> 8)
    return radius * (s if i & 1 else c)


class _BoxDraws:
    """Stands in for timm.data.random_erasing's `random` so that _erase picks a given box."""

    def __init__(self, h, w, top, left, img_h, img_w):
        self.uniforms = [h * w / (img_h * img_w), math.log(h / w)]
        self.ints = [top, left]

    def random(self):
        return 0.0

    def uniform(self, a, b):
        return self.uniforms.pop(0)

    def randint(self, a, b):
        return self.ints.pop(0)


def erase_cases(tensors, meta):
    B, C, H, W = 3, 3, 20, 24
    seed, epoch = 1234, 2
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, (B, C, H, W)).astype(np.float32)
    boxes = [(3, 4, 9, 6), (0, 0, 19, 2), (11, 21, 9, 3)]  # (top, left, h, w)
    out = torch.from_numpy(x.copy())
    erasing = re_mod.RandomErasing(probability=1.0, mode="pixel", device="cpu")
    real_random, real_pixels = re_mod.random, re_mod._get_pixels
    for b, (t, l, h, w) in enumerate(boxes):
        key = rng_key(seed, 6, epoch, 100 + b)  # RNG_STREAM_ERASE_FILL, sample 100 + b
        fill = np.zeros((C, h, w), np.float32)
        for c in range(C):
            for y in range(h):
                for xx in range(w):
                    fill[c, y, xx] = normal_at(key, ((t + y) * W + (l + xx)) * C + c)
        re_mod.random = _BoxDraws(h, w, t, l, H, W)
        re_mod._get_pixels = lambda *args, f=fill, **kw: torch.from_numpy(f)
        erasing(out[b])
    re_mod.random, re_mod._get_pixels = real_random, real_pixels
    tensors["erase/x"] = x.transpose(0, 2, 3, 1).copy()
    tensors["erase/out"] = out.numpy().transpose(0, 2, 3, 1).copy()
    tensors["erase/boxes"] = np.array(boxes, np.int32)
    meta["erase/key"] = f"{seed},{epoch},100"


def mix_cases(tensors, meta):
    B, C, H, W, K = 4, 3, 12, 10, 7
    rng = np.random.default_rng(6)
    x = rng.normal(0, 1, (B, C, H, W)).astype(np.float32)
    labels = np.array([1, 4, 4, 6], np.int64)
    tensors["mix/x"] = x.transpose(0, 2, 3, 1).copy()
    tensors["mix/labels"] = labels.astype(np.int32)
    for kind, lam, center in [("mixup", 0.3137, None), ("cutmix", 0.61, (2, 8))]:
        m = mixup_mod.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=SMOOTHING,
                            num_classes=K)
        m._params_per_batch = lambda lam=lam, kind=kind: (lam, kind == "cutmix")
        real_randint = np.random.randint
        if center:
            draws = list(center)
            np.random.randint = lambda *a, **k: draws.pop(0)
        boxes = []
        real_bbox = mixup_mod.cutmix_bbox_and_lam

        def spy(*a, **k):
            r = real_bbox(*a, **k)
            boxes.append(r)
            return r

        mixup_mod.cutmix_bbox_and_lam = spy
        xt = torch.from_numpy(x.copy())
        out, target = m(xt, torch.from_numpy(labels))
        mixup_mod.cutmix_bbox_and_lam = real_bbox
        np.random.randint = real_randint
        tensors[f"{kind}/out"] = out.numpy().transpose(0, 2, 3, 1).copy()
        tensors[f"{kind}/target"] = target.numpy().astype(np.float32)
        meta[f"{kind}/lam"] = repr(lam)
        if center:
            (yl, yh, xl, xh), lam_c = boxes[0]
            meta[f"{kind}/center"] = f"{center[0]},{center[1]}"
            meta[f"{kind}/box"] = f"{int(yl)},{int(xl)},{int(yh - yl)},{int(xh - xl)}"
            meta[f"{kind}/lam_corrected"] = repr(float(lam_c))
    # Soft-target cross entropy on the cutmix targets, in float64.
    logits = torch.from_numpy(rng.normal(0, 3, (B, K)).astype(np.float32))
    ld = logits.double().requires_grad_(True)
    loss = SoftTargetCrossEntropy()(ld, torch.from_numpy(tensors["cutmix/target"]).double())
    loss.backward()
    tensors["loss/logits"] = logits.numpy()
    tensors["loss/grad"] = ld.grad.numpy().astype(np.float32)
    meta["loss/value"] = repr(loss.item())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/augment/aug_parity.safetensors")
    args = ap.parse_args()
    random.seed(0)
    fm = fashion_images(2)
    images = {"fm0": fm[0][..., None], "fm1": fm[1][..., None],
              "syn0": synthetic_photo(36, 44, 1), "syn1": synthetic_photo(29, 41, 2),
              "big": synthetic_photo(97, 131, 3)}
    tensors, meta = {}, {}
    for name, img in images.items():
        tensors[f"img/{name}"] = img
    randaugment_cases({k: v for k, v in images.items() if k != "big"}, tensors, meta)
    resize_cases(images, tensors)
    jitter_cases(images, tensors)
    erase_cases(tensors, meta)
    mix_cases(tensors, meta)
    meta.update(smoothing=repr(SMOOTHING), fill_rgb=",".join(map(str, FILL_RGB)), fill_l=str(FILL_L),
                torch_version=torch.__version__, timm_version=timm.__version__,
                pillow_version=PIL.__version__, torchvision_version=torchvision.__version__)
    total = sum(t.nbytes for t in tensors.values())
    if total > MAX_BYTES:
        raise SystemExit(f"fixtures would take {total} bytes, over {MAX_BYTES}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, args.out, metadata=meta)
    print(f"wrote {args.out}: {len(tensors)} tensors, {total} bytes "
          f"(torch {torch.__version__}, timm {timm.__version__}, Pillow {PIL.__version__})")


if __name__ == "__main__":
    main()
