"""The bodies on the standard ``LinearAttention`` of opset 27 (attnx/plugins/gated/_standard.py) against the
torch op: every case of the op's table (lengths on every side of a chunk boundary, grouped heads, dk != dv,
scalar and per-key decay, both rules, with and without a state) as a one-node model at opset 27 in ONNX
Runtime, then decoding token by token, fp16 inputs, a scale of 0, and which body an export picks."""

from __future__ import annotations

import pytest
import torch

from attnx.exporter.lowering import lower
from attnx.ops import AttentionOp
from attnx.plugins.gated.op import GATED_DELTA_RULE_OP, GATED_DELTA_RULE_STEP_OP, gated_delta_rule_step
from attnx.testing.onnx_op import node_model
from tests.plugins import op_harness as harness
from tests.plugins.gated.cases import SCALE, Shape, draw
from tests.plugins.gated.test_op import cases

TOLERANCE = {"atol": 2e-5, "rtol": 1e-4}
STANDARD = 27


def run27(op: AttentionOp, *args) -> list[torch.Tensor]:
    call = harness.op_call(op, *args)
    return [torch.from_numpy(t) for t in harness.op_session(op, call, "function", STANDARD).run(call.bound())]


@pytest.mark.parametrize("shape", cases(), ids=str)
def test_standard_bodies_match_the_torch_op(shape):
    inputs = draw(shape, seed=shape.n * 13 + shape.dv)
    expected_out, expected_state = gated_delta_rule_step(*inputs, shape.delta, SCALE, shape.chunk)
    out, grown = run27(GATED_DELTA_RULE_STEP_OP, *inputs, shape.delta, SCALE, shape.chunk)
    torch.testing.assert_close(out, expected_out, **TOLERANCE)
    torch.testing.assert_close(grown, expected_state, **TOLERANCE)
    if inputs[-1] is None:
        (full,) = run27(GATED_DELTA_RULE_OP, *inputs[:5], shape.delta, SCALE, shape.chunk)
        torch.testing.assert_close(full, expected_out, **TOLERANCE)


@pytest.mark.parametrize(
    "shape",
    [
        Shape(2, 2, 4, 13, 6, 5, True, True, 8, state=True),
        Shape(1, 1, 3, 17, 4, 6, False, False, 8),
        Shape(2, 1, 2, 9, 5, 3, True, False, 8, state=True),
    ],
    ids=str,
)
def test_onnx_reference_evaluator_runs_the_standard_bodies(shape):
    """A second runtime: onnx's reference evaluator (its numpy LinearAttention, not the function body
    ONNX Runtime expands) gives the torch op's output and state."""
    inputs = draw(shape, seed=shape.n)
    call = harness.op_call(GATED_DELTA_RULE_STEP_OP, *inputs, shape.delta, SCALE, 8)
    model = lower(
        node_model(GATED_DELTA_RULE_STEP_OP, call, STANDARD), [GATED_DELTA_RULE_STEP_OP], "function"
    )
    feed = {name: value.numpy() for name, value in call.bound().items() if isinstance(value, torch.Tensor)}
    found = harness.run_natively(model, feed)
    for got, want in zip(found, gated_delta_rule_step(*inputs, shape.delta, SCALE, 8), strict=True):
        torch.testing.assert_close(torch.from_numpy(got), want, **TOLERANCE)


@pytest.mark.parametrize("delta", [True, False], ids=["delta", "additive"])
def test_decoding_token_by_token_equals_the_whole_sequence(delta):
    """A prompt, then one token at a time with the state fed back: the outputs and the last state are the
    torch op's over the whole sequence."""
    shape = Shape(2, 2, 4, 21, 8, 6, False, delta, 8)
    q, k, v, g, beta, _ = draw(shape, seed=21)
    expected_out, expected_state = gated_delta_rule_step(q, k, v, g, beta, None, delta, SCALE, 8)
    part = lambda t, a, b: t[:, :, a:b]  # noqa: E731
    out, state = run27(
        GATED_DELTA_RULE_STEP_OP, *(part(t, 0, 13) for t in (q, k, v, g, beta)), None, delta, SCALE, 8
    )
    outs = [out]
    for i in range(13, 21):
        tokens = [part(t, i, i + 1) for t in (q, k, v, g, beta)]
        out, state = run27(GATED_DELTA_RULE_STEP_OP, *tokens, state, delta, SCALE, 8)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), expected_out, **TOLERANCE)
    torch.testing.assert_close(state, expected_state, **TOLERANCE)


def test_fp16_inputs_keep_a_float32_state():
    shape = Shape(1, 2, 4, 40, 16, 8, True, True, 16, state=True)
    inputs = draw(shape, seed=40, dtype=torch.float16)
    expected_out, expected_state = gated_delta_rule_step(*inputs, True, SCALE, 16)
    out, grown = run27(GATED_DELTA_RULE_STEP_OP, *inputs, True, SCALE, 16)
    assert out.dtype == torch.float16 and grown.dtype == torch.float32
    torch.testing.assert_close(out, expected_out, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(grown, expected_state, **TOLERANCE)


def test_a_scale_of_zero_gives_zeros():
    """The standard op reads scale = 0 as 1/sqrt(dk); attnx's op multiplies by it."""
    shape = Shape(1, 1, 2, 7, 4, 4, True, True, 8, state=True)
    inputs = draw(shape, seed=0)
    out, grown = run27(GATED_DELTA_RULE_STEP_OP, *inputs, True, 0.0, 8)
    assert not out.any()
    torch.testing.assert_close(grown, gated_delta_rule_step(*inputs, True, 0.0, 8)[1], **TOLERANCE)


@pytest.mark.parametrize(
    ("opset", "lowering", "standard"),
    [(27, "function", True), (26, "function", False), (18, "function", False), (27, "decomposed", False)],
)
def test_the_standard_op_serves_models_at_opset_27(opset, lowering, standard):
    """The function lowering at opset 27 holds the standard op (the seeded defect: a body list or opset
    policy that silently kept the portable body would pass every comparison above); below 27, and in the
    decomposed lowering (the oldest, primitive bodies), the portable body."""
    shape = Shape(1, 1, 2, 5, 4, 4, False, True, 8, state=True)
    for op in (GATED_DELTA_RULE_OP, GATED_DELTA_RULE_STEP_OP):
        inputs = draw(shape, seed=5)
        args = (*inputs, True, SCALE, 8) if op is GATED_DELTA_RULE_STEP_OP else (*inputs[:5], True, SCALE, 8)
        model = lower(node_model(op, harness.op_call(op, *args), opset), [op], lowering)
        assert bool(harness.standard_linear_attention_nodes(model)) == standard, (op.name, opset, lowering)
        assert not any(o.domain == "com.microsoft" for o in model.opset_import)
