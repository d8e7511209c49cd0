"""Registries with the toy adapter of tests/third_party (a library defined outside attnx)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tests.third_party.toy_adapter as toy
from attnx.registry import Registry, set_registry


@pytest.fixture
def toy_registry() -> Iterator[Registry]:
    """The installed plugins plus the toy adapter."""
    registry = Registry(plugins=[("toy", toy, "test")])
    previous = set_registry(registry)
    yield registry
    set_registry(previous)


@pytest.fixture
def swapped_registry() -> Iterator[Registry]:
    """The toy adapter's seeded defect (k/v weights swapped) instead of the toy adapter."""
    registry = Registry(plugins=[("toy", toy.Swapped(), "test")])
    previous = set_registry(registry)
    yield registry
    set_registry(previous)
