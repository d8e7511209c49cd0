"""The options of the ``reformer`` variant (no torch)."""

from __future__ import annotations

import dataclasses

from attnx.config import Config, require


@dataclasses.dataclass(frozen=True)
class ReformerConfig(Config):
    n_hashes: int = 2  # hashing rounds
    n_buckets: int = 8  # buckets per round (even: argmax over [xR, -xR])
    chunk_size: int = 64  # sorted tokens per chunk; each chunk also sees the previous one

    def validate(self) -> None:
        require(self.n_hashes >= 1, f"reformer option n_hashes={self.n_hashes} must be >= 1")
        require(
            self.n_buckets >= 2 and self.n_buckets % 2 == 0,
            f"reformer option n_buckets={self.n_buckets} must be an even number >= 2",
        )
        require(self.chunk_size >= 1, f"reformer option chunk_size={self.chunk_size} must be >= 1")
