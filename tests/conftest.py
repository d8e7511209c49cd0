"""Shared fixtures: registries with extra plugins, tiny export options; the suite's hygiene (random
order with the seed printed, no test leaves global torch or attnx state changed, one compute thread per
worker process of pytest-xdist)."""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from attnx import registry as registry_module
from attnx.registry import Registry, set_registry

# Without CUDA, the Triton kernel tests (tests/kernels) run in Triton's interpreter, which triton
# fixes when it is first imported; torch._dynamo (the ONNX exporter) imports it, so switch it on now.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 50}


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: as many workers run as there are cores
        one_compute_thread()


@pytest.hookimpl(wrapper=True, tryfirst=True)  # around pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    group_shared_fixtures(items)
    yield
    if getattr(config.option, "loadgroup", False):  # a pytest-xdist worker under --dist loadgroup
        groups_in_node_ids(items)


def group_shared_fixtures(items: list[pytest.Item]) -> None:
    """The tests that share a fixture made once per session or module (an export, a trained model, a
    server), directly or through other fixtures, form one ``xdist_group``: ``--dist loadgroup`` runs
    them on one worker, so it is made once; every other test goes to whichever worker is free."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    shared = {item: shared_fixtures(item) for item in items}
    for keys in shared.values():
        for key in keys:
            parent[root(key)] = root(min(keys))
    names: dict[str, str] = {}  # each group is named after its first key, whatever the order of the tests
    for key in sorted(parent):
        names.setdefault(root(key), key)
    for item, keys in shared.items():
        if keys:
            item.add_marker(pytest.mark.xdist_group(names[root(min(keys))]))


def groups_in_node_ids(items: list[pytest.Item]) -> None:
    """Each grouped test's node id ends in ``@<group>``, which is how a worker tells pytest-xdist's
    scheduler the group. pytest-xdist 3.8 appends it by setting ``item._nodeid``, which pytest 9.2 no
    longer reads (the id is the structured ``item._id``; pytest-dev/pytest-xdist#1386): every group
    would be spread over the workers, each making the shared fixture again. Append it there."""
    for item in items:
        marks = item.iter_markers("xdist_group")
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            from _pytest.nodeid import NodeId  # only the pytest versions that have it get here

            item._id = NodeId.parse(item.nodeid + suffix)


def shared_fixtures(item: pytest.Item) -> set[str]:
    """The session- and module-scoped fixtures of the suite that ``item`` asks for, directly or through
    other fixtures (autouse ones, which every test of a folder gets, are left out), as ``where:name``."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    definitions, asked, seen, keys = info.name2fixturedefs, list(info.argnames), set(), set()
    while asked:
        name = asked.pop()
        if name in seen or not definitions.get(name):
            continue
        seen.add(name)
        fixture = definitions[name][-1]  # the one in effect for this test
        asked.extend(fixture.argnames)
        if not fixture.baseid:  # pytest's or a plugin's (tmp_path_factory, ...)
            continue
        if fixture.scope in ("session", "package"):
            keys.add(f"{fixture.baseid}:{name}")
        elif fixture.scope == "module":
            keys.add(f"{item.nodeid.split('::')[0]}:{name}")
    return keys


def one_compute_thread() -> None:
    """torch, every ONNX Runtime session that does not choose its own intra-op threads, and the children
    this process starts (OMP_NUM_THREADS) compute on one thread: the workers share the cores, and
    threads waiting on each other's barriers across busy cores make the tiny ops of the tests slower."""
    import onnxruntime

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    init = onnxruntime.InferenceSession.__init__

    @functools.wraps(init)
    def one_thread(self: Any, model: Any, sess_options: Any = None, *args: Any, **kwargs: Any) -> None:
        options = onnxruntime.SessionOptions() if sess_options is None else sess_options
        if options.intra_op_num_threads == 0:  # ONNX Runtime's default: one thread per core
            options.intra_op_num_threads = 1
        init(self, model, options, *args, **kwargs)

    onnxruntime.InferenceSession.__init__ = one_thread


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
