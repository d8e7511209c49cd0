"""The bodies on ONNX Runtime's kernels (com.microsoft GatedDeltaNet / LinearAttention / GroupQueryAttention /
MultiHeadAttention) against the torch ops.

attnx/plugins/gated/_ort.py maps attnx::GatedDeltaRule(Step) onto the first two, attnx/plugins/linear/ort.py
the ``linear`` variant's causal attention onto LinearAttention's "linear" rule, attnx/plugins/softmax/ort.py
softmax attention onto GroupQueryAttention (no cache) and MultiHeadAttention (a decode step). Each runs
as a one-node model whose node is served by that body (function and decomposed), against the torch op on
the same inputs.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import onnx
import onnxruntime
import pytest
import torch
from onnx import helper

from attnx.exporter.lowering import lower
from attnx.ops import AttentionOp
from attnx.plugins.gated._ort import ORT_BODIES, ORT_GATED_DELTA_NET_BODIES, ORT_LINEAR_ATTENTION_BODIES
from attnx.plugins.gated.op import GATED_DELTA_RULE_OP, GATED_DELTA_RULE_STEP_OP, gated_delta_rule_step
from attnx.plugins.linear.kernel import LINEAR_OP, LINEAR_STEP_OP, linear_attention, linear_attention_step
from attnx.plugins.linear.ort import LINEAR_ORT_BODIES
from attnx.plugins.softmax.kernel import SOFTMAX_OP, softmax_attention
from attnx.targets import PORTABLE
from attnx.testing.onnx_op import node_model
from tests.plugins import op_harness as harness
from tests.plugins.gated.cases import SCALE, Shape, draw

TOLERANCE = {"atol": 2e-5, "rtol": 1e-4}
KERNELS = {"GatedDeltaNet": ORT_GATED_DELTA_NET_BODIES, "LinearAttention": ORT_LINEAR_ATTENTION_BODIES}


def with_bodies(op: AttentionOp, bodies: dict) -> AttentionOp:
    return dataclasses.replace(op, bodies=bodies[op.name])


def run(
    op: AttentionOp,
    lowering: str,
    *args,
    ran: set[str] | None = None,
    target: str = PORTABLE,
    declared: bool = False,
    optimized: Path | None = None,
) -> list[torch.Tensor]:
    """``op(*args)`` as a one-node model lowered with ``op``'s bodies (``target``'s where it declares them);
    the model imports com.microsoft. ``declared``: the graph declares its inputs' and outputs' dims (else
    only their ranks). ``ran``: filled with the op types of the kernels ONNX Runtime ran (from its
    profile); ``optimized``: where ONNX Runtime writes the graph it runs."""
    call = harness.op_call(op, *args)
    model = node_model(op, call)
    node, taken = model.graph.node[0], {value.name for value in model.graph.input}
    renamed = {name: f"{name}_out" for name in node.output if name in taken}  # linear's step: S, Z in and out
    node.output[:] = [renamed.get(name, name) for name in node.output]
    for value in model.graph.output:
        value.name = renamed.get(value.name, value.name)
    if declared:
        tensors = {
            **call.bound(),
            **dict(zip((v.name for v in model.graph.output), call.outputs, strict=True)),
        }
        for value in (*model.graph.input, *model.graph.output):
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, tensors[value.name].shape, strict=True):
                dim.dim_value = size
    model = lower(model, [op], lowering, target=target)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.checker.check_model(model)  # the kernels have no onnx schema: no full (shape-inferring) check
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    with tempfile.TemporaryDirectory() as folder:  # ORT names a profile by the time: one folder per call
        options.enable_profiling = ran is not None
        options.profile_file_prefix = str(Path(folder) / "profile")
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feed = {i.name: call.bound()[i.name].numpy() for i in session.get_inputs()}
        outputs = [torch.from_numpy(t) for t in session.run(None, feed)]
        if ran is not None:
            events = json.loads(Path(session.end_profiling()).read_text())
            ran.update(
                e["args"]["op_name"] for e in events if e.get("cat") == "Node" and "op_name" in e["args"]
            )
    return outputs


CASES = [
    Shape(2, 2, 4, 13, 6, 5, False, True, 8, state=True),
    Shape(2, 2, 4, 13, 6, 5, False, False, 8),
    Shape(1, 1, 3, 37, 4, 6, True, True, 16),
    Shape(1, 2, 2, 29, 8, 3, True, False, 16, state=True),
    Shape(1, 1, 1, 1, 4, 4, True, True, 16, state=True),  # a decoded token
]


@pytest.mark.parametrize("lowering", ["function", "decomposed"])
@pytest.mark.parametrize("shape", CASES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_bodies_match_the_torch_op(kernel, shape, lowering):
    inputs = draw(shape, seed=shape.n + 3)
    expected_out, expected_state = gated_delta_rule_step(*inputs, shape.delta, SCALE, shape.chunk)
    step = with_bodies(GATED_DELTA_RULE_STEP_OP, KERNELS[kernel])
    out, grown = run(step, lowering, *inputs, shape.delta, SCALE, shape.chunk)
    torch.testing.assert_close(out, expected_out, **TOLERANCE)
    torch.testing.assert_close(grown, expected_state, **TOLERANCE)
    if inputs[-1] is None:
        (full,) = run(
            with_bodies(GATED_DELTA_RULE_OP, KERNELS[kernel]), lowering, *inputs[:5], shape.delta, SCALE, 8
        )
        torch.testing.assert_close(full, expected_out, **TOLERANCE)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_scale_of_zero_gives_zeros(kernel):
    """Both kernels read scale = 0 as 1/sqrt(dk); attnx's op multiplies by it."""
    shape = Shape(1, 1, 2, 7, 4, 4, True, True, 8, state=True)
    inputs = draw(shape, seed=0)
    out, grown = run(
        with_bodies(GATED_DELTA_RULE_STEP_OP, KERNELS[kernel]), "function", *inputs, True, 0.0, 8
    )
    assert not out.any()
    torch.testing.assert_close(grown, gated_delta_rule_step(*inputs, True, 0.0, 8)[1], **TOLERANCE)


