"""The trained small Hugging Face hybrids (made once per recipe, cached on disk: attnx.testing.hf_hybrid)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from attnx.testing import hf_hybrid  # noqa: E402

# Every architecture in the slow set; the default run keeps the attention hybrids and, of the Mamba
# models, one SSD hybrid (Granite 4.0-H: its mixer, attention without positions, MoE) and one selective
# scan (Mamba: the model that takes its 2D mask itself), within the suite's time
QUICK = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "kimi_linear", "minimax", "granitemoehybrid", "mamba")
ARCHS = tuple(a if a in QUICK else pytest.param(a, marks=pytest.mark.slow) for a in hf_hybrid.RECIPES)


@pytest.fixture(autouse=True, scope="session")
def _hf_runs_its_torch_path():
    hf_hybrid.pure_torch_gated_delta()


def _directories(steps: int):
    """``get(arch)``: the save_pretrained directory of ``arch`` trained for ``steps`` (made once)."""
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = hf_hybrid.make(arch, steps=steps)
        return made[arch]

    return get


def _models(directory):
    """``get(arch)``: the HF model saved in ``directory(arch)``, in eval mode (loaded once; do not modify)."""
    import transformers

    loaded = {}

    def get(arch: str):
        if arch not in loaded:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cls = getattr(transformers, hf_hybrid.RECIPES[arch]["class"])
                loaded[arch] = cls.from_pretrained(directory(arch)).eval()
        return loaded[arch]

    return get


@pytest.fixture(scope="session")
def saved_dir():
    """``saved_dir(arch)``: the save_pretrained directory of ``arch``'s trained model (slow tests: a
    fresh cache trains each recipe for minutes)."""
    return _directories(hf_hybrid.TRAINING["steps"])


@pytest.fixture(scope="session")
def trained(saved_dir):
    """``trained(arch)``: the trained HF model in eval mode."""
    return _models(saved_dir)


@pytest.fixture(scope="session")
def initial_dir():
    """``initial_dir(arch)``: ``arch``'s model as HF initialises it (seeded) with the trained tokenizer,
    saved: what the quick tests load, refuse and compare (seconds to make)."""
    return _directories(0)


@pytest.fixture(scope="session")
def initialised(initial_dir):
    """``initialised(arch)``: that model in eval mode."""
    return _models(initial_dir)


@pytest.fixture(params=["initialised", pytest.param("trained", marks=pytest.mark.slow)])
def hybrid(request):
    """``hybrid(arch)``: the model a parity test compares: as initialised in the default run, trained
    in the slow set (the same test, both weights)."""
    return request.getfixturevalue(request.param)
