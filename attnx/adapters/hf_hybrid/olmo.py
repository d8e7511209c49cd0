"""AI2's OLMo Hybrid (``olmo_hybrid``), as transformers 5.24 writes it: Gated DeltaNet layers and a few
softmax attention layers (``layer_types`` "linear_attention" / "full_attention"), each kind in its own
decoder layer class.

Its Gated DeltaNet (``OlmoHybridGatedDeltaNet.forward``) is Qwen3.5's (``Qwen3_5GatedDeltaNet``) line for
line: the same padding mask, one causal depthwise conv + ``hidden_act`` over the concatenated q, k, v
channels, q and k L2-normalised (the rsqrt form) in float32, g = -exp(A_log) softplus(a + dt_bias) per
value head, the chunked float32 delta rule, the gated RMSNorm per value head (norm(o) silu(gate)) and the
output projection. It differs in:

* separate ``q_proj``, ``k_proj``, ``v_proj`` (concatenated before the conv), the gate ``g_proj`` (Qwen3.5's
  ``in_proj_z``), ``b_proj`` and ``a_proj``;
* beta = 2 sigmoid(b) with ``linear_allow_neg_eigval`` (the default, and the released configs'): a write
  strength in (0, 2), so the state's transition I - beta k k^T may have a negative eigenvalue;
* the norm and projection are named ``o_norm`` (eps 1e-5) and ``o_proj``.

So it becomes :class:`OlmoGatedDeltaNet`, a :class:`~attnx.adapters.hf_hybrid.linear.GatedDeltaNet` with that
beta and those names (``attnx::GatedDeltaRule``; decode: conv carry + recurrent state).

Its attention (``OlmoHybridAttention``, OLMo 2/3's): no output gate; ``q_norm`` and ``k_norm`` are RMSNorms
over the *whole* projections (all heads at once, before they are split: one mean square per token, not per
head); then HF's ``apply_rotary_pos_emb`` on the full head, or no rotary at all when the config has no
``rope_theta`` (HF's "NoPE" mode: the model builds no rotary module, as the released checkpoints); causal
softmax with scale head_dim^-1/2 and grouped KV heads; ``o_proj``. It becomes :class:`OlmoAttention`,
:class:`~attnx.adapters.hf_hybrid.attention.GatedAttention` with its norms on the flat projections.

Everything else (embeddings, the decoder layers: pre-norm around the linear layers, norms *after* the
attention and the MLP of the attention layers, the SwiGLU MLP, the final norm, the head, the float32 rotary
table) is HF's own code.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.olmo_hybrid import modeling_olmo_hybrid as olmo

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.attention import GatedAttention
from attnx.adapters.hf_hybrid.linear import GatedDeltaNet


def _project(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(q, k, v channels, output gate per value head, beta logits, decay logits)."""
    batch, n, _ = x.shape
    qkv = torch.cat([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], dim=-1)
    gate = layer.g_proj(x).reshape(batch, n, -1, layer.head_v_dim)
    return qkv, gate, layer.b_proj(x), layer.a_proj(x)


class OlmoGatedDeltaNet(GatedDeltaNet):
    """An HF ``OlmoHybridGatedDeltaNet`` layer (same parameters, same names) on ``attnx::GatedDeltaRule``
    (decode: ``attnx::GatedDeltaRuleStep``, conv + recurrent state)."""

    output_names = ("o_norm", "o_proj")

    def __init__(self, layer: nn.Module):
        super().__init__(layer, _project, ACT2FN[layer.activation])
        self.allow_neg_eigval = layer.allow_neg_eigval

    def beta(self, b: torch.Tensor) -> torch.Tensor:
        """2 sigmoid(b) with ``linear_allow_neg_eigval``, else sigmoid(b)."""
        beta = super().beta(b)
        return beta * 2.0 if self.allow_neg_eigval else beta


class OlmoAttention(GatedAttention):
    """An HF ``OlmoHybridAttention`` layer (same parameters, same names) on ``attnx::SoftmaxAttention``: no
    output gate, q/k RMSNorms over the whole projections."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer, olmo.apply_rotary_pos_emb, gated=False)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The flat projections, q and k normalised over all their heads at once (HF's order)."""
        return self.q_norm(self.q_proj(x)), self.k_norm(self.k_proj(x)), self.v_proj(x)


OLMO_HYBRID = Architecture(
    model_type="olmo_hybrid",
    config_class="OlmoHybridConfig",
    classes=("OlmoHybridForCausalLM", "OlmoHybridModel"),
    models=(olmo.OlmoHybridForCausalLM, olmo.OlmoHybridModel),
    layers={olmo.OlmoHybridGatedDeltaNet: OlmoGatedDeltaNet, olmo.OlmoHybridAttention: OlmoAttention},
    untraceable=(olmo.OlmoHybridGatedDeltaNet,),
    rotary=olmo.OlmoHybridRotaryEmbedding,
)
