"""cosformer: the op, its ONNX bodies and the layer against the explicit relu-score x cos-weight matrix."""

from __future__ import annotations

import functools
import math

import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from attnx.errors import AttnxError
from attnx.exporter.export import export
from attnx.exporter.lowering import lower
from attnx.exporter.manifest import MODEL_FILE
from attnx.plugins.cosformer import VARIANT, CosformerConfig
from attnx.plugins.cosformer.kernel import COSFORMER_OP, cosformer_attention
from attnx.variant import AttentionSpec
from tests.plugins.encoder_parity import assert_encoder_matches_ort, export_encoder

EPS = 1e-6
TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 50}

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
    p = {name: t.detach().double() for name, t in layer.named_parameters()}
    heads = layer.spec.n_heads
    source = x if context is None else context

    def project(name, inputs):
        y = inputs.double() @ p[f"{name}.weight"].T + p[f"{name}.bias"]
        return y.reshape(*y.shape[:2], heads, -1).transpose(1, 2)

    q, k, v = project("q_proj", x), project("k_proj", source), project("v_proj", source)
    out = naive_cosformer(q, k, v, mask, causal, max_len)
    return out.transpose(1, 2).flatten(2) @ p["out_proj.weight"].T + p["out_proj.bias"]


# -- inputs and a one-node ONNX model around attnx::CosformerAttention -----------------------------------


def random_qkv(batch, heads, n, m, d, seed, dtype=torch.float32, magnitude=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n, d, generator=g) * magnitude
    k = torch.randn(batch, heads, m, d, generator=g) * magnitude
    v = torch.randn(batch, heads, m, d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype), g


def random_mask(kind, batch, m, g):
    """None, a real prefix of random length per row, or a scattered pattern (>= 1 real key per row)."""
    if kind == "none":
        return None
    if kind == "prefix":
        return torch.arange(m) < torch.randint(1, m + 1, (batch, 1), generator=g)
    mask = torch.rand(batch, m, generator=g) > 0.5
    mask[:, torch.randint(0, m, (1,), generator=g)] = True
    return mask


@functools.cache
def op_session(causal, masked, max_len, lowering="function", chunk_size=64, fp16=False):
    dtype = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    names = ["q", "k", "v"] + (["key_padding_mask"] if masked else [])
    inputs = [
        helper.make_tensor_value_info("q", dtype, ["b", "h", "n", "d"]),
        helper.make_tensor_value_info("k", dtype, ["b", "h", "m", "d"]),
        helper.make_tensor_value_info("v", dtype, ["b", "h", "m", "e"]),
    ]
    if masked:
        inputs.append(helper.make_tensor_value_info("key_padding_mask", TensorProto.BOOL, ["b", "m"]))
    attributes = {"causal": int(causal), "max_len": max_len or 0, "eps": EPS, "chunk_size": chunk_size}
    node = helper.make_node(COSFORMER_OP.name, names, ["out"], domain="attnx", **attributes)
    output = helper.make_tensor_value_info("out", dtype, ["b", "h", "n", "e"])
    graph = helper.make_graph([node], "cosformer_op", inputs, [output])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("attnx", 1)]
    model = lower(helper.make_model(graph, opset_imports=opsets, ir_version=10), [COSFORMER_OP], lowering)
    onnx.checker.check_model(model, full_check=True)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_ort(q, k, v, mask, causal, max_len, lowering="function", chunk_size=64):
    session = op_session(causal, mask is not None, max_len, lowering, chunk_size, q.dtype == torch.float16)
    feed = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()}
    if mask is not None:
        feed["key_padding_mask"] = mask.numpy()
    return torch.from_numpy(session.run(None, feed)[0])


