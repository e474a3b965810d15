#!/usr/bin/env python3
"""Ecosystem check: swin.c's weights against timm, ONNX Runtime and the official .pth layout.

    python3 scripts/check_export.py --build BUILD_DIR [--work DIR]

For two models, "tiny" (32x32, 2 stages) and "swin_tiny" (configs/swin_tiny.ini, 3 classes):
  1. train 2 steps with BUILD/swin_train on a small random ImageFolder (made in DIR/data);
  2. export the checkpoint with BUILD/swin_export as f32 and bf16 safetensors;
  3. load each export into timm.create_model('swin_tiny_patch4_window7_224', ...) with
     load_state_dict(strict=True) and compare timm's logits (fp32, CPU) with BUILD/swin_predict's
     on the same random batch;
  4. export the timm model to ONNX and compare ONNX Runtime's logits with swin.c's;
  5. write the weights in the official Swin layout as a .pth (downsample at the end of stages
     0..2, head.*, index and mask buffers), convert it with scripts/convert_pth.py and compare
     swin_predict's logits on it with timm's.
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


def make_image_folder(root, per_class=8, seed=0):
    from PIL import Image
    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for c in CLASSES:
            d = os.path.join(root, split, c)
            os.makedirs(d, exist_ok=True)
            for i in range(per_class):
                h, w = int(rng.integers(36, 61)), int(rng.integers(40, 71))  # e.g. 40x50
                pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels, "RGB").save(os.path.join(d, f"{c}_{i}.png"))
    print(f"made an ImageFolder of {len(CLASSES)} classes x {per_class} images per split in {root}")


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
    run([os.path.join(build, "swin_predict"), model_file, input_file, out_file, *config_args])
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
    run([os.path.join(build, "swin_train"), config,
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
        model = timm.create_model(TIMM_NAME, pretrained=False, **spec["timm_kwargs"])
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="swin.c build directory (swin_train, ...)")
    ap.add_argument("--work", default=None, help="scratch directory (default: a new temp dir)")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated subset of {','.join(MODELS)}")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    for prog in ("swin_train", "swin_export", "swin_predict"):
        path = os.path.join(build, prog)
        assert os.access(path, os.X_OK), f"{path} is missing: build swin.c first"
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="swin_check_export_"))
    os.makedirs(work, exist_ok=True)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    assert not unknown, f"unknown models {unknown}; choose from {list(MODELS)}"

    os.environ["TIMM_FUSED_ATTN"] = "0"  # the plain attention path (timm's default for swin)
    import onnx
    import onnxruntime
    import timm
    import torch
    deterministic_torch(torch)
    print(f"torch {torch.__version__}, timm {timm.__version__}, onnx {onnx.__version__}, "
          f"onnxruntime {onnxruntime.__version__}; work dir {work}")

    results = Results()
    make_image_folder(os.path.join(work, "data"))
    for name in names:
        try:
            check_model(name, MODELS[name], build, work, results)
        except Exception as e:
            traceback.print_exc()
            results.add(name, "ERROR", False, note=first_line(e))
    results.table()
    ok = results.all_ok()
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
