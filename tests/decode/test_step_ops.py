"""The stateful step ops against explicit token-by-token recurrences written from the papers.

linear ("Transformers are RNNs" eq. 18-20): S_i = S_{i-1} + phi(k_i) v_i^T, Z_i = Z_{i-1} + phi(k_i),
out_i = phi(q_i)^T S_i / (phi(q_i)^T Z_i + eps), phi = elu + 1.
cosFormer (eq. 9-11, causal): the same with two pairs, sin and cos of a_p = pi/2 · p/M at
positions p = 1, 2, ..., and the denominator clamped at eps.
cosFormer cross step: target queries at positions position + 1, ... against every source key at
1..n_k, as an explicit n_q x n_k matrix relu(q_i)·relu(k_j) cos(pi/2 (i - j)/M) over unpadded keys.
softmax (a KV cache): n new queries after m - n cached tokens, an explicit float64 softmax over keys
j <= i + m - n.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from attnx.exporter.lowering import lower
from attnx.exporter.opsets import IR_VERSIONS
from attnx.plugins.cosformer.kernel import (
    COSFORMER_CROSS_STEP_OP,
    COSFORMER_STEP_OP,
    cosformer_attention,
    cosformer_attention_step,
    cosformer_cross_attention_step,
)
from attnx.plugins.linear.kernel import LINEAR_OP, LINEAR_STEP_OP, linear_attention, linear_attention_step
from attnx.plugins.softmax.kernel import SOFTMAX_STEP_OP, softmax_attention, softmax_attention_step
from attnx.testing.onnx_op import OpSession
from attnx.trt.graph import attention_nodes
from tests.plugins import op_harness as harness

EPS = 1e-6

# -- the references: explicit loops over tokens, float64 ---------------------------------------------------


def naive_linear_rnn(q, k, v, S, Z, eps=EPS):
    """One token at a time; S (b, h, d, dv), Z (b, h, d) are the sums of earlier tokens."""
    q, k, v, S, Z = (t.double() for t in (q, k, v, S, Z))
    outs = []
    for i in range(q.shape[-2]):
        fk, fq = F.elu(k[..., i, :]) + 1, F.elu(q[..., i, :]) + 1
        S = S + fk[..., :, None] * v[..., i, None, :]
        Z = Z + fk
        num = (fq[..., :, None] * S).sum(-2)
        den = (fq * Z).sum(-1, keepdim=True) + eps
        outs.append(num / den)
    return torch.stack(outs, -2), S, Z


def naive_cosformer_rnn(q, k, v, position, sums, max_len, eps=EPS):
    """``sums`` = (S_sin, S_cos, Z_sin, Z_cos) of earlier tokens; token i sits at position + i + 1."""
    q, k, v = q.double(), k.double(), v.double()
    s_sin, s_cos, z_sin, z_cos = (t.double() for t in sums)
    outs = []
    for i in range(q.shape[-2]):
        angle = math.pi / 2 * (position + i + 1) / max_len
        rk, rq = torch.relu(k[..., i, :]), torch.relu(q[..., i, :])
        s_sin = s_sin + (rk * math.sin(angle))[..., :, None] * v[..., i, None, :]
        s_cos = s_cos + (rk * math.cos(angle))[..., :, None] * v[..., i, None, :]
        z_sin, z_cos = z_sin + rk * math.sin(angle), z_cos + rk * math.cos(angle)
        qs, qc = rq * math.sin(angle), rq * math.cos(angle)
        num = (qs[..., :, None] * s_sin).sum(-2) + (qc[..., :, None] * s_cos).sum(-2)
        den = (qs * z_sin).sum(-1, keepdim=True) + (qc * z_cos).sum(-1, keepdim=True)
        outs.append(num / den.clamp_min(eps))
    return torch.stack(outs, -2), (s_sin, s_cos, z_sin, z_cos)


def naive_cos_full(q, k, v, max_len, eps=EPS):
    """Causal cosFormer as an explicit N x N matrix: relu(q_i)·relu(k_j) cos(pi/2 (i-j)/M), j <= i."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    i = torch.arange(n, dtype=torch.float64)
    weights = torch.cos(math.pi / 2 * (i[:, None] - i[None, :]) / max_len) * (i[None, :] <= i[:, None])
    scores = (torch.relu(q) @ torch.relu(k).transpose(-1, -2)) * weights
    return (scores @ v) / scores.sum(-1, keepdim=True).clamp_min(eps)


