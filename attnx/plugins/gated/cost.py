"""The cost of one gated linear-attention layer (``retention``, ``gated_delta``; no torch).

FLOPs follow :mod:`attnx.cost`'s convention (the matrix products the torch code runs, at their shapes,
padding included), counted as :mod:`attnx.plugins.gated.layer` and the chunked op
(:mod:`attnx.plugins.gated._chunks`) run them, with b the batch, P the length padded to whole chunks of C
tokens, hk/hv the q-k/value heads of d_k/d_v:

* projections: q, k, v (one product), the output, the output gate, the decay and beta projections (a
  rank-r bottleneck is two products), and the short depthwise convolution, 2 b N K channels;
* in-chunk scores: 2 b H P C d_k for the queries' (and the delta rule's keys'), H = hk with a scalar decay
  (q and k are not repeated to the value heads) and hv with a per-key decay (the keys are scaled per value
  head); the mix of the in-chunk updates, 2 b hv P C d_v;
* the state: the queries against each chunk's state and each chunk's K~^T U, 2 b hv P d_k d_v each, and
  for the delta rule W S as well (the triangular solve has no FLOP formula in torch's counter: uncounted).
* token by token (the additive rule on narrow values, :func:`attnx.plugins.gated.config.by_token`): no
  matrix product (its 2 b hv N d_k d_v multiply-adds, the state's update and read, are elementwise, which
  the convention does not count).

Memory: an upper bound in float32 of the tensors the forward may hold at once (the projections, the
chunked form's (C, C) scores per chunk and head, the per-key decay's block tensors, the stacked states;
token by token, the decays and the outputs).
"""

from __future__ import annotations

import math

from attnx.cost import FLOAT_BYTES, AttentionCost, Shape
from attnx.plugins.gated.config import GatedConfig, by_token, chunk_plan


def _projection(tokens: int, d_in: int, d_out: int, rank: int) -> int:
    return 2 * tokens * (d_in * rank + rank * d_out if rank else d_in * d_out)


def gated_cost(s: Shape, config: GatedConfig) -> AttentionCost:
    """FLOPs and a memory bound of one layer on ``s`` (causal self-attention)."""
    key_heads = config.key_heads or s.n_heads
    value_heads = config.value_heads or key_heads
    key_dim, value_dim = config.key_head_dim or s.head_dim, config.value_head_dim or s.head_dim
    keys, values = key_heads * key_dim, value_heads * value_dim
    channels, tokens, d = 2 * keys + values, s.tokens, s.d_model
    per_key = config.per_key
    decay_width = value_heads * (key_dim if per_key else 1)

    projection = _projection(tokens, d, channels, 0) + _projection(tokens, values, d, 0)
    if config.output_gate != "none":
        projection += _projection(tokens, d, values, config.gate_rank)
    if config.decay in ("head", "key"):
        projection += _projection(tokens, d, decay_width, config.decay_rank)
    if config.delta:
        projection += _projection(tokens, d, value_heads, 0)
    if config.short_conv:
        projection += 2 * tokens * config.conv_kernel * channels

    live = tokens * (3 * channels + 3 * values + 2 * decay_width + d)
    b = s.batch
    if by_token(config.delta, value_dim):
        outputs = b * value_heads * s.seq * value_dim
        return AttentionCost(
            projection, 0, FLOAT_BYTES * (live + outputs + b * value_heads * key_dim * value_dim)
        )
    chunk, size = chunk_plan(s.seq, config.chunk, per_key)
    n_chunks = math.ceil(max(s.seq, 1) / chunk)
    padded = n_chunks * chunk
    rows = 2 if config.delta else 1
    score_heads = value_heads if per_key else key_heads
    maths = rows * 2 * b * score_heads * padded * chunk * key_dim
    maths += 2 * b * value_heads * padded * chunk * value_dim
    maths += (3 if config.delta else 2) * 2 * b * value_heads * padded * key_dim * value_dim

    chunked = b * value_heads * padded * ((rows + 3) * chunk + 4 * key_dim + 3 * value_dim)
    if per_key:
        chunked += b * value_heads * padded * (2 * size + chunk // size) * key_dim
    states = 2 * b * value_heads * n_chunks * key_dim * value_dim
    return AttentionCost(projection, maths, FLOAT_BYTES * (live + chunked + states))
