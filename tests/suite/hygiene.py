"""The suite's hygiene: torch's RNG starts every test from the run's seed, a test that leaves global torch
or attnx state changed fails, and the random order's seed is printed (also under -q)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from attnx import registry as registry_module


def global_state() -> dict[str, Any]:
    """What one test could change for every later test in the process: torch's global switches, every
    Dynamo option (read as Dynamo reads them: an option deleted by a careless undo no longer reads),
    and the plugins of the process-wide registry (None: rebuilt from the environment on first use)."""
    import torch._dynamo.config as dynamo

    def readable(name: str) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated options warn on every read
                return repr(getattr(dynamo, name))
        except AttributeError as exc:
            return f"unreadable: {exc}"

    current = registry_module._registry
    plugins = None if current is None else sorted([*current.variants, *current.models, *current.adapters])
    return {
        "default dtype": torch.get_default_dtype(),
        "grad enabled": torch.is_grad_enabled(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch threads": torch.get_num_threads(),
        "registry": plugins,
        **{f"torch._dynamo.config.{name}": readable(name) for name in dynamo.get_config_copy()},
    }


@pytest.fixture(autouse=True)
def seeded_torch(request: pytest.FixtureRequest) -> None:
    """torch's global RNG starts every test from the run's seed, as pytest-randomly resets ``random`` and
    numpy's: what a test draws does not depend on the tests that ran before it."""
    seed = getattr(request.config.option, "randomly_seed", 0)
    torch.manual_seed(seed if isinstance(seed, int) else 0)


@pytest.fixture(autouse=True)
def leaves_global_state_alone() -> Iterator[None]:
    """Fail a test that leaves global state changed (it would make later tests depend on the order)."""
    before = global_state()
    yield
    after = global_state()
    if after["registry"] is None or before["registry"] is None:  # dropped: rebuilt as it was on first use
        after["registry"] = before["registry"]
    changed = {key: (before[key], after.get(key)) for key in before if after.get(key) != before[key]}
    if changed:
        pytest.fail(f"the test left global state changed (before, after): {changed}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The random order's seed, also under -q (which hides pytest-randomly's header line)."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and config.pluginmanager.hasplugin("randomly"):
        rerun = f"rerun this order with -p randomly --randomly-seed={seed}"
        terminalreporter.write_line(f"tests ran in random order, seed {seed}: {rerun}")
