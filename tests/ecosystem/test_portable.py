"""The rewrites that keep attnx's graphs consistent under fp16 converters (attnx.exporter.portable), on
hand-made graphs with the two patterns: without the rewrite onnxconverter-common's output does not load
in ONNX Runtime, with it the converted graph loads and computes what the float32 one does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from attnx.exporter.portable import for_graph_tools

float16 = pytest.importorskip("onnxconverter_common.float16")


def model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    made.ir_version = 10
    return made


def positions() -> onnx.ModelProto:
    """sin(float(arange(n)) * 0.5): an integer cast to float, as every attnx graph's position encoding."""
    nodes = [
        helper.make_node("Range", ["start", "n", "one"], ["index"]),
        helper.make_node("Cast", ["index"], ["angle"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["angle", "half"], ["scaled"]),
        helper.make_node("Sin", ["scaled"], ["encoding"]),
    ]
    constants = [
        numpy_helper.from_array(np.array(0, np.int64), "start"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    n = helper.make_tensor_value_info("n", TensorProto.INT64, [])
    return model(nodes, [n], [helper.make_tensor_value_info("encoding", TensorProto.FLOAT, ["n"])], constants)


def pooled() -> onnx.ModelProto:
    """``hidden`` is an output and a pooled head reads it, as the encoder's classifier does."""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["hidden"]),
        helper.make_node("ReduceMean", ["hidden"], ["pooled"], keepdims=0),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    outputs = [
        helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("pooled", TensorProto.FLOAT, []),
    ]
    return model(nodes, [x], outputs, [numpy_helper.from_array(np.full((2, 3), 1.5, np.float32), "w")])


def run(made: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(made.SerializeToString(), providers=["CPUExecutionProvider"])
    given = {
        i.name: feed[i.name].astype(np.float16) if i.type == "tensor(float16)" else feed[i.name]
        for i in session.get_inputs()
    }
    return [np.asarray(out, np.float64) for out in session.run(None, given)]


STEPS = {"n": np.array(6, np.int64)}
ROWS = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
# without keep_io_types an output read inside is retyped with everything else: nothing to break
CASES = [(positions, STEPS, True), (positions, STEPS, False), (pooled, ROWS, True)]


@pytest.mark.parametrize(
    ("make", "feed", "keep_io_types"), CASES, ids=["cast-keep-io", "cast", "output-also-read-keep-io"]
)
def test_converted_graphs_load_and_match_only_after_the_rewrite(make, feed, keep_io_types):
    expected = run(make(), feed)
    raw = float16.convert_float_to_float16(make(), keep_io_types=keep_io_types)
    with pytest.raises(Exception, match="[Tt]ype"):
        run(raw, feed)
    rewritten = for_graph_tools(make())
    onnx.checker.check_model(rewritten, full_check=True)
    np.testing.assert_allclose(run(rewritten, feed)[0], expected[0], rtol=0, atol=0)  # the same function
    converted = float16.convert_float_to_float16(rewritten, keep_io_types=keep_io_types)
    for got, want in zip(run(converted, feed), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_the_rewrite_keeps_names_and_is_idempotent():
    once = for_graph_tools(pooled())
    twice = for_graph_tools(onnx.ModelProto.FromString(once.SerializeToString()))
    assert [o.name for o in once.graph.output] == ["hidden", "pooled"]
    assert once.SerializeToString() == twice.SerializeToString()
