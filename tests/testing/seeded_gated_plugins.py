"""Gated delta-rule plugins with seeded mistakes, for testing that the conformance kit names them.

Each is attnx's ``gated_delta`` layer (decay per value head from x, beta from x, short convolution,
grouped value heads) on the shared ``attnx::GatedDeltaRule`` ops, with one flaw:

* ``seeded_gated_sound``: no flaw (the control);
* ``seeded_gated_sign``: the decay has the wrong sign (g = +exp(A_log) softplus(.) >= 0: the state grows
  instead of forgetting), in the full forward and the step alike, so torch and ONNX agree with each other;
* ``seeded_gated_beta``: the decode step forgets beta (writes with beta = 1), so only stepping differs.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

import attnx
from attnx.ops import VariantImpl
from attnx.plugins.gated.config import GatedDeltaConfig
from attnx.plugins.gated.layer import GatedLayer
from attnx.plugins.gated.op import GATED_DELTA_RULE_OP, GATED_DELTA_RULE_STEP_OP
from attnx.variant import TestOptions

FLAWS = ("sound", "sign", "beta")
OPTIONS = {"value_heads": 4, "chunk_size": 4}


class SeededGatedLayer(GatedLayer):
    """attnx's gated layer with a seeded ``flaw``."""

    def __init__(self, flaw: str, config: GatedDeltaConfig, spec: attnx.AttentionSpec) -> None:
        super().__init__(config, spec)
        self.flaw, self.in_step = flaw, False

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        g = super().log_decay(x)
        return -g if self.flaw == "sign" else g

    def beta(self, x: torch.Tensor) -> torch.Tensor:
        if self.flaw == "beta" and self.in_step:
            return torch.ones_like(super().beta(x))
        return super().beta(x)

    def step(self, x, state, position):
        self.in_step = True
        try:
            return super().step(x, state, position)
        finally:
            self.in_step = False


def _config(flaw: str) -> type[GatedDeltaConfig]:
    @dataclasses.dataclass(frozen=True)
    class SeededGatedConfig(GatedDeltaConfig):
        variant: ClassVar[str] = f"seeded_gated_{flaw}"

    return SeededGatedConfig


def _impl(flaw: str) -> VariantImpl:
    return VariantImpl(
        build=lambda config, spec: SeededGatedLayer(flaw, config, spec),
        ops=(GATED_DELTA_RULE_OP,),
        decode_ops=(GATED_DELTA_RULE_STEP_OP,),
    )


IMPL_SOUND, IMPL_SIGN, IMPL_BETA = map(_impl, FLAWS)
VARIANTS = {
    flaw: attnx.Variant(
        name=f"seeded_gated_{flaw}",
        summary=f"the gated_delta layer with a seeded mistake: {flaw}",
        paper="none (test plugin)",
        config=_config(flaw),
        capabilities=attnx.Capabilities(
            causal=True, bidirectional=False, key_padding_mask=True, decode="recurrent", trainable=True
        ),
        tolerance=attnx.Tolerance(atol=1e-4, rtol=1e-3),
        impl=f"{__name__}:IMPL_{flaw.upper()}",
        testing=TestOptions(options=OPTIONS),
    )
    for flaw in FLAWS
}


@attnx.hookimpl
def attnx_register_variants() -> list[attnx.Variant]:
    return list(VARIANTS.values())
