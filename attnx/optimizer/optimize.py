"""``attnx.optimize``: a new export with int4/int8, slimmed, fused or fp16 graphs, checked against float32.

The source export is read through :class:`attnx.exporter.directory.ExportDir`; every graph it lists
(model.onnx, and prefill/decode graphs when present) is transformed (:mod:`attnx.optimizer.graphs`;
genai.onnx, the decode graph under onnxruntime-genai's names, is laid out again from the new decode graph;
one whose KV caches share a buffer from it before the whole-graph steps, which it then takes itself),
the other files are copied (a TensorRT engine is dropped: it was built from the float32 graph), and the
manifest records what was done (:class:`attnx.exporter.manifest.OptimizedSection`). Everything goes into
a staged directory that becomes OUT2 only when complete. The torch model rebuilt from the source (float32
weights) is the reference of the accuracy report (:mod:`attnx.optimizer.accuracy`: a language model's
quality on text, any model's relative error on random prompts) and of the usual parity check; the new
manifest's tolerance is the transformation's error bound scaled by the largest output magnitude measured,
so ``attnx verify OUT2`` holds the export to that bound later.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

from attnx.api import PARITY_EXTENSIONS
from attnx.arguments import typed_arguments
from attnx.atomic import check_output_dir, staged_directory, write_atomic
from attnx.decode.export import prefill_is_decode, prefill_of
from attnx.decode.generate import position_limits
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir, record_file
from attnx.exporter.manifest import (
    MANIFEST,
    FileRecord,
    Manifest,
    OptimizedSection,
    QuantizationSection,
    package_versions,
)
from attnx.exporter.portable import float32_ops
from attnx.exporter.reopen import source_for
from attnx.exporter.trace import save_onnx
from attnx.optimizer.accuracy import AccuracyReport, measure, text_bounds
from attnx.optimizer.graphs import WEIGHT_ONLY, check_steps, tool_versions, transform
from attnx.optimizer.layers import mixer_kinds
from attnx.optimizer.longdecode import TIE_FACTOR, long_decode
from attnx.optimizer.quantize import QuantisedWeights, plan
from attnx.optimizer.settings import DEFAULT_BLOCK_SIZE, DEFAULT_DECODE_TOKENS, DEFAULT_SEED
from attnx.optimizer.tensors import DATA_FILE, DATA_KEY, SharedData
from attnx.optimizer.text import LOGITS, is_language_model, text_rows
from attnx.parity.backends import backends
from attnx.parity.check import Cases, check_parity
from attnx.parity.report import ParityReport
from attnx.serve.decoders import DECODERS
from attnx.variant import Tolerance

# The largest output error each step is held to, relative to the float32 model's largest output magnitude
# on random prompts (the gate of a model that is not a language model, and the new manifest's tolerance):
# onnxslim and the fusions only reorder float32 arithmetic; fp16 keeps ~3 decimal digits per operation;
# dynamic int8 quantisation measured 0.9% on a 2-layer d512 encoder with random weights, but 3.6% (model.onnx)
# and 6.2% (prefill.onnx, which quantises the same weights in another graph) on the trained digits-lm recipe;
# weight-only int8 and int4 (blocks of 32) measured up to 1.7% and 21% on the test models.
ERROR_BOUNDS = {"slim": 1e-4, "fuse": 1e-4, "fp16": 1e-2, "int8": 5e-2, "dynamic-int8": 1e-1, "int4": 0.5}
Progress = Callable[[str], None]
LONG_DECODE_PROMPT = 16  # the long decode's prompt: the text's first tokens


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
    int4: bool = False,
    int8: bool = False,
    dynamic_int8: bool = False,
    fp16: bool = False,
    slim: bool = False,
    fuse: bool = False,
    layers: Mapping[str, str] | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    symmetric: bool = True,
    accuracy_level: int | None = None,
    algorithm: str = "rtn",
    force: bool = False,
    max_rel_error: float | None = None,
    max_kl: float | None = None,
    min_top1: float | None = None,
    text: str | Path | None = None,
    decode_tokens: int = DEFAULT_DECODE_TOKENS,
    seed: int = DEFAULT_SEED,
    progress: Progress | None = None,
) -> OptimizeResult:
    """Write ``out``: the export ``source`` with its weight MatMuls block-quantised (``int4``/``int8``:
    weight-only, ONNX Runtime's ``MatMulNBits``, :mod:`attnx.optimizer.quantize`; ``layers``: a precision
    per layer kind, "int4", "int8" or "fp32"; ``block_size``, ``symmetric``, ``accuracy_level``,
    ``algorithm``: "rtn" or "hqq"), its graphs slimmed (onnxslim), fused for ONNX Runtime (onnxscript's
    ort_fusions; the graphs are then decomposed: :mod:`attnx.optimizer.graphs`), dynamically int8-quantised
    (``dynamic_int8``: ONNX Runtime's dynamic quantisation of weights and activations) or converted to fp16
    (inputs and outputs stay float32), then check it against the float32 torch model rebuilt from
    ``source``.

    ``out`` is written even when a check fails (as ``attnx export`` does); ``result.passed`` says whether
    it holds its gate. A language model's gate is its quality on a fixed text (``text``: a UTF-8 file,
    default CPython's documentation; :mod:`attnx.optimizer.text`): the mean KL divergence of its next-token
    distributions from the float32 model's (``max_kl``) and their top-1 agreement (``min_top1``, 0..1),
    each the steps' default (:data:`attnx.optimizer.settings.TEXT_BOUNDS`) unless given, looser or
    tighter. Other models are held to the transformation's relative output error bound
    (:data:`ERROR_BOUNDS`); every model to ``max_rel_error`` when given. A language model with decode
    graphs also decodes ``decode_tokens`` greedy steps beside its float32 source (0: not; fewer where the
    model handles fewer positions; :mod:`attnx.optimizer.longdecode`). ``seed``: of the random prompts.

    Raises:
        AttnxError: no step or two precisions, a quantisation setting out of range, ``source`` not an
            export (or fp16, or plugin-lowered, or already optimised), ``out`` the same directory or
            existing without ``force`` (``force`` replaces only an attnx export), a limit out of range or
            a text gate for a model that is not a language model.
    """
    report_progress = progress or (lambda message: None)
    wanted = {
        "int4": int4,
        "int8": int8,
        "dynamic-int8": dynamic_int8,
        "fp16": fp16,
        "slim": slim,
        "fuse": fuse,
    }
    steps = check_steps([name for name, chosen in wanted.items() if chosen])
    weight_only = next((step for step in steps if step in WEIGHT_ONLY), None)
    if weight_only is None and layers:
        raise AttnxError("--layers sets precisions of --int4 or --int8; add one of them")
    quantization = None
    if weight_only is not None:
        quantization = plan(
            weight_only,
            layers,
            block_size=block_size,
            symmetric=symmetric,
            accuracy_level=accuracy_level,
            algorithm=algorithm,
        )
    _check_limits(max_rel_error, max_kl, min_top1)
    export = _open_source(source, out)
    outputs = [spec.name for spec in export.manifest.outputs]
    language_model = is_language_model(export.manifest.inputs, outputs)
    if not language_model and (max_kl is not None or min_top1 is not None or text is not None):
        raise AttnxError(
            f"--max-kl, --min-top1 and --text gate a language model on text; '{export.path}' is not one "
            "(no input_ids in and logits out): use --max-rel-error"
        )
    if text is not None and not Path(text).is_file():
        raise AttnxError(f"--text {text}: no such file")
    if decode_tokens < 0:
        raise AttnxError(f"--decode-tokens must be >= 0 (got {decode_tokens})")
    if not language_model or export.manifest.decode is None:
        decode_tokens = 0
    limits = [limit for _, _, limit in position_limits(export.manifest)]
    decode_tokens = min([decode_tokens, *(limit - LONG_DECODE_PROMPT for limit in limits)])
    check_output_dir(out, force, MANIFEST)  # before the model is rebuilt; checked again when published
    graphs = [key for key, record in export.manifest.files.items() if record.path.endswith(".onnx")]
    bound = max(ERROR_BOUNDS[step] for step in steps)
    with staged_directory(out, force, MANIFEST) as staging:
        files = _write_files(export, staging, steps, graphs, quantization, report_progress)
        report_progress(f"rebuilding the float32 torch model of {export.path}")  # after: one copy at a time
        reference = export.rebuild()
        source_model = export.manifest.files["model"].sha256
        section = OptimizedSection(
            str(export.path), source_model, steps, graphs, bound, tool_versions(steps), quantization
        )
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
        evaluation = None
        if language_model:
            lengths = source_for(written.manifest).accepted_lengths()
            evaluation = text_rows(written, lengths, None if text is None else Path(text))
        report = measure(written, reference, steps, bound, seed, evaluation)
        report.max_rel_error = max_rel_error
        if report.text is not None:
            default_kl, default_top1 = text_bounds(steps)
            report.max_kl = default_kl if max_kl is None else max_kl
            report.min_top1 = default_top1 if min_top1 is None else min_top1
        if evaluation is not None and decode_tokens > 0:
            report_progress(f"decoding {decode_tokens} tokens greedily beside the float32 export")
            logits_error = next(o.max_abs for o in report.outputs if o.output == LOGITS)
            report.decode = long_decode(
                export,
                written,
                evaluation.rows[0, :LONG_DECODE_PROMPT].tolist(),
                decode_tokens,
                TIE_FACTOR * logits_error,
                report_progress,
            )
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
    export: ExportDir,
    staging: Path,
    steps: list[str],
    graphs: list[str],
    quantization: QuantizationSection | None,
    report_progress: Progress,
) -> dict[str, FileRecord]:
    """Every file of ``export`` into ``staging``: the ``graphs`` transformed, the runtime decoders
    (genai.onnx, transformers-js.onnx) and a language model's prefill.onnx made again from the new
    decode graph, the others copied (a TensorRT engine dropped); their manifest records."""
    kept = float32_ops(export.ops())
    op_kinds = mixer_kinds() if quantization is not None else {}
    quantised = QuantisedWeights()  # each stored weight quantised once, for every graph over it
    section = export.manifest.decode
    derived = {}
    for key, decoder in DECODERS.items() if section is not None else ():
        held = getattr(export.manifest, key)
        if held is not None:  # the runtime's decoder, from the new decode graph
            derived[key] = functools.partial(decoder.layout, held=held, ops=export.ops())
    # A decoder whose KV caches share a buffer finds its attention among attnx's ops, which the whole-graph
    # steps inline (attnx.serve.kv_buffer): it is laid out from the decode graph after the weight-only step
    # alone, then takes the others itself.
    early = {key for key in derived if getattr(getattr(export.manifest, key), "shared_kv", False)}
    later = [step for step in steps if step not in WEIGHT_ONLY] if early else []
    first = [step for step in steps if step not in later]
    if section is not None and prefill_is_decode(section):
        derived["prefill"] = prefill_of
    shared = SharedData(staging) if _keeps_external_data(export.file("model")) else None
    files = {}
    decode_path = export.manifest.files["decode"].path if section is not None else ""
    before_later: onnx.ModelProto | None = None  # the decode graph before the ``later`` steps
    order = sorted(export.manifest.files.items(), key=lambda item: (item[0] in derived, item[0] in graphs))
    for key, record in order:  # the weights first: a graph may keep pointing into them
        if key == "engine":
            continue
        if key in derived:  # the new decode graph under a runtime's names, or from the empty state
            if key in early and before_later is not None:
                decode = before_later
            else:
                decode = onnx.load(str(staging / decode_path), load_external_data=False)
            laid_out = derived[key](decode, section)
            if shared is not None:
                shared.offload(laid_out)
            save_onnx(laid_out, staging / record.path)
            report_progress(f"{record.path}: made from the new {decode_path}")
            if key in early and later:
                made = transform(staging / record.path, staging / record.path, later, kept, shared)
                report_progress(_made(record.path, made))
        elif key in graphs:
            report_progress(f"{' + '.join(steps)}: {record.path}")
            split = key == "decode" and bool(later)
            made = transform(
                export.file(key),
                staging / record.path,
                first if split else steps,
                kept,
                shared,
                quantization,
                op_kinds,
                quantised,
            )
            if split:
                before_later = onnx.load(str(staging / record.path), load_external_data=False)
                made |= transform(staging / record.path, staging / record.path, later, kept, shared)
            if quantization is not None or "fuse" in steps:
                report_progress(_made(record.path, made))
        else:
            shutil.copyfile(export.file(key), staging / record.path)
        files[key] = record_file(staging, record.path)
    if shared is not None and shared.used:
        files[DATA_KEY] = record_file(staging, DATA_FILE)
    return files


def _made(path: str, made: Mapping[str, int]) -> str:
    """The progress line saying what the steps made of graph ``path``."""
    listed = ", ".join(f"{count} {name}" for name, count in made.items())
    return f"{path}: made {listed or 'nothing (no fusion pattern matched)'}"


def _keeps_external_data(graph: Path) -> bool:
    """Whether ``graph`` keeps tensors as external data (a shared-weights or > 2 GiB export): the optimised
    graphs then share one data file too; a small export's stay self-contained."""
    model = onnx.load(str(graph), load_external_data=False)
    return any(uses_external_data(tensor) for tensor in model.graph.initializer)


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


def _check_limits(max_rel_error: float | None, max_kl: float | None, min_top1: float | None) -> None:
    if max_rel_error is not None and not max_rel_error >= 0:
        raise AttnxError(f"--max-rel-error must be >= 0 (got {max_rel_error:g})")
    if max_kl is not None and not max_kl >= 0:
        raise AttnxError(f"--max-kl must be >= 0 (got {max_kl:g})")
    if min_top1 is not None and not 0 <= min_top1 <= 1:
        raise AttnxError(f"--min-top1 is a fraction in 0..1 (got {min_top1:g})")


def _tolerance(source: dict[str, float], report: AccuracyReport, bound: float) -> dict[str, float]:
    """The source's tolerance, loosened to ``bound`` x the largest output magnitude measured (atol) and
    ``bound`` (rtol)."""
    scale = max((o.scale for o in report.outputs), default=0.0)
    limits = Tolerance(max(source["atol"], bound * scale), max(source["rtol"], bound))
    return dataclasses.asdict(limits)
