"""Options and output helpers shared by the commands."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import click

from attnx.errors import AttnxError


def parse_int_list(value: str | None, what: str) -> list[int] | None:
    """ "1,7,32" -> [1, 7, 32]; None stays None."""
    if value is None:
        return None
    try:
        numbers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise AttnxError(f"{what} must be comma-separated integers, e.g. 1,7,32 (got '{value}')") from None
    if not numbers or any(n < 1 for n in numbers):
        raise AttnxError(f"{what} must be positive integers, e.g. 1,7,32 (got '{value}')")
    return numbers


def parse_name_list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(func)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def progress_printer(quiet: bool) -> Callable[[str], None]:
    """Report long-running stages on stderr (stdout stays clean for --json), each with the time since
    the command started ("· [  12 s] exporting ...")."""
    start = time.monotonic()

    def report(message: str) -> None:
        if not quiet:
            click.echo(f"· [{time.monotonic() - start:5.0f} s] {message} ...", err=True)

    return report


def console() -> Any:
    """A rich Console for stdout whose broken pipe (``attnx list | head -1``) reaches the CLI's
    handler (exit 0) like any other write; rich itself would exit with 1."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return PipeConsole(soft_wrap=True)


def tolerance_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "--rtol", type=float, default=None, help="Relative tolerance (default: the variant's)."
    )(func)
    func = click.option(
        "--atol", type=float, default=None, help="Absolute tolerance (default: the variant's)."
    )(func)
    return click.option(
        "--seq-lens",
        default=None,
        metavar="N,N,...",
        help="Sequence lengths to compare at (default 1,7,32,129).",
    )(func)


def print_parity(report: Any) -> None:
    """The per-backend, per-output parity table."""
    from rich.table import Table

    table = Table(title=f"parity vs torch (atol={report.atol:g}, rtol={report.rtol:g}, seed={report.seed})")
    for column in ("backend", "seq len", "output", "max abs err", "max rel err", "result"):
        table.add_column(column, justify="right" if "err" in column or column == "seq len" else "left")
    for backend in report.ran:
        own = backend.tolerance
        label = backend.backend + (f" (atol={own['atol']:g}, rtol={own['rtol']:g})" if own else "")
        for c in backend.comparisons:
            table.add_row(
                label,
                str(c.seq_len),
                c.output,
                f"{c.max_abs:.3g}",
                f"{c.max_rel:.3g}",
                "pass" if c.passed else "FAIL",
            )
    console().print(table)
    if report.fp32_drift:
        worst = max(report.fp32_drift, key=lambda d: d.max_abs)
        click.echo(
            f"{report.dtype} vs float32 torch on the same weights (informational): max abs "
            f"{worst.max_abs:.3g} ({worst.output}, seq len {worst.seq_len})"
        )
    for backend in report.backends:
        if backend.status == "skipped":
            click.echo(f"skipped {backend.backend}: {backend.reason}")
    if report.weights:
        counts = ", ".join(f"{w.graph} {w.matched}" for w in report.weights)
        click.echo(f"weights matched with the torch model's: {counts}")
    for mismatch in report.weight_mismatches:
        click.echo(f"FAIL weights: {mismatch}")


def parity_summary(report: Any) -> str:
    if report.passed:
        return "parity: PASSED on " + ", ".join(b.backend for b in report.ran)
    if not report.ran:
        return "parity: NOT CHECKED (every backend was skipped)"
    failed = [b.backend for b in report.ran if b.status == "failed"]
    if report.weight_mismatches:
        more = len(report.weight_mismatches) - 1
        failed.append(f"weights: {report.weight_mismatches[0]}" + (f" (and {more} more)" if more else ""))
    return "parity: FAILED on " + ", ".join(failed)
