"""cosFormer attention: position features, the torch custom op, its ONNX bodies and the module."""

from __future__ import annotations

import math

import onnxscript
import torch
from onnxscript import BOOL, FLOAT, INT64
from onnxscript import opset18 as op

from attnx.attention import MultiHeadAttention
from attnx.errors import AttnxError
from attnx.ops import LIBRARY, OPSET, AttentionOp, AttnxWiden, VariantImpl, at_least_float32, trainable_op
from attnx.plugins.cosformer.config import CosformerConfig
from attnx.plugins.lib.linear_core import (
    STATE_TYPES,
    STEP_OUTPUT_NAMES,
    LinearCoreAttend,
    LinearCoreAttendFirst,
    LinearCoreAttendStep,
    LinearCoreMaskKeys,
    kernel_attention,
    kernel_attention_step,
    mask_keys,
    step_fake,
)
from attnx.state import StateTensor, recurrent_state
from attnx.variant import AttentionSpec

HALF_PI = math.pi / 2
CAUSAL_NEEDS_MAX_LEN = "cosformer: causal attention needs a fixed M; set max_len (e.g. --set max_len=4096)"
CROSS_DECODE_NEEDS_MAX_LEN = (
    "cosformer: cross-attention decodes token by token only with a fixed M (unset, M = max(target, source "
    "length) changes with the target's length); set it with --set cross.max_len=4096"
)


def cos_features(x: torch.Tensor, offset: int | torch.Tensor, m: float) -> torch.Tensor:
    """[relu(x) sin(a_p), relu(x) cos(a_p)] in float32 (float64 stays float64), a_p = pi/2 · p/M,
    positions p = offset + 1, ...

    ``offset`` may be an int64 (1,) tensor (the decode position, a graph input).
    """
    x = torch.relu(at_least_float32(x))
    positions = torch.arange(1, x.shape[-2] + 1, device=x.device) + offset
    angle = (positions.to(x.dtype) * HALF_PI / m)[:, None]
    return torch.cat((x * angle.sin(), x * angle.cos()), dim=-1)


@trainable_op("attnx::cosformer_attention")
def cosformer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    max_len: int,
    eps: float,
    chunk_size: int,
) -> torch.Tensor:
    """cosFormer attention; ``max_len`` 0 means M = max(n_queries, n_keys).

    Causal queries sit at the positions of the keys they align with (bottom-right), so
    the last query of a call with fewer queries than keys is the next decoded token.
    """
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    m = float(max_len if max_len > 0 else max(n_queries, n_keys))
    qf = cos_features(q, n_keys - n_queries if causal else 0, m)
    kf = mask_keys(cos_features(k, 0, m), key_padding_mask)
    return kernel_attention(qf, kf, v, causal=causal, chunk_size=chunk_size, eps=eps, clamp=True).to(q.dtype)


