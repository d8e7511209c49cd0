"""``attnx.export``: build a model around a variant, export it to ONNX, lower, verify."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from safetensors.torch import save_model

from attnx.checkpoint import load_checkpoint
from attnx.checkpoint import save_checkpoint as write_checkpoint
from attnx.errors import AttnxError, unknown_choice
from attnx.exporter import lowering as lowering_mod
from attnx.atomic import check_output_dir, staged_directory
from attnx.exporter.assemble import Assembly, assemble
from attnx.parity.inputs import random_feed
from attnx.exporter.manifest import MODEL_FILE, WEIGHTS_FILE, Manifest, sha256_file
from attnx.parity.verify import DEFAULT_BATCH, ParityReport, verify_assembly
from attnx.models.spec import TensorSpec
from attnx.recipes import ExportSettings, Recipe, resolve

DEFAULT_OPSET = 18
SUPPORTED_OPSETS = range(18, 22)
EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # protobuf caps a file at 2 GiB
Progress = Callable[[str], None]


@dataclasses.dataclass
class ExportResult:
    out: Path
    manifest: Manifest
    attnx_nodes: int
    parity: ParityReport | None


def export(
    variant: str | None = None,
    out: str | Path = "out",
    *,
    model: str | None = None,
    recipe: str | Path | Recipe | None = None,
    cross_variant: str | None = None,
    lowering: str | None = None,
    options: Mapping[str, Any] | None = None,
    seed: int | None = None,
    opset: int | None = None,
    dtype: str | None = None,
    dynamic_axes: Sequence[str] | None = None,
    example_lengths: Mapping[str, int] | None = None,
    verify: bool | None = None,
    force: bool = False,
    seq_lens: Sequence[int] | None = None,
    batch: int | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    checkpoint: str | Path | None = None,
    save_checkpoint: str | Path | None = None,
    decode: bool = False,
    progress: Progress | None = None,
) -> ExportResult:
    """Export ``model`` built around ``variant`` to ``out`` (atomically), then verify it.

    Every setting left as None comes from ``recipe`` (a shipped name, a TOML path or a
    :class:`attnx.recipes.Recipe`), else from the defaults: a softmax ``encoder``,
    function lowering, opset 18, fp32, seed 0, every symbolic axis dynamic.

    Args:
        options: model and variant options (``{"d_model": 128}``; "model.x"/"variant.x"/"cross.x"
            to disambiguate), applied on top of the recipe's; "export.x"/"verify.x"/"bench.x"
            keys replace recipe settings.
        cross_variant: the cross-attention variant of a seq2seq model (default softmax).
        dynamic_axes: axes kept dynamic; others are fixed to their example length.
        example_lengths: per-axis lengths of the example inputs traced by torch.export.
        verify: compare torch and ONNX Runtime with Polygraphy and write ``parity.json``.
        checkpoint: weights to export (safetensors or a torch state dict) instead of the
            seeded initialisation (default: the recipe's ``[export] checkpoint``); they must match
            the model exactly.
        save_checkpoint: also write the exported weights there (``attnx.save_checkpoint``).
        decode: also write ``prefill.onnx`` and ``decode.onnx`` (KV cache or recurrent state,
            :mod:`attnx.decode`), recorded in the manifest and verified with the model.

    Raises:
        AttnxError: bad names, options or recipe, a checkpoint that does not fit, an
            existing ``out`` (or ``save_checkpoint``) without ``force``, an unwritable ``out``.
    """
    report = progress or (lambda message: None)
    out = Path(out)
    if lowering is not None and lowering not in lowering_mod.LOWERINGS:
        raise unknown_choice("lowering", lowering, lowering_mod.LOWERINGS)
    plan = resolve(recipe, variant=variant, model=model, cross_variant=cross_variant, options=options)
    plan = plan.with_settings(
        "export",
        {
            "lowering": lowering,
            "opset": opset,
            "seed": seed,
            "dtype": dtype,
            "dynamic_axes": dynamic_axes,
            "example_lengths": example_lengths,
            "checkpoint": None if checkpoint is None else str(checkpoint),
        },
    )
    plan = plan.with_settings(
        "verify", {"enabled": verify, "seq_lens": seq_lens, "batch": batch, "atol": atol, "rtol": rtol}
    )
    settings = plan.export
    if settings.opset not in SUPPORTED_OPSETS:
        raise AttnxError(
            f"opset {settings.opset} is not supported (choose {SUPPORTED_OPSETS[0]}..{SUPPORTED_OPSETS[-1]})"
        )
    if decode:
        from attnx.decode.export import check as check_decode

        check_decode(plan.model, plan.variant, settings.lowering)
    check_output_dir(out, force)
    if save_checkpoint is not None and Path(save_checkpoint).exists() and not force:
        raise AttnxError(f"checkpoint file '{save_checkpoint}' already exists; pass --force to replace it")
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
    if settings.checkpoint is not None:
        load_checkpoint(assembly.module, settings.checkpoint)
        report(f"loaded weights from {settings.checkpoint}")
    inputs, outputs, sizes = export_shapes(assembly, settings)
    with staged_directory(out, force) as staging:
        report("exporting with torch.onnx (dynamo)")
        proto = to_onnx(assembly, settings.opset, inputs, outputs, sizes)
        proto = lowering_mod.lower(proto, assembly.ops, settings.lowering)
        if settings.lowering != "plugin":
            onnx.checker.check_model(proto, full_check=True)
        save_onnx(proto, staging / MODEL_FILE)
        save_model(assembly.module, str(staging / WEIGHTS_FILE))
        decode_entry = None
        if decode:
            from attnx.decode.export import export_decode

            report("exporting prefill.onnx and decode.onnx")
            decode_entry = export_decode(assembly, staging, settings.opset, settings.lowering)
        cross = assembly.cross_variant
        manifest = Manifest(
            variant=assembly.variant.name,
            variant_config=assembly.variant_config.to_dict(),
            model=assembly.model.name,
            model_config=assembly.model_config.to_dict(),
            lowering=settings.lowering,
            opset=settings.opset,
            seed=settings.seed,
            inputs=[s.to_dict() for s in inputs],
            outputs=[s.to_dict() for s in outputs],
            ops=[f"{lowering_mod.DOMAIN}::{op.name}" for op in assembly.ops],
            weights_sha256=sha256_file(staging / WEIGHTS_FILE),
            tolerance=assembly.tolerance(),
            cross_variant=cross.name if cross else None,
            cross_variant_config=assembly.cross_variant_config.to_dict() if cross else None,
            recipe=plan.name or None,
            decode=decode_entry,
            dtype=assembly.dtype,
        )
        if decode_entry:
            manifest.files.update(decode_entry["files"])
        manifest.write(staging)
        parity = None
        if plan.verify.enabled:
            report("verifying parity (torch vs ONNX Runtime)")
            checks = plan.verify
            lengths = checks.seq_lens if _has_dynamic_length(inputs) else [_static_length(sizes)]
            parity = verify_assembly(
                staging,
                manifest,
                assembly,
                seq_lens=lengths,
                batch=checks.batch or DEFAULT_BATCH,
                atol=checks.atol,
                rtol=checks.rtol,
            )
            parity.write(staging)
    if save_checkpoint is not None:
        report(f"saving weights to {save_checkpoint}")
        write_checkpoint(assembly, save_checkpoint)
    return ExportResult(out, manifest, len(lowering_mod.attnx_nodes(proto)), parity)


def example_sizes(specs: Sequence[TensorSpec]) -> dict[str, int]:
    """Distinct, non-trivial example lengths per symbolic axis (size 1 would be specialised)."""
    sizes: dict[str, int] = {}
    lengths = iter((17, 19, 23, 29, 31))
    for spec in specs:
        for axis in spec.axes:
            if isinstance(axis, str) and axis not in sizes:
                sizes[axis] = 2 if axis == "batch" else next(lengths)
    return sizes


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


def _has_dynamic_length(specs: Sequence[TensorSpec]) -> bool:
    return any(isinstance(a, str) and a != "batch" for s in specs for a in s.axes)


def _static_length(sizes: Mapping[str, int]) -> int:
    """The length a model with only static length axes is verified at (its longest)."""
    return max((n for axis, n in sizes.items() if axis != "batch"), default=1)


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
    dims: dict[str, Any] = {}
    dynamic_shapes = tuple(
        {
            i: dims.setdefault(a, torch.export.Dim(a.replace("-", "_")))
            for i, a in enumerate(s.axes)
            if isinstance(a, str)
        }
        for s in specs
    )
    table = {op.overload: op.translation() for op in assembly.ops}
    with _quiet_exporter():
        program = torch.onnx.export(
            assembly.module,
            args,
            dynamo=True,
            input_names=[s.name for s in specs],
            output_names=[s.name for s in outputs],
            dynamic_shapes=dynamic_shapes,
            custom_translation_table=table,
            opset_version=opset,
            optimize=True,
            verbose=False,
        )
    proto = program.model_proto
    for value, spec in _declared(proto, specs + outputs):
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


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence torch.onnx's progress prints and warnings; attnx reports its own progress."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
