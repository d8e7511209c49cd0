"""The trained small Hugging Face hybrids (made once per recipe, cached on disk: attnx.testing.hf_hybrid)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from attnx.testing import hf_hybrid  # noqa: E402

ARCHS = tuple(hf_hybrid.RECIPES)


@pytest.fixture(autouse=True, scope="session")
def _hf_runs_its_torch_path():
    hf_hybrid.pure_torch_gated_delta()


@pytest.fixture(scope="session")
def saved_dir():
    """``saved_dir(arch)``: the save_pretrained directory of ``arch``'s trained model."""
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = hf_hybrid.make(arch)
        return made[arch]

    return get


@pytest.fixture(scope="session")
def trained(saved_dir):
    """``trained(arch)``: the trained HF model in eval mode (loaded once per session; do not modify)."""
    import transformers

    loaded = {}

    def get(arch: str):
        if arch not in loaded:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cls = getattr(transformers, hf_hybrid.RECIPES[arch]["class"])
                loaded[arch] = cls.from_pretrained(saved_dir(arch)).eval()
        return loaded[arch]

    return get
