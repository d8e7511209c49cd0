"""``attnx::GatedDeltaRule(Step)`` on the standard ``LinearAttention`` of ONNX opset 27: the bodies a model
at ``--opset 27`` holds (:meth:`attnx.ops.AttentionOp.body_for` takes the newest body the model's opset
allows), so its linear-attention layers need no vendor domain.

The standard op has the inputs, attributes and update rules of ``com.microsoft::LinearAttention`` and
is driven in the same layout (:mod:`attnx.plugins.gated._packed`: every value head a batch row, so any
grouping of q/k heads over value heads fits, and a decay per head or per key dimension). Its rule
``gated_delta`` is the delta rule, ``gated`` the additive one; ``linear`` and ``delta`` (no decay input)
are not used, as attnx's op always has a log-decay input. Everything runs in float32 (the op allows a
float16 T; attnx's state is float32 whatever the activations).

ONNX Runtime 1.32 has no kernel of its own for it: it expands onnx's function body of the op, a ``Scan``
over the tokens (docs/variants/gated.md has the cost).
"""

from __future__ import annotations

import onnxscript
from onnxscript import BOOL, FLOAT
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, OPSET
from attnx.plugins.gated._packed import GatedKernelEmptyState, GatedPackedIn, GatedPackedOut
from attnx.plugins.lib.standard import STANDARD


@onnxscript.script(LIBRARY, default_opset=STANDARD)
def GatedStandardDelta(
    q: FLOAT, k: FLOAT, v: FLOAT, state: FLOAT, g: FLOAT, beta: FLOAT, scale: float, chunk_size: int
) -> tuple[FLOAT, FLOAT]:
    out, final = STANDARD.LinearAttention(
        q,
        k,
        v,
        state,
        g,
        beta,
        q_num_heads=1,
        kv_num_heads=1,
        update_rule="gated_delta",
        scale=scale,
        chunk_size=chunk_size,
    )
    return out, final


@onnxscript.script(LIBRARY, default_opset=STANDARD)
def GatedStandardAdditive(
    q: FLOAT, k: FLOAT, v: FLOAT, state: FLOAT, g: FLOAT, scale: float, chunk_size: int
) -> tuple[FLOAT, FLOAT]:
    out, final = STANDARD.LinearAttention(
        q,
        k,
        v,
        state,
        g,
        q_num_heads=1,
        kv_num_heads=1,
        update_rule="gated",
        scale=scale,
        chunk_size=chunk_size,
    )
    return out, final


@onnxscript.script(LIBRARY, default_opset=op)
def GatedStandardCore(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    state: FLOAT,
    delta: int,
    scale: float,
    chunk_size: int,
) -> tuple[FLOAT, FLOAT]:
    """(b, h, n, d) inputs and state (b, hv, dk, dv) through the standard ``LinearAttention``: (out, state')
    in float32."""
    queries, keys, values, rows, decay, rate = GatedPackedIn(q, k, v, g, beta, state, delta=delta)
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:
        out, final = GatedStandardDelta(
            queries, keys, values, rows, decay, rate, scale=scale, chunk_size=chunk_size
        )
    else:
        out, final = GatedStandardAdditive(
            queries, keys, values, rows, decay, scale=scale, chunk_size=chunk_size
        )
    out, final = GatedPackedOut(out, final, v, state, scale=scale)
    return out, final


@onnxscript.script(OPSET, default_opset=op)
def GatedDeltaRuleStandard(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, delta: int, scale: float, chunk_size: int
) -> FLOAT:
    empty = GatedKernelEmptyState(q, v)
    out, _ = GatedStandardCore(q, k, v, g, beta, empty, delta=delta, scale=scale, chunk_size=chunk_size)
    return op.CastLike(out, v)


@onnxscript.script(OPSET, default_opset=op)
def GatedDeltaRuleStepStandard(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    state: FLOAT,
    delta: int,
    scale: float,
    chunk_size: int,
) -> tuple[FLOAT, FLOAT]:
    out, final = GatedStandardCore(q, k, v, g, beta, state, delta=delta, scale=scale, chunk_size=chunk_size)
    return op.CastLike(out, v), op.CastLike(final, state)


@onnxscript.script(OPSET, default_opset=op)
def GatedDeltaRuleStepFirstStandard(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, delta: int, scale: float, chunk_size: int
) -> tuple[FLOAT, FLOAT]:
    empty = GatedKernelEmptyState(q, v)
    out, final = GatedStandardCore(q, k, v, g, beta, empty, delta=delta, scale=scale, chunk_size=chunk_size)
    return op.CastLike(out, v), final
