"""``attnx build``: a TensorRT engine for an export, through Polygraphy.

``EngineBytesFromNetwork(NetworkFromOnnxPath(OUT/model.onnx), CreateConfig(fp16=...,
profiles=[Profile().add(input, min, opt, max), ...], memory_pool_limits={WORKSPACE: n}))``
with one optimisation profile derived from the manifest's dynamic axes: the axis "batch"
takes the batch range, every other named axis the sequence range, fixed axes stay fixed.
The serialized engine is written to ``OUT/engine.plan`` atomically, and the settings are
recorded in ``OUT/attnx.json`` under ``engine`` (with the hashes that tie the engine to
``model.onnx``).

A ``function``/``decomposed`` model is parsed by TensorRT's ONNX parser as is; for a
``plugin`` model the attnx QDP plugins are registered first (and again before the engine is
deserialized: JIT QDP engines need Python and the registrations at load time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx

from attnx.atomic import write_atomic
from attnx.errors import AttnxError, first_line
from attnx.exporter.directory import ExportDir
from attnx.exporter.manifest import EngineSection
from attnx.trt import GPU_EXTRA_HINT, cuda_missing, tensorrt_missing
from attnx.trt.graph import check_plugin_nodes
from attnx.trt.qdp import register_plugins

ENGINE_FILE = "engine.plan"
DEFAULT_BATCH = (1, 2, 8)
DEFAULT_SEQ = (1, 128, 512)

Range = tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """What ``attnx build`` was asked for; ``workspace`` in bytes (None: TensorRT's default)."""

    fp16: bool = False
    workspace: int | None = None
    batch: Range = DEFAULT_BATCH
    seq: Range = DEFAULT_SEQ

    def validate(self) -> None:
        for name, (low, opt, high) in (("batch", self.batch), ("seq", self.seq)):
            if not 1 <= low <= opt <= high:
                raise AttnxError(
                    f"--min-{name}/--opt-{name}/--max-{name} must satisfy 1 <= min <= opt <= max "
                    f"(got {low}, {opt}, {high})"
                )
        if self.workspace is not None and self.workspace < 1:
            raise AttnxError(f"--workspace must be positive (got {self.workspace} bytes)")


@dataclasses.dataclass
class BuildResult:
    engine: Path
    record: EngineSection


def profile_shapes(export: ExportDir, settings: BuildSettings) -> dict[str, dict[str, list[int]]]:
    """Per input, the min/opt/max shapes of the optimisation profile (from the manifest's axes)."""
    shapes: dict[str, dict[str, list[int]]] = {}
    for spec in export.manifest.inputs:
        point: dict[str, list[int]] = {"min": [], "opt": [], "max": []}
        for axis in spec.axes:
            if isinstance(axis, int):
                values: Range = (axis, axis, axis)
            else:
                values = settings.batch if axis == "batch" else settings.seq
            for key, value in zip(point, values, strict=True):
                point[key].append(int(value))
        shapes[spec.name] = point
    return shapes


def require_tensorrt(what: str) -> None:
    """Raise a one-line AttnxError when TensorRT or a CUDA device is missing."""
    reason = tensorrt_missing()
    if reason:
        raise AttnxError(f"{what} needs TensorRT: {reason}; install it with {GPU_EXTRA_HINT}")
    reason = cuda_missing()
    if reason:
        raise AttnxError(f"{what} needs a CUDA device: {reason}")


def prepare_plugins(model_path: Path, lowering: str, ops: Sequence[Any]) -> list[str]:
    """For a plugin-lowered model: check the node contract and register the QDP plugins."""
    if lowering != "plugin":
        return []
    check_plugin_nodes(onnx.load(str(model_path), load_external_data=False), ops)
    return register_plugins(ops)


def build(out: str | Path, settings: BuildSettings = BuildSettings(),
          progress: Callable[[str], None] | None = None) -> BuildResult:
    """Build ``OUT/engine.plan`` and record it in ``OUT/attnx.json``.

    Raises:
        AttnxError: not an export, bad settings, or TensorRT / CUDA missing (nothing is written).
    """
    report = progress or (lambda message: None)
    export = ExportDir.open(out)
    settings.validate()
    require_tensorrt("attnx build")
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath, Profile
    from polygraphy.exception import PolygraphyException

    manifest = export.manifest
    plugins = prepare_plugins(export.model_path, manifest.lowering, export.ops())
    shapes = profile_shapes(export, settings)
    profile = Profile()
    for name, point in shapes.items():
        profile.add(name, point["min"], point["opt"], point["max"])
    limits = {trt.MemoryPoolType.WORKSPACE: settings.workspace} if settings.workspace else None
    fp16 = settings.fp16 or manifest.dtype == "fp16"  # an fp16 export's layers run in fp16
    config = CreateConfig(fp16=fp16, profiles=[profile], memory_pool_limits=limits)
    report(f"building a TensorRT {trt.__version__} engine ({'fp16' if fp16 else 'fp32'}, "
           f"{manifest.lowering} lowering)")
    try:
        serialized = EngineBytesFromNetwork(NetworkFromOnnxPath(str(export.model_path)), config=config)()
    except PolygraphyException as exc:  # parser or builder failure: TensorRT logged the details above
        raise AttnxError(f"TensorRT could not build {export.model_path}: {first_line(exc)}") from None
    write_atomic(export.path / ENGINE_FILE, bytes(serialized))
    import torch

    section = EngineSection(
        model_sha256=manifest.files["model"].sha256,
        tensorrt=trt.__version__,
        device=torch.cuda.get_device_name(),
        fp16=fp16,
        workspace=settings.workspace,
        profiles=[shapes],
        plugins=plugins,
    )
    export.record_engine(ENGINE_FILE, section)
    return BuildResult(export.path / ENGINE_FILE, section)


def engine_problem(export: ExportDir) -> str | None:
    """Why the export's engine cannot be used for its model.onnx (None when it can)."""
    fix = f"run `attnx build {export.path}`"
    if not export.has("engine") or export.manifest.engine is None:
        return f"{export.label} has no TensorRT engine: {fix}"
    if export.manifest.engine.model_sha256 != export.manifest.files["model"].sha256:
        return f"{export.label}/{ENGINE_FILE} was built from another model.onnx: {fix}"
    return None


def check_shapes(engine: EngineSection, feed: dict[str, Any]) -> None:
    """Refuse a feed outside the engine's optimisation profile, naming the axis and the fix."""
    profiles = engine.profiles or [{}]
    for name, point in profiles[0].items():
        if name not in feed:
            continue
        shape = list(feed[name].shape)
        for axis, (value, low, high) in enumerate(zip(shape, point["min"], point["max"], strict=True)):
            if not low <= value <= high:
                raise AttnxError(
                    f"input {name} has size {value} on axis {axis}, outside the engine's profile "
                    f"[{low}, {high}]; rebuild with `attnx build` and wider --min/--max ranges"
                )
