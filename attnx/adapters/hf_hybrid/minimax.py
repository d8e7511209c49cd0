"""MiniMax (``minimax``), as transformers 5.24 writes it.

Lightning attention layers become :class:`~attnx.adapters.hf_hybrid.lightning.LightningAttention`,
the full attention layers (no output gate, no q/k norms)
:class:`~attnx.adapters.hf_hybrid.attention.GatedAttention` with ``gated=False``, the experts of its
Mixtral-style MoE :class:`~attnx.adapters.hf_hybrid.moe.DenseExperts` (HF's router runs as it is).
The decoder layers' residual alpha/beta factors are HF's own code.
"""

from __future__ import annotations

from torch import nn
from transformers.models.minimax import modeling_minimax as mm

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.attention import GatedAttention
from attnx.adapters.hf_hybrid.lightning import LightningAttention
from attnx.adapters.hf_hybrid.moe import DenseExperts


def _attention(layer: nn.Module) -> GatedAttention:
    return GatedAttention(layer, mm.apply_rotary_pos_emb, gated=False)


MINIMAX = Architecture(
    model_type="minimax",
    config_class="MiniMaxConfig",
    classes=("MiniMaxForCausalLM", "MiniMaxModel"),
    models=(mm.MiniMaxForCausalLM, mm.MiniMaxModel),
    layers={
        mm.MiniMaxLightningAttention: LightningAttention,
        mm.MiniMaxAttention: _attention,
        mm.MiniMaxExperts: DenseExperts,
    },
    untraceable=(mm.MiniMaxLightningAttention, mm.MiniMaxExperts),
    rotary=mm.MiniMaxRotaryEmbedding,
)
