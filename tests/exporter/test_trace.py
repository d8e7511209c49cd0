"""The torch.onnx translation table is built once per opset and copied per export
(:func:`attnx.exporter.trace.torchlib_registry_built_once`)."""

from __future__ import annotations

import torch
from torch.onnx._internal.exporter import _registration

from attnx.exporter.trace import torchlib_registry_built_once


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