@cosformer_attention.register_fake
def _(q, k, v, key_padding_mask, causal, max_len, eps, chunk_size):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.custom_op("attnx::cosformer_attention_step", mutates_args=())
def cosformer_attention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    position: torch.Tensor,
    kv_sum: torch.Tensor | None,
    k_sum: torch.Tensor | None,
    max_len: int,
    eps: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal cosFormer attention of new tokens at positions ``position`` + 1, ... (int64 (1,)).

    The state (S, Z) stacks the sin and cos halves of the features: S = [S_sin; S_cos]
    (b, h, 2d, dv), Z = [Z_sin; Z_cos] (b, h, 2d), the two pairs of the decomposition
    cos(a_i - a_j) = sin a_i sin a_j + cos a_i cos a_j. M = ``max_len`` is fixed (> 0).
    """
    m = float(max_len)
    qf, kf = cos_features(q, position, m), cos_features(k, position, m)
    out, grown_kv, grown_k = kernel_attention_step(
        qf, kf, v, kv_sum, k_sum, chunk_size=chunk_size, eps=eps, clamp=True
    )
    return out.to(q.dtype), grown_kv, grown_k


@cosformer_attention_step.register_fake
def _(q, k, v, position, kv_sum, k_sum, max_len, eps, chunk_size):
    return step_fake(q, v, 2 * q.shape[-1])


@torch.library.custom_op("attnx::cosformer_cross_attention_step", mutates_args=())
def cosformer_cross_attention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    position: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    max_len: int,
    eps: float,
    chunk_size: int,
) -> torch.Tensor:
    """Cross cosFormer attention of target queries at positions ``position`` + 1, ... over all the
    source keys (positions 1..n_k), M = ``max_len`` fixed (> 0): the rows of the full cross op's
    output for those queries, which a one-token decode step cannot get from :func:`cosformer_attention`
    (its bidirectional queries always start at position 1)."""
    m = float(max_len)
    qf, kf = cos_features(q, position, m), mask_keys(cos_features(k, 0, m), key_padding_mask)
    return kernel_attention(qf, kf, v, causal=False, chunk_size=chunk_size, eps=eps, clamp=True).to(q.dtype)


@cosformer_cross_attention_step.register_fake
def _(q, k, v, position, key_padding_mask, max_len, eps, chunk_size):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@onnxscript.script(LIBRARY, default_opset=op)
def CosformerFeatures(x: FLOAT, offset: INT64, m: INT64) -> FLOAT:
    """[relu(x) sin(a_p), relu(x) cos(a_p)] in float32 (b, h, n, 2d): one Mul into a (b, h, n, 2, d) layout,
    a_p = pi/2 · p/M at positions p = offset + 1, ..."""
    one = op.Constant(value_int=1)
    length = op.Squeeze(op.Shape(x, start=2, end=3), [0])
    relu = op.Relu(AttnxWiden(x))
    positions = op.CastLike(op.Add(op.Range(one, op.Add(length, one), one), offset), relu)
    half_pi = op.CastLike(op.Constant(value_float=HALF_PI), relu)
    angle = op.Div(op.Mul(positions, half_pi), op.CastLike(m, relu))
    angle = op.Unsqueeze(angle, [1, 2])
    features = op.Mul(op.Unsqueeze(relu, [3]), op.Concat(op.Sin(angle), op.Cos(angle), axis=1))  # (n, 2, 1)
    return op.Reshape(features, op.Concat(op.Shape(x, end=3), op.Constant(value_ints=[-1]), axis=0))


@onnxscript.script(LIBRARY, default_opset=op)
def CosformerQueryKeyFeatures(q: FLOAT, k: FLOAT, causal: int, max_len: int) -> tuple[FLOAT, FLOAT]:
    n_queries = op.Shape(q, start=2, end=3)
    n_keys = op.Shape(k, start=2, end=3)
    fixed = op.Constant(value_int=max_len)
    dynamic = op.Max(n_queries, n_keys)
    m = op.Where(op.Greater(fixed, op.Constant(value_int=0)), fixed, dynamic)
    offset = op.Mul(op.Sub(n_keys, n_queries), op.Constant(value_int=causal))
    return CosformerFeatures(q, offset, m), CosformerFeatures(k, op.Constant(value_ints=[0]), m)


@onnxscript.script(OPSET, default_opset=op)
def CosformerAttention(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    key_padding_mask: BOOL,
    causal: int,
    max_len: int,
    eps: float,
    chunk_size: int,
) -> FLOAT:
    qf, kf = CosformerQueryKeyFeatures(q, k, causal=causal, max_len=max_len)
    kf = LinearCoreMaskKeys(kf, key_padding_mask)
    out = LinearCoreAttend(qf, kf, v, causal=causal, chunk_size=chunk_size, eps=eps, clamp=1)
    return op.CastLike(out, q)


@onnxscript.script(OPSET, default_opset=op)
def CosformerAttentionNoMask(
    q: FLOAT, k: FLOAT, v: FLOAT, causal: int, max_len: int, eps: float, chunk_size: int
) -> FLOAT:
    qf, kf = CosformerQueryKeyFeatures(q, k, causal=causal, max_len=max_len)
    out = LinearCoreAttend(qf, kf, v, causal=causal, chunk_size=chunk_size, eps=eps, clamp=1)
    return op.CastLike(out, q)


@onnxscript.script(LIBRARY, default_opset=op)
def CosformerStepFeatures(q: FLOAT, k: FLOAT, position: INT64, max_len: int) -> tuple[FLOAT, FLOAT]:
    m = op.Constant(value_int=max_len)
    return CosformerFeatures(q, position, m), CosformerFeatures(k, position, m)


@onnxscript.script(OPSET, default_opset=op)
def CosformerAttentionStep(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    position: INT64,
    kv_sum: FLOAT,
    k_sum: FLOAT,
    max_len: int,
    eps: float,
    chunk_size: int,
) -> tuple[FLOAT, FLOAT, FLOAT]:
    qf, kf = CosformerStepFeatures(q, k, position, max_len=max_len)
    out, grown_kv, grown_k = LinearCoreAttendStep(
        qf, kf, v, kv_sum, k_sum, chunk_size=chunk_size, eps=eps, clamp=1
    )
    return op.CastLike(out, q), grown_kv, grown_k


@onnxscript.script(OPSET, default_opset=op)
def CosformerAttentionStepFirst(
    q: FLOAT, k: FLOAT, v: FLOAT, position: INT64, max_len: int, eps: float, chunk_size: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    qf, kf = CosformerStepFeatures(q, k, position, max_len=max_len)
    out, kv_sum, k_sum = LinearCoreAttendFirst(qf, kf, v, chunk_size=chunk_size, eps=eps, clamp=1)
    return op.CastLike(out, q), kv_sum, k_sum


@onnxscript.script(LIBRARY, default_opset=op)
def CosformerCrossStepFeatures(q: FLOAT, k: FLOAT, position: INT64, max_len: int) -> tuple[FLOAT, FLOAT]:
    m = op.Constant(value_int=max_len)
    return CosformerFeatures(q, position, m), CosformerFeatures(k, op.Constant(value_ints=[0]), m)


@onnxscript.script(OPSET, default_opset=op)
def CosformerCrossAttentionStep(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    position: INT64,
    key_padding_mask: BOOL,
    max_len: int,
    eps: float,
    chunk_size: int,
) -> FLOAT:
    qf, kf = CosformerCrossStepFeatures(q, k, position, max_len=max_len)
    kf = LinearCoreMaskKeys(kf, key_padding_mask)
    out = LinearCoreAttend(qf, kf, v, causal=0, chunk_size=chunk_size, eps=eps, clamp=1)
    return op.CastLike(out, q)


@onnxscript.script(OPSET, default_opset=op)
def CosformerCrossAttentionStepNoMask(
    q: FLOAT, k: FLOAT, v: FLOAT, position: INT64, max_len: int, eps: float, chunk_size: int
) -> FLOAT:
    qf, kf = CosformerCrossStepFeatures(q, k, position, max_len=max_len)
    out = LinearCoreAttend(qf, kf, v, causal=0, chunk_size=chunk_size, eps=eps, clamp=1)
    return op.CastLike(out, q)


COSFORMER_CROSS_STEP_OP = AttentionOp(
    name="CosformerCrossAttentionStep",
    torch_op=cosformer_cross_attention_step,
    bodies=(CosformerCrossAttentionStep, CosformerCrossAttentionStepNoMask),
    input_types={"position": "tensor(int64)", "key_padding_mask": "tensor(bool)"},
    doc="cross cosFormer attention of queries at target positions position+1, ... over every source key "
    "(positions 1..n_k), fixed M = max_len; q,k,v (batch, heads, seq, dim).",
)

COSFORMER_STEP_OP = AttentionOp(
    name="CosformerAttentionStep",
    torch_op=cosformer_attention_step,
    bodies=(CosformerAttentionStep, CosformerAttentionStepFirst),
    input_types={"position": "tensor(int64)", **STATE_TYPES},
    doc="causal cosFormer attention of new tokens at positions position+1, ... after the float32 state "
    "(kv_sum, k_sum: sin and cos halves stacked; omitted: none); returns the output and the next state.",
    output_names=STEP_OUTPUT_NAMES,
    output_types=STATE_TYPES,
)

COSFORMER_OP = AttentionOp(
    name="CosformerAttention",
    torch_op=cosformer_attention,
    bodies=(CosformerAttention, CosformerAttentionNoMask),
    input_types={"key_padding_mask": "tensor(bool)"},
    doc="cosFormer attention per head; q,k,v (batch, heads, seq, dim); max_len 0: M = max(n_q, n_k).",
    kernel="attnx.plugins.cosformer.triton_kernel:COSFORMER_KERNEL",
)


class CosformerAttentionLayer(MultiHeadAttention):
    def __init__(self, config: CosformerConfig, spec: AttentionSpec) -> None:
        if spec.causal and config.max_len is None:
            raise AttnxError(CAUSAL_NEEDS_MAX_LEN)
        super().__init__(spec)
        self.causal, self.max_len = spec.causal, config.max_len or 0
        self.eps, self.chunk_size = config.eps, config.chunk_size

    def attend(self, q, k, v, key_padding_mask):
        args = (self.causal, self.max_len, self.eps, self.chunk_size)
        return cosformer_attention(q, k, v, key_padding_mask, *args)

    def decode_state(self) -> list[StateTensor]:
        d = self.spec.head_dim
        return recurrent_state(self.spec.n_heads, 2 * d, d, "[relu sin, relu cos]")

    def attend_step(self, q, k, v, state, position):
        args = (self.max_len, self.eps, self.chunk_size)
        out, *grown = cosformer_attention_step(q, k, v, position, *(state or (None, None)), *args)
        return out, tuple(grown)

    def attend_cross_step(self, q, k, v, key_padding_mask, position):
        """Cross-attention of target queries from ``position`` on: the re-weighting needs their
        place in the target, and a fixed M (with M = max(n_target, n_source) every earlier logit
        would change with the target's length)."""
        if not self.max_len:
            raise AttnxError(CROSS_DECODE_NEEDS_MAX_LEN)
        args = (self.max_len, self.eps, self.chunk_size)
        return cosformer_cross_attention_step(q, k, v, position, key_padding_mask, *args)


IMPL = VariantImpl(
    build=CosformerAttentionLayer,
    ops=(COSFORMER_OP,),
    decode_ops=(COSFORMER_STEP_OP, COSFORMER_CROSS_STEP_OP),
)
