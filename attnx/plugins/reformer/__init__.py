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

from attnx.hookspecs import hookimpl
from attnx.plugins.reformer.config import ReformerConfig
from attnx.plugins.reformer.cost import reformer_cost
from attnx.variant import Capabilities, TestOptions, Tolerance, Variant

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
    impl="attnx.plugins.reformer.layer:IMPL",
    cost=reformer_cost,
    model_defaults={"reversible": True, "ff_chunks": 4},  # the paper's RevNet residuals, chunked FFN
    # Chunks of 4, so that short test inputs span several LSH chunks.
    testing=TestOptions(
        options={"chunk_size": 4}, bad_options={"n_hashes": 0, "n_buckets": 3, "chunk_size": 0}
    ),
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
