"""What TensorRT's parser reads: the plugin node contract, the opset limit, standard ``Attention`` nodes
(IAttention's restrictions); and the ``trt.plugins`` rewrite."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.trt.graph import (
    ORT_TRT_DOMAIN,
    attention_nodes,
    check_attention_nodes,
    check_opset,
    check_plugin_nodes,
    for_ort_tensorrt,
)
from attnx.trt.spec import describe
from tests.conftest import TINY
from tests.models.cases import one_per_kind
from tests.trt.conftest import VARIANTS, tiny_model


def load(out):
    return onnx.load(str(out / "model.onnx"))


def attnx_nodes(model):
    return [n for n in model.graph.node if n.domain == "attnx"]


@pytest.mark.parametrize("variant", one_per_kind(VARIANTS))  # every variant under -m slow
def test_exported_nodes_carry_exactly_the_plugin_fields(variant, plugin_export):
    model, ops = load(plugin_export(variant)), assemble(variant, tiny_model(variant), TINY).ops
    assert check_plugin_nodes(model, ops) == TINY["n_layers"]
    specs = {op.name: describe(op) for op in ops}
    for node in attnx_nodes(model):
        attributes = {a.name: a.type for a in node.attribute}
        string = onnx.AttributeProto.STRING
        assert attributes.pop("plugin_namespace") == attributes.pop("plugin_version") == string
        assert attributes == {f.name: f.onnx_type for f in specs[node.op_type].fields}


@pytest.fixture
def softmax_model(plugin_export):
    return load(plugin_export("softmax")), assemble("softmax", "encoder", TINY).ops


def edit_node(model, change):
    change(attnx_nodes(model)[0])
    return model


def rename_scale(node):
    next(a for a in node.attribute if a.name == "scale").name = "softmax_scale"


def drop_namespace(node):
    kept = [a for a in node.attribute if a.name != "plugin_namespace"]
    del node.attribute[:]
    node.attribute.extend(kept)


def scale_as_int(node):
    attribute = next(a for a in node.attribute if a.name == "scale")
    attribute.CopyFrom(helper.make_attribute("scale", 1))


def aot_request(node):
    """TensorRT's per-node JIT/AOT switch: attnx chooses with a network flag and never writes it."""
    node.attribute.append(helper.make_attribute("aot", 1))


def hole_before_mask(node):
    node.input[2] = ""


def only_two_inputs(node):
    del node.input[2:]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (rename_scale, "attributes (causal, softmax_scale) differ from the plugin's fields (causal, scale)"),
        (drop_namespace, 'needs plugin_namespace="attnx"'),
        (aot_request, "attributes (aot, causal, scale) differ from the plugin's fields (causal, scale)"),
        (scale_as_int, "attribute scale (INT) does not match plugin field scale (FLOAT)"),
        (hole_before_mask, "omits an input before a given one"),
        (only_two_inputs, "got 2 inputs; it takes q, k, v, key_padding_mask?"),
    ],
)
def test_broken_nodes_are_refused_with_the_reason(softmax_model, change, message):
    model, ops = softmax_model
    with pytest.raises(AttnxError, match="SoftmaxAttention") as info:
        check_plugin_nodes(edit_node(model, change), ops)
    assert message in str(info.value)


def test_unknown_plugin_is_refused(softmax_model):
    model, _ = softmax_model
    with pytest.raises(AttnxError, match="no attnx op of that name"):
        check_plugin_nodes(model, [])


@pytest.mark.parametrize("variant", ["softmax", "fastformer"])
def test_ort_tensorrt_rewrite_moves_only_the_domain(variant, plugin_export):
    original = load(plugin_export(variant))
    before = original.SerializeToString()
    rewritten = for_ort_tensorrt(original)
    assert original.SerializeToString() == before  # the input model is untouched
    assert attnx_nodes(rewritten) == []
    moved = [n for n in rewritten.graph.node if n.domain == ORT_TRT_DOMAIN]
    assert len(moved) == len(attnx_nodes(original)) == TINY["n_layers"]
    for old, new in zip(attnx_nodes(original), moved, strict=True):
        assert new.op_type == old.op_type and new.input == old.input and new.output == old.output
        assert list(new.attribute) == list(old.attribute)  # plugin_namespace/version and fields unchanged
    domains = {o.domain: o.version for o in rewritten.opset_import}
    assert domains[ORT_TRT_DOMAIN] == 1 and "attnx" not in domains
    others = [n for n in rewritten.graph.node if n.domain != ORT_TRT_DOMAIN]
    assert [n.SerializeToString() for n in others] == [
        n.SerializeToString() for n in original.graph.node if n.domain != "attnx"
    ]


def test_opsets_above_the_parsers_limit_are_refused():
    check_opset(25, "out")
    with pytest.raises(AttnxError) as info:
        check_opset(26, "out")
    assert str(info.value) == (
        "out uses ONNX opset 26; TensorRT 11.5 parses opsets <= 25: re-export with --opset 25 or lower"
    )


def attention_model(inputs=("q", "k", "v", "mask"), outputs=("y",), in_function=False, **attributes):
    """A model holding one standard Attention node (opset 23), in the graph or in a local function."""
    node = helper.make_node("Attention", list(inputs), list(outputs), name="attn", **attributes)
    if not in_function:
        graph = helper.make_graph([node], "g", [], [])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    call = helper.make_node("Sdpa", list(inputs), list(outputs), domain="local")
    function = helper.make_function("local", "Sdpa", list(inputs), list(outputs), [node],
                                    [helper.make_opsetid("", 23)])  # fmt: skip
    graph = helper.make_graph([call], "g", [], [])
    return helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 23),
                                                                        helper.make_opsetid("local", 1)])


def test_attention_nodes_are_found_in_the_graph_and_in_functions(softmax_model):
    assert len(attention_nodes(attention_model())) == 1
    assert len(attention_nodes(attention_model(in_function=True))) == 1
    assert attention_nodes(softmax_model[0]) == []  # the plugin lowering has none


def test_iattention_takes_the_plain_node_from_tensorrt_10_14():
    nodes = attention_nodes(attention_model(is_causal=1, scale=0.125))
    check_attention_nodes(nodes, (10, 14))
    check_attention_nodes(nodes, (11, 5))
    check_attention_nodes([], (10, 8))  # no Attention node: any version
    with pytest.raises(AttnxError, match=r"Attention node\(s\), which TensorRT 10.13 cannot parse"):
        check_attention_nodes(nodes, (10, 13))


@pytest.mark.parametrize(
    ("model", "named"),
    [
        (attention_model(("q", "k", "v", "mask", "past_k", "past_v")), "past_key, past_value"),
        (attention_model(("q", "k", "v", "", "", "", "lengths")), "nonpad_kv_seqlen"),
        (attention_model(outputs=("y", "present_k", "present_v")), "more than one output"),
        (attention_model(softcap=30.0), "softcap"),
        (attention_model(qk_matmul_output_mode=1), "qk_matmul_output_mode"),
    ],
)
def test_iattention_refuses_kv_cache_inputs_extra_outputs_and_softcap(model, named):
    with pytest.raises(AttnxError) as info:
        check_attention_nodes(attention_nodes(model), (11, 5))
    assert str(info.value).startswith(f"Attention node attn uses {named}, which TensorRT's IAttention")
    check_attention_nodes(attention_nodes(attention_model(softcap=0.0, qk_matmul_output_mode=0)), (11, 5))
