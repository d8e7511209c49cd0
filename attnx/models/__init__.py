"""Built-in model architectures, registered as an ordinary attnx plugin.

This module stays free of torch: the architectures are imported when built.

* ``encoder``: bidirectional stack, ``hidden_states`` (+ optional pooled classifier ``logits``).
* ``lm``: decoder-only causal language model with a tied output projection.
* ``seq2seq``: encoder-decoder ("Attention Is All You Need"); cross-attention may use
  another variant (``cross_variant``, default softmax).

Options: :mod:`attnx.models.config`; costs: :mod:`attnx.models.cost`.
"""

from __future__ import annotations

from attnx.hookspecs import hookimpl
from attnx.models.config import EncoderConfig, LMConfig, Seq2SeqConfig, TransformerConfig
from attnx.models.cost import encoder_cost, lm_cost, seq2seq_cost, weights_floor
from attnx.models.spec import ModelSpec, TensorSpec

__all__ = [
    "EncoderConfig",
    "LMConfig",
    "ModelSpec",
    "Seq2SeqConfig",
    "TensorSpec",
    "TransformerConfig",
]


ENCODER = ModelSpec(
    name="encoder",
    summary="bidirectional encoder: hidden states (+ optional pooled classifier logits)",
    config=EncoderConfig,
    impl="attnx.models.encoder:Encoder",
    cost=encoder_cost,
    weights=weights_floor,
)
LM = ModelSpec(
    name="lm",
    summary="decoder-only causal language model: next-token logits (tied embedding)",
    config=LMConfig,
    impl="attnx.models.lm:LanguageModel",
    cost=lm_cost,
    weights=weights_floor,
    generates=True,
)
SEQ2SEQ = ModelSpec(
    name="seq2seq",
    summary="encoder-decoder (Vaswani et al.): decoder logits; cross-attention variant selectable",
    config=Seq2SeqConfig,
    impl="attnx.models.seq2seq:Seq2Seq",
    uses_cross_attention=True,
    cost=seq2seq_cost,
    weights=weights_floor,
    generates=True,
)


@hookimpl
def attnx_register_models() -> list[ModelSpec]:
    return [ENCODER, LM, SEQ2SEQ]
