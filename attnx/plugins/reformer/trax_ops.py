"""The trax layout's custom ops and their ONNX bodies: ``attnx::ReformerTraxAttention`` (shared-QK
LSH, ``layout="trax"``) and ``attnx::ReformerLocalAttention`` (chunked local attention, which
Hugging Face Reformer models mix with LSH layers). The maths is :mod:`attnx.plugins.reformer.trax`.

Neither op has a Triton kernel (``AttentionOp.kernel`` is None): TensorRT runs their ``function``
or ``decomposed`` lowering, or the plugin lowering through attnx's CPU kernels.
"""

from __future__ import annotations

import onnxscript
import torch
from onnxscript import BOOL, FLOAT, INT64
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, OPSET, AttentionOp, AttnxWiden, trainable_op
from attnx.plugins.reformer.kernel import NEG_INF, ReformerHash, ReformerRows, ReformerSort
from attnx.plugins.reformer.trax import (
    LEN_NORM_EPS,
    MASKED_SCORE,
    SELF_SCORE,
    local_attention,
    trax_lsh_attention,
)


@trainable_op("attnx::reformer_trax_attention")
def reformer_trax_attention(
    qk: torch.Tensor,
    v: torch.Tensor,
    rotations: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    chunk_size: int,
    chunks_before: int,
    chunks_after: int,
) -> torch.Tensor:
    """Shared-QK LSH attention in the trax layout; see ``trax.trax_lsh_attention``."""
    return trax_lsh_attention(
        qk, v, rotations, key_padding_mask, causal, chunk_size, chunks_before, chunks_after
    ).contiguous()


@reformer_trax_attention.register_fake
def _(qk, v, rotations, key_padding_mask, causal, chunk_size, chunks_before, chunks_after):
    return qk.new_empty((*qk.shape[:-1], v.shape[-1]))


@trainable_op("attnx::reformer_local_attention")
def reformer_local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    chunk_size: int,
    chunks_before: int,
    chunks_after: int,
) -> torch.Tensor:
    """Chunked local attention in the trax layout; see ``trax.local_attention``."""
    return local_attention(
        q, k, v, key_padding_mask, causal, chunk_size, chunks_before, chunks_after
    ).contiguous()


