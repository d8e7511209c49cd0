"""The torch.onnx translation table is built once per opset and copied per export
(:func:`attnx.exporter.trace.torchlib_registry_built_once`); the optimizer runs without its slice-pair rule
(:func:`attnx.exporter.trace.optimize`)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.rewriter
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.onnx._internal.exporter import _registration

from attnx.exporter.trace import optimize, torchlib_registry_built_once


def _custom(x):  # registered, never called
    return x


def test_each_export_gets_its_own_copy_of_the_table_built_once():
    target = torch.ops.aten.relu.default
    with torchlib_registry_built_once():
        first = _registration.ONNXRegistry().from_torchlib(opset_version=18)
        first.register_op(target, _custom)
        second = _registration.ONNXRegistry.from_torchlib(opset_version=18)
    assert first.functions is not second.functions
    assert first.get_decomps(target)[0].onnx_function is _custom
    assert all(d.onnx_function is not _custom for d in second.get_decomps(target))
    assert second.functions.keys() == _registration.ONNXRegistry.from_torchlib(18).functions.keys()
    assert isinstance(vars(_registration.ONNXRegistry)["from_torchlib"], classmethod)  # restored


def _halves() -> onnx.ModelProto:
    """y = x[..., :4] + x[..., 4:] for x (2, 8): the two Slices the rule would make a Split (in this node
    order: its matcher tries the pattern from the last Slice)."""
    ints = {name: numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
            {"zero": [0], "half": [4], "end": [8], "axis": [-1]}.items()}  # fmt: skip
    nodes = [
        helper.make_node("Slice", ["x", "half", "end", "axis"], ["high"]),
        helper.make_node("Slice", ["x", "zero", "half", "axis"], ["low"]),
        helper.make_node("Add", ["low", "high"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "halves",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        list(ints.values()),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_the_optimizer_keeps_slice_pairs_and_its_rules():
    before = onnxscript.rewriter._DEFAULT_REWRITE_RULES
    model = ir.serde.deserialize_model(_halves())
    optimize(model, None)
    assert sorted(node.op_type for node in model.graph) == ["Add", "Slice", "Slice"]
    assert onnxscript.rewriter._DEFAULT_REWRITE_RULES is before  # restored
    onnxscript.optimizer.optimize_ir(model)  # the rule it leaves out applies to this graph
    assert sorted(node.op_type for node in model.graph) == ["Add", "Split"]
