"""Results of the conformance kit: one :class:`CheckResult` per check, gathered in a report."""

from __future__ import annotations

import dataclasses
from typing import Literal

Status = Literal["passed", "failed", "skipped"]


class ConformanceError(AssertionError):
    """A variant breaks one or more promises of the plugin contract (the message lists them)."""


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check.

    Attributes:
        check: the check's name (see :data:`attnx.testing.CHECKS`).
        promise: what the plugin promises, in one sentence.
        status: "passed", "failed" or "skipped".
        problems: for a failure, one line per broken promise; for a skip, the reason.
        seconds: wall time of the check.
    """

    check: str
    promise: str
    status: Status
    problems: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def message(self) -> str:
        """The check, its promise and each problem on its own line."""
        head = f"{self.check}: {self.promise}"
        if self.status == "passed":
            return head
        label = "broken" if self.status == "failed" else "skipped"
        return "\n".join([f"{head} -- {label}:", *(f"  - {p}" for p in self.problems)])


@dataclasses.dataclass(frozen=True)
class ConformanceReport:
    """Every check run on one variant."""

    variant: str
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        """True when no check failed and at least one ran."""
        return not self.failures and any(r.status == "passed" for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "failed"]

    def result(self, check: str) -> CheckResult:
        """The result of ``check`` (KeyError if it did not run)."""
        for r in self.results:
            if r.check == check:
                return r
        raise KeyError(check)

    def raise_for_failures(self) -> None:
        """Raise :class:`ConformanceError` listing every broken promise, if any."""
        if not self.passed:
            raise ConformanceError(str(self))

    def __str__(self) -> str:
        marks = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}
        lines = [f"attnx conformance of variant '{self.variant}':"]
        for r in self.results:
            lines.append(f"{marks[r.status]} {r.check} ({r.seconds:.1f} s): {r.promise}")
            lines.extend(f"       - {p}" for p in r.problems)
        return "\n".join(lines)
