#!/usr/bin/env python3
"""Ecosystem check: swin.c's weights against timm, ONNX Runtime and the official .pth layout.

    python3 scripts/check_export.py --build BUILD_DIR [--work DIR]

For three models, "tiny" (32x32, 2 stages), "swin_tiny" (configs/swin_tiny.ini, 3 classes) and
"swinv2_tiny" (configs/swinv2_tiny_256.ini: Swin V2, timm's swinv2_tiny_window8_256, 3 classes):
  1. train 2 steps with BUILD/swin_train on a small random ImageFolder (made in DIR/data);
  2. export the checkpoint with BUILD/swin_export as f32 and bf16 safetensors;
  3. load each export into timm.create_model('swin_tiny_patch4_window7_224', ...) with
     load_state_dict(strict=True) and compare timm's logits (fp32, CPU) with BUILD/swin_predict's
     on the same random batch;
  4. export the timm model to ONNX and compare ONNX Runtime's logits with swin.c's;
  5. write the weights in the official Swin layout as a .pth (downsample at the end of stages
     0..2, head.*, index and mask buffers), convert it with scripts/convert_pth.py and compare
     swin_predict's logits on it with timm's.
Steps 4 and 5 are Swin V1's (timm's own ONNX export and the official V1 layout); Swin V2's ONNX is
swin.c's own, checked below.
Then the ONNX export written by swin.c itself (BUILD/swin_export CKPT OUT.onnx), for Swin-T 224,
Swin-B 384 (window 12), configs/fashion_mnist.ini's model, small odd shapes (H != W with three
stages, a window larger than the map, 1 and 4 channels, 1 class, no qkv bias) and Swin V2
(configs/swinv2_tiny_256.ini, and the three-stage H != W shape with pretrained windows):
  6. train 2 steps, export OUT.onnx in f32 and f16, with a dynamic batch and with batch=1;
  7. onnx.checker.check_model(full_check=True) on each file;
  8. ONNX Runtime's logits (CPU) for a batch of 1 and, through the dynamic batch, of 3 against
     swin_predict's and against timm's on the same weights (the f32 safetensors export) and input.
A compact table of the ONNX checks is printed last.

    python3 scripts/check_export.py --build BUILD_DIR --onnx-only     # steps 6-8 only

Prints a table (check, max abs diff, rel err = ||a - b|| / ||b||, tolerance, pass/fail) and exits
non-zero on any failure. Needs torch, timm, numpy, safetensors, onnx, onnxruntime and pillow; the
CPU is enough.
"""
import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMM_NAME = "swin_tiny_patch4_window7_224"
CLASSES = ("class_a", "class_b", "class_c")
BATCH = 2

# fp32 on both sides, the same weights and input: only the order of floating-point operations
# differs (GEMM blocking, reductions), which costs ~1e-7 per op and ~1e-6 over a whole network.
TOL_TIMM = 1e-5
# ONNX Runtime fuses and rewrites the graph (LayerNorm, GELU, attention MatMul/Softmax fusions)
# and runs its own MLAS kernels, so its rounding differs more from both; still fp32, 1e-4.
TOL_ONNX = 1e-4
# The f16 export holds weights and activations in f16 (unit roundoff 2^-11 = 4.9e-4). Each block
# rounds ~10 times on a LayerNorm-scaled residual branch, and independent roundings add up like a
# random walk over the depth: Swin-B's 24 blocks give ~sqrt(240) * 4.9e-4 = 7.6e-3 at worst, so the
# logits of the f16 graph must stay within 1e-2 of the fp32 ones. The table also shows PyTorch's
# own f16 error on the same weights (timm model.half()) as a yardstick.
TOL_ONNX_F16 = 1e-2

