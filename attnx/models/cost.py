"""Cost of one forward of the built-in models (no torch): layers, FFN and output heads around the
attention costs that ``attend`` gives (see :mod:`attnx.cost`)."""

from __future__ import annotations

import dataclasses
import math

from attnx.cost import FLOAT_BYTES, Attend, Part, Shape
from attnx.models.config import EncoderConfig, LMConfig, Seq2SeqConfig, TransformerConfig


def _sum(*terms: int | None) -> int | None:
    return None if None in terms else sum(t for t in terms if t is not None)


def _times(count: int, part: Part) -> int | None:
    return None if part.flops is None else count * part.flops


def layer_cost(c: TransformerConfig, shape: Shape, attentions: list[Part]) -> Part:
    """One layer: its attention branches (self, [cross]) and the FFN, 2·2·B·P·d·d_ff over the
    sequence padded to P = ff_chunks·ceil(N/ff_chunks). Activations: 6·B·N·d (residual, norms,
    projections, branch output) plus the FFN's intermediate, B·ceil(N/ff_chunks)·d_ff (one
    slice at a time), the chunked FFN's padded input, slice outputs and concatenation
    (3·B·P·d), and the reversible residual's second stream (B·N·d)."""
    piece = math.ceil(shape.seq / c.ff_chunks)
    padded = shape.batch * c.ff_chunks * piece
    activations = 6 * shape.tokens * c.d_model + shape.batch * piece * c.d_ff
    activations += 3 * padded * c.d_model if c.ff_chunks > 1 else 0
    activations += shape.tokens * c.d_model if c.reversible else 0
    flops = _sum(*(a.flops for a in attentions), 2 * 2 * padded * c.d_model * c.d_ff)
    return Part(flops, FLOAT_BYTES * activations + sum(a.working for a in attentions))


def logits_cost(c: TransformerConfig, tokens: int) -> Part:
    """Tied output projection hidden @ embedding^T, 2·T·d·vocab; live: the (T, vocab) logits twice
    (the runtime's output buffer and the array handed back to the caller), the hidden states and their
    final norm. Counted on top of the largest layer, not instead of it: ONNX Runtime's arena keeps the
    layers' blocks, which a tensor of another shape cannot always reuse (a linear seq2seq at B=4,
    N=1024, vocab 8000 peaked at its layer's working set plus about two logits tensors)."""
    live = tokens * (2 * c.vocab_size + 2 * c.d_model)
    return Part(2 * tokens * c.d_model * c.vocab_size, FLOAT_BYTES * live)


def encoder_cost(c: EncoderConfig, shape: Shape, attend: Attend) -> Part:
    """n_layers x (bidirectional attention + FFN) + the classifier 2·B·d·num_classes on pooled states."""
    layer = layer_cost(c, shape, [attend(shape, "self")])
    classifier = 2 * shape.batch * shape.d_model * c.num_classes
    return Part(_sum(_times(c.n_layers, layer), classifier), layer.working)


def lm_cost(c: LMConfig, shape: Shape, attend: Attend) -> Part:
    """n_layers x (causal attention + FFN) + the tied logits; memory: a layer plus the logits."""
    causal = dataclasses.replace(shape, causal=True)
    layer = layer_cost(c, causal, [attend(causal, "self")])
    head = logits_cost(c, shape.tokens)
    return Part(_sum(_times(c.n_layers, layer), head.flops), layer.working + head.working)


def seq2seq_cost(c: Seq2SeqConfig, shape: Shape, attend: Attend) -> Part:
    """Source and target both ``shape.seq`` long (attnx bench gives every sequence axis the same
    length). n_layers encoder layers (bidirectional attention + FFN over the source),
    n_decoder_layers decoder layers (causal self-attention, cross-attention with queries from the
    target and keys from the source, FFN), the tied logits. Memory: the larger of an encoder and
    a decoder layer, plus the encoder output (B, N_src, d) the decoder reads, plus the logits."""
    encoder = layer_cost(c, shape, [attend(shape, "self")])
    causal = dataclasses.replace(shape, causal=True)
    context = dataclasses.replace(shape, context=shape.seq)
    decoder = layer_cost(c, causal, [attend(causal, "self"), attend(context, "cross")])
    head = logits_cost(c, shape.tokens)
    flops = _sum(_times(c.n_layers, encoder), _times(c.decoder_layers, decoder), head.flops)
    memory = FLOAT_BYTES * shape.tokens * shape.d_model
    return Part(flops, max(encoder.working, decoder.working) + memory + head.working)


def weights_floor(c: TransformerConfig) -> int:
    """Parameters every built-in model of ``c`` has whatever its attention: the token embedding, each
    layer's feed-forward (2·d·d_ff; seq2seq: encoder and decoder layers) and a classifier head."""
    layers = c.n_layers + (c.decoder_layers if isinstance(c, Seq2SeqConfig) else 0)
    head = c.d_model * getattr(c, "num_classes", 0)
    return c.vocab_size * c.d_model + layers * 2 * c.d_model * c.d_ff + head
