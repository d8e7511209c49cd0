"""Analytical cost of a model forward: FLOPs and a pessimistic working-memory bound.

One function per variant family gives an attention layer's cost (its projections plus
its attention maths) from a :class:`Shape` (bidirectional, causal, or cross-attention
over a context) and the variant's config; :func:`model_cost` assembles the built-in
models (``encoder``, ``lm``, ``seq2seq``) from those terms, the FFN and the output heads.

FLOPs are those of ``torch.utils.flop_counter``: 2 per multiply-add of every product the
implementation runs as a matrix multiplication (``nn.Linear``, matmul/bmm, SDPA; the ONNX
bodies run the same MatMuls), at the shapes it runs them, padding included (the Reformer
pads the sequence to a multiple of its chunk, the chunked causal form to a multiple of
C, the chunked FFN to a multiple of ``ff_chunks``). Element-wise work (LayerNorm,
softmax exponentials, feature maps, masking) and reductions written as multiply + sum
(the linear-attention normaliser phi(q)·sum phi(k), Fastformer's pooled sums) are left
out, as is the embedding gather: a few percent at these sizes, so an achieved FLOP rate
computed from these counts is a slight underestimate. The tests compare the counts with
the counter run on the real models, exactly.

Memory is an upper bound in float32, used to skip cases that cannot fit before running
them: every tensor the attention maths may hold at once (e.g. softmax's scores, biased
scores and probabilities, all (B, H, N, N)) plus the block's activations, times a 1.5
safety factor; layers run one after another, so the largest layer's working set counts
once, plus what outlives the layers (seq2seq's encoder output) or follows them (the
(B, N, vocab) logits, often the largest tensor of an lm). A variant without a cost
function is assumed quadratic like softmax (so long inputs are skipped rather than
risked) and gets no FLOP count.
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
    """One attention call: batch, query length, model width and heads; ``causal``
    self-attention, or cross-attention over ``context`` keys (None: self-attention)."""

    batch: int
    seq: int
    d_model: int
    n_heads: int
    causal: bool = False
    context: int | None = None

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def keys(self) -> int:
        return self.seq if self.context is None else self.context

    @property
    def key_tokens(self) -> int:
        return self.batch * self.keys

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
    flops: int | None  # None: a variant without a cost function
    working_bytes: int  # activation bound, safety factor included (weights not included)


def _linears(s: Shape, queries: int, keys: int = 0) -> int:
    """d_model x d_model projections: ``queries`` of them over the query tokens, ``keys`` over the keys'."""
    return 2 * s.d_model**2 * (queries * s.tokens + keys * s.key_tokens)


def softmax_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """Q, O projections of the queries, K, V of the keys; Q K^T and P V are 2·B·H·N·M·d_h each,
    causal or not (every score is computed, then masked). Scores, biased scores and
    probabilities (B, H, N, M) may be live together, plus the (B, 1, N, M) mask bias."""
    scores = s.batch * s.n_heads * s.seq * s.keys
    working = FLOAT_BYTES * (3 * scores + s.batch * s.seq * s.keys)
    return AttentionCost(_linears(s, 2, 2), 2 * (2 * scores * s.head_dim), working)


def _kernel_cost(s: Shape, config: Mapping[str, Any], features: int) -> AttentionCost:
    """Kernelised linear attention (attnx.plugins._linear_core) with F features per head.

    V carries a ones column (d_h + 1 values: the normaliser comes out of the same products).
    Bidirectional: phi(K)^T V over the keys and phi(Q)(phi(K)^T V) over the queries,
    2·B·H·F·(d_h + 1)·(M + N). Causal: chunks of C = min(chunk_size, N) over the sequence
    padded to P = C·ceil(N/C), per head 2·P·(C·F + C·(d_h + 1) + 2·F·(d_h + 1)) for the in-chunk
    scores and their mix, each chunk's phi(K)^T V and the queries against the earlier
    chunks' sums. Memory: features of Q and K, V and the numerator, and (counted always)
    the chunked form's (B, H, N, C) scores and (B, H, N/C, F, d_h) prefix states."""
    b, h, dh = s.batch, s.n_heads, s.head_dim
    values = dh + 1
    chunk = max(1, min(int(config.get("chunk_size") or 64), s.seq))
    if s.causal:
        padded = chunk * math.ceil(s.seq / chunk)
        maths = 2 * b * h * padded * (chunk * features + chunk * values + 2 * features * values)
    else:
        maths = 2 * b * h * features * values * (s.keys + s.seq)
    live = h * features * (s.tokens + s.key_tokens) + 2 * s.tokens * s.d_model
    chunked = s.tokens * h * chunk + 2 * b * h * math.ceil(s.seq / chunk) * features * dh
    return AttentionCost(_linears(s, 2, 2), maths, FLOAT_BYTES * (live + chunked))


