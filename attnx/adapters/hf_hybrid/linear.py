"""Gated DeltaNet layers of Hugging Face hybrids (Qwen3-Next, Qwen3.5) on attnx's gated delta rule.

What HF computes (``Qwen3NextGatedDeltaNet.forward``, ``Qwen3_5GatedDeltaNet.forward``, transformers
5.24), and so this layer, for hidden states x (batch, n, width):

1. x is multiplied by the 2D padding mask (``apply_mask_to_padding_states``), so a padded token
   projects to zeros;
2. the projections give the q, k, v channels (concatenated), the output gate z and the per-value-head
   b, a (the architecture's ``project``: Qwen3-Next interleaves them per key-head group in
   ``in_proj_qkvz`` / ``in_proj_ba``, Qwen3.5 has one projection each);
3. one causal depthwise conv (kernel ``linear_conv_kernel_dim``, no padding past the start: the
   K-1 channels before the first token are zeros, or the carried conv state) and the config's
   activation run over the q, k, v channels;
4. q and k are L2-normalised in float32 (eps 1e-6 inside the rsqrt), q scaled by d_k^-1/2; the
   decay g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) per value head; each q/k head
   serves Hv/Hk consecutive value heads; the delta rule runs in float32;
5. the output passes HF's gated RMSNorm (norm(o) * silu(z), per value head) and ``out_proj``.

A padded token is then exactly a no-op on the state at the start (left padding): its q, k, v are
silu(conv(0)) = 0, so the zero state stays zero whatever its decay.

Kimi Linear's Kimi Delta Attention is this layer with its own q/k normalisation, a decay per key channel
and its own output norm: :class:`attnx.adapters.hf_hybrid.kimi.KimiDeltaAttention` overrides
:meth:`GatedDeltaNet.l2norm`, :meth:`GatedDeltaNet.decay` and :meth:`GatedDeltaNet.output`. OLMo Hybrid's
is Qwen3.5's with its own projections' names and beta = 2 sigmoid(b) (``linear_allow_neg_eigval``):
:class:`attnx.adapters.hf_hybrid.olmo.OlmoGatedDeltaNet` overrides :meth:`GatedDeltaNet.beta` and
``output_names``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnx.adapters.hf_hybrid.mixer import PaddedMixer, mask_padding
from attnx.plugins.gated.op import l2norm, rule_state, run_rule
from attnx.shortconv import carried_conv
from attnx.state import StateTensor, conv_state

# HF's torch_chunk_gated_delta_rule default, so an export chunks (and rounds) as the model's reference
CHUNK_SIZE = 64

# project(layer, x) -> (qkv channels (b, n, conv_dim), z (b, n, Hv, Dv), b (b, n, Hv), a (b, n, Hv))
Projector = Callable[[nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


class GatedDeltaNet(PaddedMixer):
    """An HF Gated DeltaNet layer (same parameters, same names) computed by ``attnx::GatedDeltaRule``: a
    :class:`~attnx.adapters.hf_hybrid.mixer.PaddedMixer` whose state is the conv carry and the recurrent
    state (``attnx::GatedDeltaRuleStep``)."""

    # the gated output norm and the output projection, by HF's names (Qwen's; OLMo's o_norm, o_proj)
    output_names: tuple[str, str] = ("norm", "out_proj")

    def __init__(
        self, layer: nn.Module, project: Projector, activation: Callable[[torch.Tensor], torch.Tensor]
    ):
        super().__init__(layer)
        self.project, self.activation = project, activation
        self.conv_kernel_size = layer.conv_kernel_size
        self.read_heads(layer)

    def read_heads(self, layer: nn.Module) -> None:
        """The head counts and sizes, under HF's Qwen names (so the architecture's own helpers, Qwen3-Next's
        ``fix_query_key_value_ordering``, run on this module)."""
        self.num_k_heads, self.num_v_heads = layer.num_k_heads, layer.num_v_heads
        self.head_k_dim, self.head_v_dim = layer.head_k_dim, layer.head_v_dim

    def decode_state(self) -> list[StateTensor]:
        """The conv carry over the q, k, v channels and the delta rule's state per value head."""
        channels = 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim
        carry = conv_state(channels, self.conv_kernel_size)
        return rule_state(self.num_v_heads, self.head_k_dim, self.head_v_dim, carry)

    def conv(self, qkv: torch.Tensor, past: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The causal depthwise conv + activation over (b, n, C) channels after ``past`` (b, C, K-1)
        (None: zeros, as HF's left padding of K-1); returns (out, the last K-1 inputs)."""
        out, carry = carried_conv(qkv, self.conv1d.weight, self.conv1d.bias, past)
        return self.activation(out).to(qkv.dtype), carry

    def mix(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        state: tuple[torch.Tensor | None, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor, Any]:
        """``PaddedMixer.mix`` of the Gated DeltaNet (module docstring): padded tokens zeroed first."""
        x = mask_padding(x, mask)
        batch, n, _ = x.shape
        qkv, z, b, a = self.project(self, x)
        past_conv, past_state = (None, None) if state is None else state
        mixed, conv_state = self.conv(qkv, past_conv)
        widths = [self.num_k_heads * self.head_k_dim] * 2 + [self.num_v_heads * self.head_v_dim]
        q, k, v = torch.split(mixed, widths, -1)
        q, k = (self.l2norm(t.reshape(batch, n, -1, self.head_k_dim).float()).transpose(1, 2) for t in (q, k))
        v = v.reshape(batch, n, -1, self.head_v_dim).float().transpose(1, 2)
        g = self.decay(a).transpose(1, 2)
        beta = self.beta(b).float().transpose(1, 2)
        step = state is not None
        out, recurrent = run_rule(
            q, k, v, g, beta, past_state, delta=True, scale=self.head_k_dim**-0.5, chunk=CHUNK_SIZE, step=step
        )
        return self.output(out.transpose(1, 2).to(x.dtype), z), (conv_state, recurrent) if step else None

    def l2norm(self, x: torch.Tensor) -> torch.Tensor:
        """q and k's L2 normalisation (float32, per head), as the architecture writes it (HF's ``l2norm``)."""
        return l2norm(x)

    def decay(self, a: torch.Tensor) -> torch.Tensor:
        """The log-decay g <= 0, (batch, n, Hv, 1): -exp(A_log) softplus(a + dt_bias) per value head."""
        return (-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias))[..., None]

    def beta(self, b: torch.Tensor) -> torch.Tensor:
        """The delta rule's write strength per value head, (batch, n, Hv): sigmoid(b)."""
        return b.sigmoid()

    def output(self, out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The gated norm of the rule's output (batch, n, Hv, Dv) with gate ``z`` (same shape), per value
        head as HF flattens it, and the output projection (the modules ``output_names`` names)."""
        norm, projection = (getattr(self, name) for name in self.output_names)
        normed = norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
        return projection(normed.reshape(*out.shape[:2], -1))
