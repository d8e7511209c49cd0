"""``attnx::CosformerAttention`` as one Triton kernel: the shared linear core with cosFormer's features.

Features [relu(x) sin(a_p), relu(x) cos(a_p)], a_p = pi/2 · p / M at 1-based positions p
(queries aligned bottom-right when causal, as the core passes them), M = ``max_len`` or, when
it is 0, max(n_queries, n_keys) of the call; eps is a lower clamp of the denominator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import triton
import triton.language as tl

from attnx.kernels import Shapes
from attnx.plugins.cosformer.kernel import HALF_PI
from attnx.plugins.lib import linear_triton as core

_HALF_PI = tl.constexpr(HALF_PI)


@triton.jit
def cos_features(x, valid, positions, N_Q, N_K, FEATURE_ARG: tl.constexpr):
    """(rows, 2 BLOCK_D): relu(x) sin(a), relu(x) cos(a) interleaved; FEATURE_ARG = max_len (0: per call)."""
    m = FEATURE_ARG * 1.0 if FEATURE_ARG > 0 else tl.maximum(N_Q, N_K).to(tl.float32)
    angle = ((positions + 1).to(tl.float32) * _HALF_PI / m)[:, None]
    r = tl.where(valid, tl.maximum(x, 0.0), 0.0)
    both = tl.join(r * tl.sin(angle), r * tl.cos(angle))
    return tl.reshape(both, (x.shape[0], 2 * x.shape[1]))


def _constants(shapes: Shapes, attributes: Mapping[str, Any]) -> dict[str, Any]:
    causal, eps, max_len = attributes["causal"], attributes["eps"], int(attributes["max_len"])
    return core.constants(shapes, cos_features, 2, max_len, causal, eps, clamp=True)


COSFORMER_KERNEL = core.kernel(_constants)
