"""``softmax``: multi-head scaled dot-product attention (Attention Is All You Need).

softmax(Q K^T * scale + mask) V with scale = 1/sqrt(d_head) unless set. Padded keys
get -65504 added to their score (finite and fp16-exact, so a row whose keys are all
padded stays finite: it degrades to unmasked attention); causal masking is bottom-right aligned, so query
i of n attends keys j <= i + (n_keys - n), which also serves cached decoding.
"""

from __future__ import annotations

import dataclasses

from attnx.config import Config, require
from attnx.hookspecs import hookimpl
from attnx.variant import Capabilities, Tolerance, Variant


@dataclasses.dataclass(frozen=True)
class SoftmaxConfig(Config):
    scale: float | None = None  # None: 1/sqrt(head_dim)

    def validate(self) -> None:
        require(self.scale is None or self.scale > 0, f"softmax option scale={self.scale} must be > 0")


VARIANT = Variant(
    name="softmax",
    summary="scaled dot-product multi-head attention, O(N^2)",
    paper="Attention Is All You Need (arXiv 1706.03762)",
    config=SoftmaxConfig,
    capabilities=Capabilities(
        causal=True, cross=True, key_padding_mask=True, decode="kv-cache", trainable=True
    ),
    tolerance=Tolerance(atol=1e-4, rtol=1e-3),
    impl="attnx.plugins.softmax.kernel:IMPL",
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
