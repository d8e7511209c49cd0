"""The ``lm`` model: a decoder-only causal language model with a tied output projection."""

from __future__ import annotations

import torch
from torch.nn import functional

from attnx.models.blocks import TokenEmbedding
from attnx.models.config import LMConfig
from attnx.models.spec import TensorSpec
from attnx.models.stack import AttentionFactory, SelfAttentionHook, Stack


class LanguageModel(Stack):
    """Embeddings, a causal :class:`Stack`, logits = hidden @ embedding^T (weights tied, paper §3.4)."""

    def __init__(self, config: LMConfig, attention: AttentionFactory) -> None:
        super().__init__(config, attention, config.n_layers, causal=True)
        self.config = config
        self.embedding = TokenEmbedding(config.vocab_size, config.d_model)

    def input_specs(self) -> list[TensorSpec]:
        return [
            TensorSpec("input_ids", "int64", ("batch", "seq"), high=self.config.vocab_size, doc="token ids")
        ]

    def output_specs(self) -> list[TensorSpec]:
        return [
            TensorSpec(
                "logits",
                "float32",
                ("batch", "seq", self.config.vocab_size),
                doc="next-token logits; position i sees tokens 0..i",
            )
        ]

    def forward(
        self,
        input_ids: torch.Tensor,
        offset: torch.Tensor | None = None,
        self_attention: SelfAttentionHook | None = None,
    ) -> tuple[torch.Tensor]:
        """``offset`` and ``self_attention`` serve stateful decoding (:mod:`attnx.decode`): positions
        start at ``offset`` and ``self_attention(i, module, x)`` replaces layer i's attention call."""
        hidden = super().forward(self.embedding(input_ids, offset), self_attention=self_attention)
        return (functional.linear(hidden, self.embedding.weight),)
