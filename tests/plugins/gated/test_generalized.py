"""attnx::generalized_delta_rule(_step) (RWKV-7's diagonal-plus-low-rank rule) against a naive loop written
from the papers' value-major equations, S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T and
o_t = scale S_t q_t (S: d_v x d_k), and its ONNX bodies in ONNX Runtime against the torch op.

The default run keeps one quick test (:func:`test_op_and_its_onnx_body_match_the_equations`); the table
of shapes, the splits, the lowerings and the gradients are in the slow suite.
"""

from __future__ import annotations

import dataclasses

import onnx
import pytest
import torch
import torch.nn.functional as F

from attnx.exporter.lowering import function_protos
from attnx.plugins.gated.generalized import (
    GENERALIZED_DELTA_RULE_OP,
    GENERALIZED_DELTA_RULE_STEP_OP,
    generalized_delta_rule,
    generalized_delta_rule_step,
    run_generalized_rule,
)
from tests.plugins import op_harness as harness
from tests.plugins.gated.test_onnx import CONVERTER_WRAPPED
from tests.plugins.test_dtype_generic import float_literals, nodes

SCALE = 0.7
TOLERANCE = {"atol": 2e-5, "rtol": 1e-4}


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int = 1
    heads: int = 1
    n: int = 5
    dk: int = 4
    dv: int = 4
    state: bool = False

    def __str__(self) -> str:
        return f"{self.batch}x{self.heads}x{self.n}x{self.dk}/{self.dv}{'-state' if self.state else ''}"


def draw(shape: Shape, seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor | None, ...]:
    """q, k, v, w <= 0, a = -kk, b = kk * rate (RWKV-7's: kk unit, rate in (0, 1)) and a state (None unless
    ``shape.state``), drawn in float64 and cast to ``dtype`` (the state to float32 at least)."""
    gen = torch.Generator().manual_seed(seed)
    s = shape

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, dtype=torch.float64)

    keys = (s.batch, s.heads, s.n, s.dk)
    q, k, v = randn(*keys), randn(*keys), randn(s.batch, s.heads, s.n, s.dv)
    w = -0.6065 * torch.sigmoid(randn(*keys)) - F.softplus(randn(*keys))
    kk = F.normalize(randn(*keys), dim=-1)
    a, b = -kk, kk * torch.sigmoid(randn(*keys))
    state = randn(s.batch, s.heads, s.dk, s.dv) if s.state else None
    wide = torch.promote_types(dtype, torch.float32)
    return (*(t.to(dtype) for t in (q, k, v, w, a, b)), None if state is None else state.to(wide))


def naive(q, k, v, w, a, b, state, scale):
    """The equations in float64, value-major: returns the output and the final state as (d_k, d_v)."""
    q, k, v, w, a, b = (t.double() for t in (q, k, v, w, a, b))
    batch, heads, n, dk = q.shape
    s = torch.zeros(batch, heads, v.shape[-1], dk, dtype=torch.float64)
    if state is not None:
        s = state.double().transpose(-1, -2).clone()
    outs = []
    for t in range(n):
        transition = torch.diag_embed(w[:, :, t].exp()) + a[:, :, t, :, None] * b[:, :, t, None, :]
        s = torch.einsum("bhvi,bhij->bhvj", s, transition) + v[:, :, t, :, None] * k[:, :, t, None, :]
        outs.append(scale * torch.einsum("bhvk,bhk->bhv", s, q[:, :, t]))
    return torch.stack(outs, dim=2), s.transpose(-1, -2)


def onnx_step(inputs, lowering: str) -> list[torch.Tensor]:
    """(out, state') of GeneralizedDeltaRuleStep's one-node model in ONNX Runtime (None state: omitted)."""
    call = harness.op_call(GENERALIZED_DELTA_RULE_STEP_OP, *inputs, SCALE)
    session = harness.op_session(GENERALIZED_DELTA_RULE_STEP_OP, call, lowering)
    return [torch.from_numpy(t) for t in session.run(call.bound())]