def linear_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """"Transformers are RNNs": phi = elu + 1 keeps d_h features per head."""
    return _kernel_cost(s, config, features=s.head_dim)


def cosformer_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """cosFormer: the sin/cos re-weighting doubles the features to 2·d_h per head."""
    return _kernel_cost(s, config, features=2 * s.head_dim)


def fastformer_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """Q, K (and V unless ``share_qv``) projections and the output transform; each of the
    two additive poolings scores every token with a per-head vector, w·x_i, 2·T·d (its
    softmax-weighted sum and the products q ⊙ k_i, k ⊙ v_i are element-wise).
    Bidirectional self-attention only. Memory: Q, K, V, p, u and the output."""
    projections = 3 if config.get("share_qv") else 4
    return AttentionCost(_linears(s, projections), 2 * 2 * s.tokens * s.d_model,
                         FLOAT_BYTES * 6 * s.tokens * s.d_model)


def reformer_cost(s: Shape, config: Mapping[str, Any]) -> AttentionCost:
    """Shared-QK, V and output projections (self-attention only). The sequence is padded to
    P = C·ceil(N/C) with C = ``chunk_size``; the rotations x R, R (d_h, n_hashes·n_buckets/2)
    per head, are one product 2·B·H·P·d_h·n_hashes·n_buckets/2; per hash round each sorted
    query scores the 2·C keys of its own and the previous chunk, 2·B·H·P·2C·d_h, and mixes
    their values with a ones column for the denominator, 2·B·H·P·2C·(d_h + 1); causal or not
    (the causal window lies inside the same chunks). Memory per round: every (B, H, P, 2C)
    score-shaped tensor (scores, masked and hidden scores, weights, the int64 duplicate
    counts, boolean masks: 10 float-equivalents) and 7 sorted or look-back copies of qk,
    keys and v. Fallbacks are the variant's defaults (2 rounds, 8 buckets, C = 64)."""
    hashes = int(config.get("n_hashes") or 2)
    buckets = int(config.get("n_buckets") or 8)
    chunk = int(config.get("chunk_size") or 64)
    padded = s.batch * chunk * math.ceil(s.seq / chunk)
    h, dh = s.n_heads, s.head_dim
    rotations = 2 * padded * h * dh * hashes * (buckets // 2)
    chunked = 2 * padded * h * 2 * chunk * (2 * dh + 1)
    per_round = padded * (10 * h * 2 * chunk + 7 * s.d_model)
    return AttentionCost(_linears(s, 3), rotations + hashes * chunked, FLOAT_BYTES * hashes * per_round)


Family = Callable[[Shape, Mapping[str, Any]], AttentionCost]
FAMILIES: dict[str, Family] = {
    "softmax": softmax_cost,
    "linear": linear_cost,
    "cosformer": cosformer_cost,
    "fastformer": fastformer_cost,
    "reformer": reformer_cost,
}


@dataclasses.dataclass(frozen=True)
class _Part:
    """FLOPs (None: some attention has no cost function) and working bytes (no safety factor)."""

    flops: int | None
    working: int


# (shape, role) -> the attention's cost; role "self" or "cross" picks the variant
Attend = Callable[[Shape, str], _Part]


def _sum(*terms: int | None) -> int | None:
    return None if None in terms else sum(t for t in terms if t is not None)


def _times(count: int, part: _Part) -> int | None:
    return None if part.flops is None else count * part.flops


def _layer(c: Mapping[str, Any], shape: Shape, attentions: list[_Part]) -> _Part:
    """One layer: its attention branches (self, [cross]) and the FFN, 2·2·B·P·d·d_ff over the
    sequence padded to P = ff_chunks·ceil(N/ff_chunks). Activations: 6·B·N·d (residual, norms,
    projections, branch output) plus the FFN's intermediate, B·ceil(N/ff_chunks)·d_ff (one
    slice at a time), the chunked FFN's padded input, slice outputs and concatenation
    (3·B·P·d), and the reversible residual's second stream (B·N·d)."""
    d, d_ff, chunks = int(c["d_model"]), int(c["d_ff"]), int(c.get("ff_chunks") or 1)
    piece = math.ceil(shape.seq / chunks)
    padded = shape.batch * chunks * piece
    activations = 6 * shape.tokens * d + shape.batch * piece * d_ff
    activations += (3 * padded * d if chunks > 1 else 0) + (shape.tokens * d if c.get("reversible") else 0)
    flops = _sum(*(a.flops for a in attentions), 2 * 2 * padded * d * d_ff)
    return _Part(flops, FLOAT_BYTES * activations + sum(a.working for a in attentions))


def _logits(c: Mapping[str, Any], tokens: int) -> _Part:
    """Tied output projection hidden @ embedding^T, 2·T·d·vocab; live: the (T, vocab) logits,
    the hidden states and their final norm. Counted on top of the largest layer, not instead
    of it: ONNX Runtime's arena keeps the layers' blocks, which a tensor of another shape
    cannot always reuse (a softmax lm at B=4, N=1024, vocab 8000 peaked at about the layer's
    working set plus the logits)."""
    d, vocab = int(c["d_model"]), int(c["vocab_size"])
    return _Part(2 * tokens * d * vocab, FLOAT_BYTES * tokens * (vocab + 2 * d))


def _encoder(c: Mapping[str, Any], shape: Shape, attend: Attend) -> _Part:
    """n_layers x (bidirectional attention + FFN) + the classifier 2·B·d·num_classes on pooled states."""
    layer = _layer(c, shape, [attend(shape, "self")])
    classifier = 2 * shape.batch * shape.d_model * int(c.get("num_classes") or 0)
    return _Part(_sum(_times(int(c["n_layers"]), layer), classifier), layer.working)


def _lm(c: Mapping[str, Any], shape: Shape, attend: Attend) -> _Part:
    """n_layers x (causal attention + FFN) + the tied logits; memory: a layer plus the logits."""
    causal = dataclasses.replace(shape, causal=True)
    layer = _layer(c, causal, [attend(causal, "self")])
    head = _logits(c, shape.tokens)
    return _Part(_sum(_times(int(c["n_layers"]), layer), head.flops), layer.working + head.working)


def _seq2seq(c: Mapping[str, Any], shape: Shape, attend: Attend) -> _Part:
    """Source and target both ``shape.seq`` long: attnx bench gives every sequence axis (src_seq,
    tgt_seq) the same length (attnx.bench.timing.feed_for). n_layers encoder layers (bidirectional
    attention + FFN over the source), n_decoder_layers decoder layers (causal self-attention,
    cross-attention of the cross variant with queries from the target and keys from the source,
    FFN), the tied logits. Memory: the larger of an encoder and a decoder layer, plus the
    encoder output (B, N_src, d) the decoder reads, plus the logits."""
    encoder = _layer(c, shape, [attend(shape, "self")])
    causal = dataclasses.replace(shape, causal=True)
    context = dataclasses.replace(shape, context=shape.seq)
    decoder = _layer(c, causal, [attend(causal, "self"), attend(context, "cross")])
    head = _logits(c, shape.tokens)
    decoder_layers = int(c.get("n_decoder_layers") or c["n_layers"])
    flops = _sum(_times(int(c["n_layers"]), encoder), _times(decoder_layers, decoder), head.flops)
    memory = FLOAT_BYTES * shape.tokens * shape.d_model
    return _Part(flops, max(encoder.working, decoder.working) + memory + head.working)


MODELS: dict[str, Callable[[Mapping[str, Any], Shape, Attend], _Part]] = {
    "encoder": _encoder,
    "lm": _lm,
    "seq2seq": _seq2seq,
}


def model_cost(
    variant: str,
    variant_config: Mapping[str, Any],
    model: str,
    model_config: Mapping[str, Any],
    batch: int,
    seq: int,
    *,
    cross_variant: str | None = None,
    cross_variant_config: Mapping[str, Any] | None = None,
) -> ModelCost | None:
    """Cost of one forward of a built-in model (``encoder``, ``lm``, ``seq2seq``) at ``batch`` x
    ``seq`` tokens; None for another model. ``cross_variant`` (default softmax, as in
    attnx.exporter.assemble) serves seq2seq's cross-attention. ``share_layers`` changes no
    FLOPs (the shared modules run in every layer), only the weights, which are not counted here.
    """
    build = MODELS.get(model)
    if build is None:
        return None
    roles = {"self": (variant, variant_config),
             "cross": (cross_variant or "softmax", cross_variant_config or {})}

    def attend(shape: Shape, role: str) -> _Part:
        name, config = roles[role]
        family = FAMILIES.get(name)
        cost = (family or softmax_cost)(shape, config)
        return _Part(cost.flops if family else None, cost.working_bytes)

    shape = Shape(batch, seq, int(model_config["d_model"]), int(model_config["n_heads"]))
    part = build(model_config, shape, attend)
    return ModelCost(flops=part.flops, working_bytes=int(SAFETY * part.working))
