"""A stand-in for the parts of ``tensorrt`` and ``tensorrt.plugin`` that attnx calls, without TensorRT.

Written from TensorRT 11's documented Python API (``tensorrt.plugin`` docstrings and its
``_validate.py`` rules, ``_tensor.py``), not from attnx: the decorators check the function
schemas TensorRT checks and record what they receive; shape expressions support only what
``trtp.ShapeExpr`` supports (``+ - * //`` with the expression on the left, no ``int * expr``);
``KernelLaunchParams`` takes only its seven fields; the ``tensorrt`` module has the TensorRT 11
builder flags (no FP16/BF16/INT8) unless made as TensorRT 10.
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DataType:
    name: str  # the trt.DataType member name: FLOAT, HALF, BOOL, INT32, INT64


FLOAT, HALF, BOOL = DataType("FLOAT"), DataType("HALF"), DataType("BOOL")


class Expr:
    """A symbolic dimension: ``+ - * //`` with ints or Exprs, itself on the left (as trtp.ShapeExpr)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _op(self, sign: str, other: object) -> Expr:
        if not isinstance(other, (int, Expr)) or isinstance(other, bool):
            raise TypeError(f"cannot combine a shape expression with {other!r}")
        return Expr(f"({self.text} {sign} {other.text if isinstance(other, Expr) else other})")

    def __add__(self, other: object) -> Expr:
        return self._op("+", other)

    def __sub__(self, other: object) -> Expr:
        return self._op("-", other)

    def __mul__(self, other: object) -> Expr:
        return self._op("*", other)

    def __floordiv__(self, other: object) -> Expr:
        return self._op("//", other)

    def __repr__(self) -> str:
        return self.text


class TensorDesc:
    """Built from its dims: ints (known at build time) or names / Exprs (dynamic). ``shape_expr`` holds
    them as expressions, ``shape`` as TensorRT's build-time shape (-1 where dynamic)."""

    def __init__(self, dims: tuple[int | str | Expr, ...], dtype: DataType = FLOAT) -> None:
        self.shape_expr = tuple(Expr(d) if isinstance(d, str) else d for d in dims)
        self.shape = tuple(d if isinstance(d, int) else -1 for d in self.shape_expr)
        self.dtype = dtype


@dataclass
class AutoTuneCombination:
    io_types: str
    layouts: str = "LINEAR"
    tactics: list[int] | None = None


class SymInt32:
    def __init__(self, value: int | Expr) -> None:
        if not isinstance(value, (int, Expr)):
            raise TypeError(f"SymInt32 takes an int or a shape expression, not {value!r}")
        self.value = value


class SymExprs(list):
    pass


class SymIntExprs(SymExprs):
    @classmethod
    def from_tuple(cls, values: Any) -> SymIntExprs:
        return cls(values)


class KernelLaunchParams:
    FIELDS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared_mem")

    def __init__(self) -> None:
        for name in self.FIELDS:
            object.__setattr__(self, name, 0 if name == "shared_mem" else 1)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.FIELDS:
            raise AttributeError(f"KernelLaunchParams object has no attribute '{name}'")
        if not isinstance(value, (int, Expr)) or isinstance(value, bool):
            raise TypeError(f"{name} takes an int or a shape expression, not {value!r}")
        object.__setattr__(self, name, value)


ATTRIBUTE_TYPES = (int, float, str, bool, bytes)


