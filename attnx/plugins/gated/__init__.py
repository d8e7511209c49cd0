"""The gated / delta-rule family: one plugin declaring ``retention`` and ``gated_delta``.

Both build one layer (:mod:`attnx.plugins.gated.layer`) around one op (:mod:`attnx.plugins.gated.op`,
``attnx::gated_delta_rule``), with one cost model and the same capabilities and tolerances; they
differ in the rule and their defaults (:mod:`attnx.plugins.gated.config`):

* ``retention``, the additive rule (RetNet, MiniMax lightning, GLA): S_t = diag(exp(g_t)) S_{t-1} +
  k_t v_t^T, o_t = scale S_t^T q_t per head, with no decay (linear attention without a normaliser), a
  fixed decay per head (RetNet, MiniMax-01's lightning attention) or one computed from x per head or per
  key dimension (GLA) (docs/variants/retention.md);
* ``gated_delta``, the delta rule (DeltaNet, Gated DeltaNet, Kimi Delta): S_t = D_t S_{t-1} + beta_t k_t
  (v_t - (D_t S_{t-1})^T k_t)^T, with no decay (DeltaNet), a decay per value head from x (Gated
  DeltaNet: Qwen3-Next, Qwen3.5) or per key dimension (Kimi Delta Attention), beta = sigmoid(x W_b),
  L2-normalised q/k and a short convolution before the rule (docs/variants/gated_delta.md).

Both run chunk by chunk in O(N), with an O(1) recurrent state (and the convolution's carry) to decode.
This module is the light half: no torch.
"""

from __future__ import annotations

from attnx.hookspecs import hookimpl
from attnx.plugins.gated.config import GatedConfig, GatedDeltaConfig, RetentionConfig
from attnx.plugins.gated.cost import gated_cost
from attnx.variant import Capabilities, TestOptions, Tolerance, Variant


def gated_variant(
    name: str, summary: str, paper: str, config: type[GatedConfig], testing: TestOptions
) -> Variant:
    """A gated variant: causal, padding-masked, recurrent decode, trainable, float32 at the house
    tolerance. fp16 at atol 5e-2: where q . k nearly cancels (o ~ 0, a first token), the per-head
    RMSNorm runs in its eps-dominated range and passes the fp16 rounding of q and k (up to half of a
    tiny o) to the logits: measured 0.028 (retention) and 0.026 (gated_delta) on the kit's tiny lm,
    twice the house fp16 atol (docs/variants/retention.md, Tolerance)."""
    return Variant(
        name=name,
        summary=summary,
        paper=paper,
        config=config,
        capabilities=Capabilities(
            causal=True, bidirectional=False, key_padding_mask=True, decode="recurrent", trainable=True
        ),
        tolerance=Tolerance(atol=1e-4, rtol=1e-3),
        fp16_tolerance=Tolerance(atol=5e-2, rtol=1e-2),
        impl="attnx.plugins.gated.layer:IMPL",
        cost=gated_cost,
        testing=testing,
    )


RETENTION = gated_variant(
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

GATED_DELTA = gated_variant(
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
    return [RETENTION, GATED_DELTA]
