"""The base of the attnx layers that take HF's 2D padding mask themselves (Gated DeltaNet, Mamba2's SSD,
Mamba1's scan, LFM2's short convolutions, RecurrentGemma's recurrent blocks, RWKV's time and channel
mixes), and the masking they share."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnx.adapters.hf_hybrid.model import adopt
from attnx.attention import Stepping


def mask_padding(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(batch, n, ...) ``x`` with padded tokens (2D ``mask`` False or 0) zeroed, in ``x``'s dtype: HF's
    ``apply_mask_to_padding_states``, which the linear, Mamba2 and short-conv layers apply to their input
    (and flash-linear-attention's layers to their inputs, keys, values and gates)."""
    return x if mask is None else (x * mask[(..., *(None,) * (x.dim() - 2))]).to(x.dtype)


def leading_padding(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The 2D padding ``mask`` (batch, n) as bool with only the padding before each row's first real token
    False: the layers whose HF forward takes no mask (``Architecture.leaky_padding``) mask that padding
    (a left-padded row then equals the row alone) and run the padding after the real tokens, which reaches
    none of them, unmasked as HF does (so a right-padded batch equals HF's forward at every position)."""
    return None if mask is None else mask.long().cumsum(-1) > 0


class PaddedMixer(Stepping, nn.Module):
    """What the layers that take HF's 2D padding mask share (Gated DeltaNet, Mamba2's SSD, Mamba1's scan,
    LFM2's short convolutions): HF's parameters under their names, HF's call, and the step with the padding
    mask.

    A :class:`attnx.state.DecodableLayer`: ``step(x, state, position, mask)`` continues its state (a conv
    carry, and a recurrent state through ``attnx::GatedDeltaRuleStep`` where the layer has one); while
    ``stepping`` holds a Step, HF's call of the layer is that step (with the padding mask: a prefill from
    the empty state masks as the forward does). Subclasses implement ``decode_state`` and :meth:`mix`.
    """

    def __init__(self, layer: nn.Module):
        super().__init__()
        adopt(self, layer)  # Falcon-H1's mup_vector buffer too
        self.layer_idx = getattr(layer, "layer_idx", None)  # none in RecurrentGemma, xLSTM and RWKV

    def forward(
        self,
        hidden_states: torch.Tensor,
        cache: Any = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """HF's call: the whole sequence, or (while ``stepping`` holds a Step) new tokens after its state."""
        if cache is not None:
            raise ValueError(
                f"an attnx {type(self).__name__} layer keeps its state through attnx decoding, not HF's cache"
            )
        if self.stepping is not None:
            return self.stepped(hidden_states, mask=attention_mask)
        return self.mix(hidden_states, attention_mask, None)[0]

    def step(
        self,
        x: torch.Tensor,
        state: tuple[torch.Tensor, ...] | None,
        position: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The output for new tokens ``x`` (``mask``: their 2D padding mask) after ``state`` (the tensors of
        ``decode_state``; None: nothing before) and the state after them (no dependence on ``position``)."""
        return self.mix(x, mask, state or (None,) * len(self.decode_state()))

    def mix(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        state: tuple[torch.Tensor | None, ...] | None,
    ) -> tuple[torch.Tensor, Any]:
        """The layer on (batch, n, width) ``x``: with ``state`` None the whole sequence, else a step after
        ``state`` (its tensors None: empty), returning the state after ``x`` too."""
        raise NotImplementedError
