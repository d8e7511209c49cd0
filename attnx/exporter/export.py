"""``attnx.export``: build a model around a variant, export it to ONNX, lower, verify."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from safetensors.torch import save_model

from attnx.errors import AttnxError, unknown_choice
from attnx.exporter import lowering as lowering_mod
from attnx.exporter.artifacts import check_output_dir, staged_directory
from attnx.exporter.assemble import Assembly, assemble
from attnx.exporter.inputs import random_feed
from attnx.exporter.manifest import MODEL_FILE, WEIGHTS_FILE, Manifest, sha256_file
from attnx.exporter.verify import ParityReport, verify_assembly
from attnx.models.spec import TensorSpec

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
    variant: str = "softmax",
    out: str | Path = "out",
    *,
    model: str = "encoder",
    lowering: str = "function",
    options: dict[str, Any] | None = None,
    seed: int = 0,
    opset: int = DEFAULT_OPSET,
    verify: bool = True,
    force: bool = False,
    seq_lens: Sequence[int] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Export ``model`` built around ``variant`` to ``out`` (atomically), then verify it.

    Args:
        options: model and variant options (``{"d_model": 128}``; "model.x"/"variant.x" to disambiguate).
        verify: compare torch and ONNX Runtime with Polygraphy and write ``parity.json``.

    Raises:
        AttnxError: bad names or options, an existing ``out`` without ``force``, an unwritable ``out``.
    """
    report = progress or (lambda message: None)
    out = Path(out)
    if lowering not in lowering_mod.LOWERINGS:
        raise unknown_choice("lowering", lowering, lowering_mod.LOWERINGS)
    if opset not in SUPPORTED_OPSETS:
        raise AttnxError(f"opset {opset} is not supported (choose {SUPPORTED_OPSETS[0]}..{SUPPORTED_OPSETS[-1]})")
    check_output_dir(out, force)
    assembly = assemble(variant, model, options, seed)
    parameters = sum(p.numel() for p in assembly.module.parameters())
    report(f"built {model} with {variant} attention ({parameters / 1e6:.2f}M parameters, seed {seed})")
    with staged_directory(out, force) as staging:
        report("exporting with torch.onnx (dynamo)")
        proto = to_onnx(assembly, opset)
        proto = lowering_mod.lower(proto, assembly.ops, lowering)
        if lowering != "plugin":
            onnx.checker.check_model(proto, full_check=True)
        save_onnx(proto, staging / MODEL_FILE)
        save_model(assembly.module, str(staging / WEIGHTS_FILE))
        manifest = Manifest(
            variant=assembly.variant.name,
            variant_config=assembly.variant_config.to_dict(),
            model=assembly.model.name,
            model_config=assembly.model_config.to_dict(),
            lowering=lowering,
            opset=opset,
            seed=seed,
            inputs=[s.to_dict() for s in assembly.inputs],
            outputs=[s.to_dict() for s in assembly.outputs],
            ops=[f"{lowering_mod.DOMAIN}::{op.name}" for op in assembly.ops],
            weights_sha256=sha256_file(staging / WEIGHTS_FILE),
            tolerance=dataclasses.asdict(assembly.variant.tolerance),
        )
        manifest.write(staging)
        parity = None
        if verify:
            report("verifying parity (torch vs ONNX Runtime)")
            parity = verify_assembly(staging, manifest, assembly, seq_lens=seq_lens, atol=atol, rtol=rtol)
            parity.write(staging)
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


def to_onnx(assembly: Assembly, opset: int) -> onnx.ModelProto:
    """torch.onnx dynamo export with dynamic axes; attnx ops become bare ``attnx::`` nodes."""
    specs = assembly.inputs
    feed = random_feed(specs, example_sizes(specs), np.random.default_rng(0))
    args = tuple(torch.from_numpy(feed[s.name]) for s in specs)
    dims: dict[str, Any] = {}
    dynamic_shapes = tuple(
        {i: dims.setdefault(a, torch.export.Dim(a.replace("-", "_"))) for i, a in enumerate(s.axes) if isinstance(a, str)}
        for s in specs
    )
    table = {op.overload: op.translation() for op in assembly.ops}
    with _quiet_exporter():
        program = torch.onnx.export(
            assembly.module,
            args,
            dynamo=True,
            input_names=[s.name for s in specs],
            output_names=[s.name for s in assembly.outputs],
            dynamic_shapes=dynamic_shapes,
            custom_translation_table=table,
            opset_version=opset,
            optimize=True,
            verbose=False,
        )
    proto = program.model_proto
    _name_dynamic_axes(proto, specs + assembly.outputs)
    return proto


def _name_dynamic_axes(proto: onnx.ModelProto, specs: Sequence[TensorSpec]) -> None:
    """Give graph inputs/outputs the manifest's axis names (batch, seq) instead of s0, s1."""
    by_name = {s.name: s for s in specs}
    for value in [*proto.graph.input, *proto.graph.output]:
        spec = by_name.get(value.name)
        if spec is None:
            continue
        for dim, axis in zip(value.type.tensor_type.shape.dim, spec.axes):
            if isinstance(axis, str):
                dim.ClearField("dim_value")
                dim.dim_param = axis


def save_onnx(proto: onnx.ModelProto, path: Path) -> None:
    large = proto.ByteSize() > EXTERNAL_DATA_THRESHOLD
    onnx.save_model(proto, str(path), save_as_external_data=large, location=f"{path.name}.data" if large else None)


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
