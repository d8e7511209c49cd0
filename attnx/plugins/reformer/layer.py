"""The ``reformer`` variant's layer and its :class:`attnx.ops.VariantImpl`."""

from __future__ import annotations

import torch
from torch import nn

from attnx.attention import merge_heads, split_heads
from attnx.errors import AttnxError
from attnx.ops import VariantImpl
from attnx.plugins.reformer.config import ReformerConfig
from attnx.plugins.reformer.kernel import REFORMER_OP, reformer_attention
from attnx.plugins.reformer.trax_ops import LOCAL_OP, TRAX_OP, reformer_trax_attention
from attnx.variant import AttentionSpec


class ReformerAttentionLayer(nn.Module):
    """Shared-QK projections around :data:`REFORMER_OP` (``layout="paper"``) or
    :data:`TRAX_OP` (``layout="trax"``); no key projection: keys are normalised queries.

    ``rotations`` (heads, d_head, n_hashes, n_buckets/2) is drawn from torch's RNG at
    build time (attnx seeds it), is saved in the state dict and becomes an ONNX initializer.
    """

    def __init__(self, config: ReformerConfig, spec: AttentionSpec) -> None:
        super().__init__()
        self.spec = spec
        self.config = config
        self.causal = spec.causal
        self.chunk_size = config.chunk_size
        d = spec.d_model
        self.qk_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        shape = (spec.n_heads, spec.head_dim, config.n_hashes, config.n_buckets // 2)
        self.register_buffer("rotations", torch.randn(shape), persistent=True)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if context is not None:
            raise AttnxError(
                "variant 'reformer' is self-attention only (shared QK); it cannot take a context"
            )
        heads = self.spec.n_heads
        qk = split_heads(self.qk_proj(x), heads)
        v = split_heads(self.v_proj(x), heads)
        config = self.config
        if config.layout == "trax":
            out = reformer_trax_attention(
                qk, v, self.rotations, key_padding_mask, self.causal, self.chunk_size,
                config.chunks_before, config.chunks_after,
            )  # fmt: skip
        else:
            out = reformer_attention(qk, v, self.rotations, key_padding_mask, self.causal, self.chunk_size)
        return self.out_proj(merge_heads(out))


# The trax op is called with layout="trax", the local op only by the hf_reformer adapter.
IMPL = VariantImpl(
    build=ReformerAttentionLayer,
    ops=(REFORMER_OP, TRAX_OP, LOCAL_OP),
    conditional_ops=(TRAX_OP.name, LOCAL_OP.name),
)
