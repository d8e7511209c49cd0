"""Cost of one cosFormer attention layer (no torch)."""

from __future__ import annotations

from attnx.cost import AttentionCost, Shape, kernel_attention_cost
from attnx.plugins.cosformer.config import CosformerConfig


def cosformer_cost(s: Shape, config: CosformerConfig) -> AttentionCost:
    """cosFormer: the sin/cos re-weighting doubles the features to 2·d_h per head."""
    return kernel_attention_cost(s, config.chunk_size, features=2 * s.head_dim)
