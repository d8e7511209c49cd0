"""The ai.onnx opset whose standard ``LinearAttention`` the built-in bodies of models at that opset call
(the gated family's :mod:`attnx.plugins.gated._standard`, the ``linear`` variant's
:mod:`attnx.plugins.linear.standard`): a body written against it is the one a model at ``--opset 27``
holds (:meth:`attnx.ops.AttentionOp.body_for`)."""

from __future__ import annotations

import onnxscript

STANDARD_OPSET = 27
STANDARD = onnxscript.values.Opset("", STANDARD_OPSET)
