"""``softmax``: multi-head scaled dot-product attention (Attention Is All You Need).

softmax(Q K^T * scale + mask) V with scale = 1/sqrt(d_head) unless set. Padded keys
get -65504 added to their score (finite and fp16-exact, so a row whose keys are all
padded stays finite: it degrades to unmasked attention); causal masking is bottom-right aligned, so query
i of n attends keys j <= i + (n_keys - n), which also serves cached decoding. Keys and values may have
fewer heads than the queries (grouped-query attention: query head i reads key/value head
i // (heads / kv heads)), in every lowering and the kernel, so a KV cache is read once per group.
"""

from __future__ import annotations

from attnx.hookspecs import hookimpl
from attnx.plugins.softmax.config import SoftmaxConfig
from attnx.plugins.softmax.cost import softmax_cost
from attnx.variant import Capabilities, TestOptions, Tolerance, Variant

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
    cost=softmax_cost,
    testing=TestOptions(bad_options={"scale": -1.0}),
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
