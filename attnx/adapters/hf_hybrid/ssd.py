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

from attnx.adapters.hf_hybrid.model import mask_padding
from attnx.attention import Stepping
from attnx.plugins.gated.op import rule_state, run_rule
from attnx.shortconv import carried_conv
from attnx.state import StateTensor, conv_state


class StateSpaceDuality(Stepping, nn.Module):
    """An HF Mamba2 mixer (same parameters, same names) computed by ``attnx::GatedDeltaRule``.

    A :class:`attnx.state.DecodableLayer`: ``step(x, state, position, mask)`` continues its conv carry and
    its recurrent state (``attnx::GatedDeltaRuleStep``); while ``stepping`` holds a Step, HF's call of the
    layer is that step (with the padding mask: a prefill from the empty state masks as the forward does).
    """

    def __init__(self, layer: nn.Module):
        super().__init__()
        for name, child in layer.named_children():
            self.add_module(name, child)
        for name, parameter in layer.named_parameters(recurse=False):
            self.register_parameter(name, parameter)
        self.heads, self.head_dim, self.groups = layer.num_heads, layer.head_dim, layer.n_groups
        self.state_size, self.inner = layer.ssm_state_size, layer.intermediate_size
        self.conv_dim, self.act = layer.conv_dim, layer.act
        self.time_step_limit = tuple(layer.time_step_limit)
        self.layer_idx = layer.layer_idx

    def decode_state(self) -> list[StateTensor]:
        """The conv carry over [x, B, C] and the rule's state (d_state x head_dim) per head."""
        carry = conv_state(self.conv_dim, self.conv1d.weight.shape[-1])
        return rule_state(self.heads, self.state_size, self.head_dim, carry)

    def forward(
        self,
        hidden_states: torch.Tensor,
        cache: Any = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """HF's call: the whole sequence, or (while ``stepping`` holds a Step) new tokens after its state."""
        if cache is not None:
            raise ValueError("an attnx Mamba2 mixer keeps its state through attnx decoding, not HF's cache")
        if self.stepping is not None:
            return self.stepped(hidden_states, mask=attention_mask)
        return self.mix(hidden_states, attention_mask, None)[0]

    def step(
        self,
        x: torch.Tensor,
        state: tuple[torch.Tensor, ...] | None,
        position: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The output for new tokens ``x`` (``mask``: their 2D padding mask) after ``state`` ((conv,
        recurrent); None: nothing before) and the state after them (no dependence on ``position``)."""
        return self.mix(x, mask, state or (None, None))

    def mix(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        state: tuple[torch.Tensor | None, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor, Any]:
        """The layer on (batch, n, width) ``x``: with ``state`` None the full-sequence op, else the step op
        from ``state`` (its tensors None: empty), returning the state after ``x`` too."""
        batch, n, _ = x.shape
        gate, channels, dt = self.in_proj(mask_padding(x, mask)).split(
            [self.inner, self.conv_dim, self.heads], -1
        )
        past_conv, past = (None, None) if state is None else state
        mixed, carry = carried_conv(channels.transpose(1, 2), self.conv1d.weight, self.conv1d.bias, past_conv)
        mixed = mask_padding(self.act(mixed).transpose(1, 2).to(x.dtype), mask)
        width = self.groups * self.state_size
        xs, b, c = torch.split(mixed, [self.inner, width, width], dim=-1)
        xs = xs.reshape(batch, n, self.heads, self.head_dim).float()
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*self.time_step_limit)  # (b, n, h)
        g = (dt * -self.A_log.float().exp()).transpose(1, 2)[..., None]
        q, k = (t.reshape(batch, n, self.groups, self.state_size).float().transpose(1, 2) for t in (c, b))
        v = (xs * dt[..., None]).transpose(1, 2)
        beta = torch.ones(batch, self.heads, n, dtype=torch.float32, device=x.device)
        step = state is not None
        out, recurrent = run_rule(q, k, v, g, beta, past, delta=False, scale=1.0, step=step)
        y = out.transpose(1, 2) + xs * self.D.float()[:, None]
        y = self.norm(y.reshape(batch, n, -1), gate)
        return self.out_proj(y.to(x.dtype)), (carry, recurrent) if step else None
