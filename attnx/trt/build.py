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
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attnx.errors import AttnxError
from attnx.atomic import write_atomic
from attnx.exporter.manifest import MODEL_FILE, Manifest, sha256_file
from attnx.trt import GPU_EXTRA_HINT, cuda_missing, first_line, tensorrt_missing

ENGINE_FILE = "engine.plan"
DEFAULT_BATCH = (1, 2, 8)
DEFAULT_SEQ = (1, 128, 512)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

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
    record: dict[str, Any]


def parse_size(text: str) -> int:
    """"4G", "512MiB", "1.5GB", "1048576" -> bytes (binary units)."""
    match = _SIZE.match(text)
    if not match:
        raise AttnxError(f"--workspace must be a size like 4G, 512M or 1073741824 (got '{text}')")
    unit = (match.group(2) or "").upper().rstrip("B").rstrip("I") or ""
    return int(float(match.group(1)) * _UNITS[unit])


def profile_shapes(manifest: Manifest, settings: BuildSettings) -> dict[str, dict[str, list[int]]]:
    """Per input, the min/opt/max shapes of the optimisation profile (from the manifest's axes)."""
    shapes: dict[str, dict[str, list[int]]] = {}
    for spec in manifest.input_specs():
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


def ops_for(manifest: Manifest) -> list[Any]:
    """The AttentionOp objects named in the manifest, from the registered variants' implementations."""
    from attnx.registry import get_registry

    registry = get_registry()
    wanted = {name.split("::", 1)[-1] for name in manifest.ops}
    found: dict[str, Any] = {}
    names = [manifest.variant] + [n for n in sorted(registry.variants) if n != manifest.variant]
    for name in names:
        if wanted <= set(found):
            break
        for op in registry.variant(name).load().ops:
            if op.name in wanted:
                found.setdefault(op.name, op)
    missing = wanted - set(found)
    if missing:
        raise AttnxError(f"no registered variant provides {', '.join(sorted(missing))}; install its plugin")
    return [found[name] for name in sorted(wanted)]


def prepare_plugins(model_path: Path, lowering: str, ops: Sequence[Any]) -> list[str]:
    """For a plugin-lowered model: check the node contract and register the QDP plugins."""
    if lowering != "plugin":
        return []
    import onnx

    from attnx.trt.graph import check_plugin_nodes
    from attnx.trt.qdp import register_plugins

    check_plugin_nodes(onnx.load(str(model_path), load_external_data=False), ops)
    return register_plugins(ops)


def build(out: str | Path, settings: BuildSettings = BuildSettings(),
          progress: Callable[[str], None] | None = None) -> BuildResult:
    """Build ``OUT/engine.plan`` and record the settings in ``OUT/attnx.json``.

    Raises:
        AttnxError: not an export, bad settings, or TensorRT / CUDA missing (nothing is written).
    """
    report = progress or (lambda message: None)
    directory = Path(out)
    manifest = Manifest.read(directory)
    model_path = directory / MODEL_FILE
    if not model_path.is_file():
        raise AttnxError(f"'{directory}' lacks {MODEL_FILE}; re-export it with `attnx export`")
    settings.validate()
    require_tensorrt("attnx build")
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath, Profile

    plugins = prepare_plugins(model_path, manifest.lowering, ops_for(manifest))
    shapes = profile_shapes(manifest, settings)
    profile = Profile()
    for name, point in shapes.items():
        profile.add(name, point["min"], point["opt"], point["max"])
    limits = {trt.MemoryPoolType.WORKSPACE: settings.workspace} if settings.workspace else None
    fp16 = settings.fp16 or manifest.dtype == "fp16"  # an fp16 export's layers run in fp16
    config = CreateConfig(fp16=fp16, profiles=[profile], memory_pool_limits=limits)
    report(f"building a TensorRT {trt.__version__} engine ({'fp16' if fp16 else 'fp32'}, "
           f"{manifest.lowering} lowering)")
    from polygraphy.exception import PolygraphyException

    try:
        serialized = EngineBytesFromNetwork(NetworkFromOnnxPath(str(model_path)), config=config)()
    except PolygraphyException as exc:  # parser or builder failure: TensorRT logged the details above
        raise AttnxError(f"TensorRT could not build {model_path}: {first_line(exc)}") from None
    engine_path = directory / ENGINE_FILE
    write_atomic(engine_path, bytes(serialized))
    import torch

    record = {
        "file": ENGINE_FILE,
        "sha256": sha256_file(engine_path),
        "model_sha256": sha256_file(model_path),
        "tensorrt": trt.__version__,
        "device": torch.cuda.get_device_name(),
        "fp16": fp16,
        "workspace": settings.workspace,
        "profiles": [shapes],
        "plugins": plugins,
    }
    manifest.engine = record
    manifest.write(directory)
    return BuildResult(engine_path, record)


def engine_problem(directory: Path) -> str | None:
    """Why ``OUT/engine.plan`` cannot be used for OUT/model.onnx (None when it can)."""
    engine_path = directory / ENGINE_FILE
    fix = f"run `attnx build {directory}`"
    if not engine_path.is_file():
        return f"no {directory.name}/{ENGINE_FILE}: {fix}"
    record = Manifest.read(directory).engine
    if not record:
        return f"{directory.name}/{ENGINE_FILE} is not recorded in the manifest: {fix}"
    if record.get("model_sha256") != sha256_file(directory / MODEL_FILE):
        return f"{directory.name}/{ENGINE_FILE} was built from another model.onnx: {fix}"
    if record.get("sha256") != sha256_file(engine_path):
        return f"{directory.name}/{ENGINE_FILE} changed since `attnx build`: {fix}"
    return None


def check_shapes(record: dict[str, Any], feed: dict[str, Any]) -> None:
    """Refuse a feed outside the engine's optimisation profile, naming the axis and the fix."""
    profiles = record.get("profiles") or [{}]
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
