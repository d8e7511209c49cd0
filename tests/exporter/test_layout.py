"""Graph layouts: ``without_output_copies`` returns the same values without the Identity copies, and
``without_input_copies`` reads a state in place only where nothing reads it after it is written."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from attnx.exporter.layout import Layout, without_input_copies, without_output_copies


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


def state_step(late_reader: str | None) -> onnx.ModelProto:
    """A recurrent step as genai.onnx lays it out: the state read once through a copy, ``present = (copy +
    x) * 2`` written by the last node; ``late_reader`` adds a reader of the copy that the writer does not
    wait for: "direct" (an Add), "view" (a Reshape's reader), "branch" (an If branch reading it)."""
    bounds = [
        helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [1], [v]))
        for name, v in (("start", 0), ("end", 3), ("axis", 1))
    ]
    nodes = [
        *bounds,
        helper.make_node("Slice", ["past", "start", "end", "axis"], ["copy"]),
        helper.make_node("Add", ["copy", "x"], ["grown"]),
        helper.make_node("Mul", ["grown", "two"], ["present"]),
        helper.make_node("Identity", ["x"], ["y"]),
    ]
    if late_reader == "direct":
        nodes[-1] = helper.make_node("Sub", ["copy", "x"], ["y"])
    elif late_reader == "view":
        nodes[-1:] = [
            helper.make_node("Reshape", ["copy", "flat"], ["view"]),
            helper.make_node("ReduceSum", ["view"], ["y"], keepdims=0),
        ]
    elif late_reader == "branch":
        branch = helper.make_graph(
            [helper.make_node("Neg", ["copy"], ["read"])],
            "then",
            [],
            [helper.make_tensor_value_info("read", TensorProto.FLOAT, None)],
        )
        nodes[-1] = helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=branch)
    floats = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "step",
        [helper.make_tensor_value_info(n, floats, [2, 3]) for n in ("past", "x")],
        [helper.make_tensor_value_info(n, floats, None) for n in ("present", "y")],
        initializer=[
            helper.make_tensor("flat", TensorProto.INT64, [1], [-1]),
            helper.make_tensor("two", floats, [], [2.0]),
            helper.make_tensor("flag", TensorProto.BOOL, [], [True]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("late_reader", [None, "direct", "view", "branch"])
def test_a_state_is_read_in_place_only_where_its_writer_waits_for_every_read(late_reader):
    """genai binds a state's input and output to one buffer: the copy guarding the read goes only where
    every reader of the state (through views and branches) is an ancestor of the node writing it; the
    values stay the same either way."""
    model = state_step(late_reader)
    feed = {"past": np.arange(6, dtype=np.float32).reshape(2, 3), "x": np.ones((2, 3), np.float32)}
    expected = run(model, feed)
    without_input_copies(model, {"copy": "present"})
    slices = [n for n in model.graph.node if n.op_type == "Slice"]
    assert (not slices) == (late_reader is None)
    read = {name for n in model.graph.node for name in n.input}
    assert all(o in read for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    for got, want in zip(run(model, feed), expected, strict=True):
        np.testing.assert_array_equal(got, want)
