"""Shared plugin-lowered exports (one per variant and mask setting, made once per session)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from attnx.api import export
from attnx.registry import get_registry
from tests.conftest import TINY

VARIANTS = sorted(get_registry().variants)


def tiny_model(variant: str) -> str:
    """The tiny model the plugin tests build around ``variant``: an encoder, or an lm for a variant that
    attends causally only (the gated / delta rules)."""
    return "encoder" if get_registry().variant(variant).capabilities.bidirectional else "lm"


@pytest.fixture(scope="session")
def plugin_export(tmp_path_factory) -> Callable[..., Path]:
    """``plugin_export(variant, attention_mask=True, lowering="plugin", dtype="fp32")`` -> OUT of a tiny
    export (cached): an encoder, or an lm for a variant that attends causally only (no attention mask)."""
    made: dict[tuple[str, bool, str, str], Path] = {}

    def make(
        variant: str, attention_mask: bool = True, lowering: str = "plugin", dtype: str = "fp32"
    ) -> Path:
        key = (variant, attention_mask, lowering, dtype)
        if key not in made:
            out = tmp_path_factory.mktemp(f"{variant}-{lowering}-{dtype}") / "out"
            model = tiny_model(variant)
            options = {**TINY, "export.dtype": dtype, "export.lowering": lowering, "verify.enabled": False}
            options |= {"attention_mask": attention_mask} if model == "encoder" else {}
            export(variant, out, model=model, options=options)
            made[key] = out
        return made[key]

    return make