def naive_cos_cross(q, k, v, mask, position, max_len, eps=EPS):
    """Cross cosFormer as an explicit n_q x n_k matrix; query i at position + i + 1, key j at j + 1."""
    q, k, v = q.double(), k.double(), v.double()
    i = torch.arange(q.shape[-2], dtype=torch.float64) + position + 1
    j = torch.arange(k.shape[-2], dtype=torch.float64) + 1
    weights = torch.cos(math.pi / 2 * (i[:, None] - j[None, :]) / max_len)
    scores = (torch.relu(q) @ torch.relu(k).transpose(-1, -2)) * weights
    if mask is not None:
        scores = scores * mask[:, None, None, :]
    return (scores @ v) / scores.sum(-1, keepdim=True).clamp_min(eps)


def random_inputs(batch, heads, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=g) for _ in range(3)]


def split(n, pieces):
    """Chunk boundaries: the listed chunk sizes, then single tokens to the end."""
    bounds, start = [], 0
    for size in pieces:
        bounds.append((start, min(n, start + size)))
        start = min(n, start + size)
    bounds += [(t, t + 1) for t in range(start, n)]
    return [(a, b) for a, b in bounds if b > a]


# -- linear ---------------------------------------------------------------------------------------------

CASES = [
    # batch, heads, n, d, chunks (then one token at a time), chunk_size
    (1, 1, 1, 4, [1], 64),  # a prompt of one token, nothing after
    (2, 2, 9, 8, [1], 64),  # prompt 1, then 8 single steps
    (1, 3, 13, 8, [7], 4),  # odd prompt, chunked in the op (chunk 4), then steps
    (2, 2, 17, 16, [5, 3, 1], 2),  # several prompts in a row (chunked prefill)
]


