"""Kimi Linear (``kimi_linear``), as transformers 5.24 writes it.

Its Kimi Delta Attention layers (``KimiLinearDeltaAttention``) are Gated DeltaNet
(:class:`~attnx.adapters.hf_hybrid.linear.GatedDeltaNet`: the same padding mask, short conv + activation
over the concatenated q, k, v channels, float32 delta rule, decode state) with, per ``forward``:

* separate ``q_proj``, ``k_proj``, ``v_proj`` (as many q/k heads as value heads, ``linear_head_dim`` each);
* a decay per head *and key channel* (``KimiLinearForgetGate``): g = -exp(A_log[h]) * softplus(
  ``f_b_proj``(``f_a_proj``(x)) + dt_bias), HF's softplus log(1 + exp(.)) taken as the identity above 20;
  beta = sigmoid(``b_proj``(x)): ``attnx::GatedDeltaRule`` with g (batch, H, n, d_k);
* q and k L2-normalised in float32 as x / sqrt(sum(x^2) + 1e-6) (Qwen's multiplies by the rsqrt);
* the output through ``o_norm`` (RMSNorm per head in float32 times sigmoid of the gate
  ``g_b_proj``(``g_a_proj``(x))) and ``o_proj``.

The MLA layers become :class:`~attnx.adapters.hf_hybrid.latent.LatentAttention`; the experts of the
DeepSeek-V3-style MoE :class:`~attnx.adapters.hf_hybrid.moe.DenseExperts`, behind HF's own router (sigmoid
scores, ``e_score_correction_bias``, grouped top-k, ``routed_scaling_factor``), shared experts and dense
MLP layers (``mlp_layer_types``), which run as they are.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.kimi_linear import modeling_kimi_linear as kimi

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.latent import LatentAttention, check_heads
from attnx.adapters.hf_hybrid.linear import GatedDeltaNet, Projector
from attnx.adapters.hf_hybrid.moe import DenseExperts
from attnx.plugins.gated.op import l2norm

SOFTPLUS_LINEAR_ABOVE = 20.0  # KimiLinearForgetGate's softplus bound


def _project(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(q, k, v channels, output gate per head, beta logits, the forget gate's projection)."""
    batch, n, _ = x.shape
    qkv = torch.cat([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], dim=-1)
    gate = layer.g_b_proj(layer.g_a_proj(x)).view(batch, n, -1, layer.head_k_dim)
    forget = layer.forget_gate.f_b_proj(layer.forget_gate.f_a_proj(x))
    return qkv, gate, layer.b_proj(x), forget


class KimiDeltaAttention(GatedDeltaNet):
    """An HF ``KimiLinearDeltaAttention`` layer (same parameters, same names) on ``attnx::GatedDeltaRule``
    with a decay per key channel (decode: ``attnx::GatedDeltaRuleStep``, conv + recurrent state)."""

    def __init__(self, layer: nn.Module, project: Projector = _project):
        super().__init__(layer, project, ACT2FN[layer.activation])

    def read_heads(self, layer: nn.Module) -> None:
        self.num_k_heads = self.num_v_heads = layer.num_heads
        self.head_k_dim = self.head_v_dim = layer.head_dim

    def l2norm(self, x: torch.Tensor) -> torch.Tensor:
        return l2norm(x, divide=True)

    def decay(self, a: torch.Tensor) -> torch.Tensor:
        """g = -exp(A_log[h]) softplus(a + dt_bias), (batch, n, H, d_k)."""
        a, rate = self.forget_input(a)
        return -rate * torch.where(a > SOFTPLUS_LINEAR_ABOVE, a, torch.log(1.0 + torch.exp(a)))

    def forget_input(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The forget gate's input a + dt_bias (batch, n, H, d_k) and decay rate exp(A_log) (H, 1), in
        float32."""
        gate = self.forget_gate
        a = (a.float() + gate.dt_bias.float()).view(*a.shape[:2], -1, self.head_k_dim)
        return a, gate.A_log.float().exp().view(-1, 1)

    def output(self, out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.o_norm(out, z).reshape(*out.shape[:2], -1))


KIMI_LINEAR = Architecture(
    model_type="kimi_linear",
    config_class="KimiLinearConfig",
    classes=("KimiLinearForCausalLM", "KimiLinearModel"),
    models=(kimi.KimiLinearForCausalLM, kimi.KimiLinearModel),
    layers={
        kimi.KimiLinearDeltaAttention: KimiDeltaAttention,
        kimi.KimiLinearAttention: LatentAttention,
        kimi.KimiLinearExperts: DenseExperts,
    },
    untraceable=(kimi.KimiLinearDeltaAttention, kimi.KimiLinearExperts),
    rotary=None,
    check=check_heads,
)
