"""Build a model around a variant from names, options and a seed (deterministically).

:func:`construct` is the one path from names and options to a module: :func:`build` (exposed as
``attnx.models.build``) returns it ready to train, and the exporter's ``assemble`` wraps it for export.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from attnx.config import Config
from attnx.errors import AttnxError
from attnx.models import PAPER_ARCHITECTURE
from attnx.models.spec import ModelSpec
from attnx.ops import VariantImpl
from attnx.registry import Registry, get_registry
from attnx.variant import AttentionSpec, Variant

SCOPES = ("model", "variant", "cross")


@dataclasses.dataclass
class Built:
    """A built model and the specs and configs it was built from (``cross_*``: cross-attention models)."""

    module: nn.Module
    model: ModelSpec
    model_config: Config
    variant: Variant
    variant_config: Config
    impls: dict[str, VariantImpl]
    cross_variant: Variant | None = None
    cross_variant_config: Config | None = None


def build(
    model: str = "encoder",
    variant: str = "softmax",
    *,
    cross_variant: str | None = None,
    seed: int = 0,
    registry: Registry | None = None,
    **options: Any,
) -> nn.Module:
    """``model`` ("encoder", "lm", "seq2seq", or a plugin's) around ``variant`` attention, in train mode.

    The same arguments give the same initial weights (built under ``torch.manual_seed(seed)`` in a
    forked RNG). ``attnx.export(variant, out, model=model, options=options, checkpoint=...)`` exports
    the trained weights of the same model.

    Args:
        cross_variant: variant of the cross-attention layers (seq2seq only; default softmax).
        options: model and variant options (``d_model=256``, ``eps=1e-6``); see :func:`split_options`
            (a scoped key such as ``"model.d_model"`` goes in with ``**{...}``).

    Raises:
        AttnxError: unknown names or options (with the closest valid one), or a variant that cannot
            serve the model (e.g. a causal ``lm`` around a bidirectional-only variant).
    """
    built = construct(variant, model, options, seed, registry, cross_variant=cross_variant)
    return built.module.train()


def construct(
    variant: str,
    model: str,
    options: Mapping[str, Any] | None = None,
    seed: int = 0,
    registry: Registry | None = None,
    *,
    cross_variant: str | None = None,
) -> Built:
    """Resolve names, route and validate options, and build the module under ``seed`` (see :func:`build`)."""
    registry = registry or get_registry()
    model_spec = registry.model(model)
    variant_spec = registry.variant(variant)
    if cross_variant is not None and not model_spec.uses_cross_attention:
        raise AttnxError(f"model '{model}' has no cross-attention; a cross variant applies to seq2seq models")
    cross_spec = registry.variant(cross_variant or "softmax") if model_spec.uses_cross_attention else None
    model_options, variant_options, cross_options = split_options(
        options or {}, model_spec, variant_spec, cross_spec
    )
    model_fields = {f.name for f in dataclasses.fields(model_spec.config)}
    for key, value in PAPER_ARCHITECTURE.get(variant_spec.name, {}).items():
        if key in model_fields:
            model_options.setdefault(key, value)
    model_config = model_spec.make_config(model_options)
    variant_config = variant_spec.make_config(variant_options)
    roles = {"self": (variant_spec, variant_config)}
    if cross_spec is not None:
        roles["cross"] = (cross_spec, cross_spec.make_config(cross_options))
    _check_padding_masks(model_spec.name, model_config, roles.values())
    impls = {spec.name: spec.load() for spec, _ in roles.values()}

    def attention(spec: AttentionSpec, role: str = "self") -> nn.Module:
        chosen, config = roles[role]
        try:
            chosen.check_spec(spec)
        except AttnxError as exc:
            raise AttnxError(f"model '{model_spec.name}' needs {_describe_need(spec)}: {exc}") from None
        return impls[chosen.name].build(config, spec)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = model_spec.build(model_config, attention)
    cross_spec, cross_config = roles.get("cross", (None, None))
    return Built(
        module,
        model_spec,
        model_config,
        variant_spec,
        variant_config,
        impls,
        cross_variant=cross_spec,
        cross_variant_config=cross_config,
    )


def split_options(
    options: Mapping[str, Any], model: ModelSpec, variant: Variant, cross: Variant | None = None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Route option keys to the model, variant and cross-variant configs.

    A bare key goes to the model config if it has the key, else to every attention
    config that has it (the self-attention variant and the cross-attention variant, so
    ``eps`` reaches both when both are ``linear``); a key in the model and a variant
    config is ambiguous. "model.x", "variant.x" and "cross.x" say where explicitly.
    Later keys win.
    """
    specs = {"model": model, "variant": variant, "cross": cross}
    fields = {
        scope: {f.name for f in dataclasses.fields(spec.config)} if spec else set()
        for scope, spec in specs.items()
    }
    routed: dict[str, dict[str, Any]] = {scope: {} for scope in SCOPES}
    for key, value in options.items():
        scope, dot, name = key.partition(".")
        if dot and scope in SCOPES:
            if scope == "cross" and cross is None:
                raise AttnxError(
                    f"option '{key}' is for a cross-attention variant, but model '{model.name}' "
                    "has no cross-attention"
                )
            routed[scope][name] = value
            continue
        owners = [scope for scope in SCOPES if key in fields[scope]]
        if "model" in owners and len(owners) > 1:
            raise AttnxError(
                f"option '{key}' exists in both the model and the variant; "
                f"write model.{key} or {owners[1]}.{key}"
            )
        if not owners:
            raise _unknown_option(key, specs, fields)
        for owner in owners:
            routed[owner][key] = value
    return routed["model"], routed["variant"], routed["cross"]


def _unknown_option(key: str, specs: Mapping[str, Any], fields: Mapping[str, set[str]]) -> AttnxError:
    valid = sorted(set().union(*fields.values()))
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    titles = {"model": "model", "variant": "variant", "cross": "cross variant"}
    listed = [
        f"{titles[scope]} {spec.name}: {', '.join(sorted(fields[scope])) or 'none'}"
        for scope, spec in specs.items()
        if spec is not None
    ]
    return AttnxError(f"unknown option '{key}'{hint} ({'; '.join(listed)})")


def _describe_need(spec: AttentionSpec) -> str:
    if spec.cross:
        return "cross-attention"
    return "causal self-attention" if spec.causal else "bidirectional self-attention"


def _check_padding_masks(model: str, config: Config, roles: Any) -> None:
    if not getattr(config, "uses_key_padding_mask", False):
        return
    for variant, _ in roles:
        if not variant.capabilities.key_padding_mask:
            hint = "; set attention_mask=false" if hasattr(config, "attention_mask") else ""
            raise AttnxError(
                f"model '{model}' passes key padding masks, but variant '{variant.name}' "
                f"does not support them{hint}"
            )
