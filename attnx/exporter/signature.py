"""The graph signature of a user's module: its inputs from example inputs, its outputs from the
forward's return value (``attnx.export_module``; the rules are in :mod:`attnx.exporter.module`).

:class:`FlatModule` calls a module with the graph inputs in order and returns its outputs
flattened to a tuple, which is what torch.export traces and every runner calls.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from attnx.errors import AttnxError, first_line
from attnx.models.spec import TensorSpec


@dataclasses.dataclass
class OutputNames:
    """The output names of a :class:`FlatModule`'s last call (an object, not a list attribute:
    torch.export restores list attributes a traced forward assigns)."""

    names: list[str] = dataclasses.field(default_factory=list)


class FlatModule(nn.Module):
    """``module`` with the graph inputs as positional arguments and the flattened outputs as a tuple.

    ``reference``: it is the parity reference (the user's own forward), so a forward that refuses
    the inputs a parity check feeds it (a length it does not take) is a one-line error naming them.
    """

    def __init__(
        self,
        module: nn.Module,
        names: Sequence[str],
        keywords: bool,
        constants: Mapping[str, Any] | None = None,
        reference: bool = False,
    ) -> None:
        super().__init__()
        self.module, self.names, self.keywords = module, list(names), keywords
        self.constants = dict(constants or {})
        self.reference = reference
        self.last = OutputNames()
        fixed_arity(self, self.call, len(self.names))

    def call(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            if self.keywords:
                result = self.module(**dict(zip(self.names, inputs, strict=True)), **self.constants)
            else:
                result = self.module(*inputs)
        except Exception as exc:
            if not self.reference or isinstance(exc, AttnxError):
                raise
            shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(self.names, inputs, strict=True))
            raise AttnxError(
                f"the module's own forward refuses the parity inputs ({shapes}): "
                f"{first_line(exc, limit=200)}; give lengths it accepts with --seq-lens (verify.seq_lens)"
            ) from None
        pairs = flatten_outputs(result)
        self.last.names = [name for name, _ in pairs]
        return tuple(tensor for _, tensor in pairs)


def fixed_arity(module: nn.Module, call: Any, count: int) -> None:
    """Make ``module.forward`` ``call`` with one positional parameter per graph input: torch.export
    matches dynamic shapes to forward's parameters."""
    module.forward = functools.partial(call)
    module.forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(f"input_{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(count)]
    )


def flatten_outputs(value: Any) -> list[tuple[str, torch.Tensor]]:
    """A forward's return value as (name, tensor) pairs, in order (see the module docstring).

    Raises:
        AttnxError: a value that is not a tensor, None, mapping, tuple or list.
    """
    if isinstance(value, torch.Tensor):
        return [("output", value)]
    return _flatten(value, "" if isinstance(value, Mapping) else "output")


def _flatten(value: Any, path: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(path, value)]
    if value is None:
        return []
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (tuple, list)):
        items = list(enumerate(value))
    else:
        raise AttnxError(
            f"the forward returns a {type(value).__name__} at '{path or 'the root'}'; outputs must be "
            "tensors, or dicts/tuples/lists of tensors"
        )
    return [pair for key, item in items for pair in _flatten(item, f"{path}.{key}" if path else str(key))]


CONSTANT_TYPES = (type(None), bool, int, float, str)


