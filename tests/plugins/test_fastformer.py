"""fastformer: the op, its ONNX bodies and the layer against a token-by-token reference from the paper."""

from __future__ import annotations

import math

import pytest
import torch

from attnx.errors import AttnxError
from attnx.plugins.fastformer import VARIANT, FastformerConfig
from attnx.plugins.fastformer.kernel import FASTFORMER_OP, fastformer_attention
from attnx.variant import AttentionSpec
from tests.helpers import assert_unchanged
from tests.plugins import op_harness as harness
from tests.plugins.encoder_parity import TINY, encoder_fixture, encoder_property_test, export_in_lowering

SHAPES = [(1, 1, 1, 4), (2, 3, 7, 8), (3, 2, 16, 5), (2, 4, 33, 16)]  # (batch, heads, N, d_head)
MASKS = ["none", "prefix", "empty-row"]  # empty-row: batch row 0 all padding, the others random


# -- the reference: Fastformer eqs. (3)-(7), one (batch, head) and one token at a time, float64 ----------


def naive_pool(xs: list[torch.Tensor], w: torch.Tensor, real: list[bool], scale: float) -> torch.Tensor:
    """sum_i alpha_i x_i, alpha_i = exp(w·x_i·scale) / sum_j exp(w·x_j·scale) over real tokens.

    Padded tokens weigh 0; when no token is real every token weighs the same (attnx's finite convention).
    """
    if not any(real):
        weights = [1.0] * len(xs)
    else:
        scores = [float(torch.dot(w, x)) * scale for x in xs]
        top = max(s for s, r in zip(scores, real, strict=True) if r)
        weights = [math.exp(s - top) if r else 0.0 for s, r in zip(scores, real, strict=True)]
    total = sum(weights)
    pooled = torch.zeros_like(xs[0])
    for weight, x in zip(weights, xs, strict=True):
        pooled = pooled + (weight / total) * x
    return pooled


