"""``retention``: gated linear attention with the additive rule (RetNet, MiniMax lightning, GLA).

S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t per head: no decay (linear attention
without a normaliser), a fixed decay per head (RetNet, MiniMax-01's lightning attention) or one computed
from x per head or per key dimension (GLA), chunk by chunk in O(N), with an O(1) recurrent state to
decode (docs/variants/retention.md). The layer is :mod:`attnx.plugins._gated_layer`, shared with
``gated_delta``.
"""

from __future__ import annotations

from attnx.hookspecs import hookimpl
from attnx.plugins._gated_variant import gated_variant
from attnx.plugins.retention.config import RetentionConfig
from attnx.variant import TestOptions, Variant

VARIANT = gated_variant(
    name="retention",
    summary="gated linear attention, additive rule: fixed or input-dependent decay, O(N), O(1) decode",
    paper="Retentive Network (arXiv 2307.08621); GLA (2312.06635); MiniMax-01 lightning (2501.08313)",
    config=RetentionConfig,
    testing=TestOptions(
        # a per-key decay from x, grouped value heads and chunks of 4: 11 tokens cross chunks and blocks
        options={"decay": "key", "value_heads": 4, "chunk_size": 4},
        bad_options={"gammas": (1.5,), "chunk_size": 0, "conv_kernel": 0, "activation": "relu"},
    ),
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
