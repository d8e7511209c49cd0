"""Ant Group's Bailing hybrid (``bailing_hybrid``, the Ling 3 models), as transformers 5.24 writes it.

Its KDA layers (``BailingHybridDeltaAttention``) are Kimi Delta Attention
(:class:`~attnx.adapters.hf_hybrid.kimi.KimiDeltaAttention`: padding mask, short conv + activation over
the separate q, k, v projections, q and k L2-normalised as x / sqrt(sum(x^2) + 1e-6), the delta rule in
float32 with beta = sigmoid(``b_proj``(x)), a decay per head and key channel, ``o_norm`` gated by sigmoid
and ``o_proj``) with one projection for the output gate (``g_proj``) and one for the forget gate's input
(``forget_gate.f_proj``), and its own forget gate (``BailingHybridForgetGate``), with a = f_proj(x) +
dt_bias per channel and rate = exp(A_log[h]) per head:

* ``kda_safe_gate`` (the released configs): g = ``kda_lower_bound`` * sigmoid(rate * a), bounded in
  [lower bound, 0];
* otherwise Kimi's: g = -rate * softplus(a).

Its attention layers are multi-head latent attention with positions and a gate per head
(:class:`~attnx.adapters.hf_hybrid.latent.LatentAttention` with ``rotate`` its interleaved rotary and
``head_gate``); the experts of its MoE :class:`~attnx.adapters.hf_hybrid.moe.DenseExperts` behind HF's own
router (sigmoid scores, ``e_score_correction_bias``, grouped top-k, ``routed_scaling_factor``), shared
experts and dense MLP layers (``mlp_layer_types``), which run as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.bailing_hybrid import modeling_bailing_hybrid as bailing

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.kimi import KimiDeltaAttention
from attnx.adapters.hf_hybrid.latent import LatentAttention, check_heads
from attnx.adapters.hf_hybrid.moe import DenseExperts


def _project(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(q, k, v channels, output gate per head, beta logits, the forget gate's projection)."""
    batch, n, _ = x.shape
    qkv = torch.cat([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], dim=-1)
    gate = layer.g_proj(x).view(batch, n, -1, layer.head_k_dim)
    return qkv, gate, layer.b_proj(x), layer.forget_gate.f_proj(x)


class BailingDeltaAttention(KimiDeltaAttention):
    """An HF ``BailingHybridDeltaAttention`` layer (same parameters, same names) on
    ``attnx::GatedDeltaRule`` with a decay per key channel (decode: ``attnx::GatedDeltaRuleStep``)."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer, _project)
        self.safe_gate, self.lower_bound = layer.forget_gate.safe_gate, float(layer.forget_gate.lower_bound)

    def decay(self, a: torch.Tensor) -> torch.Tensor:
        """g = lower_bound sigmoid(exp(A_log[h]) (a + dt_bias)) with the safe gate, else
        -exp(A_log[h]) softplus(a + dt_bias); (batch, n, H, d_k)."""
        a, rate = self.forget_input(a)
        if self.safe_gate:
            return self.lower_bound * torch.sigmoid(rate * a)
        return -rate * F.softplus(a)


def _attention(layer: nn.Module) -> LatentAttention:
    return LatentAttention(layer, rotate=bailing.apply_rotary_pos_emb_interleave, head_gate=True)


BAILING_HYBRID = Architecture(
    model_type="bailing_hybrid",
    config_class="BailingHybridConfig",
    classes=("BailingHybridForCausalLM", "BailingHybridModel"),
    models=(bailing.BailingHybridForCausalLM, bailing.BailingHybridModel),
    layers={
        bailing.BailingHybridDeltaAttention: BailingDeltaAttention,
        bailing.BailingHybridAttention: _attention,
        bailing.BailingHybridExperts: DenseExperts,
    },
    untraceable=(bailing.BailingHybridDeltaAttention, bailing.BailingHybridExperts),
    rotary=bailing.BailingHybridRotaryEmbedding,
    check=check_heads,
)
