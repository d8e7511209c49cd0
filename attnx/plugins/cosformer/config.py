"""The options of the ``cosformer`` variant (no torch)."""

from __future__ import annotations

import dataclasses

from attnx.config import Config, require

# M of a model that generates (lm, seq2seq) unless set: its context length. Token-by-token decoding
# needs one fixed M (M = max(n_queries, n_keys) would change with every new token).
DEFAULT_CONTEXT = 2048

@dataclasses.dataclass(frozen=True)
class CosformerConfig(Config):
    max_len: int | None = None  # M of the re-weighting; None: max(n_queries, n_keys) per call
    eps: float = 1e-6  # lower clamp of the denominator, as in the official code
    chunk_size: int = 64  # causal form: positions per chunk (quadratic inside, state across)

    def validate(self) -> None:
        max_len = self.max_len
        require(max_len is None or max_len >= 1, f"cosformer option max_len={max_len} must be >= 1 (or none)")
        require(self.eps > 0, f"cosformer option eps={self.eps} must be > 0")
        require(self.chunk_size >= 1, f"cosformer option chunk_size={self.chunk_size} must be >= 1")
