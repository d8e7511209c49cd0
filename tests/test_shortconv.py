"""attnx.shortconv: both forms of the short convolution (the grouped Conv over a whole sequence, the taps
over a carried window) and the carry they hand on, against a float64 loop from the definition."""

from __future__ import annotations

import pytest
import torch

from attnx.shortconv import carried_conv


def reference(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """out[b, t, c] = bias[c] + sum_j window[b, c, t + j] * weight[c, 0, j] for (b, C, K - 1 + n) window."""
    taps = weight.shape[-1]
    n = window.shape[-1] - taps + 1
    out = torch.zeros(window.shape[0], n, window.shape[1], dtype=torch.float64)
    for t in range(n):
        for j in range(taps):
            out[:, t, :] += window[:, :, t + j].double() * weight[:, 0, j].double()
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("carried", [True, False])
@pytest.mark.parametrize(("channels", "taps", "n"), [(5, 4, 1), (7, 2, 3), (3, 4, 9), (16, 1, 2), (6, 3, 1)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_both_forms_follow_the_definition_and_hand_on_the_last_inputs(carried, channels, taps, n, with_bias):
    gen = torch.Generator().manual_seed(channels * 100 + taps * 10 + n)
    x = torch.randn(2, n, channels, generator=gen)
    weight = torch.randn(channels, 1, taps, generator=gen)
    bias = torch.randn(channels, generator=gen) if with_bias else None
    carry = torch.randn(2, channels, taps - 1, generator=gen) if carried else None
    before = carry if carried else torch.zeros(2, channels, taps - 1)
    window = torch.cat([before, x.transpose(1, 2)], dim=-1)
    out, handed_on = carried_conv(x, weight, bias, carry)
    assert out.shape == (2, n, channels) and out.dtype == x.dtype
    torch.testing.assert_close(out.double(), reference(window, weight, bias), atol=1e-5, rtol=1e-5)
    assert torch.equal(handed_on, window[..., window.shape[-1] - (taps - 1) :])
