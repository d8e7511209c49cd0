"""``attnx::GatedDeltaRule(Step)`` on ONNX Runtime's own kernels (``com.microsoft``), for an "ort" target.

Two mappings, each checked against the recurrence of :mod:`attnx.plugins.gated.op` (ONNX Runtime
1.32's schemas, and tests/plugins/gated/test_ort.py):

* ``GatedDeltaNet``: q, k (B, T, hk, dk), v (B, T, hv, dv) token-major (the rank-4 spelling), head
  counts read from the shapes, q/k head i serving the consecutive value heads i*r .. i*r + r - 1 as
  attnx's; decay (B, T, hv) scalar or (B, T, hv, dk) per key dimension; beta (B, T, hv); the state is
  V-major (B, hv, dv, dk) and required (zeros when the op has none).
* ``LinearAttention``: packed (B, T, H * D), every value head a batch row, in the layout
  :mod:`attnx.plugins.gated._packed` shares with the standard ``LinearAttention`` of opset 27; or, where
  the model declares a node's head counts and widths (:data:`ORT_SITE_BODIES`, bound per call site), with
  the heads as they are and attnx's state (B, hv, dk, dv) as the kernel's own, so the new state is the
  kernel's output, not a copy of it. At the Qwen3.5 0.8B shape the copy and the kernel's write into a
  fresh buffer cost about 0.5 ms a layer per decoded token (docs/benchmarks.md).

In both, update_rule ``gated_delta`` is the delta rule with a decay (the op always has one: g = 0 is a
decay of 1) and ``gated`` the additive rule, which ignores beta (and ``GatedDeltaNet`` refuses it), so v
is scaled by beta first. A ``scale`` of 0 means 1/sqrt(dk) to both kernels, so scale = 0 (an all-zero
output) is made explicit. Both run in float32 as the portable body does (``AttnxWiden``).
"""

from __future__ import annotations

import onnxscript
from onnxscript import BOOL, FLOAT, INT64
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, OPSET, AttnxWiden, SiteBodies
from attnx.plugins.gated._packed import (
    GatedKernelEmptyState,
    GatedKernelScaled,
    GatedPackedIn,
    GatedPackedOut,
    GatedTokensIn,
    GatedTokensOut,
)
from attnx.plugins.lib.ort import MICROSOFT

# ---------------------------------------------------------------- the kernels, one update rule each
# LinearAttention's head counts are attributes: 1 and 1 for heads as batch rows, the node's own where bound.


@onnxscript.script(LIBRARY, default_opset=op)
def OrtNetDelta(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, state: FLOAT, scale: float
) -> tuple[FLOAT, FLOAT]:
    out, final = MICROSOFT.GatedDeltaNet(
        q, k, v, None, g, beta, state, update_rule="gated_delta", scale=scale
    )
    return out, final


@onnxscript.script(LIBRARY, default_opset=op)
def OrtNetAdditive(q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, state: FLOAT, scale: float) -> tuple[FLOAT, FLOAT]:
    out, final = MICROSOFT.GatedDeltaNet(q, k, v, None, g, None, state, update_rule="gated", scale=scale)
    return out, final


@onnxscript.script(LIBRARY, default_opset=op)
def OrtLinearDelta(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    state: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    scale: float,
    chunk_size: int,
    q_heads: int,
    v_heads: int,
) -> tuple[FLOAT, FLOAT]:
    out, final = MICROSOFT.LinearAttention(
        q,
        k,
        v,
        state,
        g,
        beta,
        q_num_heads=q_heads,
        kv_num_heads=v_heads,
        update_rule="gated_delta",
        scale=scale,
        chunk_size=chunk_size,
    )
    return out, final


@onnxscript.script(LIBRARY, default_opset=op)
def OrtLinearAdditive(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    state: FLOAT,
    g: FLOAT,
    scale: float,
    chunk_size: int,
    q_heads: int,
    v_heads: int,
) -> tuple[FLOAT, FLOAT]:
    out, final = MICROSOFT.LinearAttention(
        q,
        k,
        v,
        state,
        g,
        q_num_heads=q_heads,
        kv_num_heads=v_heads,
        update_rule="gated",
        scale=scale,
        chunk_size=chunk_size,
    )
    return out, final


# ---------------------------------------------------------------- layouts


