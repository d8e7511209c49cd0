"""The short causal depthwise convolution the gated layers run on their projections before the rule
(attnx's gated variants, Hugging Face's Gated DeltaNet and Kimi Delta Attention, flash-linear-attention's
``ShortConvolution``, Mamba's and LFM2's convolutions).

Inputs and outputs are token-major, (batch, n, C), as the projections make them; the carry between calls
is channel-major, (batch, C, K - 1), the layout of every decode state that holds it.

Over a whole sequence it is one grouped ``Conv``. In a decode step (a few new tokens after the carried
inputs) it is the sum of the kernel's taps times the window's token-major slices, each a contiguous block:
one token of 6144 channels (kernel 4, ONNX Runtime 1.32, 2 threads) takes 70 us that way, against 209 us
for the same taps over a channel-major window (each slice a strided copy) and 121 us for ONNX Runtime's
``CausalConvWithState`` on its channel-major input (``benchmarks/gated_sidebyside.py --conv``,
docs/benchmarks.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def tap_sum(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, n, C) outputs of the depthwise convolution of (batch, K - 1 + n, C) ``window`` (the K - 1
    inputs before the n new ones first: zeros or a carry) with (C, 1, K) ``weight`` and (C,) ``bias``,
    computed tap by tap."""
    taps = weight.shape[-1]
    n = window.shape[1] - taps + 1
    per_tap = weight[:, 0, :].t()  # (K, C): tap j's row broadcasts over (batch, n, C)
    out = window[:, :n] * per_tap[0]
    for tap in range(1, taps):
        out = out + window[:, tap : tap + n] * per_tap[tap]
    return out if bias is None else out + bias


def carried_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, carry: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The depthwise convolution of (batch, n, C) ``x`` after ``carry`` (batch, C, K - 1: the inputs
    before it; None: zeros, the whole sequence), (batch, n, C) in ``weight``'s dtype, and the carry after
    ``x`` (its last K - 1 inputs, channel-major, ``x``'s dtype)."""
    width = weight.shape[-1] - 1
    if carry is None:
        # zeros before the first token: a Pad (fp16 converters retype it with its input)
        window = F.pad(x.transpose(1, 2), (width, 0))
        out = F.conv1d(window.to(weight.dtype), weight, bias, groups=weight.shape[0]).transpose(1, 2)
        return out, window[..., window.shape[-1] - width :]
    window = torch.cat([carry.to(x.dtype).transpose(1, 2), x], dim=1)
    out = tap_sum(window.to(weight.dtype), weight, bias)
    return out, window[:, window.shape[1] - width :].transpose(1, 2)
