"""``attnx build``: a TensorRT engine for an export (``OUT/engine.plan``, recorded in ``OUT/attnx.json``).

The steps, each refusing bad input in one line before anything is written:

1. the export (``ExportDir``), the settings, the graph TensorRT's parser will read (opset <= 25,
   the plugin node contract, standard ``Attention`` nodes);
2. TensorRT and a CUDA device; the precision for this TensorRT version
   (:func:`attnx.trt.precision.precision_plan`: strongly typed on 11, flags on 10);
3. the plugins: AOT (the ops' Triton kernels compiled to PTX; the engine loads without Python)
   when every plugin op has a kernel, Triton can compile, TensorRT has AOT plugins and a tactic of
   each node's kernel fits in 48 KiB of shared memory, else JIT (``--aot``/``--jit`` insist),
   registered in this process before parsing;
4. the build (:mod:`attnx.trt.engine`) with one optimisation profile from the manifest's dynamic
   axes: "batch" takes the batch range, every other named axis the sequence range;
5. what the engine holds (:mod:`attnx.trt.inspector`), ``engine.plan`` written atomically and the
   manifest's ``engine`` section (hashes tie it to ``model.onnx``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from attnx.atomic import write_atomic
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.lowering import attnx_nodes
from attnx.exporter.manifest import EngineSection
from attnx.trt import (
    GPU_EXTRA_HINT,
    cuda_missing,
    tensorrt_missing,
    tensorrt_version,
    triton_missing,
    version_tuple,
)
from attnx.trt.aot import PluginMode, choose_plugin_mode, kernel_blocker, tensorrt_aot_missing
from attnx.trt.engine import EngineRequest, build_engine
from attnx.trt.graph import attention_nodes, check_attention_nodes, check_opset, check_plugin_nodes
from attnx.trt.inspector import EngineLayers, read_engine_information
from attnx.trt.precision import precision_plan
from attnx.trt.qdp import CALLBACKS, register_plugins

if TYPE_CHECKING:
    from attnx.ops import AttentionOp

ENGINE_FILE = "engine.plan"
DEFAULT_BATCH = (1, 2, 8)
DEFAULT_SEQ = (1, 128, 512)

Range = tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """What ``attnx build`` was asked for; ``workspace`` in bytes (None: TensorRT's default);
    ``plugins``: "aot" (``--aot``), "jit" (``--jit``) or None (AOT where possible)."""

    fp16: bool = False
    workspace: int | None = None
    batch: Range = DEFAULT_BATCH
    seq: Range = DEFAULT_SEQ
    plugins: PluginMode | None = None

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


def build(out: str | Path, settings: BuildSettings = BuildSettings(),
          progress: Callable[[str], None] | None = None) -> BuildResult:
    """Build ``OUT/engine.plan`` and record it in ``OUT/attnx.json``.

    Raises:
        AttnxError: not an export, bad settings, a graph TensorRT cannot parse, TensorRT / CUDA
            missing, ``--fp16`` on an fp32 export with TensorRT >= 11, ``--aot`` where AOT cannot
            be had, or a failed build (nothing is written).
    """
    report = progress or (lambda message: None)
    export = ExportDir.open(out)
    settings.validate()
    request, plugins = prepare(export, settings, report)
    CALLBACKS.clear()
    try:
        built = build_engine(request)
    except AttnxError:
        if CALLBACKS.errors:  # the first error raised inside a plugin callback says more
            raise CALLBACKS.errors[0] from None
        raise
    layers = read_engine_information(built.information)
    needs_python = request.plugins == "jit" or any(CALLBACKS.aot_calls[plugin] == 0 for plugin in plugins)
    loading = "needs Python to load" if needs_python else "loads without Python"
    report(f"engine: {layers.describe()}; {loading}")
    write_atomic(export.path / ENGINE_FILE, built.plan)
    precision = request.precision
    section = EngineSection(
        model_sha256=export.manifest.files["model"].sha256,
        tensorrt=str(tensorrt_version()),
        device=built.device,
        fp16=engine_has_fp16(layers, precision.fp16_flag or precision.export_dtype == "fp16"),
        workspace=settings.workspace,
        profiles=[request.profile],
        plugins=plugins,
        typing=precision.typing,
        plugin_mode=request.plugins,
        needs_python=needs_python,
        precisions=layers.precisions,
        layer_types=layers.layer_types,
        plugin_layers=layers.plugin_layers,
    )
    export.record_engine(ENGINE_FILE, section)
    return BuildResult(export.path / ENGINE_FILE, section)


def prepare(
    export: ExportDir, settings: BuildSettings, report: Callable[[str], None]
) -> tuple[EngineRequest, list[str]]:
    """Check the graph and the machine, decide precision and plugins, register them: the engine to build
    and the registered plugin ids."""
    manifest = export.manifest
    model = onnx.load(str(export.model_path), load_external_data=False)
    check_opset(manifest.opset, str(export.path))
    plugin_ops = plugin_ops_of(export, model)
    if plugin_ops:
        check_plugin_nodes(model, plugin_ops)
    attention = attention_nodes(model)
    require_tensorrt("attnx build")
    version = str(tensorrt_version())
    precision = precision_plan(version_tuple(version), manifest.dtype, settings.fp16, str(export.path))
    check_attention_nodes(attention, version_tuple(version))
    aot_reason = tensorrt_aot_missing() if plugin_ops else None
    mode, why = choose_plugin_mode(
        plugin_ops, settings.plugins, triton_missing(), aot_reason, lambda: kernel_blocker(model, plugin_ops)
    )
    plugins = register_plugins(plugin_ops, aot_kernels=mode == "aot") if plugin_ops else []
    report(f"TensorRT {version}: {precision.describe()}")
    report(plugin_summary(mode, why, len(attention)))
    profile = profile_shapes(export, settings)
    return EngineRequest(export.model_path, profile, settings.workspace, precision, mode), plugins


def plugin_ops_of(export: ExportDir, model: onnx.ModelProto) -> list[AttentionOp]:
    """The ops of the plugin nodes of ``model`` (the manifest's ``ops`` also names the decode graphs' ops)."""
    if export.manifest.lowering != "plugin":
        return []
    in_graph = {node.op_type for node in attnx_nodes(model)}
    return [op for op in export.ops() if op.name in in_graph]


def plugin_summary(mode: PluginMode | None, why: str, attention: int) -> str:
    """One progress line: how the engine computes attention and whether it needs Python."""
    if mode == "aot":
        return (f"plugins: AOT, Triton kernels compiled to PTX and serialised into the engine ({why}); "
                "the engine loads without Python")
    if mode == "jit":
        return (f"plugins: JIT, Python callbacks into the variants' torch ops ({why}); the engine needs "
                "Python with attnx to load")
    native = f"{attention} standard Attention node(s) -> TensorRT IAttention; " if attention else ""
    return f"plugins: none ({why}); {native}the engine loads without Python"


def engine_has_fp16(layers: EngineLayers, requested: bool) -> bool:
    """Whether the engine computes in fp16: from its layers (what was asked when they carry no types)."""
    return layers.has_fp16 if set(layers.precisions) - {"unknown"} else requested


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
