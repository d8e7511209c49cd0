"""The public functions' arguments checked against their type hints, so a wrong type is a ``TypeError``
naming the argument (``attnx.export(options=[...])``), not an ``AttributeError`` deep inside.

The check is shallow where shallow is enough: a ``Mapping`` must be a mapping, a ``Sequence[int]`` a
list or tuple (not a string) of integers, a path a ``str`` or ``os.PathLike``; classes are checked
with ``isinstance``; ``Any``, callables' signatures and names hints cannot resolve are not checked.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import os
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from attnx.errors import AttnxError

F = TypeVar("F", bound=Callable[..., Any])


class ArgumentTypeError(AttnxError, TypeError):
    """An argument of the wrong type: a ``TypeError``, and an :class:`AttnxError` (one line at the CLI)."""


def typed_arguments(func: F, name: str | None = None) -> F:
    """``func`` whose arguments are checked against its type hints on every call (``name``: how errors
    call it, default its own name).

    Raises (from the wrapper):
        ArgumentTypeError: "attnx.NAME: ARGUMENT must be WHAT, not TYPE".
    """
    signature = inspect.signature(func)
    called = f"attnx.{name or func.__name__}"
    hints = functools.cache(lambda: _hints(func))  # on first call: the module has all its names then

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ArgumentTypeError(f"{called}: {exc}") from None
        for argument, value in bound.arguments.items():
            hint = hints().get(argument)
            if hint is not None and not _matches(value, hint):
                wanted, given = _describe(hint), _given(value)
                raise ArgumentTypeError(f"{called}: {argument} must be {wanted}, not {given}")
        return func(*args, **kwargs)

    return checked  # type: ignore[return-value]


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    """The parameters' hints that resolve (one that names a TYPE_CHECKING-only class is skipped)."""
    module = inspect.getmodule(func)
    names = {**vars(typing), **vars(module)} if module else dict(vars(typing))
    hints = {}
    for name, annotation in getattr(func, "__annotations__", {}).items():
        if name == "return":
            continue
        try:
            hints[name] = eval(annotation, names) if isinstance(annotation, str) else annotation  # noqa: S307
        except Exception:  # an annotation naming what only type checkers import
            continue
    return hints


def _matches(value: Any, hint: Any) -> bool:
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any or hint is object:
        return True
    if origin in (Union, types.UnionType):
        return any(_matches(value, member) for member in args)
    if origin is Literal:
        return value in args
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is os.PathLike or origin is os.PathLike:
        return isinstance(value, os.PathLike)
    if origin in (collections.abc.Mapping, dict):
        return isinstance(value, collections.abc.Mapping)
    if origin in (collections.abc.Sequence, list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, collections.abc.Sequence):
            return False
        item = args[0] if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis) else Any
        return all(_matches(v, item) for v in value) if item in (int, str, float) else True
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return callable(value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a generic this check does not know: not checked


def _given(value: Any) -> str:
    """The type of ``value`` in words ("list holding float" for a list with a float in it)."""
    kind = type(value).__name__
    if isinstance(value, (list, tuple)) and value:
        held = sorted({type(v).__name__ for v in value})
        return f"{kind} holding {' and '.join(held)}"
    return kind


def _describe(hint: Any) -> str:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(member) for member in args))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if hint is type(None):
        return "None"
    if origin in (collections.abc.Mapping, dict):
        return "a mapping (e.g. a dict)"
    if origin in (collections.abc.Sequence, list, tuple):
        item = args[0] if args else None
        names = {int: "int", str: "str", float: "number"}
        return f"a list of {names[item]}" if item in names else "a list or tuple"
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return "a callable"
    words = {int: "an int", float: "a number", str: "a str", bool: "a bool"}
    if hint in words:
        return words[hint]
    return getattr(hint, "__name__", str(hint))
