"""How the suite runs on pytest-xdist: the tests that share a fixture made once (an export, a trained
model, a server) form one ``xdist_group``, which ``--dist loadgroup`` keeps on one worker, and every
worker computes on one thread (the workers share the cores)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch


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
