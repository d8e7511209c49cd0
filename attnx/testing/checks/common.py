"""Shared by the checks: the outcome exceptions, recorded calls, tolerance comparison."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attnx.parity.rule import describe_mismatch
from attnx.testing.subject import Forward, OpCall, Subject
from attnx.variant import Tolerance


class Skip(Exception):
    """The check does not apply to this variant (the message says why)."""


class Broken(Exception):
    """The check cannot go on; ``problems`` are its findings so far."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def forwards(subject: Subject) -> list[Forward]:
    """The forward passes that ran (the ``capabilities`` check reports those that raised)."""
    return [fw for fw in subject.forwards if fw.error is None]


def declared_calls(subject: Subject) -> list[OpCall]:
    """The recorded calls of declared ops; broken when there are none (nothing to check)."""
    calls = [call for fw in forwards(subject) for call in fw.calls if call.op is not None]
    if not calls:
        raise Broken(
            ["the layer calls no declared attnx op, so there is nothing to check (see 'capabilities')"]
        )
    return calls


def mismatch(actual: Any, expected: Any, atol: float, rtol: float) -> str | None:
    """None when ``actual`` passes against ``expected`` by the one parity rule, else what differs."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape == e.shape and not np.isfinite(a).all() and np.isfinite(e).all():
        return "non-finite values where the torch op is finite"
    return describe_mismatch(a, e, Tolerance(atol, rtol))


def half(call: OpCall) -> dict[str, torch.Tensor]:
    """The call's float32 tensor arguments in float16."""
    return {
        name: value.half()
        for name, value in call.bound().items()
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32
    }
