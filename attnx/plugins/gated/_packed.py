"""The layout that ``LinearAttention`` kernels take, shared by the bodies on ONNX Runtime's
``com.microsoft::LinearAttention`` (:mod:`attnx.plugins.gated._ort`) and on the standard
``LinearAttention`` of opset 27 (:mod:`attnx.plugins.gated._standard`): both have the same inputs
(query, key, value, past_state, decay, beta), attributes and update rules.

Both take packed (B, T, H * D) inputs with the head counts as attributes, which a body cannot take from
the shapes: every value head becomes a batch row (H = 1, q and k repeated to the value heads); decay
(B, T, dg), beta (B, T, 1), the state (B, 1, dk, dv) K-major. Update rule ``gated_delta`` is the delta
rule with a decay (g = 0 is a decay of 1) and ``gated`` the additive rule, which takes no beta, so v is
scaled by beta first. A ``scale`` of 0 means 1/sqrt(dk) to both, so scale = 0 (an all-zero output) is
made explicit. Everything is widened to float32 first (``AttnxWiden``), as the portable body computes.
"""

from __future__ import annotations

import onnxscript
from onnxscript import BOOL, FLOAT
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, AttnxWiden
from attnx.plugins.lib.ort import OrtHeadsToBatch, OrtRepeatHeads


@onnxscript.script(LIBRARY, default_opset=op)
def GatedPackedIn(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, state: FLOAT, delta: int
) -> tuple[FLOAT, FLOAT, FLOAT, FLOAT, FLOAT, FLOAT]:
    """(b, h, n, d) inputs and state (b, hv, dk, dv) as the kernels' rows, in float32: queries, keys
    (b * hv, n, dk), values (b * hv, n, dv; times beta for the additive rule), the state (b * hv, 1, dk,
    dv), decay (b * hv, n, dg), beta (b * hv, n, 1)."""
    q, k, v, g = AttnxWiden(q), AttnxWiden(k), AttnxWiden(v), AttnxWiden(g)
    beta, state = AttnxWiden(beta), AttnxWiden(state)
    queries, keys = OrtHeadsToBatch(OrtRepeatHeads(q, v)), OrtHeadsToBatch(OrtRepeatHeads(k, v))
    rows = op.Reshape(state, op.Concat(op.Constant(value_ints=[-1, 1]), op.Shape(state, start=2), axis=0))
    rate = op.Reshape(
        beta,
        op.Concat(op.Constant(value_ints=[-1]), op.Shape(beta, start=2), op.Constant(value_ints=[1]), axis=0),
    )
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:  # noqa: SIM108 (onnxscript makes an If of an if statement only)
        values = OrtHeadsToBatch(v)
    else:
        values = OrtHeadsToBatch(op.Mul(v, op.Unsqueeze(beta, [-1])))
    return queries, keys, values, rows, OrtHeadsToBatch(g), rate


@onnxscript.script(LIBRARY, default_opset=op)
def GatedKernelScaled(out: FLOAT, scale: float) -> FLOAT:
    """``out``, or zeros when ``scale`` is 0 (the kernels read 0 as 1/sqrt(dk)); an If on a constant."""
    factor = op.CastLike(op.Constant(value_float=scale), out)
    zero = op.Equal(factor, op.CastLike(op.Constant(value_float=0.0), out))
    if zero:  # noqa: SIM108 (onnxscript makes an If of an if statement only)
        result = op.Mul(out, factor)
    else:
        result = op.Identity(out)
    return result


@onnxscript.script(LIBRARY, default_opset=op)
def GatedPackedOut(out: FLOAT, final: FLOAT, v: FLOAT, state: FLOAT, scale: float) -> tuple[FLOAT, FLOAT]:
    """The kernel's rows back to (out (b, hv, n, dv), state' (b, hv, dk, dv)), in float32."""
    return GatedKernelScaled(op.Reshape(out, op.Shape(v)), scale=scale), op.Reshape(final, op.Shape(state))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedKernelEmptyState(q: FLOAT, v: FLOAT) -> FLOAT:
    """Zeros (b, hv, dk, dv) in q's type."""
    shape = op.Concat(op.Shape(v, start=0, end=2), op.Shape(q, start=3), op.Shape(v, start=3), axis=0)
    return op.Expand(op.CastLike(op.Constant(value_float=0.0), q), shape)
