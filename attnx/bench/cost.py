"""Analytical cost of a model forward: FLOPs and a pessimistic working-memory bound.

One function per variant family gives a layer's attention cost (its projections plus
its attention maths) from the input shape and the variant's config; the encoder adds
the feed-forward network and the classifier.

FLOPs count 2 per multiply-add of every matrix (and matrix-vector) product: the
projections, the FFN and the attention products, the convention of
``torch.utils.flop_counter``. Element-wise work (LayerNorm, softmax exponentials,
feature maps, masking, plain sums) and the embedding gather are left out: a few percent
at these sizes, so an achieved FLOP rate computed from these counts is a slight
underestimate.

Memory is an upper bound in float32, used to skip cases that cannot fit before running
them: every tensor the attention maths may hold at once (e.g. softmax's scores, biased
scores and probabilities, all (B, H, N, N)) plus the block's activations, times a 1.5
safety factor; layers run one after another, so one layer's working set counts once.
A variant without a cost function is assumed quadratic like softmax (so long inputs are
skipped rather than risked) and gets no FLOP count.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

FLOAT_BYTES = 4
SAFETY = 1.5


@dataclasses.dataclass(frozen=True)
class Shape:
    """One self-attention call: batch, sequence length, model width and heads."""

    batch: int
    seq: int
    d_model: int
    n_heads: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclasses.dataclass(frozen=True)
class AttentionCost:
    """One layer: projection FLOPs, attention-maths FLOPs, bytes of the maths' live tensors."""

    projection_flops: int
    maths_flops: int
    working_bytes: int

    @property
    def flops(self) -> int:
        return self.projection_flops + self.maths_flops


@dataclasses.dataclass(frozen=True)
class ModelCost:
    flops: int | None  # None: the variant has no cost function
    working_bytes: int  # activation bound, safety factor included (weights not included)


def _linears(s: Shape, count: int) -> int:
    """``count`` d_model x d_model projections over every token."""
    return count * 2 * s.tokens * s.d_model**2


def softmax_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """Q, K, V, O projections; Q K^T and P V are 2·B·N²·d each. Scores, biased scores and
    probabilities (B, H, N, N) may be live together, plus the (B, 1, N, N) mask bias."""
    scores = s.batch * s.n_heads * s.seq**2
    working = FLOAT_BYTES * (3 * scores + s.batch * s.seq**2)
    return AttentionCost(_linears(s, 4), 2 * (2 * scores * s.head_dim), working)


def _kernel_cost(s: Shape, config: Mapping[str, Any], features: int) -> AttentionCost:
    """Kernelised linear attention with ``features`` F per head and token: phi(K)^T V and
    phi(Q)(phi(K)^T V) are 2·T·H·F·d_h each, the normaliser phi(Q)·sum phi(K) 2·T·H·F.
    Memory: features of Q and K, V and the numerator, and (for a causal model, counted
    always) the chunked form's (B, H, N, C) scores and (B, H, N/C, F, d_h) prefix states."""
    t, h, dh = s.tokens, s.n_heads, s.head_dim
    chunk = max(1, min(int(config.get("chunk_size") or 64), s.seq))
    live = 2 * t * h * features + 2 * t * s.d_model
    chunked = t * h * chunk + 2 * s.batch * h * math.ceil(s.seq / chunk) * features * dh
    maths = 2 * (2 * t * h * features * dh) + 2 * t * h * features
    return AttentionCost(_linears(s, 4), maths, FLOAT_BYTES * (live + chunked))


def linear_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """"Transformers are RNNs": phi = elu + 1 keeps d_h features per head."""
    return _kernel_cost(s, config, features=s.head_dim)


def cosformer_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """cosFormer: the sin/cos re-weighting doubles the features to 2·d_h per head."""
    return _kernel_cost(s, config, features=2 * s.head_dim)


def fastformer_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """Q, K (and V unless ``share_qv``) projections and the output transform; each of the
    two additive poolings costs 2·T·d for the per-head scores w·x_i and 2·T·d for the
    weighted sum (the products q ⊙ k_i and k ⊙ v_i are element-wise). Memory: Q, K, V,
    p, u and the output."""
    projections = 3 if config.get("share_qv") else 4
    return AttentionCost(_linears(s, projections), 2 * (2 + 2) * s.tokens * s.d_model,
                         FLOAT_BYTES * 6 * s.tokens * s.d_model)


def reformer_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """Shared-QK, V and output projections. Per hash round: rotations x R with R
    (d_h, n_buckets/2) per head, and each query attending the 2·C keys of its own and the
    previous chunk (2·2C·d_h for the scores and again for the mix). Memory per round:
    every (B, H, N, 2C) score-shaped tensor (scores, masked and hidden scores, weights, the
    int64 duplicate counts, boolean masks: 10 float-equivalents) and 7 sorted or look-back
    copies of qk, keys and v."""
    hashes = int(config.get("n_hashes") or 1)
    chunk = max(1, min(int(config.get("chunk_size") or config.get("bucket_size") or 64), s.seq))
    buckets = int(config.get("n_buckets") or max(2, 2 * math.ceil(s.seq / chunk)))
    t, h, dh = s.tokens, s.n_heads, s.head_dim
    rotations = 2 * t * h * dh * (buckets // 2)
    chunked = 2 * (2 * t * h * 2 * chunk * dh)
    per_round = t * (10 * h * 2 * chunk + 7 * s.d_model)
    return AttentionCost(_linears(s, 3), hashes * (rotations + chunked), FLOAT_BYTES * hashes * per_round)


FAMILIES: dict[str, Callable[[Shape, Mapping[str, Any]], AttentionCost]] = {
    "softmax": softmax_cost,
    "linear": linear_cost,
    "cosformer": cosformer_cost,
    "fastformer": fastformer_cost,
    "reformer": reformer_cost,
}


def model_cost(
    variant: str,
    variant_config: Mapping[str, Any],
    model: str,
    model_config: Mapping[str, Any],
    batch: int,
    seq: int,
) -> ModelCost | None:
    """Cost of one forward of the ``encoder`` model; None for other models (not modelled).

    Encoder: n_layers x (attention + FFN 2·(2·T·d·d_ff)) + the classifier on pooled states.
    """
    if model != "encoder":
        return None
    c = model_config
    shape = Shape(batch, seq, int(c["d_model"]), int(c["n_heads"]))
    family = FAMILIES.get(variant)
    attention = (family or softmax_cost)(shape, variant_config)
    ffn = 2 * (2 * shape.tokens * shape.d_model * int(c["d_ff"]))
    classifier = 2 * batch * shape.d_model * int(c.get("num_classes") or 0)
    block_activations = FLOAT_BYTES * shape.tokens * (6 * shape.d_model + int(c["d_ff"]))
    return ModelCost(
        flops=int(c["n_layers"]) * (attention.flops + ffn) + classifier if family else None,
        working_bytes=int(SAFETY * (block_activations + attention.working_bytes)),
    )
