"""The one parity rule is Polygraphy's element-wise check, and every consumer uses it."""

from __future__ import annotations

from collections import OrderedDict
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polygraphy.comparator import CompareFunc
from polygraphy.comparator.struct import IterationResult

from attnx.parity.rule import compare, describe_mismatch
from attnx.variant import Tolerance


def polygraphy_passes(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> bool:
    check = CompareFunc.simple(atol=atol, rtol=rtol, check_error_stat="elemwise")
    runs = [IterationResult(OrderedDict(out=a), runner_name=n) for a, n in ((actual, "a"), (expected, "b"))]
    return bool(check(*runs)["out"])


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    size=st.integers(1, 40),
    scale=st.sampled_from([1e-7, 1e-5, 1e-3, 1e-1, 1.0]),
    atol=st.sampled_from([0.0, 1e-6, 1e-4, 1e-2]),
    rtol=st.sampled_from([0.0, 1e-6, 1e-3, 1e-1]),
    zeros=st.booleans(),
)
def test_the_rule_decides_exactly_as_polygraphy(seed, size, scale, atol, rtol, zeros) -> None:
    rng = np.random.default_rng(seed)
    expected = rng.standard_normal(size).astype(np.float32)
    if zeros:
        expected[rng.random(size) < 0.3] = 0.0
    actual = (expected + scale * rng.standard_normal(size)).astype(np.float32)
    assert compare(actual, expected, Tolerance(atol, rtol)).passed == polygraphy_passes(
        actual, expected, atol, rtol
    )


def test_either_bound_is_enough_and_nan_never_passes() -> None:
    tolerance = Tolerance(atol=1e-3, rtol=1e-2)
    assert compare([1.0005], [1.0], tolerance).passed  # within atol
    assert compare([100.5], [100.0], tolerance).passed  # within rtol only
    assert not compare([1.5], [1.0], tolerance).passed
    assert not compare([np.nan], [1.0], tolerance).passed
    assert not compare([1.0, 2.0], [1.0], tolerance).passed  # shapes differ


def whole_array_rule(actual: np.ndarray, expected: np.ndarray, tolerance: Tolerance) -> tuple:
    """The rule's maxima and verdict computed over whole arrays at once (what the blocks must add up to)."""
    a, b = actual.astype(np.float64), expected.astype(np.float64)
    absolute = np.abs(a - b)
    relative = absolute / np.abs(np.where(b == 0, 2.220446049250313e-16, b))
    failed = (np.isnan(absolute) | (absolute > tolerance.atol)) & (
        np.isnan(relative) | (relative > tolerance.rtol)
    )
    nan = np.isnan(absolute).any()
    return (
        float("nan") if nan else float(absolute.max()),
        float("nan") if nan else float(relative.max()),
        not bool(failed.any()),
    )


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    block=st.integers(1, 11),
    spoil=st.sampled_from(["none", "nan", "outlier"]),
)
def test_blocks_add_up_to_the_whole_array(seed, shape, block, spoil) -> None:
    """The rule runs block by block (bounded memory on real-size logits); its maxima and verdict are the
    whole array's, wherever a NaN or the one failing element falls."""
    rng = np.random.default_rng(seed)
    expected = rng.standard_normal(shape).astype(np.float32)
    actual = (expected + 1e-4 * rng.standard_normal(shape)).astype(np.float32)
    where = tuple(int(rng.integers(0, n)) for n in shape)
    if spoil == "nan":
        actual[where] = np.nan
    elif spoil == "outlier":
        actual[where] += 1.0
    tolerance = Tolerance(atol=1e-3, rtol=1e-3)
    with mock.patch("attnx.parity.rule.BLOCK", block):
        got = compare(actual, expected, tolerance)
    want = whole_array_rule(actual, expected, tolerance)
    np.testing.assert_equal((got.max_abs, got.max_rel, got.passed), want)


def test_a_mismatch_names_the_worst_element() -> None:
    message = describe_mismatch(np.array([[0.0, 0.3]]), np.zeros((1, 2)), Tolerance(1e-3, 1e-3))
    assert message == "max abs err 0.3 at index (0, 1) (atol 0.001, rtol 0.001)"
    assert describe_mismatch(np.ones(3), np.ones(3), Tolerance(0.0, 0.0)) is None


@pytest.mark.parametrize(
    "module", ["attnx.parity.check", "attnx.decode.parity", "attnx.testing.checks.common"]
)
def test_every_comparison_goes_through_the_rule(module: str) -> None:
    """No consumer keeps a private rule: each imports the parity rule's functions."""
    import importlib
    import inspect

    source = inspect.getsource(importlib.import_module(module))
    assert "from attnx.parity.rule import" in source
    assert "atol + rtol" not in source
