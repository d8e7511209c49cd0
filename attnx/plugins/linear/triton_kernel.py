"""``attnx::LinearAttention`` as one Triton kernel: the shared linear core with phi = elu + 1."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import triton
import triton.language as tl

from attnx.kernels import Shapes
from attnx.plugins.lib import linear_triton as core


@triton.jit
def elu_features(x, valid, positions, N_Q, N_K, FEATURE_ARG: tl.constexpr):
    """phi(x) = elu(x) + 1 on the real head dimensions, 0 elsewhere (positions unused)."""
    return tl.where(valid, tl.where(x > 0, x + 1.0, tl.exp(x)), 0.0)


def _constants(shapes: Shapes, attributes: Mapping[str, Any]) -> dict[str, Any]:
    causal, eps = attributes["causal"], attributes["eps"]
    return core.constants(shapes, elu_features, 1, 0, causal, eps, clamp=False)


LINEAR_KERNEL = core.kernel(_constants)
