"""``attnx.bench``: time exported models on every backend across sequence lengths."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from attnx.arguments import typed_arguments
from attnx.bench.machine import available_memory, default_threads, machine_info
from attnx.bench.report import BenchReport, Measurement
from attnx.bench.timing import measure
from attnx.bench.worker import request, run_isolated
from attnx.errors import AttnxError
from attnx.exporter.budget import model_cost
from attnx.exporter.directory import ExportDir
from attnx.exporter.manifest import package_versions
from attnx.parity.backends import Backend
from attnx.parity.backends import backends as backend_list

DEFAULT_SEQ_LENS = (256, 1024, 4096)
DEFAULT_WARMUP = 2
DEFAULT_REPEAT = 10
MEMORY_FRACTION = 0.8  # default limit: this share of the memory available when the run starts
GiB = 1 << 30
Progress = Callable[[int, int, str], None]  # (cases done, cases in all, the case starting)


def default_memory_limit() -> int | None:
    available = available_memory()
    return None if available is None else int(MEMORY_FRACTION * available)


@typed_arguments
def bench(
    outs: str | Path | Sequence[str | Path],
    *,
    backends: Sequence[str] | None = None,
    seq_lens: Sequence[int] | None = None,
    batch: int = 1,
    warmup: int = DEFAULT_WARMUP,
    repeat: int = DEFAULT_REPEAT,
    threads: int | None = None,
    max_memory: int | None = None,
    max_time: float | None = None,
    isolate: bool = False,
    seed: int | None = None,
    progress: Progress | None = None,
) -> BenchReport:
    """Time each exported model (``attnx export`` OUT) on each backend at each length.

    Args:
        backends: names from :data:`attnx.parity.backends.BACKENDS` (default: all); one that cannot
            run here is reported as skipped with its reason.
        threads: intra-op threads for torch and ONNX Runtime (default: the usable cores).
        max_memory: bytes; a case whose estimated peak exceeds it is skipped with the
            estimate: the :mod:`attnx.exporter.budget` activation bound times the backend's
            ``memory_factor`` (2 for ONNX backends), plus ``weight_copies`` (2 for torch, 3 for
            ONNX backends) of the weights file it loads.
            Default: 80% of the memory available at the start.
        max_time: seconds of timed runs after which a case stops (after at least 3 runs).
        isolate: measure each case in a fresh process (exact memory peaks; slower).
        seed: seed of the random inputs (default: fresh, recorded in the report).

    Raises:
        AttnxError: an OUT is not an attnx export, an unknown backend, or a bad number.
    """
    outs = [outs] if isinstance(outs, (str, Path)) else list(outs)
    chosen = backend_list(None if backends is None else list(backends))
    lengths = sorted(set(seq_lens or DEFAULT_SEQ_LENS))
    threads = default_threads() if threads is None else threads
    if not outs:
        raise AttnxError("no OUT directory given; pass the output directory of an `attnx export`")
    if min(lengths) < 1 or batch < 1 or repeat < 1 or warmup < 0 or threads < 1:
        raise AttnxError("sequence lengths, batch, repeat and threads must be >= 1 and warmup >= 0")
    models = [ExportDir.open(out) for out in outs]
    limit = default_memory_limit() if max_memory is None else max_memory
    seed = secrets.randbits(31) if seed is None else seed
    plan = _Plan(chosen, lengths, batch, warmup, repeat, threads, limit, max_time, isolate, seed)
    measurements = _measure_all(models, plan, progress)
    return BenchReport(
        machine_info() | _providers(),
        versions(),
        plan.settings(),
        [_describe(m) for m in models],
        measurements,
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    """One bench run's checked settings; ``limit``: the memory limit in bytes (None: no limit)."""

    backends: list[Backend]
    lengths: list[int]
    batch: int
    warmup: int
    repeat: int
    threads: int
    limit: int | None
    max_time: float | None
    isolate: bool
    seed: int

    def settings(self) -> dict[str, Any]:
        """The report's record of the settings."""
        return {
            "backends": [b.name for b in self.backends],
            "seq_lens": self.lengths,
            "batch": self.batch,
            "warmup": self.warmup,
            "repeat": self.repeat,
            "max_time_s": self.max_time,
            "threads": self.threads,
            "max_memory_bytes": self.limit,
            "isolate": self.isolate,
            "seed": self.seed,
            "graph_optimization": "ORT_ENABLE_ALL",
        }


