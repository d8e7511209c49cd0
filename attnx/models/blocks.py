"""Layers shared by every architecture: positions, feed-forward, pre-LN block."""

from __future__ import annotations

import math

import torch
from torch import nn


class SinusoidalPositions(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) ("Attention Is All You Need").

    Computed from the positions at run time, so any sequence length exports.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.to(torch.float32)[..., None] * self.inv_freq
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


class TokenEmbedding(nn.Module):
    """Embedding scaled by sqrt(d_model), plus sinusoidal positions counted from ``offset``."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.positions = SinusoidalPositions(d_model)
        self.scale = math.sqrt(d_model)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
        return self.embed(input_ids) * self.scale + self.positions(positions)


class FeedForward(nn.Module):
    """Position-wise FFN: Linear -> ReLU -> Linear."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class PreLNBlock(nn.Module):
    """x + Attn(LN(x)), then + FFN(LN(x))."""

    def __init__(self, attention: nn.Module, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(d_model)
        self.attention = attention
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x), key_padding_mask=key_padding_mask)
        return x + self.ffn(self.ffn_norm(x))
