"""attnx.exporter.beside: the graphs after model.onnx made in a forked process while model.onnx converts."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from attnx.errors import AttnxError
from attnx.exporter.beside import beside, spare_core

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="beside forks; this platform has no os.fork")
# (the tests fork wherever os.fork exists; the exporter itself forks on Linux only: spare_core)


def test_the_work_runs_in_a_child_while_the_block_runs_and_its_result_comes_back():
    parent = os.getpid()
    with beside(lambda: (os.getpid(), time.monotonic(), list(range(5))), parallel=True) as result:
        time.sleep(0.5)  # the child's work is done well before the block ends
        ended = time.monotonic()
    pid, finished, value = result()
    assert pid != parent and value == [0, 1, 2, 3, 4]
    assert finished < ended


def test_without_a_spare_core_the_work_runs_after_the_block_in_this_process():
    order = []
    with beside(lambda: order.append("work") or os.getpid(), parallel=False) as result:
        order.append("block")
    assert result() == os.getpid()
    assert order == ["block", "work"]


def test_a_refusal_in_the_child_is_the_same_one_line_error_here():
    def refuse() -> None:
        raise AttnxError("--decode: this layer cannot step; export it without --decode")

    with beside(refuse, parallel=True) as result:
        pass
    with pytest.raises(AttnxError, match=r"^--decode: this layer cannot step; export it without --decode$"):
        result()


def test_a_bug_in_the_child_is_raised_here_with_the_childs_traceback():
    def broken() -> None:
        raise KeyError("missing-graph-input")

    with beside(broken, parallel=True) as result:
        pass
    with pytest.raises(RuntimeError, match="in its own process") as raised:
        result()
    assert "KeyError: 'missing-graph-input'" in str(raised.value) and "in broken" in str(raised.value)


def test_when_the_block_fails_the_child_is_stopped_and_the_blocks_error_passes_on(tmp_path):
    marker = tmp_path / "finished"

    def slow() -> None:
        time.sleep(30)
        marker.write_text("the child outlived the failed block")

    started = time.monotonic()
    with pytest.raises(ValueError, match="model.onnx failed"), beside(slow, parallel=True):
        raise ValueError("model.onnx failed")
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    assert not marker.exists()


def test_the_child_runs_none_of_the_parents_exit_handlers():
    """A staging directory's cleanup (a finaliser of the parent's) must not run when the child ends."""
    staging = tempfile.TemporaryDirectory()
    try:
        with beside(lambda: Path(staging.name).is_dir(), parallel=True) as result:
            pass
        assert result() is True
        time.sleep(0.2)
        assert Path(staging.name).is_dir()
    finally:
        staging.cleanup()


def test_a_spare_core_is_a_second_core_on_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert not spare_core()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert spare_core()
    monkeypatch.setattr(sys, "platform", "darwin")  # has fork, but its system frameworks are not fork-safe
    assert not spare_core()


@pytest.mark.skipif(not spare_core(), reason="one core: the decode graphs are made after model.onnx, here")
def test_a_refusal_while_the_decode_graphs_are_made_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """The decode graphs are made in the forked child; its refusal is the export's one-line error, exit 2,
    with no OUT and no staging directory left behind."""
    from attnx.decode.export import DecodeGraphs
    from tests.decode.conftest import lm_options
    from tests.helpers import assert_one_line_error, run_cli

    made_in = tmp_path / "pid"

    def refuse(self, assembly, directory, settings, store):
        made_in.write_text(str(os.getpid()))
        raise AttnxError("decode graphs refused by the test; export without --decode")

    monkeypatch.setattr(DecodeGraphs, "export", refuse)
    out = tmp_path / "out"
    options = [arg for key, value in lm_options("linear").items() for arg in ("--set", f"{key}={value}")]
    args = ["export", "--model", "lm", "--variant", "linear", "--decode", "--no-verify", "-o", str(out)]
    code, _, stderr = run_cli([*args, *options])
    assert_one_line_error(code, stderr, "decode graphs refused by the test")
    assert int(made_in.read_text()) != os.getpid()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pid"]


def test_without_a_spare_core_the_decode_graphs_follow_model_onnx_with_their_estimate(tmp_path, monkeypatch):
    """The fallback path of the exporter itself: everything in this process, the decode graphs after
    model.onnx, their progress line estimated from model.onnx's conversion."""
    from attnx.exporter import export
    from tests.decode.conftest import lm_options
    from tests.helpers import run_cli

    monkeypatch.setattr(export, "spare_core", lambda: False)
    out = tmp_path / "out"
    options = [arg for key, value in lm_options("linear").items() for arg in ("--set", f"{key}={value}")]
    args = ["export", "--model", "lm", "--variant", "linear", "--decode", "--no-verify", "-o", str(out)]
    code, _, stderr = run_cli([*args, *options])
    assert code == 0, stderr
    assert "exporting the decode graphs (1 trace, about " in stderr
    assert "in a second process" not in stderr
    assert {"model.onnx", "prefill.onnx", "decode.onnx", "attnx.json"} <= {p.name for p in out.iterdir()}
