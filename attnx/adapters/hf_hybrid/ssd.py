"""Mamba2 mixers of Hugging Face models (state-space duality, SSD) on attnx's gated rule.

What HF computes (``Mamba2Mixer.forward``, ``BambaMixer``, ``GraniteMoeHybridMambaLayer``,
``NemotronHMamba2Mixer``: one torch path, transformers 5.24), for hidden states x (batch, n, width):

1. x times the 2D padding mask; ``in_proj`` gives the output gate z (``intermediate_size``), the
   conv channels [x, B, C] (``intermediate_size + 2 n_groups d_state``) and dt (one per head);
2. a causal depthwise conv (kernel ``conv_kernel``, with bias) and the activation over [x, B, C],
   times the padding mask again (the conv's bias makes a padded token's channels non-zero);
3. dt = clamp(softplus(dt + dt_bias), *time_step_limit), A = -exp(A_log) per head; per head h,
   S_t = exp(dt_t A_h) S_{t-1} + B_t (dt_t x_t)^T and y_t = S_t^T C_t + D_h x_t, with B and C
   shared by the heads of a group (each group serves heads / n_groups consecutive heads), in float32;
4. HF's gated RMSNorm (norm(y silu(z)) per group of ``intermediate_size / n_groups`` channels) and
   ``out_proj``.

Falcon-H1's ``FalconH1Mixer`` is this with µP multipliers (x times ``ssm_in_multiplier`` before
``in_proj``, its output times the buffer ``mup_vector``), a gated norm that may normalise before the
gate (its own module decides) and, with ``mamba_rms_norm`` false, no norm: y silu(z).

Step 3 is ``attnx::GatedDeltaRule`` with ``delta=False``: q = C, k = B (d_k = d_state), v = dt x
(d_v = head_dim), g = dt A per head, beta = 1, scale 1; the D skip is added outside. A padded token
is then a no-op on the state at the start (left padding): its x, B, C are zeros, so only its decay
touches the zero state.

HF's single-token step (``mamba2_selective_state_update``) does not clamp dt to ``time_step_limit``
while its forward (``mamba2_chunk_scan``) does; attnx clamps in both, so its decode continues its
forward. The two differ only where softplus(dt + dt_bias) leaves the limit (Nemotron-H's lower limit
``time_step_min``; the others' default (0, inf) never binds).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnx.adapters.hf_hybrid.mixer import PaddedMixer, mask_padding
from attnx.plugins.gated.op import rule_state, ssd_rule
from attnx.shortconv import carried_conv
from attnx.state import StateTensor, conv_state


class StateSpaceDuality(PaddedMixer):
    """An HF Mamba2 mixer (same parameters, same names) computed by ``attnx::GatedDeltaRule``."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.heads, self.head_dim, self.groups = layer.num_heads, layer.head_dim, layer.n_groups
        self.state_size, self.inner = layer.ssm_state_size, layer.intermediate_size
        self.conv_dim, self.act = layer.conv_dim, layer.act
        self.time_step_limit = tuple(layer.time_step_limit)
        # Falcon-H1's multipliers and optional norm (1, no vector and a norm for the others)
        self.in_multiplier = getattr(layer, "ssm_in_multiplier", 1.0)
        self.normed = getattr(layer, "mamba_rms_norm", True)

    def decode_state(self) -> list[StateTensor]:
        """The conv carry over [x, B, C] and the rule's state (d_state x head_dim) per head."""
        carry = conv_state(self.conv_dim, self.conv1d.weight.shape[-1])
        return rule_state(self.heads, self.state_size, self.head_dim, carry)

    def mix(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        state: tuple[torch.Tensor | None, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor, Any]:
        """``PaddedMixer.mix`` of the SSD (module docstring)."""
        batch, n, _ = x.shape
        projected = self.in_proj(mask_padding(x, mask) * self.in_multiplier)
        if hasattr(self, "mup_vector"):
            projected = projected * self.mup_vector
        gate, channels, dt = projected.split([self.inner, self.conv_dim, self.heads], -1)
        past_conv, past = (None, None) if state is None else state
        mixed, carry = carried_conv(channels, self.conv1d.weight, self.conv1d.bias, past_conv)
        mixed = mask_padding(self.act(mixed).to(x.dtype), mask)
        width = self.groups * self.state_size
        xs, b, c = torch.split(mixed, [self.inner, width, width], dim=-1)
        xs = xs.reshape(batch, n, self.heads, self.head_dim).float()
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*self.time_step_limit)  # (b, n, h)
        b, c = (t.reshape(batch, n, self.groups, self.state_size) for t in (b, c))
        step = state is not None
        y, recurrent = ssd_rule(xs, b, c, dt, self.A_log, self.D[:, None], past, step)
        y = y.reshape(batch, n, -1)
        y = self.norm(y, gate) if self.normed else y * F.silu(gate)
        return self.out_proj(y.to(x.dtype)), (carry, recurrent) if step else None
