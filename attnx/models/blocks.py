"""Layers shared by every architecture: positions, token embedding, (chunked) feed-forward."""

from __future__ import annotations

import math

import torch
from torch import nn


class SinusoidalPositions(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) ("Attention Is All You Need").

    Computed from the positions at run time, so any sequence length exports. The angles
    are float32 whatever the model's dtype (an fp16 frequency would misplace position
    4096 by radians); the encoding is returned in ``dtype``. An odd width d ends with the
    sine of its last pair: the formula gives every column 0..d-1 (ceil(d/2) frequencies).
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model

    def forward(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        exponents = torch.arange(0, self.d_model, 2, dtype=torch.float32, device=positions.device)
        inv_freq = torch.exp(exponents * (-math.log(10000.0) / self.d_model))
        angles = positions.to(torch.float32)[..., None] * inv_freq
        encoding = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
        return encoding[..., : self.d_model].to(dtype)


class TokenEmbedding(nn.Module):
    """Embedding scaled by sqrt(d_model), plus sinusoidal positions offset, offset + 1, ... (§3.4, §3.5).

    Weights start as N(0, 1/d_model), as in tensor2tensor and fairseq, so the scaled
    embedding has unit variance like the positions; ``weight`` is also the tied output
    projection of the language models (logits = h W^T).
    """

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)
        self.positions = SinusoidalPositions(d_model)
        self.scale = math.sqrt(d_model)

    @property
    def weight(self) -> torch.Tensor:
        return self.embed.weight

    def forward(self, input_ids: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
        """``offset`` (int64, shape (1,)): position of the first token (tokens already processed)."""
        positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
        if offset is not None:
            positions = positions + offset
        return self.embed(input_ids) * self.scale + self.positions(positions, self.weight.dtype)


class FeedForward(nn.Module):
    """Position-wise FFN, Linear -> ReLU -> Linear, optionally applied to ``chunks`` slices in turn.

    Chunking (Reformer §3, "chunking") bounds the (batch, n, d_ff) intermediate to one
    slice. The slices are the sequence padded to ``chunks * ceil(n / chunks)`` positions
    (by repeating the last position, whose extra outputs are dropped) and reshaped to
    (chunks, length): a fixed number of slices of a symbolic length, which exports
    with a dynamic sequence axis (``torch.chunk`` or slicing at symbolic offsets would
    make torch.export specialise n). Each slice is a separate FFN call in the graph.
    """

    def __init__(self, d_model: int, d_ff: int, chunks: int = 1) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)
        self.chunks = chunks

    def position_wise(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.chunks == 1:
            return self.position_wise(x)
        n = x.shape[-2]
        length = (n + self.chunks - 1) // self.chunks
        padded = x.index_select(-2, torch.arange(self.chunks * length, device=x.device).clamp(max=n - 1))
        slices = padded.unflatten(-2, (self.chunks, length)).unbind(-3)
        out = torch.cat([self.position_wise(piece) for piece in slices], dim=-2)
        return out.index_select(-2, torch.arange(n, device=x.device))