@dataclass
class PluginStub:
    """The ``tensorrt.plugin`` decorators; ``calls`` records (decorator, plugin id, function) in order."""

    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    attributes: dict[str, list[str]] = field(default_factory=dict)  # plugin id -> registered attributes
    inputs: dict[str, list[str]] = field(default_factory=dict)

    def functions(self, decorator: str, plugin_id: str) -> list[Any]:
        return [f for d, p, f in self.calls if d == decorator and p == plugin_id]

    def register(self, plugin_id: str) -> Any:
        def decorate(function: Any) -> Any:
            params = list(inspect.signature(function).parameters.values())
            assert all(p.annotation is not inspect.Parameter.empty for p in params), "annotations required"
            assert all(p.default is inspect.Parameter.empty for p in params), "no defaults"
            tensors = [p.name for p in params if p.annotation is TensorDesc]
            assert [p.name for p in params[: len(tensors)]] == tensors, "tensors first"
            attributes = params[len(tensors):]
            for p in attributes:
                numpy_array = typing.get_origin(p.annotation) is np.ndarray
                assert p.annotation in ATTRIBUTE_TYPES or numpy_array, p
                assert p.name not in ("outputs", "stream", "tactic"), p.name
            assert inspect.signature(function).return_annotation is TensorDesc
            self.inputs[plugin_id] = tensors
            self.attributes[plugin_id] = [p.name for p in attributes]
            self.calls.append(("register", plugin_id, function))
            return function

        return decorate

    def _schema(self, kind: str, plugin_id: str, trailing: tuple[str, ...]) -> Any:
        def decorate(function: Any) -> Any:
            names = list(inspect.signature(function).parameters)
            assert plugin_id in self.attributes, f"{kind} before register"
            attrs = [n for n in self.attributes[plugin_id] if n in names]
            expected = [*self.inputs[plugin_id], *attrs, *trailing]
            optional_tactic = kind == "impl" and names == [*expected, "tactic"]
            assert names == expected or optional_tactic, (kind, names, expected)
            if kind == "aot_impl":
                returned = inspect.signature(function).return_annotation
                assert typing.get_origin(returned) is tuple, returned
                name, code, params, extra = typing.get_args(returned)
                assert set(typing.get_args(name)) == set(typing.get_args(code)) == {str, bytes}
                assert params is KernelLaunchParams and issubclass(extra, SymExprs)
            self.calls.append((kind, plugin_id, function))
            return function

        return decorate

    def impl(self, plugin_id: str) -> Any:
        return self._schema("impl", plugin_id, ("outputs", "stream"))

    def autotune(self, plugin_id: str) -> Any:
        return self._schema("autotune", plugin_id, ("outputs",))

    def aot_impl(self, plugin_id: str) -> Any:
        return self._schema("aot_impl", plugin_id, ("outputs", "tactic"))


def plugin_module(stub: PluginStub) -> types.ModuleType:
    """A ``tensorrt.plugin`` module object backed by ``stub``."""
    module = types.ModuleType("tensorrt.plugin")
    module.__dict__.update(
        TensorDesc=TensorDesc, AutoTuneCombination=AutoTuneCombination, KernelLaunchParams=KernelLaunchParams,
        SymInt32=SymInt32, SymIntExprs=SymIntExprs, SymExprs=SymExprs,
        from_shape_expr=lambda shape, dtype: TensorDesc(tuple(shape), dtype),
        register=stub.register, impl=stub.impl, autotune=stub.autotune, aot_impl=stub.aot_impl,
    )  # fmt: skip
    return module


class _Flags:
    def __init__(self, **values: int) -> None:
        self.__dict__.update(values)


def tensorrt_module(version: str = "11.4.0.106", plugin: types.ModuleType | None = None) -> types.ModuleType:
    """A ``tensorrt`` module with the enums attnx's build touches: TensorRT 11's builder flags (no FP16) or,
    for a 10.x ``version``, TensorRT 10's (with FP16)."""
    module = types.ModuleType("tensorrt")
    flags = {"TF32": 7, "REFIT": 3} | ({"FP16": 0, "INT8": 1} if version.startswith("10.") else {})
    module.__dict__.update(
        __version__=version,
        BuilderFlag=_Flags(**flags),
        NetworkDefinitionCreationFlag=_Flags(PREFER_JIT_PYTHON_PLUGINS=1, PREFER_AOT_PYTHON_PLUGINS=2),
        ProfilingVerbosity=_Flags(DETAILED=2),
        MemoryPoolType=_Flags(WORKSPACE=0),
    )
    if plugin is not None:
        module.plugin = plugin
    return module


def install(monkeypatch: Any, stub: PluginStub, version: str = "11.4.0.106") -> None:
    """Make ``import tensorrt`` / ``import tensorrt.plugin`` give the stand-ins (undone by monkeypatch)."""
    plugin = plugin_module(stub)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", plugin)
    monkeypatch.setitem(sys.modules, "tensorrt", tensorrt_module(version, plugin))