def _measure_all(models: list[ExportDir], plan: _Plan, progress: Progress | None) -> list[Measurement]:
    """Every case, each model's backends adjacent in time for each length, so a load change on a shared
    machine hits both sides of a comparison (e.g. ORT/torch) alike; a case that cannot run here or
    would pass the memory limit is recorded as skipped with its reason."""
    rng = np.random.default_rng(plan.seed)
    reasons = {(b.name, model.path): b.unavailable(model) for b in plan.backends for model in models}
    cases = [(model, backend, n) for model in models for n in plan.lengths for backend in plan.backends]
    measurements: list[Measurement] = []
    for done, (model, backend, n) in enumerate(cases):
        if progress:
            progress(done, len(cases), f"{model.label} {backend.name} N={n}")
        estimate, flops = estimate_case(model, backend, plan.batch, n)
        reason = reasons[backend.name, model.path] or _over_limit(estimate, plan.limit)
        if reason:
            result = Measurement(
                model.label,
                str(model.path),
                model.manifest.variant,
                backend.name,
                plan.batch,
                n,
                status="skipped",
                reason=reason,
            )
        else:
            result = _measure_case(model, backend, n, plan, rng)
        result.estimated_bytes, result.flops = estimate, flops
        measurements.append(result)
    if progress:
        progress(len(cases), len(cases), "done")
    return measurements


def _over_limit(estimate: int | None, limit: int | None) -> str | None:
    """Why a case is skipped for memory (None: it fits, or is not estimated, or there is no limit)."""
    if estimate is None or limit is None or estimate <= limit:
        return None
    return (
        f"estimated peak {estimate / GiB:.1f} GiB exceeds the memory limit "
        f"{limit / GiB:.1f} GiB (--max-memory)"
    )


def _measure_case(
    model: ExportDir, backend: Backend, n: int, plan: _Plan, rng: np.random.Generator
) -> Measurement:
    """One case timed in this process, or in a fresh one (``plan.isolate``: exact memory peaks)."""
    if plan.isolate:
        args = request(
            model,
            backend.name,
            batch=plan.batch,
            seq_len=n,
            warmup=plan.warmup,
            repeat=plan.repeat,
            threads=plan.threads,
            seed=int(rng.integers(2**31)),
            max_time=plan.max_time,
        )
        return run_isolated(model, args)
    return measure(
        model,
        backend,
        batch=plan.batch,
        seq_len=n,
        warmup=plan.warmup,
        repeat=plan.repeat,
        threads=plan.threads,
        rng=rng,
        max_time=plan.max_time,
    )


def estimate_case(export: ExportDir, backend: Backend, batch: int, n: int) -> tuple[int | None, ...]:
    """(estimated peak bytes, FLOPs) of one case on ``backend`` (the memory guard's estimate); (None,
    None) for a model without a cost model."""
    model, config, roles = export.specs()
    cost = model_cost(model, config, roles, batch, n)
    if cost is None:
        return None, None
    weights = export.size("weights") if backend.loads_weights else export.size("model")
    return int(backend.memory_factor * cost.working_bytes) + backend.weight_copies * weights, cost.flops


def _describe(export: ExportDir) -> dict[str, Any]:
    m = export.manifest
    return {
        "label": export.label,
        "out": str(export.path),
        "variant": m.variant,
        "variant_config": m.variant_config,
        "model": m.model,
        "model_config": m.model_config,
        "lowering": m.lowering,
        "opset": m.opset,
        "dtype": m.dtype,
        "weights_sha256": m.files["weights"].sha256,
    }


def versions() -> dict[str, str | None]:
    found = package_versions()
    for name in ("numpy", "onnxruntime-gpu", "matplotlib"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _providers() -> dict[str, Any]:
    import onnxruntime

    return {"onnxruntime_providers": onnxruntime.get_available_providers()}
