"""Linear attention (phi = elu + 1): the torch custom op, its ONNX bodies and the module."""

from __future__ import annotations

import onnxscript
import torch
import torch.nn.functional as F
from onnxscript import BOOL, FLOAT
from onnxscript import opset18 as op

from attnx.nn import MultiHeadAttention
from attnx.ops import LIBRARY, OPSET, AttentionOp, VariantImpl
from attnx.plugins._linear_core import LinearCoreAttend, LinearCoreMaskKeys, kernel_attention, mask_keys
from attnx.plugins.linear import LinearConfig
from attnx.variant import AttentionSpec


def elu_features(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0, in float32."""
    return F.elu(x.float()) + 1.0


@torch.library.custom_op("attnx::linear_attention", mutates_args=())
def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    eps: float,
    chunk_size: int,
) -> torch.Tensor:
    """phi(q) (phi(k)^T v) / (phi(q) . sum phi(k) + eps); padded keys get phi = 0."""
    kf = mask_keys(elu_features(k), key_padding_mask)
    out = kernel_attention(elu_features(q), kf, v, causal=causal, chunk_size=chunk_size, eps=eps, clamp=False)
    return out.to(q.dtype)


@linear_attention.register_fake
def _(q, k, v, key_padding_mask, causal, eps, chunk_size):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@onnxscript.script(LIBRARY, default_opset=op)
def LinearEluFeatures(x: FLOAT) -> FLOAT:
    return op.Add(op.Elu(op.Cast(x, to=FLOAT.dtype)), op.Constant(value_float=1.0))


@onnxscript.script(OPSET, default_opset=op)
def LinearAttention(
    q: FLOAT, k: FLOAT, v: FLOAT, key_padding_mask: BOOL, causal: int, eps: float, chunk_size: int
) -> FLOAT:
    qf = LinearEluFeatures(q)
    kf = LinearCoreMaskKeys(LinearEluFeatures(k), key_padding_mask)
    out = LinearCoreAttend(qf, kf, v, causal=causal, chunk_size=chunk_size, eps=eps, clamp=0)
    return op.CastLike(out, q)


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionNoMask(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, eps: float, chunk_size: int) -> FLOAT:
    qf = LinearEluFeatures(q)
    kf = LinearEluFeatures(k)
    out = LinearCoreAttend(qf, kf, v, causal=causal, chunk_size=chunk_size, eps=eps, clamp=0)
    return op.CastLike(out, q)


LINEAR_OP = AttentionOp(
    name="LinearAttention",
    torch_op=linear_attention,
    bodies=(LinearAttention, LinearAttentionNoMask),
    input_types={"key_padding_mask": "tensor(bool)"},
    doc="elu+1 linear attention per head; q,k,v (batch, heads, seq, dim); causal is bottom-right aligned.",
)


class LinearAttentionLayer(MultiHeadAttention):
    def __init__(self, config: LinearConfig, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.causal, self.eps, self.chunk_size = spec.causal, config.eps, config.chunk_size

    def attend(self, q, k, v, key_padding_mask):
        return linear_attention(q, k, v, key_padding_mask, self.causal, self.eps, self.chunk_size)


IMPL = VariantImpl(build=LinearAttentionLayer, ops=(LINEAR_OP,))
