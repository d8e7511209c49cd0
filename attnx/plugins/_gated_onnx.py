"""Portable ONNX bodies of ``attnx::GatedDeltaRule(Step)``: the chunked form of
:mod:`attnx.plugins._gated_torch` in standard ops (ai.onnx opset 18), which ONNX Runtime runs as they are.

The layout is the torch code's: (b, hk, r, n_chunks, C, d), q and k with r = 1 (broadcast to the value
heads they serve). Everything inside a chunk is computed for all chunks at once; a ``Scan`` over the
chunk axis carries the state (a ``Scan`` rather than a ``Loop``: it slices its inputs and stacks its
outputs along the chunk axis itself, so the loop body is the two products of the recurrence and
nothing else). Choices in the graph:

* delta or additive rule: an ``If`` on the constant ``delta`` attribute (ONNX Runtime folds it); no op
  that fp16 converters wrap in Casts (CumSum, Min, Max) sits inside a branch or loop body.
* scalar or per-key decay (known only from g's shape when it runs): both score forms are in the graph
  and the one not chosen runs on zero chunks (a ``Slice`` along the chunk axis), as in the linear core.
* (I + A)^-1, A strictly lower triangular (C x C), is the product (I - A)(I + A^2)(I + A^4)...: with
  N = -A nilpotent (N^C = 0), sum_{i < 2^L} N^i = prod_{j < L} (I + N^(2^j)), exact once 2^L >= C, so
  ceil(log2 C) - 1 squarings and products in a ``Loop`` whose trip count comes from C (a decoded token,
  C = 1, runs none). Standard ops, batched over every chunk at once (no per-row substitution); it costs
  about 4 log2(C) C^3 per chunk, so the delta rule's chunks stay short (docs/variants/gated.md).

All arithmetic is dtype-generic (``AttnxWiden``, constants through ``CastLike``).
"""

from __future__ import annotations

import onnxscript
from onnxscript import BOOL, FLOAT, INT64, graph
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, OPSET, AttnxWiden

# ONNX Runtime runs a Scan only if its body's outputs have a shape: the inputs' rank (5: (b, hk, r, rows,
# cols)) lets it infer them.
STATE = FLOAT[None, None, None, None, None]
_NEG_INF = onnxscript.ir.tensor([float("-inf")], dtype=onnxscript.ir.DataType.FLOAT)


