"""The ONNX ecosystem's tools, as users call them on an exported graph, one row each.

A tool takes the graph (``onnx.ModelProto``) and its file and returns the graph it makes, which the
matrix loads in ONNX Runtime and compares with the float32 export. ``bound`` is the largest output
error allowed relative to the largest output magnitude (``attnx optimize``'s bounds: exact tools
1e-4, fp16 1e-2, dynamic int8 1e-1). ``expensive`` tools run on one graph in the default run and on
every graph under ``-m slow``.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx

from attnx.exporter.directory import ExportDir
from attnx.exporter.opsets import model_opset
from attnx.exporter.portable import float32_ops
from attnx.optimizer.optimize import ERROR_BOUNDS

EXACT = ERROR_BOUNDS["slim"]
Apply = Callable[[onnx.ModelProto, Path], onnx.ModelProto]


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    apply: Apply
    bound: float = EXACT
    expensive: bool = False


def kept_float32(path: Path) -> list[str]:
    """The attnx ops of the export holding ``path`` that stay float32 under an fp16 converter."""
    return float32_ops(ExportDir.open(path.parent).ops())


def checker(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    onnx.checker.check_model(model, full_check=True)
    return model


def strict_shape_inference(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)


def onnxconverter_fp16(keep_io_types: bool) -> Apply:
    def convert(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
        from onnxconverter_common import float16

        blocked = float16.DEFAULT_OP_BLOCK_LIST + kept_float32(path)
        return float16.convert_float_to_float16(model, keep_io_types=keep_io_types, op_block_list=blocked)

    return convert


def onnxruntime_fp16(keep_io_types: bool) -> Apply:
    def convert(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
        from onnxruntime.transformers import float16

        blocked = float16.DEFAULT_OP_BLOCK_LIST + kept_float32(path)
        return float16.convert_float_to_float16(model, keep_io_types=keep_io_types, op_block_list=blocked)

    return convert


def quantize_dynamic(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """int8 weights with ``reduce_range``: ONNX Runtime's u8s8 kernels on x86 CPUs without VNNI saturate
    16-bit sums (VPMADDUBSW), which cost a tiny export's MatMuls up to 30% of their output range here;
    ONNX Runtime's quantization guide advises reduce_range (or uint8 weights) for those CPUs."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as quantize

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "int8.onnx"
        quantize(path, target, weight_type=QuantType.QInt8, reduce_range=True)
        return onnx.load(str(target))


def onnxslim(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    import onnxslim as slim

    return slim.slim(model)


def onnxruntime_saved(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """ONNX Runtime's optimised graph, saved (``SessionOptions.optimized_model_filepath``) at the extended
    level, the highest one ONNX Runtime recommends for a graph used on another machine."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def transformers_optimizer(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """ONNX Runtime's transformer optimizer (fusions by pattern; num_heads/hidden_size 0: detected)."""
    from onnxruntime.transformers.optimizer import optimize_model

    return optimize_model(str(path), model_type="bert", num_heads=0, hidden_size=0).model


def onnxscript_ort_fusions(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """onnxscript's fusions for ONNX Runtime (``optimize_for_ort``), which inline the model-local functions
    with onnx_ir's inliner first (what ``attnx optimize --fuse`` runs)."""
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    fused, _ = optimize_for_ort(onnx_ir.from_proto(model))
    return onnx_ir.to_proto(fused)


def version_converter(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """``onnx.version_converter`` three opsets up (18 -> 21 for a default export)."""
    from onnx import version_converter as converter

    return converter.convert_version(model, model_opset(model) + 3)


TOOLS = [
    Tool("onnx.checker", checker),
    Tool("strict-shape-inference", strict_shape_inference),
    Tool("onnxconverter-common-fp16-keep-io", onnxconverter_fp16(True), ERROR_BOUNDS["fp16"]),
    Tool("onnxconverter-common-fp16", onnxconverter_fp16(False), ERROR_BOUNDS["fp16"]),
    # onnxruntime's converter is onnxconverter-common's, vendored: one graph each in the default run
    Tool("onnxruntime-fp16-keep-io", onnxruntime_fp16(True), ERROR_BOUNDS["fp16"], expensive=True),
    Tool("onnxruntime-fp16", onnxruntime_fp16(False), ERROR_BOUNDS["fp16"], expensive=True),
    Tool("quantize-dynamic", quantize_dynamic, ERROR_BOUNDS["dynamic-int8"]),
    Tool("onnxruntime-saved-optimized", onnxruntime_saved),
    Tool("onnx.version_converter", version_converter),
    Tool("onnxslim", onnxslim, expensive=True),
    Tool("transformers-optimizer", transformers_optimizer, expensive=True),
    Tool("onnxscript-ort-fusions", onnxscript_ort_fusions, expensive=True),
]
