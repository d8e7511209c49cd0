"""attnx's Python API for whole jobs: export (a registered model, or any module through
:func:`export_module`, with the extra graphs and verification) and verify.

The steps live in the layers below (:mod:`attnx.exporter.export` writes, :mod:`attnx.parity`
checks, :mod:`attnx.decode` adds the decode graphs and their parity through the exporter's and the
checker's extension protocols); this module strings them together, so it is the one place that
knows every extension.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from attnx.arguments import typed_arguments
from attnx.checkpoint import save_checkpoint as write_checkpoint
from attnx.decode.export import DECODE_GRAPHS
from attnx.decode.parity import DECODE_PARITY
from attnx.errors import AttnxError
from attnx.exporter import export as steps
from attnx.exporter.budget import check_needs, ort_weight_copies, require_memory
from attnx.exporter.directory import ExportDir
from attnx.exporter.export import ExportJob
from attnx.exporter.lowering import attnx_nodes
from attnx.exporter.manifest import Manifest
from attnx.exporter.module import ModuleSource
from attnx.parity.backends import backends as backend_list
from attnx.parity.check import Cases, compare_backends, reference_side
from attnx.parity.report import ParityReport
from attnx.recipes import Recipe, resolve
from attnx.serve.genai import GENAI
from attnx.serve.genai_parity import GENAI_PARITY
from attnx.serve.tokenizer import TOKENIZER
from attnx.serve.transformers_js import TRANSFORMERS_JS
from attnx.serve.triton import write_repository
from attnx.variant import Tolerance

# In this order: the genai decoder is made from the decode graph and reads the tokenizer's special ids.
GRAPH_EXTENSIONS = (DECODE_GRAPHS, TOKENIZER, GENAI, TRANSFORMERS_JS)
PARITY_EXTENSIONS = (DECODE_PARITY, GENAI_PARITY)
Progress = Callable[[str], None]


@dataclasses.dataclass
class ExportResult:
    out: Path
    manifest: Manifest
    attnx_nodes: int
    parity: ParityReport | None


@typed_arguments
def export(
    variant: str | None = None,
    out: str | Path = "out",
    *,
    model: str | None = None,
    recipe: str | Path | Recipe | None = None,
    cross_variant: str | None = None,
    options: Mapping[str, Any] | None = None,
    force: bool = False,
    checkpoint: str | Path | None = None,
    save_checkpoint: str | Path | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Export ``model`` built around ``variant`` to ``out`` (atomically), then verify it.

    Every setting not given comes from ``recipe`` (a shipped name, a TOML path or a
    :class:`attnx.recipes.Recipe`), else from the defaults: a softmax ``encoder``, function
    lowering, opset 18, fp32, seed 0, every symbolic axis dynamic, verified at lengths 1, 7, 32, 129.

    Args:
        options: what ``attnx export --set`` takes, applied on top of the recipe: model and variant
            options (``{"d_model": 128}``; "model.x"/"variant.x"/"cross.x" to disambiguate) and
            recipe settings (``{"export.lowering": "decomposed", "export.decode": True,
            "verify.seq_lens": [1, 9], "verify.enabled": False}``, see docs/recipes.md).
        cross_variant: the cross-attention variant of a seq2seq model (default softmax).
        checkpoint: weights to export (safetensors or a torch state dict) instead of the seeded
            initialisation; they must match the model exactly.
        save_checkpoint: also write the exported weights there (``attnx.save_checkpoint``).

    Raises:
        AttnxError: bad names, options, settings or recipe, a checkpoint that does not fit, an
            existing ``out`` (or ``save_checkpoint``) without ``force``, an unwritable ``out``.
    """
    plan = resolve(recipe, variant=variant, model=model, cross_variant=cross_variant, options=options)
    job = ExportJob(plan, Path(out), force, _path(checkpoint), _path(save_checkpoint))
    return run_export(job, progress)


@typed_arguments
def export_module(
    module: Any,
    example_inputs: Mapping[str, Any] | Sequence[Any],
    out: str | Path = "out",
    *,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    options: Mapping[str, Any] | None = None,
    force: bool = False,
    entry: str | None = None,
    notes: Sequence[str] = (),
    progress: Progress | None = None,
) -> ExportResult:
    """Export any ``torch.nn.Module`` whose attention runs through attnx ops, after applying the
    registered adapters (a library's own model object, unchanged), to ``out``; then verify it against
    the module's own forward.

    The same steps, lowerings, manifest and parity report as :func:`export`; the manifest's ``module``
    section and ``reference.json`` (the adapted module's ``torch.export`` program, its tensors in
    ``reference.safetensors``: data, loaded without unpickling) let ``attnx verify``
    re-check it later without the module's code. See :mod:`attnx.exporter.module` for how inputs and
    outputs are named and docs/importing.md for the adapters.

    Args:
        module: in eval mode; its dtype (float32 or float16) is the export's.
        example_inputs: a dict name -> tensor (forward called with keywords) or a tuple of tensors.
        dynamic_axes: ``{input: {dim: axis name}}``; default: dim 0 "batch", dim 1 "seq".
        options: recipe settings only (``export.*``, ``verify.*``; e.g. ``{"export.lowering": "plugin",
            "export.decode": True, "verify.seq_lens": [1, 9]}``).
        entry: "pkg.mod:factory" the module came from (recorded in the manifest).
        notes: what loading it had to fix (``attnx export --from``), printed and kept in the manifest.

    Raises:
        AttnxError: a module in training mode, example inputs of the wrong type, an unsupported
            third-party module, a forward that cannot be traced, options that are not settings, an
            existing ``out`` without ``force``.
    """
    options = dict(options or {})
    model_options = sorted(k for k in options if not k.startswith(("export.", "verify.")))
    if model_options:
        raise AttnxError(
            f"export_module takes recipe settings only (export.*, verify.*), not {', '.join(model_options)}: "
            "a module's layers carry their own options"
        )
    source = ModuleSource(module, example_inputs, dynamic_axes, entry, tuple(notes))
    return run_export(ExportJob(resolve(None, options=options), Path(out), force, module=source), progress)


