#!/usr/bin/env python3
"""Reference fixtures for swin.c's parity test (tests/test_parity.c), computed by timm.

What: for three small Swin Transformers chosen to cover the geometry corner cases (shifted windows
in two stages; a rectangular image whose maps shift along both sides, then along W only, then are
smaller than the window; a last stage whose map equals the window), and two small Swin V2 models
(shifted windows in two stages; the rectangular three-stage geometry with pretrained window sizes
and one head's logit scale above its clamp), this builds timm's SwinTransformer or
SwinTransformerV2, gives every parameter random values, and records in one safetensors file per
model: an input batch (channels-last, swin.c's layout), labels, the logits, every parameter, the
gradient of the label-smoothed cross-entropy, and the weights after 1 and 5 AdamW steps with
global-norm clipping, the no-decay set and swin.c's warmup + cosine schedule (AdamW eps 1e-6,
not 1e-8: see EPS below). The file's "config" metadata is an INI text swin.c parses into the
same model and optimizer settings.

Why float64: swin.c computes in fp32; the reference runs in float64 on the CPU, so its own
rounding (~1e-16) is far below what the test measures, and a difference is swin.c's. The initial
weights and the input are rounded to fp32 values before the float64 run, so both sides start from
exactly the same numbers. Everything is stored as F32 (labels as I32) at the end.

Before writing anything the script also checks the facts about timm that swin.c reproduces: the
parameter names and shapes (the same list src/model/model.c builds), the per-side window clamp and
shift of every block, the relative position index, the shifted-window mask, and the patch-merging
concatenation order. A difference stops it with a message.

Regenerate (on a machine with torch and timm; CPU is enough, a few seconds):
    python3 scripts/make_fixtures.py [--out tests/fixtures]
The same checks at full size (swinv2_tiny_window8_256's and swin_tiny_patch4_window7_224's shapes,
batch 2, ~450 MB a file, kept out of the repository): scripts/parity_full_size.sh.
The files depend on the torch/timm versions only through rounding; the versions used are in each
file's metadata ("torch_version", "timm_version").
"""
import argparse
import json
import math
import os
import struct

import numpy as np

# ------------------------------------------------------------------------------------------------
# The models (all drop rates 0, qkv_bias True, global_pool 'avg').

CONFIGS = [
    # 16x16 -> 8x8 tokens, window 4: both stages have shifted blocks (shift 2,2).
    dict(name="shifted_two_stages", img=(32, 32), in_chans=3, patch=2, embed=16, depths=(2, 2),
         heads=(2, 4), window=4, mlp=4.0, classes=7, batch=3, seed=1),
    # 8x16 -> 4x8 -> 2x4 tokens, window 4: shift along both sides (2,2), then along W only (0,2),
    # then a map smaller than the window (window 2x4, no shift).
    dict(name="rect_three_stages", img=(16, 32), in_chans=3, patch=2, embed=8, depths=(2, 2, 2),
         heads=(1, 2, 4), window=4, mlp=2.0, classes=5, batch=2, seed=2),
    # 14x14 -> 7x7 tokens, window 7: shift 3,3, then one window equal to the map, no shift.
    dict(name="last_equals_window", img=(28, 28), in_chans=1, patch=2, embed=12, depths=(2, 2),
         heads=(2, 4), window=7, mlp=4.0, classes=10, batch=2, seed=3),
    # Swin V2 (version 2): res-post-norm, cosine attention, the continuous position bias.
    dict(name="v2_shifted_two_stages", version=2, img=(32, 32), in_chans=3, patch=2, embed=16,
         depths=(2, 2), heads=(2, 4), window=4, mlp=4.0, classes=7, batch=3, seed=4),
    # Coordinates normalized by pretrained windows (6, 5, 3: stage 2's window is 2x4), and one
    # head of layers.1.blocks.1 with its logit scale above ln 100 (clamped: no gradient).
    dict(name="v2_rect_pretrained", version=2, img=(16, 32), in_chans=3, patch=2, embed=8,
         depths=(2, 2, 2), heads=(1, 2, 4), window=4, mlp=2.0, classes=5, batch=2, seed=5,
         pretrained=(6, 5, 3), clamped="layers.1.blocks.1.attn.logit_scale"),
]

