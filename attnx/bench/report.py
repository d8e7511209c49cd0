"""Benchmark results: measurements, scaling fits, the JSON file and the terminal tables."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from attnx.atomic import write_atomic
from attnx.bench.scaling import fit_slope

SCHEMA_VERSION = 1
MiB = 1 << 20


@dataclasses.dataclass
class Measurement:
    """One (model, backend, batch, N) case; ``status`` is "ok", "skipped" or "failed" (with ``reason``).

    Memory: ``load_rss_bytes`` is what loading left resident (weights, session);
    ``peak_rss_bytes`` the peak over load, warm-up and timed runs; both are deltas over
    the RSS before the load. ``process_peak_rss_bytes``: the whole measuring process's
    peak, only for isolated runs (``--isolate``).
    """

    model: str
    out: str
    variant: str
    backend: str
    batch: int
    seq_len: int
    status: str
    reason: str = ""
    timings_s: list[float] = dataclasses.field(default_factory=list)
    warmup: int = 0
    load_s: float | None = None
    load_rss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    process_peak_rss_bytes: int | None = None
    estimated_bytes: int | None = None
    flops: int | None = None
    threads: int | None = None
    providers: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.timings_s)

    @property
    def median_s(self) -> float | None:
        return float(np.median(self.timings_s)) if self.ok else None

    @property
    def p90_s(self) -> float | None:
        return float(np.percentile(self.timings_s, 90)) if self.ok else None

    @property
    def min_s(self) -> float | None:
        return min(self.timings_s) if self.ok else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.batch * self.seq_len / self.median_s if self.ok else None

    @property
    def flops_per_s(self) -> float | None:
        return self.flops / self.median_s if self.ok and self.flops else None

    def to_dict(self) -> dict[str, Any]:
        stats = {k: getattr(self, k) for k in ("median_s", "p90_s", "min_s", "tokens_per_s", "flops_per_s")}
        return {**dataclasses.asdict(self), **stats}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Log-log slope of median latency vs N for one model, backend and batch."""

    model: str
    variant: str
    backend: str
    batch: int
    seq_lens: list[int]
    median_s: list[float]
    slope: float


def fit_scaling(measurements: Iterable[Measurement]) -> list[Scaling]:
    """A slope for every (model, backend, batch) measured at two or more lengths."""
    groups: dict[tuple[str, str, str, int], list[Measurement]] = {}
    for m in measurements:
        if m.ok:
            groups.setdefault((m.model, m.variant, m.backend, m.batch), []).append(m)
    fits = []
    for (model, variant, backend, batch), group in groups.items():
        group.sort(key=lambda m: m.seq_len)
        lengths, latencies = [m.seq_len for m in group], [m.median_s for m in group]
        if len(set(lengths)) >= 2:
            slope = fit_slope(lengths, latencies)
            fits.append(Scaling(model, variant, backend, batch, lengths, latencies, slope))
    return fits


@dataclasses.dataclass
class BenchReport:
    machine: dict[str, Any]
    versions: dict[str, str | None]
    settings: dict[str, Any]
    models: list[dict[str, Any]]
    measurements: list[Measurement]

    @property
    def scaling(self) -> list[Scaling]:
        return fit_scaling(self.measurements)

    @property
    def failed(self) -> list[Measurement]:
        return [m for m in self.measurements if m.status == "failed"]

    def find(self, model: str, backend: str, seq_len: int, batch: int | None = None) -> Measurement | None:
        for m in self.measurements:
            if (m.model, m.backend, m.seq_len) == (model, backend, seq_len) and batch in (None, m.batch):
                return m
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "machine": self.machine,
            "versions": self.versions,
            "settings": self.settings,
            "models": self.models,
            "measurements": [m.to_dict() for m in self.measurements],
            "scaling": [dataclasses.asdict(s) for s in self.scaling],
        }

    def write_json(self, path: str | Path) -> None:
        write_atomic(Path(path), json.dumps(self.to_dict(), indent=2) + "\n")


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.3g}" if seconds < 1 else f"{seconds * 1e3:.0f}"


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / MiB:.0f}"


def _not_run(measurements: Iterable[Measurement]) -> dict[tuple[Any, ...], list[str]]:
    """Skipped and failed cases grouped by (status, model, backend, batch, reason) -> lengths."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for m in measurements:
        if not m.ok:
            groups.setdefault((m.status, m.model, m.backend, m.batch, m.reason), []).append(str(m.seq_len))
    return groups


def print_report(report: BenchReport, console: Any = None) -> None:
    """The measurement table, the skipped/failed cases with reasons, and the slopes."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
    s = report.settings
    table = Table(title=f"attnx bench — {report.machine.get('cpu')}, {s.get('threads')} threads, "
                        f"warm-up {s.get('warmup')}, ≤{s.get('repeat')} runs")
    for column in ("model", "backend", "batch", "N", "median ms", "p90 ms", "min ms", "tokens/s", "GFLOP/s",
                   "peak MiB", "runs"):
        table.add_column(column, justify="left" if column in ("model", "backend") else "right")
    for m in report.measurements:
        if m.ok:
            rate = "" if m.flops_per_s is None else f"{m.flops_per_s / 1e9:.1f}"
            table.add_row(m.model, m.backend, str(m.batch), str(m.seq_len), _ms(m.median_s), _ms(m.p90_s),
                          _ms(m.min_s), f"{m.tokens_per_s:,.0f}", rate, _mib(m.peak_rss_bytes),
                          str(len(m.timings_s)))
    console.print(table)
    for (status, model, backend, batch, reason), lengths in _not_run(report.measurements).items():
        console.print(f"{status} {model} {backend} batch {batch} N={','.join(lengths)}: {reason}",
                      markup=False, highlight=False)
    fits = report.scaling
    if fits:
        slopes = Table(title="scaling: least-squares slope of log latency vs log N")
        for column in ("model", "backend", "batch", "N", "slope"):
            slopes.add_column(column, justify="right" if column in ("batch", "slope") else "left")
        for f in fits:
            slopes.add_row(f.model, f.backend, str(f.batch), ",".join(map(str, f.seq_lens)), f"{f.slope:.2f}")
        console.print(slopes)


@contextmanager
def progress_bar(quiet: bool) -> Iterator[Callable[[int, int, str], None] | None]:
    """A rich progress bar on stderr, advanced by bench's (done, total, case) callback;
    one line per case instead when stderr is not a terminal (logs, CI)."""
    if quiet:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:

        def line(done: int, total: int, case: str) -> None:
            if done < total:
                print(f"· [{done + 1}/{total}] {case}", file=sys.stderr, flush=True)

        yield line
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("bench", total=None)

        def update(done: int, total: int, case: str) -> None:
            bar.update(task, completed=done, total=total, description=case)

        yield update