TINY_INI = """\
# check_export.py: a tiny Swin for the interchange check
seed = 0

[model]
img_size = 32
in_chans = 3
patch_size = 2
embed_dim = 16
depths = 2,2
num_heads = 2,4
window_size = 4
mlp_ratio = 4
qkv_bias = true
drop_path_rate = 0.1
num_classes = 3

[train]
lr = 1e-3
lr_scale_batch = 0

[data]
mean = 0.5,0.4,0.3
std = 0.25,0.2,0.3
"""

# name -> how swin.c and timm build it. model_overrides go to swin_train and swin_predict.
MODELS = {
    "tiny": dict(config=None, model_overrides=[], img=32,
                 timm_kwargs=dict(num_classes=3, img_size=32, patch_size=2, in_chans=3,
                                  embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4,
                                  mlp_ratio=4.0, qkv_bias=True)),
    "swin_tiny": dict(config=os.path.join(REPO, "configs", "swin_tiny.ini"),
                      model_overrides=["model.num_classes=3"], img=224,
                      timm_kwargs=dict(num_classes=3)),
    # Swin V2: steps 1-3 (steps 4-5 are V1's).
    "swinv2_tiny": dict(config=os.path.join(REPO, "configs", "swinv2_tiny_256.ini"),
                        model_overrides=["model.num_classes=3"], img=256,
                        timm_name="swinv2_tiny_window8_256", v1_steps=False,
                        timm_kwargs=dict(num_classes=3)),
}


def ini_text(img, in_chans, patch, embed, depths, heads, window, classes, qkv_bias=True,
             version=1, pretrained="0"):
    return (f"[model]\nversion = {version}\npretrained_window_sizes = {pretrained}\n"
            f"img_size = {img}\nin_chans = {in_chans}\npatch_size = {patch}\n"
            f"embed_dim = {embed}\ndepths = {depths}\nnum_heads = {heads}\n"
            f"window_size = {window}\nqkv_bias = {str(qkv_bias).lower()}\n"
            f"num_classes = {classes}\n\n[train]\nlr = 1e-3\nlr_scale_batch = 0\n\n"
            f"[data]\nmean = 0.5\nstd = 0.25\n")


# ONNX export checks: name -> config file (or INI text), overrides, classes of the training data.
ONNX_MODELS = {
    "swin_tiny_224": dict(config=os.path.join(REPO, "configs", "swin_tiny.ini"),
                          overrides=["model.num_classes=3"], classes=3),
    "swin_base_384_w12": dict(config=os.path.join(REPO, "configs", "swin_base.ini"),
                              overrides=["model.img_size=384", "model.window_size=12",
                                         "model.num_classes=3"], classes=3),
    "fashion_mnist": dict(config=os.path.join(REPO, "configs", "fashion_mnist.ini"),
                          overrides=[], classes=10),
    # 16x32: maps 8x16 (shift 2,2) -> 4x8 (shift along W only) -> 2x4 (window 2x4, no shift).
    "rect_3stage": dict(ini=ini_text("16,32", 3, 2, 8, "2,2,2", "1,2,4", 4, 5), classes=5),
    # 1 channel, 1 class: 14x14 (shift 3,3) -> 7x7 = one window.
    "gray_1class_w7": dict(ini=ini_text(28, 1, 2, 8, "2,2", "2,2", 7, 1), classes=1),
    # 4 channels, window 8 larger than the 4x6 map (window 4x6, no shift), no qkv bias.
    "rgba_window_gt_map": dict(ini=ini_text("8,12", 4, 2, 8, "3", "2", 8, 7, qkv_bias=False),
                               classes=7),
    # Swin V2: swinv2_tiny_window8_256's model; the 16x32 three-stage shape with its position-bias
    # coordinates normalized by pretrained windows 6, 5, 3.
    "swinv2_tiny_256": dict(config=os.path.join(REPO, "configs", "swinv2_tiny_256.ini"),
                            overrides=["model.num_classes=3"], classes=3),
    "v2_rect_3stage": dict(ini=ini_text("16,32", 3, 2, 8, "2,2,2", "1,2,4", 4, 5, version=2,
                                        pretrained="6,5,3"), classes=5),
}


