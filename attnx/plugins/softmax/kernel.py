"""Softmax attention: the torch custom op, its ONNX bodies and the module."""

from __future__ import annotations

import math

import onnxscript
import torch
from onnxscript import BOOL, FLOAT
from onnxscript import opset18 as op

from attnx.attention import MASKED_SCORE, MultiHeadAttention
from attnx.ops import LIBRARY, OPSET, AttentionOp, AttnxWiden, VariantImpl, trainable_op
from attnx.plugins.softmax.config import SoftmaxConfig
from attnx.state import GROWING, StateTensor
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
    """softmax(q k^T * scale + bias) v; bias: MASKED_SCORE on padded keys, -inf on future keys."""
    bias = torch.zeros(q.shape[-2], k.shape[-2], dtype=q.dtype, device=q.device)
    if key_padding_mask is not None:
        bias = bias.masked_fill(~key_padding_mask[:, None, None, :], MASKED_SCORE)
    if causal:
        bias = bias.masked_fill(~causal_keep(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    # contiguous, as the fake kernel promises (torch.compile checks the strides)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale).contiguous()


@softmax_attention.register_fake
def _(q, k, v, key_padding_mask, causal, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxScores(q: FLOAT, k: FLOAT, scale: float) -> FLOAT:
    """q k^T * scale, widened to float32: in fp16, MASKED_SCORE plus a score below -16 overflows to -inf,
    and a fully padded row becomes NaN. The torch op leaves this to SDPA; the body computes the
    softmax in float32 for every input dtype."""
    scaled = op.Mul(q, op.CastLike(op.Constant(value_float=scale), q))
    return AttnxWiden(op.MatMul(scaled, op.Transpose(k, perm=[0, 1, 3, 2])))


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxCausalBias(scores: FLOAT, pad: FLOAT) -> FLOAT:
    """``pad``, or -inf where key j is in query i's future (j > i + nk - nq): (nq, nk) or (b, 1, nq, nk)."""
    shape = op.Shape(scores, start=-2)
    offset = op.Squeeze(op.Sub(op.Slice(shape, [1], [2]), op.Slice(shape, [0], [1])), [0])
    everywhere = op.ConstantOfShape(shape, value=onnxscript.ir.tensor([True]))
    future = op.Trilu(everywhere, op.Add(offset, op.Constant(value_int=1)), upper=1)
    return op.Where(future, op.CastLike(op.Constant(value_float=NEG_INF), scores), pad)


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxMix(scores: FLOAT, v: FLOAT) -> FLOAT:
    """softmax(scores) v: the softmax in the scores' type (float32), the product in v's."""
    return op.MatMul(op.CastLike(op.Softmax(scores, axis=-1), v), v)


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
        biased = op.Add(scores, SoftmaxCausalBias(scores, pad))
    else:
        biased = op.Add(scores, pad)
    return SoftmaxMix(biased, v)


@onnxscript.script(OPSET, default_opset=op)
def SoftmaxAttentionNoMask(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    scores = SoftmaxScores(q, k, scale=scale)
    if op.Cast(op.Constant(value_int=causal), to=BOOL.dtype):
        zero = op.CastLike(op.Constant(value_float=0.0), scores)
        biased = op.Add(scores, SoftmaxCausalBias(scores, zero))
    else:
        biased = op.Identity(scores)
    return SoftmaxMix(biased, v)


SOFTMAX_OP = AttentionOp(
    name="SoftmaxAttention",
    torch_op=softmax_attention,
    bodies=(SoftmaxAttention, SoftmaxAttentionNoMask),
    input_types={"key_padding_mask": "tensor(bool)"},
    doc="softmax(q k^T * scale + mask) v per head; q,k,v (batch, heads, seq, dim).",
    kernel="attnx.plugins.softmax.triton_kernel:SOFTMAX_KERNEL",
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
        axes = ("batch", self.spec.n_heads, GROWING, self.spec.head_dim)
        return [StateTensor("key", axes, doc="keys of earlier tokens"),
                StateTensor("value", axes, doc="values of earlier tokens")]

    def attend_step(self, q, k, v, state, position):
        """New queries against cached + new keys; the bottom-right causal mask lines them up."""
        if state is not None:
            k, v = torch.cat((state[0], k), dim=-2), torch.cat((state[1], v), dim=-2)
        return softmax_attention(q, k, v, None, self.causal, self.scale), (k, v)


IMPL = VariantImpl(build=SoftmaxAttentionLayer, ops=(SOFTMAX_OP,))
