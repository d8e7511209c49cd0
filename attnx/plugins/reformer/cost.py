"""Cost of one Reformer LSH attention layer (no torch)."""

from __future__ import annotations

import math

from attnx.cost import FLOAT_BYTES, AttentionCost, Shape, projections
from attnx.plugins.reformer.config import ReformerConfig


def reformer_cost(s: Shape, config: ReformerConfig) -> AttentionCost:
    """Shared-QK, V and output projections (self-attention only). The sequence is padded to
    P = C·ceil(N/C) with C = ``chunk_size``; the rotations x R, R (d_h, n_hashes·n_buckets/2)
    per head, are one product 2·B·H·P·d_h·n_hashes·n_buckets/2; per hash round each sorted
    query scores the 2·C keys of its own and the previous chunk, 2·B·H·P·2C·d_h, and mixes
    their values with a ones column for the denominator, 2·B·H·P·2C·(d_h + 1); causal or not
    (the causal window lies inside the same chunks). Memory per round: every (B, H, P, 2C)
    score-shaped tensor (scores, masked and hidden scores, weights, the int64 duplicate
    counts, boolean masks: 10 float-equivalents) and 7 sorted or look-back copies of qk,
    keys and v."""
    hashes, buckets, chunk = config.n_hashes, config.n_buckets, config.chunk_size
    padded = s.batch * chunk * math.ceil(s.seq / chunk)
    h, dh = s.n_heads, s.head_dim
    rotations = 2 * padded * h * dh * hashes * (buckets // 2)
    chunked = 2 * padded * h * 2 * chunk * (2 * dh + 1)
    per_round = padded * (10 * h * 2 * chunk + 7 * s.d_model)
    return AttentionCost(projections(s, 3), rotations + hashes * chunked, FLOAT_BYTES * hashes * per_round)