# Full-size models (--full-size): the shapes of timm's named models with the same random weights,
# too large for the repository (~450 MB a file: the weights four times over); written to --out and
# checked by `test_parity FILE...` (scripts/parity_full_size.sh).
FULL_SIZE = [
    # swinv2_tiny_window8_256: 64x64 -> 32x32 -> 16x16 -> 8x8 tokens, window 8, shift 4 in the
    # first three stages, the last map one window.
    dict(name="swinv2_tiny_window8_256", version=2, img=(256, 256), in_chans=3, patch=4, embed=96,
         depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), window=8, mlp=4.0, classes=1000, batch=2,
         seed=6),
    # swin_tiny_patch4_window7_224: 56x56 -> 28x28 -> 14x14 -> 7x7 tokens, window 7.
    dict(name="swin_tiny_patch4_window7_224", img=(224, 224), in_chans=3, patch=4, embed=96,
         depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), window=7, mlp=4.0, classes=1000, batch=2,
         seed=7),
]

# Optimizer and schedule (swin.c: optim/adamw.h, optim/clip.h, optim/schedule.h).
PEAK_LR, WARMUP_LR, MIN_LR = 1e-3, 1e-5, 1e-5
WARMUP_STEPS, TOTAL_STEPS = 2, 5
WEIGHT_DECAY, BETA1, BETA2 = 0.05, 0.9, 0.999
# AdamW eps is 1e-6 here, not the recipe's 1e-8: the key third of every attn.qkv.bias has a
# gradient that is exactly zero (adding a constant to the keys shifts each row of q k^T by a
# constant, which softmax ignores). float64 gives ~1e-19 there, fp32 ~1e-11 of rounding noise,
# and with eps 1e-8 AdamW turns that noise into steps of ~1e-3 * lr, which after 5 steps put
# those tensors ~1.5e-5 (relative) away from the reference while everything else agrees to ~1e-7.
# With eps 1e-6 the noise moves them by < 1e-7; eps is still exercised as a term of the update.
EPS = 1e-6
CLIP_GRAD = 0.5  # small enough that clipping is active (checked; lowered if the norm is below it)
LABEL_SMOOTHING = 0.1
NUM_STEPS = 5
MAX_TOTAL_BYTES = 3_500_000  # keep the fixtures in the repository small


def lr_at_step(t):
    """swin.c's optim/schedule.h: linear warmup from WARMUP_LR, then cosine to MIN_LR."""
    if t < WARMUP_STEPS:
        return WARMUP_LR + (PEAK_LR - WARMUP_LR) * t / WARMUP_STEPS
    if t >= TOTAL_STEPS:
        return MIN_LR
    progress = (t - WARMUP_STEPS) / (TOTAL_STEPS - WARMUP_STEPS)
    return MIN_LR + (PEAK_LR - MIN_LR) * (1 + math.cos(math.pi * progress)) / 2


# ------------------------------------------------------------------------------------------------
# safetensors, written and read by hand (no dependency beyond numpy)

_DTYPE_NAMES = {("f", 4): "F32", ("i", 4): "I32", ("f", 2): "F16"}  # (numpy kind, itemsize)
_NAME_DTYPES = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4"), "F16": np.dtype("<f2")}


