"""The model an export is made of: :func:`attnx.models.factory.construct` in an export dtype, in eval mode."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnx.errors import AttnxError, unknown_choice
from attnx.models.factory import Built, construct
from attnx.models.spec import TensorSpec, in_dtype
from attnx.ops import AttentionOp
from attnx.registry import Registry
from attnx.variant import Variant, describe

if TYPE_CHECKING:
    from attnx.exporter.manifest import Manifest

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


@dataclasses.dataclass
class Assembly(Built):
    """A built model as exported: its seed, and ``dtype`` ("fp32"/"fp16"), the dtype of the module's
    weights and activations."""

    seed: int = 0
    dtype: str = "fp32"

    @property
    def ops(self) -> list[AttentionOp]:
        seen: dict[str, AttentionOp] = {}
        for impl in self.impls.values():
            for op in impl.ops:
                seen.setdefault(op.name, op)
        return list(seen.values())

    def tolerance(self, dtype: str | None = None) -> dict[str, float]:
        """Parity tolerance in ``dtype`` (default: the model's): the loosest of its variants' (self and
        cross attention)."""
        variants = [v for v in (self.variant, self.cross_variant) if v is not None]
        tolerances = [v.tolerance_for(dtype or self.dtype) for v in variants]
        return {"atol": max(t.atol for t in tolerances), "rtol": max(t.rtol for t in tolerances)}

    @property
    def inputs(self) -> list[TensorSpec]:
        return in_dtype(self.module.input_specs(), self.dtype)

    @property
    def outputs(self) -> list[TensorSpec]:
        return in_dtype(self.module.output_specs(), self.dtype)


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
    """Build ``model`` with ``variant`` attention; the same arguments give the same weights.

    Args:
        options: model and variant options, see :func:`attnx.models.factory.split_options`.
        cross_variant: variant of the cross-attention layers (models with cross-attention
            only; default softmax).
        dtype: "fp32", or "fp16": the fp32 initialisation rounded to half precision.

    Raises:
        AttnxError: unknown names or options, or a variant that cannot serve the model
            (e.g. a causal ``lm`` around a bidirectional-only variant).
    """
    if dtype not in TORCH_DTYPES:
        raise unknown_choice("dtype", dtype, TORCH_DTYPES)
    built = construct(variant, model, options, seed, registry, cross_variant=cross_variant)
    _check_dtype(dtype, [v for v in (built.variant, built.cross_variant) if v is not None])
    built.module.to(TORCH_DTYPES[dtype]).eval()
    return Assembly(**vars(built), seed=seed, dtype=dtype)


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


def _check_dtype(dtype: str, variants: list[Variant]) -> None:
    """Refuse an fp16 build around a variant that declares fp32 only (``Capabilities.fp16``)."""
    for variant in variants:
        if dtype == "fp16" and not variant.capabilities.fp16:
            raise AttnxError(
                f"variant '{variant.name}' cannot be exported in fp16 ({describe(variant.capabilities)}); "
                "export it in fp32 (dtype=fp32)"
            )
