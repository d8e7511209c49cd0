"""Shared torch building blocks for attention variants: projections and head reshapes.

A variant subclasses :class:`MultiHeadAttention` and implements :meth:`attend`,
which calls the variant's ``attnx::`` custom op on per-head tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from attnx.variant import AttentionSpec

# Score bias of padded keys: the most negative fp16 value, so the same constant is
# exact in fp16 and fp32 and a query whose keys are all padded stays finite.
MASKED_SCORE = -65504.0


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(batch, seq, heads*dim) -> (batch, heads, seq, dim)."""
    return x.unflatten(-1, (n_heads, -1)).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, dim) -> (batch, seq, heads*dim)."""
    return x.transpose(1, 2).flatten(2)


class MultiHeadAttention(nn.Module):
    """Query/key/value/output projections around a variant's attention kernel.

    ``forward(x, context=None, key_padding_mask=None)``: ``x`` (batch, n, d_model)
    gives queries; keys and values come from ``context`` (cross attention) or ``x``.
    ``key_padding_mask`` is bool (batch, n_keys), True where the key is a real token.
    """

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        source = x if context is None else context
        heads = self.spec.n_heads
        q = split_heads(self.q_proj(x), heads)
        k = split_heads(self.k_proj(source), heads)
        v = split_heads(self.v_proj(source), heads)
        return self.out_proj(merge_heads(self.attend(q, k, v, key_padding_mask)))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Per-head attention: (b, h, n, d) tensors in, (b, h, n, d_v) out."""
        raise NotImplementedError
