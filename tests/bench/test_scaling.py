"""The log-log slope fit, on synthetic latencies with known exponents."""

from __future__ import annotations

import numpy as np
import pytest

from attnx.bench.report import Measurement, fit_scaling
from attnx.bench.scaling import fit_slope

LENGTHS = [256, 1024, 4096, 16384]


@pytest.mark.parametrize("exponent", [0.0, 1.0, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("constant", [1e-9, 3.7e-4, 12.0])
def test_power_law_gives_its_exponent(exponent: float, constant: float) -> None:
    latencies = [constant * n**exponent for n in LENGTHS]
    assert fit_slope(LENGTHS, latencies) == pytest.approx(exponent, abs=1e-6)


def test_matches_ordinary_least_squares_on_noisy_data() -> None:
    rng = np.random.default_rng(6)
    lengths = [7, 33, 128, 1000, 4321]
    latencies = [1e-5 * n**1.3 * float(np.exp(rng.normal(0, 0.2))) for n in lengths]
    design = np.stack([np.ones(len(lengths)), np.log(lengths)], axis=1)
    (_, expected), *_ = np.linalg.lstsq(design, np.log(latencies), rcond=None)
    assert fit_slope(lengths, latencies) == pytest.approx(expected, abs=1e-9)


def test_linear_plus_quadratic_lies_between_one_and_two() -> None:
    latencies = [1e-6 * n + 1e-9 * n**2 for n in LENGTHS]
    assert 1.0 < fit_slope(LENGTHS, latencies) < 2.0


@pytest.mark.parametrize(
    ("lengths", "latencies"),
    [
        ([1024], [0.1]),
        ([64, 64], [0.1, 0.2]),
        ([64, 128], [0.1, 0.0]),
        ([0, 128], [0.1, 0.2]),
        ([1, 2], [1.0]),
    ],
)
def test_rejects_what_has_no_slope(lengths: list[int], latencies: list[float]) -> None:
    with pytest.raises(ValueError):
        fit_slope(lengths, latencies)


def _measurement(backend: str, n: int, seconds: list[float], status: str = "ok") -> Measurement:
    return Measurement("m", "out", "softmax", backend, 1, n, status, timings_s=seconds)


def test_scaling_groups_by_backend_uses_medians_and_ignores_skipped_cases() -> None:
    cases = [
        _measurement("ort-cpu", 100, [1.0, 9.0, 2.0]),  # median 2
        _measurement("ort-cpu", 200, [8.0, 7.0, 100.0]),  # median 8: 4x for 2x N -> slope 2
        _measurement("ort-cpu", 400, [], status="skipped"),
        _measurement("torch", 100, [1.0]),  # one length: no fit
    ]
    (fit,) = fit_scaling(cases)
    assert (fit.backend, fit.seq_lens, fit.median_s) == ("ort-cpu", [100, 200], [2.0, 8.0])
    assert fit.slope == pytest.approx(2.0, abs=1e-9)
