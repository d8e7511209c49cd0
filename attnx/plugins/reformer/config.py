"""The options of the ``reformer`` variant (no torch)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from attnx.config import Config, require


@dataclasses.dataclass(frozen=True)
class ReformerConfig(Config):
    n_hashes: int = 2  # hashing rounds
    n_buckets: int = 8  # buckets per round (even: argmax over [xR, -xR])
    chunk_size: int = 64  # sorted tokens per chunk; each chunk also sees the previous one
    # "paper": same-bucket keys, rounds sorted apart, -log N_ij, strictly causal sorted window;
    # "trax": the authors' trax code and Hugging Face transformers (docs/variants/reformer.md)
    layout: Literal["paper", "trax"] = "paper"
    chunks_before: int = 1  # layout="trax": chunks before a query's own that it sees
    chunks_after: int = 0  # layout="trax": chunks after a query's own that it sees

    def validate(self) -> None:
        require(self.n_hashes >= 1, f"reformer option n_hashes={self.n_hashes} must be >= 1")
        require(
            self.n_buckets >= 2 and self.n_buckets % 2 == 0,
            f"reformer option n_buckets={self.n_buckets} must be an even number >= 2",
        )
        require(self.chunk_size >= 1, f"reformer option chunk_size={self.chunk_size} must be >= 1")
        require(
            self.chunks_before >= 0 and self.chunks_after >= 0,
            f"reformer options chunks_before={self.chunks_before}, chunks_after={self.chunks_after} "
            "must be >= 0",
        )
        require(
            self.layout == "trax" or (self.chunks_before, self.chunks_after) == (1, 0),
            f"reformer layout 'paper' sees its own and the previous chunk; "
            f"chunks_before={self.chunks_before}, chunks_after={self.chunks_after} need layout=trax",
        )
