"""softmax attention against a naive reference written from the paper's formula."""

from __future__ import annotations

import math

import pytest
import torch

from attnx.exporter.assemble import assemble
from attnx.exporter.lowering import lower
from attnx.plugins.softmax.kernel import SOFTMAX_OP, softmax_attention
from attnx.testing.onnx_op import OpSession, node_model
from attnx.trt.graph import attention_nodes
from tests.plugins import op_harness as harness

MASKED = -65504.0


def naive_softmax_attention(q, k, v, key_padding_mask=None, causal=False, scale=None):
    """Explicit loops: score_ij = q_i . k_j * scale, masked, softmax over j, sum_j p_ij v_j; with fewer key
    and value heads (grouped-query), query head i reads key/value head i // (h / kv heads)."""
    b, h, n, d = q.shape
    m, group = k.shape[2], h // k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                scores = []
                for j in range(m):
                    s = float(q[bi, hi, i].double() @ k[bi, hi // group, j].double()) * scale
                    if key_padding_mask is not None and not key_padding_mask[bi, j]:
                        s += MASKED
                    if causal and j > i + (m - n):
                        s = -math.inf
                    scores.append(s)
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for j in range(m):
                    out[bi, hi, i] += weights[j] / total * v[bi, hi // group, j].double()
    return out


CASES = [
    # batch, heads, n_queries, n_keys, dim, causal, mask (harness.padding_mask kinds)
    (1, 1, 1, 1, 4, False, "none"),
    (2, 3, 7, 7, 8, False, "prefix"),
    (2, 2, 13, 13, 16, True, "none"),
    (3, 2, 9, 9, 8, True, "prefix"),
    (2, 2, 5, 11, 8, False, "prefix"),  # cross attention, different key length
    (2, 1, 3, 10, 4, True, "none"),  # causal with a longer key history (cached decode alignment)
    (2, 2, 4, 9, 8, True, "prefix"),  # ... with padded keys
    (1, 2, 1, 12, 8, True, "none"),  # one query against a key history: a decode step
    (3, 2, 6, 6, 8, False, "empty-row"),  # batch row 0 has no real key
    (3, 1, 5, 7, 8, True, "empty-row"),  # ... causal, more keys
]
STANDARD_OPSET = 23  # from here the function body is the standard Attention op


@pytest.mark.parametrize(("batch", "heads", "n", "m", "d", "causal", "mask_kind"), CASES, ids=str)
def test_op_matches_naive_reference(batch, heads, n, m, d, causal, mask_kind):
    """In torch and in ONNX Runtime, every lowering at the default opset and the Attention-op body at 23;
    a fully padded row is plain attention (MASKED_SCORE shifts its scores alike), which the float64
    reference computes in the same way."""
    seed = hash((batch, heads, n, m, d, causal, len(mask_kind))) % 2**31  # ints: no PYTHONHASHSEED
    q, k, v, g = harness.random_qkv(batch, heads, n, m, d, seed)
    mask = harness.padding_mask(mask_kind, batch, m, g)
    scale = 1 / math.sqrt(d)
    results = harness.op_results(SOFTMAX_OP, q, k, v, mask, causal, scale)
    results["attention-op"] = harness.run_onnx(SOFTMAX_OP, q, k, v, mask, causal, scale, opset=STANDARD_OPSET)
    expected = naive_softmax_attention(q, k, v, mask, causal, scale)
    results = {name: result.double() for name, result in results.items()}
    # a fully padded row's scores sit near -65504, where float32 keeps ~3 decimal digits (ulp 0.004)
    loose = mask_kind == "empty-row"
    harness.assert_all_close(results, expected, atol=5e-3 if loose else 1e-5, rtol=5e-3 if loose else 1e-5)


GROUPED_CASES = [
    # batch, query heads, key/value heads, n_queries, n_keys, causal, mask
    (2, 6, 2, 9, 9, True, "none"),  # a prefill
    (1, 4, 1, 1, 13, True, "none"),  # a decode step after cached keys, one key/value head
    (2, 6, 3, 7, 7, False, "prefix"),
    (2, 4, 2, 5, 11, True, "empty-row"),
]


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "n", "m", "causal", "mask_kind"), GROUPED_CASES, ids=str
)
def test_grouped_query_heads_read_their_key_value_head(batch, heads, kv_heads, n, m, causal, mask_kind):
    """Keys and values of fewer heads (grouped-query attention, HF's repeat_kv layout) in torch, every
    lowering, the Attention-op body and the ort target's, against the loops; and the same as the op on
    keys and values repeated to the query heads."""
    q, _, _, g = harness.random_qkv(batch, heads, n, m, 8, seed=heads * 100 + kv_heads * 10 + n)
    k, v = torch.randn(batch, kv_heads, m, 8, generator=g), torch.randn(batch, kv_heads, m, 8, generator=g)
    mask = harness.padding_mask(mask_kind, batch, m, g)
    args = (q, k, v, mask, causal, 0.3)
    results = harness.op_results(SOFTMAX_OP, *args)
    results["attention-op"] = harness.run_onnx(SOFTMAX_OP, *args, opset=STANDARD_OPSET)
    call = harness.op_call(SOFTMAX_OP, *args)
    results["ort"] = torch.from_numpy(OpSession(SOFTMAX_OP, call, target="ort").run(call.bound())[0])
    repeated = [t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v)]
    results["repeated"] = softmax_attention(q, *repeated, mask, causal, 0.3)
    expected = naive_softmax_attention(q, k, v, mask, causal, 0.3)
    loose = mask_kind == "empty-row"  # see test_op_matches_naive_reference
    harness.assert_all_close(
        {name: result.double() for name, result in results.items()},
        expected,
        atol=5e-3 if loose else 1e-5,
        rtol=5e-3 if loose else 1e-5,
    )


