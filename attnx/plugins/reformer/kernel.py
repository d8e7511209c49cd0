"""Reformer LSH attention (the paper's layout): the torch custom op and its ONNX bodies.

ONNX has no argsort: the bodies sort with TopK (k = padded length, ascending) on the
float key ``bucket * n_pad + position`` (distinct integers, exact in float32 while
(n_buckets + 1) * n_pad <= 2**24, i.e. 1.8M tokens at 8 buckets) and undo the sort
with ScatterElements (inverse permutation) + GatherElements. TensorRT caps TopK's k
(3840 in TensorRT 10), so the function/decomposed lowerings cannot run in TensorRT
beyond that length; the plugin lowering has no such limit.
"""

from __future__ import annotations

import onnxscript
import torch
from onnxscript import BOOL, FLOAT, INT32, INT64
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, OPSET, AttentionOp, AttnxWiden, trainable_op
from attnx.plugins.reformer.lsh import NORM_EPS, SELF_SCORE, lsh_attention

NEG_INF = float("-inf")


@trainable_op("attnx::reformer_attention")
def reformer_attention(
    qk: torch.Tensor,
    v: torch.Tensor,
    rotations: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    chunk_size: int,
) -> torch.Tensor:
    """LSH attention: qk, v (b, h, n, d), rotations (h, d, n_hashes, n_buckets/2); see ``lsh_attention``."""
    # contiguous, as the fake kernel promises (torch.compile checks the strides; the result is a slice)
    return lsh_attention(qk, v, rotations, key_padding_mask, causal, chunk_size).contiguous()


