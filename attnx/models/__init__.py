"""Built-in model architectures, registered as an ordinary attnx plugin.

This module stays free of torch: the architectures are imported when built.
"""

from __future__ import annotations

import dataclasses

from attnx.config import Config, require
from attnx.hookspecs import hookimpl
from attnx.models.spec import ModelSpec, TensorSpec

__all__ = ["EncoderConfig", "ModelSpec", "TensorSpec"]


@dataclasses.dataclass(frozen=True)
class EncoderConfig(Config):
    """Token embedding + sinusoidal positions, pre-LN blocks, final LayerNorm."""

    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 1024
    attention_mask: bool = True  # add an `attention_mask` (batch, seq) bool input
    num_classes: int = 0  # > 0 adds a mean-pooled classifier head and a `logits` output

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff"):
            value = getattr(self, name)
            require(value > 0, f"encoder option {name}={value} must be > 0")
        require(self.num_classes >= 0, f"encoder option num_classes={self.num_classes} must be >= 0")
        require(
            self.d_model % self.n_heads == 0,
            f"encoder option d_model={self.d_model} must be divisible by n_heads={self.n_heads}",
        )


ENCODER = ModelSpec(
    name="encoder",
    summary="bidirectional encoder: hidden states (+ optional pooled classifier logits)",
    config=EncoderConfig,
    impl="attnx.models.encoder:build",
)


@hookimpl
def attnx_register_models() -> list[ModelSpec]:
    return [ENCODER]