@pytest.mark.parametrize("opset", [18, 22, 23, 25])
@pytest.mark.parametrize(("masked", "causal"), [(True, True), (True, False), (False, True), (False, False)])
def test_body_is_the_attention_op_from_opset_23(opset, masked, causal):
    """The function lowering picks the Attention-op body where the opset has it, the primitive body below
    it and in the decomposed lowering (which must also hold no Attention node)."""
    q, k, v, g = harness.random_qkv(1, 1, 3, 5, 4, seed=3)
    mask = harness.padding_mask("prefix" if masked else "none", 1, 5, g)
    call = harness.op_call(SOFTMAX_OP, q, k, v, mask, causal, 0.5)
    for lowering in ("function", "decomposed"):
        model = lower(node_model(SOFTMAX_OP, call, opset), [SOFTMAX_OP], lowering)
        assert bool(attention_nodes(model)) == (lowering == "function" and opset >= STANDARD_OPSET), lowering
        assert {o.version for o in model.opset_import if o.domain == ""} == {opset}


def test_fully_padded_row_stays_finite():
    """-65504 is added to every score of the row: a constant shift, so plain attention results."""
    q, k, v = (torch.randn(1, 1, 4, 8) for _ in range(3))
    out = softmax_attention(q, k, v, torch.zeros(1, 4, dtype=torch.bool), False, 0.5)
    assert torch.isfinite(out).all()
    # scores near -65504 keep ~3 decimal digits in fp32 (ulp 0.004), hence the tolerance
    torch.testing.assert_close(out, softmax_attention(q, k, v, None, False, 0.5), atol=5e-3, rtol=5e-3)


def test_layer_uses_projections_and_heads():
    """The whole layer equals naive attention over its own projections."""
    module = assemble("softmax", "encoder", {"d_model": 16, "n_heads": 4, "n_layers": 1, "d_ff": 8}).module
    layer = module.blocks[0].attention
    x = torch.randn(2, 6, 16)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    q, k, v = harness.split_qkv(layer, x)
    expected = harness.merge_heads(layer, naive_softmax_attention(q, k, v, mask)).float()
    with torch.no_grad():
        torch.testing.assert_close(layer(x, key_padding_mask=mask), expected, atol=1e-5, rtol=1e-4)


# -- fp16: torch, ONNX Runtime and native fp16 arithmetic against the float64 reference ------------------