@pytest.mark.parametrize(("batch", "heads", "n", "d", "pieces", "chunk"), CASES, ids=str)
def test_linear_step_matches_the_recurrence_and_the_full_causal_op(batch, heads, n, d, pieces, chunk):
    q, k, v = random_inputs(batch, heads, n, d, seed=n * 7 + d)
    S, Z = torch.zeros(batch, heads, d, d), torch.zeros(batch, heads, d)
    expected, expected_S, expected_Z = naive_linear_rnn(q, k, v, S, Z)
    state, outs = (None, None), []
    for a, b in split(n, pieces):
        out, *state = linear_attention_step(
            q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], *state, EPS, chunk
        )
        outs.append(out)
    steps = torch.cat(outs, -2)
    torch.testing.assert_close(steps.double(), expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(state[0].double(), expected_S, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(state[1].double(), expected_Z, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(steps, linear_attention(q, k, v, None, True, EPS, chunk), atol=1e-6, rtol=1e-5)
    assert state[0].dtype == state[1].dtype == torch.float32


def test_linear_step_continues_any_given_state():
    q, k, v = random_inputs(2, 2, 5, 8, seed=3)
    g = torch.Generator().manual_seed(4)
    S, Z = torch.rand(2, 2, 8, 8, generator=g) * 3, torch.rand(2, 2, 8, generator=g) * 3  # sums of phi > 0
    out, grown_S, grown_Z = linear_attention_step(q, k, v, S, Z, EPS, 2)
    expected, expected_S, expected_Z = naive_linear_rnn(q, k, v, S, Z)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grown_S.double(), expected_S, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grown_Z.double(), expected_Z, atol=1e-5, rtol=1e-5)


# -- cosFormer ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "heads", "n", "d", "pieces", "chunk"), CASES, ids=str)
@pytest.mark.parametrize("max_len", [16, 100])
def test_cosformer_step_matches_the_recurrence_and_the_full_causal_op(
    batch, heads, n, d, pieces, chunk, max_len
):
    q, k, v = random_inputs(batch, heads, n, d, seed=n * 5 + d + max_len)
    zeros = [torch.zeros(batch, heads, d, d)] * 2 + [torch.zeros(batch, heads, d)] * 2
    expected, (s_sin, s_cos, z_sin, z_cos) = naive_cosformer_rnn(q, k, v, 0, zeros, max_len)
    state, outs = (None, None), []
    for a, b in split(n, pieces):
        position = torch.tensor([a])
        chunk_qkv = (q[..., a:b, :], k[..., a:b, :], v[..., a:b, :])
        out, *state = cosformer_attention_step(*chunk_qkv, position, *state, max_len, EPS, chunk)
        outs.append(out)
    steps = torch.cat(outs, -2)
    torch.testing.assert_close(steps.double(), expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(steps.double(), naive_cos_full(q, k, v, max_len), atol=1e-5, rtol=1e-4)
    full_op = cosformer_attention(q, k, v, None, True, max_len, EPS, chunk)
    torch.testing.assert_close(steps, full_op, atol=1e-6, rtol=1e-5)
    # the state stacks the sin pair over the cos pair along the feature axis
    torch.testing.assert_close(state[0].double(), torch.cat((s_sin, s_cos), -2), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(state[1].double(), torch.cat((z_sin, z_cos), -1), atol=1e-4, rtol=1e-5)


def test_cosformer_position_places_new_tokens_after_the_state():
    """cos(pi/2 (i-j)/M) is relative: alone, tokens give the same result at any position; after a
    state, the position decides how far they are from the earlier tokens."""
    q, k, v = random_inputs(1, 2, 8, 4, seed=11)
    zeros = [torch.zeros(1, 2, 4, 4)] * 2 + [torch.zeros(1, 2, 4)] * 2
    alone = [
        cosformer_attention_step(q, k, v, torch.tensor([p]), None, None, 64, EPS, 64)[0] for p in (0, 40)
    ]
    torch.testing.assert_close(alone[0], alone[1], atol=1e-6, rtol=1e-5)
    _, *state = cosformer_attention_step(
        q[..., :5, :], k[..., :5, :], v[..., :5, :], torch.tensor([0]), None, None, 64, EPS, 64
    )
    tail = (q[..., 5:, :], k[..., 5:, :], v[..., 5:, :])
    right = cosformer_attention_step(*tail, torch.tensor([5]), *state, 64, EPS, 64)[0]
    wrong = cosformer_attention_step(*tail, torch.tensor([40]), *state, 64, EPS, 64)[0]
    expected, _ = naive_cosformer_rnn(q, k, v, 0, zeros, 64)
    torch.testing.assert_close(right.double(), expected[..., 5:, :], atol=1e-5, rtol=1e-4)
    assert (wrong - right).abs().max() > 1e-2


CROSS_CASES = [
    # batch, heads, n_queries, n_keys, d, position, padded
    (1, 1, 1, 1, 4, 0, False),
    (2, 2, 1, 9, 8, 5, True),  # one decode step after 5 target tokens, padded source
    (1, 3, 7, 13, 8, 0, False),  # a prompt (prefill)
    (2, 2, 3, 6, 4, 60, True),  # near M
]


def padding(batch, n_keys):
    return torch.arange(n_keys) < torch.tensor([n_keys, max(1, n_keys // 2)])[:batch, None]


@pytest.mark.parametrize(("batch", "heads", "nq", "nk", "d", "position", "padded"), CROSS_CASES, ids=str)
def test_cosformer_cross_step_matches_the_explicit_matrix_and_the_full_cross_op(
    batch, heads, nq, nk, d, position, padded
):
    g = torch.Generator().manual_seed(nq * 31 + nk)
    q = torch.randn(batch, heads, nq, d, generator=g)
    k, v = torch.randn(batch, heads, nk, d, generator=g), torch.randn(batch, heads, nk, d, generator=g)
    mask = padding(batch, nk) if padded else None
    out = cosformer_cross_attention_step(q, k, v, torch.tensor([position]), mask, 64, EPS, 4)
    expected = naive_cos_cross(q, k, v, mask, position, 64)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-4)
    # the rows of the full (bidirectional) cross op whose queries start at position 1
    before = torch.randn(batch, heads, position, d, generator=g)
    full = cosformer_attention(torch.cat((before, q), -2), k, v, mask, False, 64, EPS, 4)
    torch.testing.assert_close(out, full[..., position:, :], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("lowering", ["function", "decomposed"])
@pytest.mark.parametrize("padded", [True, False])
def test_cosformer_cross_step_onnx_bodies_match_the_explicit_matrix(lowering, padded):
    names = ["q", "k", "v", "position"] + (["key_padding_mask"] if padded else [])
    types = {
        "q": (TensorProto.FLOAT, ["b", "h", "n", "d"]),
        "k": (TensorProto.FLOAT, ["b", "h", "m", "d"]),
        "v": (TensorProto.FLOAT, ["b", "h", "m", "d"]),
        "position": (TensorProto.INT64, [1]),
        "key_padding_mask": (TensorProto.BOOL, ["b", "m"]),
    }
    inputs = [helper.make_tensor_value_info(n, *types[n]) for n in names]
    op = COSFORMER_CROSS_STEP_OP
    node = helper.make_node(op.name, names, ["out"], domain="attnx", max_len=32, eps=EPS, chunk_size=4)
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "h", "n", "d"])
    graph = helper.make_graph([node], "cross", inputs, [output])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("attnx", 1)]
    model = lower(helper.make_model(graph, opset_imports=opsets, ir_version=10), [op], lowering)
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    q, k, v = random_inputs(2, 2, 1, 4, seed=21)[0], *random_inputs(2, 2, 7, 4, seed=22)[1:]
    mask = padding(2, 7) if padded else None
    for position in (0, 3, 30):
        feed = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "position": np.array([position])}
        feed |= {"key_padding_mask": mask.numpy()} if padded else {}
        (out,) = session.run(None, feed)
        expected = naive_cos_cross(q, k, v, mask, position, 32)
        torch.testing.assert_close(torch.from_numpy(out).double(), expected, atol=1e-5, rtol=1e-4)


# -- ONNX: the bodies of both overloads, three outputs ---------------------------------------------------


@functools.cache
def step_session(op_name, with_state, lowering, opset=18):
    op = {"LinearAttentionStep": LINEAR_STEP_OP, "CosformerAttentionStep": COSFORMER_STEP_OP}[op_name]
    cos = op is COSFORMER_STEP_OP
    f = "f2" if cos else "f"
    names = ["q", "k", "v"] + (["position"] if cos else []) + (["kv_sum", "k_sum"] if with_state else [])
    shapes = {
        "q": ["b", "h", "n", "d"],
        "k": ["b", "h", "n", "d"],
        "v": ["b", "h", "n", "e"],
        "position": [1],
        "kv_sum": ["b", "h", f, "e"],
        "k_sum": ["b", "h", f],
    }
    inputs = [
        helper.make_tensor_value_info(
            n, TensorProto.INT64 if n == "position" else TensorProto.FLOAT, shapes[n]
        )
        for n in names
    ]
    attributes = {"eps": EPS, "chunk_size": 4, **({"max_len": 32} if cos else {})}
    node = helper.make_node(op.name, names, ["out", "S", "Z"], domain="attnx", **attributes)
    outputs = [
        helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "h", "n", "e"]),
        helper.make_tensor_value_info("S", TensorProto.FLOAT, ["b", "h", f, "e"]),
        helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["b", "h", f]),
    ]
    graph = helper.make_graph([node], "step", inputs, outputs)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("attnx", 1)]
    model = lower(
        helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSIONS[opset]), [op], lowering
    )
    onnx.checker.check_model(model, full_check=True)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# opset 27: linear's body on the standard LinearAttention (cosformer keeps its portable one)
