"""MiniMax's lightning attention layers on attnx's gated rule (no delta rule, fixed decay per head).

What HF computes (``MiniMaxLightningAttention.forward``, transformers 5.24), for hidden states x
(batch, n, width):

1. q, k, v = split(act(``qkv_proj``(x))) per head (``hidden_act``), times the 2D padding mask
   (``apply_mask_to_padding_states``: a padded token's q, k, v are zeros);
2. per head h a fixed decay rate s_h (``slope_rate``, from the head index and the layer's depth,
   a buffer): S_t = exp(-s_h) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, no scale, no normaliser, in the
   activations' dtype (HF computes it in blocks of ``block_size`` in prefill and token by token
   with its cache; both are this recurrence);
3. HF's RMSNorm over all heads' outputs, times sigmoid(``output_gate``(x)), ``out_proj``.

So it is ``attnx::GatedDeltaRule`` with ``delta=False``, g = -s_h at every token, beta = 1, scale 1.
A padded token decays the state like any other (HF's too); left padding meets a zero state, so it is
exactly a no-op there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnx.adapters.hf_hybrid.linear import CHUNK_SIZE
from attnx.adapters.hf_hybrid.model import adopt
from attnx.attention import Stepping
from attnx.plugins.gated.op import rule_state, run_rule
from attnx.state import StateTensor


class LightningAttention(Stepping, nn.Module):
    """An HF MiniMax lightning attention layer (same parameters, same names) on ``attnx::GatedDeltaRule``.

    A :class:`attnx.state.DecodableLayer`: ``step(x, state, position)`` continues its recurrent state
    (``attnx::GatedDeltaRuleStep``); while ``stepping`` holds a Step, HF's call of the layer is that step.
    """

    def __init__(self, layer: nn.Module):
        super().__init__()
        adopt(self, layer)  # its buffers (slope_rate, HF's decay tables) are in its state dict
        self.heads, self.head_dim, self.layer_idx = layer.num_attention_heads, layer.head_dim, layer.layer_idx

    def decode_state(self) -> list[StateTensor]:
        """The recurrent state S (d, d) per head."""
        return rule_state(self.heads, self.head_dim, self.head_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: Any = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """HF's call: the whole sequence, or (while ``stepping`` holds a Step) the step of new tokens."""
        if cache is not None:
            raise ValueError(
                "an attnx lightning attention layer keeps its state through attnx decoding, not HF's cache"
            )
        if self.stepping is not None:
            return self.stepped(hidden_states), None
        return self.mix(hidden_states, attention_mask, None)[0], None

    def step(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None, position: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor]]:
        """The output for new tokens ``x`` after ``state`` ((recurrent,); None: empty) and the state after
        them (the rule does not depend on ``position``)."""
        out, present = self.mix(x, None, (state or (None,))[0], stepping=True)
        return out, present

    def mix(
        self, x: torch.Tensor, mask: torch.Tensor | None, past: torch.Tensor | None, stepping: bool = False
    ) -> tuple[torch.Tensor, Any]:
        batch, n, _ = x.shape
        qkv = self.act_fn(self.qkv_proj(x))
        if mask is not None:
            qkv = (qkv * mask[:, :, None]).to(qkv.dtype)
        q, k, v = torch.split(qkv.reshape(batch, n, self.heads, 3 * self.head_dim), self.head_dim, dim=3)
        q, k, v = (t.transpose(1, 2).float() for t in (q, k, v))
        g = (-self.slope_rate.float()).reshape(1, self.heads, 1, 1).expand(batch, self.heads, n, 1)
        beta = torch.ones(batch, self.heads, n, dtype=torch.float32, device=x.device)
        out, recurrent = run_rule(
            q, k, v, g, beta, past, delta=False, scale=1.0, chunk=CHUNK_SIZE, step=stepping
        )
        out = out.transpose(1, 2).reshape(batch, n, -1).to(x.dtype)
        out = self.norm(out) * torch.sigmoid(self.output_gate(x))
        return self.out_proj(out), (recurrent,) if stepping else None
