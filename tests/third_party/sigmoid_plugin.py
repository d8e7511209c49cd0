"""A third-party variant defined outside attnx, registered like any plugin.

Sigmoid attention (Ramapuram et al., 2024): out = sigmoid(q k^T * scale + bias) v,
with bias = -log(n_keys) by default. It exists to prove that a variant written
outside attnx lists, exports and verifies with no change to attnx.
"""

from __future__ import annotations

import dataclasses

import attnx
from attnx.config import Config, require


@dataclasses.dataclass(frozen=True)
class SigmoidConfig(Config):
    bias: float | None = None  # None: -log(n_keys)

    def validate(self) -> None:
        require(self.bias is None or self.bias <= 0, f"sigmoid_test option bias={self.bias} must be <= 0")


VARIANT = attnx.Variant(
    name="sigmoid_test",
    summary="sigmoid attention (test plugin)",
    paper="Theory, Analysis, and Best Practices for Sigmoid Self-Attention (arXiv 2409.04431)",
    config=SigmoidConfig,
    capabilities=attnx.Capabilities(causal=False, cross=True, key_padding_mask=False),
    tolerance=attnx.Tolerance(atol=1e-4, rtol=1e-3),
    impl="tests.third_party.sigmoid_kernel:IMPL",
)


@attnx.hookimpl
def attnx_register_variants() -> list[attnx.Variant]:
    return [VARIANT]
