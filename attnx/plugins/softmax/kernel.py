"""Softmax attention: the torch custom op, its ONNX bodies and the module."""

from __future__ import annotations

import math

import onnxscript
import torch
from onnxscript import BOOL, FLOAT, INT64
from onnxscript import opset18 as op
from onnxscript import opset23 as op23

from attnx.attention import MASKED_SCORE, MultiHeadAttention
from attnx.ops import LIBRARY, OPSET, AttentionOp, AttnxWiden, TargetBodies, VariantImpl, trainable_op
from attnx.plugins.lib.ort import ORT_SINCE
from attnx.plugins.softmax.config import SoftmaxConfig
from attnx.plugins.softmax.ort import (
    SoftmaxOrtFits,
    SoftmaxOrtKernel,
    SoftmaxOrtOneQuery,
    SoftmaxOrtOneQueryKernel,
)
from attnx.state import StateTensor, kv_cache
from attnx.variant import AttentionSpec


def causal_keep(n_queries: int, n_keys: int, device: torch.device) -> torch.Tensor:
    """Bool (n_queries, n_keys): query i sees key j iff j <= i + n_keys - n_queries."""
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(n_keys - n_queries)


NEG_INF = float("-inf")


@trainable_op("attnx::softmax_attention")
def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v; bias: MASKED_SCORE on padded keys, -inf on future keys.

    k and v may have fewer heads than q, a divisor of its heads (grouped-query attention): query head i
    reads key/value head i // (q heads / kv heads), as ``repeat_kv`` lays them out, without the repeat.
    """
    bias = torch.zeros(q.shape[-2], k.shape[-2], dtype=q.dtype, device=q.device)
    if key_padding_mask is not None:
        bias = bias.masked_fill(~key_padding_mask[:, None, None, :], MASKED_SCORE)
    if causal:
        bias = bias.masked_fill(~causal_keep(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    # contiguous, as the fake kernel promises (torch.compile checks the strides)
    grouped = k.shape[-3] != q.shape[-3]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, scale=scale, enable_gqa=grouped
    )
    return out.contiguous()


@softmax_attention.register_fake
def _(q, k, v, key_padding_mask, causal, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxScores(q: FLOAT, k: FLOAT, scale: float) -> FLOAT:
    """q k^T * scale (b, h, n, m), widened to float32: in fp16, MASKED_SCORE plus a score below -16
    overflows to -inf, and a fully padded row becomes NaN. The torch op leaves this to SDPA; the body
    computes the softmax in float32 for every input dtype. With fewer key heads (grouped-query) the
    queries of one key head are one matrix (b, kv heads, group * n, d): each key is read once."""
    scaled = op.Mul(q, op.CastLike(op.Constant(value_float=scale), q))
    grouped = op.Reshape(
        scaled,
        op.Concat(op.Shape(k, start=0, end=2), op.Constant(value_ints=[-1]), op.Shape(q, start=3), axis=0),
    )
    scores = op.MatMul(grouped, op.Transpose(k, perm=[0, 1, 3, 2]))
    return AttnxWiden(
        op.Reshape(scores, op.Concat(op.Shape(q, start=0, end=3), op.Shape(k, start=2, end=3), axis=0))
    )


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxCausalBias(lengths: INT64, pad: FLOAT) -> FLOAT:
    """``pad``, or -inf where key j is in query i's future (j > i + nk - nq), for ``lengths`` = [nq, nk]:
    (nq, nk), or (b, 1, nq, nk) for a (b, 1, 1, nk) ``pad``."""
    offset = op.Squeeze(op.Sub(op.Slice(lengths, [1], [2]), op.Slice(lengths, [0], [1])), [0])
    everywhere = op.ConstantOfShape(lengths, value=onnxscript.ir.tensor([True]))
    future = op.Trilu(everywhere, op.Add(offset, op.Constant(value_int=1)), upper=1)
    return op.Where(future, op.CastLike(op.Constant(value_float=NEG_INF), pad), pad)


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxMix(scores: FLOAT, v: FLOAT) -> FLOAT:
    """softmax(scores) v: the softmax in the scores' type (float32), the product in v's; grouped by value
    head as :func:`SoftmaxScores` groups the queries."""
    weights = op.CastLike(op.Softmax(scores, axis=-1), v)
    grouped = op.Reshape(
        weights,
        op.Concat(
            op.Shape(v, start=0, end=2), op.Constant(value_ints=[-1]), op.Shape(weights, start=3), axis=0
        ),
    )
    return op.Reshape(
        op.MatMul(grouped, v), op.Concat(op.Shape(weights, start=0, end=3), op.Shape(v, start=3), axis=0)
    )


@onnxscript.script(OPSET, default_opset=op)
def SoftmaxAttention(
    q: FLOAT, k: FLOAT, v: FLOAT, key_padding_mask: BOOL, causal: int, scale: float
) -> FLOAT:
    """The causal choice is an ``If`` on a constant, which ONNX Runtime folds: bidirectional calls build
    no (nq, nk) mask and add the key padding bias (b, 1, 1, nk) to the scores as it is."""
    scores = SoftmaxScores(q, k, scale=scale)
    pad = op.Where(
        op.Unsqueeze(key_padding_mask, [1, 2]),
        op.CastLike(op.Constant(value_float=0.0), scores),
        op.CastLike(op.Constant(value_float=MASKED_SCORE), scores),
    )
    if op.Cast(op.Constant(value_int=causal), to=BOOL.dtype):
        biased = op.Add(scores, SoftmaxCausalBias(op.Shape(scores, start=-2), pad))
    else:
        biased = op.Add(scores, pad)
    return SoftmaxMix(biased, v)


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxUnmasked(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    """Softmax attention without key padding, of primitive ops."""
    scores = SoftmaxScores(q, k, scale=scale)
    if op.Cast(op.Constant(value_int=causal), to=BOOL.dtype):
        zero = op.CastLike(op.Constant(value_float=0.0), scores)
        biased = op.Add(scores, SoftmaxCausalBias(op.Shape(scores, start=-2), zero))
    else:
        biased = op.Identity(scores)
    return SoftmaxMix(biased, v)


@onnxscript.script(OPSET, default_opset=op)
def SoftmaxAttentionNoMask(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    return SoftmaxUnmasked(q, k, v, causal=causal, scale=scale)


# From opset 23 the bodies are the standard Attention op (ONNX Runtime's fused CPU/CUDA kernels,
# TensorRT's IAttention), computed in float32 like the bodies above: in fp16 a padded key's score
# MASKED_SCORE + s overflows to -inf, and ORT's kernel returns zeros for a row that sees only such keys,
# where the torch op returns the softmax over its padded keys. The bias is a float mask (the torch op's
# additive -65504/-inf); ORT's kernel refuses a (b, 1, 1, nk) mask ("inconsistent q_sequence_length"),
# so it is (b, 1, nq, nk). Attention's own is_causal is top-left aligned (key j <= i), the torch op's
# bottom-right (j <= i + nk - nq, what cached decoding needs), so causality is in the mask as well.


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxLengths(q: FLOAT, k: FLOAT) -> INT64:
    """[nq, nk] of (b, h, n, d) queries and keys."""
    return op.Concat(op.Shape(q, start=2, end=3), op.Shape(k, start=2, end=3), axis=0)


@onnxscript.script(OPSET, default_opset=op23)
def SoftmaxAttentionStandard(
    q: FLOAT, k: FLOAT, v: FLOAT, key_padding_mask: BOOL, causal: int, scale: float
) -> FLOAT:
    wq, wk, wv = AttnxWiden(q), AttnxWiden(k), AttnxWiden(v)
    pad = op23.Where(
        op23.Unsqueeze(key_padding_mask, [1, 2]),
        op23.CastLike(op23.Constant(value_float=0.0), wq),
        op23.CastLike(op23.Constant(value_float=MASKED_SCORE), wq),
    )
    lengths = SoftmaxLengths(q, k)
    if op23.Cast(op23.Constant(value_int=causal), to=BOOL.dtype):
        bias = SoftmaxCausalBias(lengths, pad)
    else:
        bias = op23.Expand(pad, op23.Concat(op23.Shape(pad, end=2), lengths, axis=0))
    return op23.CastLike(op23.Attention(wq, wk, wv, bias, scale=scale), v)


@onnxscript.script(LIBRARY, default_opset=op23)
def SoftmaxStandardUnmasked(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    """Softmax attention without key padding, on the standard Attention op."""
    wq, wk, wv = AttnxWiden(q), AttnxWiden(k), AttnxWiden(v)
    if op23.Cast(op23.Constant(value_int=causal), to=BOOL.dtype):
        zero = op23.CastLike(op23.Constant(value_float=0.0), wq)
        bias = op23.Unsqueeze(SoftmaxCausalBias(SoftmaxLengths(q, k), zero), [0, 1])
        out = op23.Attention(wq, wk, wv, bias, scale=scale)
    else:
        out = op23.Attention(wq, wk, wv, scale=scale)
    return op23.CastLike(out, v)


@onnxscript.script(OPSET, default_opset=op23)
def SoftmaxAttentionStandardNoMask(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    return SoftmaxStandardUnmasked(q, k, v, causal=causal, scale=scale)


@onnxscript.script(OPSET, default_opset=op)
def SoftmaxAttentionOrtNoMask(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    """The ``ort`` target's body without key padding: ONNX Runtime's GroupQueryAttention kernel for the
    calls without a cache, its MultiHeadAttention for a decode step (:mod:`attnx.plugins.softmax.ort`,
    ``If`` s on the shapes), the portable body for the others. The kernels run in float32, as the
    portable softmax does."""
    if SoftmaxOrtFits(q, k, v, scale=scale):
        wide = SoftmaxOrtKernel(AttnxWiden(q), AttnxWiden(k), AttnxWiden(v), causal=causal, scale=scale)
        out = op.CastLike(wide, v)
    elif SoftmaxOrtOneQuery(q, k, v, scale=scale):
        step = SoftmaxOrtOneQueryKernel(AttnxWiden(q), AttnxWiden(k), AttnxWiden(v), scale=scale)
        out = op.CastLike(step, v)
    else:
        out = SoftmaxUnmasked(q, k, v, causal=causal, scale=scale)
    return out


SOFTMAX_OP = AttentionOp(
    name="SoftmaxAttention",
    torch_op=softmax_attention,
    bodies=(
        SoftmaxAttention,
        SoftmaxAttentionNoMask,
        SoftmaxAttentionStandard,
        SoftmaxAttentionStandardNoMask,
    ),
    input_types={"key_padding_mask": "tensor(bool)"},
    doc="softmax(q k^T * scale + mask) v per head; q,k,v (batch, heads, seq, dim).",
    kernel="attnx.plugins.softmax.triton_kernel:SOFTMAX_KERNEL",
    # key padding keeps the portable bodies: the kernel masks only a right-padded tail
    targets={
        "ort": TargetBodies(
            (SoftmaxAttention, SoftmaxAttentionStandard, SoftmaxAttentionOrtNoMask), since=ORT_SINCE
        )
    },
)


@torch.library.custom_op("attnx::softmax_attention_step", mutates_args=())
def softmax_attention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_key: torch.Tensor | None,
    past_value: torch.Tensor | None,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """New queries against the cached keys/values of earlier tokens and their own (causal: bottom-right
    aligned); returns (out, past_key ++ k, past_value ++ v), the cache after the new tokens."""
    if past_key is not None and past_value is not None:
        k, v = torch.cat((past_key, k), dim=-2), torch.cat((past_value, v), dim=-2)
    else:
        k, v = k.clone(), v.clone()  # a custom op's outputs may not alias its inputs
    return softmax_attention(q, k, v, None, causal, scale), k, v


@softmax_attention_step.register_fake
def _(q, k, v, past_key, past_value, causal, scale):
    length = k.shape[-2] + (0 if past_key is None else past_key.shape[-2])
    keys = k.new_empty((*k.shape[:-2], length, k.shape[-1]))
    return q.new_empty((*q.shape[:-1], v.shape[-1])), keys, v.new_empty((*v.shape[:-2], length, v.shape[-1]))


# The decode step's cache: below opset 23 Concat in the graph, then the primitive body; from 23 the cache
# goes into Attention's past_key/past_value, which appends the new keys/values inside the node and returns
# the grown cache as present_key/present_value. Measured on ONNX Runtime CPU (a one-layer lm, d_model 256,
# 4 heads, one thread, attnx.bench.decode): 4.2-4.4 ms per token at 16384 cached tokens against 5.6-5.8
# for Concat + Attention and 5.7 for the primitive body; the same within noise at 1024-4096 and with two
# threads.


@onnxscript.script(OPSET, default_opset=op)
def SoftmaxAttentionStep(
    q: FLOAT, k: FLOAT, v: FLOAT, past_key: FLOAT, past_value: FLOAT, causal: int, scale: float
) -> tuple[FLOAT, FLOAT, FLOAT]:
    keys, values = op.Concat(past_key, k, axis=2), op.Concat(past_value, v, axis=2)
    return SoftmaxUnmasked(q, keys, values, causal=causal, scale=scale), keys, values


@onnxscript.script(OPSET, default_opset=op)
def SoftmaxAttentionStepFirst(
    q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float
) -> tuple[FLOAT, FLOAT, FLOAT]:
    return SoftmaxUnmasked(q, k, v, causal=causal, scale=scale), op.Identity(k), op.Identity(v)


@onnxscript.script(OPSET, default_opset=op23)
def SoftmaxAttentionStepStandard(
    q: FLOAT, k: FLOAT, v: FLOAT, past_key: FLOAT, past_value: FLOAT, causal: int, scale: float
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """In the inputs' type, unlike the bodies above: widening the cache would copy all of it twice per
    step (ONNX Runtime keeps a Cast that feeds a graph output), and a step needs no widening, as it has
    no padded keys and every query sees at least its own key."""
    zero = op23.CastLike(op23.Constant(value_float=0.0), q)
    total = op23.Add(op23.Shape(past_key, start=2, end=3), op23.Shape(k, start=2, end=3))
    lengths = op23.Concat(op23.Shape(q, start=2, end=3), total, axis=0)
    # one If output (an If with several has them in hash order) and one Attention call
    if op23.Cast(op23.Constant(value_int=causal), to=BOOL.dtype):
        bias = SoftmaxCausalBias(lengths, zero)
    else:
        bias = op23.Expand(zero, lengths)
    mask = op23.Unsqueeze(bias, [0, 1])
    out, keys, values = op23.Attention(q, k, v, mask, past_key, past_value, scale=scale)
    return out, keys, values


@onnxscript.script(OPSET, default_opset=op23)
def SoftmaxAttentionStepStandardFirst(
    q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float
) -> tuple[FLOAT, FLOAT, FLOAT]:
    return SoftmaxStandardUnmasked(q, k, v, causal=causal, scale=scale), op23.Identity(k), op23.Identity(v)


SOFTMAX_STEP_OP = AttentionOp(
    name="SoftmaxAttentionStep",
    torch_op=softmax_attention_step,
    bodies=(
        SoftmaxAttentionStep,
        SoftmaxAttentionStepFirst,
        SoftmaxAttentionStepStandard,
        SoftmaxAttentionStepStandardFirst,
    ),
    doc="softmax attention of new tokens after the cached keys/values of earlier ones (omitted: none), "
    "causal bottom-right aligned; returns the output and the cache with the new tokens appended.",
    output_names=("output", "key", "value"),
)


class SoftmaxAttentionLayer(MultiHeadAttention):
    def __init__(self, config: SoftmaxConfig, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.causal = spec.causal
        self.scale = config.scale if config.scale is not None else 1.0 / math.sqrt(spec.head_dim)

    def attend(self, q, k, v, key_padding_mask):
        return softmax_attention(q, k, v, key_padding_mask, self.causal, self.scale)

    def decode_state(self) -> list[StateTensor]:
        """A kv-cache: keys and values of every earlier token (one more per step)."""
        return kv_cache(self.spec.n_heads, self.spec.head_dim)

    def attend_step(self, q, k, v, state, position):
        """New queries against cached + new keys; the bottom-right causal mask lines them up."""
        out, *cache = softmax_attention_step(q, k, v, *(state or (None, None)), self.causal, self.scale)
        return out, tuple(cache)


IMPL = VariantImpl(build=SoftmaxAttentionLayer, ops=(SOFTMAX_OP,), decode_ops=(SOFTMAX_STEP_OP,))
