"""Test helpers: drive the real CLI entry point (error mapping included)."""

from __future__ import annotations

import contextlib
import io
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
