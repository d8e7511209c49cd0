"""An L2 normalisation with an epsilon, ``x * 1 / sqrt(sum(x * x, -1) + eps)`` (the gated layers' q/k norm,
Hugging Face's ``l2norm``), as ONNX Runtime's ``SimplifiedLayerNormalization``: six nodes a call become one
kernel (at the Qwen3.5 0.8B shape, 216 nodes of a decode step become 36).

The kernel computes ``x / sqrt(mean(x * x, -1) + epsilon) * scale``. With ``D`` the last dim,
``sum + eps = D * (mean + eps / D)``, so ``epsilon = eps / D`` and ``scale = 1 / sqrt(D)`` give the same
value, exact up to float rounding. onnxscript's fusions (``attnx optimize --fuse``) make RMSNorms that
kernel, not this form; the rule is written with onnxscript's rewriter as theirs are.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern


class L2NormFusion(pattern.RewriteRuleClassBase):
    """``Mul(x, Reciprocal(Sqrt(Add(ReduceSum(Mul(x, x), [-1], keepdims=1), eps))))`` on float32 ``x`` of a
    static last dim -> ``SimplifiedLayerNormalization``."""

    def pattern(self, op, x, axes, epsilon):  # noqa: ANN001, ANN201 (onnxscript's pattern builder)
        total = op.ReduceSum(op.Mul(x, x), axes, keepdims=1)
        return op.Mul(x, op.Reciprocal(op.Sqrt(op.Add(total, epsilon))))

    def check(self, context, x, axes, epsilon, **_) -> pattern.MatchResult:  # noqa: ANN001
        result = pattern.MatchResult()
        if x.dtype != ir.DataType.FLOAT:
            return result.fail("not float32", x)
        if x.shape is None or not isinstance(x.shape[-1], int):
            return result.fail("the last dim is not static", x)
        axes_value, eps_value = axes.const_value, epsilon.const_value
        if axes_value is None or eps_value is None or eps_value.size != 1:
            return result.fail("axes or epsilon not a constant", axes)
        if axes_value.numpy().tolist() not in ([-1], [len(x.shape) - 1]):
            return result.fail("not over the last axis", axes)
        return result

    def rewrite(self, op, x, epsilon, **_):  # noqa: ANN001, ANN201
        width = x.shape[-1]
        scale = np.full((width,), 1.0 / math.sqrt(width), dtype=np.float32)
        eps = float(epsilon.const_value.numpy().reshape(())) / width
        return op.SimplifiedLayerNormalization(
            x,
            op.Constant(value=ir.tensor(scale)),
            axis=-1,
            epsilon=eps,
            stash_type=ir.DataType.FLOAT.value,
        )


L2_NORM_RULES = pattern.RewriteRuleSet([L2NormFusion.rule()])
