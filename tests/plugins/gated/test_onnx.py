"""The portable ONNX bodies of attnx::GatedDeltaRule(Step) in ONNX Runtime against the torch ops.

Every case of the torch op's table (tests/plugins/gated/test_op.py: lengths on every side of a chunk
boundary, grouped heads, dk != dv, scalar and per-key decay, both rules, with and without a state) runs as
a one-node model in each lowering; then decoding step by step, strong decay, half precision (fp16 inputs,
and fp16 models made by the usual converters), and the rules the bodies keep for those converters.
"""

from __future__ import annotations

import dataclasses

import onnx
import onnxruntime
import pytest
import torch

from attnx.exporter.lowering import function_protos, lower
from attnx.exporter.signature import dynamic_shapes
from attnx.exporter.trace import export_onnx
from attnx.models.spec import TensorSpec
from attnx.plugins.gated._ort import ORT_GATED_DELTA_NET_BODIES, ORT_LINEAR_ATTENTION_BODIES
from attnx.plugins.gated.op import (
    GATED_DELTA_RULE_OP,
    GATED_DELTA_RULE_STEP_OP,
    gated_delta_rule,
    gated_delta_rule_step,
    naive_gated_delta_rule,
)
from attnx.plugins.linear.kernel import LINEAR_OP, LINEAR_STEP_OP
from attnx.plugins.linear.ort import LINEAR_ORT_BODIES
from attnx.testing.checks.fp16_convert import converters
from attnx.testing.onnx_op import node_model
from tests.plugins import op_harness as harness
from tests.plugins.gated.cases import NARROW_AND_WIDE, SCALE, Shape, draw
from tests.plugins.gated.test_op import cases
from tests.plugins.test_dtype_generic import float_literals, nodes

TOLERANCE = {"atol": 2e-5, "rtol": 1e-4}


def onnx_step(shape: Shape, inputs, lowering: str, chunk: int | None = None):
    """(out, state') of GatedDeltaRuleStep's one-node model in ONNX Runtime."""
    q, k, v, g, beta, state = inputs
    args = (q, k, v, g, beta, state, shape.delta, SCALE, chunk or shape.chunk)
    call = harness.op_call(GATED_DELTA_RULE_STEP_OP, *args)
    return [
        torch.from_numpy(t)
        for t in harness.op_session(GATED_DELTA_RULE_STEP_OP, call, lowering).run(call.bound())
    ]


@pytest.mark.parametrize("lowering", ["function", "decomposed"])
@pytest.mark.parametrize("shape", cases(), ids=str)
def test_bodies_match_the_torch_op(shape, lowering):
    inputs = draw(shape, seed=shape.n * 11 + shape.dv)
    q, k, v, g, beta, state = inputs
    expected_out, expected_state = gated_delta_rule_step(*inputs, shape.delta, SCALE, shape.chunk)
    out, grown = onnx_step(shape, inputs, lowering)
    torch.testing.assert_close(out, expected_out, **TOLERANCE)
    torch.testing.assert_close(grown, expected_state, **TOLERANCE)
    if state is None:
        full = harness.run_onnx(
            GATED_DELTA_RULE_OP, q, k, v, g, beta, shape.delta, SCALE, shape.chunk, lowering=lowering
        )
        torch.testing.assert_close(full, expected_out, **TOLERANCE)


@pytest.mark.parametrize("shape", [s for s in cases() if not s.state][::3], ids=str)
def test_plugin_lowering_runs_the_op_on_attnx_kernels(shape):
    """The bare node through attnx's ONNX Runtime CPU kernels (the path of a plugin-lowered export)."""
    q, k, v, g, beta, _ = draw(shape, seed=shape.n)
    args = (q, k, v, g, beta, shape.delta, SCALE, shape.chunk)
    expected = gated_delta_rule(*args)
    torch.testing.assert_close(
        harness.run_onnx(GATED_DELTA_RULE_OP, *args, lowering="plugin"), expected, **TOLERANCE
    )


