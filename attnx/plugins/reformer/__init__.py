"""``reformer``: shared-QK angular-LSH attention (Reformer, arXiv 2001.04451).

Queries are one projection of x; keys are those vectors L2-normalised per head.
Each of ``n_hashes`` rounds hashes them with fixed random rotations into
``n_buckets`` buckets, sorts by (bucket, position), and lets every query attend to
the same-bucket keys of its own and the previous chunk of ``chunk_size`` sorted
tokens (never itself unless nothing else is visible). Causal: the same-bucket keys
among its ``chunk_size`` sorted predecessors, which, unlike the paper's chunks, no
later token can change. Rounds are combined with logsumexp weights. See
docs/variants/reformer.md for the choices vs public code.
"""

from __future__ import annotations

import dataclasses

from attnx.config import Config, require
from attnx.hookspecs import hookimpl
from attnx.variant import Capabilities, Tolerance, Variant


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


VARIANT = Variant(
    name="reformer",
    summary="shared-QK LSH attention: hash, sort, attend within chunks, O(N log N)",
    paper="Reformer: The Efficient Transformer (arXiv 2001.04451)",
    config=ReformerConfig,
    # fp32 only: a token whose hash projections nearly tie changes bucket under fp16 rounding, and
    # torch and ONNX Runtime round differently; at d_model 256, 4 layers, 2-3% of tokens then differ
    # by up to 0.3 (docs/variants/reformer.md).
    capabilities=Capabilities(
        causal=True, cross=False, key_padding_mask=True, decode=None, fp16=False, trainable=True
    ),
    tolerance=Tolerance(atol=1e-4, rtol=1e-3),
    impl="attnx.plugins.reformer.kernel:IMPL",
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
