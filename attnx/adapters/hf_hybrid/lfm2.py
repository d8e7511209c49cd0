"""Liquid's LFM2 (``lfm2``) and LFM2-MoE (``lfm2_moe``), as transformers 5.24 writes them: gated short
convolutions and a few softmax attention layers (``layer_types`` "conv" / "full_attention"); LFM2-MoE's
feed-forward after its first ``num_dense_layers`` layers is a sparse MoE.

What HF computes in a conv layer (``Lfm2ShortConv.forward``), for hidden states x (batch, n, width):

1. x times the 2D padding mask (``apply_mask_to_padding_states``, with the mask HF's
   ``create_recurrent_attention_mask`` gives the "conv" layers);
2. ``in_proj`` (bias ``conv_bias``) gives three width-sized chunks B, C, x, in that order;
3. a causal depthwise conv (kernel ``conv_L_cache``, bias ``conv_bias``, no activation) over B * x: zeros
   before the first token (``causal_conv1d_fn``: padding K - 1, the first n outputs), or the cached last
   K - 1 inputs B * x in a decode step (``causal_conv1d_update``);
4. y = C * conv and ``out_proj``.

Only the input is masked: with ``conv_bias`` a padded token's B * x is the product of ``in_proj``'s biases,
not zero, and HF convolves it as it is; so does :class:`GatedShortConv`. There is no attnx op in it (a
depthwise conv and products export as they are); its decode state is the conv carry alone.

The attention layers (``Lfm2Attention``: no output gate, RMSNorms ``q_layernorm``/``k_layernorm`` per head
before the rotary, ``out_proj``) become :class:`~attnx.adapters.hf_hybrid.attention.GatedAttention`.
Everything else (embeddings, the decoder layers' ``operator_norm``/``ffn_norm``, the SwiGLU feed-forward,
the final ``embedding_norm``, the head) is HF's own code. LFM2-MoE's layers are LFM2's, line for line
(``Lfm2MoeShortConv``, ``Lfm2MoeAttention``); its experts (``Lfm2MoeExperts``: concatenated [gate; up])
become :class:`~attnx.adapters.hf_hybrid.moe.DenseExperts`, its router (sigmoid scores, top-k chosen with
the ``expert_bias`` buffer, weights renormalised and scaled) is HF's code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.models.lfm2 import modeling_lfm2 as lfm2
from transformers.models.lfm2_moe import modeling_lfm2_moe as lfm2_moe

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.attention import GatedAttention
from attnx.adapters.hf_hybrid.mixer import PaddedMixer, mask_padding
from attnx.adapters.hf_hybrid.moe import DenseExperts
from attnx.errors import AttnxError
from attnx.shortconv import carried_conv
from attnx.state import StateTensor, conv_state


class GatedShortConv(PaddedMixer):
    """An HF LFM2 conv layer (same parameters, same names: ``in_proj``, ``conv``, ``out_proj``); its decode
    state is the conv carry alone."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.channels, _, self.kernel = layer.conv.weight.shape

    def decode_state(self) -> list[StateTensor]:
        """The conv carry: the last K - 1 inputs B * x."""
        return [conv_state(self.channels, self.kernel)]

    def mix(
        self, x: torch.Tensor, mask: torch.Tensor | None, state: tuple[torch.Tensor | None] | None
    ) -> tuple[torch.Tensor, Any]:
        """The layer on (batch, n, width) ``x``: with ``state`` None the whole sequence, else a step after the
        carry in ``state`` (None in it: zeros), returning the carry after ``x`` too."""
        b, c, xs = self.in_proj(mask_padding(x, mask)).chunk(3, dim=-1)
        conv, carry = carried_conv(
            b * xs, self.conv.weight, self.conv.bias, None if state is None else state[0]
        )
        y = c * conv.to(x.dtype)
        return self.out_proj(y), None if state is None else (carry,)


def _check(config: Any) -> None:
    """Refuse a conv kernel of one tap (no carry: an empty decode state, which onnxruntime-genai refuses).

    Raises:
        AttnxError: ``conv_L_cache`` below 2.
    """
    if config.conv_L_cache < 2:
        raise AttnxError(
            f"lfm2 with conv_L_cache={config.conv_L_cache}: attnx decodes a conv layer through its carry of "
            "conv_L_cache - 1 inputs; export a config with conv_L_cache >= 2"
        )


def _attention(layer: nn.Module) -> GatedAttention:
    # LFM2-MoE's rotary function is LFM2's, copied
    return GatedAttention(
        layer, lfm2.apply_rotary_pos_emb, gated=False, norms=("q_layernorm", "k_layernorm"), output="out_proj"
    )


LFM2 = Architecture(
    model_type="lfm2",
    config_class="Lfm2Config",
    classes=("Lfm2ForCausalLM", "Lfm2Model"),
    models=(lfm2.Lfm2ForCausalLM, lfm2.Lfm2Model),
    layers={lfm2.Lfm2ShortConv: GatedShortConv, lfm2.Lfm2Attention: _attention},
    # with causal-conv1d installed HF binds its GPU kernels in the conv layer, whose cache does not step
    untraceable=(lfm2.Lfm2ShortConv,),
    rotary=lfm2.Lfm2RotaryEmbedding,
    check=_check,
    layer_types=("conv", "full_attention"),
)

LFM2_MOE = Architecture(
    model_type="lfm2_moe",
    config_class="Lfm2MoeConfig",
    classes=("Lfm2MoeForCausalLM", "Lfm2MoeModel"),
    models=(lfm2_moe.Lfm2MoeForCausalLM, lfm2_moe.Lfm2MoeModel),
    layers={
        lfm2_moe.Lfm2MoeShortConv: GatedShortConv,
        lfm2_moe.Lfm2MoeAttention: _attention,
        lfm2_moe.Lfm2MoeExperts: DenseExperts,
    },
    untraceable=(lfm2_moe.Lfm2MoeShortConv, lfm2_moe.Lfm2MoeExperts),
    rotary=lfm2_moe.Lfm2MoeRotaryEmbedding,
    check=_check,
    layer_types=("conv", "full_attention"),
)
