"""The Mamba2 (SSD) models as transformers 5.24 writes them: Mamba2 (``mamba2``), Bamba (``bamba``) and
IBM's Granite 4.0-H (``granitemoehybrid``).

Their Mamba2 mixers (one torch path in the three modeling files) become
:class:`~attnx.adapters.hf_hybrid.ssd.StateSpaceDuality`; Bamba's and Granite's attention layers (plain:
no output gate, no q/k norms; Granite's scale is its ``attention_multiplier``, and a Granite config
with ``position_embedding_type`` null has no rotary at all)
:class:`~attnx.adapters.hf_hybrid.attention.GatedAttention` with ``gated=False``; Granite's MoE experts
:class:`~attnx.adapters.hf_hybrid.moe.DenseExperts` (its router and shared MLP run as they are). Granite's
embedding, residual and logit multipliers are HF's own code. Mamba2 has one layer type and takes its
2D padding mask itself.
"""

from __future__ import annotations

from torch import nn
from transformers.models.bamba import modeling_bamba as bamba
from transformers.models.granitemoehybrid import modeling_granitemoehybrid as granite
from transformers.models.mamba2 import modeling_mamba2 as mamba2

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.attention import GatedAttention
from attnx.adapters.hf_hybrid.moe import DenseExperts
from attnx.adapters.hf_hybrid.ssd import StateSpaceDuality


def _bamba_attention(layer: nn.Module) -> GatedAttention:
    return GatedAttention(layer, bamba.apply_rotary_pos_emb, gated=False)


def _granite_attention(layer: nn.Module) -> GatedAttention:
    return GatedAttention(layer, granite.apply_rotary_pos_emb, gated=False)


MAMBA2 = Architecture(
    model_type="mamba2",
    config_class="Mamba2Config",
    classes=("Mamba2ForCausalLM", "Mamba2Model"),
    models=(mamba2.Mamba2ForCausalLM, mamba2.Mamba2Model),
    layers={mamba2.Mamba2Mixer: StateSpaceDuality},
    untraceable=(mamba2.Mamba2Mixer,),
    rotary=None,
    mask_by_layer_type=False,
)

BAMBA = Architecture(
    model_type="bamba",
    config_class="BambaConfig",
    classes=("BambaForCausalLM", "BambaModel"),
    models=(bamba.BambaForCausalLM, bamba.BambaModel),
    layers={bamba.BambaMixer: StateSpaceDuality, bamba.BambaAttention: _bamba_attention},
    untraceable=(bamba.BambaMixer,),
    rotary=bamba.BambaRotaryEmbedding,
)

GRANITE_MOE_HYBRID = Architecture(
    model_type="granitemoehybrid",
    config_class="GraniteMoeHybridConfig",
    classes=("GraniteMoeHybridForCausalLM", "GraniteMoeHybridModel"),
    models=(granite.GraniteMoeHybridForCausalLM, granite.GraniteMoeHybridModel),
    layers={
        granite.GraniteMoeHybridMambaLayer: StateSpaceDuality,
        granite.GraniteMoeHybridAttention: _granite_attention,
        granite.GraniteMoeHybridExperts: DenseExperts,
    },
    untraceable=(granite.GraniteMoeHybridMambaLayer, granite.GraniteMoeHybridExperts),
    rotary=granite.GraniteMoeHybridRotaryEmbedding,
)
