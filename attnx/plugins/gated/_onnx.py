"""Portable ONNX bodies of ``attnx::GatedDeltaRule(Step)``: the chunked form of
:mod:`attnx.plugins.gated._chunks` in standard ops (ai.onnx opset 18), which ONNX Runtime runs as they are,
and the token-by-token form of :mod:`attnx.plugins.gated._tokens` (:func:`GatedTokens`) that the additive
rule on narrow values takes instead (an ``If`` in :func:`GatedCore`).

The layout is the torch code's: (b, hk, r, n_chunks, C, d), q and k with r = 1 (broadcast to the value
heads they serve). Everything inside a chunk is computed for all chunks at once; a ``Scan`` over the
chunk axis carries the state (a ``Scan`` rather than a ``Loop``: it slices its inputs and stacks its
outputs along the chunk axis itself, so the loop body is the two products of the recurrence and
nothing else). Choices in the graph:

* one token (a decode step): an ``If`` on the length runs the recurrence's own step
  (:func:`GatedOneToken`, three products on the state) instead of the chunk machinery for C = 1.
* delta or additive rule: an ``If`` on the constant ``delta`` attribute (ONNX Runtime folds it).
* scalar or per-key decay, known from g's width only when the graph runs: an ``If`` on it; a scalar
  decay pays nothing per key dimension. The scores of P and A share their decays.
* no op that fp16 converters wrap in Casts (CumSum, Min, Max, Range) sits inside a branch or loop body
  (ONNX Runtime's converter misplaces those Casts there): ``Clip`` clamps, the cumulated decay is
  computed before any branch.
* (I + A)^-1, A strictly lower triangular (C x C), by doubling diagonal blocks: the inverse X of the
  blocks of s rows (s = 1: I) becomes that of the blocks of 2s rows as X - X A_s X (A_s: A's entries
  joining each block's two halves), ceil(log2 C) levels in a ``Loop`` whose trip count comes from C (a
  decoded token, C = 1, runs none). Standard ops on the full (C, C) matrices, batched over every chunk at
  once (no per-row substitution); every intermediate is a block of the inverse itself, so nothing grows
  (the product form (I - A)(I + A^2)(I + A^4)... has powers of A with entries up to binom(C, C/2) when
  the keys of a chunk align, as in trained models, and lost 0.25 absolute at C = 32 in float32). It costs
  about 4 log2(C) C^3 per chunk, so the delta rule's chunks stay short (docs/variants/gated.md).

All arithmetic is dtype-generic (``AttnxWiden``, constants through ``CastLike``).
"""

from __future__ import annotations

import onnxscript
from onnxscript import BOOL, FLOAT, INT64, graph
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, OPSET, AttnxWiden
from attnx.plugins.gated.config import TOKEN_MAX_VALUE_WIDTH

# ONNX Runtime runs a Scan only if its body's outputs have a shape: the inputs' rank (5: (b, hk, r, rows,
# cols)) lets it infer them.
STATE = FLOAT[None, None, None, None, None]
ROWS = FLOAT[None, None, None, None]  # the token-by-token state, (b, hk, r * dv, dk), and its step's inputs
_NEG_INF = onnxscript.ir.tensor([float("-inf")], dtype=onnxscript.ir.DataType.FLOAT)


