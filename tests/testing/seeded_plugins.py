"""Plugins with seeded mistakes, for testing that the conformance kit names each one.

Variants of plain causal-capable softmax attention (no padding mask), identical except
for one flaw each:

* ``seeded_sound``: no flaw (the control: every check passes);
* ``seeded_fake``: ``register_fake`` doubles the last dimension;
* ``seeded_scale``: the ONNX body forgets the ``scale`` attribute;
* ``seeded_leak``: causal mode lets query i see key i + 1 (in torch and ONNX alike);
* ``seeded_clash``: an unprefixed ONNX library function named like the softmax variant's;
* ``seeded_upcast``: the ONNX body returns float32 whatever its inputs (fine in fp32 only);
* ``seeded_float32``: the ONNX body widens q with ``Cast(to=FLOAT)`` and scales it by a float32
  literal: right in fp32 and in a native fp16 export, broken once an fp16 converter inlined it.
* ``seeded_grad``: a hand-written backward that drops the softmax Jacobian's second term
  (dS = P * dP instead of P * (dP - rowsum(P * dP))), the classic softmax-backward slip.

Every one declares ``trainable``; all but ``seeded_grad`` get their backward from
``attnx.ops.trainable_op``.
"""

from __future__ import annotations

import dataclasses
import math

import onnxscript
import torch
from onnxscript import BOOL, FLOAT
from onnxscript import opset18 as op

import attnx
from attnx.attention import MultiHeadAttention
from attnx.config import Config
from attnx.ops import LIBRARY, OPSET, AttentionOp, VariantImpl, trainable_op

FLAWS = ("sound", "fake", "scale", "leak", "clash", "upcast", "float32", "grad")
NEG_INF = float("-inf")


def _weights(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, diagonal: int) -> torch.Tensor:
    scores = (q * scale) @ k.transpose(-1, -2)
    if causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool).tril(diagonal)
        scores = scores.masked_fill(~keep, NEG_INF)
    return scores.softmax(-1)


def _define_op(flaw: str) -> object:
    diagonal = 1 if flaw == "leak" else 0
    name = f"attnx_seeded::{flaw}_attention"
    define = torch.library.custom_op(name, mutates_args=()) if flaw == "grad" else trainable_op(name)

    @define
    def attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> torch.Tensor:
        return _weights(q, k, causal, scale, diagonal) @ v

    @attention.register_fake
    def _(q, k, v, causal, scale):
        width = 2 * v.shape[-1] if flaw == "fake" else v.shape[-1]
        return q.new_empty((*q.shape[:-1], width))

    if flaw == "grad":
        attention.register_autograd(_backward_without_the_row_term, setup_context=_save_for_backward)
    return attention


def _save_for_backward(ctx, inputs, output):
    q, k, v, ctx.causal, ctx.scale = inputs
    ctx.save_for_backward(q, k, v)


def _backward_without_the_row_term(ctx, grad):
    q, k, v = ctx.saved_tensors
    weights = _weights(q, k, ctx.causal, ctx.scale, 0)
    scores_grad = weights * (grad @ v.transpose(-1, -2))  # misses "- (weights * that).sum(-1, keepdim=True)"
    q_grad = scores_grad @ k * ctx.scale
    k_grad = scores_grad.transpose(-1, -2) @ q * ctx.scale
    return q_grad, k_grad, weights.transpose(-1, -2) @ grad, None, None


@onnxscript.script(LIBRARY, default_opset=op)
def SeededMix(q: FLOAT, k: FLOAT, v: FLOAT, scale: float, causal: int, diagonal: int) -> FLOAT:
    scaled = op.Mul(q, op.CastLike(op.Constant(value_float=scale), q))
    scores = op.MatMul(scaled, op.Transpose(k, perm=[0, 1, 3, 2]))
    ones = op.ConstantOfShape(op.Shape(scores, start=-2), value=onnxscript.ir.tensor([1.0]))
    kept = op.Cast(op.Trilu(ones, op.Constant(value_int=diagonal), upper=0), to=BOOL.dtype)
    hide = op.And(op.Not(kept), op.Cast(op.Constant(value_int=causal), to=BOOL.dtype))
    return op.MatMul(op.Softmax(op.Where(hide, op.CastLike(NEG_INF, q), scores), axis=-1), v)


