"""Plugin descriptions of every registered op: fields, marshalling, output shape rule (no TensorRT)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import AttributeProto, defs, helper
from torch.utils._python_dispatch import TorchDispatchMode

from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.ops import AttentionOp
from attnx.plugins.softmax.kernel import SOFTMAX_OP, softmax_attention
from attnx.trt.spec import describe
from tests.conftest import TINY
from tests.trt.conftest import VARIANTS, tiny_model


class CaptureOps(TorchDispatchMode):
    """Record every ``attnx*`` custom-op call (op, args, output) made while a model runs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, tuple, torch.Tensor]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if func.namespace.startswith("attnx"):
            self.calls.append((func, args, out))
        return out


def captured_calls(variant: str, mask: bool, seed: int) -> list[tuple[AttentionOp, tuple, torch.Tensor]]:
    torch.manual_seed(seed)
    if tiny_model(variant) == "lm":
        if mask:
            pytest.skip(f"{variant} attends causally only: its tiny lm has no attention mask")
        assembly = assemble(variant, "lm", TINY)
    else:
        assembly = assemble(variant, "encoder", {**TINY, "attention_mask": mask})
    ops = {op.overload: op for op in assembly.ops}
    ids = torch.randint(0, TINY["vocab_size"], (2, 9))
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[1, 6:] = False
    with torch.no_grad(), CaptureOps() as capture:
        assembly.module(ids, key_mask) if mask else assembly.module(ids)
    assert capture.calls, f"{variant}: no attnx op was called"
    return [(ops[func], args, out) for func, args, out in capture.calls]


def as_trt_field(value: object) -> object:
    """What TensorRT's ONNX parser hands a plugin for an attribute: 1-element int32/float32 arrays."""
    if isinstance(value, bool | int):
        return np.array([int(value)], dtype=np.int32)
    if isinstance(value, float):
        return np.array([value], dtype=np.float32)
    return value


@pytest.mark.parametrize("variant", VARIANTS)
def test_fields_and_inputs_are_the_onnx_schema(variant):
    """Plugin fields carry the ONNX attribute names and types; inputs follow the schema's order."""
    for op in assemble(variant, tiny_model(variant), TINY).ops:
        spec, schema = describe(op), op.schema()
        assert [i.name for i in spec.inputs] == [p.name for p in schema.inputs]
        optional = defs.OpSchema.FormalParameterOption.Optional
        assert [i.optional for i in spec.inputs] == [p.option == optional for p in schema.inputs]
        assert {f.name: AttributeProto.AttributeType.Name(f.onnx_type) for f in spec.fields} == {
            name: attribute.type.name for name, attribute in schema.attributes.items()
        }
        assert spec.plugin_id == f"attnx::{op.name}" and spec.version == "1"


@pytest.mark.parametrize("mask", [True, False], ids=["mask", "no-mask"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_trt_field_values_reproduce_the_torch_call(variant, mask):
    """Fields as TensorRT delivers them -> the model's own op arguments, output and output shape."""
    for op, args, out in captured_calls(variant, mask, seed=VARIANTS.index(variant)):
        spec = describe(op)
        pairs = list(zip(args, op.arguments, strict=True))
        tensors = [a for a, arg in pairs if arg.is_tensor and a is not None]
        values = {arg.name: as_trt_field(a) for a, arg in pairs if not arg.is_tensor}
        rebuilt = spec.torch_args(tensors, values)
        for original, again, arg in zip(args, rebuilt, op.arguments, strict=True):
            if arg.is_tensor:
                assert again is original
            elif isinstance(original, float):
                assert again == float(np.float32(original))  # ONNX FLOAT attributes are float32
            else:
                assert again == original and type(again) is type(original)
        assert spec.output_shape([tuple(t.shape) for t in tensors]) == tuple(out.shape)
        torch.testing.assert_close(spec.run(tensors, values), out, rtol=1e-5, atol=1e-6)


def test_output_shape_rule_on_cross_shapes_matches_the_op():
    """Queries and keys of different lengths, values of another width: the rule gives the op's shape."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 11, 8), torch.randn(2, 3, 11, 4)
    spec = describe(SOFTMAX_OP)
    real = softmax_attention(q, k, v, None, False, 0.3)
    assert spec.output_shape([q.shape, k.shape, v.shape]) == tuple(real.shape) == (2, 3, 5, 4)


@pytest.mark.parametrize(
    ("torch_type", "delivered", "expected"),
    [
        ("bool", np.array([1], dtype=np.int32), True),
        ("bool", 0, False),
        ("int", np.array([64], dtype=np.int32), 64),
        ("float", np.array([0.125], dtype=np.float32), 0.125),
        ("str", b"rows", "rows"),
        ("int[]", np.array([3, 1, 2], dtype=np.int32), [3, 1, 2]),
        ("float[]", np.array([0.5, 2.0], dtype=np.float32), [0.5, 2.0]),
        ("float[]", [0.5, 2.0], [0.5, 2.0]),
    ],
)
def test_field_value_conversion(torch_type, delivered, expected):
    from attnx.trt.spec import _FIELD_TYPES, PluginField

    onnx_type, annotation = _FIELD_TYPES[torch_type]
    value = PluginField("x", torch_type, onnx_type, annotation).to_torch(delivered)
    assert value == expected and type(value) is type(expected)


def test_field_from_attribute_checks_name_and_type():
    spec = describe(SOFTMAX_OP)
    scale = next(f for f in spec.fields if f.name == "scale")
    assert scale.from_attribute(helper.make_attribute("scale", 0.5)) == 0.5
    with pytest.raises(AttnxError, match="scale \\(INT\\) does not match plugin field scale \\(FLOAT\\)"):
        scale.from_attribute(helper.make_attribute("scale", 1))


def test_present_inputs_drop_optional_ones_from_the_end():
    spec = describe(SOFTMAX_OP)
    assert [i.name for i in spec.present(3)] == ["q", "k", "v"]
    assert [i.name for i in spec.present(4)] == ["q", "k", "v", "key_padding_mask"]
    for count in (2, 5):
        with pytest.raises(AttnxError, match=f"got {count} inputs; it takes q, k, v, key_padding_mask\\?"):
            spec.present(count)


def test_missing_field_is_named():
    spec = describe(SOFTMAX_OP)
    with pytest.raises(AttnxError, match="lacks field\\(s\\) scale"):
        spec.torch_args([torch.zeros(1, 1, 1, 1)] * 3, {"causal": 0})


def test_input_type_without_a_tensorrt_type_is_refused():
    op = AttentionOp("Odd", softmax_attention, (), input_types={"key_padding_mask": "tensor(string)"})
    with pytest.raises(AttnxError, match="key_padding_mask \\(tensor\\(string\\)\\) has no TensorRT type"):
        describe(op)


def test_custom_output_shape_rule_is_used_and_checked_against_the_op():
    op = AttentionOp("Doubled", softmax_attention, (), output_shape=lambda s: (*s["q"][:-1], 2 * s["v"][-1]))
    spec = describe(op)
    assert spec.output_shape([(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 6)]) == (1, 2, 3, 12)
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(AttnxError, match="returned shape \\(1, 2, 3, 4\\) but its output_shape rule gives"):
        spec.run([q, q, q], {"causal": 0, "scale": 1.0})
