"""Time one case: load the backend, warm up, then timed runs on fresh random inputs.

Each run gets a new feed from :func:`attnx.parity.inputs.random_feed` (random token
ids and padding masks, never zeros), converted to the backend's input type outside the
timed region; the timed region is one forward call including its output copy.
``max_time`` ends the timed runs early once at least :data:`MIN_RUNS` are done, so long
inputs do not stall a sweep; every run's time is kept.
"""

from __future__ import annotations

import gc
import time

import numpy as np

from attnx.bench.backends import BackendSkipped, BenchBackend, ExportedModel, Feed, one_line
from attnx.bench.machine import MemoryProbe
from attnx.bench.report import Measurement
from attnx.errors import AttnxError
from attnx.parity.inputs import random_feed

MIN_RUNS = 3


def feed_for(model: ExportedModel, batch: int, seq_len: int, rng: np.random.Generator) -> Feed:
    specs = model.manifest.input_specs()
    axes = {a for s in specs for a in s.axes if isinstance(a, str)}
    return random_feed(specs, {a: batch if a == "batch" else seq_len for a in axes}, rng)


def measure(
    model: ExportedModel,
    backend: BenchBackend,
    *,
    batch: int,
    seq_len: int,
    warmup: int,
    repeat: int,
    threads: int,
    rng: np.random.Generator,
    max_time: float | None = None,
) -> Measurement:
    """Measure one (model, backend, batch, N); a backend that cannot run it gives a
    skipped or failed Measurement with the reason instead of raising."""
    result = Measurement(model.label, str(model.directory), model.manifest.variant, backend.name, batch,
                         seq_len, status="ok", warmup=warmup, threads=threads)
    probe = MemoryProbe.start()
    session = None
    try:
        start = time.perf_counter()
        session = backend.load(model, threads, feed_for(model, batch, seq_len, rng))
        result.load_s = time.perf_counter() - start
        result.load_rss_bytes = probe.current_delta()
        result.providers = list(session.providers)
        for _ in range(warmup):
            session.run(session.prepare(feed_for(model, batch, seq_len, rng)))
        began = time.perf_counter()
        for _ in range(repeat):
            prepared = session.prepare(feed_for(model, batch, seq_len, rng))
            start = time.perf_counter()
            session.run(prepared)
            result.timings_s.append(time.perf_counter() - start)
            enough = len(result.timings_s) >= MIN_RUNS
            if max_time is not None and enough and time.perf_counter() - began > max_time:
                break
    except (BackendSkipped, AttnxError) as exc:  # AttnxError: e.g. N outside a TensorRT engine's profile
        result.status, result.reason = "skipped", str(exc)
    except Exception as exc:  # a backend failing on a model is a result to report, not a crash
        result.status, result.reason = "failed", one_line(exc)
    finally:
        if session is not None:
            session.close()
        result.peak_rss_bytes = probe.peak_delta()
        del session
        gc.collect()
    if result.status != "ok":
        result.timings_s = []
    return result
