"""The TensorRT calls of ``attnx build``: parse, configure, build, inspect (tensorrt and a GPU).

Built with TensorRT's own API rather than Polygraphy's loaders, because the network needs
creation flags Polygraphy does not pass (``PREFER_AOT_PYTHON_PLUGINS`` /
``PREFER_JIT_PYTHON_PLUGINS``) and because the precision flags must follow the TensorRT version
(:mod:`attnx.trt.precision`): on TensorRT 11 no precision flag is touched (``BuilderFlag.FP16``
does not exist and the deprecated ``STRONGLY_TYPED`` creation flag is ignored), on TensorRT 10 the
FP16 flag is set for fp16 builds. TF32 is switched off so that fp32 layers compute in fp32, and
``ProfilingVerbosity.DETAILED`` keeps per-layer types for the engine inspector.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from attnx.errors import AttnxError
from attnx.trt.aot import PluginMode
from attnx.trt.precision import PrecisionPlan

_PREFERENCE_FLAGS = {"aot": "PREFER_AOT_PYTHON_PLUGINS", "jit": "PREFER_JIT_PYTHON_PLUGINS"}


@dataclasses.dataclass(frozen=True)
class EngineRequest:
    """One engine to build: the ONNX file, one optimisation profile (input -> min/opt/max shapes), the
    workspace limit in bytes (None: TensorRT's), the precision, and how plugins run (None: none)."""

    model: Path
    profile: dict[str, dict[str, list[int]]]
    workspace: int | None
    precision: PrecisionPlan
    plugins: PluginMode | None


@dataclasses.dataclass(frozen=True)
class BuiltEngine:
    """A serialized engine and what the engine inspector says about it (its JSON, parsed)."""

    plan: bytes
    information: dict[str, Any]
    device: str


def network_flags(trt: Any, plugins: PluginMode | None) -> int:
    """The network creation flags: only the Python-plugin preference (never STRONGLY_TYPED: TensorRT 11
    types every network strongly, and attnx keeps TensorRT 10 weakly typed)."""
    name = _PREFERENCE_FLAGS.get(plugins) if plugins else None
    flag = getattr(trt.NetworkDefinitionCreationFlag, name, None) if name else None
    return 0 if flag is None else 1 << int(flag)


def configure(trt: Any, builder: Any, config: Any, request: EngineRequest) -> None:
    """Set ``config`` (an ``IBuilderConfig``) for ``request``: verbosity, TF32 off, FP16 only when weakly
    typed and asked, workspace, one optimisation profile."""
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    config.clear_flag(trt.BuilderFlag.TF32)
    if request.precision.fp16_flag:
        config.set_flag(trt.BuilderFlag.FP16)
    if request.workspace:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, request.workspace)
    profile = builder.create_optimization_profile()
    for name, point in request.profile.items():
        profile.set_shape(name, point["min"], point["opt"], point["max"])
    config.add_optimization_profile(profile)


def build_engine(request: EngineRequest) -> BuiltEngine:
    """Parse, build and inspect the engine of ``request``.

    Raises:
        AttnxError: the parser refused the model or the builder failed (TensorRT logged the details).
    """
    import tensorrt as trt
    import torch

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, request.plugins))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(request.model)):
        errors = [str(parser.get_error(i).desc()) for i in range(parser.num_errors)] or ["no error recorded"]
        raise AttnxError(f"TensorRT's ONNX parser refused {request.model}: {errors[0]}")
    config = builder.create_builder_config()
    configure(trt, builder, config, request)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise AttnxError(f"TensorRT could not build an engine from {request.model} (see its log above)")
    plan = bytes(serialized)
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    information = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    return BuiltEngine(plan, json.loads(information), torch.cuda.get_device_name())