def test_op_and_its_onnx_body_match_the_equations():
    """The default run's one test of the rule: 2 heads, dk != dv, 9 tokens after a state; the torch op and
    the step op's body (function lowering) against the naive loop."""
    inputs = draw(Shape(2, 2, 9, 4, 3, state=True), seed=1)
    expected_out, expected_state = naive(*inputs, SCALE)
    out, state = generalized_delta_rule_step(*inputs, SCALE)
    torch.testing.assert_close(out.double(), expected_out, **TOLERANCE)
    torch.testing.assert_close(state.double(), expected_state, **TOLERANCE)
    onnx_out, onnx_state = onnx_step(inputs, "function")
    torch.testing.assert_close(onnx_out, out, **TOLERANCE)
    torch.testing.assert_close(onnx_state, state, **TOLERANCE)


SHAPES = [
    Shape(1, 1, 1, 4, 4),
    Shape(1, 1, 2, 3, 5),
    Shape(2, 3, 7, 4, 6, state=True),
    Shape(1, 2, 17, 8, 8),
    Shape(2, 1, 33, 16, 8, state=True),
    Shape(1, 2, 64, 8, 16),
]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_op_matches_the_equations(shape):
    inputs = draw(shape, seed=shape.n * 7 + shape.dv)
    expected_out, expected_state = naive(*inputs, SCALE)
    out, state = generalized_delta_rule_step(*inputs, SCALE)
    torch.testing.assert_close(out.double(), expected_out, **TOLERANCE)
    torch.testing.assert_close(state.double(), expected_state, **TOLERANCE)
    if inputs[-1] is None:
        full = generalized_delta_rule(*inputs[:6], SCALE)
        torch.testing.assert_close(full.double(), expected_out, **TOLERANCE)


@pytest.mark.slow
def test_removal_reads_the_state_before_the_decay():
    """One token after a state by hand: exp(w) * S + b (a^T S) + k v^T, not the gated delta rule's removal
    from the decayed state, (I + b a^T) diag(exp(w)) S (the seeded defect differs)."""
    q, k, v, w, a, b, state = draw(Shape(1, 1, 1, 3, 2, state=True), seed=3)
    decay = w[0, 0, 0].exp()
    s0 = state[0, 0]
    by_hand = decay[:, None] * s0 + b[0, 0, 0, :, None] * (a[0, 0, 0] @ s0) + k[0, 0, 0, :, None] * v[0, 0, 0]
    decayed_first = decay[:, None] * s0
    defect = (
        decayed_first + b[0, 0, 0, :, None] * (a[0, 0, 0] @ decayed_first) + k[0, 0, 0, :, None] * v[0, 0, 0]
    )
    _, grown = generalized_delta_rule_step(q, k, v, w, a, b, state, SCALE)
    torch.testing.assert_close(grown[0, 0], by_hand)
    assert (grown[0, 0] - defect).abs().max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("split", [0, 1, 6, 12, 13])