@onnxscript.script(LIBRARY, default_opset=op)
def GatedChunkLength(n: INT64, chunk_size: INT64, per_key: BOOL) -> tuple[INT64, INT64]:
    """(C, s): tokens per chunk and the per-key block length (1 for a scalar decay), int64 (1,), as
    ``attnx.plugins.gated.config.chunk_plan`` chooses them."""
    one = op.Constant(value_ints=[1])
    length = op.Min(chunk_size, op.Max(n, one))
    powers = op.Constant(value_ints=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    fits = op.LessOrEqual(op.Mul(powers, powers), length)
    size = op.Where(per_key, op.ReduceMax(op.Where(fits, powers, one), keepdims=1), one)
    return op.Mul(op.Div(op.Sub(op.Add(length, size), one), size), size), size


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
def GatedCumulated(g: FLOAT, heads: INT64, pad: INT64, chunk: INT64) -> FLOAT:
    """(b, hv, n, dg) log-decays -> their sums within each chunk, (b, hk, r, n_chunks, C, dg), zeros
    appended to the sequence: the grouping and the chunking in one ``Reshape``. Written apart from
    :func:`GatedGroup` and :func:`GatedChunks`, which the ``If`` branches of :func:`GatedCore` call: ONNX
    Runtime names a function's inlined values by the function alone, so one function inlined both
    outside and inside a branch gives a saved optimized model that ONNX Runtime refuses to load (a name
    defined twice across scopes)."""
    padded = op.Pad(
        g, op.Concat(op.Constant(value_ints=[0, 0, 0, 0, 0, 0]), pad, op.Constant(value_ints=[0]), axis=0)
    )
    shape = op.Concat(
        op.Shape(g, start=0, end=1),
        heads,
        op.Div(op.Shape(g, start=1, end=2), heads),
        op.Constant(value_ints=[-1]),
        chunk,
        op.Shape(g, start=3),
        axis=0,
    )
    return op.CumSum(op.Reshape(padded, shape), op.Constant(value_int=4))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedLowerMask(length: INT64, diagonal: int) -> BOOL:
    """(length, length) bool, True on and below the diagonal ``diagonal`` (0: inclusive, -1: strict)."""
    ones = op.Expand(op.Constant(value=onnxscript.ir.tensor([True])), op.Concat(length, length, axis=0))
    return op.Trilu(ones, op.Constant(value_int=diagonal), upper=0)


@onnxscript.script(LIBRARY, default_opset=op)
def GatedStrict(scores: FLOAT) -> FLOAT:
    """scores (..., L, L) with 0 on and above the diagonal."""
    keep = GatedLowerMask(op.Shape(scores, start=-1), diagonal=-1)
    return op.Where(keep, scores, op.CastLike(op.Constant(value_float=0.0), scores))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedScalarScores(queries: FLOAT, keys: FLOAT, cumulated: FLOAT, delta: int) -> tuple[FLOAT, FLOAT]:
    """q_i . k_j exp(G_i - G_j) and k_i . k_j exp(G_i - G_j) (the latter for the delta rule only) for j <= i,
    0 above, G (..., C, 1) one value per token: (..., C, C) each; one decay matrix serves both."""
    decay = op.Squeeze(cumulated, [-1])
    difference = op.Sub(op.Unsqueeze(decay, [-1]), op.Unsqueeze(decay, [-2]))
    keep = GatedLowerMask(op.Shape(decay, start=-1), diagonal=0)
    pairwise = op.Exp(op.Where(keep, difference, op.CastLike(op.Constant(value=_NEG_INF), difference)))
    keys_t = op.Transpose(keys, perm=[0, 1, 2, 3, 5, 4])
    inner = op.Mul(op.MatMul(queries, keys_t), pairwise)
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:  # noqa: SIM108 (onnxscript makes an If of an if statement only)
        among_keys = op.Mul(op.MatMul(keys, keys_t), pairwise)
    else:
        among_keys = op.Identity(inner)
    return inner, among_keys


@onnxscript.script(LIBRARY, default_opset=op)
def GatedBlocks(x: FLOAT, size: INT64) -> FLOAT:
    """(..., n_chunks, C, d) -> (..., n_chunks, C / s, s, d)."""
    n_blocks = op.Div(op.Shape(x, start=4, end=5), size)
    return op.Reshape(x, op.Concat(op.Shape(x, start=0, end=4), n_blocks, size, op.Shape(x, start=5), axis=0))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedPerKeyTerms(keys: FLOAT, cumulated: FLOAT, size: INT64) -> tuple[FLOAT, FLOAT, FLOAT]:
    """The decays of ``attnx.plugins.gated._chunks.per_key_scores`` for G (..., C, dk), in blocks of s tokens:
    exp(G_i - G_b) (..., m, s, dk) for the rows (G_b: before i's block), the keys times exp(G_b - G_j) for
    every block (..., m, C, dk), and the keys times exp(G_i - G_j) in each block (..., m, s, s, dk); every
    exponent <= 0, pairs in no order clamped to exp(0) (their scores are masked)."""
    decay_blocks = GatedBlocks(cumulated, size)  # (b, hk, r, nc, m, s, dk)
    last = op.Squeeze(op.Sub(size, op.Constant(value_ints=[1])), [0])
    ends = op.Gather(decay_blocks, last, axis=5)  # G at each block's end (..., m, dk)
    earlier_ends = op.Slice(ends, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]), [4])
    before = op.Unsqueeze(
        op.Pad(earlier_ends, op.Constant(value_ints=[0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])), [5]
    )
    row_decay = op.Exp(op.Sub(decay_blocks, before))
    zero = op.CastLike(op.Constant(value_float=0.0), cumulated)
    gap = op.Clip(op.Sub(before, op.Unsqueeze(cumulated, [4])), None, zero)  # min(G_b - G_j, 0)
    scaled_keys = op.Mul(op.Unsqueeze(keys, [4]), op.Exp(gap))
    # [i, j] = min(G_i - G_j, 0) inside each block
    pair_gap = op.Clip(op.Sub(op.Unsqueeze(decay_blocks, [6]), op.Unsqueeze(decay_blocks, [5])), None, zero)
    paired_keys = op.Mul(op.Unsqueeze(GatedBlocks(keys, size), [5]), op.Exp(pair_gap))
    return row_decay, scaled_keys, paired_keys


