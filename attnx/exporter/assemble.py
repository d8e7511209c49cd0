"""The model an export is made of: :func:`attnx.models.factory.construct`, in eval mode, and what
the exporter asks of it (its ops, tolerance, inputs and outputs in the export dtype)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from attnx.exporter.manifest import Manifest
from attnx.models.factory import Built, construct
from attnx.models.spec import TensorSpec, in_dtype
from attnx.registry import Registry, get_registry

if TYPE_CHECKING:
    from attnx.ops import AttentionOp, VariantImpl
    from attnx.variant import Variant


@dataclasses.dataclass
class Assembly(Built):
    """A built model as the exporter sees it."""

    every_tensor_exported = True  # an attnx model puts every one of its tensors into model.onnx

    @property
    def ops(self) -> list[AttentionOp]:
        return distinct_ops(self.impls.values())

    def tensors(self) -> dict[str, Any]:
        """The model's tensors by name (parameters and buffers, persistent or not), for the weight check."""
        return {**dict(self.module.named_buffers()), **self.module.state_dict()}

    def tolerance(self, dtype: str | None = None) -> dict[str, float]:
        """Parity tolerance in ``dtype`` (default: the model's): the loosest of its variants' (self and
        cross attention)."""
        variants = [v for v in (self.variant, self.cross_variant) if v is not None]
        return loosest_tolerance(variants, dtype or self.dtype)

    @property
    def inputs(self) -> list[TensorSpec]:
        return in_dtype(self.module.input_specs(), self.dtype)

    @property
    def outputs(self) -> list[TensorSpec]:
        return in_dtype(self.module.output_specs(), self.dtype)


def distinct_ops(impls: Iterable[VariantImpl]) -> list[AttentionOp]:
    """The ops of ``impls`` (their full forwards'), each once, in order."""
    seen: dict[str, AttentionOp] = {}
    for impl in impls:
        for op in impl.ops:
            seen.setdefault(op.name, op)
    return list(seen.values())


class AssembledOps(Protocol):
    """What :func:`every_op` reads of an assembly (:class:`Assembly`, or a module's
    :class:`attnx.exporter.module.ModuleAssembly`): its full forward's ops and its variants by name."""

    @property
    def ops(self) -> list[AttentionOp]: ...

    @property
    def impls(self) -> Mapping[str, VariantImpl]: ...


def every_op(assembly: AssembledOps) -> list[AttentionOp]:
    """Every op the export's graphs may hold: the full forward's and its variants' step ops."""
    ops = {op.name: op for op in assembly.ops}
    for _, op in get_registry().op_index(assembly.impls):
        ops.setdefault(op.name, op)
    return list(ops.values())


def loosest_tolerance(variants: Iterable[Variant], dtype: str) -> dict[str, float]:
    """The loosest parity tolerance of ``variants`` in ``dtype`` ("fp32"/"fp16")."""
    tolerances = [v.tolerance_for(dtype) for v in variants]
    return {"atol": max(t.atol for t in tolerances), "rtol": max(t.rtol for t in tolerances)}


def assemble(
    variant: str = "softmax",
    model: str = "encoder",
    options: Mapping[str, Any] | None = None,
    seed: int = 0,
    registry: Registry | None = None,
    *,
    cross_variant: str | None = None,
    dtype: str = "fp32",
) -> Assembly:
    """Build ``model`` with ``variant`` attention in eval mode; the same arguments give the same weights.

    See :func:`attnx.models.factory.construct` for the arguments and errors.
    """
    built = construct(
        registry or get_registry(), variant, model, options, seed, cross_variant=cross_variant, dtype=dtype
    )
    built.module.eval()
    return Assembly(**vars(built))


def rebuild(manifest: Manifest, weights: str | Path | None = None) -> Assembly:
    """The assembly an export was made from, from its manifest, with ``weights`` (safetensors) loaded."""
    from safetensors.torch import load_model

    configs = {
        "model": manifest.model_config,
        "variant": manifest.variant_config,
        "cross": manifest.cross_variant_config or {},
    }
    options = {f"{scope}.{key}": value for scope, config in configs.items() for key, value in config.items()}
    assembly = assemble(
        manifest.variant,
        manifest.model,
        options,
        manifest.seed,
        cross_variant=manifest.cross_variant,
        dtype=manifest.dtype,
    )
    if weights is not None:
        load_model(assembly.module, str(weights), strict=True)
    return assembly
