#!/usr/bin/env python3
"""make_bias_resize_fixture.py OUT.safetensors: reference resizes of relative-position bias
tables for tests/test_bias_resize.c, made with PyTorch's interpolate exactly as the official
Swin load_pretrained resizes a table for another window: per head, the (S1h*S1w, heads) table
as an S1h x S1w image, F.interpolate(mode='bicubic', align_corners=False) to S2h x S2w.

Cases (window W gives a side of 2W - 1): 7 -> 12, 12 -> 7, 8 -> 16, square 7 -> rectangular
12 x 7, and rectangular 7 x 4 -> 8 x 12. For case k the file holds case<k>.src (S1h*S1w, heads),
case<k>.dst (S2h*S2w, heads), F32, seeded normal values scaled like trained tables (std 0.02
plus a smooth ramp, so the interpolation is not trivially zero). The resize runs in float64 on the
f32 source and is rounded once to f32, so the reference carries PyTorch's arithmetic (taps,
coefficients, border clamping) without its f32 rounding, which differs by order 1e-6 relative
from any other correct f32 or f64 evaluation order."""
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

CASES = [((7, 7), (12, 12), 3), ((12, 12), (7, 7), 4), ((8, 8), (16, 16), 2),
         ((7, 7), (12, 7), 3), ((7, 4), (8, 12), 2)]


def main():
    out = sys.argv[1]
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for k, ((h1, w1), (h2, w2), heads) in enumerate(CASES):
        s1h, s1w, s2h, s2w = 2 * h1 - 1, 2 * w1 - 1, 2 * h2 - 1, 2 * w2 - 1
        ramp = torch.linspace(-1, 1, s1h * s1w).unsqueeze(1).repeat(1, heads)
        src = 0.02 * torch.randn(s1h * s1w, heads, generator=gen) + 0.1 * ramp
        img = src.permute(1, 0).reshape(1, heads, s1h, s1w)
        dst = F.interpolate(img.double(), size=(s2h, s2w), mode="bicubic", align_corners=False)
        dst = dst.reshape(heads, s2h * s2w).permute(1, 0).float().contiguous()
        tensors[f"case{k}.src"] = src.contiguous()
        tensors[f"case{k}.dst"] = dst
    save_file(tensors, out)
    print(f"wrote {out}: {len(CASES)} cases")


if __name__ == "__main__":
    main()