@pytest.mark.parametrize(("lowering", "opset"), [("function", 18), ("decomposed", 18), ("function", 27)])
@pytest.mark.parametrize("variant", ["linear", "cosformer"])
@pytest.mark.parametrize("n", [1, 6])
def test_onnx_bodies_match_the_recurrence(lowering, opset, variant, n):
    d = 4
    q, k, v = random_inputs(2, 2, n, d, seed=n + 17)
    cos = variant == "cosformer"
    first = step_session(LINEAR_STEP_OP.name if not cos else COSFORMER_STEP_OP.name, False, lowering, opset)
    then = step_session(LINEAR_STEP_OP.name if not cos else COSFORMER_STEP_OP.name, True, lowering, opset)
    feed = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()}
    if cos:
        feed["position"] = np.array([0], dtype=np.int64)
    out, S, Z = first.run(None, feed)
    later = [t * 0.5 for t in random_inputs(2, 2, 3, d, seed=n + 18)]
    feed = {"q": later[0].numpy(), "k": later[1].numpy(), "v": later[2].numpy(), "kv_sum": S, "k_sum": Z}
    if cos:
        feed["position"] = np.array([n], dtype=np.int64)
    out2, S2, Z2 = then.run(None, feed)
    whole = [torch.cat((a, b), -2) for a, b in zip((q, k, v), later, strict=True)]
    if cos:
        zeros = [torch.zeros(2, 2, d, d)] * 2 + [torch.zeros(2, 2, d)] * 2
        expected, sums = naive_cosformer_rnn(*whole, 0, zeros, 32)
        expected_S, expected_Z = torch.cat(sums[:2], -2), torch.cat(sums[2:], -1)
    else:
        expected, expected_S, expected_Z = naive_linear_rnn(
            *whole, torch.zeros(2, 2, d, d), torch.zeros(2, 2, d)
        )
    got = torch.cat((torch.from_numpy(out), torch.from_numpy(out2)), -2)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.from_numpy(S2).double(), expected_S, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(Z2).double(), expected_Z, atol=1e-4, rtol=1e-5)