@reformer_local_attention.register_fake
def _(q, k, v, key_padding_mask, causal, chunk_size, chunks_before, chunks_after):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerTraxChunk(x, chunk_size: int):
    """(b, h, g·c, ...) -> (b, h, g, c, ...)."""
    size = op.Unsqueeze(op.Constant(value_int=chunk_size), [0])
    shape = op.Concat(op.Shape(x, end=2), op.Constant(value_ints=[-1]), size, op.Shape(x, start=3), axis=0)
    return op.Reshape(x, shape)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerTraxWindow(x, index: INT64):
    """(b, h, g, c, ...) chunks -> (b, h, g, w·c, ...): each chunk's window, ``index`` (g, w)."""
    picked = op.Gather(x, index, axis=2)
    shape = op.Concat(
        op.Shape(picked, end=3), op.Constant(value_ints=[-1]), op.Shape(picked, start=5), axis=0
    )
    return op.Reshape(picked, shape)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerTraxAttend(
    q,
    k,
    v,
    pos: INT64,
    real: BOOL,
    span: INT64,
    causal: int,
    chunk_size: int,
    chunks_before: int,
    chunks_after: int,
    self_masked: int,
):
    """Each chunk attends its cyclic window, with trax's masks; see ``trax.chunk_attention``.

    q, k, v (b, h, g·c, f) in chunk order; ``pos`` and ``real`` (b or 1, h or 1, g·c): each slot's
    original position and whether its token is real; ``span`` 0 when a round is one chunk, else 1
    (``trax.window_span``). Returns the output and the row logsumexp as
    one (b, h, g·c, f + 1) tensor (the logsumexp last).
    """
    one = op.Constant(value_int=1)
    size = op.Unsqueeze(op.Constant(value_int=chunk_size), [0])
    chunks = op.Squeeze(op.Div(op.Shape(q, start=2, end=3), size), [0])
    before = op.Mul(op.Constant(value_int=chunks_before), span)
    offsets = op.Range(op.Neg(before), op.Add(op.Mul(op.Constant(value_int=chunks_after), span), one), one)
    index = op.Mod(
        op.Add(op.Unsqueeze(op.Range(op.Constant(value_int=0), chunks, one), [1]), offsets), chunks
    )
    q_chunks = ReformerTraxChunk(q, chunk_size=chunk_size)
    k_window = ReformerTraxWindow(ReformerTraxChunk(k, chunk_size=chunk_size), index)
    v_window = ReformerTraxWindow(ReformerTraxChunk(v, chunk_size=chunk_size), index)
    q_pos = op.Unsqueeze(ReformerTraxChunk(pos, chunk_size=chunk_size), [4])
    k_pos = op.Unsqueeze(ReformerTraxWindow(ReformerTraxChunk(pos, chunk_size=chunk_size), index), [3])
    k_real = op.Unsqueeze(ReformerTraxWindow(ReformerTraxChunk(real, chunk_size=chunk_size), index), [3])

    is_causal = op.Cast(op.Constant(value_int=causal), to=BOOL.dtype)
    visible = op.And(k_real, op.Not(op.And(is_causal, op.Less(q_pos, k_pos))))
    scores = op.MatMul(q_chunks, op.Transpose(k_window, perm=[0, 1, 2, 4, 3]))
    scores = op.Where(visible, scores, op.CastLike(MASKED_SCORE, q))
    is_self = op.And(op.Cast(op.Constant(value_int=self_masked), to=BOOL.dtype), op.Equal(q_pos, k_pos))
    scores = op.Where(is_self, op.CastLike(SELF_SCORE, q), scores)
    top = op.ReduceMax(scores, [-1], keepdims=1)
    lse = op.Add(top, op.Log(op.ReduceSum(op.Exp(op.Sub(scores, top)), [-1], keepdims=1)))
    out = op.Concat(op.MatMul(op.Exp(op.Sub(scores, lse)), v_window), lse, axis=-1)  # (b, h, g, c, f + 1)
    flat = op.Concat(op.Shape(out, end=2), op.Constant(value_ints=[-1]), op.Shape(out, start=4), axis=0)
    return op.Reshape(out, flat)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerTraxPad(x, chunk_size: int):
    """x (b, h, n, f) zero-padded along n to a multiple of ``chunk_size``."""
    size = op.Unsqueeze(op.Constant(value_int=chunk_size), [0])
    n = op.Shape(x, start=2, end=3)
    extra = op.Sub(op.Mul(op.Div(op.Sub(op.Add(n, size), op.Constant(value_ints=[1])), size), size), n)
    return op.Pad(
        x, op.Concat(op.Constant(value_ints=[0, 0, 0, 0, 0, 0]), extra, op.Constant(value_ints=[0]), axis=0)
    )


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerTraxSpan(padded, chunk_size: int) -> INT64:
    """0 when ``padded`` (b, h, n_pad, f) is one chunk, else 1 (``trax.window_span``)."""
    chunks = op.Div(op.Shape(padded, start=2, end=3), op.Unsqueeze(op.Constant(value_int=chunk_size), [0]))
    return op.Squeeze(op.Min(op.Sub(chunks, op.Constant(value_ints=[1])), op.Constant(value_ints=[1])), [0])


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerTraxReal(key_padding_mask: BOOL, like) -> BOOL:
    """(b, n) mask -> (b, n_pad): real tokens, False on the padding ``like`` (b, h, n_pad, f) adds."""
    extra = op.Sub(op.Shape(like, start=2, end=3), op.Shape(key_padding_mask, start=1, end=2))
    mask = op.Pad(
        op.Cast(key_padding_mask, to=INT64.dtype), op.Concat(op.Constant(value_ints=[0, 0, 0]), extra, axis=0)
    )
    return op.Cast(mask, to=BOOL.dtype)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerTraxLSH(
    qk: FLOAT,
    v: FLOAT,
    rotations: FLOAT,
    key_padding_mask: BOOL,
    causal: int,
    chunk_size: int,
    chunks_before: int,
    chunks_after: int,
) -> FLOAT:
    """The steps of :func:`attnx.plugins.reformer.trax.trax_lsh_attention`, in standard ONNX ops."""
    n = op.Shape(qk, start=2, end=3)
    qk = ReformerTraxPad(qk, chunk_size=chunk_size)
    v = ReformerTraxPad(v, chunk_size=chunk_size)
    real = op.Unsqueeze(ReformerTraxReal(key_padding_mask, qk), [1, 2])
    n_buckets = op.Mul(op.Shape(rotations, start=3, end=4), op.Constant(value_ints=[2]))
    buckets = op.Where(real, ReformerHash(qk, rotations), n_buckets)
    perm, rank = ReformerSort(buckets, AttnxWiden(qk))

    variance = op.ReduceMean(op.Mul(qk, qk), [-1], keepdims=1)
    rms = op.Sqrt(op.Add(variance, op.CastLike(LEN_NORM_EPS, qk)))
    keys = op.Div(op.Div(qk, rms), op.Sqrt(op.CastLike(op.Shape(qk, start=3), qk)))
    joint = op.Concat(op.Shape(qk, end=2), op.Constant(value_ints=[-1]), op.Shape(qk, start=3), axis=0)
    flat = op.Concat(op.Shape(qk, end=2), op.Constant(value_ints=[-1]), axis=0)
    q_sorted = op.Reshape(ReformerRows(qk, perm), joint)  # the rounds one after the other
    k_sorted = op.Reshape(ReformerRows(keys, perm), joint)
    v_sorted = op.Reshape(ReformerRows(v, perm), joint)
    pos = op.Reshape(perm, flat)
    real_sorted = op.Less(op.Reshape(op.GatherElements(buckets, perm, axis=-1), flat), n_buckets)
    span = ReformerTraxSpan(qk, chunk_size=chunk_size)
    both = ReformerTraxAttend(
        q_sorted, k_sorted, v_sorted, pos, real_sorted, span, causal=causal, chunk_size=chunk_size,
        chunks_before=chunks_before, chunks_after=chunks_after, self_masked=1,
    )  # fmt: skip
    both = ReformerRows(
        op.Reshape(both, op.Concat(op.Shape(buckets), op.Constant(value_ints=[-1]), axis=0)), rank
    )
    # Rounds weighted by their logsumexp; when a round is one chunk (span 0) every round is the same full
    # attention, and round 0 alone is taken (trax.trax_lsh_attention).
    lse = op.Slice(both, [-1], [9223372036854775807], [4])
    later = op.Greater(
        op.Range(
            op.Constant(value_int=0),
            op.Squeeze(op.Shape(buckets, start=2, end=3), [0]),
            op.Constant(value_int=1),
        ),
        op.Constant(value_int=0),
    )
    alone = op.And(later, op.Equal(span, op.Constant(value_int=0)))
    hidden = op.Where(alone, op.CastLike(NEG_INF, lse), op.CastLike(0.0, lse))
    lse = op.Add(lse, op.Unsqueeze(hidden, [1, 2]))
    # exp(lse - logsumexp_r lse) as trax computes it, not a Softmax: when every round saw only the query
    # itself, lse = -1e5 and logsumexp rounds to float32's 0.008 steps, so trax's weights sum to 0.995.
    top = op.ReduceMax(lse, [2], keepdims=1)
    weights = op.Exp(
        op.Sub(lse, op.Add(top, op.Log(op.ReduceSum(op.Exp(op.Sub(lse, top)), [2], keepdims=1))))
    )
    out = op.ReduceSum(op.Mul(op.Slice(both, [0], [-1], [4]), weights), [2], keepdims=0)
    return op.Slice(out, op.Constant(value_ints=[0]), n, op.Constant(value_ints=[2]))


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerLocal(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    key_padding_mask: BOOL,
    causal: int,
    chunk_size: int,
    chunks_before: int,
    chunks_after: int,
) -> FLOAT:
    """The steps of :func:`attnx.plugins.reformer.trax.local_attention`, in standard ONNX ops."""
    n = op.Shape(q, start=2, end=3)
    k = op.Div(k, op.Sqrt(op.CastLike(op.Shape(k, start=3), k)))
    q = ReformerTraxPad(q, chunk_size=chunk_size)
    k = ReformerTraxPad(k, chunk_size=chunk_size)
    v = ReformerTraxPad(v, chunk_size=chunk_size)
    real = op.Unsqueeze(ReformerTraxReal(key_padding_mask, q), [1])
    n_pad = op.Squeeze(op.Shape(q, start=2, end=3), [0])
    pos = op.Unsqueeze(op.Range(op.Constant(value_int=0), n_pad, op.Constant(value_int=1)), [0, 1])
    both = ReformerTraxAttend(
        q, k, v, pos, real, ReformerTraxSpan(q, chunk_size=chunk_size), causal=causal, chunk_size=chunk_size,
        chunks_before=chunks_before,
        chunks_after=chunks_after, self_masked=0,
    )  # fmt: skip
    return op.Slice(
        both, op.Constant(value_ints=[0, 0]), op.Concat(n, op.Constant(value_ints=[-1]), axis=0), [2, 3]
    )