@pytest.mark.parametrize("chunk", [1, 7, 48], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
def test_any_chunk_size(per_key, chunk):
    """Chunk sizes that are no power of two (per-key: rounded up to a multiple of the block length) or 1."""
    shape = Shape(1, 2, 4, 53, 8, 6, per_key, True, chunk, state=True)
    inputs = draw(shape, seed=chunk)
    expected_out, expected_state = naive_gated_delta_rule(*inputs, True, SCALE)
    out, grown = onnx_step(shape, inputs, "function")
    torch.testing.assert_close(out.double(), expected_out, **TOLERANCE)
    torch.testing.assert_close(grown.double(), expected_state, **TOLERANCE)


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
def test_decoding_token_by_token(per_key):
    """A prompt of 9 tokens, then one token at a time through the step body, each after the state the
    last returned: the outputs of one torch call over all tokens."""
    shape = Shape(2, 2, 4, 14, 8, 4, per_key, True, 8)
    q, k, v, g, beta, _ = draw(shape, seed=14)
    expected = gated_delta_rule(q, k, v, g, beta, True, SCALE, 8)
    state, outs = None, []
    for a, b in [(0, 9), *((t, t + 1) for t in range(9, 14))]:
        piece = [t[:, :, a:b] for t in (q, k, v, g, beta)]
        out, state = onnx_step(shape, (*piece, state), "function")
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), expected, **TOLERANCE)


@pytest.mark.parametrize("dv", NARROW_AND_WIDE, ids=["narrow", "wide"])
@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
@pytest.mark.parametrize("delta", [False, True], ids=["additive", "delta"])
def test_strong_decay(delta, per_key, dv):
    shape = Shape(1, 1, 2, 45, 6, dv, per_key, delta, 16, state=True)
    q, k, v, g, beta, state = draw(shape, seed=30)
    g = torch.full_like(g, -30.0)
    if per_key:
        g[..., ::2] = -1e-3
    expected_out, expected_state = naive_gated_delta_rule(q, k, v, g, beta, state, delta, SCALE)
    out, grown = onnx_step(shape, (q, k, v, g, beta, state), "decomposed")
    assert torch.isfinite(out).all() and torch.isfinite(grown).all()
    torch.testing.assert_close(out.double(), expected_out, **TOLERANCE)
    torch.testing.assert_close(grown.double(), expected_state, **TOLERANCE)


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
def test_keys_aligned_within_a_chunk(per_key):
    """Keys pointing almost the same way, beta near 1, little decay (as in trained models): (I + A)^-1 is
    small but the powers of A are not (binom(C, C/2) at C = 32), so the body's inverse must not use them."""
    shape = Shape(1, 1, 2, 70, 8, 4, per_key, True, 32, state=True)
    q, k, v, g, beta, state = draw(shape, seed=70, decay=0.01)
    noise = torch.randn(k.shape, generator=torch.Generator().manual_seed(71))
    k = torch.nn.functional.normalize(1 + 0.3 * noise, dim=-1)
    beta = torch.full_like(beta, 0.95)
    expected_out, expected_state = naive_gated_delta_rule(q, k, v, g, beta, state, True, SCALE)
    out, grown = onnx_step(shape, (q, k, v, g, beta, state), "function")
    torch.testing.assert_close(out.double(), expected_out, **TOLERANCE)
    torch.testing.assert_close(grown.double(), expected_state, **TOLERANCE)


