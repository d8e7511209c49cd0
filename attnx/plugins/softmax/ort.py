"""Softmax attention on ONNX Runtime's own kernels, for an "ort" target.

* ``com.microsoft::GroupQueryAttention`` computes softmax(q k^T * scale) v per head, causal (top-left
  aligned: key j <= query i) or bidirectional by its ``causal`` attribute, without materialising a mask:
  a causal call skips the keys in each query's future. Its keys must be as many as the queries (no
  cache): :func:`SoftmaxOrtFits`.
* ``com.microsoft::MultiHeadAttention`` takes any number of keys per query, without a mask: it computes
  a decode step, one query per head against every cached key (which a bottom-right causal mask lets it
  see all of): :func:`SoftmaxOrtOneQuery`.

Both take their head counts as attributes, which a body cannot take from the shapes, so every head is a
batch row (the query heads of one key/value head are one row's queries for MultiHeadAttention). Both read
``scale = 0`` as 1/sqrt(d) and take no key padding mask for arbitrary positions, and here keys as wide as
the values. The other calls take the portable body (``attnx.plugins.softmax.kernel``).
"""

from __future__ import annotations

import onnxscript
from onnxscript import BOOL, FLOAT, INT32
from onnxscript import opset18 as op

from attnx.ops import LIBRARY
from attnx.plugins.lib.ort import MICROSOFT, OrtHeadsToBatch, OrtRepeatHeads


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
def SoftmaxOrtOneQueryKernel(q: FLOAT, k: FLOAT, v: FLOAT, scale: float) -> FLOAT:
    """(b, h, 1, d) queries against (b, hk, n, d) keys and values, hk dividing h, through MultiHeadAttention:
    (b, h, 1, d). Row r = (batch, key/value head) holds that head's h / hk queries; its keys and values
    are read in place (BNSH with one head)."""
    groups = op.Concat(
        op.Shape(k, start=0, end=2), op.Constant(value_ints=[-1]), op.Shape(q, start=3), axis=0
    )
    rows = op.Reshape(q, groups)  # (b, hk, h / hk, d): query head i reads key/value head i // (h / hk)
    per_row = op.Concat(op.Constant(value_ints=[-1, 1]), op.Shape(k, start=2), axis=0)
    out = MICROSOFT.MultiHeadAttention(
        OrtHeadsToBatch(rows), op.Reshape(k, per_row), op.Reshape(v, per_row), num_heads=1, scale=scale
    )
    return op.Reshape(out, op.Shape(q))


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxOrtComputes(q: FLOAT, k: FLOAT, v: FLOAT, scale: float) -> BOOL:
    """(1,): keys as wide as values and a non-zero scale (the kernels' 0 means 1/sqrt(d))."""
    same_width = op.Equal(op.Shape(k, start=3), op.Shape(v, start=3))
    factor = op.CastLike(op.Constant(value_float=scale), q)
    scaled = op.Not(op.Equal(factor, op.CastLike(op.Constant(value_float=0.0), q)))
    return op.And(same_width, op.Unsqueeze(scaled, [0]))


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxOrtFits(q: FLOAT, k: FLOAT, v: FLOAT, scale: float) -> BOOL:
    """Whether :func:`SoftmaxOrtKernel` computes this call: as many queries as keys (no cache), and
    :func:`SoftmaxOrtComputes`."""
    same_length = op.Equal(op.Shape(q, start=2, end=3), op.Shape(k, start=2, end=3))
    return op.Squeeze(op.And(same_length, SoftmaxOrtComputes(q, k, v, scale=scale)))


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxOrtOneQuery(q: FLOAT, k: FLOAT, v: FLOAT, scale: float) -> BOOL:
    """Whether :func:`SoftmaxOrtOneQueryKernel` computes this call: one query per head (a decode step),
    and :func:`SoftmaxOrtComputes`."""
    one = op.Equal(op.Shape(q, start=2, end=3), op.Constant(value_ints=[1]))
    return op.Squeeze(op.And(one, SoftmaxOrtComputes(q, k, v, scale=scale)))
