"""The gated / delta-rule op against Hugging Face transformers' own reference functions (5.24).

Qwen3-Next (``models/qwen3_next``): ``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule``;
Kimi Linear (``models/kimi_linear``): ``recurrent_kimi_delta_attention`` and ``chunk_kimi_delta_attention``.
Their conventions, and what attnx's caller does instead:

* layout (batch, seq, heads, dim), attnx's (batch, heads, seq, dim): transposed here;
* q and k are L2-normalised inside with ``use_qk_l2norm_in_kernel=True`` (Qwen: x * rsqrt(sum x^2 + 1e-6),
  Kimi: x / sqrt(sum x^2 + 1e-6), the same map): attnx takes q, k as given, so the test normalises them;
* q is always scaled by d_k^-1/2 inside: attnx's ``scale`` argument;
* g is the log-decay (<= 0) per token and value head (Qwen, (b, n, hv)) or also per key dimension (Kimi,
  (b, n, h, dk)): attnx's g with a trailing axis of 1 or dk; beta (b, n, hv) as attnx's (b, hv, n);
* grouped heads (Qwen only): each q/k head serves hv / hk consecutive value heads, as attnx's;
* the state (b, hv, dk, dv) is attnx's layout; the recurrence runs in float32.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from transformers.models.kimi_linear import modeling_kimi_linear as kimi_linear
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

from attnx.plugins.gated.op import gated_delta_rule_step
from tests.plugins.gated.cases import Shape, draw


def pure_torch(function):
    """transformers' own torch function, not the hub-kernel wrapper around it (which calls
    flash-linear-attention's GPU kernels instead whenever that library is installed)."""
    pure = inspect.unwrap(function)
    assert pure.__module__.startswith("transformers."), pure.__module__
    return pure


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def hf_layout(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.transpose(1, 2).contiguous() for t in tensors]


QWEN = [
    # batch, hk, hv, n, dk, dv: grouped heads, odd lengths, across HF's 64-token chunks
    (2, 2, 4, 37, 16, 8),
    (1, 1, 2, 130, 8, 12),
    (1, 2, 2, 1, 8, 8),
]


@pytest.mark.parametrize("with_state", [False, True], ids=["empty", "state"])
@pytest.mark.parametrize(("batch", "hk", "hv", "n", "dk", "dv"), QWEN, ids=str)
@pytest.mark.parametrize("form", ["recurrent", "chunk"])
def test_qwen3_next_gated_delta_rule(form, batch, hk, hv, n, dk, dv, with_state):
    shape = Shape(batch, hk, hv, n, dk, dv, per_key=False, delta=True, chunk=32, state=with_state)
    q, k, v, g, beta, state = draw(shape, seed=n + dk)
    k = 3 * k  # not unit vectors: HF normalises q and k inside, attnx leaves it to the caller
    function = pure_torch(getattr(qwen3_next, f"torch_{form}_gated_delta_rule"))
    hq, hk_, hv_ = hf_layout(q, k, v)
    expected, expected_state = function(
        hq,
        hk_,
        hv_,
        g[..., 0].transpose(1, 2),
        beta.transpose(1, 2),
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    out, grown = gated_delta_rule_step(l2norm(q), l2norm(k), v, g, beta, state, True, dk**-0.5, 32)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(grown, expected_state, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("with_state", [False, True], ids=["empty", "state"])
@pytest.mark.parametrize(("batch", "heads", "n", "dk", "dv"), [(2, 2, 45, 16, 8), (1, 3, 70, 8, 8)], ids=str)
@pytest.mark.parametrize("form", ["recurrent", "chunk"])
def test_kimi_delta_attention(form, batch, heads, n, dk, dv, with_state):
    """KDA: a decay per key dimension, bounded as Kimi's gate is (-5 sigmoid(.) >= -5 per token)."""
    shape = Shape(batch, heads, heads, n, dk, dv, per_key=True, delta=True, chunk=16, state=with_state)
    q, k, v, _, beta, state = draw(shape, seed=n + heads)
    k = 3 * k
    gen = torch.Generator().manual_seed(n)
    g = -5.0 * torch.sigmoid(torch.randn(batch, heads, n, dk, generator=gen))
    function = pure_torch(getattr(kimi_linear, f"{form}_kimi_delta_attention"))
    hq, hk, hv, hg = hf_layout(q, k, v, g)
    expected, expected_state = function(
        hq,
        hk,
        hv,
        hg,
        beta.transpose(1, 2),
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    out, grown = gated_delta_rule_step(l2norm(q), l2norm(k), v, g, beta, state, True, 1 / math.sqrt(dk), 16)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(grown, expected_state, atol=2e-5, rtol=1e-4)
