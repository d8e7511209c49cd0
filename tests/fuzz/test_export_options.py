"""Property: any value of any option a user can ``--set``, on any shipped recipe or registered model and
variant, gives a verified export or one error line that names the option, exit code 2 and nothing
written (``attnx export`` driven in-process, tiny sizes).

Hypothesis draws the cases from a fixed seed (``derandomize``): a bounded number in the default run,
many more under ``-m slow``. The explicit examples are the cases issues reported.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.options import Case, Target, cases, targets
from tests.helpers import assert_one_line_error, run_cli

DEFAULT = settings(
    max_examples=6,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=list(HealthCheck),
)
MANY = settings(DEFAULT, max_examples=200)
BUDGETS = [pytest.param(DEFAULT, id="default"), pytest.param(MANY, id="many", marks=pytest.mark.slow)]


def case(target: Target, **assigned: str) -> Case:
    options = {option.key: option for option in target.options()}
    return Case(target, tuple((options[key], value) for key, value in assigned.items()))


ENCODER = Target(recipe="tiny-encoder")
REPORTED = [
    case(ENCODER, d_model="33", n_heads="3"),  # odd width: sinusoidal positions of 34 columns against 33
    case(Target(model="lm", variant="linear"), d_model="6", n_heads="2"),  # odd head width
    case(ENCODER, n_layers=str(10**9)),  # must be refused before anything is built
    case(ENCODER, **{"export.example_lengths": f"seq={10**9}"}),
]


@contextlib.contextmanager
def inside(directory: str) -> Iterator[Path]:
    previous = os.getcwd()
    os.chdir(directory)
    try:
        yield Path(directory)
    finally:
        os.chdir(previous)


def check(given_case: Case) -> None:
    """Run the case's export in a fresh directory; the outcome must be one of the two the CLI promises."""
    with tempfile.TemporaryDirectory(prefix="attnx-fuzz-") as tmp, inside(tmp) as root:
        code, stdout, stderr = run_cli(given_case.argv())
        written = sorted(p.name for p in root.iterdir())
    argv = " ".join(given_case.argv())
    if code == 0:
        assert written == ["out"], f"{argv}: wrote {written}"
        # no parity line: verification was switched off (verify.enabled=false), as the user asked
        assert "parity: PASSED" in stdout or "parity:" not in stdout, f"{argv}: parity not passed:\n{stdout}"
        return
    assert code == 2, f"{argv}: exit code {code}\n{stdout}\n{stderr}"
    assert_one_line_error(code, stderr)
    line = stderr.strip().splitlines()[-1]
    trained = "checkpoint" in line and given_case.target.recipe is not None
    assert given_case.named(line) or trained, f"{argv}: the error names none of the options set: {line}"
    assert written == [], f"{argv}: refused, but wrote {written}"


def test_every_recipe_and_model_variant_pair_is_a_target():
    from attnx.recipes import recipe_names
    from attnx.registry import get_registry

    found = {t.id for t in targets()}
    assert {f"recipe-{name}" for name in recipe_names()} <= found
    from tests.models.cases import SUPPORTED

    assert set(SUPPORTED) == set(get_registry().variants)
    assert {f"{m}-{v}" for v, models in SUPPORTED.items() for m in models} <= found
    keys = {o.key for o in ENCODER.options()}
    assert {"d_model", "n_heads", "export.opset", "verify.seq_lens", "bench.batch", "attention_mask"} <= keys


def describe(given_case: Case) -> str:
    return " ".join(f"{option.key}={value}" for option, value in given_case.assignments)


@pytest.mark.parametrize("reported", REPORTED, ids=describe)
def test_reported_cases(reported: Case):
    check(reported)


@pytest.mark.parametrize("budget", BUDGETS)
def test_any_option_values_export_verified_or_are_refused_by_name(budget: settings):
    budget(given(cases())(check))()
