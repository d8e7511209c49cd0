"""What the built-in bodies on ONNX Runtime's own kernels (``com.microsoft``, the "ort" target) share.

The opset of those kernels, the ONNX Runtime release they were checked against, and the head
reshapes their packed layouts need (the kernels take head counts as attributes, which a body cannot
take from the shapes, so heads become batch rows). Used by the ``softmax``, ``linear`` and gated
families' ``ort`` modules.
"""

from __future__ import annotations

import onnxscript
from onnxscript import FLOAT
from onnxscript import opset18 as op

from attnx.ops import LIBRARY

MICROSOFT = onnxscript.values.Opset("com.microsoft", 1)
# The ONNX Runtime release whose LinearAttention / GatedDeltaNet / attention kernels the built-in ort
# bodies were checked against: the ops' TargetBodies(since=...), named when an older one lacks them.
ORT_SINCE = "1.32"


@onnxscript.script(LIBRARY, default_opset=op)
def OrtHeadsToBatch(x: FLOAT) -> FLOAT:
    """(b, h, n, d) -> (b * h, n, d); n may be 0 (no -1 in the shape, and a 0 in it is a 0)."""
    rows = op.Mul(op.Shape(x, start=0, end=1), op.Shape(x, start=1, end=2))
    return op.Reshape(x, op.Concat(rows, op.Shape(x, start=2), axis=0), allowzero=1)


@onnxscript.script(LIBRARY, default_opset=op)
def OrtRepeatHeads(x: FLOAT, like: FLOAT) -> FLOAT:
    """q or k (b, hk, n, d) repeated to the value heads of ``like`` (b, hv, ...), each r times in a row."""
    grouped = op.Concat(
        op.Shape(x, start=0, end=2), op.Constant(value_ints=[1]), op.Shape(x, start=2), axis=0
    )
    heads = op.Div(op.Shape(like, start=1, end=2), op.Shape(x, start=1, end=2))
    wide = op.Concat(op.Shape(x, start=0, end=2), heads, op.Shape(x, start=2), axis=0)
    return op.Reshape(
        op.Expand(op.Reshape(x, grouped, allowzero=1), wide),
        op.Concat(op.Shape(like, start=0, end=2), op.Shape(x, start=2), axis=0),
        allowzero=1,
    )
