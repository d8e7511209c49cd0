"""The options of the built-in architectures (no torch).

Every architecture shares :class:`TransformerConfig`, including the paper-specific structure
options: ``reversible`` (Reformer RevNet residuals), ``ff_chunks`` (Reformer chunked
feed-forward) and ``share_layers`` (one attention module for every layer, as Fastformer
evaluates). A variant's ``model_defaults`` turn them on for the variant whose paper uses them,
unless the user sets them.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from attnx.config import Config, require


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