def save_safetensors(path, tensors, metadata):
    """Writes tensors (a list of (name, numpy array) pairs, F32/I32/F16, kept in this order) and
    metadata (str -> str) as safetensors: 8-byte little-endian header length, the JSON header with
    "__metadata__" first, padded with spaces so the data section starts 8-byte aligned, then the
    tensors back to back. Writes PATH.tmp and renames it over PATH."""
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()), \
        "safetensors metadata keys and values must all be strings"
    header = {"__metadata__": dict(metadata)}
    blobs, offset = [], 0
    for name, array in tensors:
        assert isinstance(name, str) and name and name != "__metadata__", f"bad name {name!r}"
        assert name not in header, f"tensor {name!r} given twice"
        array = np.asarray(array)
        dtype_name = _DTYPE_NAMES.get((array.dtype.kind, array.dtype.itemsize))
        assert dtype_name, f"tensor {name!r}: dtype {array.dtype} not supported (F32, I32, F16)"
        little = np.ascontiguousarray(array, dtype=_NAME_DTYPES[dtype_name])
        data = little.tobytes(order="C")
        header[name] = {"dtype": dtype_name, "shape": [int(d) for d in little.shape],
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)  # 8 + len(text) is then a multiple of 8
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_safetensors(path):
    """Reads a safetensors file (F32, I32, F16 tensors) written by anyone; returns
    (dict name -> numpy array, in file order, and the metadata dict). Checks that the header is
    sane and that the tensors tile the data section exactly."""
    with open(path, "rb") as f:
        raw = f.read()
    assert len(raw) >= 8, f"{path}: shorter than the 8-byte header length"
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), f"{path}: header length {n} runs past the end of the file"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    assert isinstance(header, dict), f"{path}: the header is not a JSON object"
    metadata = header.pop("__metadata__", {})
    data = raw[8 + n:]
    tensors, spans = {}, []
    for name, entry in header.items():
        assert set(entry) == {"dtype", "shape", "data_offsets"}, f"{path}: {name}: fields {entry}"
        dtype = _NAME_DTYPES.get(entry["dtype"])
        assert dtype is not None, f"{path}: {name}: dtype {entry['dtype']} not supported here"
        begin, end = entry["data_offsets"]
        count = int(np.prod(entry["shape"], dtype=np.int64))
        assert end - begin == count * dtype.itemsize, \
            f"{path}: {name}: shape {entry['shape']} does not match bytes [{begin}, {end})"
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(entry["shape"])
        spans.append((begin, end, name))
    covered = 0
    for begin, end, name in sorted(spans):
        assert begin == covered, f"{path}: gap or overlap before {name} at byte {begin}"
        covered = end
    assert covered == len(data), f"{path}: {len(data) - covered} bytes after the last tensor"
    return tensors, metadata


# ------------------------------------------------------------------------------------------------
# What swin.c builds for a config (src/model/model.c), in plain Python

