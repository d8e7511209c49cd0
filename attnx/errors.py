"""The one user-facing error type, and the helper that suggests the closest valid choice."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AttnxError(Exception):
    """A problem with the user's input or environment that has a one-line fix.

    The CLI prints it as a single line and exits with code 2; internal bugs use
    ordinary exceptions and keep their traceback.
    """


def unknown_choice(kind: str, value: str, choices: Iterable[str]) -> AttnxError:
    """Build "unknown <kind> 'x'; did you mean 'y'? (choices: a, b)"."""
    options = sorted(choices)
    message = f"unknown {kind} '{value}'"
    close = difflib.get_close_matches(value, options, n=1, cutoff=0.5)
    if close:
        message += f"; did you mean '{close[0]}'?"
    listed = ", ".join(options) if options else "none registered"
    return AttnxError(f"{message} (choices: {listed})")


def first_line(exc: BaseException, *, with_type: bool = False, limit: int = 300) -> str:
    """The first line of an exception's message (its type name when empty), "Type: message" with
    ``with_type``, cut to ``limit`` characters (compiler errors run to pages)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    if with_type or not line:
        line = f"{type(exc).__name__}: {line}".rstrip(": ")
    return line if len(line) <= limit else line[: limit - 3] + "..."
