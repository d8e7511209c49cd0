"""softmax attention against a naive reference written from the paper's formula."""

from __future__ import annotations

import math

import pytest
import torch

from attnx.exporter.assemble import assemble
from attnx.plugins.softmax.kernel import softmax_attention

MASKED = -65504.0


def naive_softmax_attention(q, k, v, key_padding_mask=None, causal=False, scale=None):
    """Explicit loops: score_ij = q_i . k_j * scale, masked, softmax over j, sum_j p_ij v_j."""
    b, h, n, d = q.shape
    m = k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                scores = []
                for j in range(m):
                    s = float(q[bi, hi, i].double() @ k[bi, hi, j].double()) * scale
                    if key_padding_mask is not None and not key_padding_mask[bi, j]:
                        s += MASKED
                    if causal and j > i + (m - n):
                        s = -math.inf
                    scores.append(s)
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for j in range(m):
                    out[bi, hi, i] += weights[j] / total * v[bi, hi, j].double()
    return out


def right_padding(batch, length, generator):
    lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    return torch.arange(length)[None, :] < lengths[:, None]


CASES = [
    # batch, heads, n_queries, n_keys, dim, causal, masked
    (1, 1, 1, 1, 4, False, False),
    (2, 3, 7, 7, 8, False, True),
    (2, 2, 13, 13, 16, True, False),
    (3, 2, 9, 9, 8, True, True),
    (2, 2, 5, 11, 8, False, True),  # cross attention, different key length
    (2, 1, 3, 10, 4, True, False),  # causal with a longer key history (cached decode alignment)
]


@pytest.mark.parametrize(("batch", "heads", "n", "m", "d", "causal", "masked"), CASES)
def test_op_matches_naive_reference(batch, heads, n, m, d, causal, masked):
    generator = torch.Generator().manual_seed(hash((batch, heads, n, m, d, causal, masked)) % 2**31)
    q, k, v = (torch.randn(batch, heads, x, d, generator=generator) for x in (n, m, m))
    mask = right_padding(batch, m, generator) if masked else None
    scale = 1 / math.sqrt(d)
    got = softmax_attention(q, k, v, mask, causal, scale)
    expected = naive_softmax_attention(q, k, v, mask, causal, scale)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


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

    def heads(t):
        return t.view(2, 6, 4, 4).transpose(1, 2)

    q, k, v = heads(layer.q_proj(x)), heads(layer.k_proj(x)), heads(layer.v_proj(x))
    merged = naive_softmax_attention(q, k, v, mask).float().transpose(1, 2).reshape(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(
            layer(x, key_padding_mask=mask), layer.out_proj(merged), atol=1e-5, rtol=1e-4
        )
