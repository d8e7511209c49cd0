"""``gated_delta``: gated linear attention with the delta rule (DeltaNet, Gated DeltaNet, Kimi Delta).

S_t = D_t S_{t-1} + beta_t k_t (v_t - (D_t S_{t-1})^T k_t)^T, o_t = scale S_t^T q_t per value head, with
no decay (DeltaNet), a decay per value head from x (Gated DeltaNet: Qwen3-Next, Qwen3.5) or per key
dimension (Kimi Delta Attention), beta = sigmoid(x W_b), L2-normalised q/k and a short convolution before
the rule, chunk by chunk in O(N) (the WY form), with an O(1) recurrent state and the convolution's carry
to decode (docs/variants/gated_delta.md). The layer is :mod:`attnx.plugins._gated_layer`, shared with
``retention``.
"""

from __future__ import annotations

from attnx.hookspecs import hookimpl
from attnx.plugins._gated_variant import gated_variant
from attnx.plugins.gated_delta.config import GatedDeltaConfig
from attnx.variant import TestOptions, Variant

VARIANT = gated_variant(
    name="gated_delta",
    summary="gated linear attention, delta rule: Gated DeltaNet / Kimi Delta, O(N), O(1) decode",
    paper="DeltaNet (arXiv 2406.06484); Gated DeltaNet (2412.06464); Kimi Linear (2510.26692)",
    config=GatedDeltaConfig,
    testing=TestOptions(
        # grouped value heads (2 q/k heads serve 4) and chunks of 4: 11 tokens cross chunks
        options={"value_heads": 4, "chunk_size": 4},
        bad_options={"gammas": (2.0,), "chunk_size": 0, "conv_kernel": 0, "activation": "tanh"},
    ),
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
