"""Factories for ``attnx export --module tests/adapters/factories.py:NAME`` (each returns a module and
its example inputs, as a user's file would)."""

from __future__ import annotations

import torch
from torch import nn

from attnx.registry import get_registry
from attnx.variant import AttentionSpec


class AttnxLayers(nn.Module):
    """A user's own model built from an attnx layer: dict output with a nested tuple."""

    def __init__(self) -> None:
        super().__init__()
        variant = get_registry().variant("linear")
        self.embed = nn.Embedding(30, 16)
        self.attention = variant.load().build(variant.make_config({}), AttentionSpec(16, 2, causal=True))
        self.head = nn.Linear(16, 30)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        hidden = self.embed(input_ids)
        hidden = hidden + self.attention(hidden, key_padding_mask=attention_mask)
        return {"logits": self.head(hidden), "aux": (hidden, None), "unused": None}


def attnx_layers() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    ids = torch.randint(0, 30, (2, 9))
    return AttnxLayers().eval(), {"input_ids": ids, "attention_mask": torch.ones(2, 9, dtype=torch.bool)}


def training() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    module, example = attnx_layers()
    return module.train(), example


class DataDependent(AttnxLayers):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        if input_ids.sum() > 10:  # Python control flow on a tensor's value
            input_ids = input_ids - 1
        return super().forward(input_ids, attention_mask)


def untraceable() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return DataDependent().eval(), attnx_layers()[1]


def no_attnx() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return nn.TransformerEncoderLayer(16, 2, batch_first=True).eval(), (torch.randn(2, 5, 16),)


def not_a_pair() -> nn.Module:
    return attnx_layers()[0]
