"""The one backend table: every runtime attnx can run an export's graphs on.

``attnx verify`` compares each against the torch model, ``attnx bench`` times each, decode
parity and ``attnx generate`` step each through the prefill/decode graphs. A backend says why it
cannot run an export here (``unavailable``: None when it can) and makes a Polygraphy runner for
one graph of an export (``runner``). Heavy libraries are imported by the runners, so an
ORT-only process never imports torch.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Sequence

from polygraphy.backend.base import BaseRunner

from attnx.errors import AttnxError, unknown_choice
from attnx.exporter.budget import ORT_MEMORY_FACTOR, ORT_WEIGHT_COPIES
from attnx.exporter.directory import ExportDir
from attnx.parity.runners import CPU, CUDA, TENSORRT, Graph, ort_runner, torch_runner, trt_runner
from attnx.trt import GPU_EXTRA_HINT, cuda_missing, tensorrt_missing
from attnx.trt.build import engine_problem

REFERENCE = "torch"  # the backend every other one is compared with


@dataclasses.dataclass(frozen=True)
class Backend:
    """A runtime for an export's graphs.

    ``unavailable(export)`` is why it cannot run that export here (None when it can; ``export``
    None asks about the machine only). ``runner(graph, threads)`` makes the Polygraphy runner.
    ``memory_factor`` (times the cost model's activation bound) and ``weight_copies`` (copies of
    the weights file held at a load's peak) size ``attnx bench``'s memory guard; ``loads_weights``:
    it loads weights.safetensors (torch) rather than the ONNX file. ``graphs``: the graphs of an
    export it runs (a TensorRT engine is built from model.onnx only).
    """

    name: str
    description: str
    unavailable: Callable[[ExportDir | None], str | None]
    runner: Callable[[Graph, int | None], BaseRunner]
    memory_factor: float = 1.0
    weight_copies: int = 2
    loads_weights: bool = False
    graphs: tuple[str, ...] = ("model", "prefill", "decode")


def _always(export: ExportDir | None = None) -> str | None:
    return None


def _compiler_missing(export: ExportDir | None = None) -> str | None:
    if next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None) is None:
        return "no C++ compiler on PATH (TorchInductor's CPU backend needs g++ or clang++)"
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile (TorchDynamo) does not support this Python version or platform"
    return None


def _ort_missing(provider: str, hint: str) -> Callable[[ExportDir | None], str | None]:
    def check(export: ExportDir | None = None) -> str | None:
        import onnxruntime

        if provider not in onnxruntime.get_available_providers():
            return f"onnxruntime has no {provider} ({hint})"
        if provider == TENSORRT and export is not None and export.manifest.lowering == "plugin":
            reason = tensorrt_missing()
            if reason:
                return f"{reason}; the attnx plugins are registered from Python ({GPU_EXTRA_HINT})"
        return None

    return check


def _trt_missing(export: ExportDir | None = None) -> str | None:
    reason = tensorrt_missing()
    if reason:
        return f"{reason} ({GPU_EXTRA_HINT})"
    return cuda_missing() or (engine_problem(export) if export is not None else None)


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            REFERENCE,
            "PyTorch eager on CPU, the model rebuilt with the exported weights (the reference)",
            _always,
            torch_runner("torch"),
            loads_weights=True,
        ),
        Backend(
            "torch-compile",
            "torch.compile (TorchInductor) on CPU, shapes specialised",
            _compiler_missing,
            torch_runner("torch-compile", compile=True),
            loads_weights=True,
        ),
        Backend(
            "ort-cpu",
            "ONNX Runtime, CPU execution provider (plugin lowering: attnx kernels)",
            _always,
            ort_runner(CPU),
            ORT_MEMORY_FACTOR,
            ORT_WEIGHT_COPIES,
        ),
        Backend(
            "ort-cuda",
            "ONNX Runtime, CUDA execution provider (host inputs and outputs; decode state stays on the GPU)",
            _ort_missing(CUDA, "install the gpu extra on a CUDA machine"),
            ort_runner(CUDA),
            ORT_MEMORY_FACTOR,
            ORT_WEIGHT_COPIES,
        ),
        Backend(
            "ort-trt",
            "ONNX Runtime, TensorRT execution provider (plugin lowering: trt.plugins domain)",
            _ort_missing(TENSORRT, "install the gpu extra with TensorRT on a CUDA machine"),
            ort_runner(TENSORRT),
            ORT_MEMORY_FACTOR,
            ORT_WEIGHT_COPIES,
        ),
        Backend(
            "trt",
            "TensorRT engine (OUT/engine.plan, from `attnx build`) through Polygraphy",
            _trt_missing,
            trt_runner,
            ORT_MEMORY_FACTOR,
            ORT_WEIGHT_COPIES,
            graphs=("model",),
        ),
    )
}


def backends(names: Sequence[str] | None) -> list[Backend]:
    """The backends called ``names`` (None: all), in the table's order of the given names.

    Raises:
        AttnxError: an unknown name (naming the closest), or no name at all.
    """
    if names is None:
        return list(BACKENDS.values())
    if not names:
        raise AttnxError(f"no backend given; choose from {', '.join(BACKENDS)}")
    for name in names:
        if name not in BACKENDS:
            raise unknown_choice("backend", name, BACKENDS)
    return [BACKENDS[name] for name in dict.fromkeys(names)]
