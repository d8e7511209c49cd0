"""Torch and ONNX side of the sigmoid test variant."""

from __future__ import annotations

import math

import onnxscript
import torch
from onnxscript import FLOAT
from onnxscript import opset18 as op

from attnx.attention import MultiHeadAttention
from attnx.ops import OPSET, AttentionOp, VariantImpl


@torch.library.custom_op("attnx_test::sigmoid_attention", mutates_args=())
def sigmoid_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, bias: float
) -> torch.Tensor:
    bias = -math.log(k.shape[-2]) if math.isnan(bias) else bias
    return torch.sigmoid(q @ k.transpose(-1, -2) * scale + bias) @ v


@sigmoid_attention.register_fake
def _(q, k, v, scale, bias):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@onnxscript.script(OPSET, default_opset=op)
def SigmoidTestAttention(q: FLOAT, k: FLOAT, v: FLOAT, scale: float, bias: float) -> FLOAT:
    scores = op.Mul(op.MatMul(q, op.Transpose(k, perm=[0, 1, 3, 2])), op.CastLike(scale, q))
    n_keys = op.CastLike(op.Shape(k, start=-2, end=-1), q)
    given = op.CastLike(op.Constant(value_float=bias), q)
    offset = op.Where(op.IsNaN(given), op.Neg(op.Log(n_keys)), given)
    return op.MatMul(op.Sigmoid(op.Add(scores, offset)), v)


SIGMOID_OP = AttentionOp(
    name="SigmoidTestAttention", torch_op=sigmoid_attention, bodies=(SigmoidTestAttention,)
)


class SigmoidLayer(MultiHeadAttention):
    def __init__(self, config, spec) -> None:
        super().__init__(spec)
        self.bias = math.nan if config.bias is None else config.bias
        self.scale = 1.0 / math.sqrt(spec.head_dim)

    def attend(self, q, k, v, key_padding_mask):
        return sigmoid_attention(q, k, v, self.scale, self.bias)


IMPL = VariantImpl(build=SigmoidLayer, ops=(SIGMOID_OP,))
