"""Inputs and cases shared by the gated / delta-rule op tests (tests/plugins/gated/)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Shape:
    """One call: q, k (batch, hk, n, dk), v (batch, hv, n, dv), g's width (1 or dk), rule, chunk size and
    whether a state comes in."""

    batch: int = 1
    hk: int = 1
    hv: int = 1
    n: int = 5
    dk: int = 4
    dv: int = 4
    per_key: bool = False
    delta: bool = True
    chunk: int = 8
    state: bool = False

    def __str__(self) -> str:
        decay = "key" if self.per_key else "scalar"
        rule = "delta" if self.delta else "additive"
        state = "-state" if self.state else ""
        sizes = f"{self.batch}x{self.hk}/{self.hv}x{self.n}x{self.dk}/{self.dv}"
        return f"{sizes}-{decay}-{rule}-C{self.chunk}{state}"


def draw(
    shape: Shape, seed: int, dtype: torch.dtype = torch.float32, decay: float = 1.0
) -> tuple[torch.Tensor, ...]:
    """q, k (L2-normalised, as the delta rule needs), v, g = -decay * softplus(randn) <= 0, beta in (0, 1) and
    a state (None unless ``shape.state``), float64 drawn then cast to ``dtype`` (the state stays float32,
    or float64 for float64)."""
    gen = torch.Generator().manual_seed(seed)
    s = shape

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, dtype=torch.float64)

    q = randn(s.batch, s.hk, s.n, s.dk)
    k = F.normalize(randn(s.batch, s.hk, s.n, s.dk), dim=-1)
    v = randn(s.batch, s.hv, s.n, s.dv)
    g = -decay * F.softplus(randn(s.batch, s.hv, s.n, s.dk if s.per_key else 1))
    beta = torch.sigmoid(randn(s.batch, s.hv, s.n))
    state = randn(s.batch, s.hv, s.dk, s.dv) if s.state else None
    wide = torch.promote_types(dtype, torch.float32)
    return (
        *(t.to(dtype) for t in (q, k, v, g, beta)),
        None if state is None else state.to(wide),
    )


def boundary_lengths(chunk: int) -> list[int]:
    """1, C - 1, C, C + 1, 3C + 5: every way a sequence meets chunk boundaries (C - 1 only if >= 1)."""
    return sorted({1, max(chunk - 1, 1), chunk, chunk + 1, 3 * chunk + 5})


SCALE = 0.7
# value widths the additive rule runs token by token (narrow) and in chunks (wide): config.by_token
NARROW_AND_WIDE = (4, 9)
