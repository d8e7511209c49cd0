"""Decode exports shared by the tests of this package (one per variant, made on first use)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY
from tests.helpers import run_cli
from tests.models.cases import decoders

DECODERS = tuple(decoders())  # every variant that declares Capabilities.decode
EXPORT_SEQ_LENS = (1, 6)


def lm_options(variant: str, **overrides: Any) -> dict[str, Any]:
    return {**TINY, **overrides}


@pytest.fixture(scope="session")
def decode_export(tmp_path_factory) -> Callable[..., tuple[Path, str]]:
    """``decode_export(variant, model="lm", cross=None)`` -> (OUT, stdout) of a verified tiny decode
    export (``cross``: the seq2seq cross-attention variant; None: the default, softmax)."""
    made: dict[tuple[str, str, str | None], tuple[Path, str]] = {}

    def get(variant: str, model: str = "lm", cross: str | None = None) -> tuple[Path, str]:
        if (variant, model, cross) not in made:
            out = tmp_path_factory.mktemp(f"decode-{model}-{variant}-{cross}") / "out"
            layers = {"n_decoder_layers": 2} if model == "seq2seq" else {}
            settings = lm_options(variant, **layers)
            options = [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]
            options += ["--cross-variant", cross] if cross else []
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
            made[(variant, model, cross)] = (out, stdout)
        return made[(variant, model, cross)]

    return get