@onnxscript.script(LIBRARY, default_opset=op)
def GatedPerKeyRows(
    rows: FLOAT, row_decay: FLOAT, scaled_keys: FLOAT, paired_keys: FLOAT, size: INT64
) -> FLOAT:
    """rows_i . (exp(G_i - G_j) * k_j) for j <= i, 0 above, from :func:`GatedPerKeyTerms`: (..., C, C)."""
    row_blocks = GatedBlocks(rows, size)
    earlier = op.MatMul(
        op.Mul(row_blocks, row_decay), op.Transpose(scaled_keys, perm=[0, 1, 2, 3, 4, 6, 5])
    )  # (..., m, s, C): keys of earlier blocks
    length = op.Shape(scaled_keys, start=5, end=6)
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
    products = op.Mul(op.Unsqueeze(row_blocks, [6]), paired_keys)
    within = op.ReduceSum(products, op.Constant(value_ints=[-1]), keepdims=0)  # (..., m, s, s)
    within = op.Where(
        GatedLowerMask(size, diagonal=0), within, op.CastLike(op.Constant(value_float=0.0), within)
    )
    zeros = op.Expand(
        op.CastLike(op.Constant(value_float=0.0), within), op.Concat(n_blocks, n_blocks, axis=0)
    )
    diagonal_blocks = op.Mul(op.Unsqueeze(within, [6]), op.Reshape(op.EyeLike(zeros), block_pairs))
    return op.Add(earlier, op.Reshape(diagonal_blocks, square))  # diagonal_blocks: (..., m, s, m, s)


@onnxscript.script(LIBRARY, default_opset=op)
def GatedPerKeyScores(
    queries: FLOAT, keys: FLOAT, cumulated: FLOAT, size: INT64, delta: int
) -> tuple[FLOAT, FLOAT]:
    """:func:`GatedScalarScores` for G (..., C, dk) per key dimension; both share the decays."""
    row_decay, scaled_keys, paired_keys = GatedPerKeyTerms(keys, cumulated, size)
    inner = GatedPerKeyRows(queries, row_decay, scaled_keys, paired_keys, size)
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:
        among_keys = GatedPerKeyRows(keys, row_decay, scaled_keys, paired_keys, size)
    else:
        among_keys = op.Identity(inner)
    return inner, among_keys


