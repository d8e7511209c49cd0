"""The graph transformations of ``attnx optimize``, applied to one ONNX file at a time.

* ``slim``: onnxslim (constant folding, dead code, fusions); exact up to rounding.
* ``fuse``: onnxscript's fusions for ONNX Runtime (``onnxscript.rewriter.ort_fusions``): the model's
  RMSNorms, residual adds with their RMSNorm and rotary embeddings become single ONNX Runtime kernels
  (``SimplifiedLayerNormalization``, ``com.microsoft::SkipSimplifiedLayerNormalization``,
  ``com.microsoft::RotaryEmbedding``), after constant folding and with every function inlined (the graph
  is then a decomposed one that only ONNX Runtime runs); exact up to rounding.
* ``fp16``: ONNX Runtime's float16 converter with the graph's inputs and outputs kept float32 (the
  export's interface does not change). It does not visit model-local functions; attnx's bodies are
  dtype-generic, so a function-lowered body computes in the dtype it is given. Ops whose schema fixes
  float32 inputs (a decode step's recurrent state) stay float32, with casts around them.
* ``int8``: ONNX Runtime's dynamic quantisation: int8 weights of MatMul/Gemm, activations quantised
  per call.

Every transformed graph states the IR version it had (the opset policy's, :mod:`attnx.exporter.opsets`),
which the tools would otherwise restamp with their own.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
from collections.abc import Collection, Iterator, Sequence
from importlib import metadata
from pathlib import Path

import onnx

from attnx.domains import DOMAIN
from attnx.errors import AttnxError, first_line
from attnx.exporter.trace import save_onnx

STEPS = ("slim", "fuse", "int8", "fp16")  # in the order they are applied
TOOLS = {"slim": "onnxslim", "fuse": "onnxscript", "int8": "onnxruntime", "fp16": "onnxruntime"}
Fused = dict[str, int]  # fusion name -> how many it made (``fuse``)


def check_steps(steps: Sequence[str]) -> list[str]:
    """``steps`` in the order they are applied.

    Raises:
        AttnxError: none given, an unknown one, or int8 with fp16.
    """
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise AttnxError(f"unknown optimisation {unknown[0]!r}; choose from {', '.join(STEPS)}")
    if not steps:
        raise AttnxError("nothing to do: choose at least one of --int8, --fp16, --slim, --fuse")
    if "int8" in steps and "fp16" in steps:
        raise AttnxError("choose --int8 or --fp16, not both (int8 quantisation keeps float32 activations)")
    if "slim" in steps:
        try:
            import onnxslim  # noqa: F401
        except ImportError:
            raise AttnxError("--slim needs onnxslim: pip install 'attnx[optimize]'") from None
    return [s for s in STEPS if s in steps]


def tool_versions(steps: Sequence[str]) -> dict[str, str | None]:
    """Versions of the packages that perform ``steps``."""
    return {TOOLS[s]: _version(TOOLS[s]) for s in steps}


def transform(source: Path, target: Path, steps: Sequence[str], float32_ops: Collection[str]) -> Fused:
    """Write ``source`` with ``steps`` (checked, in order) applied to ``target``; ``float32_ops``: attnx
    op types that keep float32 under ``fp16``. Returns what ``fuse`` fused (empty without it)."""
    model = onnx.load(str(source))
    ir_version = model.ir_version
    fused: Fused = {}
    if "slim" in steps:
        import onnxslim

        model = onnxslim.slim(model)
    if "fuse" in steps:
        model, fused = fuse_for_ort(model, source.name)
    if "fp16" in steps:
        model = to_fp16(model, float32_ops)
    if "int8" in steps:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        save_onnx(model, target)  # quantize_dynamic reads and writes files (external data included)
        with _quiet_root_logger():  # its advice to pre-process the model is logged on every call
            # ONNX shape inference leaves the outputs of some attnx nodes untyped; the export is float32
            extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
            quantize_dynamic(target, target, weight_type=QuantType.QInt8, extra_options=extra)
        model = onnx.load(str(target))
    model.ir_version = ir_version
    save_onnx(model, target)
    check_loads(target, steps)
    return fused


def fuse_for_ort(model: onnx.ModelProto, name: str) -> tuple[onnx.ModelProto, Fused]:
    """``model`` (the graph file ``name``) through onnxscript's ONNX Runtime fusions, and the fusions that
    matched.

    Raises:
        AttnxError: onnxscript failed on the graph (one line, naming it).
    """
    import onnx_ir
    from onnxscript.rewriter import ort_fusions

    try:
        with _quiet_root_logger():  # its shape inference logs a traceback for each body it cannot type
            fused, counts = ort_fusions.optimize_for_ort(onnx_ir.from_proto(model))
    except Exception as exc:  # the tool's own errors, of any type
        raise AttnxError(
            f"{name}: onnxscript's fusions failed ({first_line(exc)}); optimize without --fuse"
        ) from None
    return onnx_ir.to_proto(fused), {fusion: count for fusion, count in counts.items() if count}


def check_loads(path: Path, steps: Sequence[str]) -> None:
    """Refuse, in one line, a transformed graph that ONNX Runtime (CPU) does not load: a tool's defect,
    named with the options that ran it, rather than a traceback from the accuracy check.

    Raises:
        AttnxError: the graph does not load.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    try:
        onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        tools = ", ".join(sorted({TOOLS[step] for step in steps}))
        flags = " ".join(f"--{step}" for step in steps)
        raise AttnxError(
            f"{path.name} after {flags} ({tools}) does not load in ONNX Runtime ({first_line(exc)}); "
            "optimize without the step that broke it"
        ) from None


def to_fp16(model: onnx.ModelProto, float32_ops: Collection[str]) -> onnx.ModelProto:
    """``model`` in float16 inside, float32 at its inputs and outputs (ONNX Runtime's converter)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    for index, node in enumerate(model.graph.node):  # the converter tells nodes apart by name
        node.name = node.name or f"attnx_node_{index}"
    kept = [node.name for node in model.graph.node if node.domain == DOMAIN and node.op_type in float32_ops]
    converted = convert_float_to_float16(model, keep_io_types=True, node_block_list=kept)
    return _topologically_sorted(converted)  # the converter appends its input casts at the end


def _topologically_sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its graph's nodes in an order where every value is made before it is read (ONNX
    Runtime accepts any order, the checker does not), otherwise in their order; a node's subgraphs
    count as reading what they read."""
    nodes = list(model.graph.node)
    producer = {name: index for index, node in enumerate(nodes) for name in node.output if name}
    users: list[list[int]] = [[] for _ in nodes]
    waiting = []
    for index, node in enumerate(nodes):
        needs = {producer[name] for name in _reads(node) if name in producer}
        for need in needs:
            users[need].append(index)
        waiting.append(len(needs))
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(nodes[index])
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        raise RuntimeError(f"the graph {model.graph.name} has a cycle")
    del model.graph.node[:]
    model.graph.node.extend(order)
    return model


def _reads(node: onnx.NodeProto) -> list[str]:
    """The values ``node`` reads from its graph: its inputs and what its subgraphs read from outside."""
    names = list(node.input)
    for attribute in node.attribute:
        for subgraph in [attribute.g, *attribute.graphs] if attribute.type in (5, 10) else []:
            inner = {v.name for v in subgraph.input} | {t.name for t in subgraph.initializer}
            inner |= {out for n in subgraph.node for out in n.output}
            names += [name for n in subgraph.node for name in _reads(n) if name not in inner]
    return names


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
