"""attnx.shortconv: the short convolution's decode-step form (the kernel's taps as products) equals the
grouped Conv of the whole window, against a float64 loop from the definition."""

from __future__ import annotations

import pytest
import torch

from attnx.shortconv import depthwise_conv


def reference(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """out[b, c, t] = bias[c] + sum_j window[b, c, t + j] * weight[c, 0, j], in float64."""
    taps = weight.shape[-1]
    n = window.shape[-1] - taps + 1
    out = torch.zeros(window.shape[0], window.shape[1], n, dtype=torch.float64)
    for t in range(n):
        for j in range(taps):
            out[:, :, t] += window[:, :, t + j].double() * weight[:, 0, j].double()
    return out if bias is None else out + bias.double()[:, None]


@pytest.mark.parametrize("step", [True, False])
@pytest.mark.parametrize(("channels", "taps", "n"), [(5, 4, 1), (7, 2, 3), (3, 4, 9), (16, 1, 2)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_both_forms_follow_the_definition(step, channels, taps, n, with_bias):
    gen = torch.Generator().manual_seed(channels * 100 + taps * 10 + n)
    window = torch.randn(2, channels, taps - 1 + n, generator=gen)
    weight = torch.randn(channels, 1, taps, generator=gen)
    bias = torch.randn(channels, generator=gen) if with_bias else None
    out = depthwise_conv(window, weight, bias, step=step)
    assert out.shape == (2, channels, n) and out.dtype == window.dtype
    torch.testing.assert_close(out.double(), reference(window, weight, bias), atol=1e-5, rtol=1e-5)
