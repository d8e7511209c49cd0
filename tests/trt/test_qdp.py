"""The generated QDP functions against tensorrt.plugin's documented schemas, without TensorRT.

``tensorrt.plugin`` validates the decorated functions with ``inspect.signature``: register
``(inp0: TensorDesc, ..., attr0: T0, ...) -> TensorDesc`` (annotations required, no
defaults, attribute types int/float/str/bool/bytes or ``NDArray[dtype]``), impl
``(inputs..., attrs..., outputs, stream)``, autotune ``(inputs..., attrs..., outputs)``.
The expected schemas below are written from the op's ONNX schema, not from attnx.trt.
A stand-in for the few ``tensorrt.plugin`` names the functions use lets them run on CPU.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import numpy.typing as npt
import pytest

from attnx.exporter.assemble import assemble
from attnx.plugins.softmax.kernel import SOFTMAX_OP
from attnx.trt import tensorrt_missing
from attnx.trt.qdp import plugin_functions, qdp_type, register_plugins, split_impl_args
from attnx.trt.spec import describe
from tests.conftest import TINY
from tests.trt.conftest import VARIANTS

ALLOWED_ATTRIBUTE_TYPES = (int, float, str, bool, bytes)


class TensorDesc:
    """Stand-in for trtp.TensorDesc: a shape expression (here ints) and a dtype."""

    def __init__(self, shape_expr: tuple, dtype: str) -> None:
        self.shape_expr, self.dtype = shape_expr, dtype


STUB = SimpleNamespace(
    TensorDesc=TensorDesc,
    from_shape_expr=lambda shape, dtype: TensorDesc(tuple(shape), dtype),
    AutoTuneCombination=lambda types, layouts: (types, layouts),
)


def schema_names(op):
    schema = op.schema()
    return [p.name for p in schema.inputs], list(schema.attributes)


@pytest.mark.parametrize("variant", VARIANTS)
def test_generated_signatures_follow_the_qdp_schemas(variant):
    for op in assemble(variant, "encoder", TINY).ops:
        inputs, attributes = schema_names(op)
        register, autotune, impl = plugin_functions(describe(op), STUB)
        signature = inspect.signature(register)
        params = list(signature.parameters.values())
        order = [a.name for a in op.arguments]
        assert [p.name for p in params] == inputs + sorted(attributes, key=order.index)
        assert all(p.default is inspect.Parameter.empty for p in params)
        assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        assert [p.annotation for p in params[: len(inputs)]] == [TensorDesc] * len(inputs)
        for p in params[len(inputs):]:
            assert p.annotation in ALLOWED_ATTRIBUTE_TYPES or p.annotation in (
                npt.NDArray[np.int32],
                npt.NDArray[np.float32],
            )
        assert signature.return_annotation is TensorDesc
        names = [p.name for p in params]
        assert str(inspect.signature(impl)) == f"({', '.join([*names, 'outputs', 'stream'])})"
        assert str(inspect.signature(autotune)) == f"({', '.join([*inputs, 'outputs'])})"


def test_register_describes_the_output_for_every_input_count():
    register, _, _ = plugin_functions(describe(SOFTMAX_OP), STUB)
    q, k, v = TensorDesc(("b", "h", "n", 16), "f"), TensorDesc(("b", "h", "m", 16), "f"), TensorDesc(
        ("b", "h", "m", 8), "f"
    )
    mask = TensorDesc(("b", "m"), "bool")
    for tensors in ((q, k, v, mask), (q, k, v)):
        out = register(*tensors, causal=0, scale=0.25)
        assert out.shape_expr == ("b", "h", "n", 8) and out.dtype == "f"


def test_autotune_offers_fp32_and_fp16_with_the_mask_as_bool():
    _, autotune, _ = plugin_functions(describe(SOFTMAX_OP), STUB)
    desc = TensorDesc((1, 1, 1, 1), "f")
    assert autotune(desc, desc, desc, desc, ()) == [
        ("FP32|FP16, FP32|FP16, FP32|FP16, BOOL, FP32|FP16", "LINEAR")
    ]
    assert autotune(desc, desc, desc, ()) == [("FP32|FP16, FP32|FP16, FP32|FP16, FP32|FP16", "LINEAR")]


def test_impl_arguments_are_split_by_the_field_count():
    """TensorRT calls impl(*inputs, *field_values, outputs, stream=...) with the node's inputs only."""
    assert split_impl_args(["q", "k", "v", "m", 0, 0.5, ("out",)], ["causal", "scale"]) == (
        ["q", "k", "v", "m"],
        [0, 0.5],
        ("out",),
    )
    three = split_impl_args(["q", "k", "v", 1, 0.5, ("out",)], ["causal", "scale"])
    assert three == (["q", "k", "v"], [1, 0.5], ("out",))
    assert split_impl_args(["q", ("out",)], []) == (["q"], [], ("out",))


def test_field_annotations():
    assert qdp_type("int") is int and qdp_type("float") is float and qdp_type("str") is str
    assert qdp_type("NDArray[int32]") == npt.NDArray[np.int32]
    assert qdp_type("NDArray[float32]") == npt.NDArray[np.float32]


@pytest.mark.skipif(tensorrt_missing() is None, reason="tensorrt is importable: see the gpu test below")
def test_registration_needs_tensorrt():
    with pytest.raises(ImportError):
        register_plugins([SOFTMAX_OP])


@pytest.mark.gpu
def test_registration_with_tensorrt_is_idempotent():
    reason = tensorrt_missing()
    if reason:
        pytest.skip(reason)
    ops = assemble("softmax", "encoder", TINY).ops
    assert register_plugins(ops) == register_plugins(ops) == ["attnx::SoftmaxAttention"]
