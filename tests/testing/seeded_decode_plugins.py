"""Decoding plugins with seeded mistakes, for testing that the conformance kit's ``decode`` check names them.

One layer, in the shape of the gated linear-attention family: a short causal depthwise convolution
over the layer's input (its carry is state, role ``conv``), then plain causal linear attention
o_t = scale * sum_{j<=t} (q_t . k_j) v_j, whose state is S = sum_j k_j v_j^T (role ``recurrent``).
Its ``step(x, state, position)`` is its own (the convolution carry has no way into a q/k/v step). It
attends causally only (``Capabilities(bidirectional=False)``) and decodes (``decode="recurrent"``).

* ``seeded_decode_sound``: no flaw (the control);
* ``seeded_decode_forgets``: the layer's step drops the carried state (right for the first call only);
* ``seeded_decode_onnx``: the ONNX body of the step op with a state forgets it (the torch op is right).

The full forward never calls the step op, so every other check passes on all three.
"""

from __future__ import annotations

import dataclasses
import math

import onnxscript
import torch
from onnxscript import FLOAT
from onnxscript import opset18 as op
from torch import nn

import attnx
from attnx.attention import MultiHeadAttention
from attnx.config import Config
from attnx.ops import LIBRARY, OPSET, AttentionOp, VariantImpl
from attnx.state import StateTensor, conv_state

FLAWS = ("sound", "forgets", "onnx")
KERNEL = 3  # the convolution's width: its carry holds the last 2 inputs


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return ((q @ k.transpose(-1, -2)) * scale).tril() @ v


