"""Device-side helpers shared by the built-in Triton kernels (imports triton; loaded with a kernel)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_rows(ptr, base, rows, n_rows, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """Rows ``rows`` of a contiguous (n_rows, WIDTH) matrix at ``ptr + base`` as a (rows, BLOCK) tile in
    the input dtype; 0 for rows outside [0, n_rows) and columns >= WIDTH."""
    cols = tl.arange(0, BLOCK)
    ok = ((rows >= 0) & (rows < n_rows))[:, None] & (cols < WIDTH)[None, :]
    return tl.load(ptr + base + rows[:, None] * WIDTH + cols[None, :], mask=ok, other=0.0)
