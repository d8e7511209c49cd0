"""ONNX wiring of plugin-lowered models: the node contract and the ``trt.plugins`` rewrite.

TensorRT's ONNX parser imports an unknown node as a plugin: op_type = plugin name,
``plugin_namespace`` and ``plugin_version`` attributes pick the creator, and every other
attribute whose name is one of the creator's field names becomes a plugin field (a field
without a same-named attribute is silently skipped, so a renamed attribute would build an
engine with a missing field; :func:`check_plugin_nodes` refuses that up front).

ONNX Runtime's TensorRT execution provider validates the graph before TensorRT sees it and
only knows plugins as custom ops in the domain ``trt.plugins`` (one variadic op per creator
in TensorRT's registry); :func:`for_ort_tensorrt` produces that variant of the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import onnx
from onnx import helper

from attnx.domains import DOMAIN, PLUGIN_NAMESPACE, PLUGIN_VERSION
from attnx.errors import AttnxError
from attnx.exporter.lowering import attnx_nodes
from attnx.trt.spec import describe

if TYPE_CHECKING:
    from attnx.ops import AttentionOp

ORT_TRT_DOMAIN = "trt.plugins"
PLUGIN_ATTRIBUTES = ("plugin_namespace", "plugin_version")


def check_plugin_nodes(model: onnx.ModelProto, ops: Sequence[AttentionOp]) -> int:
    """Check that every ``attnx::`` node is a complete call of its plugin; return the node count.

    Each node must carry ``plugin_namespace="attnx"``, ``plugin_version="1"``, exactly the
    plugin's fields as attributes (same names, same types) and its inputs in plugin order
    (optional ones only missing at the end: TensorRT passes inputs by position).

    Raises:
        AttnxError: the first node that breaks the contract, naming the problem.
    """
    specs = {op.name: describe(op) for op in ops}
    nodes = attnx_nodes(model)
    for node in nodes:
        spec = specs.get(node.op_type)
        where = f"node {node.name or node.op_type} (attnx::{node.op_type})"
        if spec is None:
            raise AttnxError(f"{where}: no attnx op of that name is registered by the model's variants")
        attributes = {a.name: a for a in node.attribute}
        for name, expected in zip(PLUGIN_ATTRIBUTES, (PLUGIN_NAMESPACE, PLUGIN_VERSION), strict=True):
            value = attributes.pop(name, None)
            if value is None or helper.get_attribute_value(value) != expected.encode():
                raise AttnxError(f"{where}: needs {name}=\"{expected}\"; re-export with --lowering plugin")
        fields = {f.name: f for f in spec.fields}
        if set(attributes) != set(fields):
            raise AttnxError(
                f"{where}: attributes ({', '.join(sorted(attributes))}) differ from the plugin's fields "
                f"({', '.join(sorted(fields))})"
            )
        for name, attribute in attributes.items():
            try:
                fields[name].from_attribute(attribute)
            except AttnxError as exc:
                raise AttnxError(f"{where}: {exc}") from None
        if "" in node.input:
            raise AttnxError(f"{where}: omits an input before a given one; TensorRT maps inputs by position")
        spec.present(len(node.input))
    return len(nodes)


def for_ort_tensorrt(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a plugin-lowered model whose ``attnx::`` nodes are in the ``trt.plugins`` domain.

    Everything TensorRT reads (op_type, plugin_namespace, plugin_version, fields, inputs)
    is unchanged; only the ONNX domain moves, so ORT's graph check accepts the nodes.
    """
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for node in attnx_nodes(result):
        node.domain = ORT_TRT_DOMAIN
    kept = [o for o in result.opset_import if o.domain not in (DOMAIN, ORT_TRT_DOMAIN)]
    del result.opset_import[:]
    result.opset_import.extend([*kept, helper.make_opsetid(ORT_TRT_DOMAIN, 1)])
    return result
