"""A decoder's KV cache in one buffer its past and present share (onnxruntime-genai's
``past_present_share_buffer``): the grown cache's attention becomes ONNX Runtime's GroupQueryAttention, which
writes into the buffer it is bound to and computes what the grown cache computed; a graph that reads the
cache's length, or reads it otherwise, keeps growing it."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
import onnxruntime as ort
import pytest
from onnx import helper

from attnx.domains import DOMAIN
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.lowering import attach_functions
from attnx.plugins.softmax.kernel import SOFTMAX_OP
from attnx.serve.decoders import DECODERS
from attnx.serve.kv_buffer import BUFFER_AXIS, Cache, share_kv_buffers

HEADS, KV_HEADS, SIZE, SCALE = 4, 2, 8, 0.3
CACHE = Cache("past_key", "past_value", "present_key", "present_value")
FLOAT = onnx.TensorProto.FLOAT


def grown_cache(causal: int = 1, extra: list[onnx.NodeProto] | None = None) -> onnx.ModelProto:
    """A decoder layer's attention as the Hugging Face adapters trace it: each cache an ``Identity`` of the
    past then ``Concat``-ed with the new entries, read by one ``attnx::SoftmaxAttention``; ``extra`` nodes
    write an output ``extra`` from its values."""
    heads = {"q": HEADS, "k": KV_HEADS, "v": KV_HEADS}
    inputs = [helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["batch", "seq"])]
    inputs += [helper.make_tensor_value_info("past_length", onnx.TensorProto.INT64, [1])]
    inputs += [helper.make_tensor_value_info(n, FLOAT, ["batch", h, "seq", SIZE]) for n, h in heads.items()]
    inputs += [
        helper.make_tensor_value_info(name, FLOAT, ["batch", KV_HEADS, "past_seq", SIZE])
        for name in (CACHE.past_key, CACHE.past_value)
    ]
    nodes = [
        helper.make_node("Identity", [CACHE.past_key], ["copy_key"]),
        helper.make_node("Identity", [CACHE.past_value], ["copy_value"]),
        helper.make_node("Concat", ["copy_key", "k"], [CACHE.present_key], axis=2),
        helper.make_node("Concat", ["copy_value", "v"], [CACHE.present_value], axis=2),
        helper.make_node(
            "SoftmaxAttention",
            ["q", CACHE.present_key, CACHE.present_value],
            ["out"],
            domain=DOMAIN,
            scale=SCALE,
            causal=causal,
        ),
        *(extra or []),
    ]
    names = ["out", CACHE.present_key, CACHE.present_value, *(["extra"] if extra else [])]
    outputs = [helper.make_tensor_value_info(name, FLOAT, None) for name in names]
    graph = helper.make_graph(nodes, "layer", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)]
    )
    return attach_functions(model, [SOFTMAX_OP])


def naive(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
    """Softmax attention of queries at positions start.. over keys 0..their own (query head i reads key/value
    head i // (heads / kv heads)), from the definition."""
    out = np.zeros_like(q)
    for head in range(HEADS):
        kv = head // (HEADS // KV_HEADS)
        for i in range(q.shape[2]):
            seen = start + i + 1
            scores = np.einsum("bd,bsd->bs", q[:, head, i], k[:, kv, :seen]) * SCALE
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            weights /= weights.sum(-1, keepdims=True)
            out[:, head, i] = np.einsum("bs,bsd->bd", weights, v[:, kv, :seen])
    return out


@pytest.mark.parametrize("batch,stops", [(2, [5, 6, 7, 8, 9]), (1, [3, 7, 8, 11]), (3, [1, 2, 3])])
def test_the_shared_buffer_is_written_in_place_and_attends_as_the_grown_cache(batch, stops):
    """Bound as genai binds it (past and present one OrtValue, max_length long), the buffer holds every
    token's keys and values at its position, nothing beyond, and each step's output is the definition's
    and the grown graph's (a prompt, then one token at a time; several after a state for one sequence)."""
    grown = grown_cache()
    shared = share_kv_buffers(grown_cache(), [CACHE], "past_length", "input_ids")
    assert shared is not None
    writers = {output: node for node in shared.graph.node for output in node.output}
    for past, present in ((CACHE.past_key, CACHE.present_key), (CACHE.past_value, CACHE.present_value)):
        assert writers[present].op_type == "ScatterND" and writers[present].input[0] == past
    assert "Identity" not in {n.op_type for n in shared.graph.node}
    buffer_dims = [d.dim_param or d.dim_value for d in shared.graph.input[-1].type.tensor_type.shape.dim]
    assert buffer_dims == ["batch", KV_HEADS, BUFFER_AXIS, SIZE]
    session, reference = (ort.InferenceSession(m.SerializeToString()) for m in (shared, grown))
    rng = np.random.default_rng(batch)
    total, capacity = stops[-1], stops[-1] + 3
    q = rng.standard_normal((batch, HEADS, total, SIZE), dtype=np.float32)
    k, v = (rng.standard_normal((batch, KV_HEADS, total, SIZE), dtype=np.float32) for _ in "kv")
    buffers = {name: np.zeros((batch, KV_HEADS, capacity, SIZE), np.float32) for name in ("key", "value")}
    bound = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in buffers.items()}
    grown_state = {name: np.zeros((batch, KV_HEADS, 0, SIZE), np.float32) for name in ("key", "value")}
    start = 0
    for stop in stops:
        new = {"q": q[:, :, start:stop], "k": k[:, :, start:stop], "v": v[:, :, start:stop]}
        feed = {
            "input_ids": np.zeros((batch, stop - start), np.int64),
            "past_length": np.array([start]),
            **{name: np.ascontiguousarray(value) for name, value in new.items()},
        }
        binding = session.io_binding()
        for name, value in feed.items():
            binding.bind_cpu_input(name, value)
        binding.bind_output("out")
        for name, buffer in bound.items():
            binding.bind_ortvalue_input(f"past_{name}", buffer)
            binding.bind_ortvalue_output(f"present_{name}", buffer)
        session.run_with_iobinding(binding)
        out = binding.copy_outputs_to_cpu()[0]
        expected = naive(new["q"], k, v, start)
        np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
        grown_out, grown_state["key"], grown_state["value"] = reference.run(
            None, {**feed, **{f"past_{name}": value for name, value in grown_state.items()}}
        )
        np.testing.assert_allclose(out, grown_out, atol=1e-5, rtol=1e-5)
        start = stop
    for name, cache in (("key", k), ("value", v)):
        written = bound[name].numpy()
        np.testing.assert_array_equal(written[:, :, :total], cache)  # in place, at each token's position
        assert not written[:, :, total:].any()


