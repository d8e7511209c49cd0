"""The options of the ``gated_delta`` variant (no torch): the delta rule's defaults (Gated DeltaNet)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from attnx.plugins._gated_config import Activation, Decay, GatedConfig, OutputGate


@dataclasses.dataclass(frozen=True)
class GatedDeltaConfig(GatedConfig):
    """S_t = D_t S_{t-1} + beta_t k_t (v_t - (D_t S_{t-1})^T k_t)^T, o_t = scale S_t^T q_t; the defaults are
    Gated DeltaNet's as Qwen3-Next and Qwen3.5 use it (a decay per value head from x, L2-normalised q/k,
    a short convolution of width 4 with SiLU, a SiLU output gate after a per-head RMSNorm). DeltaNet:
    decay=none; Kimi Delta Attention: decay=key decay_rank=<head dim> output_gate=sigmoid
    gate_rank=<head dim> (docs/variants/gated_delta.md)."""

    delta: ClassVar[bool] = True
    variant: ClassVar[str] = "gated_delta"

    decay: Decay = "head"
    qk_norm: bool = True
    activation: Activation = "silu"
    short_conv: bool = True
    output_gate: OutputGate = "silu"
