"""reformer: the LSH op, its ONNX bodies and the layer against an explicit N x N form of the paper."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import numpy_helper

from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.plugins.reformer import VARIANT, ReformerConfig
from attnx.plugins.reformer.kernel import REFORMER_OP, reformer_attention
from attnx.variant import AttentionSpec
from tests.helpers import assert_unchanged
from tests.plugins import op_harness as harness
from tests.plugins.encoder_parity import TINY as ENCODER_TINY
from tests.plugins.encoder_parity import encoder_fixture, encoder_property_test, export_in_lowering

SELF_SCORE = -65504.0  # a token's score for itself: it wins only when nothing else is visible
NORM_EPS = 1e-6
TINY = {**ENCODER_TINY, "chunk_size": 8}

# -- the reference: Reformer sec. 2 + appendix A as explicit N x N matrices, float64 ----------------------


def naive_buckets(x, rotation):
    """h(x) = argmax([xR, -xR]) for x (n, d), R (d, n_buckets/2); asserts no near-tie could flip it."""
    both = torch.cat([x @ rotation, -(x @ rotation)], dim=-1)
    top2 = both.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]) / (x.norm(dim=-1) * rotation.norm(dim=0).max() + 1e-30)
    assert margin.min() > 1e-5, (
        "a near-tie between buckets: pick another seed (float32 could round either way)"
    )
    return both.argmax(dim=-1)


def naive_lsh(qk, v, rotations, mask=None, causal=False, chunk_size=64):
    """o_i = sum_r exp(z_r(i) - logsumexp_r z_r(i)) o_r(i), each round a softmax over all n keys.

    Round r sees key j from query i iff h_r(i) = h_r(j) (not the padding bucket), j != i, and
    - bidirectional (the paper): j's sorted chunk is i's or the one before (sort by (bucket, position));
    - causal (attnx): j < i and rank_r(i) - rank_r(j) <= chunk_size (sorted indices; not the paper's chunks,
      which depend on later tokens' buckets).
    Visible scores are q_i.k_j - log N_ij (N_ij: rounds in which i sees j); i's own score is SELF_SCORE;
    all else -inf. Padded tokens go to an extra bucket n_buckets.
    """
    qk, v, rotations = qk.double(), v.double(), rotations.double()
    batch, heads, n, _ = qk.shape
    n_hashes, n_buckets = rotations.shape[2], 2 * rotations.shape[3]
    position = torch.arange(n)
    out = torch.zeros(batch, heads, n, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        real = torch.ones(n, dtype=torch.bool) if mask is None else mask[b]
        for h in range(heads):
            x = qk[b, h]
            sees = []  # per round, the N x N mask "query i sees key j"
            for r in range(n_hashes):
                bucket = torch.where(real, naive_buckets(x, rotations[h, :, r]), n_buckets)
                order = sorted(range(n), key=lambda i: (int(bucket[i]), i))
                rank = torch.empty(n, dtype=torch.long)
                rank[order] = position
                same = (bucket[:, None] == bucket[None, :]) & (bucket[:, None] < n_buckets)
                if causal:
                    earlier = position[None, :] < position[:, None]
                    window = (rank[:, None] - rank[None, :] <= chunk_size) & earlier
                else:
                    chunk_gap = (rank // chunk_size)[:, None] - (rank // chunk_size)[None, :]
                    window = (chunk_gap == 0) | (chunk_gap == 1)
                sees.append(same & window & (position[:, None] != position[None, :]))
            counts = sum(visible.double() for visible in sees)
            dots = x @ (x / torch.sqrt((x * x).sum(-1, keepdim=True) + NORM_EPS)).T
            hidden = torch.full((n, n), float("-inf"), dtype=torch.float64).fill_diagonal_(SELF_SCORE)
            logsumexps, outputs = [], []
            for visible in sees:
                scores = torch.where(visible, dots - torch.log(counts.clamp_min(1)), hidden)
                logsumexps.append(torch.logsumexp(scores, -1))
                outputs.append(torch.softmax(scores, -1) @ v[b, h])
            lse = torch.stack(logsumexps)
            out[b, h] = (torch.exp(lse - torch.logsumexp(lse, 0))[..., None] * torch.stack(outputs)).sum(0)
    return out


def naive_layer(layer, x, mask=None):
    """The layer from its parameters: shared QK and V projections, naive_lsh per head, output projection."""
    qk, v = harness.split_heads(layer, "qk_proj", x), harness.split_heads(layer, "v_proj", x)
    return harness.merge_heads(layer, naive_lsh(qk, v, layer.rotations, mask, layer.causal, layer.chunk_size))


# -- inputs ----------------------------------------------------------------------------------------------


def random_inputs(batch, heads, n, d, n_hashes, n_buckets, seed):
    g = torch.Generator().manual_seed(seed)
    qk, v = (torch.randn(batch, heads, n, d, generator=g) for _ in range(2))
    rotations = torch.randn(heads, d, n_hashes, n_buckets // 2, generator=g)
    return qk, v, rotations, g


# -- the op ----------------------------------------------------------------------------------------------

CASES = [
    # batch, heads, n, d, n_hashes, n_buckets, chunk_size, causal, mask
    (1, 1, 1, 4, 2, 8, 64, False, "none"),  # N = 1
    (2, 2, 1, 8, 3, 4, 4, True, "prefix"),  # N = 1, causal
    (2, 2, 7, 8, 1, 4, 4, False, "prefix"),  # odd N, one round, N not a multiple of the chunk
    (2, 3, 13, 8, 3, 8, 4, True, "random"),  # three rounds, causal
    (1, 2, 33, 16, 2, 8, 8, False, "none"),
    (2, 2, 37, 8, 2, 2, 1, True, "none"),  # chunks of one token: each sees only its predecessor
    # Buckets larger than a chunk: the causal window (chunk_size sorted predecessors) is not the paper's.
    (2, 2, 41, 8, 2, 2, 4, True, "prefix"),
    (1, 3, 59, 8, 3, 4, 6, True, "random"),
    (2, 2, 50, 8, 3, 16, 64, False, "empty-row"),  # a single chunk; a row with no real token
    (1, 2, 130, 16, 2, 8, 64, True, "prefix"),  # default options, three chunks
    (2, 1, 64, 8, 2, 4, 16, False, "none"),  # N a multiple of the chunk
]


@pytest.mark.parametrize(
    ("batch", "heads", "n", "d", "n_hashes", "n_buckets", "chunk", "causal", "mask_kind"), CASES, ids=str
)
def test_op_matches_reference_in_torch_and_onnx(
    batch, heads, n, d, n_hashes, n_buckets, chunk, causal, mask_kind
):
    qk, v, rotations, g = random_inputs(batch, heads, n, d, n_hashes, n_buckets, seed=n * 7 + d + n_hashes)
    mask = harness.padding_mask(mask_kind, batch, n, g)
    expected = naive_lsh(qk, v, rotations, mask, causal, chunk).float()
    results = harness.op_results(REFORMER_OP, qk, v, rotations, mask, causal, chunk)
    harness.assert_all_close(results, expected, atol=1e-5, rtol=1e-4)


FP16_CASES = [
    # batch, heads, n, n_hashes, n_buckets, chunk_size, causal, mask; head dim 64
    (1, 1, 1, 2, 8, 4, False, "none"),  # N = 1
    (2, 2, 1, 2, 4, 4, True, "empty-row"),  # N = 1, causal, batch row 0 padded
    (2, 2, 7, 1, 4, 4, False, "prefix"),  # odd N
    (2, 3, 13, 3, 8, 4, True, "random"),
    (2, 2, 33, 2, 8, 8, False, "empty-row"),  # the row with no real token: each token sees only itself
    (1, 2, 41, 2, 2, 4, True, "prefix"),
]


@pytest.mark.parametrize(
    ("batch", "heads", "n", "n_hashes", "n_buckets", "chunk", "causal", "mask_kind", "magnitude"),
    [(*case, magnitude) for case in FP16_CASES for magnitude in (1.0, 4.0)]
    + [(2, 2, 33, 2, 8, 8, True, "prefix", 40.0)],  # |qk| > 256: its squared norm overflows fp16
    ids=str,
)
def test_fp16_op_is_finite_and_accurate(
    batch, heads, n, n_hashes, n_buckets, chunk, causal, mask_kind, magnitude
):
    """qk ~ magnitude * randn, d = 64, all inputs fp16: torch, ORT (function body) and native fp16 arithmetic.

    At magnitude 4, |qk| ~ 32 and the scores q.k/|k| reach ~30, where fp16 keeps 5 fractional bits. Buckets
    are hashed in float32 (naive_buckets asserts no near-tie), so fp16 moves only scores and sums. Tolerance:
    fp16's unit roundoff u = 2**-11 ~ 4.9e-4 on the output (u |o|) and on the scores (u |s| <= 0.015, moving
    the output by at most that times max |v_i - v_j|). Measured: torch and native <= 2.0e-3 max|ref|, ORT
    (float32 inside) <= 0.9e-3 max|ref|; the bound 5e-3 max|ref| + 2e-3 (~10 u) leaves ~3x room, while a
    wrong bucket, window or mask moves outputs by O(max |v|) ~ 3.
    """
    seed = 10 * n + int(magnitude)
    qk, v, rotations, g = random_inputs(batch, heads, n, 64, n_hashes, n_buckets, seed)
    qk, v, rotations = (magnitude * qk).half(), v.half(), rotations.half()
    mask = harness.padding_mask(mask_kind, batch, n, g)
    expected = naive_lsh(qk, v, rotations, mask, causal, chunk)
    harness.assert_fp16_close(
        harness.fp16_results(REFORMER_OP, qk, v, rotations, mask, causal, chunk), expected
    )


def test_padding_is_invisible_to_real_tokens():
    """Padded tokens go to their own bucket, so real tokens sort and chunk as if they were absent."""
    qk, v, rotations, g = random_inputs(2, 2, 29, 8, 2, 8, seed=11)
    mask = torch.arange(29) < torch.tensor([[29], [17]])
    for causal in (False, True):
        padded = reformer_attention(qk, v, rotations, mask, causal, 4)
        alone = reformer_attention(qk[1:, :, :17], v[1:, :, :17], rotations, None, causal, 4)
        torch.testing.assert_close(padded[1:, :, :17], alone, atol=1e-6, rtol=1e-6)
        noise = 100 * torch.randn(2, *qk.shape, generator=g) * ~mask[:, None, :, None]
        shaken = reformer_attention(qk + noise[0], v + noise[1], rotations, mask, causal, 4)
        assert_unchanged(shaken[1, :, :17], padded[1, :, :17])


def sorted_chunks(qk, rotations, mask, chunk_size):
    """Buckets and the paper's sorted chunks, (b, h, r, n) each: what a change of later tokens moved."""
    n, n_buckets = qk.shape[-2], 2 * rotations.shape[-1]
    projected = torch.einsum("bhnd,hdrk->bhrnk", qk, rotations)
    bucket = torch.cat([projected, -projected], dim=-1).argmax(-1)
    if mask is not None:
        bucket = torch.where(mask[:, None, None, :], bucket, n_buckets)
    rank = torch.argsort(torch.argsort(bucket * n + torch.arange(n), dim=-1), dim=-1)
    return bucket, rank // chunk_size