@reformer_attention.register_fake
def _(qk, v, rotations, key_padding_mask, causal, chunk_size):
    return qk.new_empty((*qk.shape[:-1], v.shape[-1]))


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerHash(qk: FLOAT, rotations: FLOAT) -> INT64:
    """argmax([x R, -x R]) per head and round, in float32: (b, h, n, d) -> (b, h, r, n)."""
    rotation_shape = op.Shape(rotations)
    flat_shape = op.Concat(op.Slice(rotation_shape, [0], [2]), op.Constant(value_ints=[-1]), axis=0)
    flat = op.Reshape(AttnxWiden(rotations), flat_shape)
    projected = op.MatMul(AttnxWiden(qk), flat)
    split = op.Concat(op.Shape(projected, end=3), op.Slice(rotation_shape, [2], [4]), axis=0)
    projected = op.Transpose(op.Reshape(projected, split), perm=[0, 1, 3, 2, 4])
    return op.ArgMax(op.Concat(projected, op.Neg(projected), axis=-1), axis=-1, keepdims=0)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerRows(x, index: INT64):
    """x (*batch, n, f) at positions ``index`` (*batch, *rest) along n -> (*batch, *rest, f).

    One Gather of whole rows from x flattened to (batch · n, f): no copy of x per round and no
    index expanded to x's width, as a GatherElements would need.
    """
    batch = op.Shape(x, end=-2)
    n = op.Squeeze(op.Shape(x, start=-2, end=-1), [0])
    count = op.ReduceProd(batch, keepdims=0)
    rows = op.Reshape(op.Mul(count, n), [1])
    flat = op.Reshape(x, op.Concat(rows, op.Shape(x, start=-1), axis=0), allowzero=1)  # f may be 0
    starts = op.Mul(op.Range(op.Constant(value_int=0), count, op.Constant(value_int=1)), n)
    extra = op.Sub(op.Size(op.Shape(index)), op.Size(batch))
    ones = op.ConstantOfShape(op.Reshape(extra, [1]), value=onnxscript.ir.tensor([1]))
    return op.Gather(flat, op.Add(index, op.Reshape(starts, op.Concat(batch, ones, axis=0))), axis=0)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerChunk(x, chunk_size: int):
    """(b, h, r, n_pad, ...) -> (b, h, r, nc, c, ...); the trailing dims may be 0."""
    size = op.Unsqueeze(op.Constant(value_int=chunk_size), [0])
    chunks = op.Div(op.Shape(x, start=3, end=4), size)
    shape = op.Concat(op.Shape(x, end=3), chunks, size, op.Shape(x, start=4), axis=0)
    return op.Reshape(x, shape, allowzero=1)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerUnchunk(x):
    """(b, h, r, nc, c, ...) -> (b, h, r, n_pad, ...)."""
    return op.Reshape(
        x, op.Concat(op.Shape(x, end=3), op.Constant(value_ints=[-1]), op.Shape(x, start=5), axis=0)
    )


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerLookBack(x):
    """Previous chunk then own chunk along the chunk axis: (..., nc, c, ...) -> (..., nc, 2c, ...)."""
    previous = op.Concat(op.Slice(x, [-1], [9223372036854775807], [3]), op.Slice(x, [0], [-1], [3]), axis=3)
    return op.Concat(previous, x, axis=4)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerLookBackFilled(x: INT64) -> INT64:
    """:func:`ReformerLookBack` with -1 as the (absent) chunk before the first one."""
    first = op.Slice(x, [0], [1], [3])
    filler = op.Sub(op.Mul(first, op.Constant(value_int=0)), op.Constant(value_int=1))
    previous = op.Concat(filler, op.Slice(x, [0], [-1], [3]), axis=3)
    return op.Concat(previous, x, axis=4)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerSort(buckets: INT64, like: FLOAT) -> tuple[INT64, INT64]:
    """Per round, positions sorted by (bucket, position) and the inverse permutation, both (b, h, r, n)."""
    n = op.Shape(buckets, start=3, end=4)
    positions = op.Range(op.Constant(value_int=0), op.Squeeze(n, [0]), op.Constant(value_int=1))
    sort_key = op.CastLike(op.Add(op.Mul(buckets, n), positions), like)
    _, perm = op.TopK(sort_key, n, axis=-1, largest=0, sorted=1)
    rank = op.ScatterElements(
        op.Mul(perm, op.Constant(value_int=0)), perm, op.Expand(positions, op.Shape(perm)), axis=-1
    )
    return perm, rank


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerMerge(top, mixed, rank: INT64):
    """Undo each round's sort and combine the rounds (``mixed``'s last feature: the denominator); see
    ``lsh.merge_rounds``."""
    mixed = ReformerRows(ReformerUnchunk(mixed), rank)
    top = op.Squeeze(ReformerRows(ReformerUnchunk(top), rank), [-1])  # (b, h, r, n): no innermost 1
    scale = op.Exp(op.Sub(top, op.ReduceMax(top, [2], keepdims=1)))
    scaled = op.ReduceSum(op.Mul(op.Unsqueeze(scale, [-1]), mixed), [2], keepdims=0)
    return op.Div(op.Slice(scaled, [0], [-1], [3]), op.Slice(scaled, [-1], [9223372036854775807], [3]))


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerWindow(q_rank: INT64, k_rank: INT64, causal: int, chunk_size: int) -> BOOL:
    """0 <= q // u - k // u <= limit, (u, limit) = (1, chunk_size) if causal else (chunk_size, 1); see
    ``lsh.in_window``."""
    is_causal = op.Cast(op.Constant(value_int=causal), to=BOOL.dtype)
    size = op.Constant(value_int=chunk_size)
    one = op.Constant(value_int=1)
    unit = op.Where(is_causal, one, size)
    gap = op.Sub(op.Div(q_rank, unit), op.Div(k_rank, unit))
    return op.And(
        op.GreaterOrEqual(gap, op.Constant(value_int=0)), op.LessOrEqual(gap, op.Where(is_causal, size, one))
    )


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerOtherRounds(buckets: INT64, rank: INT64, perm: INT64, like, causal: int, chunk_size: int):
    """In how many *other* rounds key j is in query i's bucket and :func:`ReformerWindow`, as ``like``'s
    type, (b, h, r, nc, c, 2c): a visible pair's N_ij (``lsh.duplicate_counts``) is one more.

    Bucket and window in one int32 per token and round, loc = bucket · spread + rank // u with spread
    wider than any window: key j matches query i iff 0 <= loc_i - loc_j <= limit. The other rounds
    are an axis before the chunks (as a batch axis, r · (r - 1)), never the innermost one: ONNX
    Runtime's element-wise kernels are ~15x slower when the innermost axis is as short as r - 1.
    """
    is_causal = op.Cast(op.Constant(value_int=causal), to=BOOL.dtype)
    size = op.Constant(value_int=chunk_size)
    one = op.Constant(value_int=1)
    limit = op.Where(is_causal, size, one)
    spread = op.Add(op.Add(op.Shape(buckets, start=3, end=4), limit), one)
    window = op.Div(rank, op.Where(is_causal, one, size))
    loc = op.Cast(op.Add(op.Mul(buckets, spread), window), to=INT32.dtype)
    rounds = op.Shape(buckets, start=2, end=3)
    count = op.Squeeze(rounds, [0])
    each = op.Unsqueeze(op.Range(op.Constant(value_int=0), count, one), [1])
    others = op.Mod(op.Add(each, op.Range(one, count, one)), count)  # (r, r - 1): the rounds other than r
    other_loc = op.Transpose(op.Gather(loc, others, axis=2), perm=[0, 1, 2, 4, 3])  # (b, h, r, n, r - 1)
    by_round = op.Transpose(ReformerRows(other_loc, perm), perm=[0, 1, 2, 4, 3])  # (b, h, r, r - 1, n)
    pairs = op.Mul(rounds, op.Sub(rounds, one))
    flat = op.Concat(op.Shape(buckets, end=2), pairs, op.Shape(buckets, start=3), axis=0)
    sorted_loc = ReformerChunk(op.Reshape(by_round, flat, allowzero=1), chunk_size=chunk_size)
    gap = op.Sub(op.Unsqueeze(sorted_loc, [5]), op.Unsqueeze(ReformerLookBack(sorted_loc), [4]))
    found = op.And(
        op.GreaterOrEqual(gap, op.CastLike(op.Constant(value_int=0), gap)),
        op.LessOrEqual(gap, op.CastLike(limit, gap)),
    )
    split = op.Concat(op.Shape(buckets, end=3), op.Sub(rounds, one), op.Shape(gap, start=3), axis=0)
    return op.ReduceSum(op.Reshape(op.CastLike(found, like), split, allowzero=1), [3], keepdims=0)


