"""Graph layouts: ``without_output_copies`` returns the same values without the Identity copies."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from attnx.exporter.layout import Layout, without_output_copies


def cache_step() -> onnx.ModelProto:
    """A decode step's cache: present = Identity(Identity(Concat(past, new))), the concatenation also read
    by a MatMul (so ONNX Runtime cannot drop the copies itself); a second output copies a graph input."""
    nodes = [
        helper.make_node("Concat", ["past", "new"], ["grown"], axis=0),
        helper.make_node("Identity", ["grown"], ["grown.read"]),
        helper.make_node("Identity", ["grown.read"], ["present"]),
        helper.make_node("MatMul", ["grown", "w"], ["y"]),
        helper.make_node("Identity", ["past"], ["past.echo"]),
    ]
    floats = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "step",
        [helper.make_tensor_value_info(n, floats, [s, 3]) for n, s in (("past", "p"), ("new", 1))],
        [
            helper.make_tensor_value_info(n, floats, s)
            for n, s in (("present", ["q", 3]), ("y", ["q", 2]), ("past.echo", ["p", 3]))
        ],
        initializer=[helper.make_tensor("w", floats, [3, 2], np.arange(6, dtype=np.float32))],
        value_info=[helper.make_tensor_value_info("grown", floats, ["q", 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString()).run(None, feed)


def test_outputs_come_from_their_nodes_and_the_values_stay():
    feed = {"past": np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)}
    feed["new"] = np.ones((1, 3), np.float32)
    expected = run(cache_step(), feed)
    model = without_output_copies(cache_step())
    onnx.checker.check_model(model, full_check=True)
    by_output = {o: n for n in model.graph.node for o in n.output}
    assert by_output["present"].op_type == "Concat" and by_output["y"].input[0] == "present"
    assert by_output["past.echo"].op_type == "Identity"  # a graph input's copy is not a computed value
    assert [n.op_type for n in model.graph.node].count("Identity") == 1
    assert "grown" not in {v.name for v in model.graph.value_info}
    for got, want in zip(run(model, feed), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_output_is_computed_from_an_input_only_through_the_nodes_between():
    """``Layout.computed_from``: what genai's in-place states rely on. A token-shift carry (the last new
    token) is not computed from the carry before it, however the graph is ordered; a value a subgraph
    reads from outside counts as read."""
    floats = TensorProto.FLOAT
    branch = helper.make_graph(
        [helper.make_node("Identity", ["carry"], ["picked"])],
        "then",
        [],
        [helper.make_tensor_value_info("picked", floats, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["new"], ["kept"])],
        "else",
        [],
        [helper.make_tensor_value_info("kept", floats, None)],
    )
    nodes = [
        helper.make_node("Concat", ["carry", "new"], ["window"], axis=0),
        helper.make_node("ReduceSum", ["window"], ["out"]),
        helper.make_node("Identity", ["new"], ["next_carry"]),
        helper.make_node("If", ["flag"], ["chosen"], then_branch=branch, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "shift",
        [helper.make_tensor_value_info(n, floats, [1]) for n in ("carry", "new")]
        + [helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, floats, None) for n in ("out", "next_carry", "chosen")],
    )
    layout = Layout(helper.make_model(graph))
    assert layout.computed_from("out", "carry")
    assert not layout.computed_from("next_carry", "carry")
    assert layout.computed_from("next_carry", "new")
    assert layout.computed_from("chosen", "carry")
