"""Run the conformance checks: :func:`check_variant` (a report) and :func:`conformance_tests` (pytest)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attnx.errors import AttnxError, unknown_choice
from attnx.registry import Registry
from attnx.testing.checks import CHECKS, Broken, Check, Skip
from attnx.testing.report import CheckResult, ConformanceReport
from attnx.testing.subject import Subject, resolve
from attnx.variant import Variant


def check_variant(
    variant: str | Variant,
    *,
    options: Mapping[str, Any] | None = None,
    bad_options: Mapping[str, Any] | None = None,
    checks: Sequence[str] | None = None,
    heavy: bool = True,
    registry: Registry | None = None,
    seed: int = 0,
) -> ConformanceReport:
    """Run the conformance checks on ``variant`` and return what passed, failed or was skipped.

    Args:
        variant: a registered variant's name, or a :class:`attnx.Variant` object (one
            not registered yet is tested in a registry of its own next to attnx's models).
        options: variant options to test with (default: the variant's ``testing.options``).
        bad_options: ``{option: value}`` pairs that ``validate()`` must reject, each tried alone
            (default: the variant's ``testing.bad_options``).
        checks: names of the checks to run (default: all, see :data:`attnx.testing.CHECKS`).
        heavy: also run the export checks (a few seconds each).
        registry: the registry to look the variant up in (default: the process-wide one).

    Raises:
        AttnxError: an unknown variant or check name.
    """
    selected = select_checks(checks, heavy)
    subject = make_subject(variant, options, bad_options, registry, seed)
    by_name = {check.name: check for check in CHECKS}
    return ConformanceReport(
        subject.variant.name, tuple(run_check(by_name[name], subject) for name in selected)
    )


def select_checks(names: Sequence[str] | None, heavy: bool = True) -> list[str]:
    known = [check.name for check in CHECKS]
    for name in names or ():
        if name not in known:
            raise unknown_choice("conformance check", name, known)
    return [c.name for c in CHECKS if (names is None or c.name in names) and (heavy or not c.heavy)]


def make_subject(
    variant: str | Variant,
    options: Mapping[str, Any] | None,
    bad_options: Mapping[str, Any] | None,
    registry: Registry | None,
    seed: int,
) -> Subject:
    """The variant under test; options not given come from its declaration (``Variant.testing``)."""
    registry, found = resolve(variant, registry)
    options = found.testing.options if options is None else options
    bad_options = found.testing.bad_options if bad_options is None else bad_options
    return Subject(registry, found, dict(options), dict(bad_options), seed)


def run_check(check: Check, subject: Subject) -> CheckResult:
    """Run one check; a crash inside it is a failure naming the exception and where it was raised."""
    start, status = time.perf_counter(), None
    try:
        problems = check.run(subject)
    except Skip as skip:
        problems, status = [str(skip)], "skipped"
    except Broken as broken:
        problems = broken.problems
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        problems = [f"raised {type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"]
    status = status or ("failed" if problems else "passed")
    return CheckResult(check.name, check.promise, status, tuple(problems), time.perf_counter() - start)


def conformance_tests(
    variant: str | Variant,
    *,
    options: Mapping[str, Any] | None = None,
    bad_options: Mapping[str, Any] | None = None,
    checks: Sequence[str] | None = None,
    heavy_marks: Sequence[Any] = (),
    marks: Mapping[str, Sequence[Any]] | None = None,
    registry: Registry | None = None,
    seed: int = 0,
) -> Callable[[str], None]:
    """A pytest test function parametrised over the checks: assign it to a ``test_*`` name.

    ::

        from attnx.testing import conformance_tests

        test_conformance = conformance_tests("window", bad_options={"window": -1})

    Each check is its own test item (``test_conformance[causality]``), failing with
    the broken promises as its message, skipped when it does not apply. The variant
    is looked up and probed once, when the first item runs (not at collection).
    ``heavy_marks`` are applied to the export checks, e.g. ``[pytest.mark.slow]``;
    ``marks`` adds marks per check, e.g. ``{"causality": [pytest.mark.xfail(reason=...)]}``
    for a documented limitation.
    """
    import pytest

    heavy = {c.name for c in CHECKS if c.heavy}
    selected = select_checks(checks)
    select_checks(list(marks or ()))  # a misspelt check name in ``marks`` is an error, not a no-op
    params = [
        pytest.param(
            name, id=name, marks=(*(heavy_marks if name in heavy else ()), *(marks or {}).get(name, ()))
        )
        for name in selected
    ]
    by_name = {check.name: check for check in CHECKS}
    subjects: list[Subject] = []

    @pytest.mark.parametrize("check", params)
    def test_conformance(check: str) -> None:
        if not subjects:
            try:
                subjects.append(make_subject(variant, options, bad_options, registry, seed))
            except AttnxError as exc:  # e.g. not installed: say so, without a traceback
                pytest.fail(f"conformance: {exc}", pytrace=False)
        result = run_check(by_name[check], subjects[0])
        if result.status == "skipped":
            pytest.skip(result.problems[0])
        if result.status == "failed":
            pytest.fail(f"variant '{subjects[0].variant.name}': {result.message}", pytrace=False)

    return test_conformance