@pytest.mark.parametrize(
    ("seed", "n", "chunk", "n_buckets", "mask_kind"),
    [
        (0, 23, 4, 4, "none"),
        (1, 45, 8, 2, "random"),
        (2, 61, 4, 8, "prefix"),
        (3, 97, 16, 4, "none"),
        (4, 31, 3, 2, "random"),
    ],
)
def test_changing_any_later_tokens_leaves_earlier_outputs_unchanged(seed, n, chunk, n_buckets, mask_kind):
    """Strict causality: new qk, v (and padding) at positions >= cut change later buckets and move earlier
    tokens' sorted chunks (so the paper's rule would leak); outputs before cut stay unchanged up to rounding
    in torch and within 1e-6 in ONNX Runtime."""
    qk, v, rotations, g = random_inputs(2, 2, n, 8, 3, n_buckets, seed=seed)
    mask = harness.padding_mask(mask_kind, 2, n, g)
    before = reformer_attention(qk, v, rotations, mask, True, chunk)
    ort_before = harness.run_onnx(REFORMER_OP, qk, v, rotations, mask, True, chunk)
    buckets, chunks = sorted_chunks(qk, rotations, mask, chunk)
    moved_a_chunk = False
    for cut in (1, n // 3, 2 * n // 3, n - 1):
        changed_qk, changed_v = qk.clone(), v.clone()
        later = torch.randn(2, *qk[..., cut:, :].shape, generator=g)
        changed_qk[..., cut:, :], changed_v[..., cut:, :] = later
        changed_mask = None if mask is None else mask.clone()
        if changed_mask is not None:
            changed_mask[:, cut:] = torch.rand(2, n - cut, generator=g) > 0.4
        new_buckets, new_chunks = sorted_chunks(changed_qk, rotations, changed_mask, chunk)
        assert not torch.equal(new_buckets[..., cut:], buckets[..., cut:])
        moved_a_chunk |= not torch.equal(new_chunks[..., :cut], chunks[..., :cut])

        after = reformer_attention(changed_qk, changed_v, rotations, changed_mask, True, chunk)
        assert_unchanged(after[..., :cut, :], before[..., :cut, :], f"cut={cut}")
        assert not torch.allclose(after[..., cut:, :], before[..., cut:, :])
        ort_after = harness.run_onnx(REFORMER_OP, changed_qk, changed_v, rotations, changed_mask, True, chunk)
        torch.testing.assert_close(ort_after[..., :cut, :], ort_before[..., :cut, :], atol=1e-6, rtol=0)
    assert moved_a_chunk, "no earlier token changed sorted chunk: the case the paper's rule leaks is untested"


def test_later_buckets_do_not_change_which_past_keys_a_query_sees():
    """The paper's leak, closed. Chunks of 2, R = I so e0 hashes to bucket 0 and e1 to bucket 1; tokens
    0-3 and 5 are e1. Token 4 = e0 sorts first and puts query 3 in the chunk (3, 5), token 4 = e1 puts it
    in (2, 3): the paper's rule shows query 3 the past keys {1, 2}, then {0, 1, 2}. attnx shows it its
    chunk_size = 2 sorted predecessors of its bucket, {1, 2}, in both cases.
    """
    rotations = torch.eye(2).reshape(1, 2, 1, 2)
    e0, e1 = torch.tensor([1.0, 0.1]), torch.tensor([0.1, 1.0])
    tokens = torch.stack([e1, e1, e1, e1, e0, e1])[None, None]
    moved = tokens.clone()
    moved[0, 0, 4] = e1
    v = torch.randn(1, 1, 6, 3, generator=torch.Generator().manual_seed(0))
    before, after = (reformer_attention(qk, v, rotations, None, True, 2) for qk in (tokens, moved))
    for qk, result in ((tokens, before), (moved, after)):
        torch.testing.assert_close(result, naive_lsh(qk, v, rotations, None, True, 2).float())
        torch.testing.assert_close(result[0, 0, 3], v[0, 0, 1:3].mean(0))  # equal scores: the mean
    assert_unchanged(after[..., :4, :], before[..., :4, :])


# -- the layer -------------------------------------------------------------------------------------------


def reformer_layer(causal=False, seed=0, **options):
    return harness.build_layer(VARIANT, ReformerConfig(**options), seed=seed, causal=causal)


@pytest.mark.parametrize(
    ("batch", "n", "causal", "mask_kind", "options"),
    [
        (1, 1, False, "none", {}),
        (2, 9, True, "prefix", {"chunk_size": 2, "n_hashes": 3, "n_buckets": 2}),
        (3, 21, False, "random", {"chunk_size": 4, "n_buckets": 4}),
        (2, 70, True, "random", {"n_hashes": 1}),
    ],
    ids=str,
)
def test_layer_matches_reference(batch, n, causal, mask_kind, options):
    layer = reformer_layer(causal=causal, seed=n, **options)
    x, _, mask = harness.layer_inputs(batch, n, None, mask_kind, seed=n + 1000)
    expected = naive_layer(layer, x, mask).float()
    torch.testing.assert_close(harness.run_layer(layer, x, mask=mask), expected, atol=1e-5, rtol=1e-4)


def test_causal_layer_and_language_model_ignore_later_tokens():
    """Through the layer (Variant.build with a causal spec) and a whole reformer LM (reversible blocks,
    chunked FFN): new later inputs leave earlier outputs unchanged up to rounding."""
    layer = reformer_layer(causal=True, seed=5, chunk_size=4, n_buckets=2)
    lm = assemble("reformer", "lm", {**TINY, "n_layers": 2, "n_buckets": 2, "chunk_size": 4}, seed=5).module
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 37, 24, generator=g)
    ids = torch.randint(0, TINY["vocab_size"], (2, 37), generator=g)
    with torch.no_grad():
        base, (base_logits,) = layer(x), lm(ids)
        for cut in (1, 12, 25, 36):
            changed_x, changed_ids = x.clone(), ids.clone()
            changed_x[:, cut:] = torch.randn(2, 37 - cut, 24, generator=g)
            changed_ids[:, cut:] = torch.randint(0, TINY["vocab_size"], (2, 37 - cut), generator=g)
            (logits,) = lm(changed_ids)
            assert_unchanged(layer(changed_x)[:, :cut], base[:, :cut], f"layer, cut={cut}")
            assert_unchanged(logits[:, :cut], base_logits[:, :cut], f"lm, cut={cut}")
            assert not torch.allclose(logits[:, cut:], base_logits[:, cut:])