FP16_CASES = [
    # batch, heads, n_queries, n_keys, dim, causal, mask ("none", "prefix", "empty": batch row 0 all padded)
    (1, 1, 1, 1, 64, False, "none"),
    (2, 2, 1, 1, 64, True, "empty"),  # N = 1, its only key padded
    (2, 2, 7, 7, 64, True, "prefix"),
    (2, 3, 13, 13, 64, False, "none"),
    (3, 2, 9, 9, 64, False, "empty"),
    (2, 2, 5, 11, 64, False, "prefix"),  # cross attention
    (2, 2, 3, 10, 64, True, "empty"),  # causal with a longer key history
]


@pytest.mark.parametrize(("batch", "heads", "n", "m", "d", "causal", "mask_kind"), FP16_CASES, ids=str)
@pytest.mark.parametrize("magnitude", [1.0, 4.0])
def test_fp16_op_is_finite_and_accurate(batch, heads, n, m, d, causal, mask_kind, magnitude):
    """q, k ~ magnitude * randn, d = 64: at 4 the scaled scores reach |s| ~ 60 (|q.k| in the hundreds), where
    fp16 keeps 5 fractional bits and the softmax is nearly one-hot; at 1 the weights are spread, so every
    visible key counts. Rows whose keys are all padded stay finite and give plain attention, as
    MASKED_SCORE shifts every score alike (the body adds it in float32, so native fp16 too).

    fp16 rounds the output (u |o|, u = 2**-11) and, in native fp16, the scores (u |s| <= 0.03 at |s| ~ 60,
    moving the output by at most that times max |v_i - v_j|). Measured: torch and ORT <= 1.5e-3 max|ref|,
    native <= 2.3e-3 max|ref|; the bound 5e-3 max|ref| + 2e-3 leaves 2.5x room, while a dropped or extra
    key, a wrong mask or an overflow moves outputs by O(max |v|) ~ 3."""
    seed = 1000 * n + 10 * m + batch + int(magnitude)
    q, k, v, g = harness.random_qkv(batch, heads, n, m, d, seed, dtype=torch.float16, magnitude=magnitude)
    mask = harness.padding_mask("none" if mask_kind == "none" else "prefix", batch, m, g)
    if mask_kind == "empty":
        mask[0] = False
    scale = 1 / math.sqrt(d)
    expected = naive_softmax_attention(q, k, v, mask, causal, scale)
    results = harness.fp16_results(SOFTMAX_OP, q, k, v, mask, causal, scale)
    results["attention-op"] = harness.run_onnx(SOFTMAX_OP, q, k, v, mask, causal, scale, opset=STANDARD_OPSET)
    harness.assert_fp16_close(results, expected)


def test_fp16_body_scales_before_the_product():
    """|q.k| reaches ~1e5 > 65504 and would overflow fp16; q * scale first keeps |scores| below ~60."""
    q, k, v, _ = harness.random_qkv(2, 2, 8, 8, 64, seed=65504, dtype=torch.float16, magnitude=64.0)
    assert (q.double() @ k.double().transpose(-1, -2)).abs().max() > 65504
    expected = naive_softmax_attention(q, k, v, None, True, 2**-11)
    harness.assert_fp16_close(harness.fp16_results(SOFTMAX_OP, q, k, v, None, True, 2**-11), expected)


def test_fp16_fully_padded_row_in_native_fp16_arithmetic():
    """Scores -64 and -60 plus the -65504 padding bias overflow fp16: the body adds them in float32
    (native fp16 arithmetic; torch and ORT are checked alike)."""
    q = torch.ones(1, 1, 1, 64, dtype=torch.float16)
    k = torch.tensor([-8.0, -7.5], dtype=torch.float16).repeat_interleave(64).view(1, 1, 2, 64)
    v = torch.tensor([1.0, 3.0], dtype=torch.float16).view(1, 1, 2, 1)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    expected = naive_softmax_attention(q, k, v, mask, False, 0.125)  # scores -64 and -60
    harness.assert_fp16_close(harness.fp16_results(SOFTMAX_OP, q, k, v, mask, False, 0.125), expected)
