"""Portable ONNX bodies of ``attnx::GeneralizedDeltaRule(Step)`` (:mod:`attnx.plugins.gated.generalized`):
the token-by-token form in standard ops (ai.onnx opset 18), a ``Scan`` over the tokens carrying the
(b, h, dk, dv) state, whose step is three products:

    S = exp(w_t) * S + b_t (a_t^T S) + k_t v_t^T,    o_t = q_t^T S

with a_t, q_t, v_t as rows and b_t, k_t as columns (the inputs are laid out so before the loop, token
axis first: ONNX Runtime's Scan slices along axis 0 at half the cost of another axis, as measured for
the gated bodies). All arithmetic is dtype-generic (``AttnxWiden``, constants through ``CastLike``).
"""

from __future__ import annotations

import onnxscript
from onnxscript import FLOAT, graph
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, OPSET, AttnxWiden

# ONNX Runtime runs a Scan only if its body's outputs have a shape: the rank lets it infer them.
STATE = FLOAT[None, None, None, None]


@onnxscript.script(LIBRARY, default_opset=op)
def GeneralizedRows(x: FLOAT) -> FLOAT:
    """(b, h, n, d) -> (n, b, h, 1, d): each token's vector as a row."""
    return op.Transpose(op.Unsqueeze(x, [3]), perm=[2, 0, 1, 3, 4])


@onnxscript.script(LIBRARY, default_opset=op)
def GeneralizedColumns(x: FLOAT) -> FLOAT:
    """(b, h, n, d) -> (n, b, h, d, 1): each token's vector as a column."""
    return op.Transpose(op.Unsqueeze(x, [4]), perm=[2, 0, 1, 3, 4])


@onnxscript.script(LIBRARY, default_opset=op)
def GeneralizedTokens(
    q: FLOAT, k: FLOAT, v: FLOAT, w: FLOAT, a: FLOAT, b: FLOAT, state: FLOAT, scale: float
) -> tuple[FLOAT, FLOAT]:
    """The rule token by token after ``state`` (b, h, dk, dv), all inputs widened: (out (b, h, n, dv),
    state')."""

    @graph()
    def step(
        s: STATE, decay: STATE, a_row: STATE, b_column: STATE, k_column: STATE, v_row: STATE, q_row: STATE
    ):
        removed = op.MatMul(b_column, op.MatMul(a_row, s))
        grown = op.Add(op.Add(op.Mul(decay, s), removed), op.MatMul(k_column, v_row))
        return grown, op.MatMul(q_row, grown)

    final, outs = op.Scan(
        state,
        GeneralizedColumns(op.Exp(w)),
        GeneralizedRows(a),
        GeneralizedColumns(b),
        GeneralizedColumns(k),
        GeneralizedRows(v),
        GeneralizedRows(q),
        body=step,
        num_scan_inputs=6,
    )
    out = op.Transpose(op.Squeeze(outs, [3]), perm=[1, 2, 0, 3])  # outs: (n, b, h, 1, dv)
    return op.Mul(out, op.CastLike(op.Constant(value_float=scale), out)), final


@onnxscript.script(LIBRARY, default_opset=op)
def GeneralizedEmptyState(q: FLOAT, v: FLOAT) -> FLOAT:
    """Zeros (b, h, dk, dv) in q's type."""
    shape = op.Concat(op.Shape(v, start=0, end=2), op.Shape(q, start=3), op.Shape(v, start=3), axis=0)
    return op.Expand(op.CastLike(op.Constant(value_float=0.0), q), shape)


@onnxscript.script(OPSET, default_opset=op)
def GeneralizedDeltaRule(q: FLOAT, k: FLOAT, v: FLOAT, w: FLOAT, a: FLOAT, b: FLOAT, scale: float) -> FLOAT:
    wide = AttnxWiden(q)
    out, _ = GeneralizedTokens(
        wide,
        AttnxWiden(k),
        AttnxWiden(v),
        AttnxWiden(w),
        AttnxWiden(a),
        AttnxWiden(b),
        GeneralizedEmptyState(wide, v),
        scale=scale,
    )
    return op.CastLike(out, v)


@onnxscript.script(OPSET, default_opset=op)
def GeneralizedDeltaRuleStep(
    q: FLOAT, k: FLOAT, v: FLOAT, w: FLOAT, a: FLOAT, b: FLOAT, state: FLOAT, scale: float
) -> tuple[FLOAT, FLOAT]:
    wide = AttnxWiden(q)
    out, grown = GeneralizedTokens(
        wide,
        AttnxWiden(k),
        AttnxWiden(v),
        AttnxWiden(w),
        AttnxWiden(a),
        AttnxWiden(b),
        op.CastLike(state, wide),
        scale=scale,
    )
    return op.CastLike(out, v), op.CastLike(grown, state)


@onnxscript.script(OPSET, default_opset=op)
def GeneralizedDeltaRuleStepFirst(
    q: FLOAT, k: FLOAT, v: FLOAT, w: FLOAT, a: FLOAT, b: FLOAT, scale: float
) -> tuple[FLOAT, FLOAT]:
    wide = AttnxWiden(q)
    out, grown = GeneralizedTokens(
        wide,
        AttnxWiden(k),
        AttnxWiden(v),
        AttnxWiden(w),
        AttnxWiden(a),
        AttnxWiden(b),
        GeneralizedEmptyState(wide, v),
        scale=scale,
    )
    return op.CastLike(out, v), grown
