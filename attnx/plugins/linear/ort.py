"""The ``linear`` variant's causal attention on ONNX Runtime's ``com.microsoft::LinearAttention`` kernel.

Bodies of ``attnx::LinearAttention`` and ``attnx::LinearAttentionStep`` for an "ort" target: the kernel's
``update_rule="linear"`` (S_t = S_{t-1} + k_t v_t^T, o_t = scale q_t^T S_t) with scale 1 on the elu + 1
features, V with a column of ones so that one pass gives the numerator and the denominator, then
num / (den + eps) as the portable body does. Every head is a batch row of the kernel (its head counts are
attributes, which a body cannot take from the shapes). The sums are the portable body's, added token by
token instead of chunk by chunk: equal up to float32 rounding (tests/plugins/gated/test_ort.py).

The kernel is causal with as many queries as keys (self-attention); bidirectional calls take the portable
form (an ``If`` on the constant ``causal``, which ONNX Runtime folds). Causal attention with fewer
queries than keys (bottom-right aligned) has no kernel form: these bodies assume n_queries = n_keys.
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
from attnx.plugins.lib.ort import MICROSOFT, OrtHeadsToBatch
from attnx.plugins.linear.features import LinearEluFeatures


@onnxscript.script(LIBRARY, default_opset=op)
def OrtLinearKernel(qf: FLOAT, kf: FLOAT, values: FLOAT, state: FLOAT) -> tuple[FLOAT, FLOAT]:
    """Causal [num, den] (b, h, n, dv + 1) and the state after them (b, h, f, dv + 1), after ``state``."""
    rows = op.Reshape(state, op.Concat(op.Constant(value_ints=[-1, 1]), op.Shape(state, start=2), axis=0))
    sums, grown = MICROSOFT.LinearAttention(
        OrtHeadsToBatch(qf),
        OrtHeadsToBatch(kf),
        OrtHeadsToBatch(values),
        rows,
        q_num_heads=1,
        kv_num_heads=1,
        update_rule="linear",
        scale=1.0,
    )
    return op.Reshape(sums, op.Shape(values)), op.Reshape(grown, op.Shape(state))


@onnxscript.script(LIBRARY, default_opset=op)
def OrtLinearEmptyState(qf: FLOAT, values: FLOAT) -> FLOAT:
    shape = op.Concat(op.Shape(qf, start=0, end=2), op.Shape(qf, start=3), op.Shape(values, start=3), axis=0)
    return op.Expand(op.CastLike(op.Constant(value_float=0.0), qf), shape)


@onnxscript.script(LIBRARY, default_opset=op)
def OrtLinearAttend(qf: FLOAT, kf: FLOAT, v: FLOAT, causal: int, eps: float) -> FLOAT:
    values = LinearCoreValues(v, qf)
    use_kernel = op.Cast(op.Constant(value_int=causal), to=BOOL.dtype)
    if use_kernel:
        sums, _ = OrtLinearKernel(qf, kf, values, OrtLinearEmptyState(qf, values))
    else:
        sums = LinearCoreFullSums(qf, kf, values)
    return LinearCoreNormalise(sums, eps=eps, clamp=0)


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionOrt(
    q: FLOAT, k: FLOAT, v: FLOAT, key_padding_mask: BOOL, causal: int, eps: float, chunk_size: int
) -> FLOAT:
    kf = LinearCoreMaskKeys(LinearEluFeatures(k), key_padding_mask)
    return op.CastLike(OrtLinearAttend(LinearEluFeatures(q), kf, v, causal=causal, eps=eps), q)


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionOrtNoMask(q: FLOAT, k: FLOAT, v: FLOAT, causal: int, eps: float, chunk_size: int) -> FLOAT:
    return op.CastLike(
        OrtLinearAttend(LinearEluFeatures(q), LinearEluFeatures(k), v, causal=causal, eps=eps), q
    )


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionStepOrt(
    q: FLOAT, k: FLOAT, v: FLOAT, kv_sum: FLOAT, k_sum: FLOAT, eps: float, chunk_size: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    qf = LinearEluFeatures(q)
    state = op.Concat(kv_sum, op.Unsqueeze(k_sum, [-1]), axis=-1)
    sums, grown = OrtLinearKernel(qf, LinearEluFeatures(k), LinearCoreValues(v, qf), state)
    kv, z = LinearCoreSplitLast(grown)
    return op.CastLike(LinearCoreNormalise(sums, eps=eps, clamp=0), q), kv, op.Squeeze(z, [-1])


@onnxscript.script(OPSET, default_opset=op)
def LinearAttentionStepFirstOrt(
    q: FLOAT, k: FLOAT, v: FLOAT, eps: float, chunk_size: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    qf = LinearEluFeatures(q)
    values = LinearCoreValues(v, qf)
    sums, grown = OrtLinearKernel(qf, LinearEluFeatures(k), values, OrtLinearEmptyState(qf, values))
    kv, z = LinearCoreSplitLast(grown)
    return op.CastLike(LinearCoreNormalise(sums, eps=eps, clamp=0), q), kv, op.Squeeze(z, [-1])


# The bodies by op name, in AttentionOp.bodies order.
LINEAR_ORT_BODIES = {
    "LinearAttention": (LinearAttentionOrt, LinearAttentionOrtNoMask),
    "LinearAttentionStep": (LinearAttentionStepOrt, LinearAttentionStepFirstOrt),
}
