"""The ``linear`` variant's feature map phi(x) = elu(x) + 1 as an ONNX library function (shared by its
portable bodies and its ONNX Runtime kernel bodies)."""

from __future__ import annotations

import onnxscript
from onnxscript import FLOAT
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, AttnxWiden


@onnxscript.script(LIBRARY, default_opset=op)
def LinearEluFeatures(x: FLOAT) -> FLOAT:
    """elu(x) + 1 in float32, as relu(x) + exp(min(x, 0)): the same map, without ONNX Runtime's slow Elu."""
    wide = AttnxWiden(x)
    return op.Add(op.Relu(wide), op.Exp(op.Min(wide, op.CastLike(op.Constant(value_float=0.0), wide))))
