"""Polygraphy runners: a CPU/GPU-aware torch runner and the ONNX backends attnx compares.

Polygraphy's own ``PytRunner`` calls ``.cuda()`` unconditionally and mishandles
dtypes, so the torch side is a small :class:`BaseRunner` of our own.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from attnx.errors import AttnxError
from attnx.exporter.lowering import attach_functions, strip_plugin_attributes
from attnx.models.spec import TensorSpec
from attnx.ops import AttentionOp


class TorchRunner(BaseRunner):
    """Runs an attnx model module (inputs in ``specs`` order) on CPU or CUDA."""

    def __init__(self, module: torch.nn.Module, specs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 device: str = "cpu", name: str = "torch") -> None:
        super().__init__(name=name)
        self.module, self.specs, self.outputs, self.device = module, list(specs), list(outputs), device

    def activate_impl(self) -> None:
        self.module.to(self.device).eval()

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for spec in self.specs:
            meta.add(spec.name, np.dtype(spec.dtype), [None if isinstance(a, str) else a for a in spec.axes])
        return meta

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(feed_dict[s.name])).to(self.device) for s in self.specs]
        start = time.perf_counter()
        with torch.inference_mode():
            results = self.module(*args)
        self.inference_time = time.perf_counter() - start
        results = results if isinstance(results, tuple) else (results,)
        pairs = zip(self.outputs, results, strict=False)
        return OrderedDict((s.name, r.detach().float().cpu().numpy()) for s, r in pairs)

    def deactivate_impl(self) -> None:
        self.module.to("cpu")


@dataclasses.dataclass(frozen=True)
class Backend:
    """An ONNX backend to compare against torch.

    ``unavailable(directory)`` returns the reason it cannot run here (None when it can);
    ``directory`` is the export being verified (None: a general check, as in ``attnx doctor``).
    ``runner(model_path, lowering, ops)`` returns the Polygraphy runner.
    """

    name: str
    description: str
    unavailable: Callable[[Path | None], str | None]
    runner: Callable[[Path, str, Sequence[AttentionOp]], BaseRunner]


def _ort_providers() -> list[str]:
    import onnxruntime

    return onnxruntime.get_available_providers()


def _ort_missing(
    provider: str, hint: str, needs_tensorrt: bool = False
) -> Callable[[Path | None], str | None]:
    def check(directory: Path | None = None) -> str | None:
        if provider not in _ort_providers():
            return f"onnxruntime has no {provider} ({hint})"
        if needs_tensorrt and directory is not None and _lowering(directory) == "plugin":
            from attnx.trt import GPU_EXTRA_HINT, tensorrt_missing

            reason = tensorrt_missing()
            if reason:
                return f"{reason}; the attnx plugins are registered from Python ({GPU_EXTRA_HINT})"
        return None

    return check


def onnx_for_ort(path: Path, lowering: str, ops: Sequence[AttentionOp], provider: str) -> bytes | str:
    """What ONNX Runtime loads for ``provider``; a plugin-lowered model takes one of three paths:

    * CPU: the bare nodes run through attnx's custom-op kernels (:mod:`attnx.ortkernels`),
      computed from each node's inputs and attributes alone;
    * CUDA: the same graph with attnx's reference bodies attached (those kernels are CPU-only);
    * TensorRT: the nodes moved to the ``trt.plugins`` domain, computed by the attnx QDP plugins.
    """
    if lowering != "plugin":
        return str(path)
    model = onnx.load(str(path))
    if provider == "CPUExecutionProvider":
        from attnx.ortkernels import kernel_view

        return kernel_view(model, ops).SerializeToString()
    if provider == "TensorrtExecutionProvider":
        from attnx.trt.graph import check_plugin_nodes, for_ort_tensorrt
        from attnx.trt.qdp import register_plugins

        check_plugin_nodes(model, ops)
        register_plugins(ops)
        return for_ort_tensorrt(model).SerializeToString()
    return attach_functions(strip_plugin_attributes(model), ops).SerializeToString()


_ORT_NAMES = {
    "CPUExecutionProvider": "ort-cpu",
    "CUDAExecutionProvider": "ort-cuda",
    "TensorrtExecutionProvider": "ort-trt",
}


def _ort_runner(provider: str) -> Callable[[Path, str, Sequence[AttentionOp]], BaseRunner]:
    def make(path: Path, lowering: str, ops: Sequence[AttentionOp]) -> BaseRunner:
        import onnxruntime
        from polygraphy.backend.onnxrt import OnnxrtRunner

        model = onnx_for_ort(path, lowering, ops, provider)
        providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
        if provider == "TensorrtExecutionProvider":
            providers.insert(1, "CUDAExecutionProvider")
        if lowering == "plugin" and provider == "CPUExecutionProvider":
            from attnx.ortkernels import session_options

            options = session_options()
        else:
            options = onnxruntime.SessionOptions()

        def session() -> onnxruntime.InferenceSession:
            return onnxruntime.InferenceSession(model, options, providers=providers)

        if lowering == "plugin" and provider == "TensorrtExecutionProvider":
            return OnnxrtRunner(_plugin_session_for_tensorrt(session), name=_ORT_NAMES[provider])
        return OnnxrtRunner(session, name=_ORT_NAMES[provider])

    return make


def _plugin_session_for_tensorrt(session: Callable[[], object]) -> object:
    """Create the session now, so a refusal is one line with the reason, not a failure mid-comparison."""
    try:
        return session()
    except Exception as exc:
        from attnx.trt import first_line

        raise AttnxError(
            f"ONNX Runtime's TensorRT EP refused the attnx plugin nodes ({first_line(exc)}); it lists only "
            "IPluginCreator/IPluginCreatorV3One creators in trt.plugins, attnx's QDP plugins are "
            "IPluginCreatorV3Quick: verify the engine with --backends trt"
        ) from None


def _lowering(directory: Path) -> str | None:
    from attnx.exporter.manifest import Manifest

    try:
        return Manifest.read(directory).lowering
    except AttnxError:
        return None


def _trt_missing(directory: Path | None = None) -> str | None:
    from attnx.trt import GPU_EXTRA_HINT, cuda_missing, tensorrt_missing

    reason = tensorrt_missing()
    if reason:
        return f"{reason} ({GPU_EXTRA_HINT})"
    reason = cuda_missing()
    if reason:
        return reason
    if directory is not None:
        from attnx.trt.build import engine_problem

        return engine_problem(Path(directory))
    return None


def _trt_runner(path: Path, lowering: str, ops: Sequence[AttentionOp]) -> BaseRunner:
    """Polygraphy's TrtRunner on ``OUT/engine.plan`` (plugins registered before deserialization)."""
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    from attnx.exporter.manifest import Manifest
    from attnx.trt.build import ENGINE_FILE, check_shapes, prepare_plugins

    directory = Path(path).parent
    record = Manifest.read(directory).engine or {}
    prepare_plugins(Path(path), lowering, ops)

    class EngineRunner(TrtRunner):
        def infer_impl(self, feed_dict, *args, **kwargs):  # type: ignore[no-untyped-def]
            check_shapes(record, feed_dict)
            return super().infer_impl(feed_dict, *args, **kwargs)

    return EngineRunner(EngineFromBytes(BytesFromPath(str(directory / ENGINE_FILE))), name="trt")


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "ort-cpu",
            "ONNX Runtime, CPU execution provider (plugin lowering: attnx kernels)",
            lambda directory=None: None,
            _ort_runner("CPUExecutionProvider"),
        ),
        Backend(
            "ort-cuda",
            "ONNX Runtime, CUDA execution provider",
            _ort_missing("CUDAExecutionProvider", "install the gpu extra on a CUDA machine"),
            _ort_runner("CUDAExecutionProvider"),
        ),
        Backend(
            "ort-trt",
            "ONNX Runtime, TensorRT execution provider (plugin lowering: trt.plugins domain)",
            _ort_missing("TensorrtExecutionProvider", "install the gpu extra with TensorRT on a CUDA machine",
                         needs_tensorrt=True),
            _ort_runner("TensorrtExecutionProvider"),
        ),
        Backend("trt", "TensorRT engine (OUT/engine.plan) through Polygraphy", _trt_missing, _trt_runner),
    )
}
