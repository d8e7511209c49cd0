"""Writing an export: the model's ONNX graph(s), its weights and the manifest, into a staged OUT.

One typed job (:class:`ExportJob`: the resolved recipe plus where to write) goes through named
steps that :func:`attnx.api.run_export` strings together: :func:`preflight` refuses what cannot
be done before any work, :func:`build` makes the torch model, :func:`write` fills a staged
directory (:func:`staged`), which becomes OUT only when everything, verification included,
succeeded. A job for ``attnx.export_module`` carries a :class:`attnx.exporter.module.ModuleSource`
instead of a model name: only :func:`build` (where the module and its TensorSpecs come from),
the graph's source in :func:`write` and the manifest's description of the reference differ.
Graphs beside model.onnx (decode) come from :class:`GraphExtension` objects the
caller passes, so this module does not know them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import torch
from safetensors.torch import save_model

from attnx.atomic import check_output_dir, staged_directory, write_atomic
from attnx.checkpoint import check_checkpoint_target, load_checkpoint
from attnx.domains import DOMAIN
from attnx.errors import AttnxError, unknown_choice
from attnx.exporter import lowering as lowering_mod
from attnx.exporter.assemble import Assembly, assemble
from attnx.exporter.budget import EXPORT_WEIGHT_COPIES, ORT_WEIGHT_COPIES, check_needs, require_memory
from attnx.exporter.directory import ExportDir, record_file
from attnx.exporter.inputs import random_feed
from attnx.exporter.manifest import MANIFEST, MODEL_FILE, MODULE_MODEL, WEIGHTS_FILE, Manifest
from attnx.exporter.module import (
    ModuleAssembly,
    ModuleSource,
    build_module,
    quiet_torch,
    save_reference,
    unwrap_interrupt,
)
from attnx.exporter.opsets import check_onnxruntime, check_opset
from attnx.exporter.signature import dynamic_shapes
from attnx.exporter.targets import check_target, target_section
from attnx.models.spec import TensorSpec
from attnx.ops import AttentionOp
from attnx.recipes import ExportSettings, Recipe
from attnx.registry import get_registry

EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # protobuf caps a file at 2 GiB
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

    def export(self, assembly: Assembly, directory: Path, settings: ExportSettings) -> ExtraGraphs:
        """Write the graphs into ``directory``."""


def preflight(job: ExportJob, extensions: Sequence[GraphExtension] = ()) -> None:
    """Refuse a job that cannot succeed before anything is built or written.

    Raises:
        AttnxError: an opset attnx does not write, that the lowering cannot serve the variants' ops at
            or that the installed ONNX Runtime cannot verify, an extension that cannot serve the job,
            an OUT (or --save-checkpoint file) that exists without --force or cannot be written.
    """
    settings = job.settings
    check_opset(settings.opset, settings.lowering, job_ops(job))
    check_target(settings.target, settings.lowering, job_ops(job), known=job.module is None)
    if job.plan.verify.enabled:
        import onnxruntime

        check_onnxruntime(settings.opset, onnxruntime.__version__)
    if job.module is not None and (settings.example_lengths or settings.dynamic_axes is not None):
        raise AttnxError(
            "a module export takes its example lengths and dynamic axes from its example inputs and "
            "dynamic_axes, not from export.example_lengths/export.dynamic_axes"
        )
    if job.module is not None and settings.tokenizer is not None:
        raise AttnxError("--tokenizer serves attnx's own lm exports; a module export does not take one yet")
    for extension in extensions:
        if extension.wanted(job):
            extension.check(job)
    check_output_dir(job.out, job.force, MANIFEST)
    if job.save_checkpoint is not None:
        check_checkpoint_target(job.save_checkpoint, job.force)


def job_ops(job: ExportJob) -> list[AttentionOp]:
    """The attnx ops the job's graphs may hold: its variants' (with their decode ops for --decode); none
    known before a module export is traced (its lowering refuses an op without a body at the opset)."""
    if job.module is not None:
        return []
    registry = get_registry()
    names = [n for n in (job.plan.variant, job.plan.cross_variant) if n]
    impls = [registry.variant(name).load() for name in names]
    return [op for impl in impls for op in (*impl.ops, *(impl.decode_ops if job.settings.decode else ()))]


def every_op(assembly: Assembly | ModuleAssembly) -> list[AttentionOp]:
    """Every op the export's graphs may hold: the full forward's and its variants' step ops."""
    ops = {op.name: op for op in assembly.ops}
    for impl in assembly.impls.values():
        ops.update({op.name: op for op in impl.decode_ops})
    return list(ops.values())