def run_torch(q, k, v, mask, causal, max_len, chunk_size=64):
    return cosformer_attention(q, k, v, mask, causal, max_len or 0, EPS, chunk_size)


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
    q, k, v, g = random_qkv(batch, heads, n, m, d, seed=n * 37 + m + d)
    mask = random_mask(mask_kind, batch, m, g)
    expected = naive_cosformer(q, k, v, mask, causal, max_len).float()
    results = [run_torch(q, k, v, mask, causal, max_len, chunk)]
    results += [
        run_ort(q, k, v, mask, causal, max_len, lowering, chunk) for lowering in ("function", "decomposed")
    ]
    for result in results:
        torch.testing.assert_close(result, expected, atol=1e-5, rtol=1e-4)


def test_unset_max_len_takes_m_from_each_call():
    q, k, v, _ = random_qkv(1, 2, 24, 24, 8, seed=24)
    short = run_torch(q[..., :12, :], k[..., :12, :], v[..., :12, :], None, False, None)
    fixed = run_torch(q[..., :12, :], k[..., :12, :], v[..., :12, :], None, False, 24)
    torch.testing.assert_close(
        fixed, naive_cosformer(q[..., :12, :], k[..., :12, :], v[..., :12, :], max_len=24).float()
    )
    assert not torch.allclose(short, fixed, atol=1e-4)
    for n in (12, 24):  # the ONNX graph computes M at run time, not the M of one example length
        qkv = [t[..., :n, :] for t in (q, k, v)]
        torch.testing.assert_close(run_ort(*qkv, None, False, None), naive_cosformer(*qkv).float())


def test_causal_with_fixed_m_decodes_token_by_token():
    """With a fixed M the last query of a call equals the next decoded token against the same keys."""
    q, k, v, _ = random_qkv(2, 2, 19, 19, 8, seed=19)
    full = run_torch(q, k, v, None, True, 32, chunk_size=4)
    for t in (1, 7, 19):
        step = run_torch(q[..., t - 1 : t, :], k[..., :t, :], v[..., :t, :], None, True, 32, chunk_size=4)
        torch.testing.assert_close(step, full[..., t - 1 : t, :], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("scale", [5e-4, 1e-3])
def test_eps_clamps_the_denominator(causal, scale):
    """Features so small that the denominator is about eps: max(den, eps), not den + eps, decides."""
    q, k, v, _ = random_qkv(2, 1, 3, 3, 1, seed=7)
    q, k = q.abs() * scale, k.abs() * scale
    expected = naive_cosformer(q, k, v, causal=causal, max_len=4)
    assert (expected - naive_cosformer(q, k, v, causal=causal, max_len=4, eps=0.0)).abs().max() > 0.05
    for result in (run_torch(q, k, v, None, causal, 4, 2), run_ort(q, k, v, None, causal, 4, chunk_size=2)):
        torch.testing.assert_close(result.double(), expected, atol=1e-6, rtol=1e-3)


def test_chunk_size_does_not_change_the_result():
    q, k, v, _ = random_qkv(2, 2, 37, 37, 8, seed=5)
    results = [run_torch(q, k, v, None, True, 64, c) for c in (1, 3, 8, 37, 64)]
    for result in results[1:]:
        torch.testing.assert_close(result, results[0], atol=1e-6, rtol=1e-5)


def test_padded_keys_do_not_influence_the_output():
    q, k, v, g = random_qkv(2, 2, 9, 9, 4, seed=3)
    mask = torch.arange(9) < torch.tensor([[4], [9]])
    noise = 100 * torch.randn(2, *k.shape, generator=g) * ~mask[:, None, :, None]
    for causal in (False, True):
        before = run_torch(q, k, v, mask, causal, 16, 4)
        assert torch.equal(before, run_torch(q, k + noise[0], v + noise[1], mask, causal, 16, 4))


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_fp16_at_8192_tokens_is_finite_and_accurate(causal):
    n = 8192
    q, k, v, g = random_qkv(1, 1, n, n, 16, seed=n, dtype=torch.float16, magnitude=3.0)
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
    for result in (run_torch(q, k, v, None, causal, n), run_ort(q, k, v, None, causal, n)):
        assert result.dtype == torch.float16 and torch.isfinite(result).all()
        torch.testing.assert_close(result[..., rows, :].double(), expected, atol=5e-3, rtol=5e-3)


def test_causality_future_tokens_do_not_change_the_past():
    q, k, v, g = random_qkv(2, 2, 40, 40, 8, seed=40)
    changed = [t.clone() for t in (q, k, v)]
    for t in changed:
        t[..., 23:, :] = torch.randn(t[..., 23:, :].shape, generator=g) * 10
    before = run_torch(q, k, v, None, True, 64, 8)
    after = run_torch(*changed, None, True, 64, 8)
    assert torch.equal(before[..., :23, :], after[..., :23, :])
    assert not torch.allclose(before[..., 23:, :], after[..., 23:, :])
    ort_before, ort_after = (run_ort(*qkv, None, True, 64, "function", 8) for qkv in ((q, k, v), changed))
    torch.testing.assert_close(ort_after[..., :23, :], ort_before[..., :23, :], atol=1e-6, rtol=1e-5)


# -- the layer -------------------------------------------------------------------------------------------


def build_layer(causal=False, cross=False, max_len=None, seed=0):
    torch.manual_seed(seed)
    config = CosformerConfig(max_len=max_len, chunk_size=4)
    return VARIANT.load().build(config, AttentionSpec(24, 3, causal=causal, cross=cross)).eval()


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
    layer = build_layer(causal=causal, cross=m is not None, max_len=max_len, seed=n)
    g = torch.Generator().manual_seed(n + 1000)
    x = torch.randn(batch, n, 24, generator=g)
    context = None if m is None else torch.randn(batch, m, 24, generator=g)
    mask = random_mask(mask_kind, batch, m or n, g)
    with torch.no_grad():
        result = layer(x, context=context, key_padding_mask=mask)
    expected = naive_layer(layer, x, context, mask, causal, max_len).float()
    torch.testing.assert_close(result, expected, atol=1e-5, rtol=1e-4)


def test_layer_is_causal():
    layer = build_layer(causal=True, max_len=64)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 30, 24, generator=g)
    y = x.clone()
    y[:, 17:] = torch.randn(2, 13, 24, generator=g)
    with torch.no_grad():
        assert torch.equal(layer(x)[:, :17], layer(y)[:, :17])


