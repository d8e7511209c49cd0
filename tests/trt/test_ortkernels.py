"""Plugin-lowered models on ONNX Runtime CPU through attnx's kernels (the bare nodes, nothing attached)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from attnx.api import verify
from attnx.exporter.directory import ExportDir
from attnx.ops import AttentionOp
from attnx.ortkernels import kernel_view, kernels_missing, register_all, session_options
from attnx.plugins.softmax.kernel import SOFTMAX_OP
from attnx.trt.spec import PluginSpec, describe
from tests.trt.conftest import VARIANTS


@pytest.fixture
def kernel_calls(monkeypatch):
    """Count the kernel invocations (PluginSpec.run is what every attnx kernel calls)."""
    calls = []
    run = PluginSpec.run

    def spy(self, tensors, values, names=None):
        calls.append(self.name)
        return run(self, tensors, values, names)

    monkeypatch.setattr(PluginSpec, "run", spy)
    return calls


@pytest.mark.parametrize("variant", VARIANTS)
def test_plugin_export_matches_torch_through_the_kernels(variant, plugin_export, kernel_calls):
    report = verify(plugin_export(variant), backends=["ort-cpu"], seq_lens=[1, 7, 33], write=False, seed=1)
    assert report.passed, report.to_dict()
    assert len(kernel_calls) == 3 * 1  # one attention layer, three sequence lengths


@pytest.mark.parametrize("variant", ["softmax", pytest.param("reformer", marks=pytest.mark.slow)])
def test_nodes_without_the_mask_use_the_shorter_kernel(variant, plugin_export, kernel_calls):
    out = plugin_export(variant, attention_mask=False)
    ops = ExportDir.open(out).ops()
    view = kernel_view(onnx.load(str(out / "model.onnx")), ops)
    (node,) = [n for n in view.graph.node if n.domain == "attnx"]
    assert node.op_type == f"{ops[0].name}_{'_'.join(ops[0].input_names[:-1])}"
    assert verify(out, backends=["ort-cpu"], seq_lens=[2, 9], write=False, seed=2).passed
    assert kernel_calls


# -- an independent check of one node: softmax written out with explicit N x N matrices -------------------


def naive_attention(q, k, v, mask, causal, scale):
    scores = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale
    n, m = scores.shape[-2:]
    for i in range(n):
        for j in range(m):
            if mask is not None:
                scores[:, :, i, j] = np.where(mask[:, j][:, None], scores[:, :, i, j], -65504.0)
            if causal and j > i + m - n:
                scores[:, :, i, j] = -np.inf
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", weights, v.astype(np.float64))


def single_node_model(op_type, inputs, attributes, ranks, input_types):
    node = helper.make_node(op_type, [n for n, _ in inputs], ["out"], domain="attnx", **attributes,
                            plugin_namespace="attnx", plugin_version="1")
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info(n, input_types.get(n, TensorProto.FLOAT), [None] * ranks[n])
         for n, _ in inputs],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("attnx", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def kernel_session(model, ops):
    view = kernel_view(model, ops).SerializeToString()
    return ort.InferenceSession(view, session_options(), providers=["CPUExecutionProvider"])


def run_kernels(model, ops, feed):
    return kernel_session(model, ops).run(None, feed)[0]


SHAPES = [(1, 1, 1, 1, 4), (2, 3, 5, 9, 8), (3, 2, 7, 7, 16)]


@pytest.mark.parametrize(("batch", "heads", "n", "m", "d"), SHAPES)
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("with_mask", [True, False])
def test_softmax_node_matches_the_formula(batch, heads, n, m, d, causal, with_mask):
    rng = np.random.default_rng(batch * 100 + n * 10 + m + causal)
    q, k, v = (rng.standard_normal((batch, heads, length, d)).astype(np.float32) for length in (n, m, m))
    mask = rng.random((batch, m)) > 0.3
    mask[:, -1] = True
    scale = float(np.float32(0.7 / np.sqrt(d)))
    inputs = [("q", q), ("k", k), ("v", v)] + ([("key_padding_mask", mask)] if with_mask else [])
    ranks = {"q": 4, "k": 4, "v": 4, "key_padding_mask": 2}
    model = single_node_model("SoftmaxAttention", inputs, {"causal": causal, "scale": scale}, ranks,
                              {"key_padding_mask": TensorProto.BOOL})
    got = run_kernels(model, [SOFTMAX_OP], dict(inputs))
    expected = naive_attention(q, k, v, mask if with_mask else None, causal, scale)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# -- list and string attributes travel through the node ---------------------------------------------------


@torch.library.custom_op("attnx_test::scaled_roll", mutates_args=())
def scaled_roll(
    x: torch.Tensor, key_padding_mask: torch.Tensor | None, weights: list[float], shift: list[int], mode: str
) -> torch.Tensor:
    out = torch.roll(x, shifts=shift[0], dims=-2) * torch.tensor(weights, dtype=x.dtype)
    if key_padding_mask is not None:
        out = out * key_padding_mask[..., None]
    return -out if mode == "negate" else out


@scaled_roll.register_fake
def _(x, key_padding_mask, weights, shift, mode):
    return torch.empty_like(x)


ROLL_OP = AttentionOp("ScaledRollTest", scaled_roll, (), input_types={"key_padding_mask": "tensor(bool)"})
# Its kernels are registered now, at collection, before any session of this process exists: a session
# made before a later registration crashes onnxruntime-extensions when it runs or is freed (register_all).
if kernels_missing() is None:
    register_all([describe(ROLL_OP)])


@pytest.mark.parametrize("with_mask", [True, False])
def test_list_and_string_attributes_reach_the_op(with_mask):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=bool)
    attributes = {"weights": [0.5, -2.0, 3.0], "shift": [2], "mode": "negate"}
    inputs = [("x", x)] + ([("key_padding_mask", mask)] if with_mask else [])
    model = single_node_model("ScaledRollTest", inputs, attributes, {"x": 3, "key_padding_mask": 2},
                              {"key_padding_mask": TensorProto.BOOL})
    view = kernel_view(model, [ROLL_OP])
    (node,) = view.graph.node
    assert node.op_type == ("ScaledRollTest" if with_mask else "ScaledRollTest_x")
    encoded = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert json.loads(encoded["weights"]) == [0.5, -2.0, 3.0] and json.loads(encoded["shift"]) == [2]
    expected = -np.roll(x, 2, axis=-2) * np.array([0.5, -2.0, 3.0], dtype=np.float32)
    if with_mask:
        expected = expected * mask[..., None]
    np.testing.assert_allclose(run_kernels(model, [ROLL_OP], dict(inputs)), expected, rtol=1e-6, atol=1e-6)


# -- property: one plugin-lowered model, hypothesis draws the shapes -------------------------------------


@pytest.fixture(scope="module")
def softmax_pair(plugin_export):
    out = plugin_export("softmax")
    export = ExportDir.open(out)
    return export.rebuild().module.eval(), kernel_session(onnx.load(str(out / "model.onnx")), export.ops())


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 3), n=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_property_plugin_model_matches_torch(softmax_pair, batch, n, seed):
    module, session = softmax_pair
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, (batch, n))
    mask = rng.random((batch, n)) > 0.25
    mask[:, 0] = True
    (got,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        (expected,) = module(torch.from_numpy(ids), torch.from_numpy(mask))
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.slow  # two plugin exports in one process; each variant's kernels are tested by default
def test_earlier_sessions_survive_kernels_of_another_variant(tmp_path):
    """onnxruntime-extensions crashed (SIGSEGV) when a session ran after a later kernel
    registration; attnx registers every known kernel before the first session."""
    script = f"""
import numpy as np
from pathlib import Path
from attnx.api import export
from attnx.exporter.directory import ExportDir
from attnx.parity.backends import BACKENDS
from attnx.parity.runners import Graph
tiny = {{"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "vocab_size": 20}}
feed = {{"input_ids": np.ones((2, 5), np.int64), "attention_mask": np.ones((2, 5), bool)}}
runners = []
for variant in ("softmax", "linear"):
    out = Path({str(tmp_path)!r}) / variant
    export(variant, out, options={{**tiny, "export.lowering": "plugin", "verify.enabled": False}})
    runner = BACKENDS["ort-cpu"].runner(Graph.of_model(ExportDir.open(out)), None)
    runner.activate()
    runners.append(runner)
    runner.infer(feed)
runners[0].infer(feed)
for runner in runners:
    runner.deactivate()
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, f"exit code {result.returncode}: {result.stderr[-2000:]}"
