"""Build a model around a variant from names, options and a seed (deterministically)."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import torch
from torch import nn

from attnx.config import Config
from attnx.errors import AttnxError
from attnx.models.spec import ModelSpec, TensorSpec
from attnx.ops import AttentionOp, VariantImpl
from attnx.registry import Registry, get_registry
from attnx.variant import AttentionSpec, Variant


@dataclasses.dataclass
class Assembly:
    """A built model and everything that describes it."""

    module: nn.Module
    model: ModelSpec
    model_config: Config
    variant: Variant
    variant_config: Config
    impls: dict[str, VariantImpl]
    seed: int

    @property
    def ops(self) -> list[AttentionOp]:
        seen: dict[str, AttentionOp] = {}
        for impl in self.impls.values():
            for op in impl.ops:
                seen.setdefault(op.name, op)
        return list(seen.values())

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.module.input_specs()

    @property
    def outputs(self) -> list[TensorSpec]:
        return self.module.output_specs()


def split_options(
    options: dict[str, Any], model: ModelSpec, variant: Variant
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Route ``--set`` keys to the model or the variant config ("model.x"/"variant.x" to force)."""
    model_fields = {f.name for f in dataclasses.fields(model.config)}
    variant_fields = {f.name for f in dataclasses.fields(variant.config)}
    model_options: dict[str, Any] = {}
    variant_options: dict[str, Any] = {}
    for key, value in options.items():
        scope, dot, name = key.partition(".")
        if dot and scope in ("model", "variant"):
            (model_options if scope == "model" else variant_options)[name] = value
        elif key in model_fields and key in variant_fields:
            raise AttnxError(f"option '{key}' exists in both the model and the variant; write model.{key} or variant.{key}")
        elif key in model_fields:
            model_options[key] = value
        elif key in variant_fields:
            variant_options[key] = value
        else:
            valid = sorted(model_fields | variant_fields)
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise AttnxError(
                f"unknown option '{key}'{hint} (model {model.name}: {', '.join(sorted(model_fields))}; "
                f"variant {variant.name}: {', '.join(sorted(variant_fields)) or 'none'})"
            )
    return model_options, variant_options


def assemble(
    variant: str = "softmax",
    model: str = "encoder",
    options: dict[str, Any] | None = None,
    seed: int = 0,
    registry: Registry | None = None,
) -> Assembly:
    """Build ``model`` with ``variant`` attention; the same arguments give the same weights."""
    registry = registry or get_registry()
    model_spec = registry.model(model)
    variant_spec = registry.variant(variant)
    model_options, variant_options = split_options(dict(options or {}), model_spec, variant_spec)
    model_config = model_spec.make_config(model_options)
    variant_config = variant_spec.make_config(variant_options)
    impl = variant_spec.load()

    def attention(spec: AttentionSpec, role: str = "self") -> nn.Module:
        variant_spec.check_spec(spec)
        return impl.build(variant_config, spec)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = model_spec.build(model_config, attention)
    module.eval()
    return Assembly(module, model_spec, model_config, variant_spec, variant_config, {variant_spec.name: impl}, seed)