@onnxscript.script(LIBRARY, default_opset=op)
def OrtNetCore(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, state: FLOAT, delta: int, scale: float
) -> tuple[FLOAT, FLOAT]:
    """(b, h, n, d) inputs and state (b, hv, dk, dv), widened to float32, through ``GatedDeltaNet``: (out,
    state') in float32."""
    q, k, v, g = AttnxWiden(q), AttnxWiden(k), AttnxWiden(v), AttnxWiden(g)
    beta, state = AttnxWiden(beta), AttnxWiden(state)
    decay = op.Transpose(g, perm=[0, 2, 1, 3])  # (b, n, hv, dg), or (b, n, hv) for a scalar decay:
    per_key = op.Cast(op.Greater(op.Shape(g, start=3), op.Constant(value_ints=[1])), to=INT64.dtype)
    rank = op.Add(op.Constant(value_ints=[3]), per_key)
    decay = op.Reshape(decay, op.Slice(op.Shape(decay), op.Constant(value_ints=[0]), rank))
    rate = op.Transpose(beta, perm=[0, 2, 1])
    v_major = op.Transpose(state, perm=[0, 1, 3, 2])
    queries, keys = op.Transpose(q, perm=[0, 2, 1, 3]), op.Transpose(k, perm=[0, 2, 1, 3])
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:
        out, final = OrtNetDelta(
            queries, keys, op.Transpose(v, perm=[0, 2, 1, 3]), decay, rate, v_major, scale=scale
        )
    else:
        values = op.Transpose(op.Mul(v, op.Unsqueeze(beta, [-1])), perm=[0, 2, 1, 3])
        out, final = OrtNetAdditive(queries, keys, values, decay, v_major, scale=scale)
    return GatedKernelScaled(op.Transpose(out, perm=[0, 2, 1, 3]), scale=scale), op.Transpose(
        final, perm=[0, 1, 3, 2]
    )