@pytest.mark.parametrize("kernel", KERNELS)
def test_fp16_inputs(kernel):
    shape = Shape(1, 2, 4, 40, 16, 8, True, True, 16, state=True)
    inputs = draw(shape, seed=40, dtype=torch.float16)
    expected_out, expected_state = gated_delta_rule_step(*inputs, True, SCALE, 16)
    out, grown = run(
        with_bodies(GATED_DELTA_RULE_STEP_OP, KERNELS[kernel]), "function", *inputs, True, SCALE, 16
    )
    assert out.dtype == torch.float16 and grown.dtype == torch.float32
    torch.testing.assert_close(out, expected_out, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(grown, expected_state, **TOLERANCE)


def test_ort_bodies_cover_both_ops_in_their_input_order():
    assert ORT_BODIES is ORT_LINEAR_ATTENTION_BODIES
    for bodies in KERNELS.values():
        for op in (GATED_DELTA_RULE_OP, GATED_DELTA_RULE_STEP_OP):
            found = [[p.name for p in body.function_ir.inputs] for body in bodies[op.name]]
            assert found[0] == op.input_names
            assert all(op.body_for(inputs) is not None for inputs in found)


# -- per call site: the heads as they are, where the model declares them ---------------------------------

SITED_CASES = [
    *CASES,
    Shape(1, 2, 4, 1, 8, 6, True, True, 16, state=True),  # two value heads per key head, one token
    Shape(2, 1, 3, 9, 4, 4, False, False, 8, state=True),
    Shape(1, 2, 2, 0, 4, 4, False, True, 8, state=True),  # no new token
]


def sited(model_functions: list[str]) -> bool:
    return "OrtSitedCore" in model_functions


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "ranks-only"])
@pytest.mark.parametrize("lowering", ["function", "decomposed"])
@pytest.mark.parametrize("shape", SITED_CASES, ids=str)
def test_the_ort_target_matches_the_torch_op_with_and_without_declared_dims(shape, lowering, declared):
    """With its inputs' dims declared, a node takes the kernel with its heads as they are (the site body);
    with only their ranks, heads as batch rows; both compute the op."""
    inputs = draw(shape, seed=shape.n + 11)
    expected_out, expected_state = gated_delta_rule_step(*inputs, shape.delta, SCALE, shape.chunk)
    step = GATED_DELTA_RULE_STEP_OP
    call = harness.op_call(step, *inputs, shape.delta, SCALE, shape.chunk)
    model = lower(node_model(step, call), [step], "function", target="ort")
    assert sited([f.name for f in model.functions]) is False  # ranks only: node_model declares no dims
    out, grown = run(
        step, lowering, *inputs, shape.delta, SCALE, shape.chunk, target="ort", declared=declared
    )
    torch.testing.assert_close(out, expected_out, **TOLERANCE)
    torch.testing.assert_close(grown, expected_state, **TOLERANCE)
    if inputs[-1] is None:
        rule = GATED_DELTA_RULE_OP
        (full,) = run(rule, lowering, *inputs[:5], shape.delta, SCALE, 8, target="ort", declared=declared)
        torch.testing.assert_close(full, expected_out, **TOLERANCE)


