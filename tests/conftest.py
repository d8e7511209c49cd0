"""Shared fixtures: registries with extra plugins, tiny export options. The suite's plumbing is in
:mod:`tests.suite` (pytest-xdist scheduling, hygiene), loaded here as plugins."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator

import pytest
import torch

from attnx.registry import Registry, set_registry

pytest_plugins = ["tests.suite.scheduling", "tests.suite.hygiene"]

# Without CUDA, the Triton kernel tests (tests/kernels) run in Triton's interpreter, which triton
# fixes when it is first imported; torch._dynamo (the ONNX exporter) imports it, so switch it on now.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 50}


@pytest.fixture
def use_registry() -> Iterator:
    """Install a registry with extra plugins: ``use_registry(("name", "module"), ...)``."""
    previous = set_registry(None)

    def install(*plugins: tuple[str, str]) -> Registry:
        registry = Registry(plugins=[(name, importlib.import_module(mod), "test") for name, mod in plugins])
        set_registry(registry)
        return registry

    yield install
    set_registry(previous)
