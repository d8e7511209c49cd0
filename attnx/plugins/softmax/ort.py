"""Softmax attention on ONNX Runtime's ``com.microsoft::GroupQueryAttention`` kernel, for an "ort" target.

The kernel computes softmax(q k^T * scale) v per head, causal (top-left aligned: key j <= query i) or
bidirectional by its ``causal`` attribute, without materialising a mask: a causal call skips the keys
in each query's future. Every head is a batch row of the kernel (its head counts are attributes, which a
body cannot take from the shapes). It reads ``scale = 0`` as 1/sqrt(d) and takes no key padding mask for
arbitrary positions, and its keys must be as many as the queries with no cache and as wide as the values:
:func:`SoftmaxOrtFits` says when a call is one it computes as the torch op does; the others take the
portable body (``attnx.plugins.softmax.kernel``).
"""

from __future__ import annotations

import onnxscript
from onnxscript import BOOL, FLOAT, INT32
from onnxscript import opset18 as op

from attnx.ops import LIBRARY
from attnx.plugins._gated_ort import MICROSOFT, OrtHeadsToBatch, OrtRepeatHeads


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxOrtKernel(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    """(b, h, n, d) queries, keys and values through the kernel, with no cache: (b, h, n, d); keys and
    values of fewer heads (grouped-query) are repeated to the query heads first."""
    rows = OrtHeadsToBatch(q)
    lengths = op.Shape(q, start=2, end=3)
    last = op.Cast(op.Sub(lengths, op.Constant(value_ints=[1])), to=INT32.dtype)
    out, _, _ = MICROSOFT.GroupQueryAttention(
        rows,
        OrtHeadsToBatch(OrtRepeatHeads(k, q)),
        OrtHeadsToBatch(OrtRepeatHeads(v, q)),
        None,
        None,
        op.Expand(last, op.Shape(rows, start=0, end=1)),  # seqlens_k: the last key's index, per row
        op.Cast(op.Squeeze(lengths), to=INT32.dtype),  # total_sequence_length
        num_heads=1,
        kv_num_heads=1,
        causal=causal,
        scale=scale,
    )
    return op.Reshape(out, op.Shape(q))


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxOrtFits(q: FLOAT, k: FLOAT, v: FLOAT, scale: float) -> BOOL:
    """Whether :func:`SoftmaxOrtKernel` computes this call: as many queries as keys (no cache), keys as
    wide as values and a non-zero scale (the kernel's 0 means 1/sqrt(d))."""
    same_length = op.Equal(op.Shape(q, start=2, end=3), op.Shape(k, start=2, end=3))
    same_width = op.Equal(op.Shape(k, start=3), op.Shape(v, start=3))
    factor = op.CastLike(op.Constant(value_float=scale), q)
    scaled = op.Not(op.Equal(factor, op.CastLike(op.Constant(value_float=0.0), q)))
    return op.Squeeze(op.And(op.And(same_length, same_width), op.Unsqueeze(scaled, [0])))
