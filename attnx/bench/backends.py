"""What ``attnx bench`` times: an exported model (OUT) and the backends that run it.

Every backend loads the model from OUT itself (torch rebuilds it from the manifest and
the saved weights, as ``attnx verify`` does), so the load's memory counts for each
backend alike. A session splits each run into ``prepare`` (untimed: copy a feed into
the backend's input type) and ``run`` (timed: one forward, outputs materialised).
Heavy libraries are imported inside the loaders, so an ORT-only measurement process
never imports torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from attnx.errors import AttnxError
from attnx.exporter.manifest import MODEL_FILE, WEIGHTS_FILE, Manifest, sha256_file

Feed = dict[str, np.ndarray]


class BackendSkipped(Exception):
    """The backend cannot run this case here; the message is the reason."""


@dataclasses.dataclass(frozen=True)
class ExportedModel:
    """An ``attnx export`` OUT directory, checked once when opened."""

    directory: Path
    manifest: Manifest

    @classmethod
    def open(cls, out: str | Path) -> ExportedModel:
        """Read and check OUT (manifest, model, weights hash).

        Raises:
            AttnxError: OUT is not a complete attnx export.
        """
        directory = Path(out)
        manifest = Manifest.read(directory)
        for name in (MODEL_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise AttnxError(f"'{directory}' lacks {name}; re-export it with `attnx export`")
        weights = directory / WEIGHTS_FILE
        if sha256_file(weights) != manifest.weights_sha256:
            raise AttnxError(f"{weights} does not match the manifest's weights hash; re-export it")
        return cls(directory, manifest)

    @property
    def label(self) -> str:
        return self.directory.name or str(self.directory)

    @property
    def model_path(self) -> Path:
        return self.directory / MODEL_FILE

    def onnx_bytes(self) -> int:
        """Size of the ONNX graph with its external data, if any."""
        return sum(p.stat().st_size for p in self.directory.glob(f"{MODEL_FILE}*") if p.is_file())

    def weights_bytes(self) -> int:
        return (self.directory / WEIGHTS_FILE).stat().st_size

    def attention_ops(self) -> list[Any]:
        from attnx.registry import get_registry

        return list(get_registry().variant(self.manifest.variant).load().ops)


class Session(Protocol):
    providers: list[str]  # what actually executes (ORT providers, "torch-cpu", ...)

    def prepare(self, feed: Feed) -> Any: ...

    def run(self, prepared: Any) -> None: ...

    def close(self) -> None: ...


Loader = Callable[[ExportedModel, int, Feed], Session]


@dataclasses.dataclass(frozen=True)
class BenchBackend:
    """``unavailable(directory)`` is the reason the backend cannot run that export here
    (None when it can; ``directory`` None asks about the machine only);
    ``load(model, threads, sample_feed)`` returns a warm-able session (``sample_feed``
    lets shape-specialising backends compile before the timed runs)."""

    name: str
    description: str
    unavailable: Callable[[Path | None], str | None]
    load: Loader
    uses_weights_file: bool = False  # loads weights.safetensors (else the ONNX file)
    memory_factor: float = 1.0  # times the cost model's activation bound (see attnx.bench.api)
    weight_copies: int = 2  # copies of the weights file held at the peak of a load


class TorchSession:
    def __init__(self, module: Any, names: list[str], threads: int, label: str) -> None:
        import torch

        self.module, self.names, self.providers = module, names, [label]
        self._threads = torch.get_num_threads()
        torch.set_num_threads(threads)

    def prepare(self, feed: Feed) -> list[Any]:
        import torch

        return [torch.from_numpy(np.ascontiguousarray(feed[name])) for name in self.names]

    def run(self, prepared: list[Any]) -> None:
        import torch

        with torch.inference_mode():
            self.module(*prepared)

    def close(self) -> None:
        import torch

        torch.set_num_threads(self._threads)
        self.module = None


def rebuild_torch(model: ExportedModel) -> Any:
    """The torch module with the exported weights (the same rebuild as ``attnx verify``)."""
    from attnx.exporter.assemble import rebuild

    return rebuild(model.manifest, model.directory / WEIGHTS_FILE).module.eval()


def _input_names(model: ExportedModel) -> list[str]:
    return [s.name for s in model.manifest.input_specs()]


def _always_available(directory: Path | None = None) -> str | None:
    return None


def _load_torch(model: ExportedModel, threads: int, sample: Feed) -> Session:
    return TorchSession(rebuild_torch(model), _input_names(model), threads, "torch-cpu")


def _load_torch_compile(model: ExportedModel, threads: int, sample: Feed) -> Session:
    """Inductor, shapes specialised (dynamic=False): the sample feed compiles in the load."""
    import torch

    compiled = torch.compile(rebuild_torch(model), backend="inductor", dynamic=False)
    session = TorchSession(compiled, _input_names(model), threads, "torch-inductor-cpu")
    try:
        session.run(session.prepare(sample))
    except Exception as exc:
        session.close()
        raise BackendSkipped(f"torch.compile failed: {one_line(exc)}") from exc
    return session


def _compile_missing(directory: Path | None = None) -> str | None:
    compiler = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if compiler is None:
        return "no C++ compiler on PATH (TorchInductor's CPU backend needs g++ or clang++)"
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile (TorchDynamo) does not support this Python version or platform"
    return None


_CPU, _CUDA, _TRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
# ONNX Runtime held up to 2.9x torch eager's activation memory in docs/benchmarks.md (inlined
# function bodies materialise more intermediates; the CPU arena grows in powers of two), and
# three copies of the weights while loading (the proto, the initializers, MLAS's prepacked GEMM
# weights).
ORT_MEMORY_FACTOR = 2.0
ORT_MEMORY = {"memory_factor": ORT_MEMORY_FACTOR, "weight_copies": 3}


class OrtSession:
    def __init__(self, session: Any) -> None:
        self.session, self.providers = session, list(session.get_providers())

    def prepare(self, feed: Feed) -> Feed:
        return feed

    def run(self, prepared: Feed) -> None:
        self.session.run(None, prepared)

    def close(self) -> None:
        self.session = None


def ort_session_options(threads: int, plugin_kernels: bool = False) -> Any:
    """All graph optimisations, ``threads`` intra-op threads, sequential execution; with
    ``plugin_kernels`` also attnx's CPU kernels for the bare nodes of a plugin-lowered model."""
    import onnxruntime

    if plugin_kernels:
        from attnx.ortkernels import session_options

        options = session_options()
    else:
        options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return options