@onnxscript.script(LIBRARY, default_opset=op)
def OrtLinearCore(
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
    """(b, h, n, d) inputs and state (b, hv, dk, dv) through ``com.microsoft::LinearAttention``: (out,
    state') in float32."""
    queries, keys, values, rows, decay, rate = GatedPackedIn(q, k, v, g, beta, state, delta=delta)
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:
        out, final = OrtLinearDelta(
            queries, keys, values, rows, decay, rate, scale=scale, chunk_size=chunk_size, q_heads=1, v_heads=1
        )
    else:
        out, final = OrtLinearAdditive(
            queries, keys, values, rows, decay, scale=scale, chunk_size=chunk_size, q_heads=1, v_heads=1
        )
    out, final = GatedPackedOut(out, final, v, state, scale=scale)
    return out, final


@onnxscript.script(LIBRARY, default_opset=op)
def OrtSitedCore(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    state: FLOAT,
    delta: int,
    scale: float,
    chunk_size: int,
    q_heads: int,
    dk: int,
    v_heads: int,
    dv: int,
    dg: int,
) -> tuple[FLOAT, FLOAT]:
    """(b, h, n, d) inputs of static heads and widths and the float32 state (b, hv, dk, dv) through
    ``com.microsoft::LinearAttention`` with its heads as they are: (out in float32, the kernel's state)."""
    queries, keys, values, decay, rate = GatedTokensIn(
        q, k, v, g, beta, delta=delta, q_heads=q_heads, dk=dk, v_heads=v_heads, dv=dv, dg=dg
    )
    use_delta = op.Cast(op.Constant(value_int=delta), to=BOOL.dtype)
    if use_delta:
        out, final = OrtLinearDelta(
            queries,
            keys,
            values,
            state,
            decay,
            rate,
            scale=scale,
            chunk_size=chunk_size,
            q_heads=q_heads,
            v_heads=v_heads,
        )
    else:
        out, final = OrtLinearAdditive(
            queries,
            keys,
            values,
            state,
            decay,
            scale=scale,
            chunk_size=chunk_size,
            q_heads=q_heads,
            v_heads=v_heads,
        )
    return GatedTokensOut(out, scale=scale, v_heads=v_heads, dv=dv), final


@onnxscript.script(OPSET, default_opset=op)
def OrtNetRule(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, delta: int, scale: float, chunk_size: int
) -> FLOAT:
    out, _ = OrtNetCore(q, k, v, g, beta, GatedKernelEmptyState(q, v), delta=delta, scale=scale)
    return op.CastLike(out, v)


@onnxscript.script(OPSET, default_opset=op)
def OrtNetStep(
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
    out, final = OrtNetCore(q, k, v, g, beta, state, delta=delta, scale=scale)
    return op.CastLike(out, v), op.CastLike(final, state)


@onnxscript.script(OPSET, default_opset=op)
def OrtNetStepFirst(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, delta: int, scale: float, chunk_size: int
) -> tuple[FLOAT, FLOAT]:
    out, final = OrtNetCore(q, k, v, g, beta, GatedKernelEmptyState(q, v), delta=delta, scale=scale)
    return op.CastLike(out, v), final


@onnxscript.script(OPSET, default_opset=op)
def OrtLinearRule(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, delta: int, scale: float, chunk_size: int
) -> FLOAT:
    empty = GatedKernelEmptyState(q, v)
    out, _ = OrtLinearCore(q, k, v, g, beta, empty, delta=delta, scale=scale, chunk_size=chunk_size)
    return op.CastLike(out, v)


@onnxscript.script(OPSET, default_opset=op)
def OrtLinearStep(
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
    out, final = OrtLinearCore(q, k, v, g, beta, state, delta=delta, scale=scale, chunk_size=chunk_size)
    return op.CastLike(out, v), op.CastLike(final, state)


@onnxscript.script(OPSET, default_opset=op)
def OrtLinearStepFirst(
    q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, delta: int, scale: float, chunk_size: int
) -> tuple[FLOAT, FLOAT]:
    empty = GatedKernelEmptyState(q, v)
    out, final = OrtLinearCore(q, k, v, g, beta, empty, delta=delta, scale=scale, chunk_size=chunk_size)
    return op.CastLike(out, v), final


@onnxscript.script(OPSET, default_opset=op)
def OrtSitedRule(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    delta: int,
    scale: float,
    chunk_size: int,
    q_heads: int,
    dk: int,
    v_heads: int,
    dv: int,
    dg: int,
) -> FLOAT:
    empty = AttnxWiden(GatedKernelEmptyState(q, v))
    out, _ = OrtSitedCore(
        q,
        k,
        v,
        g,
        beta,
        empty,
        delta=delta,
        scale=scale,
        chunk_size=chunk_size,
        q_heads=q_heads,
        dk=dk,
        v_heads=v_heads,
        dv=dv,
        dg=dg,
    )
    return op.CastLike(out, v)


@onnxscript.script(OPSET, default_opset=op)
def OrtSitedStep(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    state: FLOAT,
    delta: int,
    scale: float,
    chunk_size: int,
    q_heads: int,
    dk: int,
    v_heads: int,
    dv: int,
    dg: int,
) -> tuple[FLOAT, FLOAT]:
    out, final = OrtSitedCore(
        q,
        k,
        v,
        g,
        beta,
        AttnxWiden(state),
        delta=delta,
        scale=scale,
        chunk_size=chunk_size,
        q_heads=q_heads,
        dk=dk,
        v_heads=v_heads,
        dv=dv,
        dg=dg,
    )
    return op.CastLike(out, v), final  # float32 as it is: a cast would copy it into the output


@onnxscript.script(OPSET, default_opset=op)
def OrtSitedStepFirst(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    g: FLOAT,
    beta: FLOAT,
    delta: int,
    scale: float,
    chunk_size: int,
    q_heads: int,
    dk: int,
    v_heads: int,
    dv: int,
    dg: int,
) -> tuple[FLOAT, FLOAT]:
    empty = AttnxWiden(GatedKernelEmptyState(q, v))
    out, final = OrtSitedCore(
        q,
        k,
        v,
        g,
        beta,
        empty,
        delta=delta,
        scale=scale,
        chunk_size=chunk_size,
        q_heads=q_heads,
        dk=dk,
        v_heads=v_heads,
        dv=dv,
        dg=dg,
    )
    return op.CastLike(out, v), final


# The bodies by op name, in AttentionOp.bodies order (all inputs first, then without the state).
ORT_GATED_DELTA_NET_BODIES = {
    "GatedDeltaRule": (OrtNetRule,),
    "GatedDeltaRuleStep": (OrtNetStep, OrtNetStepFirst),
}
ORT_LINEAR_ATTENTION_BODIES = {
    "GatedDeltaRule": (OrtLinearRule,),
    "GatedDeltaRuleStep": (OrtLinearStep, OrtLinearStepFirst),
}
# LinearAttention's CPU kernel ran 4-8x faster than GatedDeltaNet's at N = 4096 (docs/variants/gated.md).
ORT_BODIES = ORT_LINEAR_ATTENTION_BODIES
# The dims a site body binds: q and k (b, hk, n, dk), v (b, hv, n, dv), g (b, hv, n, dg).
SITE_DIMS = {"q_heads": ("q", 1), "dk": ("q", 3), "v_heads": ("v", 1), "dv": ("v", 3), "dg": ("g", 3)}
ORT_SITE_BODIES = {
    "GatedDeltaRule": SiteBodies((OrtSitedRule,), SITE_DIMS),
    "GatedDeltaRuleStep": SiteBodies((OrtSitedStep, OrtSitedStepFirst), SITE_DIMS),
}
