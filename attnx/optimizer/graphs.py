"""The graph transformations of ``attnx optimize``, applied to one ONNX file at a time.

* ``slim``: onnxslim (constant folding, dead code, fusions); exact up to rounding.
* ``fuse``: onnxscript's fusions for ONNX Runtime (``onnxscript.rewriter.ort_fusions``): the model's
  RMSNorms, residual adds with their RMSNorm and rotary embeddings become single ONNX Runtime kernels
  (``SimplifiedLayerNormalization``, ``com.microsoft::SkipSimplifiedLayerNormalization``,
  ``com.microsoft::RotaryEmbedding``), after constant folding and with every function inlined (the graph
  is then a decomposed one that only ONNX Runtime runs); and the gated layers' q/k L2 norms the same
  RMSNorm kernel (:mod:`attnx.optimizer.l2norm`); exact up to rounding.
* ``fp16``: ONNX Runtime's float16 converter with the graph's inputs and outputs kept float32 (the
  export's interface does not change). It does not visit model-local functions; attnx's bodies are
  dtype-generic, so a function-lowered body computes in the dtype it is given. Ops whose schema fixes
  float32 inputs (a decode step's recurrent state) stay float32, with casts around them.
* ``int4`` / ``int8``: weight-only block quantisation of the weight MatMuls, per layer kind
  (:mod:`attnx.optimizer.quantize`: ONNX Runtime's ``MatMulNBits``); applied first, while the graph still
  carries the op functions that tell the layer kinds apart.
* ``dynamic-int8``: ONNX Runtime's dynamic quantisation: int8 weights of MatMul/Gemm, activations
  quantised per call.

Every transformed graph states the IR version it had (the opset policy's, :mod:`attnx.exporter.opsets`),
which the tools would otherwise restamp with their own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
import onnx.inliner
from onnx.external_data_helper import load_external_data_for_model

from attnx.domains import DOMAIN
from attnx.errors import AttnxError, first_line
from attnx.exporter.manifest import QuantizationSection
from attnx.exporter.trace import save_onnx
from attnx.optimizer.protos import name_nodes, quiet_root_logger, topologically_sorted
from attnx.optimizer.tensors import SharedData

if TYPE_CHECKING:
    from attnx.optimizer.quantize import QuantisedWeights

STEPS = ("int4", "int8", "slim", "fuse", "dynamic-int8", "fp16")  # in the order they are applied
WEIGHT_ONLY = ("int4", "int8")
PRECISION_STEPS = (*WEIGHT_ONLY, "dynamic-int8", "fp16")  # one at most: each sets the weights' type
TOOLS = {"slim": "onnxslim", "fuse": "onnxscript", **dict.fromkeys(PRECISION_STEPS, "onnxruntime")}
Made = dict[str, int]  # what a graph's transformation made, and how many: fusions, quantised MatMuls


def check_steps(steps: Sequence[str]) -> list[str]:
    """``steps`` in the order they are applied.

    Raises:
        AttnxError: none given, an unknown one, or two precisions (e.g. int4 with fp16).
    """
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise AttnxError(f"unknown optimisation {unknown[0]!r}; choose from {', '.join(STEPS)}")
    if not steps:
        flags = ", ".join(f"--{step}" for step in STEPS)
        raise AttnxError(f"nothing to do: choose at least one of {flags}")
    precisions = [f"--{s}" for s in PRECISION_STEPS if s in steps]
    if len(precisions) > 1:
        raise AttnxError(
            f"choose one of {' and '.join(precisions)}: each sets the weights' precision (quantisation keeps "
            "float32 activations); per layer kind, use --layers KIND=int4|int8|fp32"
        )
    if "slim" in steps:
        try:
            import onnxslim  # noqa: F401
        except ImportError:
            raise AttnxError("--slim needs onnxslim: pip install 'attnx[optimize]'") from None
    return [s for s in STEPS if s in steps]


def tool_versions(steps: Sequence[str]) -> dict[str, str | None]:
    """Versions of the packages that perform ``steps``."""
    return {TOOLS[s]: _version(TOOLS[s]) for s in steps}


def transform(
    source: Path,
    target: Path,
    steps: Sequence[str],
    float32_ops: Collection[str],
    shared: SharedData | None,
    quantization: QuantizationSection | None = None,
    op_kinds: Mapping[str, str] | None = None,
    quantised: QuantisedWeights | None = None,
) -> Made:
    """Write ``source`` with ``steps`` (checked, in order) applied to ``target``, its tensors in ``shared``
    (None: inside the graph; the export's other files, its weights included, are already beside
    ``target``); ``float32_ops``: attnx
    op types that keep float32 under ``fp16``; ``quantization`` and ``op_kinds`` (attnx op type ->
    "attention" or "recurrent"): what ``int4``/``int8`` do, taking and adding to ``quantised`` (the blocks
    made for the export's other graphs over the same weights). Weight-only quantisation alone reads only the
    weights it quantises; the other steps, whole-graph tools, read every tensor. Returns what the steps
    made: the quantised MatMuls by "kind precision", ``fuse``'s fusions."""
    model = onnx.load(str(source), load_external_data=False)
    ir_version = model.ir_version
    made: Made = {}
    if quantization is not None and any(step in WEIGHT_ONLY for step in steps):
        from attnx.optimizer.quantize import quantize_weights

        model, made = quantize_weights(model, quantization, op_kinds or {}, source, quantised)
    if not set(steps) <= set(WEIGHT_ONLY):  # after quantising, which knows a weight by where it is stored
        load_external_data_for_model(model, str(source.parent))
    if "slim" in steps:
        import onnxslim

        model = onnxslim.slim(for_onnxslim(model))
    if "fuse" in steps:
        model, fused = fuse_for_ort(model, source.name)
        made.update(fused)
    if "fp16" in steps:
        model = to_fp16(model, float32_ops)
    if "dynamic-int8" in steps:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        save_onnx(model, target)  # quantize_dynamic reads and writes files (external data included)
        with quiet_root_logger():  # its advice to pre-process the model is logged on every call
            # ONNX shape inference leaves the outputs of some attnx nodes untyped; the export is float32
            extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
            quantize_dynamic(target, target, weight_type=QuantType.QInt8, extra_options=extra)
        model = onnx.load(str(target))
    model.ir_version = ir_version
    if shared is not None:
        shared.offload(model)
    save_onnx(model, target)
    check_loads(target, steps)
    return made


def for_onnxslim(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its local functions inlined where its main graph also holds subgraphs (an ``If`` of
    a genai.onnx whose KV caches share a buffer): onnxslim's graph sorter (0.1.x) then recurses without end
    (``get_used_funcs`` walks the main graph's subgraphs for every function); otherwise as it is."""
    nested = any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for n in model.graph.node
        for a in n.attribute
    )
    return onnx.inliner.inline_local_functions(model) if nested and model.functions else model


def fuse_for_ort(model: onnx.ModelProto, name: str) -> tuple[onnx.ModelProto, Made]:
    """``model`` (the graph file ``name``) through onnxscript's ONNX Runtime fusions, and the fusions that
    matched.

    Raises:
        AttnxError: onnxscript failed on the graph (one line, naming it).
    """
    import onnx_ir
    from onnxscript.rewriter import ort_fusions

    from attnx.optimizer.l2norm import L2_NORM_RULES

    try:
        with quiet_root_logger():  # its shape inference logs a traceback for each body it cannot type
            fused, counts = ort_fusions.optimize_for_ort(onnx_ir.from_proto(model))
            counts = {**counts, "l2_normalization": L2_NORM_RULES.apply_to_model(fused)}
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
    # loading resolves every node's types and kernel; the graph optimisations (seconds at real size) run
    # when the accuracy check opens it
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
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

    name_nodes(model)
    kept = [node.name for node in model.graph.node if node.domain == DOMAIN and node.op_type in float32_ops]
    converted = convert_float_to_float16(model, keep_io_types=True, node_block_list=kept)
    return topologically_sorted(converted)  # the converter appends its input casts at the end


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
