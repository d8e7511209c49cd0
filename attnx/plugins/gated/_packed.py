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

Where a call site's dims are static and bound into its body (:class:`attnx.ops.SiteBodies`), the kernels
take the heads as they are instead (:func:`GatedTokensIn`, :func:`GatedTokensOut`): q, k (B, T, hk * dk),
v (B, T, hv * dv), decay (B, T, hv * dg), beta (B, T, hv), and the state (B, hv, dk, dv) exactly as
attnx holds it, so the kernel's new state is the op's output with no copy (a runtime that binds a state's
input and output to one buffer, as onnxruntime-genai does, updates it where it lies). Both kernels give
value head i the q/k head i // (hv / hk), as attnx does.
"""

from __future__ import annotations

import onnxscript
from onnxscript import BOOL, FLOAT, INT64
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
    rate = OrtHeadsToBatch(op.Unsqueeze(beta, [-1]))
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
    out = op.Reshape(out, op.Shape(v), allowzero=1)
    return GatedKernelScaled(out, scale=scale), op.Reshape(final, op.Shape(state))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedKernelEmptyState(q: FLOAT, v: FLOAT) -> FLOAT:
    """Zeros (b, hv, dk, dv) in q's type."""
    shape = op.Concat(op.Shape(v, start=0, end=2), op.Shape(q, start=3), op.Shape(v, start=3), axis=0)
    return op.Expand(op.CastLike(op.Constant(value_float=0.0), q), shape)


@onnxscript.script(LIBRARY, default_opset=op)
def GatedDim(value: int) -> INT64:
    """[value]: an attribute as a one-element shape vector (a constant: a runtime folds it once)."""
    return op.Reshape(op.Constant(value_int=value), op.Constant(value_ints=[1]))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedTokensShape(heads: int, width: int) -> INT64:
    """[0, 0, heads * width]: a (b, n, heads, width) tensor as (b, n, heads * width); 0s, not -1, keep
    n = 0 reshapable."""
    return op.Concat(
        op.Constant(value_ints=[0, 0]), op.Mul(GatedDim(value=heads), GatedDim(value=width)), axis=0
    )


@onnxscript.script(LIBRARY, default_opset=op)
def GatedTokens(x: FLOAT, heads: int, width: int) -> FLOAT:
    """(b, h, n, d) -> (b, n, h * d), token-major with the heads packed."""
    return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), GatedTokensShape(heads=heads, width=width))


@onnxscript.script(LIBRARY, default_opset=op)
def GatedTokensIn(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    delta: int,
    q_heads: int,
    dk: int,
    v_heads: int,
    dv: int,
    dg: int,
) -> tuple[FLOAT, FLOAT, FLOAT, FLOAT, FLOAT]:
    """(b, h, n, d) inputs with their static head counts and widths as the kernels' packed tokens, in
    float32: queries, keys (b, n, hk * dk), values (b, n, hv * dv; times beta for the additive rule),
    decay (b, n, hv * dg), beta (b, n, hv)."""
    q, k, v, g, beta = AttnxWiden(q), AttnxWiden(k), AttnxWiden(v), AttnxWiden(g), AttnxWiden(beta)
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:  # noqa: SIM108 (onnxscript makes an If of an if statement only)
        values = GatedTokens(v, heads=v_heads, width=dv)
    else:
        values = GatedTokens(op.Mul(v, op.Unsqueeze(beta, [-1])), heads=v_heads, width=dv)
    queries = GatedTokens(q, heads=q_heads, width=dk)
    keys = GatedTokens(k, heads=q_heads, width=dk)
    decay = GatedTokens(g, heads=v_heads, width=dg)
    return queries, keys, values, decay, op.Transpose(beta, perm=[0, 2, 1])


@onnxscript.script(LIBRARY, default_opset=op)
def GatedTokensOut(out: FLOAT, scale: float, v_heads: int, dv: int) -> FLOAT:
    """The kernel's packed output (b, n, hv * dv) as attnx's (b, hv, n, dv), in float32."""
    shape = op.Concat(op.Constant(value_ints=[0, 0]), GatedDim(value=v_heads), GatedDim(value=dv), axis=0)
    return GatedKernelScaled(op.Transpose(op.Reshape(out, shape), perm=[0, 2, 1, 3]), scale=scale)
