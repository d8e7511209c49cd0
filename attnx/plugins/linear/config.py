"""The options of the ``linear`` variant (no torch)."""

from __future__ import annotations

import dataclasses

from attnx.config import Config, require


@dataclasses.dataclass(frozen=True)
class LinearConfig(Config):
    eps: float = 1e-6  # added to the denominator, as in the paper's code
    chunk_size: int = 64  # causal form: positions per chunk (quadratic inside, state across)

    def validate(self) -> None:
        require(self.eps > 0, f"linear option eps={self.eps} must be > 0")
        require(self.chunk_size >= 1, f"linear option chunk_size={self.chunk_size} must be >= 1")
