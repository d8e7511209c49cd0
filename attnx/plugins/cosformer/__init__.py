"""``cosformer``: ReLU linear attention with cos re-weighting (cosFormer, arXiv 2202.08791).

Scores relu(q_i)·relu(k_j) cos(pi/2 · (i - j)/M), decomposed with
cos(a - b) = cos a cos b + sin a sin b into linear attention over the features
[relu(x) sin(pi p/2M), relu(x) cos(pi p/2M)] at positions p = 1, 2, ...
M is ``max_len``; when unset, M = max(n_queries, n_keys) per call as in the official
code, which only bidirectional attention allows (a causal model must decode token by
token with one fixed M).
"""

from __future__ import annotations

import dataclasses

from attnx.config import Config, require
from attnx.hookspecs import hookimpl
from attnx.variant import Capabilities, Tolerance, Variant


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


VARIANT = Variant(
    name="cosformer",
    summary="ReLU linear attention with cos(pi/2·(i-j)/M) re-weighting, O(N d^2)",
    paper="cosFormer: Rethinking Softmax in Attention (arXiv 2202.08791)",
    config=CosformerConfig,
    capabilities=Capabilities(
        causal=True, cross=True, key_padding_mask=True, decode="recurrent", trainable=True
    ),
    tolerance=Tolerance(atol=1e-4, rtol=1e-3),
    impl="attnx.plugins.cosformer.kernel:IMPL",
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
