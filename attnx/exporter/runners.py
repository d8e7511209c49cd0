"""Polygraphy runners: a CPU/GPU-aware torch runner and the ONNX backends attnx compares.

Polygraphy's own ``PytRunner`` calls ``.cuda()`` unconditionally and mishandles
dtypes, so the torch side is a small :class:`BaseRunner` of our own.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

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
        return OrderedDict((s.name, r.detach().float().cpu().numpy()) for s, r in zip(self.outputs, results))

    def deactivate_impl(self) -> None:
        self.module.to("cpu")


@dataclasses.dataclass(frozen=True)
class Backend:
    """An ONNX backend to compare against torch.

    ``unavailable()`` returns the reason it cannot run here (None when it can);
    ``runner(model_path, lowering, ops)`` returns the Polygraphy runner.
    """

    name: str
    description: str
    unavailable: Callable[[], str | None]
    runner: Callable[[Path, str, Sequence[AttentionOp]], BaseRunner]


def _ort_providers() -> list[str]:
    import onnxruntime

    return onnxruntime.get_available_providers()


def _ort_missing(provider: str, hint: str) -> Callable[[], str | None]:
    def check() -> str | None:
        if provider not in _ort_providers():
            return f"onnxruntime has no {provider} ({hint})"
        return None

    return check


def onnx_for_ort(path: Path, lowering: str, ops: Sequence[AttentionOp]) -> bytes | str:
    """What ORT loads: the file itself, or for a plugin-lowered model the same graph with
    attnx's reference bodies attached, so the bare nodes run from their inputs and attributes."""
    if lowering != "plugin":
        return str(path)
    model = strip_plugin_attributes(onnx.load(str(path)))
    return attach_functions(model, ops).SerializeToString()


def _ort_runner(provider: str) -> Callable[[Path, str, Sequence[AttentionOp]], BaseRunner]:
    def make(path: Path, lowering: str, ops: Sequence[AttentionOp]) -> BaseRunner:
        from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

        name = {"CPUExecutionProvider": "ort-cpu", "CUDAExecutionProvider": "ort-cuda"}.get(provider, "ort-trt")
        return OnnxrtRunner(SessionFromOnnx(onnx_for_ort(path, lowering, ops), providers=[provider]), name=name)

    return make


def _tensorrt_missing() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "tensorrt is not installed (pip install 'attnx[gpu]' on a machine with an NVIDIA GPU)"
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:  # the bindings wheel imports, but libnvinfer may be missing
        return f"tensorrt not importable: {exc}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return "the trt backend needs an engine from `attnx build` (not built by this attnx version)"


def _no_trt_runner(path: Path, lowering: str, ops: Sequence[AttentionOp]) -> BaseRunner:
    raise RuntimeError("trt backend is unavailable")


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("ort-cpu", "ONNX Runtime, CPU execution provider", lambda: None, _ort_runner("CPUExecutionProvider")),
        Backend(
            "ort-cuda",
            "ONNX Runtime, CUDA execution provider",
            _ort_missing("CUDAExecutionProvider", "install the gpu extra on a CUDA machine"),
            _ort_runner("CUDAExecutionProvider"),
        ),
        Backend(
            "ort-trt",
            "ONNX Runtime, TensorRT execution provider",
            _ort_missing("TensorrtExecutionProvider", "install the gpu extra with TensorRT on a CUDA machine"),
            _ort_runner("TensorrtExecutionProvider"),
        ),
        Backend("trt", "TensorRT engine through Polygraphy", _tensorrt_missing, _no_trt_runner),
    )
}