@onnxscript.script(LIBRARY, default_opset=op)
def ReformerLSH(
    qk: FLOAT, v: FLOAT, rotations: FLOAT, key_padding_mask: BOOL, causal: int, chunk_size: int
) -> FLOAT:
    """The steps of :func:`attnx.plugins.reformer.lsh.lsh_attention`, in standard ONNX ops."""
    size = op.Unsqueeze(op.Constant(value_int=chunk_size), [0])
    n = op.Shape(qk, start=2, end=3)
    n_pad = op.Mul(op.Div(op.Sub(op.Add(n, size), op.Constant(value_ints=[1])), size), size)
    extra = op.Sub(n_pad, n)
    padded = op.Concat(op.Constant(value_ints=[0, 0, 0, 0, 0, 0]), extra, op.Constant(value_ints=[0]), axis=0)
    qk = op.Pad(qk, padded)
    # [v, 1] in one Pad: the padding rows get ones instead of torch's zeros, which no output row < n sees
    # (padding rows are in a bucket of their own and only see themselves).
    v_pads = op.Add(padded, op.Constant(value_ints=[0, 0, 0, 0, 0, 0, 0, 1]))
    v = op.Pad(v, v_pads, op.CastLike(op.Constant(value_float=1.0), v))
    mask = op.Pad(
        op.Cast(key_padding_mask, to=INT64.dtype), op.Concat(op.Constant(value_ints=[0, 0, 0]), extra, axis=0)
    )
    real = op.Unsqueeze(op.Cast(mask, to=BOOL.dtype), [1, 2])
    n_buckets = op.Mul(op.Shape(rotations, start=3, end=4), op.Constant(value_ints=[2]))
    buckets = op.Where(real, ReformerHash(qk, rotations), n_buckets)

    wide = AttnxWiden(qk)  # the squared norm of |qk| > 256 overflows fp16
    perm, rank = ReformerSort(buckets, wide)
    norm = op.Sqrt(op.Add(op.ReduceSumSquare(wide, [-1], keepdims=0), op.CastLike(NORM_EPS, wide)))
    keys = op.CastLike(op.Div(wide, op.Unsqueeze(norm, [-1])), qk)
    q_sorted = ReformerChunk(ReformerRows(qk, perm), chunk_size=chunk_size)
    k_window = ReformerLookBack(ReformerChunk(ReformerRows(keys, perm), chunk_size=chunk_size))
    v_window = ReformerLookBack(ReformerChunk(ReformerRows(v, perm), chunk_size=chunk_size))

    # Visible: same bucket (padded queries, bucket n_buckets, match none; the missing chunk before the
    # first one has bucket -1), in the window and not the query itself. In the chunked layout query
    # slot s sits at key slot c + s, so the window and the self slot are one constant (c, 2c) pattern.
    q_bucket = ReformerChunk(op.GatherElements(buckets, perm, axis=-1), chunk_size=chunk_size)
    k_bucket = op.Unsqueeze(ReformerLookBackFilled(q_bucket), [4])
    q_bucket = op.Where(op.Less(q_bucket, n_buckets), q_bucket, op.Constant(value_int=-2))
    width = op.Constant(value_int=chunk_size)
    slots = op.Range(op.Constant(value_int=0), op.Add(width, width), op.Constant(value_int=1))
    query_slots = op.Unsqueeze(op.Slice(slots, size, [9223372036854775807]), [1])
    is_self = op.Equal(query_slots, slots)
    window = op.And(ReformerWindow(query_slots, slots, causal=causal, chunk_size=chunk_size), op.Not(is_self))
    visible = op.And(op.Equal(op.Unsqueeze(q_bucket, [5]), k_bucket), window)
    hidden = op.Where(is_self, op.CastLike(SELF_SCORE, qk), op.CastLike(NEG_INF, qk))

    others = ReformerOtherRounds(buckets, rank, perm, qk, causal=causal, chunk_size=chunk_size)
    log_counts = op.Log(op.Add(others, op.CastLike(op.Constant(value_float=1.0), others)))
    scores = op.MatMul(q_sorted, op.Transpose(k_window, perm=[0, 1, 2, 3, 5, 4]))
    scores = op.Where(visible, op.Sub(scores, log_counts), hidden)

    top = op.ReduceMax(scores, [-1], keepdims=1)
    out = ReformerMerge(top, op.MatMul(op.Exp(op.Sub(scores, top)), v_window), rank)
    return op.Slice(out, op.Constant(value_ints=[0]), n, op.Constant(value_ints=[2]))


