"""flash-linear-attention's Triton building blocks written in torch (what the converted layers and
models use in place of the library's kernels), each checked against the kernel's formula.

* ``rms_norm`` / ``layer_norm``: ``fla.modules.norm.layernorm``'s ``layer_norm_fwd_kernel``: in float32,
  x / sqrt(mean(x²) + eps) (RMS) or (x - mean) / sqrt(var + eps), then * weight + bias, cast back;
  with ``groups`` the statistics are per group of channels (``GroupNorm``).
* ``gated_rms_norm``: ``fla.modules.norm.fused_norm_gate``: rms_norm(x) * silu(g) ("swish"/"silu")
  or * sigmoid(g).
* :class:`Norm`: the library's ``RMSNorm`` / ``LayerNorm`` modules with their call
  ``(x, residual=None, prenorm=False)``: x + residual is normalised, and with ``prenorm`` also
  returned (the models' fused add-and-norm).
* :class:`ShortConv`: ``ShortConvolution`` (a depthwise causal conv1d, kernel W, optional SiLU)
  over several projections at once, carrying the last W - 1 inputs as its state.
* ``rotate``: ``RotaryEmbedding`` (non-interleaved halves, base 10000, no XPos) at given positions.
* :class:`SwiGLU`: ``GatedMLP`` with ``hidden_act`` swish: down(silu(gate(x)) * up(x)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnx.errors import AttnxError
from attnx.shortconv import carried_conv

ACTIVATIONS = {
    "swish": F.silu,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "relu": F.relu,
    "sqrelu": lambda x: F.relu(x).square(),
    "logsigmoid": F.logsigmoid,
}


def activation(name: str | None, where: str) -> object:
    """The torch function of one of the library's ``ACT2FN`` names (None: identity).

    Raises:
        AttnxError: a name attnx does not reproduce.
    """
    if name is None:
        return lambda x: x
    if name not in ACTIVATIONS:
        known = ", ".join(ACTIVATIONS)
        raise AttnxError(f"{where}: activation '{name}' is not exported by attnx (it takes {known})")
    return ACTIVATIONS[name]


def norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    rms: bool,
    groups: int = 1,
) -> torch.Tensor:
    """RMS or layer norm over the last dim (in ``groups`` equal parts), in float32, cast back."""
    shape, xf = x.shape, x.float()
    xf = xf.reshape(*shape[:-1], groups, shape[-1] // groups)
    if not rms:
        xf = xf - xf.mean(-1, keepdim=True)
    y = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).reshape(shape)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def gated_rms_norm(
    x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor | None, eps: float, gate: str
) -> torch.Tensor:
    """``FusedRMSNormGated``: rms_norm(x) * silu(g) or * sigmoid(g), computed in float32."""
    y = norm(x.float(), weight, None, eps, rms=True)
    gf = g.float()
    y = y * (torch.sigmoid(gf) if gate == "sigmoid" else F.silu(gf))
    return y.to(x.dtype)


class Norm(nn.Module):
    """The library's ``RMSNorm`` / ``LayerNorm`` module in torch, with its prenorm residual call."""

    def __init__(self, module: nn.Module, rms: bool) -> None:
        super().__init__()
        self.weight, self.bias, self.eps, self.rms = module.weight, module.bias, module.eps, rms

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        prenorm: bool = False,
        residual_in_fp32: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        y = norm(x, self.weight, self.bias, self.eps, self.rms)
        return (y, x) if prenorm else y


class SwiGLU(nn.Module):
    """The library's ``GatedMLP`` (``hidden_act`` swish): down(silu(gate(x)) * up(x))."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        if mlp.hidden_act not in ("swish", "silu"):
            raise AttnxError(
                f"flash-linear-attention GatedMLP with hidden_act '{mlp.hidden_act}' is not exported by "
                "attnx (it takes swish)"
            )
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj

    def forward(self, x: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ShortConv(nn.Module):
    """Several ``ShortConvolution`` layers (same kernel size) as one depthwise causal conv over their
    concatenated channels: the same numbers, one state (batch, channels, kernel - 1)."""

    def __init__(self, convs: list[nn.Module]) -> None:
        super().__init__()
        sizes = {c.kernel_size[0] for c in convs}
        if len(sizes) != 1:
            raise AttnxError("flash-linear-attention short convolutions of unequal kernel sizes in one layer")
        self.weights = nn.ParameterList([c.weight for c in convs])  # the library's parameters, shared
        self.biases = nn.ParameterList([c.bias for c in convs if c.bias is not None])
        self.kernel = sizes.pop()
        self.split = [c.weight.shape[0] for c in convs]
        self.silu = [c.activation is not None for c in convs]

    @property
    def channels(self) -> int:
        return sum(self.split)

    def forward(
        self, xs: list[torch.Tensor], state: torch.Tensor | None
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Convolve (batch, n, channels_i) inputs after ``state`` (None: zeros); returns the outputs and
        the last kernel - 1 inputs."""
        x = torch.cat(xs, dim=-1)
        weight = torch.cat(list(self.weights), dim=0)
        bias = torch.cat(list(self.biases), dim=0) if len(self.biases) else None
        y, carry = carried_conv(x, weight, bias, state)
        outs = list(torch.split(y, self.split, dim=-1))
        outs = [F.silu(o) if silu else o for o, silu in zip(outs, self.silu, strict=True)]
        return outs, carry


def rotate(x: torch.Tensor, inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Non-interleaved rotary embedding of (batch, n, heads, d) at float32 ``positions``, (n,) or
    (batch, n) (cos/sin computed in float32 like the library's tables, then cast to x's dtype)."""
    freqs = positions[..., None] * inv_freq.float()
    cos, sin = (t.to(x.dtype).unsqueeze(-2) for t in (freqs.cos(), freqs.sin()))
    half = inv_freq.shape[0]
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([rotated, x[..., 2 * half :]], dim=-1)
