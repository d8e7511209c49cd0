"""The ``encoder`` model: embeddings, N pre-LN blocks, final norm, optional classifier."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attnx.models import EncoderConfig
from attnx.models.blocks import PreLNBlock, TokenEmbedding
from attnx.models.spec import TensorSpec
from attnx.variant import AttentionSpec


class Encoder(nn.Module):
    def __init__(self, config: EncoderConfig, attention: Callable[..., nn.Module]) -> None:
        super().__init__()
        self.config = config
        spec = AttentionSpec(config.d_model, config.n_heads)
        self.embedding = TokenEmbedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            PreLNBlock(attention(spec, "self"), config.d_model, config.d_ff) for _ in range(config.n_layers)
        )
        self.norm = nn.LayerNorm(config.d_model)
        self.classifier = nn.Linear(config.d_model, config.num_classes) if config.num_classes else None

    def input_specs(self) -> list[TensorSpec]:
        specs = [TensorSpec("input_ids", "int64", ("batch", "seq"), high=self.config.vocab_size, doc="token ids")]
        if self.config.attention_mask:
            specs.append(TensorSpec("attention_mask", "bool", ("batch", "seq"), doc="True for real tokens"))
        return specs

    def output_specs(self) -> list[TensorSpec]:
        specs = [TensorSpec("hidden_states", "float32", ("batch", "seq", self.config.d_model))]
        if self.classifier is not None:
            specs.append(TensorSpec("logits", "float32", ("batch", self.config.num_classes), doc="mean-pooled"))
        return specs

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        x = self.embedding(input_ids)
        for block in self.blocks:
            x = block(x, key_padding_mask=attention_mask)
        hidden = self.norm(x)
        if self.classifier is None:
            return (hidden,)
        if attention_mask is None:
            pooled = hidden.mean(dim=1)
        else:
            weights = attention_mask.to(hidden.dtype)[..., None]
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        return hidden, self.classifier(pooled)


def build(config: EncoderConfig, attention: Callable[..., nn.Module]) -> Encoder:
    return Encoder(config, attention)