def test_plain_runs_feed_the_buffer_back_as_a_new_array():
    """Without IO binding (parity's runners) the kernel fills a present as long as the buffer from the
    past."""
    shared = share_kv_buffers(grown_cache(), [CACHE], "past_length", "input_ids")
    session = ort.InferenceSession(shared.SerializeToString())
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, HEADS, 6, SIZE), dtype=np.float32)
    k, v = (rng.standard_normal((1, KV_HEADS, 6, SIZE), dtype=np.float32) for _ in "kv")
    state = [np.zeros((1, KV_HEADS, 8, SIZE), np.float32)] * 2
    for start, stop in [(0, 4), (4, 5), (5, 6)]:
        feed = {"input_ids": np.zeros((1, stop - start), np.int64), "past_length": np.array([start])}
        feed |= {"q": q[:, :, start:stop], "k": k[:, :, start:stop], "v": v[:, :, start:stop]}
        out, *state = session.run(None, {**feed, "past_key": state[0], "past_value": state[1]})
        np.testing.assert_allclose(out, naive(q[:, :, start:stop], k, v, start), atol=1e-5, rtol=1e-5)
        assert state[0].shape == (1, KV_HEADS, 8, SIZE)


def _shape(name: str, output: str, **bounds: int) -> list[onnx.NodeProto]:
    """Nodes writing ``extra`` (float) from a ``Shape`` of ``name`` (``bounds``: its start and end)."""
    return [
        helper.make_node("Shape", [name], ["dims"], **bounds),
        helper.make_node("Cast", ["dims"], [output], to=FLOAT),
    ]


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: grown_cache(causal=0), id="not causal"),
        pytest.param(
            lambda: grown_cache(extra=_shape(CACHE.past_key, "extra", start=2, end=3)), id="past length"
        ),
        pytest.param(lambda: grown_cache(extra=_shape("copy_key", "extra")), id="past shape"),
        pytest.param(
            lambda: grown_cache(extra=_shape(CACHE.present_key, "extra", start=2)), id="present length"
        ),
        pytest.param(
            lambda: grown_cache(extra=[helper.make_node("ReduceSum", [CACHE.past_value], ["extra"])]),
            id="past read",
        ),
    ],
)
def test_a_cache_read_otherwise_keeps_growing(model):
    """In a shared buffer the sequence axis is the buffer's length and its tail is stale: a graph that
    reads either, or attends otherwise, is left as it is."""
    graph = model()
    before = graph.SerializeToString()
    assert share_kv_buffers(graph, [CACHE], "past_length", "input_ids") is None
    assert graph.SerializeToString() == before


def test_a_shape_of_the_batch_reads_the_buffer():
    """A Shape of the dims before the sequence axis (the batch, as torch.export reads it off the cache)
    stays, reading the graph input."""
    shared = share_kv_buffers(
        grown_cache(extra=_shape("copy_key", "extra", start=0, end=1)), [CACHE], "past_length", "input_ids"
    )
    assert shared is not None
    assert [list(n.input) for n in shared.graph.node if n.op_type == "Shape" and n.output[0] == "dims"] == [
        [CACHE.past_key]
    ]


def test_a_decode_graph_whose_attention_was_inlined_cannot_keep_a_shared_buffer(serve_export):
    """Laying genai.onnx out again (``attnx optimize``) from a decode graph whose attention nodes a tool
    inlined cannot keep the buffer the manifest says genai shares: one line, naming the way out."""
    out = serve_export("softmax")
    export = ExportDir.open(out)
    held = export.manifest.genai
    assert held.shared_kv
    decode = onnx.load(str(out / "decode.onnx"))
    inlined = onnx.inliner.inline_local_functions(decode)
    with pytest.raises(AttnxError, match="no longer take the buffer"):
        DECODERS["genai"].layout(inlined, export.manifest.decode, held=held, ops=export.ops())
    laid_out = DECODERS["genai"].layout(decode, export.manifest.decode, held=held, ops=export.ops())
    assert {n.op_type for n in laid_out.graph.node} >= {"ScatterND", "If"}
