"""``attnx.optimize``: a new export with slimmed, fused, int8 or fp16 graphs, verified against float32 torch.

The source export is read through :class:`attnx.exporter.directory.ExportDir`; every graph it lists
(model.onnx, and prefill/decode graphs when present) is transformed (:mod:`attnx.optimizer.graphs`;
genai.onnx, the decode graph under onnxruntime-genai's names, is laid out again from the new decode graph),
the other files are copied (a TensorRT engine is dropped: it was built from the float32 graph), and the
manifest records what was done (:class:`attnx.exporter.manifest.OptimizedSection`). Everything goes into
a staged directory that becomes OUT2 only when complete. The torch model rebuilt from the source (float32
weights) is the reference of the accuracy report (:mod:`attnx.optimizer.accuracy`) and of the usual
parity check; the new manifest's tolerance is the transformation's error bound scaled by the largest
output magnitude measured, so ``attnx verify OUT2`` holds the export to that bound later.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import onnx

from attnx.api import PARITY_EXTENSIONS
from attnx.arguments import typed_arguments
from attnx.atomic import check_output_dir, staged_directory, write_atomic
from attnx.decode.export import prefill_is_decode, prefill_of
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir, record_file
from attnx.exporter.manifest import MANIFEST, FileRecord, Manifest, OptimizedSection, package_versions
from attnx.exporter.portable import float32_ops
from attnx.exporter.trace import save_onnx
from attnx.optimizer.accuracy import AccuracyReport, measure
from attnx.optimizer.graphs import check_steps, tool_versions, transform
from attnx.parity.backends import backends
from attnx.parity.check import Cases, check_parity
from attnx.parity.report import ParityReport
from attnx.serve.genai import GENAI, genai_layout
from attnx.variant import Tolerance

# The largest output error each step is held to, relative to the float32 model's largest output magnitude:
# onnxslim and the fusions only reorder float32 arithmetic; fp16 keeps ~3 decimal digits per operation;
# dynamic int8 quantisation measured 0.9% on a 2-layer d512 encoder with random weights, but 3.6% (model.onnx)
# and 6.2% (prefill.onnx, which quantises the same weights in another graph) on the trained digits-lm recipe.
ERROR_BOUNDS = {"slim": 1e-4, "fuse": 1e-4, "fp16": 1e-2, "int8": 1e-1}
Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    """The optimised export ``out``, its manifest, the accuracy report and the parity report (at the
    manifest's new tolerance, decode graphs included)."""

    out: Path
    manifest: Manifest
    report: AccuracyReport
    parity: ParityReport

    @property
    def passed(self) -> bool:
        return self.report.passed and self.parity.passed


@typed_arguments
def optimize(
    source: str | Path,
    out: str | Path,
    *,
    int8: bool = False,
    fp16: bool = False,
    slim: bool = False,
    fuse: bool = False,
    force: bool = False,
    max_rel_error: float | None = None,
    min_top1: float | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
) -> OptimizeResult:
    """Write ``out``: the export ``source`` with its graphs slimmed (onnxslim), fused for ONNX Runtime
    (onnxscript's ort_fusions; the graphs are then decomposed: :mod:`attnx.optimizer.graphs`),
    int8-quantised (ONNX Runtime's dynamic quantisation of the weights) and/or converted to fp16 (inputs
    and outputs stay float32), then check it against the float32 torch model rebuilt from ``source``.

    ``out`` is written even when a check fails (as ``attnx export`` does); ``result.passed`` says whether
    the outputs stay within the transformation's error bound (:data:`ERROR_BOUNDS`) and the limits given:
    ``max_rel_error`` (largest output error relative to the largest output magnitude) and ``min_top1``
    (next-token top-1 agreement of a language model, 0..1). ``seed``: of the random prompts (default fresh).

    Raises:
        AttnxError: no step or int8 with fp16, ``source`` not an export (or fp16, or plugin-lowered, or
            already optimised), ``out`` the same directory or existing without ``force`` (``force``
            replaces only an attnx export), a limit out of range.
    """
    report_progress = progress or (lambda message: None)
    wanted = {"int8": int8, "fp16": fp16, "slim": slim, "fuse": fuse}
    steps = check_steps([name for name, chosen in wanted.items() if chosen])
    _check_limits(max_rel_error, min_top1)
    export = _open_source(source, out)
    check_output_dir(out, force, MANIFEST)  # before the model is rebuilt; checked again when published
    seed = secrets.randbits(31) if seed is None else seed
    report_progress(f"rebuilding the float32 torch model of {export.path}")
    reference = export.rebuild()
    graphs = [key for key, record in export.manifest.files.items() if record.path.endswith(".onnx")]
    bound = max(ERROR_BOUNDS[step] for step in steps)
    with staged_directory(out, force, MANIFEST) as staging:
        files = _write_files(export, staging, steps, graphs, report_progress)
        source_model = export.manifest.files["model"].sha256
        section = OptimizedSection(str(export.path), source_model, steps, graphs, bound, tool_versions(steps))
        manifest = dataclasses.replace(
            export.manifest,
            files=files,
            engine=None,
            optimized=section,
            versions=package_versions(),
            lowering="decomposed" if "fuse" in steps else export.manifest.lowering,  # fuse inlines the bodies
        )
        write_atomic(staging / MANIFEST, manifest.to_json())
        written = ExportDir.open(staging)
        report_progress("measuring accuracy against the float32 torch model (ONNX Runtime CPU)")
        report = measure(written, reference, steps, bound, seed)
        report.max_rel_error, report.min_top1 = max_rel_error, min_top1
        written = written.write_manifest(
            dataclasses.replace(manifest, tolerance=_tolerance(manifest.tolerance, report, bound))
        )
        report_progress("verifying parity at the optimised export's tolerance")
        cases = Cases.make(written, seed=seed)
        parity = check_parity(written, reference, backends(["ort-cpu"]), cases, PARITY_EXTENSIONS)
        parity.write(staging)
        report.write(staging)
    return OptimizeResult(Path(out), written.manifest, report, parity)


def _write_files(
    export: ExportDir, staging: Path, steps: list[str], graphs: list[str], report_progress: Progress
) -> dict[str, FileRecord]:
    """Every file of ``export`` into ``staging``: the ``graphs`` transformed, genai.onnx and a language
    model's prefill.onnx made again from the new decode graph, the others copied (a TensorRT engine
    dropped); their manifest records."""
    kept = float32_ops(export.ops())
    section = export.manifest.decode
    derived = {GENAI.name: genai_layout} if section is not None else {}
    if section is not None and prefill_is_decode(section):
        derived["prefill"] = prefill_of
    files = {}
    for key, record in sorted(export.manifest.files.items(), key=lambda item: item[0] in derived):
        if key == "engine":
            continue
        if key in derived:  # the new decode graph under genai's names, or from the empty state
            decode_path = export.manifest.files["decode"].path
            save_onnx(derived[key](onnx.load(str(staging / decode_path)), section), staging / record.path)
            report_progress(f"{record.path}: made from the new {decode_path}")
        elif key in graphs:
            report_progress(f"{' + '.join(steps)}: {record.path}")
            fused = transform(export.file(key), staging / record.path, steps, kept)
            if "fuse" in steps:
                made = ", ".join(f"{count} {name}" for name, count in sorted(fused.items()))
                report_progress(f"{record.path}: fused {made or 'nothing (no pattern matched)'}")
        else:
            shutil.copyfile(export.file(key), staging / record.path)
        files[key] = record_file(staging, record.path)
    return files


def _open_source(source: str | Path, out: str | Path) -> ExportDir:
    export = ExportDir.open(source)
    manifest = export.manifest
    if Path(out).resolve() == export.path.resolve():
        raise AttnxError(f"-o {out} is the export being optimised; write the optimised export elsewhere")
    if manifest.dtype != "fp32":
        raise AttnxError(f"'{export.path}' is an {manifest.dtype} export; optimise an fp32 export")
    if manifest.lowering == "plugin":
        raise AttnxError(
            f"'{export.path}' is plugin-lowered (TensorRT plugins); optimise a function or decomposed export"
        )
    if manifest.optimized is not None:
        raise AttnxError(
            f"'{export.path}' is already optimised ({' + '.join(manifest.optimized.steps)}); optimise its "
            f"source export {manifest.optimized.source} with every step at once"
        )
    return export


def _check_limits(max_rel_error: float | None, min_top1: float | None) -> None:
    if max_rel_error is not None and not max_rel_error >= 0:
        raise AttnxError(f"--max-rel-error must be >= 0 (got {max_rel_error:g})")
    if min_top1 is not None and not 0 <= min_top1 <= 1:
        raise AttnxError(f"--min-top1 is a fraction in 0..1 (got {min_top1:g})")


def _tolerance(source: dict[str, float], report: AccuracyReport, bound: float) -> dict[str, float]:
    """The source's tolerance, loosened to ``bound`` x the largest output magnitude measured (atol) and
    ``bound`` (rtol)."""
    scale = max((o.scale for o in report.outputs), default=0.0)
    limits = Tolerance(max(source["atol"], bound * scale), max(source["rtol"], bound))
    return dataclasses.asdict(limits)
