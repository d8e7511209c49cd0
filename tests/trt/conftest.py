"""Shared plugin-lowered exports (one per variant and mask setting, made once per session)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from attnx.api import export
from attnx.registry import get_registry
from tests.conftest import TINY

VARIANTS = sorted(get_registry().variants)


@pytest.fixture(scope="session")
def plugin_export(tmp_path_factory) -> Callable[..., Path]:
    """``plugin_export(variant, attention_mask=True, lowering="plugin", dtype="fp32")`` -> OUT of a tiny
    export (cached)."""
    made: dict[tuple[str, bool, str, str], Path] = {}

    def make(
        variant: str, attention_mask: bool = True, lowering: str = "plugin", dtype: str = "fp32"
    ) -> Path:
        key = (variant, attention_mask, lowering, dtype)
        if key not in made:
            out = tmp_path_factory.mktemp(f"{variant}-{lowering}-{dtype}") / "out"
            options = {**TINY, "attention_mask": attention_mask, "export.dtype": dtype}
            export(variant, out, options={**options, "export.lowering": lowering, "verify.enabled": False})
            made[key] = out
        return made[key]

    return make