def test_declared_dims_bind_a_site_body_per_distinct_dims():
    """Two nodes of different heads get two overloads, each binding its own; a node with a dim missing keeps
    the heads-as-batch body."""
    step = GATED_DELTA_RULE_STEP_OP
    calls = [
        draw(Shape(1, hk, hv, 3, 4, 4, False, True, 8, state=True), seed=hv) for hk, hv in ((1, 2), (2, 2))
    ]
    nodes, inputs = [], []
    for index, arguments in enumerate((*calls, calls[0])):
        names = [f"{name}{index}" for name in step.input_names]
        nodes.append(
            helper.make_node(
                step.name,
                names,
                [f"out{index}", f"state{index}"],
                domain="attnx",
                delta=1,
                scale=SCALE,
                chunk_size=8,
            )
        )
        for name, tensor in zip(names, arguments, strict=True):
            dims = list(tensor.shape) if index < 2 else [None] * tensor.dim()
            inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims))
    outputs = [
        helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for n in nodes for o in n.output
    ]
    graph = helper.make_graph(nodes, "three", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("attnx", 1)]
    )
    model = lower(model, [step], "function", target="ort")
    assert [n.overload for n in model.graph.node if n.domain == "attnx"] == [
        "q_heads1_dk4_v_heads2_dv4_dg1",
        "q_heads2_dk4_v_heads2_dv4_dg1",
        "",
    ]
    assert sorted(f.overload for f in model.functions if f.name == step.name) == [
        "",
        "q_heads1_dk4_v_heads2_dv4_dg1",
        "q_heads2_dk4_v_heads2_dv4_dg1",
    ]


def test_the_site_body_state_is_the_kernels_output(tmp_path):
    """In the graph ONNX Runtime runs, the new state comes out of LinearAttention itself, which writes a
    buffer bound to it (onnxruntime-genai binds the state's input and output to one): no copy after it."""
    shape = Shape(1, 2, 4, 1, 8, 8, False, True, 16, state=True)
    inputs = draw(shape, seed=5)
    for declared, copied in ((True, False), (False, True)):
        path = tmp_path / f"{declared}.onnx"
        run(
            GATED_DELTA_RULE_STEP_OP,
            "function",
            *inputs,
            True,
            SCALE,
            16,
            target="ort",
            declared=declared,
            optimized=path,
        )
        graph = onnx.load(path).graph
        (writer,) = [node for node in graph.node if "new_state" in node.output]
        assert (writer.op_type != "LinearAttention") is copied, writer.op_type


# -- the linear variant on LinearAttention's "linear" rule -----------------------------------------------


@pytest.mark.parametrize("lowering", ["function", "decomposed"])
@pytest.mark.parametrize(("causal", "mask_kind"), [(True, "none"), (True, "prefix"), (False, "scattered")])
def test_linear_variant_on_the_kernel(causal, mask_kind, lowering):
    q, k, v, gen = harness.random_qkv(2, 3, 19, 19, 8, seed=19)
    mask = harness.padding_mask(mask_kind, 2, 19, gen)
    expected = linear_attention(q, k, v, mask, causal, 1e-6, 8)
    (out,) = run(with_bodies(LINEAR_OP, LINEAR_ORT_BODIES), lowering, q, k, v, mask, causal, 1e-6, 8)
    torch.testing.assert_close(out, expected, **TOLERANCE)


@pytest.mark.parametrize("with_state", [False, True], ids=["prompt", "state"])
def test_linear_variant_step_on_the_kernel(with_state):
    q, k, v, gen = harness.random_qkv(2, 3, 6, 6, 8, seed=6)
    state = (
        (torch.rand(2, 3, 8, 8, generator=gen), torch.rand(2, 3, 8, generator=gen))
        if with_state
        else (None, None)
    )
    expected = linear_attention_step(q, k, v, *state, 1e-6, 8)
    found = run(with_bodies(LINEAR_STEP_OP, LINEAR_ORT_BODIES), "function", q, k, v, *state, 1e-6, 8)
    for out, want in zip(found, expected, strict=True):
        torch.testing.assert_close(out, want, **TOLERANCE)


