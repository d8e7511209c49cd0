"""Test helpers: drive the real CLI entry point (error mapping included)."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from attnx.cli import main


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """Run ``attnx ARGS`` through the console entry point; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, stderr: str, *fragments: str) -> None:
    """Exit code 2, exactly one 'Error:' line, no traceback, containing every fragment."""
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("·")]
    assert code == 2, f"exit code {code}, stderr: {stderr}"
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        if fragment not in lines[0]:
            pytest.fail(f"{fragment!r} not in error line {lines[0]!r}")


def assert_unchanged(actual: Any, expected: Any, what: str = "") -> None:
    """``actual`` equals ``expected`` up to the rounding of correct kernels (the conformance kit's
    causality bound, ``attnx.testing.checks.causality.rounding_bound``). Bit equality would depend
    on the CPU: BLAS may block a matmul differently once other rows of its input change."""
    from attnx.testing.checks.causality import rounding_bound

    assert actual.shape == expected.shape, what
    change = float((actual.double() - expected.double()).abs().max()) if actual.numel() else 0.0
    bound = rounding_bound(expected)
    assert change <= bound, f"{what} changed by {change:.3g} (rounding allows {bound:.3g})"


# Python installs its Ctrl-C handler only where SIGINT is not ignored, and a child inherits an ignored
# SIGINT from a suite started in the background (`nohup`, `setsid ... &`, some CI runners).
_INTERRUPTIBLE = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "del sys.argv[0]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def interruptible(module: str, *args: str) -> list[str]:
    """The argv of ``python -m MODULE ARGS`` in a child that takes Ctrl-C (SIGINT raises
    KeyboardInterrupt) however this process was started."""
    return [sys.executable, "-c", _INTERRUPTIBLE, module, *args]


REPO = Path(__file__).resolve().parents[1]
_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from attnx.atomic import staged_directory
    out, signal_file = Path(sys.argv[1]), Path(sys.argv[2])
    with staged_directory(out, marker="attnx.json") as staging:
        (staging / "attnx.json").write_text("{}")
        signal_file.write_text("inside")
        time.sleep(float(sys.argv[3]))
    """
)


def start_holder(out: Path, seconds: float) -> subprocess.Popen:
    """A process inside ``staged_directory(out)`` (lock held, staging folder written) for ``seconds``."""
    inside = out.parent / ".holder-inside"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out), str(inside), str(seconds)], cwd=REPO)
    deadline = time.monotonic() + 60
    while not inside.exists():
        assert holder.poll() is None and time.monotonic() < deadline, "holder did not start"
        time.sleep(0.02)
    inside.unlink()
    return holder
