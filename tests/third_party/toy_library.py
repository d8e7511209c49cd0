"""A stand-in for a third-party library: its own attention classes, parameter names and forward.

``ToyLinearAttention`` computes elu+1 linear attention ("Transformers are RNNs") with the
library's own projections; ``ToyKernelAttention`` stands for a layer whose kernel cannot be
traced (an extension op), so it must be converted and no adapter does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ToyLinearAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, eps: float = 1e-6, causal: bool = False) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model) for _ in range(4))
        self.heads, self.eps, self.causal = heads, eps, causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (w(x).view(b, n, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = F.elu(q) + 1, F.elu(k) + 1
        scores = q @ k.transpose(-1, -2)  # the naive quadratic form of the paper's equation
        if self.causal:
            scores = scores.tril()
        out = scores @ v / (scores.sum(-1, keepdim=True) + self.eps)
        return self.wo(out.transpose(1, 2).reshape(b, n, -1))


class ToyKernelAttention(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ToyModel(nn.Module):
    """Embedding (+ learned positions, offset by ``past_length``) -> the library's layers -> head."""

    def __init__(self, unsupported: bool = False, causal: bool = False) -> None:
        super().__init__()
        self.embed, self.positions = nn.Embedding(40, 16), nn.Embedding(64, 16)
        self.blocks = nn.ModuleList([ToyLinearAttention(16, 2, causal=causal) for _ in range(2)])
        self.extra = ToyKernelAttention() if unsupported else nn.Identity()
        self.head = nn.Linear(16, 40)

    def forward(self, input_ids: torch.Tensor, past_length: torch.Tensor | None = None) -> torch.Tensor:
        start = 0 if past_length is None else past_length
        x = self.embed(input_ids) + self.positions(torch.arange(input_ids.shape[1]) + start)
        for block in self.blocks:
            x = x + block(x)
        return self.head(self.extra(x))
