"""``fp16-convert``: an fp32 export turned into fp16 by the usual converters loads and matches torch fp16.

fp16 converters retype every float tensor of the graphs they visit and do not visit model-local
functions. A body that mixes a float32 literal with a tensor, or produces a type its declaration
no longer says, then fails to load once inlined (``decomposed``) or mixes types inside a function.
Bodies stay dtype-generic with ``CastLike`` (:func:`attnx.ops.AttnxWiden` where they must
accumulate in float32).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from attnx.api import export
from attnx.errors import first_line
from attnx.exporter.assemble import assemble
from attnx.exporter.directory import ExportDir
from attnx.parity.backends import backends
from attnx.parity.check import Cases, check_parity
from attnx.testing.checks.common import Skip
from attnx.testing.checks.export import EXPORT_SEQ_LENS, export_model, export_options, parity_problems
from attnx.testing.subject import Subject

LOWERINGS = ("function", "decomposed")
Converter = Callable[[Any], Any]


def converters() -> dict[str, Converter]:
    """The installed fp16 converters by name: ONNX Runtime's (a dependency of attnx) and
    onnxconverter-common's (the ``dev`` and ``optimize`` extras)."""
    found: dict[str, Converter] = {}
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16 as ort_convert
    except ImportError:
        pass
    else:
        found["onnxruntime.transformers.float16"] = ort_convert
    try:
        from onnxconverter_common.float16 import convert_float_to_float16 as common_convert
    except ImportError:
        pass
    else:

        def convert(model: Any) -> Any:
            # onnxconverter-common >= 1.15 retypes the output of Cast(to=FLOAT) without changing the
            # Cast (its issue #320), so any int -> float cast of the model (positions) stops loading.
            # Keeping those Casts in float32 (block list; the converter casts their output to fp16)
            # is the documented workaround; a body's float32 literal still breaks the graph.
            casts = [n.name for n in model.graph.node if n.name and n.op_type == "Cast" and _to_float(n)]
            return common_convert(model, node_block_list=casts)

        found["onnxconverter-common"] = convert
    return found


def check_fp16_convert(subject: Subject) -> list[str]:
    """Export a tiny fp32 model in the function and decomposed lowerings, convert it with every
    installed fp16 converter, and compare it with the torch model in fp16 at the fp16 tolerance."""
    if not subject.variant.capabilities.fp16:
        raise Skip("the variant exports in fp32 only (Capabilities.fp16=False), so no fp16 model is promised")
    found = converters()
    if not found:
        raise Skip("no fp16 converter is installed (onnxruntime.transformers, onnxconverter-common)")
    options = export_options(subject)
    tolerance = subject.variant.tolerance_for("fp16")
    problems = []
    with tempfile.TemporaryDirectory(prefix="attnx-fp16-convert-") as tmp, subject.installed():
        kind = export_model(subject)
        half = assemble(subject.variant.name, kind, options, subject.seed, dtype="fp16")
        for lowering in LOWERINGS:
            out = Path(tmp) / lowering
            settings = {"export.lowering": lowering, "export.seed": subject.seed, "verify.enabled": False}
            try:
                export(subject.variant.name, out, model=kind, options={**options, **settings})
            except Exception as exc:
                problems.append(
                    f"export with the {lowering} lowering failed: {type(exc).__name__}: {first_line(exc)}"
                )
                continue
            exported = ExportDir.open(out)  # checked as written; its model.onnx is replaced below
            model = onnx.load(str(exported.model_path))
            for name, convert in found.items():
                what = f"the {lowering}-lowered export converted to fp16 by {name}"
                try:
                    onnx.save(convert(model), str(exported.model_path))
                    cases = Cases.make(exported, EXPORT_SEQ_LENS, tolerance=tolerance, seed=subject.seed)
                    report = check_parity(exported, half, backends(["ort-cpu"]), cases)
                except Exception as exc:
                    problems.append(
                        f"{what} does not run in ONNX Runtime: {type(exc).__name__}: {first_line(exc)}"
                    )
                    continue
                problems += parity_problems(report, what)
    return problems


def _to_float(node: Any) -> bool:
    return any(a.name == "to" and a.i == 1 for a in node.attribute)  # onnx.TensorProto.FLOAT
