"""The variant under test and the op calls its module makes (captured, then replayed by the checks).

Checks never guess how to call a plugin's op: they build the variant's attention
layer for every declared capability, run it on tiny random inputs and record each
custom-op call (arguments, attributes, which optional inputs were None, output) with
a ``TorchDispatchMode``. Replaying those calls works for any op signature (extra
weight inputs, several ops per layer).

Sizes are chosen so that axes are told apart by length: batch 3, 2 heads of 8,
sequence 11 (prime, and equal to no other axis), 5 queries in cross attention.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from attnx import models as builtin_models
from attnx.config import Config
from attnx.hookspecs import hookimpl
from attnx.ops import AttentionOp, VariantImpl
from attnx.registry import Registry, get_registry, set_registry
from attnx.variant import AttentionSpec, Variant

BATCH = 3
D_MODEL = 16
N_HEADS = 2
LENGTH = 11
CROSS_QUERIES = 5
_BUILTIN_NAMESPACES = frozenset({"aten", "prims", "prim", "_refs"})


@dataclasses.dataclass(frozen=True)
class Case:
    """One way of calling the attention layer."""

    label: str
    causal: bool = False
    cross: bool = False
    masked: bool = False
    n_queries: int = LENGTH
    n_keys: int = LENGTH

    @property
    def spec(self) -> AttentionSpec:
        return AttentionSpec(D_MODEL, N_HEADS, causal=self.causal, cross=self.cross)


@dataclasses.dataclass
class OpCall:
    """One recorded call of a custom op (``op`` is None when the variant does not declare it)."""

    case: Case
    overload: Any
    op: AttentionOp | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any

    @property
    def name(self) -> str:
        """The torch op's qualified name, e.g. ``attnx_window::window_attention``."""
        return self.overload._schema.name

    def bound(self) -> dict[str, Any]:
        """Argument name -> value, in schema order."""
        names = [a.name for a in self.overload._schema.arguments]
        return {**dict(zip(names, self.args, strict=False)), **self.kwargs}  # trailing kwargs

    @property
    def outputs(self) -> tuple[torch.Tensor, ...]:
        """The recorded output(s) as a tuple; ``outputs[0]`` is the attention output."""
        return self.output if isinstance(self.output, tuple) else (self.output,)

    def run(self, values: Mapping[str, Any] | None = None) -> Any:
        """Call the op again, with some arguments replaced by ``values``."""
        return self.overload(**{**self.bound(), **(values or {})})

    def describe(self) -> str:
        """E.g. "causal, padded: q (3, 2, 11, 8), key_padding_mask (3, 11) bool, causal=True"."""
        parts = []
        for name, value in self.bound().items():
            if isinstance(value, torch.Tensor):
                dtype = "" if value.dtype == torch.float32 else f" {str(value.dtype).removeprefix('torch.')}"
                parts.append(f"{name} {tuple(value.shape)}{dtype}")
            elif value is None:
                parts.append(f"{name}=None")
            else:
                parts.append(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}")
        return f"{self.case.label}: " + ", ".join(parts)