@onnxscript.script(OPSET, default_opset=op)
def ReformerTraxAttention(
    qk: FLOAT,
    v: FLOAT,
    rotations: FLOAT,
    key_padding_mask: BOOL,
    causal: int,
    chunk_size: int,
    chunks_before: int,
    chunks_after: int,
) -> FLOAT:
    return ReformerTraxLSH(
        qk, v, rotations, key_padding_mask, causal=causal, chunk_size=chunk_size,
        chunks_before=chunks_before, chunks_after=chunks_after,
    )  # fmt: skip


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerEveryone(x) -> BOOL:
    """An all-True (b, n) mask for x (b, h, n, f)."""
    batch_and_length = op.Concat(op.Shape(x, end=1), op.Shape(x, start=2, end=3), axis=0)
    return op.ConstantOfShape(batch_and_length, value=onnxscript.ir.tensor([True]))


@onnxscript.script(OPSET, default_opset=op)
def ReformerTraxAttentionNoMask(
    qk: FLOAT, v: FLOAT, rotations: FLOAT, causal: int, chunk_size: int, chunks_before: int, chunks_after: int
) -> FLOAT:
    return ReformerTraxLSH(
        qk, v, rotations, ReformerEveryone(qk), causal=causal, chunk_size=chunk_size,
        chunks_before=chunks_before, chunks_after=chunks_after,
    )  # fmt: skip