# -- softmax attention on GroupQueryAttention ------------------------------------------------------------

SOFTMAX_ORT = dataclasses.replace(SOFTMAX_OP, bodies=SOFTMAX_OP.targets["ort"].bodies)


GQA, MHA = "GroupQueryAttention", "MultiHeadAttention"


@pytest.mark.parametrize("lowering", ["function", "decomposed"])
@pytest.mark.parametrize(
    ("n", "m", "dv", "causal", "scale", "kernel"),
    [
        (37, 37, 8, True, 0.3, GQA),  # a prefill: odd length
        (64, 64, 8, True, 0.125, GQA),
        (19, 19, 8, False, 0.3, GQA),  # an encoder
        (1, 1, 8, True, 0.3, GQA),  # a one-token prefill
        (1, 23, 8, True, 0.3, MHA),  # a decode step: one query against the cache (bottom-right: all keys)
        (1, 70, 8, False, 0.3, MHA),
        (5, 23, 8, True, 0.3, None),  # several queries after cached keys: the portable body
        (17, 17, 6, True, 0.3, None),  # values narrower than keys
        (1, 23, 6, True, 0.3, None),
        (9, 9, 8, True, 0.0, None),  # scale 0: the kernels would read it as 1/sqrt(d)
        (1, 9, 8, True, 0.0, None),
    ],
)
def test_softmax_on_onnxruntime_attention_kernels(n, m, dv, causal, scale, kernel, lowering):
    q, k, v, gen = harness.random_qkv(2, 3, n, m, 8, seed=n + m)
    v = torch.randn(2, 3, m, dv, generator=gen)
    expected = softmax_attention(q, k, v, None, causal, scale)
    ran: set[str] = set()
    (out,) = run(SOFTMAX_ORT, lowering, q, k, v, None, causal, scale, ran=ran)
    torch.testing.assert_close(out, expected, **TOLERANCE)
    assert {kernel} - {None} == ran & {GQA, MHA}, sorted(ran)


@pytest.mark.parametrize(("n", "m", "kernel"), [(1, 29, MHA), (11, 11, GQA), (3, 29, None)])
def test_grouped_query_heads_on_the_kernels(n, m, kernel):
    """6 query heads on 2 key/value heads: query head i reads key/value head i // 3 (HF's repeat_kv)."""
    gen = torch.Generator().manual_seed(n + m)
    q = torch.randn(2, 6, n, 8, generator=gen)
    k, v = (torch.randn(2, 2, m, 8, generator=gen) for _ in range(2))
    expected = softmax_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), None, True, 0.3)
    ran: set[str] = set()
    (out,) = run(SOFTMAX_ORT, "function", q, k, v, None, True, 0.3, ran=ran)
    torch.testing.assert_close(out, expected, **TOLERANCE)
    assert {kernel} - {None} == ran & {GQA, MHA}, sorted(ran)


@pytest.mark.parametrize(("n", "kernel"), [(40, GQA), (1, MHA)])
def test_softmax_on_the_kernels_in_fp16(n, kernel):
    q, k, v, _ = harness.random_qkv(1, 2, n, 40, 16, seed=40, dtype=torch.float16)
    expected = softmax_attention(q.float(), k.float(), v.float(), None, True, 0.25)
    ran: set[str] = set()
    (out,) = run(SOFTMAX_ORT, "function", q, k, v, None, True, 0.25, ran=ran)
    assert out.dtype == torch.float16 and kernel in ran
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("causal", [True, False])
def test_softmax_with_key_padding_keeps_the_portable_body(causal):
    q, k, v, gen = harness.random_qkv(2, 3, 13, 13, 8, seed=13)
    mask = harness.padding_mask("scattered", 2, 13, gen)
    ran: set[str] = set()
    (out,) = run(SOFTMAX_ORT, "function", q, k, v, mask, causal, 0.3, ran=ran)
    torch.testing.assert_close(out, softmax_attention(q, k, v, mask, causal, 0.3), **TOLERANCE)
    assert not ran & {GQA, MHA}
