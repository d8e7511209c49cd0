"""Cost of one linear attention layer (no torch)."""

from __future__ import annotations

from attnx.cost import AttentionCost, Shape, kernel_attention_cost
from attnx.plugins.linear.config import LinearConfig


def linear_cost(s: Shape, config: LinearConfig) -> AttentionCost:
    """"Transformers are RNNs": phi = elu + 1 keeps d_h features per head."""
    return kernel_attention_cost(s, config.chunk_size, features=s.head_dim)
