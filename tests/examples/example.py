"""examples/train_digits.py as a module (examples/ is not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def train_digits() -> ModuleType:
    """The example module; skipped with the reason when scikit-learn (the ``examples`` extra) is missing."""
    pytest.importorskip(
        "sklearn", reason="examples/train_digits.py needs scikit-learn (pip install 'attnx[dev]')"
    )
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLES / "train_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