@onnxscript.script(LIBRARY, default_opset=op)
def SoftmaxMix(q: FLOAT, k: FLOAT, v: FLOAT, scale: float, causal: int) -> FLOAT:
    """The seeded clash: same maths as the sound body, but the softmax variant's helper name."""
    return SeededMix(q, k, v, scale=scale, causal=causal, diagonal=0)


@onnxscript.script(OPSET, default_opset=op)
def SeededAttention(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    return SeededMix(q, k, v, scale=scale, causal=causal, diagonal=0)


@onnxscript.script(OPSET, default_opset=op)
def SeededAttentionWithoutScale(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    return SeededMix(q, k, v, scale=1.0, causal=causal, diagonal=0)


@onnxscript.script(OPSET, default_opset=op)
def SeededAttentionLeaky(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    return SeededMix(q, k, v, scale=scale, causal=causal, diagonal=1)


@onnxscript.script(OPSET, default_opset=op)
def SeededAttentionClashing(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    return SoftmaxMix(q, k, v, scale=scale, causal=causal)


@onnxscript.script(OPSET, default_opset=op)
def SeededAttentionUpcast(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    return op.Cast(SeededMix(q, k, v, scale=scale, causal=causal, diagonal=0), to=FLOAT.dtype)


@onnxscript.script(OPSET, default_opset=op)
def SeededAttentionFloat32(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, scale: float) -> FLOAT:
    scaled = op.Mul(op.Cast(q, to=FLOAT.dtype), op.Constant(value_float=scale))
    wide = SeededMix(
        scaled, op.Cast(k, to=FLOAT.dtype), op.Cast(v, to=FLOAT.dtype), scale=1.0, causal=causal, diagonal=0
    )
    return op.CastLike(wide, q)


BODIES = {
    "sound": SeededAttention,
    "grad": SeededAttention,
    "fake": SeededAttention,
    "scale": SeededAttentionWithoutScale,
    "leak": SeededAttentionLeaky,
    "clash": SeededAttentionClashing,
    "upcast": SeededAttentionUpcast,
    "float32": SeededAttentionFloat32,
}
OPS = {
    flaw: AttentionOp(
        name=f"Seeded{flaw.capitalize()}Attention", torch_op=_define_op(flaw), bodies=(BODIES[flaw],)
    )
    for flaw in FLAWS
}


class SeededLayer(MultiHeadAttention):
    def __init__(self, flaw: str, spec: attnx.AttentionSpec) -> None:
        super().__init__(spec)
        self.torch_op, self.causal = OPS[flaw].torch_op, spec.causal
        self.scale = 1.0 / math.sqrt(spec.head_dim)

    def attend(self, q, k, v, key_padding_mask):
        return self.torch_op(q, k, v, self.causal, self.scale)


@dataclasses.dataclass(frozen=True)
class SeededConfig(Config):
    pass


def _impl(flaw: str) -> VariantImpl:
    return VariantImpl(build=lambda config, spec: SeededLayer(flaw, spec), ops=(OPS[flaw],))


IMPL_SOUND, IMPL_FAKE, IMPL_SCALE, IMPL_LEAK, IMPL_CLASH, IMPL_UPCAST, IMPL_FLOAT32, IMPL_GRAD = map(
    _impl, FLAWS
)
VARIANTS = {
    flaw: attnx.Variant(
        name=f"seeded_{flaw}",
        summary=f"softmax attention with a seeded mistake: {flaw}",
        paper="none (test plugin)",
        config=SeededConfig,
        capabilities=attnx.Capabilities(causal=True, cross=False, key_padding_mask=False, trainable=True),
        tolerance=attnx.Tolerance(atol=1e-4, rtol=1e-3),
        impl=f"{__name__}:IMPL_{flaw.upper()}",
    )
    for flaw in FLAWS
}


@attnx.hookimpl
def attnx_register_variants() -> list[attnx.Variant]:
    return list(VARIANTS.values())