def naive_fastformer(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """u (batch, heads, N, d) in float64 from q, k, v (batch, heads, N, d), w_q, w_k (heads, d)."""
    q, k, v, w_q, w_k = (t.double() for t in (q, k, v, w_q, w_k))
    batch, heads, n, _ = q.shape
    out = torch.empty_like(v)
    for b in range(batch):
        real = [True if mask is None else bool(mask[b, i]) for i in range(n)]
        for h in range(heads):
            global_query = naive_pool([q[b, h, i] for i in range(n)], w_q[h], real, scale)
            p = [global_query * k[b, h, i] for i in range(n)]
            global_key = naive_pool(p, w_k[h], real, scale)
            for i in range(n):
                out[b, h, i] = global_key * v[b, h, i]
    return out


def naive_layer(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Recompute the whole layer with its own parameters: transform(concat_h u) + Q."""
    q, k = harness.split_heads(layer, "q_proj", x), harness.split_heads(layer, "k_proj", x)
    v = q if layer.v_proj is None else harness.split_heads(layer, "v_proj", x)
    u = naive_fastformer(q, k, v, layer.w_q.detach(), layer.w_k.detach(), mask, 1.0 / math.sqrt(q.shape[-1]))
    return harness.merge_heads(layer, u, "transform") + q.transpose(1, 2).flatten(2)


# -- inputs ----------------------------------------------------------------------------------------------


def op_inputs(
    shape: tuple[int, int, int, int], seed: int, dtype: torch.dtype = torch.float32, magnitude: float = 1.0
) -> tuple[list[torch.Tensor], torch.Generator]:
    """Random q, k, v (batch, heads, N, d) and w_q, w_k (heads, d), plus the generator for masks."""
    batch, heads, n, d = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, d, generator=g) * magnitude for _ in range(3))
    w_q, w_k = (torch.randn(heads, d, generator=g) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v, w_q, w_k)], g


# -- the op ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("share_qv", [False, True], ids=["qkv", "share_qv"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_op_matches_reference_in_torch_and_ort(shape, mask_kind, share_qv):
    (q, k, v, w_q, w_k), g = op_inputs(shape, seed=sum(shape) + 7 * MASKS.index(mask_kind))
    v = q if share_qv else v
    mask = harness.padding_mask(mask_kind, shape[0], shape[2], g)
    scale = 1.0 / math.sqrt(shape[-1])
    expected = naive_fastformer(q, k, v, w_q, w_k, mask, scale).float()
    results = harness.op_results(FASTFORMER_OP, q, k, v, w_q, w_k, mask, scale)
    harness.assert_all_close(results, expected, atol=1e-5, rtol=1e-4)


def test_padded_tokens_do_not_influence_real_ones():
    (q, k, v, w_q, w_k), g = op_inputs((2, 2, 9, 4), seed=3)
    mask = torch.arange(9) < torch.tensor([[5], [9]])
    before = fastformer_attention(q, k, v, w_q, w_k, mask, 0.5)
    noise = torch.randn(3, *q.shape, generator=g) * 100 * ~mask[:, None, :, None]
    after = fastformer_attention(q + noise[0], k + noise[1], v + noise[2], w_q, w_k, mask, 0.5)
    assert_unchanged(after * mask[:, None, :, None], before * mask[:, None, :, None])


@pytest.mark.parametrize("mask_kind", MASKS)
def test_fp16_op_is_finite_and_close(mask_kind):
    """torch, ORT (function body) and native fp16 arithmetic: measured <= 0.9e-2 max|ref| (native, with
    a fully padded row), within the bound 2e-2 max|ref|."""
    shape = (3, 2, 24, 8)
    tensors, g = op_inputs(shape, seed=11, dtype=torch.float16, magnitude=6.0)
    mask = harness.padding_mask(mask_kind, shape[0], shape[2], g)
    scale = 1.0 / math.sqrt(shape[-1])
    expected = naive_fastformer(*tensors, mask, scale)
    harness.assert_fp16_close(
        harness.fp16_results(FASTFORMER_OP, *tensors, mask, scale), expected, rel=2e-2, atol=0.0
    )


# -- the layer -------------------------------------------------------------------------------------------


def fastformer_layer(share_qv: bool, seed: int = 0) -> torch.nn.Module:
    layer = harness.build_layer(VARIANT, FastformerConfig(share_qv=share_qv), seed=seed)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_(0.0, 0.4)  # sharper than the init, so the poolings are far from uniform
    return layer


@pytest.mark.parametrize("share_qv", [False, True], ids=["qkv", "share_qv"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize(("batch", "n"), [(1, 1), (2, 7), (3, 20)])
def test_layer_matches_reference(batch, n, mask_kind, share_qv):
    layer = fastformer_layer(share_qv, seed=n)
    x, _, mask = harness.layer_inputs(batch, n, None, mask_kind, seed=100 + n)
    expected = naive_layer(layer, x, mask).float()
    torch.testing.assert_close(harness.run_layer(layer, x, mask=mask), expected, atol=1e-4, rtol=1e-4)


def test_layer_parameters_follow_the_paper():
    separate, shared = fastformer_layer(False), fastformer_layer(True)
    assert separate.w_q.shape == separate.w_k.shape == (3, 8)
    assert separate.v_proj is not None and shared.v_proj is None
    saved = sum(p.numel() for p in separate.parameters()) - sum(p.numel() for p in shared.parameters())
    assert saved == 24 * 24 + 24  # exactly the value projection


def test_capabilities_refuse_causal_and_cross():
    assert VARIANT.capabilities.key_padding_mask and VARIANT.capabilities.decode is None
    with pytest.raises(AttnxError, match="does not support causal"):
        VARIANT.check_spec(AttentionSpec(32, 2, causal=True))
    with pytest.raises(AttnxError, match="does not support cross"):
        VARIANT.check_spec(AttentionSpec(32, 2, cross=True))
    with pytest.raises(ValueError, match="cross"):
        fastformer_layer(False)(torch.randn(1, 3, 24), context=torch.randn(1, 4, 24))


# -- export ----------------------------------------------------------------------------------------------


# the plugin lowering in the slow run: tests/trt/test_ortkernels.py runs every variant's plugin export
# through the CPU kernels in the default run
@pytest.mark.parametrize(
    ("lowering", "share_qv"),
    [
        pytest.param("function", False, id="function-qkv", marks=pytest.mark.slow),
        pytest.param("function", True, id="function-share_qv"),
        pytest.param("decomposed", True, id="decomposed-share_qv"),
        pytest.param("plugin", False, id="plugin-qkv", marks=pytest.mark.slow),
    ],
)
def test_export_verifies_in_every_lowering(tmp_path, lowering, share_qv):
    options = {**TINY, "n_layers": 2, "share_qv": share_qv}
    out = tmp_path / "out"
    _, _, nodes = export_in_lowering(
        "fastformer", out, options, lowering, "FastformerAttention", n_nodes=2, seq_lens=[1, 7, 33], seed=5
    )
    assert all(node.input[3].endswith("w_q") and node.input[4].endswith("w_k") for node in nodes)
    assert all((node.input[0] == node.input[2]) == share_qv for node in nodes)


exported = encoder_fixture("fastformer", TINY)
test_property_torch_matches_onnxruntime = encoder_property_test(VARIANT, max_n=48)
