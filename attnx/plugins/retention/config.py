"""The options of the ``retention`` variant (no torch): the additive rule's defaults (RetNet)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from attnx.plugins._gated_config import Activation, Decay, GatedConfig, OutputGate


@dataclasses.dataclass(frozen=True)
class RetentionConfig(GatedConfig):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t; the defaults are RetNet's multi-scale
    retention (fixed gamma_h = 1 - 2^(-5-h), swish output gate after a per-head norm). MiniMax-01's
    lightning attention: decay=minimax activation=silu scale=1 output_norm=full output_gate=sigmoid; GLA:
    decay=key decay_gate=logsigmoid decay_rank=16; plain linear attention without a normaliser:
    decay=none output_gate=none output_norm=none (docs/variants/retention.md)."""

    delta: ClassVar[bool] = False
    variant: ClassVar[str] = "retention"

    decay: Decay = "retnet"
    activation: Activation = "none"
    output_gate: OutputGate = "silu"
