"""benchmarks/gated.py's device rows (``--device cuda``: the torch op, attnx's Triton kernel and
flash-linear-attention's chunk kernels side by side) on the CPU, the kernels in Triton's interpreter
(tests/conftest.py): every rule's inputs reach each kernel in its own layout, so a GPU run measures the
same computation. A lent GPU runs for minutes; the script must not be what fails there."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'attnx[triton]'")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def gated(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("gated")


def test_attnx_triton_kernel_rows_agree_with_the_torch_op(gated):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: run the script itself (bash benchmarks/gpu_checks.sh)")
    for rule in gated.RULES:
        x = gated.inputs(rule, 9, seed=1, heads=gated.Heads(1, 2, 8))
        with torch.no_grad():
            found = gated.differences(
                gated.device_runners(x, rule, gated.default_chunk(rule), ["torch", "triton"])
            )
        assert found["triton"] < 1e-5, (rule, found)


def test_flash_linear_attention_kernel_rows_agree_with_the_torch_op(gated):
    """Each rule's mapping onto the library's kernels (layouts, grouped value heads, beta, the delta rule as
    g = 0), across its 64-token chunk."""
    pytest.importorskip("fla", reason="flash-linear-attention is not installed (pip install 'attnx[fla]')")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: run the script itself (bash benchmarks/gpu_checks.sh)")
    from attnx.adapters.fla.cpu import import_library

    import_library()
    for rule in ("gated", "gla", "delta", "gated_delta", "kda"):
        x = gated.inputs(rule, 70, seed=2, heads=gated.Heads(1, 2, 16))
        with torch.no_grad():
            found = gated.differences(
                gated.device_runners(x, rule, gated.default_chunk(rule), ["torch", "fla"])
            )
        assert found["fla"] < 1e-5, (rule, found)
