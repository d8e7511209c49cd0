"""Time one case: make the backend's runner, warm up, then timed runs on fresh random inputs.

Each run gets a new feed from :func:`attnx.exporter.inputs.random_feed` (random token ids and
padding masks, never zeros), made outside the timed region; the timed region is one
``runner.infer`` call including its output copy. ``max_time`` ends the timed runs early once at
least :data:`MIN_RUNS` are done, so long inputs do not stall a sweep; every run's time is kept.
"""

from __future__ import annotations

import gc
import time

import numpy as np
from polygraphy.backend.base import BaseRunner

from attnx.bench.machine import MemoryProbe
from attnx.bench.report import Measurement
from attnx.errors import first_line
from attnx.exporter.directory import ExportDir
from attnx.exporter.inputs import random_feed
from attnx.parity.backends import Backend
from attnx.parity.check import sizes
from attnx.parity.runners import BackendSkipped, Graph

MIN_RUNS = 3
Feed = dict[str, np.ndarray]


def feed_for(export: ExportDir, batch: int, seq_len: int, rng: np.random.Generator) -> Feed:
    specs = export.manifest.inputs
    return random_feed(specs, sizes(specs, batch, seq_len), rng)


def providers(runner: BaseRunner) -> list[str]:
    """What actually executes: ONNX Runtime's enabled providers, torch's device, else the runner's name."""
    return list(getattr(runner, "providers", [runner.name]))


def measure(
    export: ExportDir,
    backend: Backend,
    *,
    batch: int,
    seq_len: int,
    warmup: int,
    repeat: int,
    threads: int,
    rng: np.random.Generator,
    max_time: float | None = None,
) -> Measurement:
    """Measure one (export, backend, batch, N). A backend that cannot run it here gives a skipped
    Measurement with the reason; any other error (an internal inconsistency included) a failed one."""
    result = Measurement(
        export.label,
        str(export.path),
        export.manifest.variant,
        backend.name,
        batch,
        seq_len,
        status="ok",
        warmup=warmup,
        threads=threads,
    )
    probe = MemoryProbe.start()
    runner = None
    try:
        start = time.perf_counter()
        runner = backend.runner(Graph.of_model(export, many_runs=True), threads)
        runner.activate()
        result.load_s = time.perf_counter() - start
        result.load_rss_bytes = probe.current_delta()
        result.providers = providers(runner)
        for _ in range(warmup):
            runner.infer(feed_for(export, batch, seq_len, rng), check_inputs=False)
        began = time.perf_counter()
        for _ in range(repeat):
            feed = feed_for(export, batch, seq_len, rng)
            start = time.perf_counter()
            runner.infer(feed, check_inputs=False)
            result.timings_s.append(time.perf_counter() - start)
            enough = len(result.timings_s) >= MIN_RUNS
            if max_time is not None and enough and time.perf_counter() - began > max_time:
                break
    except BackendSkipped as exc:
        result.status, result.reason = "skipped", str(exc)
    except Exception as exc:  # a backend failing on a model is a result to report (exit 1), not a crash
        result.status, result.reason = "failed", first_line(exc, with_type=True)
    finally:
        if runner is not None and runner.is_active:
            runner.deactivate()
        result.peak_rss_bytes = probe.peak_delta()
        del runner
        gc.collect()
    if result.status != "ok":
        result.timings_s = []
    return result
