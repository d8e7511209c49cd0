"""The ``linear`` variant's causal attention on the standard ``LinearAttention`` of ONNX opset 27: the
bodies of ``attnx::LinearAttention`` and ``attnx::LinearAttentionStep`` a model at ``--opset 27`` holds.

The op's ``update_rule="linear"`` (S_t = S_{t-1} + k_t v_t^T, o_t = scale q_t^T S_t) with scale 1 on the
elu + 1 features, V with a column of ones so that one pass gives the numerator and the denominator, then
num / (den + eps) as the portable body does; every head a batch row (the op's head counts are attributes,
which a body cannot take from the shapes), as :mod:`attnx.plugins.linear.ort` drives ONNX Runtime's
``com.microsoft::LinearAttention``.

The op is causal with as many queries as keys. attnx's causal attention is bottom-right aligned, so the
keys before the last n_queries fold into the op's starting state (one product), and queries before the
first key (n_queries > n_keys) meet zero-feature keys, which add nothing. Bidirectional calls take the
portable form (an ``If`` on the constant ``causal``, which ONNX Runtime folds).
"""

from __future__ import annotations

import onnxscript
from onnxscript import BOOL, FLOAT
from onnxscript import opset18 as op

from attnx.ops import LIBRARY, OPSET
from attnx.plugins.lib.linear_core import (
    LinearCoreFullSums,
    LinearCoreMaskKeys,
    LinearCoreNormalise,
    LinearCoreSplitLast,
    LinearCoreValues,
)
from attnx.plugins.lib.ort import OrtHeadsToBatch
from attnx.plugins.lib.standard import STANDARD
from attnx.plugins.linear.features import LinearEluFeatures
from attnx.plugins.linear.ort import OrtLinearEmptyState


@onnxscript.script(LIBRARY, default_opset=STANDARD)
def LinearStandardKernel(qf: FLOAT, kf: FLOAT, values: FLOAT, state: FLOAT) -> tuple[FLOAT, FLOAT]:
    """Causal [num, den] (b, h, n, dv + 1) of n queries on n keys and the state after them (b, h, f,
    dv + 1), after ``state``."""
    rows = STANDARD.Reshape(
        state, STANDARD.Concat(STANDARD.Constant(value_ints=[-1, 1]), STANDARD.Shape(state, start=2), axis=0)
    )
    sums, grown = STANDARD.LinearAttention(
        OrtHeadsToBatch(qf),
        OrtHeadsToBatch(kf),
        OrtHeadsToBatch(values),
        rows,
        q_num_heads=1,
        kv_num_heads=1,
        update_rule="linear",
        scale=1.0,
    )
    return STANDARD.Reshape(sums, STANDARD.Shape(values)), STANDARD.Reshape(grown, STANDARD.Shape(state))


@onnxscript.script(LIBRARY, default_opset=op)
def LinearStandardCausal(qf: FLOAT, kf: FLOAT, values: FLOAT) -> FLOAT:
    """Causal [num, den] (b, h, n_queries, dv + 1), bottom-right aligned: the keys before the last
    n_queries as the starting state, zero keys before the first when there are fewer keys than queries."""
    zero = op.Constant(value_ints=[0])
    axis = op.Constant(value_ints=[2])
    n_queries, n_keys = op.Shape(qf, start=2, end=3), op.Shape(kf, start=2, end=3)
    front = op.Max(op.Sub(n_queries, n_keys), zero)
    pads = op.Concat(op.Constant(value_ints=[0, 0]), front, op.Constant(value_ints=[0, 0, 0, 0, 0]), axis=0)
    kf, values = op.Pad(kf, pads), op.Pad(values, pads)
    before = op.Max(op.Sub(n_keys, n_queries), zero)
    end = op.Constant(value_ints=[9223372036854775807])
    state = op.MatMul(
        op.Transpose(op.Slice(kf, zero, before, axis), perm=[0, 1, 3, 2]),
        op.Slice(values, zero, before, axis),
    )
    sums, _ = LinearStandardKernel(
        qf, op.Slice(kf, before, end, axis), op.Slice(values, before, end, axis), state
    )
    return sums


@onnxscript.script(LIBRARY, default_opset=op)
def LinearStandardAttend(qf: FLOAT, kf: FLOAT, v: FLOAT, causal: int, eps: float) -> FLOAT:
    values = LinearCoreValues(v, qf)
    use_kernel = op.Cast(op.Constant(value_int=causal), to=BOOL.dtype)
    if use_kernel:  # noqa: SIM108 (onnxscript makes an If of an if statement only)
        sums = LinearStandardCausal(qf, kf, values)
    else:
        sums = LinearCoreFullSums(qf, kf, values)
    return LinearCoreNormalise(sums, eps=eps, clamp=0)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearStandardStep(
    qf: FLOAT, kf: FLOAT, v: FLOAT, state: FLOAT, eps: float
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """(out, S', Z') of new tokens after ``state`` [S, Z] (b, h, f, dv + 1), float32."""
    sums, grown = LinearStandardKernel(qf, kf, LinearCoreValues(v, qf), state)
    kv, z = LinearCoreSplitLast(grown)
    return LinearCoreNormalise(sums, eps=eps, clamp=0), kv, op.Squeeze(z, [-1])


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionStandard(
    q: FLOAT, k: FLOAT, v: FLOAT, key_padding_mask: BOOL, causal: int, eps: float, chunk_size: int
) -> FLOAT:
    kf = LinearCoreMaskKeys(LinearEluFeatures(k), key_padding_mask)
    return op.CastLike(LinearStandardAttend(LinearEluFeatures(q), kf, v, causal=causal, eps=eps), q)


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionStandardNoMask(
    q: FLOAT, k: FLOAT, v: FLOAT, causal: int, eps: float, chunk_size: int
) -> FLOAT:
    return op.CastLike(
        LinearStandardAttend(LinearEluFeatures(q), LinearEluFeatures(k), v, causal=causal, eps=eps), q
    )


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionStepStandard(
    q: FLOAT, k: FLOAT, v: FLOAT, kv_sum: FLOAT, k_sum: FLOAT, eps: float, chunk_size: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    state = op.Concat(kv_sum, op.Unsqueeze(k_sum, [-1]), axis=-1)
    out, kv, z = LinearStandardStep(LinearEluFeatures(q), LinearEluFeatures(k), v, state, eps=eps)
    return op.CastLike(out, q), kv, z


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionStepFirstStandard(
    q: FLOAT, k: FLOAT, v: FLOAT, eps: float, chunk_size: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    qf = LinearEluFeatures(q)
    empty = OrtLinearEmptyState(qf, LinearCoreValues(v, qf))
    out, kv, z = LinearStandardStep(qf, LinearEluFeatures(k), v, empty, eps=eps)
    return op.CastLike(out, q), kv, z