def test_steps_continue_the_full_forward(split):
    """Any split of 13 tokens into a prefill and the rest (then single tokens) gives the full forward."""
    q, k, v, w, a, b, _ = draw(Shape(2, 2, 13, 4, 5), seed=split)
    full = generalized_delta_rule(q, k, v, w, a, b, SCALE)
    parts, state = [], None
    bounds = [0, split, *range(split + 1, 14)] if split < 13 else [0, 13]
    for start, end in zip(bounds, bounds[1:], strict=False):
        pieces = [t[:, :, start:end] for t in (q, k, v, w, a, b)]
        out, state = run_generalized_rule(*pieces, state, scale=SCALE, step=True)
        parts.append(out)
    torch.testing.assert_close(torch.cat(parts, dim=2), full, **TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("lowering", ["function", "decomposed"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bodies_match_the_torch_op(shape, lowering):
    inputs = draw(shape, seed=shape.n * 5 + shape.dk)
    expected_out, expected_state = generalized_delta_rule_step(*inputs, SCALE)
    out, state = onnx_step(inputs, lowering)
    torch.testing.assert_close(out, expected_out, **TOLERANCE)
    torch.testing.assert_close(state, expected_state, **TOLERANCE)
    if inputs[-1] is None:
        full = harness.run_onnx(GENERALIZED_DELTA_RULE_OP, *inputs[:6], SCALE, lowering=lowering)
        torch.testing.assert_close(full, expected_out, **TOLERANCE)


@pytest.mark.slow
def test_onnx_decoding_token_by_token_continues_the_prefill():
    """The step body fed its own state back one token at a time after a prefill of 5."""
    inputs = draw(Shape(1, 2, 9, 4, 4), seed=11)
    full = generalized_delta_rule(*inputs[:6], SCALE)
    outs, state = [], None
    for start, end in [(0, 5), *((t, t + 1) for t in range(5, 9))]:
        out, state = onnx_step([*(t[:, :, start:end] for t in inputs[:6]), state], "function")
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), full, **TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_inputs_recur_in_float32(dtype):
    inputs = draw(Shape(1, 2, 9, 4, 4, state=True), seed=2, dtype=dtype)
    out, state = generalized_delta_rule_step(*inputs, SCALE)
    assert out.dtype == dtype and state.dtype == torch.float32
    expected_out, expected_state = naive(*inputs, SCALE)
    torch.testing.assert_close(state.double(), expected_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), expected_out, atol=2e-2, rtol=1e-2)


@pytest.mark.slow
def test_bad_shapes_and_growing_decays_are_refused():
    q, k, v, w, a, b, _ = draw(Shape(1, 2, 5, 4, 3), seed=0)
    with pytest.raises(ValueError, match=r"a \(1, 2, 5, 3\) must have q's shape"):
        generalized_delta_rule(q, k, v, w, a[..., :3], b, SCALE)
    with pytest.raises(ValueError, match=r"v \(1, 2, 4, 3\) must be"):
        generalized_delta_rule(q, k, v[:, :, :4], w, a, b, SCALE)
    arguments = {"w": w.abs() + 0.5}
    assert "w (the log-decay) must be <= 0" in GENERALIZED_DELTA_RULE_OP.preconditions(arguments)
    assert GENERALIZED_DELTA_RULE_OP.preconditions({"w": w}) is None


@pytest.mark.slow
def test_ops_export_as_single_nodes_and_have_gradients():
    inputs = draw(Shape(1, 2, 5, 3, 2, state=True), seed=4, dtype=torch.float64)

    class Layer(torch.nn.Module):
        def forward(self, q, k, v, w, a, b, state):
            out, grown = generalized_delta_rule_step(q, k, v, w, a, b, state, SCALE)
            return generalized_delta_rule(q, k, v, w, a, b, SCALE) + out, grown

    program = torch.export.export(Layer(), tuple(t.float() for t in inputs))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count("attnx.generalized_delta_rule.default") == 1
    assert targets.count("attnx.generalized_delta_rule_step.default") == 1
    leaves = [t.requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(lambda *x: generalized_delta_rule_step(*x, SCALE), leaves, fast_mode=True)


@pytest.mark.slow
def test_bodies_stay_dtype_generic_for_fp16_converters():
    """Floats only through CastLike, and no op the converters wrap in Casts inside the Scan body (the
    gated bodies' rules, tests/plugins/gated/test_onnx.py)."""
    for op in (GENERALIZED_DELTA_RULE_OP, GENERALIZED_DELTA_RULE_STEP_OP):
        assert float_literals(op) == []
        for body in op.bodies:
            for function in function_protos(body):
                for node in function.node:
                    for attribute in node.attribute:
                        if attribute.type == onnx.AttributeProto.GRAPH:
                            inside = {n.op_type for n in nodes(list(attribute.g.node))}
                            assert not inside & CONVERTER_WRAPPED, (function.name, inside)
