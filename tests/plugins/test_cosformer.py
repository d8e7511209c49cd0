"""cosformer: the op, its ONNX bodies and the layer against the explicit relu-score x cos-weight matrix."""

from __future__ import annotations

import math

import pytest
import torch
from onnx import helper

from attnx.errors import AttnxError
from attnx.plugins.cosformer import VARIANT, CosformerConfig
from attnx.plugins.cosformer.kernel import COSFORMER_OP, cosformer_attention
from tests.plugins import op_harness as harness
from tests.plugins.encoder_parity import TINY, encoder_fixture, encoder_property_test, export_in_lowering

EPS = 1e-6

# -- the reference: eq. (6)-(8) of the paper without the decomposition, float64 -------------------------


def naive_cosformer(q, k, v, mask=None, causal=False, max_len=None, eps=EPS):
    """s_ij = relu(q_i)·relu(k_j) · cos(pi/2 · (i - j)/M), 0 for padded or future keys;
    out_i = sum_j s_ij v_j / max(sum_j s_ij, eps).

    Positions count from 1; M = max_len, or max(n, n_keys) when None. Causal is bottom-right
    aligned: query i of n sits at key position i + n_keys - n and sees keys up to it.
    """
    q, k, v = q.double(), k.double(), v.double()
    n, m = q.shape[-2], k.shape[-2]
    big_m = max_len or max(n, m)
    query_pos = torch.arange(1, n + 1, dtype=torch.float64) + (m - n if causal else 0)
    key_pos = torch.arange(1, m + 1, dtype=torch.float64)
    weight = torch.cos(math.pi / 2 * (query_pos[:, None] - key_pos[None, :]) / big_m)
    scores = (torch.relu(q) @ torch.relu(k).transpose(-1, -2)) * weight
    keep = torch.ones(q.shape[0], 1, n, m, dtype=torch.bool)
    if causal:
        keep = keep & (key_pos[None, :] <= query_pos[:, None])
    if mask is not None:
        keep = keep & mask[:, None, None, :]
    scores = scores * keep
    return (scores @ v) / scores.sum(-1, keepdim=True).clamp_min(eps)


def naive_layer(layer, x, context=None, mask=None, causal=False, max_len=None):
    """The whole layer from its parameters: projections, per-head naive_cosformer, output projection."""
    q, k, v = harness.split_qkv(layer, x, context)
    return harness.merge_heads(layer, naive_cosformer(q, k, v, mask, causal, max_len))


# -- the op's arguments ------------------------------------------------------------------------------


def op_args(mask, causal, max_len, chunk_size=64):
    """The op's arguments after q, k, v: max_len None (M per call) is the attribute 0."""
    return mask, causal, max_len or 0, EPS, chunk_size


def run_torch(q, k, v, mask, causal, max_len, chunk_size=64):
    return cosformer_attention(q, k, v, *op_args(mask, causal, max_len, chunk_size))


# -- the op ----------------------------------------------------------------------------------------------

CASES = [
    # batch, heads, n_queries, n_keys, d, causal, mask, max_len, chunk_size
    (1, 1, 1, 1, 4, False, "none", None, 64),  # N = 1, M = 1
    (1, 2, 1, 1, 8, True, "none", 16, 64),  # N = 1, causal
    (2, 3, 7, 7, 8, False, "prefix", None, 64),
    (2, 2, 13, 13, 8, True, "scattered", 32, 4),  # odd N, 4 chunks, the last one padded
    (3, 2, 33, 33, 16, True, "prefix", 40, 8),
    (1, 2, 130, 130, 8, True, "none", 256, 64),  # default chunk size, N not a multiple of it
    (2, 2, 20, 20, 8, False, "none", 64, 64),  # bidirectional with a fixed M
    (2, 2, 5, 11, 8, False, "scattered", None, 64),  # cross attention, M = n_keys
    (2, 2, 11, 5, 8, False, "none", None, 64),  # cross attention, M = n_queries
    (2, 1, 5, 11, 8, True, "prefix", 16, 4),  # causal with more keys: bottom-right aligned
    (2, 1, 11, 5, 8, True, "none", 16, 4),  # causal with more queries: the first six see no key
]


