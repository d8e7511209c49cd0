"""The short causal depthwise convolution the gated layers run on their projections before the rule
(attnx's gated variants, Hugging Face's Gated DeltaNet and Kimi Delta Attention, flash-linear-attention's
``ShortConvolution``).

Over a whole sequence it is one grouped ``Conv``. In a decode step (a few new tokens after the carried
inputs) it is the sum of the kernel's taps times shifted slices of the window: ONNX Runtime's grouped
``Conv`` takes 100-190 us per call on one token of 1024 channels (kernel 4, 2 threads), the taps' products
45-60 us; over 4096 tokens the products take ~7x the ``Conv``'s 6-13 ms, hence the two forms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def depthwise_conv(
    window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, step: bool
) -> torch.Tensor:
    """(batch, C, n) outputs of the depthwise convolution of (batch, C, K - 1 + n) ``window`` (the K - 1
    inputs before the n new ones first: zeros or a carry) with (C, 1, K) ``weight`` and (C,) ``bias``;
    ``step``: the n tokens of a decode step, computed tap by tap."""
    if not step:
        return F.conv1d(window, weight, bias, groups=weight.shape[0])
    taps = weight.shape[-1]
    n = window.shape[-1] - taps + 1
    out = window[..., :n] * weight[:, :, 0]
    for tap in range(1, taps):
        out = out + window[..., tap : tap + n] * weight[:, :, tap]
    return out if bias is None else out + bias[:, None]


def carried_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, carry: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The depthwise convolution of (batch, C, n) ``x`` after ``carry`` (batch, C, K - 1: the inputs
    before it; None: zeros, the whole sequence) in ``weight``'s dtype, and the carry after ``x`` (its
    last K - 1 inputs, ``x``'s dtype)."""
    width = weight.shape[-1] - 1
    # zeros before the first token: a Pad (fp16 converters retype it with its input)
    window = F.pad(x, (width, 0)) if carry is None else torch.cat([carry.to(x.dtype), x], dim=-1)
    out = depthwise_conv(window.to(weight.dtype), weight, bias, step=carry is not None)
    return out, window[..., window.shape[-1] - width :]
