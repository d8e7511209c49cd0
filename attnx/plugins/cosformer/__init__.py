"""``cosformer``: ReLU linear attention with cos re-weighting (cosFormer, arXiv 2202.08791).

Scores relu(q_i)·relu(k_j) cos(pi/2 · (i - j)/M), decomposed with
cos(a - b) = cos a cos b + sin a sin b into linear attention over the features
[relu(x) sin(pi p/2M), relu(x) cos(pi p/2M)] at positions p = 1, 2, ...
M is ``max_len``; when unset, M = max(n_queries, n_keys) per call as in the official
code, which only bidirectional attention allows (a causal model must decode token by
token with one fixed M).
"""

from __future__ import annotations

from attnx.hookspecs import hookimpl
from attnx.plugins.cosformer.config import DEFAULT_CONTEXT, CosformerConfig
from attnx.plugins.cosformer.cost import cosformer_cost
from attnx.variant import Capabilities, TestOptions, Tolerance, Variant

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
    cost=cosformer_cost,
    # A model that generates decodes token by token, which needs one fixed M: its context length.
    decoder_defaults={"max_len": DEFAULT_CONTEXT},
    position_limit_option="max_len",
    # M >= every length the tests use (kit 19, models 33, decode sources n + 2 = 35): a re-weighting past
    # M turns negative and the normaliser ill-conditioned. Small enough that the re-weighting matters.
    testing=TestOptions(options={"max_len": 64}, bad_options={"max_len": 0, "eps": -1.0, "chunk_size": 0}),
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
