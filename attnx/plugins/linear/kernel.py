"""Linear attention (phi = elu + 1): the torch custom op, its ONNX bodies and the module."""

from __future__ import annotations

import onnxscript
import torch
import torch.nn.functional as F
from onnxscript import BOOL, FLOAT
from onnxscript import opset18 as op

from attnx.attention import MultiHeadAttention
from attnx.ops import OPSET, AttentionOp, TargetBodies, VariantImpl, at_least_float32, trainable_op
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
from attnx.plugins.lib.ort import ORT_SINCE
from attnx.plugins.linear.config import LinearConfig
from attnx.plugins.linear.features import LinearEluFeatures
from attnx.plugins.linear.ort import LINEAR_ORT_BODIES
from attnx.plugins.linear.standard import (
    LinearAttentionStandard,
    LinearAttentionStandardNoMask,
    LinearAttentionStepFirstStandard,
    LinearAttentionStepStandard,
)
from attnx.state import StateTensor, recurrent_state
from attnx.variant import AttentionSpec


def elu_features(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0, in float32 (float64 stays float64)."""
    return F.elu(at_least_float32(x)) + 1.0


@trainable_op("attnx::linear_attention")
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


@torch.library.custom_op("attnx::linear_attention_step", mutates_args=())
def linear_attention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_sum: torch.Tensor | None,
    k_sum: torch.Tensor | None,
    eps: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal linear attention of new tokens after the state (S, Z) of earlier ones; returns (out, S', Z')."""
    out, grown_kv, grown_k = kernel_attention_step(
        elu_features(q), elu_features(k), v, kv_sum, k_sum, chunk_size=chunk_size, eps=eps, clamp=False
    )
    return out.to(q.dtype), grown_kv, grown_k


@linear_attention_step.register_fake
def _(q, k, v, kv_sum, k_sum, eps, chunk_size):
    return step_fake(q, v, q.shape[-1])


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


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionStep(
    q: FLOAT, k: FLOAT, v: FLOAT, kv_sum: FLOAT, k_sum: FLOAT, eps: float, chunk_size: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    qf, kf = LinearEluFeatures(q), LinearEluFeatures(k)
    out, grown_kv, grown_k = LinearCoreAttendStep(
        qf, kf, v, kv_sum, k_sum, chunk_size=chunk_size, eps=eps, clamp=0
    )
    return op.CastLike(out, q), grown_kv, grown_k


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionStepFirst(
    q: FLOAT, k: FLOAT, v: FLOAT, eps: float, chunk_size: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    qf, kf = LinearEluFeatures(q), LinearEluFeatures(k)
    out, kv_sum, k_sum = LinearCoreAttendFirst(qf, kf, v, chunk_size=chunk_size, eps=eps, clamp=0)
    return op.CastLike(out, q), kv_sum, k_sum


LINEAR_STEP_OP = AttentionOp(
    name="LinearAttentionStep",
    torch_op=linear_attention_step,
    bodies=(
        LinearAttentionStep,
        LinearAttentionStepFirst,
        LinearAttentionStepStandard,
        LinearAttentionStepFirstStandard,
    ),
    doc="causal elu+1 linear attention of new tokens after the float32 state (kv_sum S, k_sum Z) of "
    "earlier ones (omitted: none); returns the output and the state after the new tokens.",
    input_types=STATE_TYPES,
    output_names=STEP_OUTPUT_NAMES,
    output_types=STATE_TYPES,
    targets={"ort": TargetBodies(LINEAR_ORT_BODIES["LinearAttentionStep"], since=ORT_SINCE)},
)

LINEAR_OP = AttentionOp(
    name="LinearAttention",
    torch_op=linear_attention,
    bodies=(LinearAttention, LinearAttentionNoMask, LinearAttentionStandard, LinearAttentionStandardNoMask),
    input_types={"key_padding_mask": "tensor(bool)"},
    doc="elu+1 linear attention per head; q,k,v (batch, heads, seq, dim); causal is bottom-right aligned.",
    kernel="attnx.plugins.linear.triton_kernel:LINEAR_KERNEL",
    targets={"ort": TargetBodies(LINEAR_ORT_BODIES["LinearAttention"], since=ORT_SINCE)},
)


class LinearAttentionLayer(MultiHeadAttention):
    def __init__(self, config: LinearConfig, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.causal, self.eps, self.chunk_size = spec.causal, config.eps, config.chunk_size

    def attend(self, q, k, v, key_padding_mask):
        return linear_attention(q, k, v, key_padding_mask, self.causal, self.eps, self.chunk_size)

    def decode_state(self) -> list[StateTensor]:
        return recurrent_state(self.spec.n_heads, self.spec.head_dim, self.spec.head_dim, "phi")

    def attend_step(self, q, k, v, state, position):
        out, *grown = linear_attention_step(q, k, v, *(state or (None, None)), self.eps, self.chunk_size)
        return out, tuple(grown)


IMPL = VariantImpl(build=LinearAttentionLayer, ops=(LINEAR_OP,), decode_ops=(LINEAR_STEP_OP,))
