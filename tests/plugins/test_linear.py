"""linear: the op, its ONNX bodies and the layer against the explicit N x N form of the paper."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnx.errors import AttnxError
from attnx.exporter.lowering import lower
from attnx.plugins.lib.standard import STANDARD_OPSET
from attnx.plugins.linear import VARIANT, LinearConfig
from attnx.plugins.linear.kernel import LINEAR_OP, LINEAR_STEP_OP, linear_attention
from attnx.testing.onnx_op import node_model
from tests.plugins import op_harness as harness
from tests.plugins.encoder_parity import TINY, encoder_fixture, encoder_property_test, export_in_lowering

EPS = 1e-6

# -- the reference: eq. (2)/(9) of the paper as an explicit kernel matrix, float64 --------------------


def naive_linear(q, k, v, mask=None, causal=False, eps=EPS):
    """A_ij = phi(q_i)·phi(k_j) (0 for padded or future keys), out_i = sum_j A_ij v_j / (sum_j A_ij + eps).

    Causal is bottom-right aligned: query i of n sees key j iff j <= i + n_keys - n.
    """
    q, k, v = q.double(), k.double(), v.double()
    n, m = q.shape[-2], k.shape[-2]
    scores = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)
    keep = torch.ones(q.shape[0], 1, n, m, dtype=torch.bool)
    if causal:
        keep = keep & (torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n))
    if mask is not None:
        keep = keep & mask[:, None, None, :]
    scores = scores * keep
    return (scores @ v) / (scores.sum(-1, keepdim=True) + eps)


def naive_layer(layer, x, context=None, mask=None, causal=False):
    """The whole layer from its parameters: projections, per-head naive_linear, output projection."""
    q, k, v = harness.split_qkv(layer, x, context)
    return harness.merge_heads(layer, naive_linear(q, k, v, mask, causal))


# -- the op ----------------------------------------------------------------------------------------------

CASES = [
    # batch, heads, n_queries, n_keys, d, causal, mask, chunk_size
    (1, 1, 1, 1, 4, False, "none", 64),
    (1, 2, 1, 1, 8, True, "none", 64),  # N = 1, causal
    (2, 3, 7, 7, 8, False, "prefix", 64),
    (2, 2, 13, 13, 8, True, "scattered", 4),  # odd N, 4 chunks, the last one padded
    (3, 2, 33, 33, 16, True, "prefix", 8),
    (1, 2, 130, 130, 8, True, "none", 64),  # default chunk size, N not a multiple of it
    (2, 2, 5, 11, 8, False, "scattered", 64),  # cross attention, more keys
    (2, 2, 11, 5, 8, False, "none", 64),  # cross attention, more queries
    (2, 1, 5, 11, 8, True, "prefix", 4),  # causal with more keys: bottom-right aligned
    (2, 1, 11, 5, 8, True, "none", 4),  # causal with more queries: the first six see no key
]


@pytest.mark.parametrize(("batch", "heads", "n", "m", "d", "causal", "mask_kind", "chunk"), CASES, ids=str)
def test_op_matches_reference_in_torch_and_onnx(batch, heads, n, m, d, causal, mask_kind, chunk):
    q, k, v, g = harness.random_qkv(batch, heads, n, m, d, seed=n * 31 + m + d)
    mask = harness.padding_mask(mask_kind, batch, m, g)
    expected = naive_linear(q, k, v, mask, causal).float()
    results = harness.op_results(LINEAR_OP, q, k, v, mask, causal, EPS, chunk)
    harness.assert_all_close(results, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_eps_is_added_to_the_denominator(causal):
    """Features so small that phi(q)·sum phi(k) is about eps: den + eps, not max(den, eps), decides."""
    q, k, v, _ = harness.random_qkv(2, 1, 3, 3, 1, seed=7)
    q, k = q * 0.1 - 7.0, k * 0.1 - 7.0  # phi = exp(x) ~ 1e-3, phi(q) phi(k) ~ 1e-6
    expected = naive_linear(q, k, v, causal=causal)
    assert (expected - naive_linear(q, k, v, causal=causal, eps=0.0)).abs().max() > 0.1  # eps matters here
    for result in harness.op_results(LINEAR_OP, q, k, v, None, causal, EPS, 2).values():
        torch.testing.assert_close(result.double(), expected, atol=1e-7, rtol=1e-3)


@pytest.mark.parametrize(("batch", "heads", "n", "m", "d", "causal", "mask_kind", "chunk"), CASES, ids=str)
def test_standard_linear_attention_body_at_opset_27(batch, heads, n, m, d, causal, mask_kind, chunk):
    """The body on the standard LinearAttention (a model at opset 27) against the reference, causal
    calls with more keys or more queries included (bottom-right aligned around the op's own causality)."""
    q, k, v, g = harness.random_qkv(batch, heads, n, m, d, seed=n * 17 + m + d)
    mask = harness.padding_mask(mask_kind, batch, m, g)
    out = harness.run_onnx(LINEAR_OP, q, k, v, mask, causal, EPS, chunk, opset=STANDARD_OPSET)
    torch.testing.assert_close(out, naive_linear(q, k, v, mask, causal).float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("opset", "standard"), [(27, True), (26, False)])
def test_a_model_at_opset_27_holds_the_standard_op(opset, standard):
    """Both ops' function lowering at opset 27 holds the standard LinearAttention, below it the portable
    body (the seeded defect: a body list that kept the portable body at 27 would pass the comparisons;
    the step body is compared in tests/decode/test_step_ops.py)."""
    q, k, v, _ = harness.random_qkv(1, 2, 5, 5, 4, seed=5)
    for op, args in (
        (LINEAR_OP, (q, k, v, None, True, EPS, 4)),
        (LINEAR_STEP_OP, (q, k, v, None, None, EPS, 4)),
    ):
        model = lower(node_model(op, harness.op_call(op, *args), opset), [op], "function")
        assert bool(harness.standard_linear_attention_nodes(model)) == standard, op.name


def test_one_query_against_a_key_history_is_the_next_decoded_token():
    q, k, v, _ = harness.random_qkv(2, 2, 19, 19, 8, seed=19)
    full = linear_attention(q, k, v, None, True, EPS, 4)
    for t in (1, 7, 19):
        step = linear_attention(q[..., t - 1 : t, :], k[..., :t, :], v[..., :t, :], None, True, EPS, 4)
        torch.testing.assert_close(step, full[..., t - 1 : t, :], atol=1e-6, rtol=1e-5)


def test_chunk_size_does_not_change_the_result():
    q, k, v, _ = harness.random_qkv(2, 2, 37, 37, 8, seed=5)
    results = [linear_attention(q, k, v, None, True, EPS, c) for c in (1, 3, 8, 37, 64)]
    for result in results[1:]:
        torch.testing.assert_close(result, results[0], atol=1e-6, rtol=1e-5)


def test_padded_keys_do_not_influence_the_output():
    q, k, v, g = harness.random_qkv(2, 2, 9, 9, 4, seed=3)
    harness.assert_padded_keys_ignored(lambda *args: linear_attention(*args, EPS, 4), (q, k, v), g)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_fp16_at_8192_tokens_is_finite_and_accurate(causal):
    q, k, v, g = harness.random_qkv(1, 1, 8192, 8192, 16, seed=8192, dtype=torch.float16)
    rows = torch.randint(0, 8192, (48,), generator=g)
    # Checked at sampled rows: the full 8192 x 8192 reference is too large for a unit test.
    scores = (F.elu(q.double()[..., rows, :]) + 1) @ (F.elu(k.double()) + 1).transpose(-1, -2)
    if causal:
        scores = scores * (torch.arange(8192)[None, :] <= rows[:, None])
    denominator = scores.sum(-1, keepdim=True)
    assert denominator.max() > 65504 or causal  # the normaliser itself would overflow in fp16
    expected = (scores @ v.double()) / (denominator + EPS)
    harness.assert_fp16_rows_close(LINEAR_OP, (q, k, v, None, causal, EPS, 64), rows, expected)


def test_causality_future_tokens_do_not_change_the_past():
    q, k, v, g = harness.random_qkv(2, 2, 40, 40, 8, seed=40)
    harness.assert_causal_op(LINEAR_OP, (q, k, v), (None, True, EPS, 8), 23, g)


# -- the layer -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "n", "m", "causal", "mask_kind"),
    [
        (1, 1, None, False, "none"),
        (2, 9, None, True, "prefix"),
        (2, 7, 12, False, "scattered"),
        (3, 21, None, True, "scattered"),
        (2, 6, 10, True, "none"),
    ],
    ids=str,
)
def test_layer_matches_reference(batch, n, m, causal, mask_kind):
    layer = harness.build_layer(
        VARIANT, LinearConfig(chunk_size=4), seed=n, causal=causal, cross=m is not None
    )
    x, context, mask = harness.layer_inputs(batch, n, m, mask_kind, seed=n + 1000)
    expected = naive_layer(layer, x, context, mask, causal).float()
    torch.testing.assert_close(harness.run_layer(layer, x, context, mask), expected, atol=1e-5, rtol=1e-4)


