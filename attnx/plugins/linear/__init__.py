"""``linear``: linear attention with phi(x) = elu(x) + 1 ("Transformers are RNNs").

out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps), in O(N d^2);
the causal form restricts both sums to j <= i and is computed chunk by chunk.
"""

from __future__ import annotations

import dataclasses

from attnx.config import Config, require
from attnx.hookspecs import hookimpl
from attnx.variant import Capabilities, Tolerance, Variant


@dataclasses.dataclass(frozen=True)
class LinearConfig(Config):
    eps: float = 1e-6  # added to the denominator, as in the paper's code
    chunk_size: int = 64  # causal form: positions per chunk (quadratic inside, state across)

    def validate(self) -> None:
        require(self.eps > 0, f"linear option eps={self.eps} must be > 0")
        require(self.chunk_size >= 1, f"linear option chunk_size={self.chunk_size} must be >= 1")


VARIANT = Variant(
    name="linear",
    summary="kernelised linear attention, phi = elu + 1, O(N d^2)",
    paper="Transformers are RNNs (arXiv 2006.16236)",
    config=LinearConfig,
    capabilities=Capabilities(
        causal=True, cross=True, key_padding_mask=True, decode="recurrent", trainable=True
    ),
    tolerance=Tolerance(atol=1e-4, rtol=1e-3),
    impl="attnx.plugins.linear.kernel:IMPL",
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
