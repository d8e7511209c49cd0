"""Tiny exported models shared by the bench tests (exported once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY


@pytest.fixture(scope="session")
def tiny_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer d_model 32 softmax encoder exported to ONNX (no parity check)."""
    from attnx.api import export

    out = tmp_path_factory.mktemp("bench") / "softmax-tiny"
    export("softmax", out, options={**TINY, "verify.enabled": False})
    return out