def test_layer_shares_queries_and_keys_and_refuses_a_context():
    layer = reformer_layer()
    names = {name for name, _ in layer.named_parameters()}
    assert names == {f"{p}.{t}" for p in ("qk_proj", "v_proj", "out_proj") for t in ("weight", "bias")}
    with pytest.raises(AttnxError, match="self-attention only"):
        layer(torch.randn(1, 3, 24), context=torch.randn(1, 4, 24))


def test_rotations_are_a_seeded_buffer_in_the_state_dict():
    def rotations(seed):
        module = assemble("reformer", "encoder", TINY, seed=seed).module
        return module.state_dict()["blocks.0.attention.rotations"]

    first = rotations(0)
    assert first.shape == (2, 16, 2, 4)  # (heads, d_head, n_hashes, n_buckets / 2)
    assert torch.equal(first, rotations(0))
    assert not torch.equal(first, rotations(1))


def test_declaration_and_config():
    caps = VARIANT.capabilities
    assert (caps.causal, caps.cross, caps.key_padding_mask, caps.decode) == (True, False, True, None)
    assert VARIANT.make_config({"n_hashes": "3", "n_buckets": "4", "chunk_size": "16"}) == ReformerConfig(
        3, 4, 16
    )
    for option, value in (("n_hashes", 0), ("n_buckets", 7), ("n_buckets", 0), ("chunk_size", 0)):
        with pytest.raises(AttnxError, match=f"{option}={value} must be") as error:
            VARIANT.make_config({option: value})
        assert "\n" not in str(error.value)