def input_specs(
    module: nn.Module, example: Any, dynamic_axes: Mapping[str, Mapping[int, str]] | None
) -> tuple[list[TensorSpec], tuple[torch.Tensor, ...], bool, dict[str, Any]]:
    """TensorSpecs of the example inputs, the tensors in graph order, whether the forward takes
    them as keywords, and the constant keyword arguments (a dict's non-tensor values).

    Raises:
        AttnxError: example inputs that are not a dict of tensors or a tuple of tensors, a dtype
            numpy has no name for, dynamic axes of unknown inputs or of example length 1, or one
            axis name with two example lengths.
    """
    constants: dict[str, Any] = {}
    if isinstance(example, Mapping):
        constants = {str(k): v for k, v in example.items() if isinstance(v, CONSTANT_TYPES)}
        given = {str(k): v for k, v in example.items() if str(k) not in constants}
        names, tensors, keywords = list(given), list(given.values()), True
    elif isinstance(example, (tuple, list)):
        tensors, keywords = list(example), False
        names = _positional_names(module, len(tensors))
    else:
        raise AttnxError(
            "example inputs must be a dict of name -> tensor or a tuple of tensors, "
            f"not {type(example).__name__}"
        )
    for name, tensor in zip(names, tensors, strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise AttnxError(f"example input '{name}' is a {type(tensor).__name__}, not a torch.Tensor")
    given = dict(dynamic_axes or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise AttnxError(f"dynamic axes name unknown inputs {unknown} (inputs: {', '.join(names)})")
    specs, lengths = [], {}
    for name, tensor in zip(names, tensors, strict=True):
        axes = given.get(name, _default_axes(tensor.dim()))
        spec = _spec(name, tensor, axes)
        for axis, size in zip(spec.axes, tensor.shape, strict=True):
            if isinstance(axis, str) and lengths.setdefault(axis, size) != size:
                raise AttnxError(
                    f"axis '{axis}' is {lengths[axis]} long in one example input and {size} in '{name}'; "
                    "one axis name means one length"
                )
        specs.append(spec)
    return specs, tuple(tensors), keywords, constants


def _positional_names(module: nn.Module, count: int) -> list[str]:
    parameters = [
        p.name
        for p in inspect.signature(module.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return [parameters[i] if i < len(parameters) else f"input_{i}" for i in range(count)]


def _default_axes(rank: int) -> dict[int, str]:
    return {i: axis for i, axis in enumerate(("batch", "seq")) if i < rank}


def _spec(name: str, tensor: torch.Tensor, axes: Mapping[int, str]) -> TensorSpec:
    dtype = str(tensor.dtype).removeprefix("torch.")
    if tensor.dtype == torch.bfloat16 or tensor.is_complex():
        raise AttnxError(
            f"example input '{name}' is {dtype}; export float32, float16, integer or bool inputs"
        )
    bad = sorted(d for d in axes if not 0 <= d < tensor.dim())
    if bad:
        raise AttnxError(f"dynamic axes of '{name}' name dims {bad}, but it has {tensor.dim()}")
    for dim, axis in axes.items():
        if tensor.shape[dim] < 2:
            raise AttnxError(
                f"example input '{name}' is {tensor.shape[dim]} long in dynamic axis '{axis}'; give an "
                "example of length >= 2 there (1 would be specialised)"
            )
    high = None
    if not tensor.is_floating_point() and tensor.dtype != torch.bool:
        high = int(tensor.max()) + 1 if tensor.numel() else 1
    shape = tuple(axes.get(d, n) for d, n in enumerate(tensor.shape))
    return TensorSpec(name, dtype, shape, high=high, bounds=_one_signed_range(tensor))


def _one_signed_range(tensor: torch.Tensor) -> tuple[float, float] | None:
    """The example's [min, max] when it has one sign (every element >= 0, or every one <= 0; not all zero):
    such an input is constrained (a log-decay, a gate, a rate) and parity inputs are drawn there; None
    otherwise."""
    if not tensor.is_floating_point() or not tensor.numel():
        return None
    low, high = float(tensor.min()), float(tensor.max())
    if not (math.isfinite(low) and math.isfinite(high)) or low < 0 < high or low == high == 0:
        return None
    return low, high


def dynamic_shapes(specs: Sequence[TensorSpec]) -> tuple[dict[int, Any], ...]:
    """torch.export's dynamic shapes of graph inputs: one ``Dim`` per axis name, shared by every input
    that has that axis."""
    dims: dict[str, Any] = {}
    return tuple(
        {
            i: dims.setdefault(a, torch.export.Dim(a.replace("-", "_").replace(".", "_")))
            for i, a in enumerate(s.axes)
            if isinstance(a, str)
        }
        for s in specs
    )


def output_specs(program: Any, inputs: Sequence[TensorSpec], names: Sequence[str]) -> list[TensorSpec]:
    """The flattened outputs' specs: ``names`` (from the traced call), dtypes and axes from the program
    (a dimension that is an input's dynamic axis takes its name, another symbolic one
    "<output>_dim<i>")."""
    symbols: dict[str, str] = {}
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for spec, name in zip(inputs, program.graph_signature.user_inputs, strict=True):
        for axis, dim in zip(spec.axes, placeholders[name].meta["val"].shape, strict=True):
            if isinstance(axis, str):
                symbols[str(dim)] = axis
    output = next(n for n in program.graph.nodes if n.op == "output")
    specs = []
    for name, node in zip(names, output.args[0], strict=True):
        value = node.meta["val"]
        axes = tuple(
            dim if isinstance(dim, int) else symbols.get(str(dim), f"{name}_dim{i}")
            for i, dim in enumerate(value.shape)
        )
        specs.append(TensorSpec(name, str(value.dtype).removeprefix("torch."), axes))
    return specs
