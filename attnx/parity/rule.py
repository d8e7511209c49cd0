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


def compare(actual: Any, expected: Any, tolerance: Tolerance) -> Difference:
    """Polygraphy's element-wise rule on ``actual`` against the reference ``expected``, in float64."""
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    if a.shape != b.shape:
        return Difference(float("inf"), float("inf"), False)
    absolute = np.abs(a - b)
    relative = absolute / np.abs(np.where(b == 0, _ZERO_GUARD, b))
    failed = (np.isnan(absolute) | (absolute > tolerance.atol)) & (
        np.isnan(relative) | (relative > tolerance.rtol)
    )
    return Difference(_max(absolute), _max(relative), not bool(failed.any()))


def _max(values: np.ndarray) -> float:
    if values.size == 0:
        return 0.0
    return float("nan") if np.isnan(values).any() else float(values.max())


def describe_mismatch(actual: Any, expected: Any, tolerance: Tolerance) -> str | None:
    """None when ``actual`` passes against ``expected``, else one line on where and by how much it fails."""
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    if a.shape != b.shape:
        return f"shape {a.shape} instead of {b.shape}"
    difference = compare(a, b, tolerance)
    if difference.passed:
        return None
    absolute = np.abs(a - b)
    worst = np.unravel_index(np.nanargmax(np.where(np.isnan(absolute), np.inf, absolute)), absolute.shape)
    index = tuple(int(i) for i in worst)
    return (
        f"max abs err {difference.max_abs:.3g} at index {index} "
        f"(atol {tolerance.atol:g}, rtol {tolerance.rtol:g})"
    )
