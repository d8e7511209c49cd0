"""Mamba1 mixers of Hugging Face models (the selective scan) on attnx's gated rule.

What HF computes (``MambaMixer.forward``, ``FalconMambaMixer``, ``JambaMambaMixer``, transformers 5.24),
for hidden states x (batch, n, width):

1. x times the 2D padding mask; ``in_proj`` gives the channels u and the gate z (``intermediate_size``
   each);
2. a causal depthwise conv (kernel ``conv_kernel``, with bias) and the activation over u, times the
   padding mask again;
3. ``x_proj``(u) splits into dt (``time_step_rank``), B and C (``state_size`` each); Falcon-Mamba and
   Jamba pass the three through RMSNorms (``dt_layernorm``, ``b_layernorm``, ``c_layernorm``: weightless
   in Falcon-Mamba, learnt in Jamba); dt = softplus(``dt_proj``(dt)) per channel (its bias inside);
4. A = -exp(A_log) per channel *and* state dimension; per channel c, S_t = exp(dt_{t,c} A_c) * S_{t-1} +
   dt_{t,c} u_{t,c} B_t (a vector of ``state_size``), y_{t,c} = S_t . C_t + D_c u_{t,c}, in float32;
5. y silu(z), ``out_proj``.

Step 4 is ``attnx::GatedDeltaRule`` with ``delta=False`` and a decay per key dimension: one value head
of width 1 per channel (v = dt u), the key dimension the state (k = B, q = C, one q/k head shared by
every channel, the op's grouped layout), g = dt A (batch, channels, n, state), beta = 1, scale 1; the D
skip and the gate are outside. With values of width 1 the op runs token by token (its chunked form's
score blocks would be C times the scan's work; :func:`attnx.plugins.gated.config.by_token`). A padded
token is a no-op on the state at the start (left padding): its u is zero (the second mask), so only its
decay touches the zero state.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnx.adapters.hf_hybrid.mixer import PaddedMixer, mask_padding
from attnx.plugins.gated.op import rule_state, run_rule
from attnx.shortconv import carried_conv
from attnx.state import StateTensor, conv_state


class SelectiveScan(PaddedMixer):
    """An HF Mamba1 mixer (same parameters, same names) computed by ``attnx::GatedDeltaRule``: a conv carry
    over the channels and the rule's state (state_size x 1) per channel."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.inner, self.state_size = layer.intermediate_size, layer.ssm_state_size
        self.rank, self.act = layer.time_step_rank, layer.act
        self.normed = hasattr(layer, "dt_layernorm")  # Falcon-Mamba, Jamba

    def decode_state(self) -> list[StateTensor]:
        """The conv carry over the channels and the rule's state (state_size x 1) per channel."""
        carry = conv_state(self.inner, self.conv1d.weight.shape[-1])
        return rule_state(self.inner, self.state_size, 1, carry)

    def mix(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        state: tuple[torch.Tensor | None, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor, Any]:
        """``PaddedMixer.mix`` of the selective scan (module docstring)."""
        batch, n, _ = x.shape
        channels, gate = self.in_proj(mask_padding(x, mask)).chunk(2, dim=-1)
        past_conv, past = (None, None) if state is None else state
        u, carry = carried_conv(channels, self.conv1d.weight, self.conv1d.bias, past_conv)
        u = mask_padding(self.act(u).to(x.dtype), mask)
        dt, b, c = torch.split(self.x_proj(u), [self.rank, self.state_size, self.state_size], dim=-1)
        if self.normed:
            dt, b, c = self.dt_layernorm(dt), self.b_layernorm(b), self.c_layernorm(c)
        dt = F.softplus(self.dt_proj(dt).float())  # (b, n, channels), dt_proj's bias inside as HF adds it
        g = dt.transpose(1, 2)[..., None] * -self.A_log.float().exp()[None, :, None, :]
        q, k = (t.float()[:, None] for t in (c, b))  # one q/k head for every channel
        v = (u.float() * dt).transpose(1, 2)[..., None]
        beta = torch.ones(batch, self.inner, n, dtype=torch.float32, device=x.device)
        step = state is not None
        out, recurrent = run_rule(q, k, v, g, beta, past, delta=False, scale=1.0, step=step)
        y = (out[..., 0].transpose(1, 2) + u.float() * self.D.float()) * F.silu(gate.float())
        return self.out_proj(y.to(x.dtype)), (carry, recurrent) if step else None
