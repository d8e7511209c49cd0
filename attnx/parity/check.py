"""Parity between the torch model and an export, on every backend asked for, by the one rule.

Fresh random inputs at each sequence length go through the torch model (the reference) and each
backend's runner on ``model.onnx``; every output is compared with :func:`attnx.parity.rule.compare`.
Every weight stored in the export's graphs is matched with the torch model's
(:mod:`attnx.parity.weights`), which random inputs alone cannot prove. Graphs an export carries beside
``model.onnx`` are checked by :class:`ParityExtension` objects the caller passes (decode parity:
:mod:`attnx.decode.parity`), so this module knows nothing about them. An fp16 export is compared with
the torch model in fp16 (the computation it exports); the report's ``fp32_drift`` also shows how far
that is from float32.

A check runs in two phases, so that the torch model and a runtime never hold the weights at once:
:func:`reference_side` does everything the torch model takes part in (its outputs, the backends that
load the weights themselves, the weight check) and keeps only numbers; :func:`compare_backends` then
runs the other backends, one session at a time. A caller that drops the model between the two
(``attnx export``, ``attnx verify``) checks a real-size model in about one copy of its weights at a
time; :func:`check_parity` runs both for a caller that keeps the model.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from polygraphy.backend.base import BaseRunner

from attnx.errors import AttnxError
from attnx.exporter.assemble import Assembly
from attnx.exporter.budget import page_out_weight_files, return_freed_memory
from attnx.exporter.directory import ExportDir
from attnx.exporter.inputs import random_feed
from attnx.exporter.reopen import source_for
from attnx.models.spec import TensorSpec
from attnx.parity.backends import REFERENCE, Backend
from attnx.parity.report import BackendParity, Comparison, Drift, ParityReport
from attnx.parity.rule import compare
from attnx.parity.runners import BackendSkipped, Graph, TorchRunner
from attnx.parity.weights import WeightCheck, check_weights
from attnx.recipes import VerifySettings
from attnx.variant import Tolerance

DEFAULTS = VerifySettings()


@dataclasses.dataclass(frozen=True)
class Cases:
    """What a parity check runs: sequence lengths, batch, the seed of the random inputs, the tolerance."""

    seq_lens: tuple[int, ...]
    batch: int
    seed: int
    tolerance: Tolerance

    @classmethod
    def make(
        cls,
        export: ExportDir,
        seq_lens: Sequence[int] | None = None,
        batch: int | None = None,
        tolerance: Tolerance | None = None,
        seed: int | None = None,
    ) -> Cases:
        """Defaults filled in: ``[verify]``'s lengths (fitted to the lengths an adapted module accepts)
        and batch, the manifest's tolerance, a fresh seed.

        Raises:
            AttnxError: a length or batch below 1, or a negative tolerance.
        """
        lengths = tuple(seq_lens or DEFAULTS.lengths(source_for(export.manifest).accepted_lengths()))
        batch = DEFAULTS.batch if batch is None else batch
        if min(lengths) < 1 or batch < 1:
            raise AttnxError(f"sequence lengths and batch must be >= 1 (got {list(lengths)}, batch {batch})")
        tolerance = tolerance or Tolerance(**export.manifest.tolerance)
        if tolerance.atol < 0 or tolerance.rtol < 0:
            raise AttnxError(f"--atol and --rtol must be >= 0 (got {tolerance.atol:g}, {tolerance.rtol:g})")
        return cls(lengths, batch, secrets.randbits(31) if seed is None else seed, tolerance)

    def feeds(self, specs: Sequence[TensorSpec], offset: int = 0) -> list[dict[str, np.ndarray]]:
        """One random feed per sequence length (every named axis but batch takes that length)."""
        rng = np.random.default_rng(self.seed + offset)
        return [random_feed(specs, sizes(specs, self.batch, n), rng) for n in self.seq_lens]


def sizes(specs: Sequence[TensorSpec], batch: int, length: int) -> dict[str, int]:
    """Every named axis of ``specs``: ``batch`` for "batch", ``length`` for the others."""
    axes = {a for s in specs for a in s.axes if isinstance(a, str)}
    return {a: batch if a == "batch" else length for a in axes}


Pending = Callable[[Sequence[Backend]], list[BackendParity]]
"""The rest of an extension's check: given the backends that do not load the weights themselves, every
one of its results (those already run with the torch model first)."""


class ParityExtension(Protocol):
    """Checks the graphs an export carries beside model.onnx (e.g. decode graphs)."""

    def applies(self, export: ExportDir) -> bool:
        """Whether the export has what this extension checks."""

    def reference(
        self, export: ExportDir, assembly: Assembly, backends: Sequence[Backend], cases: Cases
    ) -> Pending:
        """Run what needs the torch model now (its outputs, ``backends`` that load the weights); the
        returned call runs the others later, without the model, and gives one result per backend (named
        after the backend and what it checks)."""


@dataclasses.dataclass
class ReferenceSide:
    """What the torch model gives a parity check, computed while it is loaded; it holds no weights."""

    feeds: list[dict[str, np.ndarray]]  # model.onnx's inputs, one per sequence length
    expected: list[dict[str, np.ndarray]]  # the torch model's outputs per feed
    ran: dict[str, BackendParity]  # the backends that load the weights themselves, already run
    tolerances: dict[str, Tolerance | None]  # a backend's own tolerance (an fp16 TensorRT engine)
    pending: list[Pending]  # the extensions' checks still to run
    dtype: str
    drift: list[Drift]
    weights: list[WeightCheck]


def reference_side(
    export: ExportDir,
    assembly: Assembly,
    backends: Sequence[Backend],
    cases: Cases,
    extensions: Sequence[ParityExtension] = (),
) -> ReferenceSide:
    """Everything of a parity check that runs the torch model (see the module docstring).

    Raises:
        AttnxError: a backend that is the reference itself.
    """
    if any(b.name == REFERENCE for b in backends):
        raise AttnxError(f"{REFERENCE} is the reference every backend is compared with; choose others")
    manifest = export.manifest
    feeds = cases.feeds(manifest.inputs)
    graph = Graph.of_model(export, assembly.module)
    expected = infer(TorchRunner(graph.module(), graph.inputs, graph.outputs), feeds)
    ran = {b.name: run_backend(b, graph, feeds, expected, cases) for b in backends if b.loads_weights}
    tolerances = {b.name: engine_tolerance(export, assembly) if b.name == "trt" else None for b in backends}
    pending = [e.reference(export, assembly, backends, cases) for e in extensions if e.applies(export)]
    drift = []
    if assembly.dtype != "fp32":
        drift = fp32_drift(assembly, manifest.inputs, manifest.outputs, feeds, cases.seq_lens)
    weights = check_weights(export, assembly.tensors(), assembly.every_tensor_exported)
    return ReferenceSide(feeds, expected, ran, tolerances, pending, assembly.dtype, drift, weights)


def compare_backends(
    export: ExportDir, side: ReferenceSide, backends: Sequence[Backend], cases: Cases
) -> ParityReport:
    """The parity report: ``backends`` that do not load the weights run now, against ``side`` (whose
    expected outputs of model.onnx are dropped once every backend has run it)."""
    page_out_weight_files()  # a checkpoint the torch model read in place
    return_freed_memory()  # and what the torch side's forwards freed
    graph = Graph.of_model(export)
    results = [
        side.ran.get(b.name)
        or run_backend(b, graph, side.feeds, side.expected, cases, side.tolerances[b.name])
        for b in backends
    ]
    side.expected.clear()  # model.onnx's references: the extensions' sessions (the largest) run without them
    others = [b for b in backends if not b.loads_weights]
    for pending in side.pending:
        results += pending(others)
    tol = cases.tolerance
    return ParityReport(
        tol.atol,
        tol.rtol,
        cases.batch,
        list(cases.seq_lens),
        cases.seed,
        results,
        side.dtype,
        side.drift,
        side.weights,
    )


def check_parity(
    export: ExportDir,
    assembly: Assembly,
    backends: Sequence[Backend],
    cases: Cases,
    extensions: Sequence[ParityExtension] = (),
) -> ParityReport:
    """Compare ``assembly.module`` (the reference, kept loaded) with the export on each backend.

    Raises:
        AttnxError: a backend that is the reference itself.
    """
    return compare_backends(
        export, reference_side(export, assembly, backends, cases, extensions), backends, cases
    )


def run_backend(
    backend: Backend,
    graph: Graph,
    feeds: Sequence[dict[str, np.ndarray]],
    expected: Sequence[dict[str, np.ndarray]],
    cases: Cases,
    tolerance: Tolerance | None = None,
) -> BackendParity:
    """The backend's outputs on ``feeds`` against the torch module's ``expected`` (``tolerance``: a
    backend's own)."""
    reason = backend.unavailable(graph.export)
    if reason:
        return BackendParity(backend.name, "skipped", reason)
    limits = tolerance or cases.tolerance
    try:
        actual = infer(backend.runner(graph, None), feeds)
    except BackendSkipped as exc:
        return BackendParity(backend.name, "skipped", str(exc))
    comparisons = [
        Comparison(n, name, *dataclasses.astuple(compare(got[name], want[name], limits)))
        for n, got, want in zip(cases.seq_lens, actual, expected, strict=True)
        for name in want
    ]
    status = "passed" if comparisons and all(c.passed for c in comparisons) else "failed"
    own = dataclasses.asdict(tolerance) if tolerance else None
    return BackendParity(backend.name, status, comparisons=comparisons, tolerance=own)


def infer(runner: BaseRunner, feeds: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """``runner``'s outputs for each feed (activated once)."""
    with runner:
        return [dict(runner.infer(feed)) for feed in feeds]


def engine_tolerance(export: ExportDir, assembly: Assembly) -> Tolerance | None:
    """The tolerance of an fp32 export's TensorRT engine built with fp16 kernels (``attnx build
    --fp16``): the variants' fp16 tolerance; None when the report's own tolerance applies."""
    engine = export.manifest.engine
    if engine is None or not engine.fp16 or export.manifest.dtype == "fp16":
        return None
    return Tolerance(**assembly.tolerance("fp16"))


def fp32_drift(
    assembly: Assembly,
    specs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    feeds: Sequence[dict[str, np.ndarray]],
    seq_lens: Sequence[int],
) -> list[Drift]:
    """The torch model against itself in float32 (same weights, upcast exactly) on ``feeds``.

    The module is upcast in place and cast back afterwards: fp16 -> fp32 -> fp16 is lossless,
    and a copy would need every layer to be deep-copyable.
    """
    module = assembly.module
    dtype = next(module.parameters()).dtype
    low = infer(TorchRunner(module, specs, outputs), feeds)
    try:
        module.float()
        high = infer(TorchRunner(module, specs, outputs), feeds)
    finally:
        module.to(dtype)
    return [
        Drift(n, name, *_max_errors(a[name], expected))
        for n, a, b in zip(seq_lens, low, high, strict=True)
        for name, expected in b.items()
    ]


def _max_errors(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    difference = compare(actual, expected, Tolerance(np.inf, np.inf))
    return difference.max_abs, difference.max_rel
