"""``linear``: linear attention with phi(x) = elu(x) + 1 ("Transformers are RNNs").

out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps), in O(N d^2);
the causal form restricts both sums to j <= i and is computed chunk by chunk.
"""

from __future__ import annotations

from attnx.hookspecs import hookimpl
from attnx.plugins.linear.config import LinearConfig
from attnx.plugins.linear.cost import linear_cost
from attnx.variant import Capabilities, TestOptions, Tolerance, Variant

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
    cost=linear_cost,
    testing=TestOptions(bad_options={"eps": 0.0, "chunk_size": 0}),
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
