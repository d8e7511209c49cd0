"""The Mamba models as transformers 5.24 writes them. Mamba2 (SSD): Mamba2 (``mamba2``), Bamba
(``bamba``), IBM's Granite 4.0-H (``granitemoehybrid``), NVIDIA's Nemotron-H (``nemotron_h``), TII's
Falcon-H1 (``falcon_h1``) and Zyphra's Zamba2 (``zamba2``).
Mamba1 (selective scan): Mamba (``mamba``), TII's Falcon-Mamba (``falcon_mamba``) and AI21's Jamba
(``jamba``).

Their Mamba2 mixers (one torch path in the three modeling files) become
:class:`~attnx.adapters.hf_hybrid.ssd.StateSpaceDuality`; Bamba's and Granite's attention layers (plain:
no output gate, no q/k norms; Granite's scale is its ``attention_multiplier``, and a Granite config
with ``position_embedding_type`` null has no rotary at all)
:class:`~attnx.adapters.hf_hybrid.attention.GatedAttention` with ``gated=False``; Granite's MoE experts
:class:`~attnx.adapters.hf_hybrid.moe.DenseExperts` (its router and shared MLP run as they are). Granite's
embedding, residual and logit multipliers are HF's own code. Mamba2 has one layer type and takes its
2D padding mask itself. Nemotron-H's blocks hold one mixer each (Mamba2, attention without positions,
an MLP or a MoE: its ``layer_types`` add ``mlp`` and ``moe``); its experts have no gate (``up_proj``,
relu²), which :class:`~attnx.adapters.hf_hybrid.moe.DenseExperts` takes too, and its DeepSeek-V3-style
router and shared expert run as they are. Falcon-H1's layers run a Mamba2 mixer and an attention
layer side by side (its one layer type ``hybrid``), with µP multipliers the mixer and the attention
(``key_multiplier``) take in, the rest HF's own code.

Zamba2's hybrid layers call a transformer block whose weights are tied across every
``num_mem_blocks``-th call (one module per call site, so each keeps its own KV cache) with LoRA adapters
chosen by the calling layer's index: :class:`SiteAttention` adds its site's adapters; the block's MLP
(its adapters too) and the concatenation with the embeddings are HF's own code.

The Mamba1 mixers (one torch path, Falcon-Mamba's and Jamba's with RMSNorms on dt, B and C) become
:class:`~attnx.adapters.hf_hybrid.scan.SelectiveScan`; Mamba and Falcon-Mamba take their 2D padding
mask themselves; Jamba's attention layers have no positions and its Mixtral-style experts become
:class:`~attnx.adapters.hf_hybrid.moe.DenseExperts`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from transformers.models.bamba import modeling_bamba as bamba
from transformers.models.falcon_h1 import modeling_falcon_h1 as falcon_h1
from transformers.models.falcon_mamba import modeling_falcon_mamba as falcon_mamba
from transformers.models.granitemoehybrid import modeling_granitemoehybrid as granite
from transformers.models.jamba import modeling_jamba as jamba
from transformers.models.mamba import modeling_mamba as mamba
from transformers.models.mamba2 import modeling_mamba2 as mamba2
from transformers.models.nemotron_h import modeling_nemotron_h as nemotron
from transformers.models.zamba2 import modeling_zamba2 as zamba2

from attnx.adapters.hf_hybrid.architecture import LAYER_TYPES, Architecture
from attnx.adapters.hf_hybrid.attention import GatedAttention
from attnx.adapters.hf_hybrid.moe import DenseExperts
from attnx.adapters.hf_hybrid.scan import SelectiveScan
from attnx.adapters.hf_hybrid.ssd import StateSpaceDuality


def _attention(module: Any, layer: nn.Module) -> GatedAttention:
    return GatedAttention(layer, module.apply_rotary_pos_emb, gated=False)


class SiteAttention(GatedAttention):
    """Zamba2's attention at one call site of its shared transformer block (HF's ``Zamba2Attention``: the
    plain layer on 2 x width inputs, scale (head_dim / 2)^-1/2, its q/k/v plus the LoRA adapters of the
    site, HF's rotary only with ``use_mem_rope``). ``layer.call_site`` (set by :func:`_record_sites`) is the
    index of the model layer that calls it, which HF passes at every call."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer, zamba2.apply_rotary_pos_emb, gated=False)
        config = layer.config
        self.adapter = layer.layer_dic[layer.call_site] if config.use_shared_attention_adapter else None
        self.rotates = config.use_mem_rope

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        query, key, value = super().projections(x)
        if self.adapter is None:
            return query, key, value
        adapters = (self.linear_q_adapter_list, self.linear_k_adapter_list, self.linear_v_adapter_list)
        q, k, v = (adapter[self.adapter](x) for adapter in adapters)
        return query + q, key + k, value + v

    def project(
        self, x: torch.Tensor, position_embeddings: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return super().project(x, position_embeddings if self.rotates else None)


def _record_sites(model: nn.Module) -> None:
    """Tell each Zamba2 hybrid layer's attention which model layer calls it (:class:`SiteAttention`)."""
    for index, layer in enumerate(model.base_model.layers):
        if isinstance(layer, zamba2.Zamba2HybridLayer):
            layer.shared_transformer.self_attn.call_site = index


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
    layers={bamba.BambaMixer: StateSpaceDuality, bamba.BambaAttention: functools.partial(_attention, bamba)},
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
        granite.GraniteMoeHybridAttention: functools.partial(_attention, granite),
        granite.GraniteMoeHybridExperts: DenseExperts,
    },
    untraceable=(granite.GraniteMoeHybridMambaLayer, granite.GraniteMoeHybridExperts),
    rotary=granite.GraniteMoeHybridRotaryEmbedding,
)

