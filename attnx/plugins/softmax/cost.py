"""Cost of one softmax attention layer (no torch)."""

from __future__ import annotations

from attnx.cost import AttentionCost, Shape, dense_attention_cost
from attnx.plugins.softmax.config import SoftmaxConfig


def softmax_cost(s: Shape, config: SoftmaxConfig) -> AttentionCost:
    """Scaled dot-product attention materialises every (B, H, N, M) score (see
    :func:`attnx.cost.dense_attention_cost`)."""
    return dense_attention_cost(s)
