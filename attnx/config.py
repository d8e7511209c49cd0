"""Typed, validated configuration dataclasses shared by variants, models and recipes.

A config is a frozen dataclass. Options arrive as strings (``--set heads=4``) or as
TOML values; :func:`make_config` converts them to the declared field types, rejects
unknown keys (naming the valid ones) and runs the class's own ``validate``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from attnx.errors import AttnxError

C = TypeVar("C", bound="Config")


@dataclasses.dataclass(frozen=True)
class Config:
    """Base class of every variant and model config."""

    def validate(self) -> None:
        """Raise :class:`AttnxError` naming the bad option and the fix. Override to add checks."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_config(cls: type[C], options: Mapping[str, Any] | None = None, *, what: str = "option") -> C:
    """Build ``cls`` from ``options`` (strings or typed values), converting and validating each."""
    options = dict(options or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        valid = ", ".join(sorted(fields)) or "none"
        raise AttnxError(f"unknown {what} '{unknown[0]}' for {cls.__name__} (valid: {valid})")
    converted = {name: convert_value(name, value, hints[name], what) for name, value in options.items()}
    config = cls(**converted)
    config.validate()
    return config


def convert_value(name: str, value: Any, annotation: Any, what: str = "option") -> Any:
    """Convert ``value`` (often a string from the command line) to ``annotation``."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return convert_value(name, value, args[0], what)
    if origin is Literal:
        choices = get_args(annotation)
        text = value if not isinstance(value, str) else value
        for choice in choices:
            if text == choice or str(choice) == str(text):
                return choice
        raise AttnxError(f"{what} {name}={value!r} must be one of {', '.join(map(str, choices))}")
    if origin in (tuple, list):
        (item_type, *_) = get_args(annotation) or (str,)
        items = value.split(",") if isinstance(value, str) else list(value)
        return tuple(convert_value(name, item, item_type, what) for item in items if str(item).strip())
    if annotation is bool:
        if isinstance(value, bool):
            return value
        lowered = str(value).strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise AttnxError(f"{what} {name}={value!r} must be a boolean (true/false)")
    if annotation in (int, float, str):
        if annotation is int and isinstance(value, float) and not value.is_integer():
            raise AttnxError(f"{what} {name}={value!r} must be an integer")
        if annotation is not str and isinstance(value, bool):
            raise AttnxError(f"{what} {name}={value!r} must be {annotation.__name__}, not a boolean")
        try:
            return annotation(value)
        except (TypeError, ValueError):
            article = "an" if annotation is int else "a"
            kind = {"int": "integer", "float": "number", "str": "string"}[annotation.__name__]
            raise AttnxError(f"{what} {name}={value!r} must be {article} {kind}") from None
    return value


def parse_assignments(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Parse ``["a=1", "b=x"]`` into a dict; a pair without '=' is an error."""
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise AttnxError(f"--set expects key=value, got '{pair}'")
        result[key.strip()] = value.strip()
    return result


def require(condition: bool, message: str) -> None:
    """Raise :class:`AttnxError` with ``message`` when ``condition`` is false."""
    if not condition:
        raise AttnxError(message)