@onnxscript.script(LIBRARY, default_opset=op)
def GatedInverse(weights: FLOAT) -> FLOAT:
    """(I + A)^-1 for A strictly lower triangular (..., C, C), by doubling diagonal blocks: X, the inverse of
    the blocks of s rows, becomes the inverse of the blocks of 2s rows as X - X A_s X, A_s = A on the rows of
    each block's second half and the columns of its first."""
    length = op.Shape(weights, start=-1)
    square = op.Expand(op.CastLike(op.Constant(value_float=0.0), weights), op.Concat(length, length, axis=0))
    inverse = op.Expand(op.EyeLike(square), op.Shape(weights))
    index = op.Range(op.Constant(value_int=0), op.Squeeze(length, [0]), op.Constant(value_int=1))
    rows = op.Unsqueeze(index, [1])
    columns = op.Unsqueeze(index, [0])
    powers = op.Constant(value_ints=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    levels = op.ReduceSum(op.Cast(op.Less(powers, length), to=INT64.dtype), keepdims=0)
    two = op.Constant(value_int=2)
    # the inverse is the loop's one carried value: onnxscript orders several by their names' hash
    for level in range(levels):
        size = op.Gather(powers, level)
        pair = op.Mul(size, two)
        same_pair = op.Equal(op.Div(rows, pair), op.Div(columns, pair))
        across = op.And(same_pair, op.Not(op.Equal(op.Div(rows, size), op.Div(columns, size))))
        joining = op.Mul(weights, op.CastLike(across, weights))
        inverse = op.Sub(inverse, op.MatMul(op.MatMul(inverse, joining), inverse))
    return inverse


@onnxscript.script(LIBRARY, default_opset=op)
def GatedChunksFirst(x: FLOAT) -> FLOAT:
    """(b, hk, r, n_chunks, ...) -> (n_chunks, b, hk, r, ...): ONNX Runtime's Scan slices its inputs and
    stacks its outputs along axis 0 at half the cost of another axis (measured)."""
    return op.Transpose(x, perm=[3, 0, 1, 2, 4, 5])


@onnxscript.script(LIBRARY, default_opset=op)
def GatedChunksBack(x: FLOAT) -> FLOAT:
    return op.Transpose(x, perm=[1, 2, 3, 0, 4, 5])


@onnxscript.script(LIBRARY, default_opset=op)
def GatedDeltaCarry(
    among_keys: FLOAT,
    keys: FLOAT,
    values: FLOAT,
    rate: FLOAT,
    cumulated: FLOAT,
    to_end: FLOAT,
    chunk_decay: FLOAT,
    start: FLOAT,
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """The delta rule: U = U_b - W S per chunk, A = diag(beta) ``among_keys`` below the diagonal. Returns the
    states before each chunk (..., n_chunks, dk, dv), U (..., n_chunks, C, dv) and the last state."""
    inverse = GatedInverse(op.Mul(rate, GatedStrict(among_keys)))
    updates = op.MatMul(inverse, op.Mul(rate, values))  # U_b
    retrieve = op.MatMul(inverse, op.Mul(op.Mul(rate, op.Exp(cumulated)), keys))  # W

    @graph()
    def step(state: STATE, update: STATE, retrieval: STATE, key: STATE, decay: STATE):
        solved = op.Sub(update, op.MatMul(retrieval, state))
        grown = op.Add(op.Mul(decay, state), op.MatMul(op.Transpose(key, perm=[0, 1, 2, 4, 3]), solved))
        return grown, op.Identity(state), solved

    final, states, solved = op.Scan(
        start,
        GatedChunksFirst(updates),
        GatedChunksFirst(retrieve),
        GatedChunksFirst(to_end),
        GatedChunksFirst(chunk_decay),
        body=step,
        num_scan_inputs=4,
    )
    return GatedChunksBack(states), GatedChunksBack(solved), final


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
        start, GatedChunksFirst(increments), GatedChunksFirst(chunk_decay), body=step, num_scan_inputs=2
    )
    return GatedChunksBack(states), updates, final


@onnxscript.script(LIBRARY, default_opset=op)
def GatedChunked(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    cumulated: FLOAT,
    beta: FLOAT,
    state: FLOAT,
    per_key: BOOL,
    chunk: INT64,
    size: INT64,
    pad: INT64,
    delta: int,
    scale: float,
) -> tuple[FLOAT, FLOAT]:
    """The chunked form after ``state`` (b, hk, r, dk, dv), g cumulated in its chunks (``cumulated``,
    (b, hk, r, nc, C, dg); ``per_key``: dg > 1): (out (b, hv, n, dv), state' (b, hv, dk, dv))."""
    heads = op.Shape(q, start=1, end=2)
    n = op.Shape(v, start=2, end=3)
    queries = GatedChunks(op.Unsqueeze(q, [2]), pad, chunk)  # (b, hk, 1, nc, C, dk)
    keys = GatedChunks(op.Unsqueeze(k, [2]), pad, chunk)
    values = GatedChunks(GatedGroup(v, heads), pad, chunk)  # (b, hk, r, nc, C, dv)
    rate = GatedChunks(GatedGroup(op.Unsqueeze(beta, [-1]), heads), pad, chunk)
    if per_key:  # P, and the keys' scores for A
        inner, among_keys = GatedPerKeyScores(queries, keys, cumulated, size, delta=delta)
    else:
        inner, among_keys = GatedScalarScores(queries, keys, cumulated, delta=delta)
    last = op.Slice(
        cumulated, op.Constant(value_ints=[-1]), op.Constant(value_ints=[9223372036854775807]), [4]
    )
    to_end = op.Mul(keys, op.Exp(op.Sub(last, cumulated)))  # K~
    chunk_decay = op.Exp(op.Transpose(last, perm=[0, 1, 2, 3, 5, 4]))  # (..., nc, dg, 1)
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:
        states, updates, final = GatedDeltaCarry(
            among_keys, keys, values, rate, cumulated, to_end, chunk_decay, state
        )
    else:
        states, updates, final = GatedAdditiveCarry(op.Mul(rate, values), to_end, chunk_decay, state)
    read = op.MatMul(op.Mul(queries, op.Exp(cumulated)), states)
    out = op.Mul(op.Add(read, op.MatMul(inner, updates)), op.CastLike(op.Constant(value_float=scale), read))
    flat = op.Concat(op.Shape(v, start=0, end=2), op.Constant(value_ints=[-1]), op.Shape(v, start=3), axis=0)
    out = op.Slice(op.Reshape(out, flat), op.Constant(value_ints=[0]), n, op.Constant(value_ints=[2]))
    return out, op.Reshape(final, op.Concat(op.Shape(v, start=0, end=2), op.Shape(final, start=3), axis=0))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedTokens(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, state: FLOAT, scale: float
) -> tuple[FLOAT, FLOAT]:
    """The additive rule token by token (``attnx.plugins.gated._tokens``) after ``state`` (b, hk, r, dk,
    dv): a ``Scan`` over the tokens whose step is the state's multiply-add and the read of the output.
    Inside, the state is V-major with the value heads of a q/k head as rows, (b, hk, r * dv, dk), so that
    the added outer product and the read are one product each (a GEMV per token over every value head of
    the q/k head; elementwise products broadcast over the heads took 8x as long). Returns (out (b, hv, n,
    dv), state' (b, hv, dk, dv))."""
    heads = op.Shape(q, start=1, end=2)
    queries = op.Transpose(op.Unsqueeze(q, [4]), perm=[2, 0, 1, 3, 4])  # (n, b, hk, dk, 1)
    keys = op.Transpose(op.Unsqueeze(k, [3]), perm=[2, 0, 1, 3, 4])  # (n, b, hk, 1, dk)
    grouped = op.Mul(GatedGroup(v, heads), GatedGroup(op.Unsqueeze(beta, [-1]), heads))  # (b, hk, r, n, dv)
    values = op.Transpose(grouped, perm=[3, 0, 1, 2, 4])  # (n, b, hk, r, dv)
    rows = op.Concat(op.Shape(values, start=0, end=3), op.Constant(value_ints=[-1, 1]), axis=0)
    values = op.Reshape(values, rows)  # (n, b, hk, r * dv, 1)
    decays = op.Transpose(op.Unsqueeze(GatedGroup(g, heads), [4]), perm=[3, 0, 1, 2, 4, 5])  # (n, .., 1, dg)
    per_head = op.Concat(
        op.Shape(grouped, start=0, end=3), op.Shape(v, start=3), op.Shape(q, start=3), axis=0
    )
    per_row = op.Concat(
        op.Shape(q, start=0, end=2), op.Constant(value_ints=[-1]), op.Shape(q, start=3), axis=0
    )

    @graph()
    def step(state: ROWS, decay: STATE, key: ROWS, query: ROWS, value: ROWS):
        decayed = op.Reshape(op.Mul(op.Exp(decay), op.Reshape(state, per_head)), per_row)
        grown = op.Add(decayed, op.MatMul(value, key))
        return grown, op.MatMul(grown, query)

    start = op.Reshape(op.Transpose(state, perm=[0, 1, 2, 4, 3]), per_row)
    final, outs = op.Scan(start, decays, keys, queries, values, body=step, num_scan_inputs=4)
    token_major = op.Concat(
        op.Shape(outs, start=0, end=1), op.Shape(v, start=0, end=2), op.Shape(v, start=3), axis=0
    )
    out = op.Transpose(op.Reshape(outs, token_major), perm=[1, 2, 0, 3])  # outs: (n, b, hk, r * dv, 1)
    out = op.Mul(out, op.CastLike(op.Constant(value_float=scale), out))
    final = op.Transpose(op.Reshape(final, per_head), perm=[0, 1, 2, 4, 3])  # (b, hk, r, dk, dv)
    return out, op.Reshape(final, op.Concat(op.Shape(v, start=0, end=2), op.Shape(final, start=3), axis=0))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedOneToken(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, state: FLOAT, delta: int, scale: float
) -> tuple[FLOAT, FLOAT]:
    """One token after ``state`` (b, hk, r, dk, dv): the recurrence's own step (module docstring of
    :mod:`attnx.plugins.gated._chunks`), three products and no chunk machinery, what a decode step runs.
    Returns (out (b, hv, 1, dv), state' (b, hv, dk, dv))."""
    heads = op.Shape(q, start=1, end=2)
    key = op.Unsqueeze(k, [2])  # (b, hk, 1, 1, dk)
    decay = op.Exp(op.Transpose(GatedGroup(g, heads), perm=[0, 1, 2, 4, 3]))  # (b, hk, r, 1 | dk, 1)
    decayed = op.Mul(decay, state)
    rate = GatedGroup(op.Unsqueeze(beta, [-1]), heads)  # (b, hk, r, 1, 1)
    values = GatedGroup(v, heads)  # (b, hk, r, 1, dv)
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:  # noqa: SIM108 (u = beta (v - (D S)^T k); onnxscript makes an If of an if statement only)
        update = op.Mul(rate, op.Sub(values, op.MatMul(key, decayed)))
    else:
        update = op.Mul(rate, values)
    grown = op.Add(decayed, op.MatMul(op.Transpose(key, perm=[0, 1, 2, 4, 3]), update))
    out = op.MatMul(op.Unsqueeze(q, [2]), grown)  # (b, hk, r, 1, dv)
    out = op.Mul(out, op.CastLike(op.Constant(value_float=scale), out))
    flat = op.Concat(op.Shape(v, start=0, end=2), op.Constant(value_ints=[-1]), op.Shape(v, start=3), axis=0)
    return op.Reshape(out, flat), op.Reshape(
        grown, op.Concat(op.Shape(v, start=0, end=2), op.Shape(grown, start=3), axis=0)
    )


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
    """The recurrence after ``state`` (b, hk, r, dk, dv), all inputs widened: (out (b, hv, n, dv), state'),
    one token in one step, else token by token or in chunks as ``attnx.plugins.gated.config.by_token``
    says. The chunked form's CumSum stays out of the ``If`` (module docstring): it runs on one token when
    the rule goes by token (none would leave Reshape's -1 undefined)."""
    heads = op.Shape(q, start=1, end=2)
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    narrow = op.LessOrEqual(op.Shape(v, start=3), op.Constant(value_ints=[TOKEN_MAX_VALUE_WIDTH]))
    by_token = op.Squeeze(op.And(op.Not(use_delta), narrow), [0])
    n = op.Where(by_token, op.Constant(value_ints=[1]), op.Shape(v, start=2, end=3))  # the chunked form's
    wide_decay = op.Greater(op.Shape(g, start=3), op.Constant(value_ints=[1]))
    chunk, size = GatedChunkLength(n, op.Reshape(op.Constant(value_int=chunk_size), [1]), wide_decay)
    pad = op.Sub(op.Mul(op.Div(op.Sub(op.Add(n, chunk), op.Constant(value_ints=[1])), chunk), chunk), n)
    chunked_g = op.Slice(g, op.Constant(value_ints=[0]), n, op.Constant(value_ints=[2]))
    cumulated = GatedCumulated(chunked_g, heads, pad, chunk)
    one_token = op.Squeeze(op.Equal(op.Shape(v, start=2, end=3), op.Constant(value_ints=[1])), [0])
    if one_token:
        out, final = GatedOneToken(q, k, v, g, beta, state, delta=delta, scale=scale)
    elif by_token:
        out, final = GatedTokens(q, k, v, g, beta, state, scale=scale)
    else:
        per_key = op.Squeeze(wide_decay, [0])
        out, final = GatedChunked(
            q, k, v, cumulated, beta, state, per_key, chunk, size, pad, delta=delta, scale=scale
        )
    return out, final


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
