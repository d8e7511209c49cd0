"""``attnx optimize --fuse``'s L2-norm rule (attnx/optimizer/l2norm.py): Hugging Face's q/k ``l2norm`` as
torch.onnx writes it becomes one ``SimplifiedLayerNormalization`` that computes the same values (against a
float64 reference of the formula, at widths and magnitudes where eps matters and where it does not), and
the forms it does not compute are left alone."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx_ir
import onnxruntime
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from attnx.optimizer.l2norm import L2_NORM_RULES


class L2Norm(torch.nn.Module):
    """transformers' ``l2norm`` (the gated layers' q/k norm): x * rsqrt(sum(x * x, -1) + eps)."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + self.eps)


@functools.cache
def exported(width: int, eps: float) -> bytes:
    """The torch.onnx graph of :class:`L2Norm` on (batch, 3, width), its batch dynamic."""
    program = torch.onnx.export(
        L2Norm(eps).eval(),
        (torch.randn(2, 3, width),),
        dynamo=True,
        dynamic_shapes=({0: torch.export.Dim("batch")},),
        verbose=False,
    )
    return program.model_proto.SerializeToString()


def fused(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    ir_model = onnx_ir.from_proto(model)
    count = L2_NORM_RULES.apply_to_model(ir_model)
    return onnx_ir.to_proto(ir_model), count


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@settings(max_examples=25, deadline=None)
@given(
    width=st.sampled_from([1, 7, 64, 128]),
    eps=st.sampled_from([1e-6, 1e-3]),
    magnitude=st.sampled_from([1e-5, 1e-2, 1.0, 30.0]),
    batch=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_hf_l2norm_becomes_one_kernel_with_the_same_values(width, eps, magnitude, batch, seed):
    source = onnx.load_from_string(exported(width, eps))
    model, count = fused(source)
    assert count == 1
    assert [n.op_type for n in model.graph.node if n.op_type != "Constant"] == [
        "SimplifiedLayerNormalization"
    ]
    x = (np.random.default_rng(seed).standard_normal((batch, 3, width)) * magnitude).astype(np.float32)
    wide = x.astype(np.float64)
    reference = wide / np.sqrt((wide * wide).sum(-1, keepdims=True) + eps)
    # a few float32 roundings of values of size <= 1: what the unfused graph itself is off by
    tolerance = 8 * np.finfo(np.float32).eps
    np.testing.assert_allclose(run(model, x), reference, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(run(source, x), reference, rtol=tolerance, atol=tolerance)


def _hand_built(axes: list[int], eps_input: bool, dtype: int, width: int | str) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["square"]),
        helper.make_node("ReduceSum", ["square", "axes"], ["total"], keepdims=1),
        helper.make_node("Add", ["total", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["norm"]),
        helper.make_node("Reciprocal", ["norm"], ["inverse"]),
        helper.make_node("Mul", ["x", "inverse"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", dtype, ["batch", 3, width])]
    initializers = [helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes)]
    if eps_input:
        inputs.append(helper.make_tensor_value_info("eps", dtype, []))
    else:
        initializers.append(helper.make_tensor("eps", dtype, [], [1e-6]))
    graph = helper.make_graph(
        nodes, "l2", inputs, [helper.make_tensor_value_info("y", dtype, None)], initializers
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(
    ("axes", "eps_input", "dtype", "width", "fits"),
    [
        ([-1], False, TensorProto.FLOAT, 8, True),
        ([2], False, TensorProto.FLOAT, 8, True),  # the last axis by its index
        ([1], False, TensorProto.FLOAT, 8, False),  # another axis: not a norm over the last dim
        ([-1], True, TensorProto.FLOAT, 8, False),  # eps only known at run time
        ([-1], False, TensorProto.FLOAT16, 8, False),  # the kernel's scale would need fp16 handling
        ([-1], False, TensorProto.FLOAT, "width", False),  # 1 / sqrt(D) needs D
    ],
)
def test_only_the_form_it_computes_is_fused(axes, eps_input, dtype, width, fits):
    model, count = fused(_hand_built(axes, eps_input, dtype, width))
    assert count == int(fits)
    assert ("SimplifiedLayerNormalization" in {n.op_type for n in model.graph.node}) is fits