def stage_geometry(cfg):
    """Per stage: token map (H, W), window (wh, ww) and the shift of the odd blocks (sh, sw).
    A side no larger than the window becomes the window side and is not shifted, per side."""
    H, W = cfg["img"][0] // cfg["patch"], cfg["img"][1] // cfg["patch"]
    win = cfg["window"]
    stages = []
    for s in range(len(cfg["depths"])):
        h, w = H >> s, W >> s
        wh, ww = min(h, win), min(w, win)
        sh, sw = (0 if h <= win else win // 2), (0 if w <= win else win // 2)
        stages.append(dict(H=h, W=w, window=(wh, ww), shift=(sh, sw)))
    return stages


def expected_params_v2(cfg):
    """expected_params for a V2 model: merging reduces then normalizes; blocks carry the logit
    scale, q and v biases, the position-bias MLP, and post-norms."""
    E, p, cin = cfg["embed"], cfg["patch"], cfg["in_chans"]
    out = [("patch_embed.proj.weight", (E, cin, p, p)), ("patch_embed.proj.bias", (E,)),
           ("patch_embed.norm.weight", (E,)), ("patch_embed.norm.bias", (E,))]
    for s in range(len(cfg["depths"])):
        C, heads = E << s, cfg["heads"][s]
        if s > 0:
            out += [(f"layers.{s}.downsample.reduction.weight", (C, 2 * C)),
                    (f"layers.{s}.downsample.norm.weight", (C,)),
                    (f"layers.{s}.downsample.norm.bias", (C,))]
        hidden = int(C * cfg["mlp"])
        for j in range(cfg["depths"][s]):
            b = f"layers.{s}.blocks.{j}."
            out += [(b + "attn.logit_scale", (heads, 1, 1)), (b + "attn.q_bias", (C,)),
                    (b + "attn.v_bias", (C,)), (b + "attn.cpb_mlp.0.weight", (512, 2)),
                    (b + "attn.cpb_mlp.0.bias", (512,)), (b + "attn.cpb_mlp.2.weight", (heads, 512)),
                    (b + "attn.qkv.weight", (3 * C, C)),
                    (b + "attn.proj.weight", (C, C)), (b + "attn.proj.bias", (C,)),
                    (b + "norm1.weight", (C,)), (b + "norm1.bias", (C,)),
                    (b + "mlp.fc1.weight", (hidden, C)), (b + "mlp.fc1.bias", (hidden,)),
                    (b + "mlp.fc2.weight", (C, hidden)), (b + "mlp.fc2.bias", (C,)),
                    (b + "norm2.weight", (C,)), (b + "norm2.bias", (C,))]
    Cl, K = E << (len(cfg["depths"]) - 1), cfg["classes"]
    out += [("norm.weight", (Cl,)), ("norm.bias", (Cl,)),
            ("head.fc.weight", (K, Cl)), ("head.fc.bias", (K,))]
    return out


def cpb_coords(wh, ww, pretrained):
    """swin.c's cpb_coords_build (kernels/cosine_attention.h): ((2wh-1)(2ww-1), 2) in float32."""
    dh = np.arange(-(wh - 1), wh, dtype=np.float32)
    dw = np.arange(-(ww - 1), ww, dtype=np.float32)
    t = np.stack(np.meshgrid(dh, dw, indexing="ij"), axis=-1)
    t[..., 0] /= np.float32((pretrained if pretrained > 0 else wh) - 1)
    t[..., 1] /= np.float32((pretrained if pretrained > 0 else ww) - 1)
    t *= np.float32(8)
    t = np.sign(t) * np.log2(np.abs(t) + np.float32(1)) / np.float32(math.log2(8))
    return t.reshape(-1, 2).astype(np.float32)


def expected_params(cfg):
    """(name, shape) of every parameter in swin.c's order (src/model/model.c walk_params), which is
    also timm's state-dict order."""
    if cfg.get("version", 1) == 2:
        return expected_params_v2(cfg)
    E, p, cin = cfg["embed"], cfg["patch"], cfg["in_chans"]
    out = [("patch_embed.proj.weight", (E, cin, p, p)), ("patch_embed.proj.bias", (E,)),
           ("patch_embed.norm.weight", (E,)), ("patch_embed.norm.bias", (E,))]
    for s, g in enumerate(stage_geometry(cfg)):
        C, heads = E << s, cfg["heads"][s]
        if s > 0:
            out += [(f"layers.{s}.downsample.norm.weight", (2 * C,)),
                    (f"layers.{s}.downsample.norm.bias", (2 * C,)),
                    (f"layers.{s}.downsample.reduction.weight", (C, 2 * C))]
        wh, ww = g["window"]
        hidden = int(C * cfg["mlp"])
        for j in range(cfg["depths"][s]):
            b = f"layers.{s}.blocks.{j}."
            out += [(b + "norm1.weight", (C,)), (b + "norm1.bias", (C,)),
                    (b + "attn.relative_position_bias_table", ((2 * wh - 1) * (2 * ww - 1), heads)),
                    (b + "attn.qkv.weight", (3 * C, C)), (b + "attn.qkv.bias", (3 * C,)),
                    (b + "attn.proj.weight", (C, C)), (b + "attn.proj.bias", (C,)),
                    (b + "norm2.weight", (C,)), (b + "norm2.bias", (C,)),
                    (b + "mlp.fc1.weight", (hidden, C)), (b + "mlp.fc1.bias", (hidden,)),
                    (b + "mlp.fc2.weight", (C, hidden)), (b + "mlp.fc2.bias", (C,))]
    Cl, K = E << (len(cfg["depths"]) - 1), cfg["classes"]
    out += [("norm.weight", (Cl,)), ("norm.bias", (Cl,)),
            ("head.fc.weight", (K, Cl)), ("head.fc.bias", (K,))]
    return out


def relative_position_index(wh, ww):
    """swin.c's kernels/cpu/window.c: index[i, j] for tokens i = (ri, ci), j = (rj, cj)."""
    r, c = np.divmod(np.arange(wh * ww), ww)
    return (r[:, None] - r[None, :] + wh - 1) * (2 * ww - 1) + (c[:, None] - c[None, :] + ww - 1)


def shift_mask(H, W, window, shift):
    """swin.c's attention_mask_build: (nW, N, N), 0 where two tokens of a window come from the
    same region of the un-rolled map, -100 elsewhere; regions per side are [0, S-w), [S-w, S-s),
    [S-s, S), and a side with shift 0 is one region."""
    (wh, ww), (sh, sw) = window, shift

    def region(p, size, win, s):
        return 0 if s == 0 or p < size - win else (1 if p < size - s else 2)

    nWh, nWw, N = H // wh, W // ww, wh * ww
    mask = np.zeros((nWh * nWw, N, N))
    for wi in range(nWh):
        for wj in range(nWw):
            labels = np.array([region(wi * wh + t // ww, H, wh, sh) * 3 +
                               region(wj * ww + t % ww, W, ww, sw) for t in range(N)])
            mask[wi * nWw + wj] = np.where(labels[:, None] == labels[None, :], 0.0, -100.0)
    return mask


def config_ini(cfg, clip):
    """The fixture's config as swin.c reads it (src/base/config.h keys)."""
    def fmt(v):
        return ",".join(str(x) for x in v)
    H, W = cfg["img"]
    return "\n".join([
        f"# swin.c config of the timm fixture '{cfg['name']}' (scripts/make_fixtures.py)",
        "seed = 0",
        "",
        "[model]",
    ] + ([
        "version = 2",
        f"pretrained_window_sizes = {fmt(cfg.get('pretrained', (0,)))}",
    ] if cfg.get("version", 1) == 2 else []) + [
        f"img_size = {H},{W}",
        f"in_chans = {cfg['in_chans']}",
        f"patch_size = {cfg['patch']}",
        f"embed_dim = {cfg['embed']}",
        f"depths = {fmt(cfg['depths'])}",
        f"num_heads = {fmt(cfg['heads'])}",
        f"window_size = {cfg['window']}",
        f"mlp_ratio = {cfg['mlp']:g}",
        "qkv_bias = true",
        "drop_path_rate = 0",
        f"num_classes = {cfg['classes']}",
        "",
        "[train]",
        f"lr = {PEAK_LR!r}",
        "lr_scale_batch = 0",
        f"min_lr = {MIN_LR!r}",
        f"warmup_lr = {WARMUP_LR!r}",
        f"weight_decay = {WEIGHT_DECAY!r}",
        f"beta1 = {BETA1!r}",
        f"beta2 = {BETA2!r}",
        f"eps = {EPS!r}",
        f"clip_grad = {clip!r}",
        f"label_smoothing = {LABEL_SMOOTHING!r}",
        f"batch_size = {cfg['batch']}",
        "",
        "[data]",
        "# the fixture's input is already normalized",
        "mean = 0",
        "std = 1",
        "",
    ])


# ------------------------------------------------------------------------------------------------
# timm

def build_model(cfg):
    if cfg.get("version", 1) == 2:
        from timm.models.swin_transformer_v2 import SwinTransformerV2
        model = SwinTransformerV2(
            img_size=tuple(cfg["img"]), patch_size=cfg["patch"], in_chans=cfg["in_chans"],
            num_classes=cfg["classes"], embed_dim=cfg["embed"], depths=tuple(cfg["depths"]),
            num_heads=tuple(cfg["heads"]), window_size=cfg["window"], mlp_ratio=cfg["mlp"],
            qkv_bias=True, drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0,
            global_pool="avg",
            pretrained_window_sizes=tuple(cfg.get("pretrained", (0,) * len(cfg["depths"]))))
        return model.double()
    from timm.models.swin_transformer import SwinTransformer
    model = SwinTransformer(
        img_size=tuple(cfg["img"]), patch_size=cfg["patch"], in_chans=cfg["in_chans"],
        num_classes=cfg["classes"], embed_dim=cfg["embed"], depths=tuple(cfg["depths"]),
        num_heads=tuple(cfg["heads"]), window_size=cfg["window"], mlp_ratio=cfg["mlp"],
        qkv_bias=True, drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0, global_pool="avg")
    return model.double()


def check_timm_matches_swin_c(model, cfg):
    """Asserts the facts swin.c relies on, on the installed timm."""
    import torch
    v2 = cfg.get("version", 1) == 2
    if v2:
        from timm.models.swin_transformer_v2 import PatchMerging
        from timm.models.swin_transformer_v2 import SwinTransformerV2Block as SwinTransformerBlock
    else:
        from timm.models.swin_transformer import PatchMerging, SwinTransformerBlock
    name = cfg["name"]
    # State dict = parameters, with swin.c's names, shapes and order.
    is_buffer = lambda k: ("relative_position_index" in k or "attn_mask" in k  # noqa: E731
                           or "relative_coords_table" in k or k.endswith("k_bias"))
    sd_keys = [k for k in model.state_dict() if not is_buffer(k)]
    param_names = [n for n, _ in model.named_parameters()]
    assert sd_keys == param_names, (
        f"{name}: timm's state dict (minus buffers) differs from its parameters:\n"
        f"  only in state dict: {sorted(set(sd_keys) - set(param_names))}\n"
        f"  only in parameters: {sorted(set(param_names) - set(sd_keys))}")
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    want = expected_params(cfg)
    if got != want:
        diff = [f"  timm {g}  swin.c {w}" for g, w in zip(got, want) if g != w][:10]
        raise AssertionError(f"{name}: timm's parameters differ from swin.c's list "
                             f"({len(got)} vs {len(want)} tensors):\n" + "\n".join(diff))
    # Window, shift, relative position index and mask of every block.
    geometry = stage_geometry(cfg)
    for s, stage in enumerate(model.layers):
        g = geometry[s]
        for j, block in enumerate(stage.blocks):
            assert isinstance(block, SwinTransformerBlock)
            where = f"{name}: layers.{s}.blocks.{j} (map {g['H']}x{g['W']})"
            shift = g["shift"] if j % 2 == 1 else (0, 0)
            assert tuple(block.input_resolution) == (g["H"], g["W"]), \
                f"{where}: timm's input_resolution is {block.input_resolution}"
            assert tuple(block.window_size) == g["window"], \
                f"{where}: timm's window is {block.window_size}, swin.c uses {g['window']}"
            assert tuple(block.shift_size) == shift, \
                f"{where}: timm's shift is {block.shift_size}, swin.c uses {shift}"
            index = block.attn.relative_position_index.cpu().numpy()
            assert np.array_equal(index, relative_position_index(*g["window"])), \
                f"{where}: timm's relative_position_index differs from swin.c's formula"
            if any(shift):
                assert block.attn_mask is not None, f"{where}: shifted block without a mask"
                mask = block.attn_mask.cpu().double().numpy()
                assert np.array_equal(mask, shift_mask(g["H"], g["W"], g["window"], shift)), \
                    f"{where}: timm's attention mask differs from swin.c's region labels"
            else:
                assert block.attn_mask is None, f"{where}: unshifted block with a mask"
            assert not getattr(block.attn, "fused_attn", False), \
                f"{where}: fused attention is on; set TIMM_FUSED_ATTN=0"
            if v2:
                pretrained = cfg.get("pretrained", (0,) * len(cfg["depths"]))[s]
                table = block.attn.relative_coords_table.cpu().numpy().reshape(-1, 2)
                want = cpb_coords(*g["window"], pretrained).astype(np.float64)
                # float32 log2 may round differently by an ulp between libraries.
                assert np.allclose(table, want, rtol=3e-7, atol=0), \
                    f"{where}: timm's relative_coords_table differs from swin.c's coordinates " \
                    f"(max diff {np.abs(table - want).max():.3g})"
    for s, g in enumerate(geometry):
        print(f"{name}: layers.{s}: map {g['H']}x{g['W']}, window {g['window'][0]}x"
              f"{g['window'][1]}, odd blocks shift {g['shift']}: timm agrees with swin.c")
    # Patch merging gathers [x(0::2,0::2), x(1::2,0::2), x(0::2,1::2), x(1::2,1::2)] on channels.
    gen = torch.Generator().manual_seed(0)
    for s, stage in enumerate(model.layers):
        if not isinstance(stage.downsample, PatchMerging):
            assert s == 0, f"{name}: stage {s} has no patch merging"
            continue
        g, C = geometry[s - 1], cfg["embed"] << (s - 1)
        x = torch.randn(2, g["H"], g["W"], C, dtype=torch.float64, generator=gen)
        cat = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
                        dim=-1)
        ds = stage.downsample
        with torch.no_grad():
            want = ds.norm(ds.reduction(cat)) if v2 else ds.reduction(ds.norm(cat))
            got = ds(x)
        assert torch.allclose(got, want, rtol=0, atol=1e-12), \
            f"{name}: layers.{s}.downsample does not concatenate in swin.c's order"
        print(f"{name}: layers.{s}.downsample concatenates [x(0::2,0::2), x(1::2,0::2), "
              f"x(0::2,1::2), x(1::2,1::2)]: timm agrees with swin.c")


def reinitialize(model, torch, clamped=None):
    """Every parameter random, so no bug hides behind zeros and ones: Linear/conv weights and
    biases N(0, 0.1^2); LayerNorm weight 1 + 0.1 N, bias 0.1 N; bias tables N(0, 0.5^2). Values are
    rounded to fp32 so that swin.c loads exactly the weights the float64 reference uses."""
    nn = torch.nn
    kinds = {}
    for mname, module in model.named_modules():
        for pname, _ in module.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if isinstance(module, nn.LayerNorm):
                kind = "ln_" + pname
            elif pname == "relative_position_bias_table":
                kind = "table"
            elif pname == "logit_scale":
                kind = "logit_scale"
            elif pname in ("q_bias", "v_bias"):
                kind = "linear"
            elif ".cpb_mlp.0" in full:
                kind = "cpb_in"
            elif isinstance(module, (nn.Linear, nn.Conv2d)) and pname in ("weight", "bias"):
                kind = "linear"
            else:
                raise AssertionError(f"parameter {full} of {type(module).__name__}: no init rule")
            kinds[full] = kind
    names = [n for n, _ in model.named_parameters()]
    assert sorted(kinds) == sorted(names), "every parameter needs exactly one init rule"
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, dtype=torch.float64)
            value = {"ln_weight": 1 + 0.1 * noise, "ln_bias": 0.1 * noise, "table": 0.5 * noise,
                     "linear": 0.1 * noise, "cpb_in": 0.5 * noise,
                     "logit_scale": math.log(10) + 0.3 * noise}[kinds[name]]
            if name == clamped:
                value[0] = 5.0  # above ln 100: the forward clamps it, its gradient is 0
            p.copy_(value.float().double())


