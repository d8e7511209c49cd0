"""Cost of one Fastformer attention layer (no torch)."""

from __future__ import annotations

from attnx.cost import FLOAT_BYTES, AttentionCost, Shape, projections
from attnx.plugins.fastformer.config import FastformerConfig


def fastformer_cost(s: Shape, config: FastformerConfig) -> AttentionCost:
    """Q, K (and V unless ``share_qv``) projections and the output transform; each of the
    two additive poolings scores every token with a per-head vector, w·x_i, 2·T·d (its
    softmax-weighted sum and the products q ⊙ k_i, k ⊙ v_i are element-wise).
    Bidirectional self-attention only. Memory: Q, K, V, p, u and the output."""
    count = 3 if config.share_qv else 4
    working = FLOAT_BYTES * 6 * s.tokens * s.d_model
    return AttentionCost(projections(s, count), 2 * 2 * s.tokens * s.d_model, working)
