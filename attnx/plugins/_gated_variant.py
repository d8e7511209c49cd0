"""The declaration the two gated variants share (``retention``, ``gated_delta``): one layer
(:mod:`attnx.plugins._gated_layer`), one cost model, the same capabilities and tolerances; each
variant names only what is its own."""

from __future__ import annotations

from attnx.plugins._gated_config import GatedConfig
from attnx.plugins._gated_cost import gated_cost
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
        impl="attnx.plugins._gated_layer:IMPL",
        cost=gated_cost,
        testing=testing,
    )
