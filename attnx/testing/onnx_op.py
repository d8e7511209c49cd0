"""Run one recorded op call through ONNX Runtime as a one-node model, lowered as the exporter does.

The node is built the way attnx's translation emits it (omitted optional inputs left
out, bool attributes as ints) in a model at ``opset``, then lowered by attnx's own code:
``function`` attaches the body :func:`attnx.exporter.lowering.attach_functions` picks (the
body an export at that opset would use), ``decomposed`` inlines the portable body; ``plugin``
marks the bare node and runs it through attnx's CPU kernels (:mod:`attnx.ortkernels`), the
path a plugin-lowered export takes on ONNX Runtime CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper

from attnx.domains import DOMAIN
from attnx.exporter.lowering import check, lower
from attnx.exporter.opsets import DEFAULT_OPSET, IR_VERSIONS
from attnx.ops import AttentionOp
from attnx.targets import PORTABLE
from attnx.testing.subject import OpCall

OPSET = DEFAULT_OPSET
_INT_ATTRIBUTES = ("bool", "int", "SymInt")
_FLOAT_ATTRIBUTES = ("float",)


def attribute_value(torch_type: str, value: Any) -> Any:
    """The ONNX attribute value of a torch argument (bool -> int, int for a float -> float)."""
    if torch_type in _INT_ATTRIBUTES:
        return int(value)
    if torch_type in _FLOAT_ATTRIBUTES:
        return float(value)
    if torch_type in ("List[float]", "float[]"):
        return [float(v) for v in value]
    if torch_type in ("List[int]", "int[]"):
        return [int(v) for v in value]
    return value


def node_model(op: AttentionOp, call: OpCall, opset: int = OPSET) -> onnx.ModelProto:
    """A model at ``opset`` with the single bare node ``attnx::<op.name>`` for ``call``."""
    bound = call.bound()
    node_inputs: list[str] = []
    graph_inputs = []
    for arg in op.arguments:
        if not arg.is_tensor:
            continue
        value = bound[arg.name]
        if value is None:
            node_inputs.append("")
            continue
        node_inputs.append(arg.name)
        elem = helper.np_dtype_to_tensor_dtype(_numpy(value).dtype)
        graph_inputs.append(helper.make_tensor_value_info(arg.name, elem, [None] * value.dim()))
    while node_inputs and not node_inputs[-1]:
        node_inputs.pop()
    attributes = {
        a.name: attribute_value(a.attribute_type, bound[a.name]) for a in op.arguments if not a.is_tensor
    }
    node = helper.make_node(op.name, node_inputs, list(op.outputs), domain=DOMAIN, **attributes)
    graph_outputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(_numpy(value).dtype), [None] * value.dim()
        )
        for name, value in zip(op.outputs, call.outputs, strict=True)
    ]
    graph = helper.make_graph([node], f"attnx_testing_{op.name}", graph_inputs, graph_outputs)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, 1)],
        ir_version=IR_VERSIONS[opset],
    )


class OpSession:
    """An ONNX Runtime (CPU) session of :func:`node_model` at ``opset`` with ``lowering`` (and ``target``'s
    bodies where the op declares them), fed with torch tensors.

    The model is prepared (for ``plugin``, its attnx kernel registered) at construction; the
    session starts on the first :meth:`run`, so a failing body is reported where it runs.
    """

    def __init__(
        self,
        op: AttentionOp,
        call: OpCall,
        lowering: str = "function",
        opset: int = OPSET,
        target: str = PORTABLE,
    ) -> None:
        import onnxruntime

        model = lower(node_model(op, call, opset), [op], lowering, target)
        self.options = onnxruntime.SessionOptions()
        if lowering == "plugin":
            from attnx.ortkernels import kernel_view, session_options

            model, self.options = kernel_view(model, [op]), session_options()
        else:
            check(model)
        self.model = model
        self.input_names = [value.name for value in model.graph.input]
        self.session: Any = None

    def run(self, values: Mapping[str, Any]) -> list[np.ndarray]:
        """Every output of the node, in the op's output order."""
        import onnxruntime

        if self.session is None:
            self.session = onnxruntime.InferenceSession(
                self.model.SerializeToString(), self.options, providers=["CPUExecutionProvider"]
            )
        return self.session.run(None, {name: _numpy(values[name]) for name in self.input_names})


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().contiguous().cpu().numpy()
