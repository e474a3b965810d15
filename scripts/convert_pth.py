#!/usr/bin/env python3
"""Converts a PyTorch Swin checkpoint (.pth) into safetensors that swin.c can load (init_from,
swin_predict with a CONFIG).

    python3 scripts/convert_pth.py IN.pth OUT.safetensors [--dtype f32|bf16|f16]

The checkpoint may be a bare state dict or a dict holding it under 'model' (the official Swin
releases) or 'state_dict'. Buffers (relative_position_index, attn_mask, relative_coords_table)
and entries that are not floating-point tensors are dropped; every other name is kept as it is:
swin.c's importer reads both the timm layout (layers.{i}.downsample at the start of stages 1..3,
head.fc.*) and the official one (downsample at the end of stages 0..2, head.*). Needs torch and
safetensors.
"""
import argparse
import collections
import collections.abc
import os
import re
import sys

BUFFER_MARKERS = ("relative_position_index", "attn_mask", "relative_coords_table")
DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def load_checkpoint(path):
    import torch
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # e.g. pickled config objects in the checkpoint
        print(f"WARNING: torch.load(weights_only=True) failed: {type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}\n"
              f"WARNING: loading '{path}' with weights_only=False, which runs code stored in the "
              f"file: do this only for checkpoints from a source you trust", file=sys.stderr)
        return torch.load(path, map_location="cpu", weights_only=False)


def state_dict_of(checkpoint):
    """The state dict inside a checkpoint: checkpoint['model'], checkpoint['state_dict'] or the
    checkpoint itself."""
    assert isinstance(checkpoint, collections.abc.Mapping), \
        f"the checkpoint is a {type(checkpoint).__name__}, not a dict of tensors"
    for key in ("model", "state_dict"):
        if key in checkpoint and hasattr(checkpoint[key], "state_dict"):  # a pickled nn.Module
            print(f"using checkpoint['{key}'].state_dict()")
            return checkpoint[key].state_dict()
        if key in checkpoint and isinstance(checkpoint[key], collections.abc.Mapping):
            print(f"using checkpoint['{key}'] (other top-level entries: "
                  f"{sorted(str(k) for k in checkpoint if k != key) or 'none'})")
            return checkpoint[key]
    return checkpoint


def convert(state_dict, dtype_name):
    """Returns (tensors to write, dropped) where dropped maps a reason to the names dropped."""
    import torch
    dtype = getattr(torch, DTYPES[dtype_name])
    tensors, dropped = {}, collections.defaultdict(list)
    for name, value in state_dict.items():
        if not isinstance(name, str):
            dropped["key is not a string"].append(repr(name))
        elif not isinstance(value, torch.Tensor):
            dropped["not a tensor"].append(f"{name} ({type(value).__name__})")
        elif any(marker in name for marker in BUFFER_MARKERS):
            dropped["buffer"].append(name)
        elif not value.is_floating_point():
            dropped["not floating point"].append(f"{name} ({value.dtype})")
        else:
            # A fresh contiguous copy: safetensors refuses tensors that share memory.
            tensors[name] = value.detach().to(device="cpu", dtype=dtype, copy=True).contiguous()
    return tensors, dropped


def describe_layout(names):
    if "head.fc.weight" in names:
        return "timm layout (head.fc.*)"
    if "head.weight" in names:
        return "official layout (head.*, downsample at the end of stages 0..2)"
    return "no classifier head found (neither head.fc.weight nor head.weight)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="PyTorch checkpoint (.pth / .pt)")
    ap.add_argument("output", help="safetensors file to write")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32",
                    help="dtype of the written tensors (default f32)")
    args = ap.parse_args()
    from safetensors.torch import save_file

    assert os.path.isfile(args.input), f"no such file: {args.input}"
    state_dict = state_dict_of(load_checkpoint(args.input))
    tensors, dropped = convert(state_dict, args.dtype)
    assert tensors, f"'{args.input}' holds no floating-point tensors to convert"
    if any(n.startswith("module.") for n in tensors):
        print("WARNING: names start with 'module.' (a DistributedDataParallel wrapper); swin.c "
              "expects names without it", file=sys.stderr)
    save_file(tensors, args.output, metadata={"format": "pt"})

    print(f"wrote {len(tensors)} tensors ({sum(t.numel() for t in tensors.values()):,} values, "
          f"{args.dtype}) to {args.output}; {describe_layout(tensors)}")
    if not dropped:
        print("dropped nothing")
    for reason, names in dropped.items():
        # One line per kind: layers.0.blocks.1.attn_mask -> layers.*.blocks.*.attn_mask
        kinds = collections.Counter(re.sub(r"\.\d+\.", ".*.", n) for n in names)
        summary = ", ".join(f"{k} x{c}" if c > 1 else k for k, c in sorted(kinds.items()))
        print(f"dropped {len(names)} ({reason}): {summary}")


if __name__ == "__main__":
    main()