# -- softmax: the KV cache (from opset 23 in Attention's past_key/past_value) -----------------------------

SOFTMAX_SCALE = 0.3


def naive_softmax_cached(q, keys, values, causal=True, scale=SOFTMAX_SCALE):
    """The n queries are the last n of the m tokens: query i attends keys j <= i + m - n if causal, else
    all m (float64)."""
    q, keys, values = q.double(), keys.double(), values.double()
    n, m = q.shape[-2], keys.shape[-2]
    future = (torch.arange(m)[None, :] > torch.arange(n)[:, None] + (m - n)) & causal
    scores = (q @ keys.transpose(-1, -2) * scale).masked_fill(future, -math.inf)
    return torch.softmax(scores, -1) @ values


@pytest.mark.parametrize(("batch", "heads", "n", "d", "pieces", "chunk"), CASES, ids=str)
def test_softmax_step_matches_the_explicit_softmax_and_the_full_causal_op(batch, heads, n, d, pieces, chunk):
    q, k, v = random_inputs(batch, heads, n, d, seed=n * 3 + d)
    cache, outs = (None, None), []
    for a, b in split(n, pieces):
        out, *cache = softmax_attention_step(
            q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], *cache, True, SOFTMAX_SCALE
        )
        outs.append(out)
    steps = torch.cat(outs, -2)
    torch.testing.assert_close(steps.double(), naive_softmax_cached(q, k, v), atol=1e-5, rtol=1e-4)
    full = softmax_attention(q, k, v, None, True, SOFTMAX_SCALE)
    torch.testing.assert_close(steps, full, atol=1e-6, rtol=1e-5)
    assert torch.equal(cache[0], k) and torch.equal(cache[1], v)  # the cache is the keys/values, appended