@onnxscript.script(OPSET, default_opset=op)
def ReformerAttention(
    qk: FLOAT, v: FLOAT, rotations: FLOAT, key_padding_mask: BOOL, causal: int, chunk_size: int
) -> FLOAT:
    return ReformerLSH(qk, v, rotations, key_padding_mask, causal=causal, chunk_size=chunk_size)


@onnxscript.script(OPSET, default_opset=op)
def ReformerAttentionNoMask(qk: FLOAT, v: FLOAT, rotations: FLOAT, causal: int, chunk_size: int) -> FLOAT:
    batch_and_length = op.Concat(op.Shape(qk, end=1), op.Shape(qk, start=2, end=3), axis=0)
    everyone = op.ConstantOfShape(batch_and_length, value=onnxscript.ir.tensor([True]))
    return ReformerLSH(qk, v, rotations, everyone, causal=causal, chunk_size=chunk_size)


REFORMER_OP = AttentionOp(
    name="ReformerAttention",
    torch_op=reformer_attention,
    bodies=(ReformerAttention, ReformerAttentionNoMask),
    input_types={"key_padding_mask": "tensor(bool)"},
    doc="Reformer shared-QK LSH attention; qk, v (batch, heads, seq, dim), rotations (heads, dim, n_hashes, "
    "n_buckets/2); key_padding_mask (batch, seq) bool, True = real token.",
    kernel="attnx.plugins.reformer.triton_kernel:REFORMER_KERNEL",
)
