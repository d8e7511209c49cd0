"""Decode exports shared by the tests of this package (one per variant, made on first use)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY
from tests.helpers import run_cli

DECODERS = ("softmax", "linear", "cosformer")
VARIANT_OPTIONS = {"cosformer": {"max_len": 64}}
EXPORT_SEQ_LENS = (1, 6)


def lm_options(variant: str, **overrides: Any) -> dict[str, Any]:
    return {**TINY, **VARIANT_OPTIONS.get(variant, {}), **overrides}


@pytest.fixture(scope="session")
def decode_export(tmp_path_factory) -> Callable[..., tuple[Path, str]]:
    """``decode_export(variant, model="lm")`` -> (OUT, stdout) of a verified tiny decode export."""
    made: dict[tuple[str, str], tuple[Path, str]] = {}

    def get(variant: str, model: str = "lm") -> tuple[Path, str]:
        if (variant, model) not in made:
            out = tmp_path_factory.mktemp(f"decode-{model}-{variant}") / "out"
            options = [arg for k, v in lm_options(variant).items() for arg in ("--set", f"{k}={v}")]
            seq_lens = ",".join(map(str, EXPORT_SEQ_LENS))
            args = [
                "export",
                "--model",
                model,
                "--variant",
                variant,
                "--decode",
                "-o",
                str(out),
                "--seed",
                "1",
            ]
            code, stdout, stderr = run_cli([*args, "--seq-lens", seq_lens, *options])
            assert code == 0, stderr
            made[(variant, model)] = (out, stdout)
        return made[(variant, model)]

    return get