def onnx_steps(q, k, v, cache, causal, lowering, opset, pieces):
    """Feed the token ranges ``pieces`` of q, k, v one after another through SoftmaxAttentionStep's
    one-node model, each after the cache the one before returned; yields (a, b, the session that ran,
    the past it was given, its output, the cache it returned)."""
    for a, b in pieces:
        new = (q[..., a:b, :], k[..., a:b, :], v[..., a:b, :])
        call = harness.op_call(SOFTMAX_STEP_OP, *new, *cache, causal, SOFTMAX_SCALE)
        session = OpSession(SOFTMAX_STEP_OP, call, lowering, opset)
        past = cache
        out, *cache = (torch.from_numpy(t) for t in session.run(call.bound()))
        yield a, b, session, past, out, cache


@pytest.mark.parametrize("opset", [18, 23])
@pytest.mark.parametrize("lowering", ["function", "decomposed"])
@pytest.mark.parametrize(("n", "causal", "empty"), [(1, True, False), (6, True, True), (6, False, False)])
def test_softmax_step_onnx_bodies_match_the_explicit_softmax(opset, lowering, n, causal, empty):
    """A prompt of n tokens (after no cache, or a cache of length 0 as decode.onnx starts), then 3 tokens,
    then 1 (q_len < kv_len) through each body: from opset 23 the function lowering's cache goes through
    Attention's past_key/past_value."""
    q, k, v = random_inputs(2, 3, n + 4, 8, seed=n + 40)
    start = (torch.zeros(2, 3, 0, 8), torch.zeros(2, 3, 0, 8)) if empty else (None, None)
    pieces = ((0, n), (n, n + 3), (n + 3, n + 4))
    for a, b, session, past, out, cache in onnx_steps(q, k, v, start, causal, lowering, opset, pieces):
        standard = attention_nodes(session.model)
        assert bool(standard) == (lowering == "function" and opset >= 23)
        if standard and past[0] is not None:
            assert [i for i in standard[0].input if i][4:] and len(standard[0].output) >= 3  # past -> present
        expected = naive_softmax_cached(q[..., a:b, :], k[..., :b, :], v[..., :b, :], causal)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-4)
        assert cache[0].shape[-2] == cache[1].shape[-2] == b  # every token so far
    assert torch.equal(cache[0], k) and torch.equal(cache[1], v)


@pytest.mark.parametrize("opset", [18, 23])
def test_softmax_step_in_fp16_keeps_its_cache_exact_and_its_output_close(opset):
    """fp16 (an fp16 export): the Attention op's step runs in the inputs' type, with no casts of the cache."""
    q, k, v = (t.half() for t in random_inputs(1, 4, 9, 16, seed=77))
    pieces = ((0, 5), (5, 8), (8, 9))
    for a, b, _, _, out, cache in onnx_steps(q, k, v, (None, None), True, "function", opset, pieces):
        assert out.dtype == cache[0].dtype == torch.float16
        expected = naive_softmax_cached(q[..., a:b, :], k[..., :b, :], v[..., :b, :])
        torch.testing.assert_close(out.double(), expected, atol=2e-3, rtol=2e-3)
    assert torch.equal(cache[0], k) and torch.equal(cache[1], v)


# -- the op contract: several outputs derived from the torch op -------------------------------------------


def test_schema_outputs_follow_the_torch_op_returns():
    schema = LINEAR_STEP_OP.schema()
    assert [o.name for o in schema.outputs] == ["output", "kv_sum", "k_sum"]
    types = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    assert types[schema.outputs[1].type_str] == ["tensor(float)"]  # the state is float32
    assert [o.name for o in LINEAR_OP.schema().outputs] == ["output"]
    assert [i.name for i in COSFORMER_STEP_OP.schema().inputs] == [
        "q",
        "k",
        "v",
        "position",
        "kv_sum",
        "k_sum",
    ]


def test_output_names_must_match_the_number_of_returns():
    import dataclasses

    wrong = dataclasses.replace(LINEAR_STEP_OP, output_names=("output", "kv_sum"))
    with pytest.raises(TypeError, match="returns 3 tensors, 2 names"):
        wrong.schema()
