"""Translated's Lara Mini (``lara_mini``), as transformers 5.24 writes it: Qwen3.5's Gated DeltaNet, Qwen3's
attention and a Qwen3-Next-style sparse MoE with an ungated shared expert.

Line for line against Qwen3.5 (``Qwen3_5GatedDeltaNet``), ``LaraMiniGatedDeltaNet.forward`` is the same
layer: ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``, the conv + activation, q/k
L2-normalised in float32, g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), the float32 delta rule;
only its gated norm differs (``LaraMiniRMSNormGated``: weight times the float32 RMS-normalised output times
silu(z), the weight not zero-centred), which is HF's own module here. So the layer is
:class:`~attnx.adapters.hf_hybrid.linear.GatedDeltaNet` with Qwen3.5's projections, nothing overridden.

``LaraMiniAttention`` is Qwen3's: no output gate, per-head RMSNorms ``q_norm``/``k_norm`` (weight not
zero-centred), the whole head rotated, and only where the model passes cos/sin: the ``"sliding_attention"``
layers. The ``"full_attention"`` layers take no positions at all, so they become
:class:`~attnx.adapters.hf_hybrid.attention.GatedAttention` (``gated=False``) that never rotates. The
sliding layers attend to the last ``sliding_window`` keys, which attnx's softmax attention and its KV cache
do not reproduce: they are refused by name, so an adapted model has no rotated layer and its rotary module
(``LaraMiniRotaryEmbedding``, HF's code, still run by HF's forward) reaches no layer (``rotary=None``).

The MoE (``LaraMiniSparseMoeBlock``): the experts (``LaraMiniExperts``: concatenated [gate; up], Qwen3-Next's
layout) become :class:`~attnx.adapters.hf_hybrid.moe.DenseExperts`; the router (float32 softmax, top-k,
renormalised with ``norm_topk_prob``) and the shared expert, added without a gate, are HF's code, as are the
embeddings, the decoder norms and the head.
"""

from __future__ import annotations

import functools

from torch import nn
from transformers.models.lara_mini import modeling_lara_mini as lara

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.attention import GatedAttention
from attnx.adapters.hf_hybrid.moe import DenseExperts
from attnx.adapters.hf_hybrid.qwen import linear, project_35


def _attention(layer: nn.Module) -> GatedAttention:
    return GatedAttention(layer, lara.apply_rotary_pos_emb, gated=False, norms=("q_norm", "k_norm"))


LARA_MINI = Architecture(
    model_type="lara_mini",
    config_class="LaraMiniConfig",
    classes=("LaraMiniForCausalLM", "LaraMiniModel"),
    models=(lara.LaraMiniForCausalLM, lara.LaraMiniModel),
    layers={
        lara.LaraMiniGatedDeltaNet: functools.partial(linear, project_35),
        lara.LaraMiniAttention: _attention,
        lara.LaraMiniExperts: DenseExperts,
    },
    untraceable=(lara.LaraMiniGatedDeltaNet, lara.LaraMiniExperts),
    rotary=None,
    windowed="sliding_attention",
)
