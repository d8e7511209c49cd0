"""Qwen3-Next (``qwen3_next``) and the text models of Qwen3.5 (``qwen3_5``) and Qwen3.5-MoE
(``qwen3_5_moe``), as transformers 5.24 writes them.

They share their layers' maths and differ in the linear layers' projections: Qwen3-Next packs
q, k, v, z per key-head group in ``in_proj_qkvz`` and b, a in ``in_proj_ba`` (un-interleaved by its
own ``fix_query_key_value_ordering``, which runs here), Qwen3.5 and Qwen3.5-MoE have ``in_proj_qkv``,
``in_proj_z``, ``in_proj_b``, ``in_proj_a``. The MoE blocks (Qwen3-Next, Qwen3.5-MoE) keep HF's
router and shared expert; their experts become :class:`attnx.adapters.hf_hybrid.moe.DenseExperts`.
The Qwen3.5 multimodal rotary (``mrope_section``) is HF's own code: for text its three position rows
are equal, the plain rotary.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.qwen3_5 import modeling_qwen3_5 as q35
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as q35moe
from transformers.models.qwen3_next import modeling_qwen3_next as qnext

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.attention import GatedAttention
from attnx.adapters.hf_hybrid.linear import GatedDeltaNet
from attnx.adapters.hf_hybrid.moe import DenseExperts


def _project_next(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q, k, v, z, b, a = qnext.Qwen3NextGatedDeltaNet.fix_query_key_value_ordering(
        layer, layer.in_proj_qkvz(x), layer.in_proj_ba(x)
    )
    qkv = torch.cat([t.reshape(t.shape[0], t.shape[1], -1) for t in (q, k, v)], dim=-1)
    return qkv, z, b, a


def project_35(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Qwen3.5's projections, one each (Lara Mini's too): (q, k, v channels, z per value head, b, a)."""
    batch, n, _ = x.shape
    z = layer.in_proj_z(x).reshape(batch, n, -1, layer.head_v_dim)
    return layer.in_proj_qkv(x), z, layer.in_proj_b(x), layer.in_proj_a(x)


def linear(project: Any, layer: nn.Module) -> GatedDeltaNet:
    """The Gated DeltaNet of an HF linear layer whose projections ``project`` reads."""
    return GatedDeltaNet(layer, project, ACT2FN[layer.activation])


def qk_normed_attention(module: Any, layer: nn.Module) -> GatedAttention:
    return GatedAttention(layer, module.apply_rotary_pos_emb, norms=("q_norm", "k_norm"))


QWEN3_NEXT = Architecture(
    model_type="qwen3_next",
    config_class="Qwen3NextConfig",
    classes=("Qwen3NextForCausalLM", "Qwen3NextModel"),
    models=(qnext.Qwen3NextForCausalLM, qnext.Qwen3NextModel),
    layers={
        qnext.Qwen3NextGatedDeltaNet: functools.partial(linear, _project_next),
        qnext.Qwen3NextAttention: functools.partial(qk_normed_attention, qnext),
        qnext.Qwen3NextExperts: DenseExperts,
    },
    untraceable=(qnext.Qwen3NextGatedDeltaNet, qnext.Qwen3NextExperts),
    rotary=qnext.Qwen3NextRotaryEmbedding,
)

QWEN3_5 = Architecture(
    model_type="qwen3_5",
    config_class="Qwen3_5TextConfig",
    classes=("Qwen3_5ForCausalLM", "Qwen3_5TextModel"),
    models=(q35.Qwen3_5ForCausalLM, q35.Qwen3_5TextModel),
    layers={
        q35.Qwen3_5GatedDeltaNet: functools.partial(linear, project_35),
        q35.Qwen3_5Attention: functools.partial(qk_normed_attention, q35),
    },
    untraceable=(q35.Qwen3_5GatedDeltaNet,),
    rotary=q35.Qwen3_5TextRotaryEmbedding,
)

QWEN3_5_MOE = Architecture(
    model_type="qwen3_5_moe",
    config_class="Qwen3_5MoeTextConfig",
    classes=("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextModel"),
    models=(q35moe.Qwen3_5MoeForCausalLM, q35moe.Qwen3_5MoeTextModel),
    layers={
        q35moe.Qwen3_5MoeGatedDeltaNet: functools.partial(linear, project_35),
        q35moe.Qwen3_5MoeAttention: functools.partial(qk_normed_attention, q35moe),
        q35moe.Qwen3_5MoeExperts: DenseExperts,
    },
    untraceable=(q35moe.Qwen3_5MoeGatedDeltaNet, q35moe.Qwen3_5MoeExperts),
    rotary=q35moe.Qwen3_5MoeTextRotaryEmbedding,
)