@pytest.mark.parametrize(
    ("batch", "heads", "n", "m", "d", "causal", "mask_kind", "max_len", "chunk"), CASES, ids=str
)
def test_op_matches_reference_in_torch_and_onnx(batch, heads, n, m, d, causal, mask_kind, max_len, chunk):
    q, k, v, g = harness.random_qkv(batch, heads, n, m, d, seed=n * 37 + m + d)
    mask = harness.padding_mask(mask_kind, batch, m, g)
    expected = naive_cosformer(q, k, v, mask, causal, max_len).float()
    results = harness.op_results(COSFORMER_OP, q, k, v, *op_args(mask, causal, max_len, chunk))
    harness.assert_all_close(results, expected, atol=1e-5, rtol=1e-4)


def test_unset_max_len_takes_m_from_each_call():
    q, k, v, _ = harness.random_qkv(1, 2, 24, 24, 8, seed=24)
    short = run_torch(q[..., :12, :], k[..., :12, :], v[..., :12, :], None, False, None)
    fixed = run_torch(q[..., :12, :], k[..., :12, :], v[..., :12, :], None, False, 24)
    torch.testing.assert_close(
        fixed, naive_cosformer(q[..., :12, :], k[..., :12, :], v[..., :12, :], max_len=24).float()
    )
    assert not torch.allclose(short, fixed, atol=1e-4)
    for n in (12, 24):  # the ONNX graph computes M at run time, not the M of one example length
        qkv = [t[..., :n, :] for t in (q, k, v)]
        ort = harness.run_onnx(COSFORMER_OP, *qkv, *op_args(None, False, None))
        torch.testing.assert_close(ort, naive_cosformer(*qkv).float())