class Results:
    def __init__(self):
        self.rows = []

    def add(self, model, check, ok, max_abs=None, rel=None, tol=None, note=""):
        self.rows.append((model, check, max_abs, rel, tol, bool(ok), note))
        status = "pass" if ok else "FAIL"
        nums = f"max abs {max_abs:.3e}, rel err {rel:.3e} (tol {tol:g})" if rel is not None else ""
        print(f"[{status}] {model}: {check} {nums} {note}".rstrip(), flush=True)

    def compare(self, model, check, got, want, tol):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape:
            return self.add(model, check, False, note=f"shape {got.shape} vs {want.shape}")
        finite = bool(np.isfinite(got).all() and np.isfinite(want).all())
        max_abs = float(np.abs(got - want).max())
        rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
        self.add(model, check, finite and rel <= tol, max_abs, rel, tol,
                 "" if finite else "non-finite values")

    def table(self):
        def num(x):
            return "-" if x is None else f"{x:.3e}"
        header = ("model", "check", "max abs diff", "rel err", "tol", "result")
        lines = [(m, c, num(a), num(r), "-" if t is None else f"{t:g}",
                  ("pass" if ok else "FAIL") + (f" ({n})" if n and not ok else ""))
                 for m, c, a, r, t, ok, n in self.rows]
        widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        print("\n" + fmt.format(*header))
        print(fmt.format(*("-" * w for w in widths)))
        for line in lines:
            print(fmt.format(*line))

    def all_ok(self):
        return bool(self.rows) and all(row[5] for row in self.rows)


def first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


@contextlib.contextmanager
def guarded(results, model, what):
    """Records an exception in the block as a failed check and carries on with the next one."""
    try:
        yield
    except Exception as e:
        traceback.print_exc()
        results.add(model, f"{what}: ERROR", False, note=first_line(e))


def run(cmd, timeout=540):
    """Runs a command; on failure prints its output and raises."""
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        print(proc.stdout[-6000:])
        raise RuntimeError(f"{os.path.basename(cmd[0])} exited with {proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    for line in lines[-3:]:
        print("    " + line)
    return proc.stdout


def make_image_folder(root, per_class=8, seed=0, classes=CLASSES):
    from PIL import Image
    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for c in classes:
            d = os.path.join(root, split, c)
            os.makedirs(d, exist_ok=True)
            for i in range(per_class):
                h, w = int(rng.integers(36, 61)), int(rng.integers(40, 71))  # e.g. 40x50
                pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels, "RGB").save(os.path.join(d, f"{c}_{i}.png"))
    print(f"made an ImageFolder of {len(classes)} classes x {per_class} images per split in {root}")


def deterministic_torch(torch):
    torch.use_deterministic_algorithms(True)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def load_export(path, want_dtype):
    """An export as a float32 state dict; checks every tensor has the exported dtype."""
    import torch
    from safetensors.torch import load_file
    sd = load_file(path)
    wrong = [k for k, v in sd.items() if v.dtype != want_dtype]
    assert not wrong, f"{path}: tensors not {want_dtype}: {wrong[:5]}"
    return {k: v.to(torch.float32) for k, v in sd.items()}


def timm_logits(model, x_nhwc):
    import torch
    with torch.no_grad():
        return model(torch.from_numpy(x_nhwc).permute(0, 3, 1, 2).contiguous()).numpy()


def predict(build, model_file, input_file, out_file, config_args=()):
    from safetensors.numpy import load_file
    # On the CPU, the reference: the CUDA backend does not serve Swin-B 384's 144-token windows.
    run([os.path.join(build, "swin_predict"), model_file, input_file, out_file, *config_args,
         "device=cpu"])
    logits = load_file(out_file)["logits"]
    assert logits.dtype == np.float32, f"{out_file}: logits are {logits.dtype}"
    return logits