def _ort_loader(providers: list[str]) -> Loader:
    def load(model: ExportedModel, threads: int, sample: Feed) -> Session:
        import onnxruntime

        source: str | bytes = str(model.model_path)
        plugin = model.manifest.lowering == "plugin"
        if plugin:
            from attnx.parity.runners import onnx_for_ort

            source = onnx_for_ort(model.model_path, "plugin", model.attention_ops(), providers[0])
        options = ort_session_options(threads, plugin_kernels=plugin and providers[0] == _CPU)
        session = onnxruntime.InferenceSession(source, options, providers=providers)
        if session.get_providers()[0] != providers[0]:
            raise BackendSkipped(f"onnxruntime did not enable {providers[0]} (got {session.get_providers()})")
        return OrtSession(session)

    return load


class PolygraphySession:
    def __init__(self, runner: Any) -> None:
        self.runner, self.providers = runner, [runner.name]
        runner.activate()

    def prepare(self, feed: Feed) -> Feed:
        return feed

    def run(self, prepared: Feed) -> None:
        self.runner.infer(prepared)

    def close(self) -> None:
        self.runner.deactivate()


def _polygraphy_loader(name: str) -> Loader:
    """The Polygraphy runner ``attnx verify`` uses for ``name`` (e.g. the TensorRT engine)."""

    def load(model: ExportedModel, threads: int, sample: Feed) -> Session:
        from attnx.parity.runners import BACKENDS

        runner = BACKENDS[name].runner(model.model_path, model.manifest.lowering, model.attention_ops())
        return PolygraphySession(runner)

    return load


def _verify_reason(name: str) -> Callable[[Path | None], str | None]:
    """The availability check ``attnx verify`` uses for the same backend."""

    def check(directory: Path | None = None) -> str | None:
        return importlib.import_module("attnx.parity.runners").BACKENDS[name].unavailable(directory)

    return check


BENCH_BACKENDS: dict[str, BenchBackend] = {
    b.name: b
    for b in (
        BenchBackend("torch", "PyTorch eager on CPU, the exported weights", _always_available, _load_torch,
                     True),
        BenchBackend("torch-compile", "torch.compile (TorchInductor) on CPU, shapes specialised",
                     _compile_missing, _load_torch_compile, True),
        BenchBackend("ort-cpu", "ONNX Runtime, CPU execution provider", _verify_reason("ort-cpu"),
                     _ort_loader([_CPU]), **ORT_MEMORY),
        BenchBackend("ort-cuda", "ONNX Runtime, CUDA execution provider (host inputs and outputs)",
                     _verify_reason("ort-cuda"), _ort_loader([_CUDA, _CPU]), **ORT_MEMORY),
        BenchBackend("ort-trt", "ONNX Runtime, TensorRT execution provider (CUDA fallback)",
                     _verify_reason("ort-trt"), _ort_loader([_TRT, _CUDA, _CPU]),
                     **ORT_MEMORY),
        BenchBackend("trt", "TensorRT engine through Polygraphy", _verify_reason("trt"),
                     _polygraphy_loader("trt"), **ORT_MEMORY),
    )
}


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (long compiler errors cut to 300 characters)."""
    text = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return message if len(message) <= 300 else message[:297] + "..."
