"""Polygraphy runners for one graph of an export: torch (eager or compiled), ONNX Runtime, TensorRT.

Polygraphy's own ``PytRunner`` calls ``.cuda()`` unconditionally and mishandles dtypes, so the
torch side is a small :class:`BaseRunner` of our own. Every consumer (verify, decode parity,
generate, bench) runs graphs through these runners, made by the backend table
(:mod:`attnx.parity.backends`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.datatype import DataType

from attnx.errors import AttnxError, first_line
from attnx.exporter.budget import return_freed_memory
from attnx.exporter.directory import ExportDir
from attnx.exporter.lowering import attach_functions, strip_plugin_attributes
from attnx.models.spec import TensorSpec
from attnx.ortkernels import kernel_view, session_options
from attnx.trt.build import check_shapes, engine_problem
from attnx.trt.graph import check_plugin_nodes, for_ort_tensorrt
from attnx.trt.qdp import register_plugins


class BackendSkipped(Exception):
    """The backend cannot run this graph here (the message says why): a limitation, not a failure."""


@dataclasses.dataclass(frozen=True)
class Graph:
    """One graph of an export to run: the manifest file ``key`` ("model", "prefill", "decode"), its
    inputs and outputs, and ``module()``, the torch module that computes the same function
    (built on first use, for the torch backends and as the reference).

    ``many_runs``: the graph runs many times (``attnx bench``, ``attnx generate``, the accuracy gate's text),
    so ONNX Runtime's preparation of the weights at load (folded, packed for its MatMul kernels) pays off.
    Otherwise (parity) its CPU session skips that preparation (:data:`CHECK_SKIPS`), but for the packing of
    quantised weights (:attr:`packs_weights`)."""

    export: ExportDir
    key: str
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    module: Callable[[], Any]
    many_runs: bool = False

    @classmethod
    def of_model(cls, export: ExportDir, module: Any = None, many_runs: bool = False) -> Graph:
        """``model.onnx`` of ``export``; its torch module is ``module`` (None: rebuilt on first use)."""
        manifest = export.manifest
        return cls(
            export,
            "model",
            manifest.inputs,
            manifest.outputs,
            (lambda: module) if module is not None else (lambda: export.rebuild().module),
            many_runs,
        )

    @property
    def path(self) -> Path:
        return self.export.file(self.key)

    @property
    def lowering(self) -> str:
        return self.export.manifest.lowering

    @property
    def packs_weights(self) -> bool:
        """Whether even a check's session packs the weights at load: quantised ones (``attnx optimize
        --int4``, ``--int8``, ``--dynamic-int8``), whose kernels are slow without it, and packed take less
        memory than stored. Measured on the 0.8B shape's int4 decode graph: a step took 3.2 s unpacked
        against 75 ms packed, in 1.76 against 0.94 GB (docs/benchmarks.md)."""
        optimized = self.export.manifest.optimized
        return optimized is not None and optimized.quantized


class TorchRunner(BaseRunner):
    """Runs a torch module (inputs in ``specs`` order) on CPU or CUDA, optionally ``torch.compile``d.

    Outputs keep their dtype (a decode graph returns int64 positions); ``threads`` (None: torch's
    setting) is applied while the runner is active.
    """

    def __init__(
        self,
        module: Any,
        specs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        device: str = "cpu",
        name: str = "torch",
        threads: int | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__(name=name)
        self.module, self.specs, self.outputs, self.device = module, list(specs), list(outputs), device
        self.threads, self.compile, self._call = threads, compile, module

    def activate_impl(self) -> None:
        import torch

        self._previous_threads = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        self.module.to(self.device).eval()
        if self.compile:
            # Every model attnx builds runs the same forward code; Dynamo keeps one compiled version of
            # that code per model and shape, and past its recompile limit (8) it silently runs it eager.
            torch.compiler.reset()
        self._call = torch.compile(self.module, dynamic=False) if self.compile else self.module

    @property
    def providers(self) -> list[str]:
        """What executes: "torch-cpu", "torch-inductor-cpu", "torch-cuda", ..."""
        return [f"torch-{'inductor-' if self.compile else ''}{self.device}"]

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for spec in self.specs:
            meta.add(spec.name, np.dtype(spec.dtype), [None if isinstance(a, str) else a for a in spec.axes])
        return meta

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        import torch

        args = [torch.from_numpy(np.ascontiguousarray(feed_dict[s.name])).to(self.device) for s in self.specs]
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                results = self._call(*args)
        except Exception as exc:
            if not self.compile:
                raise
            raise BackendSkipped(f"torch.compile failed: {type(exc).__name__}: {first_line(exc)}") from exc
        self.inference_time = time.perf_counter() - start
        results = results if isinstance(results, tuple) else (results,)
        pairs = zip(self.outputs, results, strict=False)
        return OrderedDict((s.name, r.detach().cpu().numpy()) for s, r in pairs)

    def deactivate_impl(self) -> None:
        import torch

        self.module.to("cpu")
        self._call = self.module
        torch.set_num_threads(self._previous_threads)


def torch_runner(name: str, compile: bool = False) -> Callable[[Graph, int | None], BaseRunner]:
    def make(graph: Graph, threads: int | None) -> BaseRunner:
        return TorchRunner(
            graph.module(), graph.inputs, graph.outputs, name=name, threads=threads, compile=compile
        )

    return make


CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"

CHECK_SKIPS = ["ConstantFolding"]
"""ONNX Runtime's graph transformers a check's CPU session (:attr:`Graph.many_runs`) leaves out. Folding the
graphs' ``Transpose`` of each stored weight made a transposed copy of it at load (ONNX Runtime then fuses
each Transpose into its MatMul instead, reading the weight as stored), and packing the weights for the
MatMul kernels (``session.disable_prepacking``) another: so the weights stay memory-mapped from the
export's file, a session of the 0.8B shape loads in seconds at 0.1 GB and holds one copy of the weights once
run, where it held 4.7 GB at load (docs/benchmarks.md). Neither changes what the graph computes."""


def ort_session_options(
    threads: int | None, plugin_kernels: bool = False, spin: bool = True, prepack: bool = True
) -> Any:
    """All graph optimisations, ``threads`` intra-op threads (None: ORT's default), sequential
    execution; with ``plugin_kernels`` also attnx's CPU kernels for a plugin-lowered model's nodes.
    ``prepack`` False: constant weights are not packed for the kernels at load (``Graph.many_runs``).

    ``spin`` False: the intra-op threads sleep between ops instead of spinning (ORT's
    ``session.intra_op.allow_spinning``), for graphs of many small ops such as a decode step: on a 2-core
    machine shared with other work, spinning made a one-token step 2.4x slower (docs/benchmarks.md).
    """
    import onnxruntime

    options = session_options() if plugin_kernels else onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return options


def onnx_for_ort(graph: Graph, provider: str) -> bytes | str:
    """What ONNX Runtime loads for ``provider``; a plugin-lowered graph takes one of three paths:

    * CPU: the bare nodes run through attnx's custom-op kernels (:mod:`attnx.ortkernels`),
      computed from each node's inputs and attributes alone;
    * CUDA: the same graph with attnx's reference bodies attached (those kernels are CPU-only);
    * TensorRT: the nodes moved to the ``trt.plugins`` domain, computed by the attnx QDP plugins.
    """
    if graph.lowering != "plugin":
        return str(graph.path)
    model = onnx.load(str(graph.path))
    ops = graph.export.ops()
    if provider == CPU:
        return kernel_view(model, ops).SerializeToString()
    if provider == TENSORRT:
        check_plugin_nodes(model, ops)
        register_plugins(ops)
        return for_ort_tensorrt(model).SerializeToString()
    return attach_functions(strip_plugin_attributes(model), ops).SerializeToString()


ORT_NAMES = {CPU: "ort-cpu", CUDA: "ort-cuda", TENSORRT: "ort-trt"}
ORT_DEVICES = {CPU: "cpu", CUDA: "cuda", TENSORRT: "cuda"}  # where each provider's tensors live


class OrtRunner(BaseRunner):
    """An ONNX Runtime session as a Polygraphy runner; ``device`` ("cpu", "cuda") is where its execution
    provider keeps tensors.

    Polygraphy's ``OnnxrtRunner`` imports torch on every inference (to accept torch tensors); this
    one takes NumPy arrays only, so a process that times ONNX Runtime never loads torch.
    """

    def __init__(self, session: Callable[[], Any], name: str, device: str = "cpu") -> None:
        super().__init__(name=name)
        self._make, self.device = session, device

    def activate_impl(self) -> None:
        self.sess = self._make()
        self._outputs = [o.name for o in self.sess.get_outputs()]

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for node in self.sess.get_inputs():
            meta.add(node.name, dtype=DataType.from_dtype(node.type, "onnxruntime"), shape=node.shape)
        return meta

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        start = time.perf_counter()
        outputs = self.sess.run(self._outputs, feed_dict)
        self.inference_time = time.perf_counter() - start
        return OrderedDict(zip(self._outputs, outputs, strict=True))

    def infer_bound(self, feed: Mapping[str, Any], keep: Collection[str]) -> dict[str, Any]:
        """One run through ONNX Runtime's IO binding (an active runner): each input a NumPy array or an
        ``OrtValue``, bound where it lies; the outputs named in ``keep`` stay ``OrtValue``s on
        :attr:`device` (a decode step's state, bound as the next step's inputs: on a GPU it never visits
        the host), the others come back as NumPy arrays."""
        import onnxruntime

        # a binding per run: run again, a binding writes its outputs into the last run's (the state we hold)
        binding = self.sess.io_binding()
        for name, value in feed.items():
            if isinstance(value, onnxruntime.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in self._outputs:
            binding.bind_output(name, self.device if name in keep else "cpu")
        start = time.perf_counter()
        self.sess.run_with_iobinding(binding)
        self.inference_time = time.perf_counter() - start
        outputs = zip(self._outputs, binding.get_outputs(), strict=True)
        return {name: value if name in keep else value.numpy() for name, value in outputs}

    def deactivate_impl(self) -> None:
        del self.sess
        return_freed_memory()  # the next session (a real-size model's next graph) starts from here

    @property
    def providers(self) -> list[str]:
        return list(self.sess.get_providers())


def ort_runner(provider: str) -> Callable[[Graph, int | None], BaseRunner]:
    def make(graph: Graph, threads: int | None) -> BaseRunner:
        import onnxruntime

        source = onnx_for_ort(graph, provider)
        providers = {CPU: [CPU], CUDA: [CUDA, CPU], TENSORRT: [TENSORRT, CUDA, CPU]}[provider]
        check = provider == CPU and not graph.many_runs  # the lean session of a parity check
        options = ort_session_options(
            threads,
            plugin_kernels=graph.lowering == "plugin" and provider == CPU,
            spin=graph.key != "decode",
            prepack=not check or graph.packs_weights,
        )
        skipped = CHECK_SKIPS if check else None

        def session() -> onnxruntime.InferenceSession:
            made = onnxruntime.InferenceSession(
                source, options, providers=providers, disabled_optimizers=skipped
            )
            if made.get_providers()[0] != provider:
                raise BackendSkipped(f"onnxruntime did not enable {provider} (got {made.get_providers()})")
            return made

        if graph.lowering == "plugin" and provider == TENSORRT:
            made = _plugin_session_for_tensorrt(session)
            return OrtRunner(lambda: made, ORT_NAMES[provider], ORT_DEVICES[provider])
        return OrtRunner(session, ORT_NAMES[provider], ORT_DEVICES[provider])

    return make


def _plugin_session_for_tensorrt(session: Callable[[], Any]) -> Any:
    """Create the session now, so a refusal is one line with the reason, not a failure mid-comparison."""
    try:
        return session()
    except Exception as exc:
        raise AttnxError(
            f"ONNX Runtime's TensorRT EP refused the attnx plugin nodes ({first_line(exc)}); it lists only "
            "IPluginCreator/IPluginCreatorV3One creators in trt.plugins, attnx's QDP plugins are "
            "IPluginCreatorV3Quick: verify the engine with --backends trt"
        ) from None


def trt_runner(graph: Graph, threads: int | None) -> BaseRunner:
    """Polygraphy's TrtRunner on the export's engine. An engine with JIT plugins (``needs_python``) gets
    the attnx plugins registered before deserialization; an AOT or plugin-free engine loads as it is,
    as it would in C++ or trtexec."""
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    export = graph.export
    engine = export.manifest.engine
    problem = engine_problem(export)
    if problem or engine is None:
        raise BackendSkipped(problem)
    if engine.needs_python:
        register_plugins(export.ops())

    class EngineRunner(TrtRunner):
        def infer_impl(self, feed_dict, *args, **kwargs):  # type: ignore[no-untyped-def]
            try:
                check_shapes(engine, feed_dict)
            except AttnxError as exc:
                raise BackendSkipped(str(exc)) from None
            return super().infer_impl(feed_dict, *args, **kwargs)

    return EngineRunner(EngineFromBytes(BytesFromPath(str(export.file("engine")))), name="trt")
