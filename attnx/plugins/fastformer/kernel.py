"""Fastformer additive attention: the torch custom op, its ONNX bodies and the layer.

The op ``attnx::FastformerAttention`` takes per-head q, k, v (batch, heads, n, d), the
per-head scoring vectors w_q, w_k (heads, d) and an optional key padding mask, and
returns u (batch, heads, n, d); the ``transform`` Linear and the ``+ Q`` residual stay
in torch around it.

Choices against the official code (github.com/wuch15/Fastformer), following the paper:

* ``query_att``/``key_att`` there are one Linear(H·d -> H) each, so a head's score
  mixes every head's features; the paper scores head h with its own w ∈ R^d, so w_q
  and w_k are (heads, d) parameters. Their biases are dropped: a per-head constant
  added to every token's score does not change the softmax.
* Padded tokens' scores are replaced by ``MASKED_SCORE`` (the official code adds
  -10000), so they get exactly zero weight and a fully padded row pools uniformly
  instead of overflowing.
* The official layer feeds ``transform(u) + Q`` to a BertSelfOutput (another dense,
  residual and LayerNorm); in attnx the model's block supplies residual and norm.

No causal form: stable prefix poolings need a running max (a scan), which a CumSum-only
ONNX graph cannot express without underflow or future-dependent rounding; see
docs/variants/fastformer.md.
"""

from __future__ import annotations

import math

import onnxscript
import torch
from onnxscript import BOOL, FLOAT
from onnxscript import opset18 as op
from torch import nn

from attnx.attention import MASKED_SCORE, merge_heads, split_heads
from attnx.ops import LIBRARY, OPSET, AttentionOp, VariantImpl, trainable_op
from attnx.plugins.fastformer.config import FastformerConfig
from attnx.variant import AttentionSpec


def additive_pool(
    x: torch.Tensor, w: torch.Tensor, key_padding_mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """sum_i softmax_i(w_h · x_i * scale) x_i per head: (b, h, n, d) -> (b, h, 1, d)."""
    scores = (x @ w.unsqueeze(-1)) * scale
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, :, None], MASKED_SCORE)
    return (scores.softmax(dim=-2) * x).sum(dim=-2, keepdim=True)


@trainable_op("attnx::fastformer_attention")
def fastformer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """u_i = k_global ⊙ v_i with k_global pooled from p_i = q_global ⊙ k_i, q_global pooled from q."""
    global_query = additive_pool(q, w_q, key_padding_mask, scale)
    global_key = additive_pool(global_query * k, w_k, key_padding_mask, scale)
    return global_key * v


@fastformer_attention.register_fake
def _(q, k, v, w_q, w_k, key_padding_mask, scale):
    return torch.empty_like(v)


@onnxscript.script(LIBRARY, default_opset=op)
def FastformerScores(x: FLOAT, w: FLOAT, scale: float) -> FLOAT:
    """(b, h, 1, n): w_h · x_i * scale, the tokens along the last axis (ONNX Runtime's element-wise
    kernels and Softmax are far slower over an (n, 1) layout)."""
    row = op.Concat(op.Shape(x, end=2), op.Constant(value_ints=[1, -1]), axis=0)
    scores = op.Reshape(op.MatMul(x, op.Unsqueeze(w, [-1])), row)
    return op.Mul(scores, op.CastLike(op.Constant(value_float=scale), x))


@onnxscript.script(LIBRARY, default_opset=op)
def FastformerMaskScores(scores: FLOAT, key_padding_mask: BOOL) -> FLOAT:
    keep = op.Unsqueeze(key_padding_mask, [1, 2])
    return op.Where(keep, scores, op.CastLike(MASKED_SCORE, scores))


@onnxscript.script(LIBRARY, default_opset=op)
def FastformerPool(x: FLOAT, scores: FLOAT) -> FLOAT:
    """(b, h, 1, d): sum_i softmax_i(scores) x_i, as one product (b, h, 1, n) @ (b, h, n, d)."""
    return op.MatMul(op.Softmax(scores, axis=-1), x)


@onnxscript.script(OPSET, default_opset=op)
def FastformerAttention(
    q: FLOAT, k: FLOAT, v: FLOAT, w_q: FLOAT, w_k: FLOAT, key_padding_mask: BOOL, scale: float
) -> FLOAT:
    query_scores = FastformerMaskScores(FastformerScores(q, w_q, scale=scale), key_padding_mask)
    p = op.Mul(FastformerPool(q, query_scores), k)
    key_scores = FastformerMaskScores(FastformerScores(p, w_k, scale=scale), key_padding_mask)
    return op.Mul(FastformerPool(p, key_scores), v)


@onnxscript.script(OPSET, default_opset=op)
def FastformerAttentionNoMask(q: FLOAT, k: FLOAT, v: FLOAT, w_q: FLOAT, w_k: FLOAT, scale: float) -> FLOAT:
    p = op.Mul(FastformerPool(q, FastformerScores(q, w_q, scale=scale)), k)
    return op.Mul(FastformerPool(p, FastformerScores(p, w_k, scale=scale)), v)


FASTFORMER_OP = AttentionOp(
    name="FastformerAttention",
    torch_op=fastformer_attention,
    bodies=(FastformerAttention, FastformerAttentionNoMask),
    input_types={"key_padding_mask": "tensor(bool)"},
    doc="Fastformer additive attention per head: u_i = k_global * v_i; q,k,v (batch, heads, seq, dim), "
    "w_q,w_k (heads, dim).",
    kernel="attnx.plugins.fastformer.triton_kernel:FASTFORMER_KERNEL",
)


class FastformerAttentionLayer(nn.Module):
    """Q, K (and V unless ``share_qv``) projections, the op, then ``transform(u) + Q``.

    ``w_q``/``w_k`` start like an ``nn.Linear(d_head, 1)`` weight: U(-1/sqrt(d), 1/sqrt(d)).
    """

    def __init__(self, config: FastformerConfig, spec: AttentionSpec) -> None:
        super().__init__()
        self.spec = spec
        d, heads, head_dim = spec.d_model, spec.n_heads, spec.head_dim
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = None if config.share_qv else nn.Linear(d, d)
        bound = 1.0 / math.sqrt(head_dim)
        self.w_q = nn.Parameter(torch.empty(heads, head_dim).uniform_(-bound, bound))
        self.w_k = nn.Parameter(torch.empty(heads, head_dim).uniform_(-bound, bound))
        self.transform = nn.Linear(d, d)
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if context is not None:
            raise ValueError("fastformer attention has no cross-attention form")
        heads = self.spec.n_heads
        queries = self.q_proj(x)
        q = split_heads(queries, heads)
        k = split_heads(self.k_proj(x), heads)
        v = q if self.v_proj is None else split_heads(self.v_proj(x), heads)
        u = fastformer_attention(q, k, v, self.w_q, self.w_k, key_padding_mask, self.scale)
        return self.transform(merge_heads(u)) + queries


IMPL = VariantImpl(build=FastformerAttentionLayer, ops=(FASTFORMER_OP,))