@onnxscript.script(LIBRARY, default_opset=op)
def GatedChunkLength(n: INT64, chunk_size: INT64, per_key: BOOL) -> tuple[INT64, INT64]:
    """(C, s): tokens per chunk and the per-key block length (1 for a scalar decay), int64 (1,), as
    ``attnx.plugins._gated_torch.chunk_length`` / ``block_size`` choose them."""
    one = op.Constant(value_ints=[1])
    powers = op.Constant(value_ints=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    fits = op.LessOrEqual(op.Mul(powers, powers), chunk_size)
    size = op.Where(per_key, op.ReduceMax(op.Where(fits, powers, one), keepdims=1), one)
    rounded = op.Mul(op.Div(op.Sub(op.Add(chunk_size, size), one), size), size)
    needed = op.Mul(op.Div(op.Sub(op.Add(op.Max(n, one), size), one), size), size)
    return op.Min(rounded, needed), size


@onnxscript.script(LIBRARY, default_opset=op)
def GatedGroup(x: FLOAT, heads: INT64) -> FLOAT:
    """(b, hv, n, d) -> (b, hk, r, n, d): value head j = i * r + t as (i, t)."""
    return op.Reshape(
        x,
        op.Concat(
            op.Shape(x, start=0, end=1), heads, op.Constant(value_ints=[-1]), op.Shape(x, start=2), axis=0
        ),
    )


@onnxscript.script(LIBRARY, default_opset=op)
def GatedChunks(x: FLOAT, pad: INT64, chunk: INT64) -> FLOAT:
    """(b, hk, r, n, d) -> (b, hk, r, n_chunks, C, d), zeros appended to the sequence (axis 3)."""
    padded = op.Pad(
        x,
        op.Concat(op.Constant(value_ints=[0, 0, 0, 0, 0, 0, 0, 0]), pad, op.Constant(value_ints=[0]), axis=0),
    )
    shape = op.Concat(
        op.Shape(x, start=0, end=3), op.Constant(value_ints=[-1]), chunk, op.Shape(x, start=4), axis=0
    )
    return op.Reshape(padded, shape)


@onnxscript.script(LIBRARY, default_opset=op)
def GatedTake(x: FLOAT, taken: BOOL) -> FLOAT:
    """x, or its empty prefix along the chunk axis (3) when not ``taken``."""
    end = op.Mul(op.Constant(value_ints=[9223372036854775807]), op.Cast(taken, to=INT64.dtype))
    return op.Slice(x, op.Constant(value_ints=[0]), end, op.Constant(value_ints=[3]))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedLowerMask(length: INT64, diagonal: int) -> BOOL:
    """(length, length) bool, True on and below the diagonal ``diagonal`` (0: inclusive, -1: strict)."""
    ones = op.Expand(op.Constant(value=onnxscript.ir.tensor([True])), op.Concat(length, length, axis=0))
    return op.Trilu(ones, op.Constant(value_int=diagonal), upper=0)


@onnxscript.script(LIBRARY, default_opset=op)
def GatedScalarScores(rows: FLOAT, keys: FLOAT, cumulated: FLOAT, diagonal: int) -> FLOAT:
    """rows_i . keys_j exp(G_i - G_j) for j <= i + ``diagonal``, else 0; G (..., C, 1): (..., C, C)."""
    decay = op.Squeeze(
        op.Slice(cumulated, op.Constant(value_ints=[0]), op.Constant(value_ints=[1]), [-1]), [-1]
    )
    difference = op.Sub(op.Unsqueeze(decay, [-1]), op.Unsqueeze(decay, [-2]))
    keep = GatedLowerMask(op.Shape(decay, start=-1), diagonal=diagonal)
    pairwise = op.Exp(op.Where(keep, difference, op.CastLike(op.Constant(value=_NEG_INF), difference)))
    return op.Mul(op.MatMul(rows, op.Transpose(keys, perm=[0, 1, 2, 3, 5, 4])), pairwise)


@onnxscript.script(LIBRARY, default_opset=op)
def GatedBlocks(x: FLOAT, size: INT64) -> FLOAT:
    """(..., n_chunks, C, d) -> (..., n_chunks, C / s, s, d) (no -1: the chunk axis may be empty)."""
    n_blocks = op.Div(op.Shape(x, start=4, end=5), size)
    return op.Reshape(x, op.Concat(op.Shape(x, start=0, end=4), n_blocks, size, op.Shape(x, start=5), axis=0))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedPerKeyScores(rows: FLOAT, keys: FLOAT, cumulated: FLOAT, size: INT64, diagonal: int) -> FLOAT:
    """:func:`GatedScalarScores` with G (..., C, dk) per key dimension, in blocks of s tokens
    (``attnx.plugins._gated_torch.per_key_scores``): (..., C, C)."""
    row_blocks = GatedBlocks(rows, size)
    key_blocks = GatedBlocks(keys, size)
    decay_blocks = GatedBlocks(cumulated, size)  # (b, hk, r, nc, m, s, dk)
    last = op.Sub(size, op.Constant(value_ints=[1]))
    ends = op.Gather(decay_blocks, op.Squeeze(last, [0]), axis=5)  # G at each block's end (..., m, dk)
    earlier_ends = op.Slice(ends, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]), [4])
    before = op.Pad(
        earlier_ends, op.Constant(value_ints=[0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])
    )  # G before each block
    scaled_rows = op.Mul(row_blocks, op.Exp(op.Sub(decay_blocks, op.Unsqueeze(before, [5]))))
    # exp(min(G_before(block) - G_j, 0)): pairs j in the block or after it are masked below
    gap = op.Neg(op.Relu(op.Sub(op.Unsqueeze(cumulated, [4]), op.Unsqueeze(before, [5]))))
    scaled_keys = op.Mul(op.Unsqueeze(keys, [4]), op.Exp(gap))  # (..., m, C, dk)
    earlier = op.MatMul(scaled_rows, op.Transpose(scaled_keys, perm=[0, 1, 2, 3, 4, 6, 5]))  # (..., m, s, C)
    length = op.Shape(cumulated, start=4, end=5)
    square = op.Concat(op.Shape(earlier, start=0, end=4), length, length, axis=0)
    n_blocks = op.Div(length, size)
    block_pairs = op.Concat(
        n_blocks, op.Constant(value_ints=[1]), n_blocks, op.Constant(value_ints=[1]), axis=0
    )
    spread = op.Concat(n_blocks, size, n_blocks, size, axis=0)
    block_lower = op.Reshape(
        op.Expand(op.Reshape(GatedLowerMask(n_blocks, diagonal=-1), block_pairs), spread),
        op.Concat(length, length, axis=0),
    )
    earlier = op.Mul(op.Reshape(earlier, square), op.CastLike(block_lower, earlier))
    keep = op.Unsqueeze(GatedLowerMask(size, diagonal=diagonal), [-1])
    difference = op.Sub(
        op.Unsqueeze(decay_blocks, [6]), op.Unsqueeze(decay_blocks, [5])
    )  # (..., m, s, s, dk)
    pairwise = op.Exp(op.Where(keep, difference, op.CastLike(op.Constant(value=_NEG_INF), difference)))
    products = op.Mul(op.Mul(op.Unsqueeze(row_blocks, [6]), op.Unsqueeze(key_blocks, [5])), pairwise)
    within = op.ReduceSum(products, op.Constant(value_ints=[-1]), keepdims=0)  # (..., m, s, s)
    eye = op.EyeLike(
        op.Expand(op.CastLike(op.Constant(value_float=0.0), within), op.Concat(n_blocks, n_blocks, axis=0))
    )
    diagonal_blocks = op.Mul(op.Unsqueeze(within, [6]), op.Reshape(eye, block_pairs))  # (..., m, s, m, s)
    return op.Add(earlier, op.Reshape(diagonal_blocks, square))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedScores(
    rows: FLOAT, keys: FLOAT, cumulated: FLOAT, size: INT64, per_key: BOOL, diagonal: int
) -> FLOAT:
    """The decayed scores (..., n_chunks, C, C) in the form g's width asks for; the other runs on no chunk."""
    scalar = op.Not(per_key)
    by_scalar = GatedScalarScores(
        GatedTake(rows, scalar), GatedTake(keys, scalar), GatedTake(cumulated, scalar), diagonal=diagonal
    )
    by_key = GatedPerKeyScores(
        GatedTake(rows, per_key),
        GatedTake(keys, per_key),
        GatedTake(cumulated, per_key),
        size,
        diagonal=diagonal,
    )
    return op.Concat(by_scalar, by_key, axis=3)


