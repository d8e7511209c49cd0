"""Writing an export: the model's ONNX graph(s), its weights and the manifest, into a staged OUT.

One typed job (:class:`ExportJob`: the resolved recipe plus where to write) goes through named
steps that :func:`attnx.api.run_export` strings together: :func:`preflight` refuses what cannot
be done before any work, the job's :class:`attnx.exporter.source.Source` checks memory and builds
the torch model, :func:`write` fills a staged directory (:func:`staged`), which becomes OUT only
when everything, verification included, succeeded. Whether the job exports a registered model or a
user's module (``attnx.export_module``) is the source's business alone: these steps ask it for the
ops, the graph's shapes and trace and the manifest's description of the reference. Graphs beside
model.onnx (decode) come from :class:`GraphExtension` objects the caller passes, so this module
does not know them; where one of them traces and the machine has a second core, they are made in a
forked process while model.onnx converts (:mod:`attnx.exporter.beside`). The torch-to-ONNX mechanics
are :mod:`attnx.exporter.trace`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from attnx.atomic import check_output_dir, staged_directory, write_atomic
from attnx.checkpoint import check_checkpoint_target
from attnx.cost import require_disk
from attnx.exporter import lowering as lowering_mod
from attnx.exporter.assemble import Assembly, every_op
from attnx.exporter.beside import beside, spare_core
from attnx.exporter.directory import ExportDir, record_file
from attnx.exporter.manifest import MANIFEST, MODEL_FILE, WEIGHTS_FILE, Manifest
from attnx.exporter.module import ModuleAssembly, ModuleSource
from attnx.exporter.opsets import check_onnxruntime, check_opset
from attnx.exporter.source import RegisteredModel, Source, UserModule
from attnx.exporter.store import WeightStore, shares_weights
from attnx.exporter.targets import check_target, target_section
from attnx.exporter.trace import attnx_ops, save_onnx
from attnx.recipes import ExportSettings, Recipe

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class ExportJob:
    """Everything one export needs: the resolved recipe (what to build; the ``[export]`` and
    ``[verify]`` settings) and where its files go."""

    plan: Recipe
    out: Path
    force: bool = False
    checkpoint: Path | None = None  # weights to export instead of the seeded initialisation
    save_checkpoint: Path | None = None  # also write the exported weights there
    module: ModuleSource | None = None  # export this module instead of building plan.model

    @property
    def settings(self) -> ExportSettings:
        return self.plan.export

    @functools.cached_property
    def source(self) -> Source:
        """Where the torch model comes from: the job's module, else the recipe's registered model."""
        if self.module is None:
            return RegisteredModel(self.plan, self.checkpoint)
        return UserModule(self.module, self.settings, self.plan.verify.enabled)


@dataclasses.dataclass(frozen=True)
class ExtraGraphs:
    """What a :class:`GraphExtension` wrote: manifest file keys -> file names, the attnx ops in those
    graphs, and the manifest section that describes them."""

    files: Mapping[str, str]
    ops: Sequence[str]
    section: Any


class GraphExtension(Protocol):
    """Graphs an export carries beside model.onnx, described in the manifest section ``name``."""

    name: str

    def wanted(self, job: ExportJob) -> bool:
        """Whether the job asks for these graphs."""

    def check(self, job: ExportJob) -> None:
        """Refuse, before any work, a job these graphs cannot serve (one-line AttnxError)."""

    def traces(self, assembly: Assembly) -> int:
        """How many traces of the model these graphs take, each about as long as model.onnx's (the
        progress line's estimate); 0: a few seconds."""

    def export(
        self, assembly: Assembly, directory: Path, settings: ExportSettings, store: WeightStore | None
    ) -> ExtraGraphs:
        """Write the graphs into ``directory`` (their weights in ``store``'s file when it is given)."""


def preflight(job: ExportJob, extensions: Sequence[GraphExtension] = ()) -> None:
    """Refuse a job that cannot succeed before anything is built or written.

    Raises:
        AttnxError: an opset attnx does not write, that the lowering cannot serve the variants' ops at
            or that the installed ONNX Runtime cannot verify, an extension that cannot serve the job,
            an OUT (or --save-checkpoint file) that exists without --force or cannot be written.
    """
    settings, source = job.settings, job.source
    check_opset(settings.opset, settings.lowering, source.ops())
    check_target(settings.target, settings.lowering, source.ops(), known=source.known)
    if job.plan.verify.enabled:
        import onnxruntime

        check_onnxruntime(settings.opset, onnxruntime.__version__)
    source.check()
    for extension in extensions:
        if extension.wanted(job):
            extension.check(job)
    check_output_dir(job.out, job.force, MANIFEST)
    if job.save_checkpoint is not None:
        check_checkpoint_target(job.save_checkpoint, job.force)


def check_disk(job: ExportJob, weights: int) -> None:
    """Refuse, before the build, an export whose files cannot fit on OUT's filesystem: its weights once
    with shared weights; else once in the weights file, once per graph and once more in a module's
    reference.

    Raises:
        AttnxError: naming what the export writes, what is free and the fix.
    """
    copies = 1
    if not shares_weights(job.settings.shared_weights, weights):
        copies += (4 if job.settings.decode else 1) + (job.module is not None)
    require_disk(int(copies * weights * DISK_SLACK) + GRAPHS_BYTES, f"exporting to {job.out}", job.out.parent)


