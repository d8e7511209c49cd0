"""The ONNX contract of plugin nodes (what TensorRT's parser reads) and the ``trt.plugins`` rewrite."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.trt.graph import ORT_TRT_DOMAIN, check_plugin_nodes, for_ort_tensorrt
from attnx.trt.spec import describe
from tests.conftest import TINY
from tests.trt.conftest import VARIANTS


def load(out):
    return onnx.load(str(out / "model.onnx"))


def attnx_nodes(model):
    return [n for n in model.graph.node if n.domain == "attnx"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_exported_nodes_carry_exactly_the_plugin_fields(variant, plugin_export):
    model, ops = load(plugin_export(variant)), assemble(variant, "encoder", TINY).ops
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


def hole_before_mask(node):
    node.input[2] = ""


def only_two_inputs(node):
    del node.input[2:]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (rename_scale, "attributes (causal, softmax_scale) differ from the plugin's fields (causal, scale)"),
        (drop_namespace, 'needs plugin_namespace="attnx"'),
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
