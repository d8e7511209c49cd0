"""The ``encoder`` model: embeddings, a bidirectional stack, optional mean-pooled classifier."""

from __future__ import annotations

import torch
from torch import nn

from attnx.models.blocks import TokenEmbedding
from attnx.models.config import EncoderConfig
from attnx.models.spec import TensorSpec
from attnx.models.stack import AttentionFactory, Stack


class Encoder(Stack):
    """A bidirectional :class:`Stack` with token embeddings in front and an optional classifier."""

    def __init__(self, config: EncoderConfig, attention: AttentionFactory) -> None:
        super().__init__(config, attention, config.n_layers)
        self.config = config
        self.embedding = TokenEmbedding(config.vocab_size, config.d_model)
        self.classifier = nn.Linear(config.d_model, config.num_classes) if config.num_classes else None

    def input_specs(self) -> list[TensorSpec]:
        specs = [
            TensorSpec("input_ids", "int64", ("batch", "seq"), high=self.config.vocab_size, doc="token ids")
        ]
        if self.config.attention_mask:
            specs.append(TensorSpec("attention_mask", "bool", ("batch", "seq"), doc="True for real tokens"))
        return specs

    def output_specs(self) -> list[TensorSpec]:
        specs = [TensorSpec("hidden_states", "float32", ("batch", "seq", self.config.d_model))]
        if self.classifier is not None:
            specs.append(
                TensorSpec("logits", "float32", ("batch", self.config.num_classes), doc="mean-pooled")
            )
        return specs

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        hidden = super().forward(self.embedding(input_ids), key_padding_mask=attention_mask)
        if self.classifier is None:
            return (hidden,)
        if attention_mask is None:
            pooled = hidden.mean(dim=1)
        else:
            weights = attention_mask.to(hidden.dtype)[..., None]
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        return hidden, self.classifier(pooled)
