"""The gated / delta-rule torch ops against the token-by-token recurrence (attnx/plugins/gated/op.py).

The reference ``naive_gated_delta_rule`` is itself checked against closed forms of the equations (the
additive rule as an explicit N x N sum, the delta rule's overwrite property), then the chunked ops against
it on fresh inputs: lengths on every side of a chunk boundary, grouped heads, dk != dv, scalar and per-key
decay, both rules, with and without a state, half precision, decays strong enough to underflow, gradients.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from attnx.plugins.gated.config import block_size, chunk_plan
from attnx.plugins.gated.op import (
    MAX_CHUNK_SIZE,
    default_chunk_size,
    gated_delta_rule,
    gated_delta_rule_step,
    naive_gated_delta_rule,
)
from tests.helpers import assert_unchanged
from tests.plugins.gated.cases import NARROW_AND_WIDE, SCALE, Shape, boundary_lengths, draw

# -- the reference, checked against closed forms ---------------------------------------------------------


def explicit_additive(q, k, v, g, beta, state, scale):
    """The additive rule unrolled: o_t = scale (sum_{j<=t} (q_t . (exp(G_t - G_j) * k_j)) beta_j v_j
    + (exp(G_t) * q_t)^T S_0), G the cumulated g, as an explicit (n, n, dk) sum in float64."""
    ratio = v.shape[1] // q.shape[1]
    q, k = (x.double().repeat_interleave(ratio, 1) for x in (q, k))
    cumulated = g.double().cumsum(2).expand(*v.shape[:3], q.shape[-1])  # (b, hv, n, dk)
    n = q.shape[2]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    decay = (cumulated[:, :, :, None] - cumulated[:, :, None, :]).masked_fill(
        ~causal[..., None], float("-inf")
    )
    scores = (q[:, :, :, None] * k[:, :, None] * decay.exp()).sum(-1)  # (b, hv, n, n)
    out = scores @ (beta.double()[..., None] * v.double())
    if state is not None:
        out = out + (q * cumulated.exp()) @ state.double()
    return scale * out


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
@pytest.mark.parametrize("with_state", [False, True], ids=["empty", "state"])
def test_reference_additive_rule_is_the_unrolled_sum(per_key, with_state):
    shape = Shape(batch=2, hk=2, hv=4, n=9, dk=3, dv=5, per_key=per_key, delta=False, state=with_state)
    q, k, v, g, beta, state = draw(shape, seed=1, dtype=torch.float64)
    out, _ = naive_gated_delta_rule(q, k, v, g, beta, state, False, SCALE)
    torch.testing.assert_close(out, explicit_additive(q, k, v, g, beta, state, SCALE))


def test_reference_delta_rule_overwrites_the_value_of_a_unit_key():
    """beta = 1, |k| = 1, no decay: once (k, v) is written the state answers v to the query k, whatever it
    held before."""
    shape = Shape(batch=2, hk=1, hv=2, n=6, dk=5, dv=3, state=True)
    q, k, v, g, beta, state = draw(shape, seed=2, dtype=torch.float64)
    q = k.clone()
    out, _ = naive_gated_delta_rule(q, k, v, g * 0, beta * 0 + 1, state, True, 1.0)
    torch.testing.assert_close(out, v)


def test_reference_delta_rule_first_token_by_hand():
    shape = Shape(batch=1, hk=1, hv=1, n=1, dk=3, dv=2, per_key=True, state=True)
    q, k, v, g, beta, state = draw(shape, seed=3, dtype=torch.float64)
    decayed = g[0, 0, 0].exp()[:, None] * state[0, 0]  # D S_0
    update = beta[0, 0, 0] * (v[0, 0, 0] - decayed.T @ k[0, 0, 0])
    grown = decayed + torch.outer(k[0, 0, 0], update)
    out, new_state = naive_gated_delta_rule(q, k, v, g, beta, state, True, SCALE)
    torch.testing.assert_close(new_state[0, 0], grown)
    torch.testing.assert_close(out[0, 0, 0], SCALE * grown.T @ q[0, 0, 0])


# -- the chunked op against the reference ----------------------------------------------------------------


def cases() -> list[Shape]:
    found = []
    for per_key, chunk in ((False, 8), (True, 16)):  # per-key: blocks of 4 inside chunks of 16
        for delta in (False, True):
            for n in boundary_lengths(chunk):
                found.append(Shape(2, 2, 4, n, 6, 9, per_key, delta, chunk, state=n % 2 == 1))
    found += [
        Shape(1, 1, 1, 130, 8, 8, False, True, 64),  # default-sized chunks, a padded last one
        Shape(1, 2, 2, 70, 8, 8, True, True, 64, state=True),  # per-key blocks of 8
        Shape(2, 1, 3, 23, 3, 9, True, False, 7, state=True),  # C = 7 -> 8 (blocks of 2), dk < dv
        Shape(1, 3, 6, 17, 5, 2, False, True, 1),  # one token per chunk
        Shape(1, 2, 2, 40, 4, 4, True, True, 48),  # one chunk of 40 < 48, blocks of 4
        # the additive rule token by token (values of at most TOKEN_MAX_VALUE_WIDTH): Mamba1's shape
        # (one value of width 1 per head, per-key decay, q/k shared by groups of heads), and the widest
        Shape(2, 2, 6, 37, 16, 1, True, False, 16, state=True),
        Shape(1, 1, 4, 130, 8, 8, True, False, 16),
        Shape(2, 1, 3, 1, 4, 1, False, False, 8, state=True),
        Shape(1, 2, 4, 19, 6, 2, False, False, 8),
    ]
    return found


@pytest.mark.parametrize("shape", cases(), ids=str)
def test_op_matches_the_recurrence(shape):
    q, k, v, g, beta, state = draw(shape, seed=shape.n * 7 + shape.dk)
    expected_out, expected_state = naive_gated_delta_rule(q, k, v, g, beta, state, shape.delta, SCALE)
    out, grown = gated_delta_rule_step(q, k, v, g, beta, state, shape.delta, SCALE, shape.chunk)
    assert out.dtype == torch.float32 and grown.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(grown.double(), expected_state, atol=2e-5, rtol=1e-4)
    if state is None:
        full = gated_delta_rule(q, k, v, g, beta, shape.delta, SCALE, shape.chunk)
        torch.testing.assert_close(full.double(), expected_out, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dv", NARROW_AND_WIDE, ids=["narrow", "wide"])
@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
@pytest.mark.parametrize("delta", [False, True], ids=["additive", "delta"])
def test_strong_decay_underflows_without_overflow(per_key, delta, dv):
    """g = -30 per token (and per key dimension, mixed with dimensions that barely decay): the naive
    exp(G_i) exp(-G_j) factorisation would overflow float32 after 3 tokens; the op stays exact (the
    additive rule both token by token and in chunks)."""
    shape = Shape(1, 1, 2, 45, 6, dv, per_key, delta, 16, state=True)
    q, k, v, g, beta, state = draw(shape, seed=30)
    g = torch.full_like(g, -30.0)
    if per_key:
        g[..., ::2] = -1e-3
    expected_out, expected_state = naive_gated_delta_rule(q, k, v, g, beta, state, delta, SCALE)
    out, grown = gated_delta_rule_step(q, k, v, g, beta, state, delta, SCALE, 16)
    assert torch.isfinite(out).all() and torch.isfinite(grown).all()
    torch.testing.assert_close(out.double(), expected_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(grown.double(), expected_state, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
def test_chunk_size_does_not_change_the_result(per_key):
    shape = Shape(1, 2, 4, 37, 8, 8, per_key, True)
    q, k, v, g, beta, _ = draw(shape, seed=37)
    results = [gated_delta_rule(q, k, v, g, beta, True, SCALE, c) for c in (1, 3, 8, 37, 64)]
    for result in results[1:]:
        torch.testing.assert_close(result, results[0], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per-key"])
def test_steps_continue_the_recurrence(per_key):
    """A prompt, then 3 tokens, then 1 at a time, each from the state the last returned, give the
    outputs and final state of one call."""
    shape = Shape(2, 2, 4, 25, 8, 6, per_key, True, 8)
    q, k, v, g, beta, _ = draw(shape, seed=25)
    full, final = gated_delta_rule_step(q, k, v, g, beta, None, True, SCALE, 8)
    state, outs = None, []
    for a, b in ((0, 19), (19, 22), (22, 23), (23, 24), (24, 25)):
        piece = [t[:, :, a:b] for t in (q, k, v, g, beta)]
        out, state = gated_delta_rule_step(*piece, state, True, SCALE, 8)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), full, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(state, final, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dv", NARROW_AND_WIDE, ids=["narrow", "wide"])
@pytest.mark.parametrize("delta", [False, True], ids=["additive", "delta"])
def test_a_token_with_no_decay_and_no_rate_is_a_no_op(delta, dv):
    """g = 0 and beta = 0 (a padded token; its k may be anything): the state passes through it unchanged."""
    shape = Shape(1, 2, 2, 12, 4, dv, True, delta, 4, state=True)
    q, k, v, g, beta, state = draw(shape, seed=12)
    padded = [5, 6, 11]
    g[:, :, padded], beta[:, :, padded] = 0.0, 0.0
    out, grown = gated_delta_rule_step(q, k, v, g, beta, state, delta, SCALE, 4)
    kept = [i for i in range(12) if i not in padded]
    dropped = [t[:, :, kept] for t in (q, k, v, g, beta)]
    out_without, grown_without = gated_delta_rule_step(*dropped, state, delta, SCALE, 4)
    assert_unchanged(grown, grown_without)
    assert_unchanged(out[:, :, kept], out_without)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_inputs_recur_in_float32(dtype):
    shape = Shape(1, 2, 4, 300, 16, 16, True, True, 32, state=True)
    q, k, v, g, beta, state = draw(shape, seed=16, dtype=dtype)
    out, grown = gated_delta_rule_step(q, k, v, g, beta, state, True, SCALE, 32)
    assert out.dtype == dtype and grown.dtype == torch.float32
    expected_out, expected_state = naive_gated_delta_rule(q, k, v, g, beta, state, True, SCALE)
    unit = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    torch.testing.assert_close(out.double(), expected_out, atol=4 * unit, rtol=4 * unit)
    torch.testing.assert_close(grown.double(), expected_state, atol=1e-5, rtol=1e-5)  # only inputs rounded


def test_block_and_chunk_lengths():
    assert [block_size(c) for c in (1, 3, 4, 15, 16, 48, 64, 100)] == [1, 1, 2, 2, 4, 4, 8, 8]
    assert chunk_plan(1, 64, per_key=False) == (1, 1)  # a decoded token is one chunk of 1
    assert chunk_plan(1, 64, per_key=True) == (1, 1)
    assert chunk_plan(1000, 64, per_key=True) == (64, 8)
    assert chunk_plan(1000, 7, per_key=True) == (8, 2)  # rounded up to a multiple of the blocks
    assert chunk_plan(5, 64, per_key=False) == (5, 1)
    assert chunk_plan(15, 64, per_key=True) == (16, 2)
    assert default_chunk_size(True, False) in (16, 32, 64)


def test_bad_shapes_are_refused():
    shape = Shape(1, 2, 4, 5, 4, 4)
    q, k, v, g, beta, _ = draw(shape, seed=0)
    with pytest.raises(ValueError, match="hv a multiple"):
        gated_delta_rule(q, k, v[:, :3], g[:, :3], beta[:, :3], True, SCALE, 8)
    with pytest.raises(ValueError, match="g .* must be"):
        gated_delta_rule(q, k, v, g.expand(-1, -1, -1, 3), beta, True, SCALE, 8)
    for chunk in (0, MAX_CHUNK_SIZE + 1):
        with pytest.raises(ValueError, match=f"chunk_size={chunk} must be in 1..{MAX_CHUNK_SIZE}"):
            gated_delta_rule(q, k, v, g, beta, True, SCALE, chunk)


# -- torch machinery: one node, trainable ----------------------------------------------------------------


def test_ops_export_as_single_nodes():
    shape = Shape(1, 2, 4, 7, 4, 3, True, True, 4, state=True)
    q, k, v, g, beta, state = draw(shape, seed=4)

    class Layer(torch.nn.Module):
        def forward(self, q, k, v, g, beta, state):
            out, grown = gated_delta_rule_step(q, k, v, g, beta, state, True, SCALE, 4)
            return gated_delta_rule(q, k, v, g, beta, False, SCALE, 4) + out, grown

    program = torch.export.export(Layer(), (q, k, v, g, beta, state))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count("attnx.gated_delta_rule.default") == 1
    assert targets.count("attnx.gated_delta_rule_step.default") == 1


GRADIENT_SHAPES = [
    Shape(1, 1, 2, 5, 3, 2, False, True, 2, state=True),
    Shape(1, 1, 1, 6, 2, 3, True, True, 4),
    Shape(2, 1, 2, 5, 3, 2, True, False, 3, state=True),
    Shape(1, 2, 2, 4, 2, 2, False, False, 8),
]


def leaves(shape: Shape, seed: int) -> list[torch.Tensor]:
    q, k, v, g, beta, state = draw(shape, seed=seed, dtype=torch.float64)
    return [t.requires_grad_() for t in (q, k, v, g, beta, *([state] if state is not None else []))]


def step_op(shape: Shape, *x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    state = x[5] if shape.state else None
    return gated_delta_rule_step(*x[:5], state, shape.delta, SCALE, shape.chunk)


@pytest.mark.parametrize(
    "fast", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["projected", "full-jacobian"]
)
@pytest.mark.parametrize("shape", GRADIENT_SHAPES, ids=str)
def test_gradcheck_in_float64(shape, fast):
    """gradcheck of both ops; by default along random projections (fast_mode), the whole Jacobian (tens of
    seconds each) in the slow suite."""
    inputs = leaves(shape, seed=5)
    assert torch.autograd.gradcheck(lambda *x: step_op(shape, *x), inputs, fast_mode=fast)
    assert torch.autograd.gradcheck(
        lambda *x: gated_delta_rule(*x[:5], shape.delta, SCALE, shape.chunk), inputs[:5], fast_mode=fast
    )


@pytest.mark.parametrize("shape", GRADIENT_SHAPES, ids=str)
def test_gradients_match_autograd_through_the_recurrence(shape):
    """The op's gradients (all inputs, both outputs) in float64 and float32 against autograd through
    the float64 token-by-token reference, on a longer sequence than gradcheck's."""
    shape = dataclasses.replace(shape, n=shape.n + 9)
    inputs = leaves(shape, seed=6)
    gen = torch.Generator().manual_seed(7)
    expected_out, expected_state = naive_gated_delta_rule(
        *inputs[:5], inputs[5] if shape.state else None, shape.delta, SCALE
    )
    cotangents = [
        torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (expected_out, expected_state)
    ]
    expected = torch.autograd.grad((expected_out, expected_state), inputs, cotangents)
    bound_scale = max(float(e.abs().max()) for e in expected)
    for dtype, rel in ((torch.float64, 1e-7), (torch.float32, 1e-4)):
        cast = [t.detach().to(dtype).requires_grad_() for t in inputs]
        outputs = step_op(shape, *cast)
        found = torch.autograd.grad(
            outputs, cast, [c.to(o.dtype) for c, o in zip(cotangents, outputs, strict=True)]
        )
        for index, (a, e) in enumerate(zip(found, expected, strict=True)):
            error = float((a.double() - e).abs().max())
            assert error <= rel * bound_scale, f"{dtype} input {index}: {error:.3g}"


def test_opcheck():
    shape = Shape(1, 2, 4, 6, 4, 3, True, True, 4, state=True)
    inputs = [t.float().detach().requires_grad_() for t in leaves(shape, seed=8)]
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    results = torch.library.opcheck(gated_delta_rule_step, (*inputs, True, SCALE, 4), test_utils=utils)
    assert set(results.values()) == {"SUCCESS"}, results
    results = torch.library.opcheck(gated_delta_rule, (*inputs[:5], False, SCALE, 4), test_utils=utils)
    assert set(results.values()) == {"SUCCESS"}, results


def test_keys_need_not_be_normalised_for_the_additive_rule():
    """The op uses q and k as given (normalising is the caller's job): scaling k by 3 scales the additive
    rule's output by 3."""
    shape = Shape(1, 1, 1, 9, 4, 4, False, False, 4)
    q, k, v, g, beta, _ = draw(shape, seed=9)
    base = gated_delta_rule(q, k, v, g, beta, False, SCALE, 4)
    torch.testing.assert_close(gated_delta_rule(q, 3 * k, v, g, beta, False, SCALE, 4), 3 * base)
    assert not torch.allclose(F.normalize(k, dim=-1), 3 * k)