@pytest.mark.parametrize("dv", NARROW_AND_WIDE, ids=["narrow", "wide"])
@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
@pytest.mark.parametrize("delta", [False, True], ids=["additive", "delta"])
def test_fp16_inputs(delta, per_key, dv):
    """fp16 q, k, v, g, beta: the output is fp16, the state float32, both within fp16 rounding of the
    float64 recurrence, as the torch op's (the body widens to float32 as the torch op does)."""
    shape = Shape(1, 2, 4, 77, 16, dv, per_key, delta, 32, state=True)
    inputs = draw(shape, seed=77, dtype=torch.float16)
    expected_out, expected_state = naive_gated_delta_rule(*inputs, delta, SCALE)
    for out, grown in (
        onnx_step(shape, inputs, "function"),
        gated_delta_rule_step(*inputs, delta, SCALE, 32),
    ):
        assert out.dtype == torch.float16 and grown.dtype == torch.float32
        torch.testing.assert_close(out.double(), expected_out, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(grown.double(), expected_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
def test_fp16_body_in_the_reference_evaluator(per_key):
    """The body op by op in onnx's reference evaluator (fp16 inputs; it widens them) as in ONNX Runtime: the
    inverse's Loop, whose cond input is omitted, runs its levels (onnx 1.23.2's own Loop ran none, 0.25 off;
    tests/plugins/op_harness.py's Loop)."""
    shape = Shape(1, 2, 4, 45, 16, 8, per_key, True, 16)
    q, k, v, g, beta, _ = draw(shape, seed=45, dtype=torch.float16)
    expected, _ = naive_gated_delta_rule(q, k, v, g, beta, None, True, SCALE)
    results = harness.fp16_results(GATED_DELTA_RULE_OP, q, k, v, g, beta, True, SCALE, 16)
    harness.assert_fp16_close(results, expected)


@pytest.mark.filterwarnings("ignore:the float32 number -inf will be truncated")  # to -1e4: exp gives 0 still
@pytest.mark.parametrize("lowering", ["function", "decomposed"])
@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
@pytest.mark.parametrize("delta", [False, True], ids=["additive", "delta"])
@pytest.mark.parametrize("dv", [9, 1], ids=["chunked", "narrow"])
def test_fp16_converted_models_run(dv, delta, per_key, lowering):
    """A float32 one-node model converted to fp16 by each installed converter loads and computes the
    recurrence to fp16 accuracy (decomposed: in fp16 throughout, Scan and Loop bodies included), in chunks
    and (the additive rule on values of width 1) token by token."""
    shape = Shape(1, 2, 4, 37, 8, dv, per_key, delta, 16)
    q, k, v, g, beta, _ = draw(shape, seed=37)
    expected, _ = naive_gated_delta_rule(q, k, v, g, beta, None, delta, SCALE)
    call = harness.op_call(GATED_DELTA_RULE_OP, q, k, v, g, beta, delta, SCALE, 16)
    model = lower(node_model(GATED_DELTA_RULE_OP, call), [GATED_DELTA_RULE_OP], lowering)
    found = converters()
    assert found, "the dev extra installs both fp16 converters"
    for name, convert in found.items():
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(
            convert(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feed = {i.name: call.bound()[i.name].half().numpy() for i in session.get_inputs()}
        (out,) = session.run(None, feed)
        assert out.dtype == "float16", name
        torch.testing.assert_close(torch.from_numpy(out).double(), expected, atol=1e-2, rtol=1e-2, msg=name)


ORT_TARGETS = {
    "GatedDeltaNet": ORT_GATED_DELTA_NET_BODIES,
    "LinearAttention": ORT_LINEAR_ATTENTION_BODIES | LINEAR_ORT_BODIES,
}
BODY_OPS = [pytest.param(op, id=op.name) for op in (GATED_DELTA_RULE_OP, GATED_DELTA_RULE_STEP_OP)] + [
    pytest.param(dataclasses.replace(op, bodies=bodies[op.name]), id=f"{kernel}-{op.name}")
    for kernel, bodies in ORT_TARGETS.items()
    for op in (GATED_DELTA_RULE_OP, GATED_DELTA_RULE_STEP_OP, LINEAR_OP, LINEAR_STEP_OP)
    if op.name in bodies
]


@pytest.mark.parametrize("op", BODY_OPS)
def test_bodies_make_floats_only_through_castlike(op):
    assert float_literals(op) == []


CONVERTER_WRAPPED = {"CumSum", "Min", "Max", "Range"}  # fp16 converters put Casts around these


def test_loop_and_branch_bodies_hold_no_op_that_converters_wrap_in_casts():
    """ONNX Runtime's fp16 converter misplaces the Casts it puts around CumSum, Min, Max inside a subgraph
    (docs/variants/linear.md), so the Scan, Loop and If bodies must hold none."""
    for body in (*GATED_DELTA_RULE_OP.bodies, *GATED_DELTA_RULE_STEP_OP.bodies):
        for function in function_protos(body):
            for node in function.node:
                for attribute in node.attribute:
                    if attribute.type == onnx.AttributeProto.GRAPH:
                        inside = {n.op_type for n in nodes(list(attribute.g.node))}
                        assert not inside & CONVERTER_WRAPPED, (function.name, node.op_type, inside)


class Layer(torch.nn.Module):
    """Calls all three overloads: the full op, the step after a state and the step from none."""

    def forward(self, q, k, v, g, beta, state):
        out, grown = gated_delta_rule_step(q, k, v, g, beta, state, True, SCALE, 8)
        first, _ = gated_delta_rule_step(q, k, v, g, beta, None, False, SCALE, 8)
        return out + first + gated_delta_rule(q, k, v, g, beta, True, SCALE, 8), grown


@pytest.mark.parametrize("lowering", ["function", "decomposed"])
def test_a_module_exports_through_the_translations(lowering):
    """torch.onnx export with attnx's derived translations: one attnx:: node per call (the stateless step
    with its state input omitted), lowered onto the bodies, at two lengths of the dynamic sequence axis."""
    ops = [GATED_DELTA_RULE_OP, GATED_DELTA_RULE_STEP_OP]
    axes = {"q": ("batch", 2, "n", 6), "k": ("batch", 2, "n", 6), "v": ("batch", 4, "n", 5)}
    axes |= {"g": ("batch", 4, "n", 6), "beta": ("batch", 4, "n"), "state": ("batch", 4, 6, 5)}
    inputs = [TensorSpec(name, "float32", shape) for name, shape in axes.items()]
    outputs = [TensorSpec("out", "float32", ("batch", 4, "n", 5)), TensorSpec("grown", "float32", (4, 6, 5))]
    shape = Shape(2, 2, 4, 11, 6, 5, True, True, 8, state=True)
    example = draw(shape, seed=11)
    proto = export_onnx(Layer(), example, ops, 18, inputs, outputs, dynamic_shapes(inputs))
    nodes_by_type = [
        (n.op_type, len([i for i in n.input if i])) for n in proto.graph.node if n.domain == "attnx"
    ]
    assert sorted(nodes_by_type) == [
        ("GatedDeltaRule", 5),
        ("GatedDeltaRuleStep", 5),
        ("GatedDeltaRuleStep", 6),
    ]
    model = lower(proto, ops, lowering)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (11, 30):
        values = draw(dataclasses.replace(shape, n=n), seed=n)
        found = session.run(None, {spec.name: t.numpy() for spec, t in zip(inputs, values, strict=True)})
        for result, expected in zip(found, Layer()(*values), strict=True):
            torch.testing.assert_close(torch.from_numpy(result), expected, **TOLERANCE)


@pytest.mark.parametrize("delta", [True, False], ids=["delta", "additive"])
def test_onnx_runtime_reloads_the_graph_it_saves(delta, tmp_path):
    """ONNX Runtime names a function's inlined values after the function alone: a body that inlines one
    function both outside its ``If`` and in a branch saves an optimised graph that ONNX Runtime refuses
    to load (one name defined in two scopes). The saved step graph loads and computes the step."""
    shape = Shape(hk=2, hv=4, n=3, state=True, delta=delta)
    inputs = draw(shape, seed=7)
    call = harness.op_call(GATED_DELTA_RULE_STEP_OP, *inputs, delta, SCALE, shape.chunk)
    model = lower(node_model(GATED_DELTA_RULE_STEP_OP, call), [GATED_DELTA_RULE_STEP_OP], "function")
    saved = tmp_path / "optimized.onnx"
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(saved)
    onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    reloaded = onnxruntime.InferenceSession(str(saved), providers=["CPUExecutionProvider"])
    feed = {i.name: call.bound()[i.name].numpy() for i in reloaded.get_inputs()}
    out, grown = reloaded.run(None, feed)
    expected_out, expected_state = gated_delta_rule_step(*inputs, delta, SCALE, shape.chunk)
    torch.testing.assert_close(torch.from_numpy(out), expected_out, **TOLERANCE)
    torch.testing.assert_close(torch.from_numpy(grown), expected_state, **TOLERANCE)
