"""Shared torch building blocks for attention variants: projections, head reshapes, the default step.

A variant subclasses :class:`MultiHeadAttention` and implements :meth:`attend`,
which calls the variant's ``attnx::`` custom op on per-head tensors. A variant that decodes adds
``decode_state()`` and ``attend_step(q, k, v, state, position)``; :meth:`MultiHeadAttention.step`
(the :class:`attnx.state.DecodableLayer` step) puts the projections around it. A layer whose step
needs more than q, k, v (gates from ``x``, a convolution carry, an output gate) overrides ``step``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attnx.variant import AttentionSpec

if TYPE_CHECKING:
    from attnx.state import Step

# Score bias of padded keys: the most negative fp16 value, so the same constant is
# exact in fp16 and fp32 and a query whose keys are all padded stays finite.
MASKED_SCORE = -65504.0


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(batch, seq, heads*dim) -> (batch, heads, seq, dim)."""
    return x.unflatten(-1, (n_heads, -1)).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, dim) -> (batch, seq, heads*dim)."""
    return x.transpose(1, 2).flatten(2)


class Stepping:
    """Drives a decodable layer through the forward of the module around it (``attnx.export_module``):
    while ``stepping`` holds an :class:`attnx.state.Step`, the layer's forward returns :meth:`stepped`,
    its own ``step`` on the input it was given, and records the state after it."""

    stepping: Step | None = None

    def stepped(self, x: torch.Tensor, **context: Any) -> torch.Tensor:
        """``step(x, **context)`` after ``stepping.past`` at ``stepping.position``, the state after it
        kept in ``stepping.present`` (``context``: what else the layer's step takes, e.g. a padding mask)."""
        step = self.stepping
        assert step is not None, "stepped() is called only while stepping"
        y, step.present = self.step(x, step.past, step.position, **context)  # type: ignore[attr-defined]
        return y


class MultiHeadAttention(Stepping, nn.Module):
    """Query/key/value/output projections around a variant's attention kernel.

    ``forward(x, context=None, key_padding_mask=None)``: ``x`` (batch, n, d_model)
    gives queries; keys and values come from ``context`` (cross attention) or ``x``.
    ``key_padding_mask`` is bool (batch, n_keys), True where the key is a real token.
    While ``stepping`` is set (a module export decoding, :class:`Stepping`) it is :meth:`step`.
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
        if self.stepping is not None:
            return self.stepped(x)
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

    def step(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None, position: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The default decode step: the projections of new tokens ``x`` around the variant's
        ``attend_step(q, k, v, state, position) -> (out, state)`` on per-head tensors."""
        heads = self.spec.n_heads
        q, k, v = (split_heads(project(x), heads) for project in (self.q_proj, self.k_proj, self.v_proj))
        out, state = self.attend_step(q, k, v, state, position)  # type: ignore[attr-defined]
        return self.out_proj(merge_heads(out)), state