@onnxscript.script(LIBRARY, default_opset=op)
def GatedInverse(weights: FLOAT) -> FLOAT:
    """(I + A)^-1 for A strictly lower triangular (..., C, C): (I + N)(I + N^2)(I + N^4)..., N = -A."""
    nilpotent = op.Neg(weights)
    length = op.Shape(weights, start=-1)
    square = op.Expand(op.CastLike(op.Constant(value_float=0.0), weights), op.Concat(length, length, axis=0))
    inverse = op.Add(op.EyeLike(square), nilpotent)
    powers = op.Constant(value_ints=[2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    squarings = op.ReduceSum(op.Cast(op.Less(powers, length), to=INT64.dtype), keepdims=0)
    for _ in range(squarings):
        nilpotent = op.MatMul(nilpotent, nilpotent)
        inverse = op.Add(inverse, op.MatMul(inverse, nilpotent))
    return inverse


@onnxscript.script(LIBRARY, default_opset=op)
def GatedDeltaCarry(
    keys: FLOAT,
    values: FLOAT,
    rate: FLOAT,
    cumulated: FLOAT,
    to_end: FLOAT,
    chunk_decay: FLOAT,
    start: FLOAT,
    size: INT64,
    per_key: BOOL,
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """The delta rule: U = U_b - W S per chunk. Returns the states before each chunk
    (..., n_chunks, dk, dv), U (..., n_chunks, C, dv) and the last state."""
    weights = op.Mul(rate, GatedScores(keys, keys, cumulated, size, per_key, diagonal=-1))  # A
    inverse = GatedInverse(weights)
    updates = op.MatMul(inverse, op.Mul(rate, values))  # U_b
    retrieve = op.MatMul(inverse, op.Mul(op.Mul(rate, op.Exp(cumulated)), keys))  # W

    @graph()
    def step(state: STATE, update: STATE, retrieval: STATE, key: STATE, decay: STATE):
        solved = op.Sub(update, op.MatMul(retrieval, state))
        grown = op.Add(op.Mul(decay, state), op.MatMul(op.Transpose(key, perm=[0, 1, 2, 4, 3]), solved))
        return grown, op.Identity(state), solved

    final, states, solved = op.Scan(
        start,
        updates,
        retrieve,
        to_end,
        chunk_decay,
        body=step,
        num_scan_inputs=4,
        scan_input_axes=[3, 3, 3, 3],
        scan_output_axes=[3, 3],
    )
    return states, solved, final


@onnxscript.script(LIBRARY, default_opset=op)
def GatedAdditiveCarry(
    updates: FLOAT, to_end: FLOAT, chunk_decay: FLOAT, start: FLOAT
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """The additive rule: U = diag(beta) V, known before the loop, which adds each chunk's K~^T U."""
    increments = op.MatMul(op.Transpose(to_end, perm=[0, 1, 2, 3, 5, 4]), updates)

    @graph()
    def step(state: STATE, increment: STATE, decay: STATE):
        return op.Add(op.Mul(decay, state), increment), op.Identity(state)

    final, states = op.Scan(
        start,
        increments,
        chunk_decay,
        body=step,
        num_scan_inputs=2,
        scan_input_axes=[3, 3],
        scan_output_axes=[3],
    )
    return states, updates, final


@onnxscript.script(LIBRARY, default_opset=op)
def GatedCore(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    state: FLOAT,
    delta: int,
    scale: float,
    chunk_size: int,
) -> tuple[FLOAT, FLOAT]:
    """The recurrence after ``state`` (b, hk, r, dk, dv), all inputs widened: (out (b, hv, n, dv), state')."""
    heads = op.Shape(q, start=1, end=2)
    n = op.Shape(v, start=2, end=3)
    per_key = op.Greater(op.Shape(g, start=3), op.Constant(value_ints=[1]))
    chunk, size = GatedChunkLength(n, op.Reshape(op.Constant(value_int=chunk_size), [1]), per_key)
    pad = op.Sub(op.Mul(op.Div(op.Sub(op.Add(n, chunk), op.Constant(value_ints=[1])), chunk), chunk), n)
    queries = GatedChunks(op.Unsqueeze(q, [2]), pad, chunk)  # (b, hk, 1, nc, C, dk)
    keys = GatedChunks(op.Unsqueeze(k, [2]), pad, chunk)
    values = GatedChunks(GatedGroup(v, heads), pad, chunk)  # (b, hk, r, nc, C, dv)
    cumulated = op.CumSum(GatedChunks(GatedGroup(g, heads), pad, chunk), op.Constant(value_int=4))
    rate = GatedChunks(GatedGroup(op.Unsqueeze(beta, [-1]), heads), pad, chunk)
    inner = GatedScores(queries, keys, cumulated, size, per_key, diagonal=0)  # P
    last = op.Slice(
        cumulated, op.Constant(value_ints=[-1]), op.Constant(value_ints=[9223372036854775807]), [4]
    )
    to_end = op.Mul(keys, op.Exp(op.Sub(last, cumulated)))  # K~
    chunk_decay = op.Exp(op.Transpose(last, perm=[0, 1, 2, 3, 5, 4]))  # (..., nc, dg, 1)
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:
        states, updates, final = GatedDeltaCarry(
            keys, values, rate, cumulated, to_end, chunk_decay, state, size, per_key
        )
    else:
        states, updates, final = GatedAdditiveCarry(op.Mul(rate, values), to_end, chunk_decay, state)
    read = op.MatMul(op.Mul(queries, op.Exp(cumulated)), states)
    out = op.Mul(op.Add(read, op.MatMul(inner, updates)), op.CastLike(op.Constant(value_float=scale), read))
    flat = op.Concat(op.Shape(v, start=0, end=2), op.Constant(value_ints=[-1]), op.Shape(v, start=3), axis=0)
    out = op.Slice(op.Reshape(out, flat), op.Constant(value_ints=[0]), n, op.Constant(value_ints=[2]))
    return out, op.Reshape(final, op.Concat(op.Shape(v, start=0, end=2), op.Shape(final, start=3), axis=0))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedEmptyState(q: FLOAT, v: FLOAT) -> FLOAT:
    """Zeros (b, hk, r, dk, dv) in q's type."""
    shape = op.Concat(
        op.Shape(q, start=0, end=2),
        op.Constant(value_ints=[-1]),
        op.Shape(q, start=3),
        op.Shape(v, start=3),
        axis=0,
    )
    heads = op.Concat(op.Shape(v, start=0, end=2), op.Shape(q, start=3), op.Shape(v, start=3), axis=0)
    return op.Reshape(op.Expand(op.CastLike(op.Constant(value_float=0.0), q), heads), shape)


@onnxscript.script(OPSET, default_opset=op)
def GatedDeltaRule(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, delta: int, scale: float, chunk_size: int
) -> FLOAT:
    wide = AttnxWiden(q)
    out, _ = GatedCore(
        wide,
        AttnxWiden(k),
        AttnxWiden(v),
        AttnxWiden(g),
        AttnxWiden(beta),
        GatedEmptyState(wide, v),
        delta=delta,
        scale=scale,
        chunk_size=chunk_size,
    )
    return op.CastLike(out, v)


@onnxscript.script(OPSET, default_opset=op)
def GatedDeltaRuleStep(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    state: FLOAT,
    delta: int,
    scale: float,
    chunk_size: int,
) -> tuple[FLOAT, FLOAT]:
    wide = AttnxWiden(q)
    start = op.Reshape(
        op.CastLike(state, wide),
        op.Concat(
            op.Shape(q, start=0, end=2), op.Constant(value_ints=[-1]), op.Shape(state, start=2), axis=0
        ),
    )
    out, grown = GatedCore(
        wide,
        AttnxWiden(k),
        AttnxWiden(v),
        AttnxWiden(g),
        AttnxWiden(beta),
        start,
        delta=delta,
        scale=scale,
        chunk_size=chunk_size,
    )
    return op.CastLike(out, v), op.CastLike(grown, state)


@onnxscript.script(OPSET, default_opset=op)
def GatedDeltaRuleStepFirst(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, delta: int, scale: float, chunk_size: int
) -> tuple[FLOAT, FLOAT]:
    wide = AttnxWiden(q)
    out, grown = GatedCore(
        wide,
        AttnxWiden(k),
        AttnxWiden(v),
        AttnxWiden(g),
        AttnxWiden(beta),
        GatedEmptyState(wide, v),
        delta=delta,
        scale=scale,
        chunk_size=chunk_size,
    )
    return op.CastLike(out, v), grown