def test_causal_with_fixed_m_decodes_token_by_token():
    """With a fixed M the last query of a call equals the next decoded token against the same keys."""
    q, k, v, _ = harness.random_qkv(2, 2, 19, 19, 8, seed=19)
    full = run_torch(q, k, v, None, True, 32, chunk_size=4)
    for t in (1, 7, 19):
        step = run_torch(q[..., t - 1 : t, :], k[..., :t, :], v[..., :t, :], None, True, 32, chunk_size=4)
        torch.testing.assert_close(step, full[..., t - 1 : t, :], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("scale", [5e-4, 1e-3])
def test_eps_clamps_the_denominator(causal, scale):
    """Features so small that the denominator is about eps: max(den, eps), not den + eps, decides."""
    q, k, v, _ = harness.random_qkv(2, 1, 3, 3, 1, seed=7)
    q, k = q.abs() * scale, k.abs() * scale
    expected = naive_cosformer(q, k, v, causal=causal, max_len=4)
    assert (expected - naive_cosformer(q, k, v, causal=causal, max_len=4, eps=0.0)).abs().max() > 0.05
    for result in harness.op_results(COSFORMER_OP, q, k, v, *op_args(None, causal, 4, 2)).values():
        torch.testing.assert_close(result.double(), expected, atol=1e-6, rtol=1e-3)


def test_chunk_size_does_not_change_the_result():
    q, k, v, _ = harness.random_qkv(2, 2, 37, 37, 8, seed=5)
    results = [run_torch(q, k, v, None, True, 64, c) for c in (1, 3, 8, 37, 64)]
    for result in results[1:]:
        torch.testing.assert_close(result, results[0], atol=1e-6, rtol=1e-5)


def test_padded_keys_do_not_influence_the_output():
    q, k, v, g = harness.random_qkv(2, 2, 9, 9, 4, seed=3)
    harness.assert_padded_keys_ignored(lambda *args: run_torch(*args, 16, 4), (q, k, v), g)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_fp16_at_8192_tokens_is_finite_and_accurate(causal):
    n = 8192
    q, k, v, g = harness.random_qkv(1, 1, n, n, 16, seed=n, dtype=torch.float16, magnitude=3.0)
    rows = torch.randint(0, n, (48,), generator=g)
    # Checked at sampled rows: the full 8192 x 8192 reference is too large for a unit test.
    positions = torch.arange(1, n + 1, dtype=torch.float64)
    weight = torch.cos(math.pi / 2 * (positions[rows, None] - positions[None, :]) / n)
    scores = (torch.relu(q.double()[..., rows, :]) @ torch.relu(k.double()).transpose(-1, -2)) * weight
    if causal:
        scores = scores * (positions[None, :] <= positions[rows, None])
    denominator = scores.sum(-1, keepdim=True)
    assert denominator.max() > 65504 or causal  # the normaliser itself would overflow in fp16
    expected = (scores @ v.double()) / denominator.clamp_min(EPS)
    harness.assert_fp16_rows_close(COSFORMER_OP, (q, k, v, *op_args(None, causal, n)), rows, expected)


def test_causality_future_tokens_do_not_change_the_past():
    q, k, v, g = harness.random_qkv(2, 2, 40, 40, 8, seed=40)
    harness.assert_causal_op(COSFORMER_OP, (q, k, v), op_args(None, True, 64, 8), 23, g)


# -- the layer -------------------------------------------------------------------------------------------


def cosformer_layer(causal=False, cross=False, max_len=None, seed=0):
    config = CosformerConfig(max_len=max_len, chunk_size=4)
    return harness.build_layer(VARIANT, config, seed=seed, causal=causal, cross=cross)


@pytest.mark.parametrize(
    ("batch", "n", "m", "causal", "mask_kind", "max_len"),
    [
        (1, 1, None, False, "none", None),
        (2, 9, None, True, "prefix", 16),
        (2, 7, 12, False, "scattered", None),
        (3, 21, None, True, "scattered", 32),
        (2, 6, 10, True, "none", 12),
        (2, 8, None, False, "prefix", 100),
    ],
    ids=str,
)
def test_layer_matches_reference(batch, n, m, causal, mask_kind, max_len):
    layer = cosformer_layer(causal=causal, cross=m is not None, max_len=max_len, seed=n)
    x, context, mask = harness.layer_inputs(batch, n, m, mask_kind, seed=n + 1000)
    expected = naive_layer(layer, x, context, mask, causal, max_len).float()
    torch.testing.assert_close(harness.run_layer(layer, x, context, mask), expected, atol=1e-5, rtol=1e-4)


def test_layer_is_causal():
    harness.assert_layer_is_causal(cosformer_layer(causal=True, max_len=64))


def test_causal_without_max_len_fails_at_build_time():
    with pytest.raises(AttnxError) as error:
        cosformer_layer(causal=True)
    message = str(error.value)
    assert message == "cosformer: causal attention needs a fixed M; set max_len (e.g. --set max_len=4096)"
    cosformer_layer(causal=True, max_len=4096)
    cosformer_layer(causal=False)  # bidirectional keeps the official per-call M


def test_declaration_and_config():
    caps = VARIANT.capabilities
    assert (caps.causal, caps.cross, caps.key_padding_mask, caps.decode) == (True, True, True, "recurrent")
    assert VARIANT.make_config({"max_len": "4096"}) == CosformerConfig(max_len=4096)
    assert VARIANT.make_config({"max_len": "none"}).max_len is None
    for bad, name in (
        ({"max_len": 0}, "max_len=0"),
        ({"chunk_size": 0}, "chunk_size=0"),
        ({"eps": 0}, "eps"),
    ):
        with pytest.raises(AttnxError, match=name):
            VARIANT.make_config(bad)


# -- export ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lowering", ["function", "decomposed", pytest.param("plugin", marks=pytest.mark.slow)]
)
def test_export_verifies_in_every_lowering(tmp_path, lowering):
    out = tmp_path / "out"
    options = {**TINY, "max_len": 256} if lowering == "plugin" else TINY
    _, _, nodes = export_in_lowering(
        "cosformer", out, options, lowering, "CosformerAttention", seq_lens=[1, 7, 33, 130]
    )
    for node in nodes:  # none when decomposed
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["max_len"] == options.get("max_len", 0)


exported = encoder_fixture("cosformer", TINY)  # per-call M (max_len unset)
test_property_torch_matches_onnxruntime = encoder_property_test(VARIANT, keep_first_token=True)
