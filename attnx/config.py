"""Typed, validated configuration dataclasses shared by variants, models and recipes.

A config is a frozen dataclass. Options arrive as strings (``--set heads=4``) or as
TOML values; :func:`make_config` converts them to the declared field types, rejects
unknown keys (naming the valid ones) and runs the class's own ``validate``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from attnx.errors import AttnxError

C = TypeVar("C", bound="Config")
FLOAT32_MAX = 3.4028234663852886e38  # the largest float32


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
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise AttnxError(f"{what} {name}={value!r} must be one of {', '.join(map(str, choices))}{hint}")
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
            converted = annotation(value)
        except (TypeError, ValueError):
            article = "an" if annotation is int else "a"
            kind = {"int": "integer", "float": "number", "str": "string"}[annotation.__name__]
            raise AttnxError(f"{what} {name}={value!r} must be {article} {kind}") from None
        # TOML and float() take nan and inf; a model computes in float32, where 1e39 is inf already
        if annotation is float and not abs(converted) <= FLOAT32_MAX:
            raise AttnxError(f"{what} {name}={value!r} must be a finite number (at most {FLOAT32_MAX:.3g})")
        return converted
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


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mib": 1 << 20,
               "mb": 10**6, "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40,
               "tb": 10**12}


def parse_size(text: str, what: str = "size") -> int:
    """"8GiB", "512M", "2GB", "1e9" -> bytes: K/M/G/T and KiB/MiB/GiB/TiB are binary (2^10...), KB/MB/GB/TB
    decimal (10^3...), as IEC and SI define them.

    Raises:
        AttnxError: not a positive size in those units (naming ``what``).
    """
    match = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    try:
        value = float(match.group(1)) if match else -1.0
    except ValueError:
        value = -1.0
    if not match or unit not in _SIZE_UNITS or not value > 0:
        raise AttnxError(f"{what} '{text}' is not understood; write e.g. 8GiB, 512MiB or 2GB")
    return int(value * _SIZE_UNITS[unit])


def require(condition: bool, message: str) -> None:
    """Raise :class:`AttnxError` with ``message`` when ``condition`` is false."""
    if not condition:
        raise AttnxError(message)


def expected_type(value: Any, annotation: Any) -> str | None:
    """None if the parsed ``value`` (TOML or JSON: no coercion) has the type ``annotation`` asks for,
    else that type in words."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = get_args(annotation)
        if value is None and type(None) in members:
            return None
        wanted = [expected_type(value, member) for member in members if member is not type(None)]
        return None if None in wanted else " or ".join(str(w) for w in wanted)
    if origin is Literal:
        choices = get_args(annotation)
        return None if value in choices else "one of " + ", ".join(repr(c) for c in choices)
    if origin in (tuple, list):
        (item, *_) = get_args(annotation) or (str,)
        if not isinstance(value, list):
            return f"an array of {_words(item)}s"
        return next((f"an array of {_words(item)}s" for v in value if expected_type(v, item)), None)
    if origin is dict:
        _, item = get_args(annotation)
        ok = isinstance(value, dict) and all(not expected_type(v, item) for v in value.values())
        return None if ok else f"a table of {_words(item)}s"
    checks = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }
    check = checks.get(annotation)
    return None if check is None or check(value) else _words(annotation, article=True)


def _words(annotation: Any, article: bool = False) -> str:
    word = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(annotation, str(annotation))
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}" if article else word


def value_type(value: Any) -> str:
    kinds = [
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a float"),
        (str, "a string"),
        (list, "an array"),
        (dict, "a table"),
    ]
    return next((word for kind, word in kinds if isinstance(value, kind)), type(value).__name__)
