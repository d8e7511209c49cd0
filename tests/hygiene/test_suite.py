"""The suite's own promises: it runs in a random order with the seed printed, a test that leaves
global state changed fails, and children that must take Ctrl-C take it however the suite started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO, interruptible

POLLUTER = """
import torch._dynamo.config


def test_clean():
    pass


def test_deletes_a_dynamo_option():
    # what pytest 9.2's monkeypatch.setattr(torch._dynamo.config, ...) leaves at undo (the option is
    # not in the module's __dict__, so undo deletes it): later torch.compile calls fail
    del torch._dynamo.config.recompile_limit
"""


def test_the_default_run_shuffles_the_tests(request):
    assert request.config.pluginmanager.hasplugin("randomly")
    assert request.config.getoption("randomly_reorganize")


@pytest.mark.slow  # a pytest run in a fresh process: the suite's own plumbing
def test_a_test_that_leaves_dynamo_config_broken_fails_and_the_seed_is_printed_under_q(tmp_path):
    hooks = 'pytest_plugins = ["tests.suite.hygiene"]  # as tests/conftest.py loads it\n'
    (tmp_path / "conftest.py").write_text(hooks)
    (tmp_path / "test_polluter.py").write_text(POLLUTER)
    pytest_args = ["-q", "-p", "randomly", "-p", "no:cacheprovider", "--randomly-seed=7"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 passed, 1 error" in run.stdout, run.stdout  # the polluter passes, then fails at teardown
    assert "torch._dynamo.config.recompile_limit" in run.stdout and "unreadable" in run.stdout, run.stdout
    assert "seed 7: rerun this order with -p randomly --randomly-seed=7" in run.stdout, run.stdout


def test_a_child_takes_ctrl_c_when_the_suite_ignores_it(tmp_path: Path):
    """What `nohup` or `setsid ... &` do to the suite: SIGINT ignored, inherited by every child."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        setup = "import sys; print('ready', flush=True)"
        child = subprocess.Popen(
            interruptible("timeit", "-n", "1", "-s", setup, "import time; time.sleep(120)"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert "KeyboardInterrupt" in stderr, stderr
    assert child.returncode != 0


@pytest.mark.parametrize("ignored", [True, False], ids=["ignored", "default"])
def test_interruptible_runs_the_module_with_its_arguments(ignored: bool):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
    try:
        code = textwrap.dedent("print(1 + 1)")
        run = subprocess.run(
            interruptible("timeit", "-n", "1", "-r", "1", code), capture_output=True, text=True, timeout=60
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert run.returncode == 0 and run.stdout.startswith("2"), run.stdout + run.stderr


def test_torch_starts_every_test_from_the_run_seed(request):
    import torch

    drawn = torch.rand(3)
    torch.manual_seed(request.config.option.randomly_seed)
    assert torch.equal(drawn, torch.rand(3))


@pytest.fixture(scope="module")
def made_once_per_module() -> None:
    """A module-scoped fixture: the tests that ask for it form one pytest-xdist group."""


def test_a_test_sharing_a_fixture_tells_pytest_xdist_its_group(request, made_once_per_module):
    """Under --dist loadgroup a worker reports each test's group at the end of its node id, and only so
    do the tests sharing an export run on one worker; without it each worker makes the export again."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not a pytest-xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith("@tests/hygiene/test_suite.py:made_once_per_module")
