"""The one parity rule: Polygraphy's element-wise check, used by verify, decode parity, bench and the kit.

An element passes when ``|a - b| <= atol`` or ``|a - b| <= rtol * |b|`` (``b``: the reference,
torch), exactly as Polygraphy's ``CompareFunc.simple(check_error_stat="elemwise")`` decides
(a 0 in ``b`` gets Polygraphy's 2.2e-16 added before dividing; NaN never passes).
tests/parity/test_rule.py holds the two side by side on random arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from attnx.variant import Tolerance

_ZERO_GUARD = 2.220446049250313e-16  # what Polygraphy adds to a 0 reference before dividing


@dataclasses.dataclass(frozen=True)
class Difference:
    """How far ``actual`` is from ``expected``: the largest absolute and relative differences, and
    whether every element passes the rule (shapes must match)."""

    max_abs: float
    max_rel: float
    passed: bool


BLOCK = 1 << 20
"""Elements compared at a time: a real-size model's logits (2 x 129 x 248320 float32) compared whole in
float64 held six temporaries of their size (2.5 GB beside the session that made them); a block's are a few
MB, and the rule and its maxima are the same element by element."""


def compare(actual: Any, expected: Any, tolerance: Tolerance) -> Difference:
    """Polygraphy's element-wise rule on ``actual`` against the reference ``expected``, in float64, a block
    of :data:`BLOCK` elements at a time."""
    a, b = np.asarray(actual), np.asarray(expected)
    if a.shape != b.shape:
        return Difference(float("inf"), float("inf"), False)
    a, b = a.reshape(-1), b.reshape(-1)
    max_abs = max_rel = 0.0
    passed = True
    for start in range(0, a.size, BLOCK):
        absolute, relative = _errors(a[start : start + BLOCK], b[start : start + BLOCK])
        failed = (np.isnan(absolute) | (absolute > tolerance.atol)) & (
            np.isnan(relative) | (relative > tolerance.rtol)
        )
        passed = passed and not bool(failed.any())
        max_abs, max_rel = _larger(max_abs, _max(absolute)), _larger(max_rel, _max(relative))
    return Difference(max_abs, max_rel, passed)


def _errors(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|a - b| and |a - b| / |b| (a 0 in ``b`` guarded as Polygraphy does), in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    absolute = np.abs(a - b)
    return absolute, absolute / np.abs(np.where(b == 0, _ZERO_GUARD, b))


def _larger(kept: float, new: float) -> float:
    """The larger of two maxima, NaN once either is (NaN never passes, so it is what a report shows)."""
    return new if np.isnan(new) or new > kept else kept


def _max(values: np.ndarray) -> float:
    if values.size == 0:
        return 0.0
    return float("nan") if np.isnan(values).any() else float(values.max())


def describe_mismatch(actual: Any, expected: Any, tolerance: Tolerance) -> str | None:
    """None when ``actual`` passes against ``expected``, else one line on where and by how much it fails."""
    a, b = np.asarray(actual), np.asarray(expected)
    if a.shape != b.shape:
        return f"shape {a.shape} instead of {b.shape}"
    difference = compare(a, b, tolerance)
    if difference.passed:
        return None
    absolute, _ = _errors(a, b)
    worst = np.unravel_index(np.nanargmax(np.where(np.isnan(absolute), np.inf, absolute)), absolute.shape)
    index = tuple(int(i) for i in worst)
    return (
        f"max abs err {difference.max_abs:.3g} at index {index} "
        f"(atol {tolerance.atol:g}, rtol {tolerance.rtol:g})"
    )