NEMOTRON_H = Architecture(
    model_type="nemotron_h",
    config_class="NemotronHConfig",
    classes=("NemotronHForCausalLM", "NemotronHModel"),
    models=(nemotron.NemotronHForCausalLM, nemotron.NemotronHModel),
    layers={
        nemotron.NemotronHMamba2Mixer: StateSpaceDuality,
        nemotron.NemotronHAttention: functools.partial(_attention, nemotron),
        nemotron.NemotronHExperts: DenseExperts,
    },
    untraceable=(nemotron.NemotronHMamba2Mixer, nemotron.NemotronHExperts),
    rotary=None,
    layer_types=(*LAYER_TYPES, "mlp", "moe"),
)

MAMBA = Architecture(
    model_type="mamba",
    config_class="MambaConfig",
    classes=("MambaForCausalLM", "MambaModel"),
    models=(mamba.MambaForCausalLM, mamba.MambaModel),
    layers={mamba.MambaMixer: SelectiveScan},
    untraceable=(mamba.MambaMixer,),
    rotary=None,
    mask_by_layer_type=False,
)

FALCON_MAMBA = Architecture(
    model_type="falcon_mamba",
    config_class="FalconMambaConfig",
    classes=("FalconMambaForCausalLM", "FalconMambaModel"),
    models=(falcon_mamba.FalconMambaForCausalLM, falcon_mamba.FalconMambaModel),
    layers={falcon_mamba.FalconMambaMixer: SelectiveScan},
    untraceable=(falcon_mamba.FalconMambaMixer,),
    rotary=None,
    mask_by_layer_type=False,
)

JAMBA = Architecture(
    model_type="jamba",
    config_class="JambaConfig",
    classes=("JambaForCausalLM", "JambaModel"),
    models=(jamba.JambaForCausalLM, jamba.JambaModel),
    layers={
        jamba.JambaMambaMixer: SelectiveScan,
        jamba.JambaAttention: functools.partial(_attention, jamba),
        jamba.JambaExperts: DenseExperts,
    },
    untraceable=(jamba.JambaMambaMixer, jamba.JambaExperts),
    rotary=None,
)

FALCON_H1 = Architecture(
    model_type="falcon_h1",
    config_class="FalconH1Config",
    classes=("FalconH1ForCausalLM", "FalconH1Model"),
    models=(falcon_h1.FalconH1ForCausalLM, falcon_h1.FalconH1Model),
    layers={
        falcon_h1.FalconH1Mixer: StateSpaceDuality,
        falcon_h1.FalconH1Attention: functools.partial(_attention, falcon_h1),
    },
    untraceable=(falcon_h1.FalconH1Mixer,),
    rotary=falcon_h1.FalconH1RotaryEmbedding,
    layer_types=("hybrid",),
)

ZAMBA2 = Architecture(
    model_type="zamba2",
    config_class="Zamba2Config",
    classes=("Zamba2ForCausalLM", "Zamba2Model"),
    models=(zamba2.Zamba2ForCausalLM, zamba2.Zamba2Model),
    layers={zamba2.Zamba2MambaMixer: StateSpaceDuality, zamba2.Zamba2Attention: SiteAttention},
    untraceable=(zamba2.Zamba2MambaMixer,),
    rotary=zamba2.Zamba2RotaryEmbedding,
    layer_types=("hybrid", "linear_attention"),
    prepare=_record_sites,
)