@onnxscript.script(OPSET, default_opset=op)
def ReformerLocalAttention(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    key_padding_mask: BOOL,
    causal: int,
    chunk_size: int,
    chunks_before: int,
    chunks_after: int,
) -> FLOAT:
    return ReformerLocal(
        q, k, v, key_padding_mask, causal=causal, chunk_size=chunk_size, chunks_before=chunks_before,
        chunks_after=chunks_after,
    )  # fmt: skip


@onnxscript.script(OPSET, default_opset=op)
def ReformerLocalAttentionNoMask(
    q: FLOAT, k: FLOAT, v: FLOAT, causal: int, chunk_size: int, chunks_before: int, chunks_after: int
) -> FLOAT:
    return ReformerLocal(
        q, k, v, ReformerEveryone(q), causal=causal, chunk_size=chunk_size, chunks_before=chunks_before,
        chunks_after=chunks_after,
    )  # fmt: skip


TRAX_OP = AttentionOp(
    name="ReformerTraxAttention",
    torch_op=reformer_trax_attention,
    bodies=(ReformerTraxAttention, ReformerTraxAttentionNoMask),
    input_types={"key_padding_mask": "tensor(bool)"},
    doc="Reformer shared-QK LSH attention in the trax / Hugging Face layout (joint cyclic chunks, keys of "
    "any bucket, self -1e5, masked -1e9); qk, v (batch, heads, seq, dim), rotations (heads, dim, n_hashes, "
    "n_buckets/2); key_padding_mask (batch, seq) bool, True = real token.",
)
LOCAL_OP = AttentionOp(
    name="ReformerLocalAttention",
    torch_op=reformer_local_attention,
    bodies=(ReformerLocalAttention, ReformerLocalAttentionNoMask),
    input_types={"key_padding_mask": "tensor(bool)"},
    doc="Reformer chunked local attention in the trax / Hugging Face layout (cyclic windows of chunks, "
    "masked -1e9); q, k, v (batch, heads, seq, dim); key_padding_mask (batch, seq) bool, True = real token.",
)
