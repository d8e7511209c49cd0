"""Each variant test module's cached one-node sessions end with the module (op_harness.close_sessions)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.plugins import op_harness


@pytest.fixture(autouse=True, scope="module")
def _module_sessions() -> Iterator[None]:
    yield
    op_harness.close_sessions()
