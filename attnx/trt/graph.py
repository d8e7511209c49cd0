"""What TensorRT's ONNX parser needs from a graph: plugin nodes, the opset, standard ``Attention``
nodes; and the ``trt.plugins`` rewrite for ONNX Runtime's TensorRT execution provider.

TensorRT's ONNX parser imports an unknown node as a plugin: op_type = plugin name,
``plugin_namespace`` and ``plugin_version`` attributes pick the creator, and every other
attribute whose name is one of the creator's field names becomes a plugin field (a field
without a same-named attribute is silently skipped, so a renamed attribute would build an
engine with a missing field; :func:`check_plugin_nodes` refuses that up front).

ONNX Runtime's TensorRT execution provider validates the graph before TensorRT sees it and
only knows plugins as custom ops in the domain ``trt.plugins`` (one variadic op per creator
in TensorRT's registry); :func:`for_ort_tensorrt` produces that variant of the graph.

The parser of TensorRT 11.5 reads ai.onnx opsets up to 25 (:func:`check_opset`). From TensorRT 10.14
it maps the standard ``Attention`` op (opset >= 23) to its native ``IAttention`` layer, with the
restrictions of onnx-tensorrt's operator table: 4-D ``Q``/``K``/``V``/``attn_mask``, one output, no
``past_key``/``past_value``/``nonpad_kv_seqlen`` inputs, no ``softcap`` or ``qk_matmul_output_mode``
(:func:`check_attention_nodes`); such an export needs no plugin at all.
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
PARSER_MAX_OPSET = 25  # TensorRT 11.5's ONNX parser
ATTENTION_MIN_VERSION = (10, 14)  # the first parser that maps Attention to IAttention
# Attention inputs 4-6 and attributes IAttention does not take (onnx-tensorrt docs/operators.md)
_ATTENTION_INPUTS = ("past_key", "past_value", "nonpad_kv_seqlen")
_ATTENTION_ATTRIBUTES = ("softcap", "qk_matmul_output_mode")


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


def check_opset(opset: int, label: str) -> None:
    """Refuse an ai.onnx opset TensorRT's parser cannot read (above :data:`PARSER_MAX_OPSET`)."""
    if opset > PARSER_MAX_OPSET:
        raise AttnxError(
            f"{label} uses ONNX opset {opset}; TensorRT 11.5 parses opsets <= {PARSER_MAX_OPSET}: "
            f"re-export with --opset {PARSER_MAX_OPSET} or lower"
        )


def attention_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The standard ``Attention`` nodes of the graph and of its model-local functions, in ``If``
    branches too."""
    nodes = _with_subgraphs([*model.graph.node, *(n for f in model.functions for n in f.node)])
    return [n for n in nodes if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]


def _with_subgraphs(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    found = []
    for node in nodes:
        found.append(node)
        for attribute in node.attribute:
            for graph in [attribute.g, *attribute.graphs]:
                found += _with_subgraphs(list(graph.node))
    return found


def check_attention_nodes(nodes: Sequence[onnx.NodeProto], version: tuple[int, int]) -> None:
    """Refuse standard ``Attention`` nodes TensorRT ``version`` cannot map to ``IAttention``."""
    if nodes and version < ATTENTION_MIN_VERSION:
        raise AttnxError(
            f"the graph has {len(nodes)} standard Attention node(s), which TensorRT "
            f"{version[0]}.{version[1]} cannot parse (IAttention needs >= "
            f"{ATTENTION_MIN_VERSION[0]}.{ATTENTION_MIN_VERSION[1]}): "
            "upgrade TensorRT (pip install 'attnx[gpu]') or export a lowering without the Attention op"
        )
    for node in nodes:
        unsupported = _unsupported_attention_parts(node)
        if unsupported:
            raise AttnxError(
                f"Attention node {node.name or '(unnamed)'} uses {', '.join(unsupported)}, which TensorRT's "
                "IAttention does not take (one output, no KV-cache inputs); build a graph without them"
            )


def _unsupported_attention_parts(node: onnx.NodeProto) -> list[str]:
    parts = [name for name, given in zip(_ATTENTION_INPUTS, node.input[4:], strict=False) if given]
    named = [a for a in node.attribute if a.name in _ATTENTION_ATTRIBUTES]
    parts += [a.name for a in named if helper.get_attribute_value(a) != 0]
    if sum(1 for output in node.output if output) > 1:
        parts.append("more than one output")
    return parts
