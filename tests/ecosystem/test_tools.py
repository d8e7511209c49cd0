"""The ONNX ecosystem's own tools on attnx exports: every tool x every registered variant's graphs.

Each cell runs the tool as users call it, loads what it made in ONNX Runtime and compares it with the
float32 export on the same inputs, within the tool's error bound (:mod:`tests.ecosystem.tools`). A
cell that cannot pass because of a bug in the tool is an ``xfail(strict=True)`` naming the upstream
issue and what to run instead (docs/ecosystem.md has the table).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from attnx.plugins.gated import attnx_register_variants
from tests.ecosystem.subjects import Subject, feed, in_default_run, subjects
from tests.ecosystem.tools import TOOLS, Tool

# onnx.version_converter rebuilds the graph without the model-local functions (onnx/onnx#4370, open), so
# every attnx::<Op> node of a function-lowered graph is left without a body.
VERSION_CONVERTER_DROPS_FUNCTIONS = (
    "onnx.version_converter drops model-local functions (https://github.com/onnx/onnx/issues/4370): "
    "export at the opset you need (attnx export --opset N), or convert a --lowering decomposed export"
)
# onnxruntime.transformers' OnnxModel.graph_topological_sort orders a graph's nodes by their explicit
# inputs only: a value that only an If branch reads may be placed after the If, and ONNX Runtime refuses
# the result. The gated family's op chooses its form with nested Ifs whose branches read such values.
TRANSFORMERS_OPTIMIZER_SORTS_OUT_BRANCH_READS = (
    "onnxruntime.transformers.optimizer sorts nodes by explicit inputs only (OnnxModel."
    "graph_topological_sort), placing a value an If branch reads after the If: use attnx optimize --fuse "
    "(onnxscript's fusions for ONNX Runtime) on gated-family exports"
)
GATED_FAMILY = {variant.name for variant in attnx_register_variants()}
SUBJECTS = subjects()
# the default run gives each expensive tool one graph (the first variant's lm prefill, or encoder), the
# others the graphs of in_default_run
SAMPLE = next((s for s in SUBJECTS if s.graph == "prefill"), SUBJECTS[0])


def known_bug(subject: Subject, tool: Tool) -> str | None:
    if tool.name == "onnx.version_converter" and subject.lowering == "function":
        return VERSION_CONVERTER_DROPS_FUNCTIONS
    if tool.name == "transformers-optimizer" and subject.variant in GATED_FAMILY:
        return TRANSFORMERS_OPTIMIZER_SORTS_OUT_BRANCH_READS
    return None


def cells() -> list[Any]:
    params = []
    for subject in SUBJECTS:
        for tool in TOOLS:
            # the cells of one export run on one pytest-xdist worker, which makes the export once
            marks = [subject.same_worker()]
            if subject != SAMPLE and (tool.expensive or not in_default_run(subject)):
                marks.append(pytest.mark.slow)
            reason = known_bug(subject, tool)
            if reason:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            params.append(pytest.param(subject, tool, marks=marks, id=f"{tool.name}-{subject.id}"))
    return params


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the converters' graphs draw warnings about unused initializers
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``model`` on ``inputs``, each cast to the dtype the graph declares (an fp16 converter without
    keep_io_types makes float inputs float16)."""
    runner = session(model)
    dtypes = {"tensor(float16)": np.float16, "tensor(float)": np.float32}
    given = {
        i.name: inputs[i.name].astype(dtypes[i.type]) if i.type in dtypes else inputs[i.name]
        for i in runner.get_inputs()
    }
    names = [o.name for o in runner.get_outputs()]
    return dict(zip(names, runner.run(None, given), strict=True))


@pytest.mark.parametrize(("subject", "tool"), cells())
def test_the_tool_output_loads_in_onnxruntime_and_matches_the_export(subject: Subject, tool: Tool):
    export = subject.export()
    path = export.file(subject.graph)
    graphs = {
        key: onnx.load(str(export.file(key)))
        for key in ("model", "prefill", "decode")
        if key in export.manifest.files
    }
    inputs = feed(export, subject.graph, lambda key, given: run(graphs[key], given))
    expected = run(graphs[subject.graph], inputs)
    made = tool.apply(onnx.load(str(path)), path)
    actual = run(made, inputs)
    assert set(actual) == set(expected)
    for name, reference in expected.items():
        error = np.abs(actual[name].astype(np.float64) - reference).max(initial=0.0)
        scale = max(float(np.abs(reference).max(initial=0.0)), 1e-6)
        assert error <= tool.bound * scale, (
            f"{name}: max error {error:.3g}, {error / scale:.3g} of max |{name}|"
        )


def test_the_matrix_covers_every_registered_variant_and_graph_kind():
    from tests.models.cases import REGISTERED

    assert {s.variant for s in SUBJECTS} == set(REGISTERED)
    assert {s.graph for s in SUBJECTS} == {"model", "prefill", "decode"}
    assert any(s.optimized for s in SUBJECTS)