def test_causal_without_max_len_fails_at_build_time():
    with pytest.raises(AttnxError) as error:
        build_layer(causal=True)
    message = str(error.value)
    assert message == "cosformer: causal attention needs a fixed M; set max_len (e.g. --set max_len=4096)"
    build_layer(causal=True, max_len=4096)
    build_layer(causal=False)  # bidirectional keeps the official per-call M


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


@pytest.mark.parametrize("lowering", ["function", "decomposed", "plugin"])
def test_export_verifies_in_every_lowering(tmp_path, lowering):
    out = tmp_path / "out"
    options = {**TINY, "max_len": 256} if lowering == "plugin" else TINY
    result = export("cosformer", out, options=options, lowering=lowering, seq_lens=[1, 7, 33, 130])
    assert result.parity is not None and result.parity.passed, result.parity
    model = onnx.load(str(out / MODEL_FILE))
    nodes = [node for node in model.graph.node if node.domain == "attnx"]
    if lowering == "decomposed":
        assert result.attnx_nodes == 0 and not nodes and not model.functions
        assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}
        return
    assert [node.op_type for node in nodes] == ["CosformerAttention"]
    attributes = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes["max_len"] == options.get("max_len", 0)
    assert ({"plugin_namespace", "plugin_version"} <= set(attributes)) == (lowering == "plugin")
    assert bool(model.functions) == (lowering == "function")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One dynamic-shape export (function lowering, per-call M) and the torch model rebuilt from it."""
    out = tmp_path_factory.mktemp("cosformer") / "out"
    return export_encoder("cosformer", out, TINY)


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 3), n=st.integers(1, 100), seed=st.integers(0, 2**16))
def test_property_torch_matches_onnxruntime(exported, batch, n, seed):
    assert_encoder_matches_ort(
        exported, batch, n, seed, TINY["vocab_size"], VARIANT.tolerance, keep_first_token=True
    )
