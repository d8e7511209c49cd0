"""How latency grows with the sequence length: the log-log slope.

latency ≈ c·N^k  ⇔  log t = log c + k·log N, so k is the least-squares slope of
log(median latency) against log N: about 2 for softmax attention once the N² terms
dominate, about 1 for linear-time variants (projections and FFN are linear in N too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def fit_slope(seq_lens: Sequence[float], latencies: Sequence[float]) -> float:
    """Least-squares slope of log(latency) on log(N).

    Raises:
        ValueError: fewer than two distinct lengths, or a non-positive value.
    """
    if len(seq_lens) != len(latencies):
        raise ValueError("seq_lens and latencies differ in length")
    if any(v <= 0 for v in (*seq_lens, *latencies)):
        raise ValueError("lengths and latencies must be positive")
    xs = [math.log(n) for n in seq_lens]
    ys = [math.log(t) for t in latencies]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if len(set(seq_lens)) < 2 or spread == 0.0:
        raise ValueError("a slope needs at least two distinct sequence lengths")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