def test_layer_is_causal():
    harness.assert_layer_is_causal(harness.build_layer(VARIANT, LinearConfig(chunk_size=8), causal=True))


def test_declaration_and_config():
    caps = VARIANT.capabilities
    assert (caps.causal, caps.cross, caps.key_padding_mask, caps.decode) == (True, True, True, "recurrent")
    assert VARIANT.make_config({"eps": "1e-5", "chunk_size": "16"}) == LinearConfig(eps=1e-5, chunk_size=16)
    with pytest.raises(AttnxError, match="chunk_size=0"):
        VARIANT.make_config({"chunk_size": 0})
    with pytest.raises(AttnxError, match="eps"):
        VARIANT.make_config({"eps": -1})


# -- export ----------------------------------------------------------------------------------------------


# the plugin lowering in the slow run: tests/trt/test_ortkernels.py runs every variant's plugin export
# through the CPU kernels in the default run
@pytest.mark.parametrize(
    "lowering", ["function", "decomposed", pytest.param("plugin", marks=pytest.mark.slow)]
)
def test_export_verifies_in_every_lowering(tmp_path, lowering):
    out = tmp_path / "out"
    export_in_lowering("linear", out, TINY, lowering, "LinearAttention", seq_lens=[1, 7, 33, 130])


exported = encoder_fixture("linear", TINY)
test_property_torch_matches_onnxruntime = encoder_property_test(VARIANT, keep_first_token=True)