def run_export(job: ExportJob, progress: Progress | None = None) -> ExportResult:
    """The export steps: preflight, the source's memory check and build, write into a staging
    directory, verify, commit."""
    report = progress or (lambda message: None)
    steps.preflight(job, GRAPH_EXTENSIONS)
    steps.check_disk(job, job.source.check_memory())
    assembly = job.source.build(report)
    parity = None
    with steps.staged(job) as staging:
        written = steps.write(assembly, job, staging, GRAPH_EXTENSIONS, report)
        if job.save_checkpoint is not None:
            report(f"saving weights to {job.save_checkpoint}")
            write_checkpoint(assembly, job.save_checkpoint)
        checks, ort = job.plan.verify, backend_list(["ort-cpu"])
        if checks.enabled:
            report("verifying parity: the torch model's outputs and weights")
            tolerance = _tolerance(checks.atol, checks.rtol, written)
            cases = Cases.make(written, steps.verify_lengths(job, assembly), checks.batch, tolerance)
            side = reference_side(written, assembly, ort, cases, PARITY_EXTENSIONS)
        del assembly  # the torch model's weights are freed before ONNX Runtime loads the graphs'
        if checks.enabled:
            report("verifying parity: ONNX Runtime, one graph at a time")
            parity = compare_backends(written, side, ort, cases)
            parity.write(staging)
        nodes = len(attnx_nodes(onnx.load(str(written.model_path), load_external_data=False)))
    return ExportResult(job.out, written.manifest, nodes, parity)


@typed_arguments
def verify(
    out: str | Path,
    *,
    backends: Sequence[str] = ("ort-cpu",),
    seq_lens: Sequence[int] | None = None,
    batch: int | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int | None = None,
    write: bool = True,
) -> ParityReport:
    """Rebuild the exported model from ``OUT`` (manifest + weights) and compare it with each backend.

    Tolerances default to the manifest's; ``write`` records the report in ``OUT/parity.json``.

    Raises:
        AttnxError: ``out`` is not an attnx export (or a file of it changed), an unknown backend,
            bad lengths or tolerances, or ``write`` to a read-only OUT.
    """
    export = ExportDir.open(out)
    chosen = backend_list(list(backends))
    cases = Cases.make(export, seq_lens, batch, _tolerance(atol, rtol, export), seed)
    if write:
        _check_writable(export)
    model, config, roles = export.specs()
    shared = export.size("model") < export.size("weights") / 2  # graphs that read weights.safetensors
    needed = check_needs(
        model,
        config,
        roles,
        weights_bytes=export.size("weights"),
        weight_copies=max(1, ort_weight_copies(shared)),  # the torch model is freed before ONNX Runtime runs
        batch=cases.batch,
        seq=max(cases.seq_lens),
    )
    require_memory(
        needed,
        f"verifying {export.label} at batch {cases.batch} x {max(cases.seq_lens)} tokens",
        "verify at shorter --seq-lens or a smaller --batch",
    )
    side = reference_side(export, export.rebuild(), chosen, cases, PARITY_EXTENSIONS)  # the model is freed
    report = compare_backends(export, side, chosen, cases)
    if write:
        report.write(export.path)
    return report


# attnx.triton(out, repo, *, name, max_batch, batching, instances, force, backend, env_cache, progress): a
# Triton model repository serving the export (docs/deploying.md); the serving layer does the whole job.
triton = typed_arguments(write_repository, "triton")


def _tolerance(atol: float | None, rtol: float | None, export: ExportDir) -> Tolerance | None:
    """The given tolerances over the manifest's (None: the manifest's)."""
    if atol is None and rtol is None:
        return None
    default = export.manifest.tolerance
    return Tolerance(default["atol"] if atol is None else atol, default["rtol"] if rtol is None else rtol)


def _check_writable(export: ExportDir) -> None:
    if not os.access(export.path, os.W_OK):
        raise AttnxError(
            f"cannot write the parity report into '{export.path}' (read-only); "
            "pass --no-write to only print it"
        )


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)
