"""The options of the ``softmax`` variant (no torch)."""

from __future__ import annotations

import dataclasses

from attnx.config import Config, require


@dataclasses.dataclass(frozen=True)
class SoftmaxConfig(Config):
    scale: float | None = None  # None: 1/sqrt(head_dim)

    def validate(self) -> None:
        require(self.scale is None or self.scale > 0, f"softmax option scale={self.scale} must be > 0")
