"""Every built-in ONNX body is dtype-generic: no Cast to a float type, float literals only into CastLike.

fp16 converters retype every float tensor of the graphs they visit (converting constant tensors with
them) and skip model-local functions. A float literal (``value_float``) is not converted, so next to a
tensor it breaks an inlined (decomposed) body once converted; onnxconverter-common also leaves
``Cast(to=FLOAT)`` untouched while retyping its output. The conformance kit's ``fp16-convert`` check
exports and converts whole models (slow); this is its fast static half, on every body and library
function the built-ins attach.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import pytest

from attnx.exporter.lowering import function_protos
from attnx.ops import AttentionOp
from attnx.registry import Registry
from tests.testing import seeded_plugins

FLOATS = {
    onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE
}
BUILTINS = ("softmax", "linear", "cosformer", "reformer", "fastformer")


def builtin_ops() -> list[AttentionOp]:
    registry = Registry(autoload=True)
    impls = [registry.variant(name).load() for name in BUILTINS]
    return [op for impl in impls for op in (*impl.ops, *impl.decode_ops)]


def nodes(graph_nodes: list[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """The nodes and those of their subgraphs (If branches)."""
    for node in graph_nodes:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from nodes(list(attribute.g.node))


def float_literals(op: AttentionOp) -> list[str]:
    """Where a body of ``op`` makes a float the converters cannot follow: a Cast to a float type, or a
    float literal that is not CastLike's input."""
    problems = []
    for body in op.bodies:
        for function in function_protos(body):
            where = function.name
            found = list(nodes(list(function.node)))
            users = {}
            for node in found:
                for position, name in enumerate(node.input):
                    users.setdefault(name, []).append((node.op_type, position))
            for node in found:
                attributes = {a.name: a for a in node.attribute}
                if node.op_type == "Cast" and attributes["to"].i in FLOATS:
                    problems.append(f"{where}: Cast to {onnx.TensorProto.DataType.Name(attributes['to'].i)}")
                if node.op_type == "Constant" and ({"value_float", "value_floats"} & set(attributes)):
                    consumers = users.get(node.output[0], [])
                    if not consumers or any(user[0] != "CastLike" for user in consumers):
                        problems.append(f"{where}: float literal used by {sorted(set(consumers))}")
    return problems


@pytest.mark.parametrize("op", builtin_ops(), ids=lambda op: op.name)
def test_builtin_bodies_make_floats_only_through_castlike(op):
    assert float_literals(op) == []


def test_a_cast_to_float_and_a_float32_literal_are_found():
    found = "\n".join(float_literals(seeded_plugins.OPS["float32"]))
    assert "SeededAttentionFloat32: Cast to FLOAT" in found
    assert "SeededAttentionFloat32: float literal used by [('Mul', 1)]" in found
    assert float_literals(seeded_plugins.OPS["sound"]) == []
