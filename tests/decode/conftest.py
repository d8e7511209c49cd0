"""Decode exports shared by the tests of this package (one per variant, made on first use)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY

DECODERS = ("softmax", "linear", "cosformer")
VARIANT_OPTIONS = {"cosformer": {"max_len": 64}}
EXPORT_SEQ_LENS = (1, 6)


def lm_options(variant: str, **overrides: Any) -> dict[str, Any]:
    return {**TINY, **VARIANT_OPTIONS.get(variant, {}), **overrides}


@pytest.fixture(scope="session")
def decode_export(tmp_path_factory) -> Callable[[str], tuple[Path, Any]]:
    """``decode_export(variant)`` -> (OUT, ExportResult) of a verified tiny ``lm --decode`` export."""
    from attnx.exporter.export import export

    made: dict[str, tuple[Path, Any]] = {}

    def get(variant: str) -> tuple[Path, Any]:
        if variant not in made:
            out = tmp_path_factory.mktemp(f"decode-{variant}") / "out"
            result = export(
                variant,
                out,
                model="lm",
                decode=True,
                options=lm_options(variant),
                seq_lens=EXPORT_SEQ_LENS,
                seed=1,
            )
            made[variant] = (out, result)
        return made[variant]

    return get
