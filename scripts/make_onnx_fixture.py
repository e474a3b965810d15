#!/usr/bin/env python3
"""Writes tests/fixtures/onnx_reference.onnx: a small ONNX model serialized by the onnx package.

    python3 scripts/make_onnx_fixture.py [--out tests/fixtures/onnx_reference.onnx]

tests/test_onnx.c builds the same model with swin.c's ONNX writer and requires the same bytes, so
a field number, wire type or field order that differs from the reference protobuf encoder fails
CI without Python. The model uses every message and field kind swin.c writes: nodes with INT,
FLOAT and INTS attributes (negative values included), an omitted optional input, f32, f16 and
int64 initializers (a scalar among them), a symbolic and fixed input/output dimensions, opset
and metadata. It is also a valid model (onnx.checker passes), so the decoder can be tested on it.
Needs the onnx and numpy packages.
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tensor(name, array, data_type):
    return helper.make_tensor(name, data_type, array.shape, array.tobytes(), raw=True)


def build():
    w = (np.arange(6, dtype=np.float32).reshape(3, 2) * 0.75 - 1.5)  # (out 3, in 2)
    b = np.array([0.5, -0.25, 2.0], dtype=np.float32)
    gamma = np.array([1.0, 0.5, -2.0], dtype=np.float32)
    beta = np.array([0.0, 0.125, -1.0], dtype=np.float32)
    half = np.array(0.5, dtype=np.float16)  # a scalar: no dims
    shape = np.array([-1, 3], dtype=np.int64)
    # make_node sorts attributes by name; test_onnx.c adds them in the same order.
    nodes = [
        helper.make_node("Gemm", ["x", "fc.weight", "fc.bias"], ["fc"], name="fc", transB=1),
        helper.make_node("LayerNormalization", ["fc", "norm.weight", "norm.bias"], ["norm"],
                         name="norm", axis=-1, epsilon=1e-5),
        helper.make_node("Cast", ["norm"], ["norm.f16"], name="norm.f16", to=TensorProto.FLOAT16),
        helper.make_node("Mul", ["norm.f16", "f.half"], ["scaled"], name="scaled"),
        helper.make_node("Cast", ["scaled"], ["scaled.f32"], name="scaled.f32",
                         to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["scaled.f32", "i64[-1,3]"], ["rows"], name="rows"),
        helper.make_node("Gemm", ["rows", "fc.weight", ""], ["proj"], name="proj"),
        helper.make_node("Transpose", ["proj"], ["y"], name="y", perm=[1, 0]),
    ]
    inits = [
        tensor("fc.weight", w, TensorProto.FLOAT),
        tensor("fc.bias", b, TensorProto.FLOAT),
        tensor("norm.weight", gamma, TensorProto.FLOAT),
        tensor("norm.bias", beta, TensorProto.FLOAT),
        tensor("f.half", half, TensorProto.FLOAT16),
        tensor("i64[-1,3]", shape, TensorProto.INT64),
    ]
    graph = helper.make_graph(
        nodes, "reference",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "batch"])],
        initializer=inits)
    model = helper.make_model(graph, ir_version=8, producer_name="swin.c",
                              producer_version="swin_export",
                              opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {"swin.config": "[model]\nembed_dim = 8\n"})
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "onnx_reference.onnx"))
    args = ap.parse_args()
    model = build()
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {args.out} ({len(data)} bytes, onnx {onnx.__version__})")


if __name__ == "__main__":
    main()
