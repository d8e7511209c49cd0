"""``attnx.verify``: Polygraphy parity between the torch model and its ONNX export."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnx.errors import AttnxError, unknown_choice
from attnx.atomic import write_atomic
from attnx.parity.inputs import random_feed
from attnx.exporter.manifest import MODEL_FILE, PARITY_FILE, WEIGHTS_FILE, Manifest, sha256_file

DEFAULT_SEQ_LENS = (1, 7, 32, 129)
DEFAULT_BATCH = 2


@dataclasses.dataclass
class Comparison:
    seq_len: int
    output: str
    max_abs: float
    max_rel: float
    passed: bool


@dataclasses.dataclass
class Drift:
    """fp16 exports: how far the torch model in fp16 is from the same weights run in float32.

    Informational (no pass/fail): it shows what half precision itself changes, which the
    parity check (ONNX fp16 vs torch fp16) cannot see.
    """

    seq_len: int
    output: str
    max_abs: float
    max_rel: float


@dataclasses.dataclass
class BackendParity:
    backend: str
    status: str  # "passed" | "failed" | "skipped"
    reason: str = ""
    comparisons: list[Comparison] = dataclasses.field(default_factory=list)
    tolerance: dict[str, float] | None = None  # when not the report's (an fp16 TensorRT engine)


@dataclasses.dataclass
class ParityReport:
    atol: float
    rtol: float
    batch: int
    seq_lens: list[int]
    seed: int
    backends: list[BackendParity]
    dtype: str = "fp32"
    fp32_drift: list[Drift] = dataclasses.field(default_factory=list)

    @property
    def ran(self) -> list[BackendParity]:
        return [b for b in self.backends if b.status != "skipped"]

    @property
    def passed(self) -> bool:
        return bool(self.ran) and all(b.status == "passed" for b in self.ran)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, **dataclasses.asdict(self)}

    def write(self, directory: Path) -> None:
        write_atomic(Path(directory) / PARITY_FILE, json.dumps(self.to_dict(), indent=2) + "\n")


def verify(
    out: str | Path,
    *,
    backends: Sequence[str] = ("ort-cpu",),
    seq_lens: Sequence[int] | None = None,
    batch: int = DEFAULT_BATCH,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int | None = None,
    write: bool = True,
) -> ParityReport:
    """Rebuild the exported model from ``OUT`` (manifest + weights) and compare it with each backend.

    Raises:
        AttnxError: ``out`` is not an attnx export, its weights changed, or an unknown backend.
    """
    from attnx.exporter.assemble import rebuild

    directory = Path(out)
    manifest = Manifest.read(directory)
    for name in (MODEL_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise AttnxError(f"'{directory}' lacks {name}; re-export it with `attnx export`")
    if sha256_file(directory / WEIGHTS_FILE) != manifest.weights_sha256:
        raise AttnxError(f"{directory / WEIGHTS_FILE} does not match the manifest's weights hash; re-export")
    assembly = rebuild(manifest, directory / WEIGHTS_FILE)
    report = verify_assembly(
        directory,
        manifest,
        assembly,
        backends=backends,
        seq_lens=seq_lens,
        batch=batch,
        atol=atol,
        rtol=rtol,
        seed=seed,
    )
    if write:
        report.write(directory)
    return report


def verify_assembly(
    directory: Path,
    manifest: Manifest,
    assembly: Any,
    *,
    backends: Sequence[str] = ("ort-cpu",),
    seq_lens: Sequence[int] | None = None,
    batch: int = DEFAULT_BATCH,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int | None = None,
) -> ParityReport:
    """Compare ``assembly.module`` with ``directory/model.onnx`` on each backend (and, for a decode
    export, its prefill + one-token steps with the full forward: :mod:`attnx.decode.verify`).

    An fp16 export is compared with the torch model in fp16 (the computation it exports);
    the report's ``fp32_drift`` also shows how far that is from float32.
    """
    from polygraphy.comparator import Comparator, CompareFunc
    from polygraphy.logger import G_LOGGER

    from attnx.parity.runners import BACKENDS, TorchRunner

    for name in backends:
        if name not in BACKENDS:
            raise unknown_choice("backend", name, BACKENDS)
    seq_lens = list(seq_lens or DEFAULT_SEQ_LENS)
    if any(n < 1 for n in seq_lens) or batch < 1:
        raise AttnxError("sequence lengths and batch must be >= 1")
    given = atol is not None or rtol is not None
    atol = manifest.tolerance["atol"] if atol is None else atol
    rtol = manifest.tolerance["rtol"] if rtol is None else rtol
    seed = secrets.randbits(31) if seed is None else seed
    specs = manifest.input_specs()
    rng = np.random.default_rng(seed)
    feeds = [random_feed(specs, _sizes(specs, batch, n), rng) for n in seq_lens]
    G_LOGGER.module_severity = G_LOGGER.ERROR

    results: list[BackendParity] = []
    for name in backends:
        backend = BACKENDS[name]
        reason = backend.unavailable(directory)
        if reason:
            results.append(BackendParity(name, "skipped", reason))
            continue
        torch_runner = TorchRunner(assembly.module, specs, manifest.output_specs())
        onnx_runner = backend.runner(directory / MODEL_FILE, manifest.lowering, assembly.ops)
        run = Comparator.run([torch_runner, onnx_runner], data_loader=feeds)
        own = engine_tolerance(manifest, assembly) if name == "trt" and not given else None
        limits = own or {"atol": atol, "rtol": rtol}
        accuracy = Comparator.compare_accuracy(run, compare_func=CompareFunc.simple(**limits))
        comparisons = [
            Comparison(n, output, float(result.max_absdiff), float(result.max_reldiff), bool(result))
            for accuracy_result in accuracy
            for iterations in accuracy_result.values()
            for n, iteration in zip(seq_lens, iterations, strict=True)
            for output, result in iteration.items()
        ]
        status = "passed" if comparisons and all(c.passed for c in comparisons) else "failed"
        results.append(BackendParity(name, status, comparisons=comparisons, tolerance=own))
    if manifest.decode:
        from attnx.decode.verify import decode_parity

        results += decode_parity(directory, manifest, assembly, backends, seq_lens, batch, atol, rtol, seed)
    drift = []
    if assembly.dtype != "fp32":
        drift = fp32_drift(assembly, specs, manifest.output_specs(), feeds, seq_lens)
    return ParityReport(atol, rtol, batch, seq_lens, seed, results, assembly.dtype, drift)


def engine_tolerance(manifest: Any, assembly: Any) -> dict[str, float] | None:
    """The tolerance of an fp32 export's TensorRT engine built with fp16 kernels (``attnx build
    --fp16``): the variants' fp16 tolerance; None when the manifest's own tolerance applies."""
    engine = manifest.engine or {}
    if not engine.get("fp16") or manifest.dtype == "fp16":
        return None
    return assembly.tolerance("fp16")


def fp32_drift(
    assembly: Any,
    specs: Sequence[Any],
    outputs: Sequence[Any],
    feeds: Sequence[dict[str, np.ndarray]],
    seq_lens: Sequence[int],
) -> list[Drift]:
    """The torch model against itself in float32 (same weights, upcast exactly) on ``feeds``.

    The module is upcast in place and cast back afterwards: fp16 -> fp32 -> fp16 is lossless,
    and a copy would need every layer to be deep-copyable.
    """
    from attnx.parity.runners import TorchRunner

    runner = TorchRunner(assembly.module, specs, outputs)
    dtype = next(assembly.module.parameters()).dtype
    with runner:
        low = [runner.infer(feed) for feed in feeds]
        try:
            assembly.module.float()
            high = [runner.infer(feed) for feed in feeds]
        finally:
            assembly.module.to(dtype)
    return [
        Drift(n, name, *max_errors(a[name], expected))
        for n, a, b in zip(seq_lens, low, high, strict=True)
        for name, expected in b.items()
    ]


def max_errors(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Largest |actual - expected| and largest |actual - expected| / |expected|, in float64."""
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    relative = diff / np.maximum(np.abs(expected.astype(np.float64)), np.finfo(np.float32).tiny)
    return float(diff.max(initial=0.0)), float(relative.max(initial=0.0))


def _sizes(specs: Sequence[Any], batch: int, length: int) -> dict[str, int]:
    axes = {a for s in specs for a in s.axes if isinstance(a, str)}
    return {a: batch if a == "batch" else length for a in axes}
