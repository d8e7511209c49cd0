"""A layer as a sequence of residual branches, run with plain or reversible (RevNet) residuals.

A Transformer layer is k residual branches f_1..f_k (self-attention, [cross-attention],
FFN), each reading a pre-LN view of its input.

* plain (pre-LN): x <- x + f_i(x) for i = 1..k.
* reversible (Reformer §4, after RevNet): two streams (x1, x2); each branch is one
  step (a, b) -> (b, a + f_i(b)). For k = 2 this is the paper's
  y1 = x1 + Attention(x2), y2 = x2 + FFN(y1); for the decoder (k = 3) it is trax's
  ``EncoderDecoderBlock``: self-attention, cross-attention and FFN half-residuals, each
  followed by a swap. Every step inverts exactly: (p, q) -> (q - f_i(p), p), so a
  layer's inputs are recomputable from its outputs (the memory saving in training).

Models start the streams as two copies of the embedding (trax ``Dup``) and end with
their mean (trax ``XYAvg``, as in trax's Reformer encoder-decoder; trax's ReformerLM
concatenates instead, which would double the width of ``hidden_states`` and untie the
output projection).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

Branch = Callable[[torch.Tensor], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class ResidualBlock:
    """One layer's residual branches (closures over its norms, attention modules and masks)."""

    branches: Sequence[Branch]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Plain pre-LN residuals."""
        for branch in self.branches:
            x = x + branch(x)
        return x

    def reversible(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x1, x2) -> (y1, y2): each branch steps (a, b) -> (b, a + f(b))."""
        for branch in self.branches:
            x1, x2 = x2, x1 + branch(x2)
        return x1, x2

    def inverse(self, y1: torch.Tensor, y2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs of :meth:`reversible` from its outputs: steps (p, q) -> (q - f(p), p) in reverse."""
        for branch in reversed(self.branches):
            y1, y2 = y2 - branch(y1), y1
        return y1, y2
