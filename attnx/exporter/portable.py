"""What attnx writes so that the ONNX ecosystem's graph tools transform its graphs correctly.

fp16 converters retype every float32 tensor of the graph they visit (not the model-local functions).
Two things in a graph trip onnxconverter-common's converter (>= 1.15) and are rewritten, computing the
same function:

* ``Cast(to=FLOAT)`` (every attnx graph casts the integer positions of its sinusoidal encoding): the
  converter retypes the cast's output without changing its ``to`` attribute, and ONNX Runtime refuses
  the model ("Type (tensor(float16)) of output arg ... does not match expected type (tensor(float))";
  microsoft/onnxconverter-common#320). ``CastLike(x, a float32 scalar)`` casts to float32 in the
  export, and to float16 once a converter retyped the scalar (ONNX Runtime's converter turns such a
  ``Cast`` into a float16 cast too): the dtype-generic way of the bodies' ``AttnxWiden``.
* a graph output that another node also reads (the encoder's pooled classifier reads
  ``hidden_states``): with ``keep_io_types`` the converter casts the output back to float32 under its
  own name, so the reader gets float32 among float16 tensors. The output becomes an ``Identity`` of the
  value the readers keep.

Ops whose schema fixes float32 inputs (a decode step's recurrent state) cannot follow a converter's
retyping; :func:`float32_ops` names them for its ``op_block_list``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper

if TYPE_CHECKING:
    from attnx.ops import AttentionOp

FLOAT_LIKE = "attnx_float32_like"  # the scalar initializer CastLike takes its type from
READ_SUFFIX = ".read"  # the value a graph output's readers keep reading


def for_graph_tools(model: onnx.ModelProto) -> onnx.ModelProto:
    """Both rewrites on the main graph of ``model``, in place; returns it."""
    return leaf_outputs(float_casts_as_castlike(model))


def float_casts_as_castlike(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite the graph's ``Cast(to=FLOAT)`` nodes as ``CastLike(x, FLOAT_LIKE)`` in place; return it."""
    graph = model.graph
    casts = [node for node in graph.node if _float_cast(node)]
    for node in casts:
        node.CopyFrom(
            helper.make_node("CastLike", [node.input[0], FLOAT_LIKE], list(node.output), name=node.name)
        )
    if casts and not any(t.name == FLOAT_LIKE for t in graph.initializer):
        graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), FLOAT_LIKE))
    return model


def leaf_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give every graph output that a node of the graph also reads its own ``Identity`` node, in place: the
    producer writes ``<name>.read``, the readers read that, and ``Identity`` makes the output."""
    graph = model.graph
    read = {name for node in graph.node for name in node.input}
    for output in graph.output:
        if output.name not in read:
            continue
        inner = output.name + READ_SUFFIX
        for node in graph.node:
            node.output[:] = [inner if name == output.name else name for name in node.output]
            node.input[:] = [inner if name == output.name else name for name in node.input]
        graph.node.append(
            helper.make_node("Identity", [inner], [output.name], name=f"{output.name}.identity")
        )
    return model


def float32_ops(ops: Iterable[AttentionOp]) -> list[str]:
    """The op types among ``ops`` whose schema fixes float32 inputs (a decode step's recurrent state):
    an fp16 converter must keep them in float32 (its ``op_block_list``; ``attnx optimize --fp16`` does)."""
    return sorted({op.name for op in ops if "tensor(float)" in op.input_types.values()})


def _float_cast(node: onnx.NodeProto) -> bool:
    to = next((a.i for a in node.attribute if a.name == "to"), None)
    return node.op_type == "Cast" and node.domain in ("", "ai.onnx") and to == onnx.TensorProto.FLOAT