DISK_SLACK = 1.05  # the graphs' own constants, the manifest, the parity report
GRAPHS_BYTES = 64 << 20  # a real-size model's graphs without their weights (the 0.8B Qwen3.5's: 5 MB each)


@contextlib.contextmanager
def staged(job: ExportJob) -> Iterator[Path]:
    """A staging directory that replaces OUT when the block succeeds (``--force``: only an export)."""
    with staged_directory(job.out, job.force, MANIFEST) as staging:
        yield staging


def write(
    assembly: Assembly | ModuleAssembly,
    job: ExportJob,
    directory: Path,
    extensions: Sequence[GraphExtension] = (),
    progress: Progress | None = None,
) -> ExportDir:
    """Export, lower, check and save model.onnx, the weights (and a module's reference program), the
    extensions' graphs (beside model.onnx's conversion where they trace and a core is spare) and the
    manifest into ``directory``; returns it opened."""
    report = progress or (lambda message: None)
    settings, source = job.settings, job.source
    shapes = source.shapes(assembly)
    inputs, outputs, _ = shapes
    saved = WeightStore.save(assembly.module, directory / WEIGHTS_FILE)
    size = (directory / WEIGHTS_FILE).stat().st_size
    store = saved if shares_weights(settings.shared_weights, size) else None
    if store is not None:
        report(f"saved the weights once, for every graph ({size / 2**30:.2f} GiB)")
    wanted = [(extension, extension.traces(assembly)) for extension in extensions if extension.wanted(job)]
    parallel = any(traces for _, traces in wanted) and spare_core()  # a fork only for a trace
    conversion: dict[str, float] = {}  # model.onnx's seconds, once known: the estimate of what follows
    graphs = functools.partial(
        _extension_graphs, wanted, assembly, directory, settings, store, report, conversion
    )
    with beside(graphs, parallel) as extension_graphs:
        reference, stored = source.reference(assembly, directory, store)
        report("exporting with torch.onnx (dynamo)")
        started = time.monotonic()
        proto = source.trace(assembly, shapes, store)
        used = attnx_ops(proto)
        proto = lowering_mod.lower(proto, every_op(assembly), settings.lowering, settings.target)
        if settings.lowering != "plugin":
            lowering_mod.check(proto)
        save_onnx(proto, directory / MODEL_FILE)
        conversion["took"] = time.monotonic() - started
    files = {"model": MODEL_FILE, "weights": WEIGHTS_FILE, **stored}
    sections: dict[str, Any] = {}
    for name, extra in extension_graphs():
        files.update(extra.files)
        used += [op for op in extra.ops if op not in used]
        sections[name] = extra.section
    for key, name in list(files.items()):  # a large graph's external data is listed (and hashed) too
        if name.endswith(".onnx") and (directory / f"{name}.data").is_file():
            files[f"{key}_data"] = f"{name}.data"
    manifest = Manifest(
        **reference,
        lowering=settings.lowering,
        opset=settings.opset,
        ir_version=proto.ir_version,
        seed=settings.seed,
        inputs=inputs,
        outputs=outputs,
        ops=used,
        files={key: record_file(directory, name) for key, name in files.items()},
        tolerance=assembly.tolerance(),
        dtype=assembly.dtype,
        target=target_section(settings.target, every_op(assembly), used),
        **sections,
    )
    write_atomic(directory / MANIFEST, manifest.to_json())
    return ExportDir.written(directory)


def _extension_graphs(
    extensions: Sequence[tuple[GraphExtension, int]],
    assembly: Assembly | ModuleAssembly,
    directory: Path,
    settings: ExportSettings,
    store: WeightStore | None,
    report: Progress,
    conversion: Mapping[str, float],
) -> list[tuple[str, ExtraGraphs]]:
    """Each extension's graphs, in order (genai's reads the decode graph written before it), with the
    traces each takes; the progress line estimates each from model.onnx's conversion when it ran before
    them, else says they run beside it."""
    made = []
    for extension, traces in extensions:
        count = f"{traces} trace{'s' * (traces > 1)}"
        if not traces:
            estimate = "seconds"
        elif "took" in conversion:
            estimate = f"{count}, about {traces * conversion['took']:.0f} s"
        else:
            estimate = f"{count}, in a second process beside model.onnx's"
        report(f"exporting the {extension.name} graphs ({estimate})")
        made.append((extension.name, extension.export(assembly, directory, settings, store)))
    return made


def verify_lengths(job: ExportJob, assembly: Assembly | ModuleAssembly) -> list[int]:
    """The sequence lengths to verify at: the [verify] setting, or the one length of a model whose
    length axes were all fixed (its longest example length)."""
    inputs, _, sizes = job.source.shapes(assembly)
    if any(isinstance(a, str) and a != "batch" for s in inputs for a in s.axes):
        return list(job.plan.verify.lengths(job.source.accepted_lengths(assembly)))
    return [max((n for axis, n in sizes.items() if axis != "batch"), default=1)]