def _define_ops(flaw: str) -> tuple[object, object]:
    prefix = f"attnx::seeded_decode_{flaw}"  # attnx's namespace: module exports look ops up there

    @torch.library.custom_op(f"{prefix}_running_attention", mutates_args=())
    def running(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return _causal(q, k, v, scale)

    @running.register_fake
    def _(q, k, v, scale):
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    @torch.library.custom_op(f"{prefix}_running_attention_step", mutates_args=())
    def step(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor | None, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = _causal(q, k, v, scale)
        grown = k.transpose(-1, -2) @ v
        if state is not None:
            out, grown = out + scale * (q @ state), grown + state
        return out, grown

    @step.register_fake
    def _(q, k, v, state, scale):
        return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(
            (*k.shape[:-2], k.shape[-1], v.shape[-1])
        )

    return running, step


@onnxscript.script(LIBRARY, default_opset=op)
def SeededDecodeCausal(q: FLOAT, k: FLOAT, v: FLOAT, scale: float) -> FLOAT:
    scaled = op.Mul(q, op.CastLike(op.Constant(value_float=scale), q))
    return op.MatMul(op.Trilu(op.MatMul(scaled, op.Transpose(k, perm=[0, 1, 3, 2])), upper=0), v)


@onnxscript.script(OPSET, default_opset=op)
def SeededRunning(q: FLOAT, k: FLOAT, v: FLOAT, scale: float) -> FLOAT:
    return SeededDecodeCausal(q, k, v, scale=scale)


@onnxscript.script(OPSET, default_opset=op)
def SeededRunningStep(q: FLOAT, k: FLOAT, v: FLOAT, state: FLOAT, scale: float) -> tuple[FLOAT, FLOAT]:
    carried = op.Mul(op.MatMul(q, state), op.CastLike(op.Constant(value_float=scale), q))
    grown = op.Add(state, op.MatMul(op.Transpose(k, perm=[0, 1, 3, 2]), v))
    return op.Add(SeededDecodeCausal(q, k, v, scale=scale), carried), grown


@onnxscript.script(OPSET, default_opset=op)
def SeededRunningStepForgetful(
    q: FLOAT, k: FLOAT, v: FLOAT, state: FLOAT, scale: float
) -> tuple[FLOAT, FLOAT]:
    grown = op.Add(state, op.MatMul(op.Transpose(k, perm=[0, 1, 3, 2]), v))
    return SeededDecodeCausal(q, k, v, scale=scale), grown


@onnxscript.script(OPSET, default_opset=op)
def SeededRunningStepFirst(q: FLOAT, k: FLOAT, v: FLOAT, scale: float) -> tuple[FLOAT, FLOAT]:
    return SeededDecodeCausal(q, k, v, scale=scale), op.MatMul(op.Transpose(k, perm=[0, 1, 3, 2]), v)


def _ops(flaw: str) -> tuple[AttentionOp, AttentionOp]:
    running, step = _define_ops(flaw)
    stepped = SeededRunningStepForgetful if flaw == "onnx" else SeededRunningStep
    name = f"SeededDecode{flaw.capitalize()}"
    return (
        AttentionOp(name=f"{name}Attention", torch_op=running, bodies=(SeededRunning,)),
        AttentionOp(
            name=f"{name}AttentionStep",
            torch_op=step,
            bodies=(stepped, SeededRunningStepFirst),
            output_names=("output", "state"),
            output_types={"state": "tensor(float)"},
        ),
    )


OPS = {flaw: _ops(flaw) for flaw in FLAWS}


class SeededDecodeLayer(MultiHeadAttention):
    """Causal depthwise convolution, then running linear attention; the step carries both."""

    def __init__(self, flaw: str, spec: attnx.AttentionSpec) -> None:
        super().__init__(spec)
        self.flaw, self.scale = flaw, 1.0 / math.sqrt(spec.head_dim)
        self.conv = nn.Conv1d(spec.d_model, spec.d_model, KERNEL, groups=spec.d_model, bias=False)

    def convolve(self, x: torch.Tensor, carry: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The convolution of ``x`` (batch, n, d) after ``carry`` (the last inputs; None: zeros)."""
        if carry is None:
            carry = x.new_zeros(x.shape[0], x.shape[-1], KERNEL - 1)
        inputs = torch.cat((carry, x.transpose(1, 2)), -1)
        return self.conv(inputs).transpose(1, 2), inputs[..., -(KERNEL - 1) :]

    def forward(self, x, context=None, key_padding_mask=None):
        if self.stepping is not None:
            return self.stepped(x)
        return super().forward(self.convolve(x, None)[0], context, key_padding_mask)

    def attend(self, q, k, v, key_padding_mask):
        return OPS[self.flaw][0].torch_op(q, k, v, self.scale)

    def decode_state(self) -> list[StateTensor]:
        heads, d = self.spec.n_heads, self.spec.head_dim
        state = StateTensor("recurrent", ("batch", heads, d, d), "float32", doc="S = sum_j k_j v_j^T")
        return [conv_state(self.spec.d_model, KERNEL), state]

    def step(self, x, state, position):
        carry, recurrent = (None, None) if state is None or self.flaw == "forgets" else state
        h, carry = self.convolve(x, carry)
        y, (recurrent,) = super().step(h, None if recurrent is None else (recurrent,), position)
        return y, (carry, recurrent)

    def attend_step(self, q, k, v, state, position):
        out, grown = OPS[self.flaw][1].torch_op(q, k, v, None if state is None else state[0], self.scale)
        return out, (grown,)


@dataclasses.dataclass(frozen=True)
class SeededDecodeConfig(Config):
    pass


def _impl(flaw: str) -> VariantImpl:
    forward, step = OPS[flaw]
    return VariantImpl(
        build=lambda config, spec: SeededDecodeLayer(flaw, spec), ops=(forward,), decode_ops=(step,)
    )


IMPL_SOUND, IMPL_FORGETS, IMPL_ONNX = map(_impl, FLAWS)
VARIANTS = {
    flaw: attnx.Variant(
        name=f"seeded_decode_{flaw}",
        summary=f"causal conv + running linear attention with a seeded decode mistake: {flaw}",
        paper="none (test plugin)",
        config=SeededDecodeConfig,
        capabilities=attnx.Capabilities(
            causal=True, bidirectional=False, key_padding_mask=False, decode="recurrent", fp16=False
        ),
        tolerance=attnx.Tolerance(atol=1e-4, rtol=1e-3),
        impl=f"{__name__}:IMPL_{flaw.upper()}",
    )
    for flaw in FLAWS
}


@attnx.hookimpl
def attnx_register_variants() -> list[attnx.Variant]:
    return list(VARIANTS.values())
