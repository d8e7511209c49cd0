"""Time several contenders on the same case in turns, so load on a shared machine hits them alike.

Every contender of a case (say attnx in torch and in ONNX Runtime, and a peer library's module) is
loaded once; then, per sequence length, each warms up (its first run's peak memory is measured with
:class:`attnx.bench.machine.MemoryProbe`, so it is the forward's working memory, not the load's),
and the timed runs go round the contenders: run ``i`` of every contender before run ``i + 1`` of any.
Inputs are fresh random arrays for every run, made outside the timed region. A contender that cannot
run is a ``skipped`` :class:`Measurement` with the reason; one that raises is ``failed`` at that
length and out of the later lengths' runs; neither stops the others. Before each length the memory
guard skips a contender whose estimated peak exceeds ``limit``. A runtime keeps what its largest run
allocated (ONNX Runtime's arena), so where the contenders' estimates together exceed ``limit`` they are
timed one at a time instead, each loaded only while it runs (its row says so): softmax's ONNX Runtime
sessions at N=16384, each fitting alone, held 24 GiB together.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Sequence

import numpy as np
from polygraphy.backend.base import BaseRunner

from attnx.bench.machine import MemoryProbe
from attnx.bench.report import Measurement
from attnx.bench.timing import MIN_RUNS, Feed, providers
from attnx.errors import first_line
from attnx.parity.runners import BackendSkipped

GiB = 1 << 30


@dataclasses.dataclass
class Contender:
    """One row of a side-by-side: a runner (made on demand) and the inputs it takes at length ``n``.

    ``skip``: why it cannot run here at all (a printed row, never a crash). ``estimate(n)``: its
    peak bytes at length ``n`` for the memory guard (None: unknown, not guarded).
    """

    name: str
    case: str
    variant: str
    make: Callable[[], BaseRunner] | None
    feed: Callable[[int, np.random.Generator], Feed] | None
    estimate: Callable[[int], int | None] = lambda n: None
    skip: str = ""


def round_robin(
    contenders: Sequence[Contender],
    seq_lens: Sequence[int],
    *,
    warmup: int,
    repeat: int,
    threads: int,
    rng: np.random.Generator,
    limit: int | None,
    max_time: float | None = None,
) -> list[Measurement]:
    """Measurements of every contender at every length (ascending), timed in turns (see module)."""
    rows: dict[tuple[str, int], Measurement] = {
        (c.name, n): Measurement(
            c.case, "", c.variant, c.name, 1, n, status="ok", warmup=warmup, threads=threads
        )
        for c in contenders
        for n in seq_lens
    }
    live: dict[str, BaseRunner] = {}
    try:
        for c in contenders:
            reason = c.skip
            if not reason:
                reason, runner = _activate(c)
                if runner is not None:
                    live[c.name] = runner
            if reason:
                for n in seq_lens:
                    _stop(rows[c.name, n], reason)
        by_name = {c.name: c for c in contenders}
        for n in sorted(seq_lens):
            running = [name for name in live if _guard(by_name[name], n, limit, rows[name, n])]
            together = sum(rows[name, n].estimated_bytes or 0 for name in running)
            alone = limit is not None and together > limit and len(running) > 1
            if alone:
                for runner in live.values():
                    _deactivate(runner)
            for turn in [[name] for name in running] if alone else [running]:
                if alone:
                    rows[turn[0], n].reason = f"timed alone: together {together / GiB:.1f} GiB > limit"
                warm = [
                    name
                    for name in turn
                    if _reactivate(live[name], rows[name, n])
                    and _warm_up(live[name], by_name[name], n, warmup, rng, rows[name, n])
                ]
                _time_in_turns({name: live[name] for name in warm}, by_name, rows, n, repeat, rng, max_time)
                if alone:
                    _deactivate(live[turn[0]])
                    gc.collect()
            for name in [name for name in live if rows[name, n].status == "failed"]:
                _deactivate(live.pop(name))
                for later in (k for k in seq_lens if k > n):
                    _stop(rows[name, later], f"not run: failed at N={n}")
    finally:
        for runner in live.values():
            _deactivate(runner)
        gc.collect()
    return list(rows.values())


def _time_in_turns(
    runners: dict[str, BaseRunner],
    by_name: dict[str, Contender],
    rows: dict[tuple[str, int], Measurement],
    n: int,
    repeat: int,
    rng: np.random.Generator,
    max_time: float | None,
) -> None:
    """``repeat`` timed runs of each of ``runners`` at length ``n``, run i of every one before run i + 1
    of any; one that has spent ``max_time`` after MIN_RUNS runs sits out the rest."""
    running, spent = list(runners), dict.fromkeys(runners, 0.0)
    for _ in range(repeat):
        for name in list(running):
            m = rows[name, n]
            if max_time is not None and len(m.timings_s) >= MIN_RUNS and spent[name] > max_time:
                continue
            feed = by_name[name].feed(n, rng)
            start = time.perf_counter()
            try:
                runners[name].infer(feed, check_inputs=False)
            except Exception as exc:  # a contender failing is a row to report, not a crash
                _stop(m, first_line(exc, with_type=True), "failed")
                running.remove(name)
                continue
            m.timings_s.append(time.perf_counter() - start)
            spent[name] += m.timings_s[-1]


def _activate(c: Contender) -> tuple[str, BaseRunner | None]:
    """(why it cannot run, else "", the active runner)."""
    try:
        runner = c.make()
        runner.activate()
    except BackendSkipped as exc:
        return str(exc), None
    except Exception as exc:  # a peer that will not build is a row to report
        return f"failed to load: {first_line(exc, with_type=True)}", None
    return "", runner


def _reactivate(runner: BaseRunner, m: Measurement) -> bool:
    """Load ``runner`` again if a turn alone unloaded it; False (``m`` failed) if it no longer loads."""
    try:
        if not runner.is_active:
            runner.activate()
    except Exception as exc:
        _stop(m, f"failed to load again: {first_line(exc, with_type=True)}", "failed")
        return False
    return True


def _guard(c: Contender, n: int, limit: int | None, m: Measurement) -> bool:
    m.estimated_bytes = c.estimate(n)
    if limit is not None and m.estimated_bytes is not None and m.estimated_bytes > limit:
        estimate = f"estimated peak {m.estimated_bytes / GiB:.1f} GiB"
        _stop(m, f"memory guard: {estimate} > limit {limit / GiB:.1f} GiB")
        return False
    return True


def _warm_up(runner: BaseRunner, c: Contender, n: int, warmup: int, rng: np.random.Generator,
             m: Measurement) -> bool:
    """Run ``max(warmup, 1)`` untimed runs; the first one's peak RSS over the loaded state is the
    contender's forward memory at this length. False (and ``m`` stopped) when it cannot run."""
    try:
        for i in range(max(warmup, 1)):
            feed = c.feed(n, rng)
            probe = MemoryProbe.start() if i == 0 else None
            runner.infer(feed, check_inputs=False)
            if probe is not None:
                m.peak_rss_bytes = probe.peak_delta()
    except BackendSkipped as exc:
        _stop(m, str(exc))
        return False
    except Exception as exc:
        _stop(m, first_line(exc, with_type=True), "failed")
        return False
    m.providers = providers(runner)
    return True


def _stop(m: Measurement, reason: str, status: str = "skipped") -> None:
    m.status, m.reason, m.timings_s = status, reason, []


def _deactivate(runner: BaseRunner) -> None:
    if runner.is_active:
        runner.deactivate()