def test_cross_attention_is_refused_at_build_time():
    with pytest.raises(AttnxError, match="does not support cross attention") as error:
        VARIANT.check_spec(AttentionSpec(32, 2, cross=True))
    assert "supports: bidirectional, causal, key padding mask, fp32 only" in str(error.value)
    VARIANT.check_spec(AttentionSpec(32, 2, causal=True))


# -- export ----------------------------------------------------------------------------------------------


# the plugin lowering in the slow run: tests/trt/test_ortkernels.py runs every variant's plugin export
# through the CPU kernels in the default run
@pytest.mark.parametrize(
    "lowering", ["function", "decomposed", pytest.param("plugin", marks=pytest.mark.slow)]
)
def test_export_verifies_in_every_lowering(tmp_path, lowering):
    out = tmp_path / "out"
    _, model, nodes = export_in_lowering(
        "reformer", out, TINY, lowering, "ReformerAttention", seq_lens=[1, 7, 33, 130]
    )
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    expected = assemble("reformer", "encoder", TINY, seed=0).module.state_dict()[
        "blocks.0.attention.rotations"
    ]
    np.testing.assert_array_equal(initializers["blocks.0.attention.rotations"], expected.numpy())
    if lowering == "decomposed":
        assert {"TopK", "ScatterElements", "GatherElements"} <= {node.op_type for node in model.graph.node}
    else:
        assert nodes[0].input[2] == "blocks.0.attention.rotations"


exported = encoder_fixture("reformer", {**TINY, "n_hashes": 3, "chunk_size": 4})  # rotations in the weights
test_property_torch_matches_onnxruntime = encoder_property_test(VARIANT)