def make_fixture(cfg, out_dir):
    import timm
    import torch
    name, B, K = cfg["name"], cfg["batch"], cfg["classes"]
    H, W = cfg["img"]
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg)
    check_timm_matches_swin_c(model, cfg)
    reinitialize(model, torch, cfg.get("clamped"))
    x = torch.randn(B, cfg["in_chans"], H, W, dtype=torch.float64).float().double()
    labels = torch.randint(0, K, (B,), dtype=torch.int64)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)

    # Logits, loss and gradients at the initial weights.
    model.eval()
    with torch.no_grad():
        logits_eval = model(x)
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(x)
    diff = (logits - logits_eval).abs().max().item()
    assert diff <= 1e-12, f"{name}: train and eval logits differ by {diff} with all drops at 0"
    loss = criterion(logits, labels)
    loss.backward()
    params = list(model.named_parameters())
    init = {n: p.detach().clone() for n, p in params}
    grads = {n: p.grad.detach().clone() for n, p in params}
    assert all(torch.isfinite(g).all() for g in grads.values()), f"{name}: non-finite gradient"
    grad_norm0 = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    clip = CLIP_GRAD
    if grad_norm0 <= 1.25 * clip:
        clip = float(f"{grad_norm0 / 2:.1g}")
        print(f"{name}: gradient norm {grad_norm0:.4g} is not above {CLIP_GRAD}; clip lowered "
              f"to {clip} so that clipping is active")
    assert grad_norm0 > clip, f"{name}: gradient norm {grad_norm0} does not exceed clip {clip}"

    # NUM_STEPS AdamW steps from the same weights on the same batch.
    # No decay for 1-D tensors, the bias tables, and V2's position-bias MLP and logit scales (the
    # official no_weight_decay_keywords), as swin.c's parameter table says.
    no_decay_words = ("relative_position_bias_table", "cpb_mlp", "logit_scale")
    decays = {n: p.ndim >= 2 and not any(w in n for w in no_decay_words) for n, p in params}
    decay = [p for n, p in params if decays[n]]
    no_decay = [p for n, p in params if not decays[n]]
    assert len(decay) + len(no_decay) == len(params)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=PEAK_LR, betas=(BETA1, BETA2), eps=EPS, foreach=False)
    step_lr, step_norm, snapshots = [], [], {}
    for t in range(NUM_STEPS):
        opt.zero_grad(set_to_none=True)
        loss_t = criterion(model(x), labels)
        loss_t.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
        if t == 0:
            assert abs(norm.item() - grad_norm0) <= 1e-9 * grad_norm0, \
                f"{name}: step 0 gradient norm {norm.item()} differs from {grad_norm0}"
            assert norm.item() > clip, f"{name}: clipping inactive at step 0"
        lr = lr_at_step(t)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        step_lr.append(lr)
        step_norm.append(norm.item())
        if t + 1 in (1, NUM_STEPS):
            snapshots[t + 1] = {n: p.detach().clone() for n, p in params}
        print(f"{name}: step {t}  loss {loss_t.item():.6f}  grad norm {norm.item():.4f}  "
              f"lr {lr:.3e}")

    def f32(t):
        return t.detach().cpu().numpy().astype(np.float32)

    tensors = [("input", f32(x.permute(0, 2, 3, 1).contiguous())),
               ("labels", labels.numpy().astype(np.int32)),
               ("logits", f32(logits))]
    for prefix, values in (("w.", init), ("grad.", grads), ("step1.", snapshots[1]),
                           ("step5.", snapshots[NUM_STEPS])):
        tensors += [(prefix + n, f32(values[n])) for n, _ in params]
    tensors += [("step_lr", np.array(step_lr, dtype=np.float32)),
                ("step_grad_norm", np.array(step_norm, dtype=np.float32))]
    metadata = {
        "config": config_ini(cfg, clip),
        "loss": repr(loss.item()),
        "warmup_steps": str(WARMUP_STEPS),
        "total_steps": str(TOTAL_STEPS),
        "timm_version": timm.__version__,
        "torch_version": torch.__version__,
        "torch_seed": str(cfg["seed"]),
        "generator": "scripts/make_fixtures.py",
    }
    path = os.path.join(out_dir, name + ".safetensors")
    save_safetensors(path, tensors, metadata)
    # Read it back: names, shapes and values survive the round trip.
    back, meta = load_safetensors(path)
    assert list(back) == [n for n, _ in tensors] and meta == metadata, f"{path}: round trip"
    for n, a in tensors:
        assert back[n].dtype == a.dtype and np.array_equal(back[n], a), f"{path}: {n} round trip"
    print(f"{name}: loss {loss.item():.9f}, {len(params)} parameters "
          f"({sum(p.numel() for _, p in params)} values), clip {clip}, wrote {path}")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "tests", "fixtures"),
                    help="output directory (default: tests/fixtures of this repository)")
    ap.add_argument("--full-size", nargs="*", metavar="NAME",
                    help="write the full-size models instead (FULL_SIZE: all, or those named); "
                         "needs --out outside the repository")
    args = ap.parse_args()
    configs = CONFIGS
    if args.full_size is not None:
        names = [c["name"] for c in FULL_SIZE]
        unknown = [n for n in args.full_size if n not in names]
        if unknown:
            ap.error(f"--full-size: unknown model {unknown[0]} (have: {', '.join(names)})")
        configs = [c for c in FULL_SIZE if not args.full_size or c["name"] in args.full_size]
        repo_fixtures = os.path.realpath(ap.get_default("out"))
        if os.path.realpath(args.out) == repo_fixtures:
            ap.error("--full-size writes ~450 MB a model: give --out a directory outside "
                     "tests/fixtures")
    # swin's attention is unfused in timm unless TIMM_FUSED_ATTN >= 2; make the plain path
    # (explicit q k^T + bias + mask, softmax, @ v) certain before timm is imported.
    os.environ["TIMM_FUSED_ATTN"] = "0"
    import timm
    import torch
    torch.set_num_threads(max(1, min(8 if args.full_size is None else 16, os.cpu_count() or 1)))
    print(f"torch {torch.__version__}, timm {timm.__version__}, float64 on the CPU")
    os.makedirs(args.out, exist_ok=True)
    paths = [make_fixture(cfg, args.out) for cfg in configs]
    total = 0
    for p in paths:
        size = os.path.getsize(p)
        total += size
        print(f"{size:>10,d} bytes  {p}")
    print(f"{total:>10,d} bytes  total")
    assert args.full_size is not None or total <= MAX_TOTAL_BYTES, \
        f"fixtures take {total} bytes, over {MAX_TOTAL_BYTES}: make the models smaller"


if __name__ == "__main__":
    main()