def export_onnx(torch, model, x_nchw, path):
    kwargs = dict(opset_version=17, input_names=["images"], output_names=["logits"],
                  dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
    try:
        torch.onnx.export(model, (x_nchw,), path, dynamo=False, **kwargs)
        return "dynamo=False"
    except Exception as e:
        print(f"NOTE: torch.onnx.export(dynamo=False) failed on torch {torch.__version__}: "
              f"{first_line(e)}\n"
              f"NOTE: falling back to torch.onnx.export(dynamo=True)", flush=True)
        torch.onnx.export(model, (x_nchw,), path, dynamo=True, **kwargs)
        return "dynamo=True (fallback)"


def official_state_dict(torch, model):
    """timm's weights in the official Swin layout, with the index and mask buffers a release has."""
    sd = {}
    for name, value in model.state_dict().items():
        m = re.fullmatch(r"layers\.(\d+)\.downsample\.(.+)", name)
        if m:
            stage = int(m.group(1))
            assert stage >= 1, f"timm has a downsample in stage 0: {name}"
            name = f"layers.{stage - 1}.downsample.{m.group(2)}"
        elif name.startswith("head.fc."):
            name = "head." + name[len("head.fc."):]
        assert name not in sd, f"official layout: {name} twice"
        sd[name] = value.detach().clone()
    buffers = 0
    for mname, module in model.named_modules():
        index = getattr(module, "relative_position_index", None)
        if isinstance(index, torch.Tensor):
            sd[f"{mname}.relative_position_index"] = index.detach().clone().to(torch.int64)
            buffers += 1
        mask = getattr(module, "attn_mask", None)
        if isinstance(mask, torch.Tensor):
            sd[f"{mname}.attn_mask"] = mask.detach().clone()
            buffers += 1
    assert buffers > 0, "found no relative_position_index buffers in the timm model"
    return sd


def check_model(name, spec, build, work, results):
    import onnx
    import onnxruntime as ort
    import timm
    import torch
    from safetensors.numpy import save_file as save_numpy

    # 1. train two steps
    if spec["config"] is None:
        config = os.path.join(work, f"{name}.ini")
        with open(config, "w") as f:
            f.write(TINY_INI)
    else:
        config = spec["config"]
    run_dir = os.path.join(work, f"run_{name}")
    shutil.rmtree(run_dir, ignore_errors=True)
    run([os.path.join(build, "swin_train"), config, "device=cpu",
         "data.dataset=imagefolder", f"data.path={os.path.join(work, 'data')}",
         f"run_dir={run_dir}", "train.max_steps=2", "train.batch_size=4",
         "train.eval_batch_size=4", "data.workers=2", "train.warmup_epochs=0",
         # swin_tiny.ini scales lr by batch/512: at batch 4 the peak would fall below min_lr.
         "train.lr_scale_batch=0", *spec["model_overrides"]])
    ckpt = os.path.join(run_dir, "ckpt-00000002.safetensors")
    assert os.path.isfile(ckpt), f"no {ckpt}; run_dir holds {sorted(os.listdir(run_dir))}"
    results.add(name, "swin_train 2 steps -> checkpoint", True)

    # 2. export
    exports = {}
    for dtype in ("f32", "bf16"):
        exports[dtype] = os.path.join(work, f"{name}_{dtype}.safetensors")
        run([os.path.join(build, "swin_export"), ckpt, exports[dtype], f"dtype={dtype}"])

    # 3. timm with strict loading, against swin_predict
    rng = np.random.default_rng(1234)
    H = W = spec["img"]
    x = rng.standard_normal((BATCH, H, W, 3)).astype(np.float32)
    input_file = os.path.join(work, f"{name}_input.safetensors")
    save_numpy({"input": x}, input_file)
    models, swin_logits = {}, {}
    for dtype, torch_dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        model = timm.create_model(spec.get("timm_name", TIMM_NAME), pretrained=False,
                                  **spec["timm_kwargs"])
        sd = load_export(exports[dtype], torch_dtype)
        model.load_state_dict(sd, strict=True)
        model = model.float().eval()
        results.add(name, f"timm load_state_dict(strict=True) of the {dtype} export", True,
                    note=f"{len(sd)} tensors")
        models[dtype] = model
        swin_logits[dtype] = predict(build, exports[dtype], input_file,
                                     os.path.join(work, f"{name}_logits_{dtype}.safetensors"))
        results.compare(name, f"swin_predict {dtype} export vs timm", swin_logits[dtype],
                        timm_logits(model, x), TOL_TIMM)
    model = models["f32"]
    want = timm_logits(model, x)
    if not spec.get("v1_steps", True):
        return

    # 4. ONNX
    with guarded(results, name, "onnx export + onnxruntime"):
        onnx_path = os.path.join(work, f"{name}.onnx")
        x_nchw = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
        how = export_onnx(torch, model, x_nchw, onnx_path)
        onnx.checker.check_model(onnx.load(onnx_path))
        session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        got = session.run(["logits"], {"images": x_nchw.numpy()})[0]
        results.compare(name, f"onnxruntime vs swin_predict [{how}]", got, swin_logits["f32"],
                        TOL_ONNX)
        # Another batch size through the dynamic axis.
        x3 = rng.standard_normal((3, 3, H, W)).astype(np.float32)
        got3 = session.run(["logits"], {"images": x3})[0]
        with torch.no_grad():
            want3 = model(torch.from_numpy(x3)).numpy()
        results.compare(name, "onnxruntime batch 3 vs timm (dynamic batch)", got3, want3, TOL_ONNX)

    # 5. official layout .pth -> convert_pth.py -> swin_predict with the config
    with guarded(results, name, "official .pth + convert_pth.py"):
        pth = os.path.join(work, f"{name}_official.pth")
        official = official_state_dict(torch, model)
        torch.save({"model": official}, pth)
        converted = os.path.join(work, f"{name}_official.safetensors")
        out = run([sys.executable, os.path.join(REPO, "scripts", "convert_pth.py"), pth, converted])
        n_params = len(model.state_dict())
        assert f"wrote {n_params} tensors" in out, \
            f"convert_pth.py did not write the model's {n_params} tensors"
        got = predict(build, converted, input_file,
                      os.path.join(work, f"{name}_logits_official.safetensors"),
                      [config, *spec["model_overrides"]])
        results.compare(name, "swin_predict official .pth (convert_pth.py) vs timm", got, want,
                        TOL_TIMM)


def read_model_config(ckpt):
    """The [model] keys of a swin.c checkpoint's resolved config (INI text in its metadata)."""
    from safetensors import safe_open
    with safe_open(ckpt, "np") as f:
        ini = f.metadata()["config"]
    section, keys = "", {}
    for line in ini.splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section == "model":
            k, v = (x.strip().strip('"') for x in line.split("=", 1))
            keys[k] = v
    ints = lambda v: tuple(int(x) for x in v.split(","))  # noqa: E731
    img = ints(keys["img_size"])
    depths = ints(keys["depths"])
    pretrained = ints(keys.get("pretrained_window_sizes", "0"))
    if len(pretrained) == 1:
        pretrained = pretrained * len(depths)
    return dict(version=int(keys.get("version", "1")), pretrained_window_sizes=pretrained,
                img_size=(img[0], img[-1]), in_chans=int(keys["in_chans"]),
                patch_size=int(keys["patch_size"]), embed_dim=int(keys["embed_dim"]),
                depths=depths, num_heads=ints(keys["num_heads"]),
                window_size=int(keys["window_size"]), mlp_ratio=float(keys["mlp_ratio"]),
                qkv_bias=keys["qkv_bias"] in ("true", "1", "yes"),
                num_classes=int(keys["num_classes"]))


def train_checkpoint(name, spec, build, work):
    """swin_train for 2 steps on a random ImageFolder with the model's class count."""
    classes = spec["classes"]
    data = os.path.join(work, f"data_{classes}_classes")
    if not os.path.isdir(data):
        make_image_folder(data, per_class=2, classes=tuple(f"class_{i:02d}" for i in range(classes)))
    config = spec.get("config")
    if config is None:
        config = os.path.join(work, f"{name}.ini")
        with open(config, "w") as f:
            f.write(spec["ini"])
    run_dir = os.path.join(work, f"run_onnx_{name}")
    shutil.rmtree(run_dir, ignore_errors=True)
    run([os.path.join(build, "swin_train"), config, "device=cpu", "data.dataset=imagefolder",
         f"data.path={data}", f"run_dir={run_dir}", "train.max_steps=2", "train.batch_size=2",
         "train.eval_batch_size=2", "data.workers=2", "train.warmup_epochs=0",
         "train.lr_scale_batch=0", "model.drop_path_rate=0.1", *spec.get("overrides", [])])
    ckpt = os.path.join(run_dir, "ckpt-00000002.safetensors")
    assert os.path.isfile(ckpt), f"no {ckpt}; run_dir holds {sorted(os.listdir(run_dir))}"
    return ckpt


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def check_onnx_model(name, spec, build, work, results, rows):
    """swin_export's own ONNX files against swin_predict and timm (steps 6-8)."""
    import onnx
    import onnxruntime as ort
    import torch
    from safetensors.numpy import save_file as save_numpy
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    ckpt = train_checkpoint(name, spec, build, work)
    cfg = read_model_config(ckpt)
    version, pretrained = cfg.pop("version"), cfg.pop("pretrained_window_sizes")
    H, W = cfg["img_size"]
    rng = np.random.default_rng(4321)
    inputs = {b: rng.standard_normal((b, H, W, cfg["in_chans"])).astype(np.float32)
              for b in (1, 3)}
    swin, timm_out, timm_f16 = {}, {}, {}
    weights = os.path.join(work, f"{name}_onnx_weights.safetensors")
    run([os.path.join(build, "swin_export"), ckpt, weights, "dtype=f32"])
    if version == 2:
        model = SwinTransformerV2(**cfg, drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0,
                                  global_pool="avg", pretrained_window_sizes=pretrained)
    else:
        model = SwinTransformer(**cfg, drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0,
                                global_pool="avg")
    model.load_state_dict(load_export(weights, torch.float32), strict=True)
    model = model.float().eval()
    for b, x in inputs.items():
        input_file = os.path.join(work, f"{name}_onnx_input_{b}.safetensors")
        save_numpy({"input": x}, input_file)
        swin[b] = predict(build, ckpt, input_file,
                          os.path.join(work, f"{name}_onnx_logits_{b}.safetensors"))
        timm_out[b] = timm_logits(model, x)
        results.compare(name, f"swin_predict vs timm, batch {b}", swin[b], timm_out[b], TOL_ONNX)
    with contextlib.suppress(Exception):  # PyTorch's CPU f16 coverage varies by version
        half = model.half()
        with torch.no_grad():
            for b, x in inputs.items():
                nchw = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().half()
                timm_f16[b] = rel_err(half(nchw).float().numpy(), timm_out[b])
        model.float()

    for dtype in ("f32", "f16"):
        tol = TOL_ONNX if dtype == "f32" else TOL_ONNX_F16
        for batch in ("dynamic", "1"):
            tag = f"ONNX {dtype} batch={batch}"
            row = dict(model=name, dtype=dtype, batch=batch, checker="-", swin=[], timm=[],
                       torch_f16=max(timm_f16.values()) if dtype == "f16" and timm_f16 else None,
                       tol=tol, ok=False, mb=None)
            rows.append(row)
            with guarded(results, name, tag):
                path = os.path.join(work, f"{name}_{dtype}_{batch}.onnx")
                run([os.path.join(build, "swin_export"), ckpt, path, f"dtype={dtype}",
                     f"batch={batch}"])
                row["mb"] = os.path.getsize(path) / 2**20
                onnx.checker.check_model(path, full_check=True)
                row["checker"] = "pass"
                results.add(name, f"{tag}: onnx.checker.check_model(full_check=True)", True)
                session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                for b in ((1, 3) if batch == "dynamic" else (1,)):
                    got = session.run(["logits"], {"images": np.ascontiguousarray(
                        inputs[b].transpose(0, 3, 1, 2))})[0]
                    results.compare(name, f"{tag}: onnxruntime vs swin_predict, batch {b}", got,
                                    swin[b], tol)
                    row["swin"].append(rel_err(got, swin[b]))
                    if dtype == "f32":
                        results.compare(name, f"{tag}: onnxruntime vs timm, batch {b}", got,
                                        timm_out[b], tol)
                        row["timm"].append(rel_err(got, timm_out[b]))
                errs = row["swin"] + row["timm"]
                row["ok"] = bool(errs) and max(errs) <= tol


def onnx_table(rows):
    """The compact summary of the ONNX checks: one line per exported file."""
    def worst(xs):
        return "-" if not xs else f"{max(xs):.2e}"
    header = ("model", "dtype", "batch", "MiB", "checker", "vs swin_predict", "vs timm",
              "torch f16", "tol", "result")
    lines = [(r["model"], r["dtype"], r["batch"], "-" if r["mb"] is None else f"{r['mb']:.1f}",
              r["checker"], worst(r["swin"]), worst(r["timm"]),
              "-" if r["torch_f16"] is None else f"{r['torch_f16']:.2e}", f"{r['tol']:g}",
              "pass" if r["ok"] else "FAIL") for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print("\nswin_export ONNX files (rel err = ||a - b|| / ||b|| of the logits, worst of batch 1 "
          "and 3; onnxruntime CPU)")
    print(fmt.format(*header))
    print(fmt.format(*("-" * w for w in widths)))
    for line in lines:
        print(fmt.format(*line))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="swin.c build directory (swin_train, ...)")
    ap.add_argument("--work", default=None, help="scratch directory (default: a new temp dir)")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--onnx-models", default=",".join(ONNX_MODELS),
                    help=f"comma-separated subset of {','.join(ONNX_MODELS)} ('' for none)")
    ap.add_argument("--onnx-only", action="store_true",
                    help="only the checks of swin_export's own ONNX files (steps 6-8)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    for prog in ("swin_train", "swin_export", "swin_predict"):
        path = os.path.join(build, prog)
        assert os.access(path, os.X_OK), f"{path} is missing: build swin.c first"
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="swin_check_export_"))
    os.makedirs(work, exist_ok=True)
    names = [] if args.onnx_only else [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    assert not unknown, f"unknown models {unknown}; choose from {list(MODELS)}"
    onnx_names = [n for n in args.onnx_models.split(",") if n]
    unknown = [n for n in onnx_names if n not in ONNX_MODELS]
    assert not unknown, f"unknown ONNX models {unknown}; choose from {list(ONNX_MODELS)}"

    os.environ["TIMM_FUSED_ATTN"] = "0"  # the plain attention path (timm's default for swin)
    import onnx
    import onnxruntime
    import timm
    import torch
    deterministic_torch(torch)
    print(f"torch {torch.__version__}, timm {timm.__version__}, onnx {onnx.__version__}, "
          f"onnxruntime {onnxruntime.__version__}; work dir {work}")

    results = Results()
    if names:
        make_image_folder(os.path.join(work, "data"))
    for name in names:
        try:
            check_model(name, MODELS[name], build, work, results)
        except Exception as e:
            traceback.print_exc()
            results.add(name, "ERROR", False, note=first_line(e))
    onnx_rows = []
    for name in onnx_names:
        try:
            check_onnx_model(name, ONNX_MODELS[name], build, work, results, onnx_rows)
        except Exception as e:
            traceback.print_exc()
            results.add(name, "ERROR", False, note=first_line(e))
    results.table()
    if onnx_names:
        onnx_table(onnx_rows)
    ok = results.all_ok()
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