def build(job: ExportJob, progress: Progress | None = None) -> Assembly | ModuleAssembly:
    """The torch model the job exports: seeded initialisation, or the job's checkpoint; or the job's
    module, adapted and traced."""
    report = progress or (lambda message: None)
    if job.module is not None:
        report("applying adapters and tracing the module with torch.export")
        built = build_module(job.module)
        adapters = ", ".join(built.section.adapters) or "none"
        report(f"traced {built.section.module_class} ({built.dtype}, adapters: {adapters})")
        return built
    plan, settings = job.plan, job.settings
    assembly = assemble(
        plan.variant,
        plan.model,
        plan.options,
        settings.seed,
        cross_variant=plan.cross_variant,
        dtype=settings.dtype,
    )
    parameters = sum(p.numel() for p in assembly.module.parameters())
    report(
        f"built {plan.model} with {plan.variant} attention ({parameters / 1e6:.2f}M parameters, "
        f"{settings.dtype}, seed {settings.seed})"
    )
    checkpoint = job.checkpoint or settings.checkpoint  # given, else the recipe's [export] checkpoint
    if checkpoint is not None:
        load_checkpoint(assembly.module, checkpoint)
        report(f"loaded weights from {checkpoint}")
    return assembly


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
    extensions' graphs and the manifest into ``directory``; returns it opened."""
    report = progress or (lambda message: None)
    settings = job.settings
    inputs, outputs, sizes = shapes(assembly, settings)
    report("exporting with torch.onnx (dynamo)")
    if isinstance(assembly, ModuleAssembly):  # the program traced when the module was built
        proto = export_onnx(assembly.program, (), assembly.ops, settings.opset, inputs, outputs)
    else:
        proto = to_onnx(assembly, settings.opset, inputs, outputs, sizes)
    used = attnx_ops(proto)
    if isinstance(assembly, ModuleAssembly):  # its ops are known now that it is traced
        check_target(settings.target, settings.lowering, every_op(assembly))
    proto = lowering_mod.lower(proto, assembly.ops, settings.lowering, settings.target)
    if settings.lowering != "plugin":
        lowering_mod.check(proto)
    save_onnx(proto, directory / MODEL_FILE)
    save_model(assembly.module, str(directory / WEIGHTS_FILE))
    files = {"model": MODEL_FILE, "weights": WEIGHTS_FILE}
    if isinstance(assembly, ModuleAssembly):
        files[assembly.section.program] = save_reference(assembly, directory)
    sections: dict[str, Any] = {}
    for extension in extensions:
        if extension.wanted(job):
            report(f"exporting the {extension.name} graphs")
            extra = extension.export(assembly, directory, settings)
            files.update(extra.files)
            used += [op for op in extra.ops if op not in used]
            sections[extension.name] = extra.section
    manifest = Manifest(
        **reference_source(assembly, job),
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
    return ExportDir.open(directory)


def reference_source(assembly: Assembly | ModuleAssembly, job: ExportJob) -> dict[str, Any]:
    """The manifest fields that say where the torch reference comes from: the model, its variants and
    their configs (rebuilt by name), or a module's section (its stored program); a module export
    names its first variant and the model "module", with no options (its layers carry their own)."""
    if isinstance(assembly, ModuleAssembly):
        return {
            "variant": assembly.variants[0].name,
            "variant_config": {},
            "model": MODULE_MODEL,
            "model_config": {},
            "module": assembly.section,
        }
    cross = assembly.cross_variant
    return {
        "variant": assembly.variant.name,
        "variant_config": assembly.variant_config.to_dict(),
        "model": assembly.model.name,
        "model_config": assembly.model_config.to_dict(),
        "cross_variant": cross.name if cross else None,
        "cross_variant_config": assembly.cross_variant_config.to_dict() if cross else None,
        "recipe": job.plan.name or None,
    }


def attnx_ops(proto: onnx.ModelProto) -> list[str]:
    """The distinct ``attnx::`` ops of a graph, in order of first use."""
    return list(dict.fromkeys(f"{DOMAIN}::{node.op_type}" for node in lowering_mod.attnx_nodes(proto)))


def verify_lengths(job: ExportJob, assembly: Assembly | ModuleAssembly) -> list[int]:
    """The sequence lengths to verify at: the [verify] setting, or the one length of a model whose
    length axes were all fixed (its longest example length)."""
    inputs, _, sizes = shapes(assembly, job.settings)
    if any(isinstance(a, str) and a != "batch" for s in inputs for a in s.axes):
        return list(job.plan.verify.seq_lens)
    return [max((n for axis, n in sizes.items() if axis != "batch"), default=1)]


def check_memory(job: ExportJob) -> None:
    """Refuse an export that cannot fit in memory before building it: the model is built on torch's
    meta device (no memory) to count its weights, and the parity check's largest case is costed.

    Raises:
        AttnxError: the estimate exceeds the memory available, naming both and the fix.
    """
    import torch

    if job.module is not None:  # already in memory: count the copies an export adds, no cost model
        weights = sum(p.numel() * p.element_size() for p in job.module.module.parameters())
        require_memory(
            EXPORT_WEIGHT_COPIES * weights,
            f"exporting this module ({weights / 2**30:.2f} GiB of weights)",
            "export it on a machine with more memory",
        )
        return
    plan, settings = job.plan, job.settings
    with torch.device("meta"):
        assembly = assemble(
            plan.variant,
            plan.model,
            plan.options,
            settings.seed,
            cross_variant=plan.cross_variant,
            dtype=settings.dtype,
        )
    weights = sum(p.numel() * p.element_size() for p in assembly.module.parameters())
    roles = {"self": (assembly.variant, assembly.variant_config)}
    if assembly.cross_variant is not None:
        roles["cross"] = (assembly.cross_variant, assembly.cross_variant_config)
    checks = plan.verify
    if checks.enabled:  # the parity check's largest case, torch and ORT side by side
        copies, batch, seq = EXPORT_WEIGHT_COPIES, checks.batch, max(checks.seq_lens)
    else:  # only the export's own trace
        copies, batch, seq = (
            EXPORT_WEIGHT_COPIES - ORT_WEIGHT_COPIES,
            2,
            max(example_sizes(assembly.inputs).values()),
        )
    needed = check_needs(
        assembly.model,
        assembly.model_config,
        roles,
        weights_bytes=weights,
        weight_copies=copies,
        batch=batch,
        seq=seq,
    )
    require_memory(
        needed,
        f"exporting this {plan.model} ({weights / 2**30:.2f} GiB of weights)",
        "make it smaller (vocab_size, d_model, n_layers) or verify at shorter --seq-lens",
    )


def example_sizes(specs: Sequence[TensorSpec]) -> dict[str, int]:
    """Distinct, non-trivial example lengths per symbolic axis (size 1 would be specialised)."""
    sizes: dict[str, int] = {}
    lengths = iter((17, 19, 23, 29, 31))
    for spec in specs:
        for axis in spec.axes:
            if isinstance(axis, str) and axis not in sizes:
                sizes[axis] = 2 if axis == "batch" else next(lengths)
    return sizes


def shapes(
    assembly: Assembly | ModuleAssembly, settings: ExportSettings
) -> tuple[list[TensorSpec], list[TensorSpec], dict[str, int]]:
    """The graph's inputs, outputs and example length per axis: a module's come from its example
    inputs (traced already), a model's from :func:`export_shapes`."""
    if isinstance(assembly, ModuleAssembly):
        return assembly.inputs, assembly.outputs, assembly.sizes()
    return export_shapes(assembly, settings)


def export_shapes(
    assembly: Assembly, settings: ExportSettings
) -> tuple[list[TensorSpec], list[TensorSpec], dict[str, int]]:
    """Inputs and outputs with the axes ``settings`` fixes made static, and the example sizes.

    Raises:
        AttnxError: an axis the model does not have, or a dynamic axis of example length 1.
    """
    inputs, outputs = assembly.inputs, assembly.outputs
    sizes = example_sizes(inputs)
    axes = list(sizes)
    given = dict(settings.example_lengths or {})
    for axis in [*given, *(settings.dynamic_axes or ())]:
        if axis not in sizes:
            raise unknown_choice(f"axis of model {assembly.model.name}", axis, axes)
    sizes.update(given)
    dynamic = set(axes if settings.dynamic_axes is None else settings.dynamic_axes)
    for axis in sorted(dynamic):
        if sizes[axis] < 2:
            raise AttnxError(f"example length of dynamic axis '{axis}' must be >= 2 (1 would be specialised)")

    def fix(spec: TensorSpec) -> TensorSpec:
        fixed = tuple(sizes[a] if isinstance(a, str) and a not in dynamic else a for a in spec.axes)
        return dataclasses.replace(spec, axes=fixed)

    return [fix(s) for s in inputs], [fix(s) for s in outputs], sizes


def to_onnx(
    assembly: Assembly,
    opset: int,
    inputs: Sequence[TensorSpec] | None = None,
    outputs: Sequence[TensorSpec] | None = None,
    sizes: Mapping[str, int] | None = None,
) -> onnx.ModelProto:
    """torch.onnx dynamo export; named axes are dynamic, attnx ops become bare ``attnx::`` nodes.

    ``inputs``/``outputs`` default to the model's specs (every symbolic axis dynamic) and
    ``sizes`` (example length per axis) to :func:`example_sizes`.
    """
    specs = list(inputs or assembly.inputs)
    outputs = list(outputs or assembly.outputs)
    feed = random_feed(specs, sizes or example_sizes(specs), np.random.default_rng(0))
    args = tuple(torch.from_numpy(feed[s.name]) for s in specs)
    return export_onnx(assembly.module, args, assembly.ops, opset, specs, outputs, dynamic_shapes(specs))


def export_onnx(
    model: Any,
    args: tuple[Any, ...],
    ops: Sequence[Any],
    opset: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    dynamic_shapes: Any = None,
) -> onnx.ModelProto:
    """torch.onnx (dynamo) of a module called with ``args``, or of an ``ExportedProgram`` (``args`` and
    ``dynamic_shapes`` unused), with ``ops`` as bare ``attnx::`` nodes; checks the graph's dtypes
    against the specs and names their dynamic axes."""
    table = {op.overload: op.translation() for op in ops}
    with quiet_torch(), unwrap_interrupt():
        program = torch.onnx.export(
            model,
            args,
            dynamo=True,
            input_names=[s.name for s in inputs],
            output_names=[s.name for s in outputs],
            dynamic_shapes=dynamic_shapes,
            custom_translation_table=table,
            opset_version=opset,
            optimize=True,
            verbose=False,
        )
    proto = program.model_proto
    for value, spec in _declared(proto, [*inputs, *outputs]):
        _check_dtype(value, spec)
        _name_dynamic_axes(value, spec)
    return proto


def _declared(proto: onnx.ModelProto, specs: Sequence[TensorSpec]) -> Iterator[tuple[Any, TensorSpec]]:
    """Each graph input/output that ``specs`` declare, with its spec."""
    by_name = {s.name: s for s in specs}
    for value in [*proto.graph.input, *proto.graph.output]:
        if value.name in by_name:
            yield value, by_name[value.name]


def _check_dtype(value: Any, spec: TensorSpec) -> None:
    """A graph input/output has the dtype the manifest will declare.

    Raises:
        AttnxError: a model whose forward returns another dtype than its specs declare
            (e.g. float32 logits from an fp16 model, after an explicit upcast).
    """
    actual = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    if actual != np.dtype(spec.dtype):
        raise AttnxError(
            f"graph tensor '{value.name}' is {actual} but the model declares {spec.dtype}; "
            "a model computes in its export dtype and declares activations as float32 (TensorSpec)"
        )


def _name_dynamic_axes(value: Any, spec: TensorSpec) -> None:
    """Give a graph input/output the manifest's axis names (batch, seq) instead of s0, s1."""
    for dim, axis in zip(value.type.tensor_type.shape.dim, spec.axes, strict=False):
        if isinstance(axis, str):
            dim.ClearField("dim_value")
            dim.dim_param = axis


def save_onnx(proto: onnx.ModelProto, path: Path) -> None:
    large = proto.ByteSize() > EXTERNAL_DATA_THRESHOLD
    onnx.save_model(
        proto, str(path), save_as_external_data=large, location=f"{path.name}.data" if large else None
    )