@dataclasses.dataclass
class Forward:
    """One forward pass of the attention layer and the op calls it made (or the error it raised)."""

    case: Case
    module: nn.Module | None
    x: torch.Tensor
    context: torch.Tensor | None
    mask: torch.Tensor | None
    output: torch.Tensor | None
    calls: list[OpCall]
    error: str | None = None

    def rerun(self, x: torch.Tensor | None = None, context: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.module(
                self.x if x is None else x,
                context=self.context if context is None else context,
                key_padding_mask=self.mask,
            )


class _Recorder(TorchDispatchMode):
    """Records every call of a non-ATen op (the variant's custom ops) with its output."""

    def __init__(self, case: Case, ops: Mapping[Any, AttentionOp]) -> None:
        super().__init__()
        self.case, self.ops, self.calls = case, ops, []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        if func.namespace not in _BUILTIN_NAMESPACES:
            self.calls.append(
                OpCall(
                    self.case,
                    func,
                    self.ops.get(func),
                    tuple(_clone(a) for a in args),
                    {k: _clone(v) for k, v in kwargs.items()},
                    _clone(output),
                )
            )
        return output


def _clone(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def cases_for(variant: Variant) -> list[Case]:
    """Every case the declared capabilities allow: length 1, padded keys, causal, cross."""
    caps = variant.capabilities
    cases = []
    if caps.bidirectional:
        cases += [Case("self, n=1", n_queries=1, n_keys=1), Case("self")]
        if caps.key_padding_mask:
            cases.append(Case("self, padded", masked=True))
    elif caps.causal:
        cases.append(Case("causal, n=1", causal=True, n_queries=1, n_keys=1))
    if caps.causal:
        cases.append(Case("causal", causal=True))
        if caps.key_padding_mask:
            cases.append(Case("causal, padded", causal=True, masked=True))
    if caps.cross:
        cases.append(Case("cross", cross=True, n_queries=CROSS_QUERIES, masked=caps.key_padding_mask))
    return cases


def padding_mask(n_keys: int, generator: torch.Generator) -> torch.Tensor:
    """Bool (BATCH, n_keys), True = real token: random prefix lengths, one row of 1 token, one full row."""
    lengths = torch.randint(1, n_keys + 1, (BATCH,), generator=generator)
    lengths[0], lengths[1] = 1, n_keys
    return torch.arange(n_keys) < lengths[:, None]


@dataclasses.dataclass
class Subject:
    """The variant under test, its registry and everything derived from them (lazily, once)."""

    registry: Registry
    variant: Variant
    options: dict[str, Any]
    bad_options: dict[str, Any]
    seed: int = 0

    @functools.cached_property
    def config(self) -> Config:
        return self.variant.make_config(self.options)

    @functools.cached_property
    def impl(self) -> VariantImpl:
        impl = self.variant.load()
        if not isinstance(impl, VariantImpl):
            raise TypeError(
                f"impl '{self.variant.impl}' is a {type(impl).__name__}, not an attnx.ops.VariantImpl"
            )
        return impl

    def build(self, case: Case) -> nn.Module:
        """The attention layer for ``case``, refused by ``check_spec`` exactly as ``assemble`` would."""
        self.variant.check_spec(case.spec)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self.impl.build(self.config, case.spec).eval()

    @functools.cached_property
    def forwards(self) -> list[Forward]:
        """One recorded forward pass per case of :func:`cases_for` (failed ones carry ``error``)."""
        ops = {op.overload: op for op in self.impl.ops}
        modules: dict[AttentionSpec, nn.Module] = {}
        forwards = []
        for index, case in enumerate(cases_for(self.variant)):
            generator = torch.Generator().manual_seed(self.seed * 1000 + index)
            x = torch.randn(BATCH, case.n_queries, D_MODEL, generator=generator)
            context = torch.randn(BATCH, case.n_keys, D_MODEL, generator=generator) if case.cross else None
            mask = padding_mask(case.n_keys, generator) if case.masked else None
            recorder = _Recorder(case, ops)
            try:
                if case.spec not in modules:
                    modules[case.spec] = self.build(case)
                with torch.no_grad(), recorder:
                    output = modules[case.spec](x, context=context, key_padding_mask=mask)
            except Exception as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                place = f"{where.filename}:{where.lineno}"
                error = f"the {case.label} layer raised {type(exc).__name__}: {exc} ({place})"
                forwards.append(Forward(case, None, x, context, mask, None, [], error))
                continue
            forwards.append(Forward(case, modules[case.spec], x, context, mask, output, recorder.calls))
        return forwards

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Make :attr:`registry` the process-wide registry (the exporter looks variants up there)."""
        previous = set_registry(self.registry)
        try:
            yield
        finally:
            set_registry(previous)


class _Provides:
    """A plugin object registering one :class:`Variant` (for variants passed as objects)."""

    def __init__(self, variant: Variant) -> None:
        self.variant = variant

    @hookimpl
    def attnx_register_variants(self) -> list[Variant]:
        return [self.variant]


def resolve(variant: str | Variant, registry: Registry | None) -> tuple[Registry, Variant]:
    """The registry to test in and the variant, looked up by name or given as an object.

    A :class:`Variant` object that the registry does not already hold is registered
    in a fresh registry next to attnx's built-in models, so a plugin can be tested
    before it is installed.
    """
    registry = registry or get_registry()
    if isinstance(variant, str):
        return registry, registry.variant(variant)
    if registry.variants.get(variant.name) == variant:
        return registry, variant
    fresh = Registry(
        plugins=[
            ("models", builtin_models, "attnx.testing"),
            (f"attnx.testing:{variant.name}", _Provides(variant), "attnx.testing"),
        ],
        autoload=False,
    )
    return fresh, fresh.variant(variant.name)
