"""Built-in model architectures, registered as an ordinary attnx plugin.

This module stays free of torch: the architectures are imported when built.

* ``encoder``: bidirectional stack, ``hidden_states`` (+ optional pooled classifier ``logits``).
* ``lm``: decoder-only causal language model with a tied output projection.
* ``seq2seq``: encoder-decoder ("Attention Is All You Need"); cross-attention may use
  another variant (``cross_variant``, default softmax).

``build(model, variant, **options)`` (torch, imported on first use) returns one ready to train;
see :mod:`attnx.models.factory`.

Every architecture shares :class:`TransformerConfig`, including the paper-specific
structure options: ``reversible`` (Reformer RevNet residuals), ``ff_chunks`` (Reformer
chunked feed-forward) and ``share_layers`` (one attention module for every layer, as
Fastformer evaluates). :data:`PAPER_ARCHITECTURE` turns them on for the variant whose
paper uses them, unless the user sets them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from attnx.config import Config, require
from attnx.hookspecs import hookimpl
from attnx.models.spec import ModelSpec, TensorSpec

__all__ = [
    "PAPER_ARCHITECTURE",
    "build",
    "EncoderConfig",
    "LMConfig",
    "ModelSpec",
    "Seq2SeqConfig",
    "TensorSpec",
    "TransformerConfig",
]

# Model options each variant's paper pairs it with; applied when the option is not given.
PAPER_ARCHITECTURE: Mapping[str, Mapping[str, Any]] = {
    "reformer": {"reversible": True, "ff_chunks": 4},
    "fastformer": {"share_layers": True},
}


@dataclasses.dataclass(frozen=True)
class TransformerConfig(Config):
    """Options shared by every architecture: token embedding + sinusoidal positions,
    pre-LN layers (attention, FFN), final LayerNorm.

    Attributes:
        reversible: RevNet residuals (Reformer): two streams start as copies of the
            embedding, y1 = x1 + Attention(x2), y2 = x2 + FFN(y1); their mean is normalised.
        ff_chunks: apply the FFN to this many slices of the sequence in turn (Reformer);
            1 = one pass. Position-wise, so the result is the same function.
        share_layers: one attention module (and one cross-attention module) for all
            layers, ALBERT-style (Fastformer's layer-wise sharing); norms and FFNs stay per layer.
    """

    kind: ClassVar[str] = "model"

    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 1024
    reversible: bool = False
    ff_chunks: int = 1
    share_layers: bool = False

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "ff_chunks"):
            value = getattr(self, name)
            require(value > 0, f"{self.kind} option {name}={value} must be > 0")
        require(
            self.d_model % self.n_heads == 0,
            f"{self.kind} option d_model={self.d_model} must be divisible by n_heads={self.n_heads}",
        )

    @property
    def uses_key_padding_mask(self) -> bool:
        """Whether the model passes key padding masks to its attention layers."""
        return False


@dataclasses.dataclass(frozen=True)
class EncoderConfig(TransformerConfig):
    """``encoder``: bidirectional; ``num_classes`` > 0 adds a mean-pooled classifier."""

    kind: ClassVar[str] = "encoder"

    attention_mask: bool = True  # add an `attention_mask` (batch, seq) bool input
    num_classes: int = 0  # > 0 adds a mean-pooled classifier head and a `logits` output

    def validate(self) -> None:
        super().validate()
        require(self.num_classes >= 0, f"encoder option num_classes={self.num_classes} must be >= 0")

    @property
    def uses_key_padding_mask(self) -> bool:
        return self.attention_mask


@dataclasses.dataclass(frozen=True)
class LMConfig(TransformerConfig):
    """``lm``: causal self-attention, logits = hidden @ embedding^T (tied)."""

    kind: ClassVar[str] = "lm"


@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig(TransformerConfig):
    """``seq2seq``: ``n_layers`` encoder layers, ``n_decoder_layers`` decoder layers
    (None: as many as the encoder); one embedding shared by source, target and output."""

    kind: ClassVar[str] = "seq2seq"

    n_decoder_layers: int | None = None

    def validate(self) -> None:
        super().validate()
        layers = self.n_decoder_layers
        require(layers is None or layers > 0, f"seq2seq option n_decoder_layers={layers} must be > 0")

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    @property
    def uses_key_padding_mask(self) -> bool:
        return True


ENCODER = ModelSpec(
    name="encoder",
    summary="bidirectional encoder: hidden states (+ optional pooled classifier logits)",
    config=EncoderConfig,
    impl="attnx.models.encoder:Encoder",
)
LM = ModelSpec(
    name="lm",
    summary="decoder-only causal language model: next-token logits (tied embedding)",
    config=LMConfig,
    impl="attnx.models.lm:LanguageModel",
)
SEQ2SEQ = ModelSpec(
    name="seq2seq",
    summary="encoder-decoder (Vaswani et al.): decoder logits; cross-attention variant selectable",
    config=Seq2SeqConfig,
    impl="attnx.models.seq2seq:Seq2Seq",
    uses_cross_attention=True,
)


@hookimpl
def attnx_register_models() -> list[ModelSpec]:
    return [ENCODER, LM, SEQ2SEQ]


def __getattr__(name: str) -> Any:
    """``build`` from :mod:`attnx.models.factory`, imported on first use (it needs torch)."""
    if name == "build":
        from attnx.models.factory import build

        return build
    raise AttributeError(f"module 'attnx.models' has no attribute '{name}'")
