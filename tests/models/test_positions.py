"""The sinusoidal position encoding against the paper's formula, written out element by element."""

from __future__ import annotations

import math

import pytest
import torch

from attnx.models.blocks import SinusoidalPositions


def paper(positions: list[int], d: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), in float64."""
    table = torch.empty(len(positions), d, dtype=torch.float64)
    for row, pos in enumerate(positions):
        for column in range(d):
            angle = pos / 10000 ** (2 * (column // 2) / d)
            table[row, column] = math.sin(angle) if column % 2 == 0 else math.cos(angle)
    return table


@pytest.mark.parametrize("d", [1, 2, 3, 8, 33, 64])
def test_every_width_odd_ones_included_follows_the_formula(d: int):
    positions = [0, 1, 2, 7, 40, 129]
    encoding = SinusoidalPositions(d)(torch.tensor(positions))
    assert encoding.shape == (len(positions), d) and encoding.dtype == torch.float32
    # float32 angles of positions up to 129: a few ulps of 129 radians
    torch.testing.assert_close(encoding.double(), paper(positions, d), atol=5e-5, rtol=0)


def test_the_encoding_is_returned_in_the_dtype_asked_for():
    encoding = SinusoidalPositions(5)(torch.arange(3), torch.float16)
    assert encoding.dtype == torch.float16 and encoding.shape == (3, 5)
