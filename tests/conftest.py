"""Shared fixtures: registries with extra plugins, tiny export options. The suite's plumbing is in
:mod:`tests.suite` (pytest-xdist scheduling, hygiene), loaded here as plugins."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(scope="session")
def triton_cache(request, tmp_path_factory) -> Path:
    """A folder kept between runs (pytest's cache, else a session folder): the tritonserver wheel's files
    and the python backend's environment are fetched and built once."""
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("attnx-triton") if cache is not None else tmp_path_factory.mktemp("attnx-triton")


@pytest.fixture(scope="session")
def triton_build(triton_cache) -> Path:
    """The ``nvidia-pytriton`` wheel's server build (skipped, with the reason, where it cannot be fetched)."""
    from tests.serve.tritonserver import Unavailable, server_build

    try:
        return server_build(triton_cache)
    except Unavailable as exc:
        pytest.skip(f"no tritonserver to test with: {exc}")
