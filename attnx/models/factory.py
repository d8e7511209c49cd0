"""Build a model around a variant from names, options and a seed (deterministically).

:func:`construct` is the one path from names and options to a module, shared by the exporter
(``attnx.exporter.assemble``) and by training code (``attnx.nn.Model``). It takes the registry to
look the names up in as an argument: the models layer sits beside the registry, not above it.
Torch is imported when a model is built, so importing this module stays light.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from attnx.config import Config
from attnx.errors import AttnxError, unknown_choice
from attnx.models.spec import ACTIVATION_DTYPES, ModelSpec
from attnx.variant import AttentionSpec, Variant, describe

if TYPE_CHECKING:
    from torch import nn

    from attnx.ops import VariantImpl
    from attnx.registry import Registry

SCOPES = ("model", "variant", "cross")


@dataclasses.dataclass
class Built:
    """A built model and what it was built from (``cross_*`` only for cross-attention models).

    ``seed`` drew its initial weights; ``dtype`` ("fp32"/"fp16") is the dtype of its weights
    and activations.
    """

    module: nn.Module
    model: ModelSpec
    model_config: Config
    variant: Variant
    variant_config: Config
    impls: dict[str, VariantImpl]
    seed: int
    cross_variant: Variant | None = None
    cross_variant_config: Config | None = None
    dtype: str = "fp32"


def construct(
    registry: Registry,
    variant: str,
    model: str,
    options: Mapping[str, Any] | None = None,
    seed: int = 0,
    *,
    cross_variant: str | None = None,
    dtype: str = "fp32",
) -> Built:
    """Build ``model`` with ``variant`` attention; the same arguments give the same weights.

    Args:
        registry: where the model and variant names are looked up.
        options: model and variant options, see :func:`split_options`; the variant's
            ``model_defaults`` (and, in a model that generates, its ``decoder_defaults``) fill in
            what is not given.
        seed: the module is built under ``torch.manual_seed(seed)`` in a forked RNG.
        cross_variant: variant of the cross-attention layers (models with cross-attention
            only; default softmax).
        dtype: "fp32", or "fp16": the fp32 initialisation rounded to half precision.

    Raises:
        AttnxError: unknown names or options, or a variant that cannot serve the model
            (e.g. a causal ``lm`` around a bidirectional-only variant).
    """
    if dtype not in ACTIVATION_DTYPES:
        raise unknown_choice("dtype", dtype, ACTIVATION_DTYPES)
    model_spec = registry.model(model)
    variant_spec = registry.variant(variant)
    if cross_variant is not None and not model_spec.uses_cross_attention:
        raise AttnxError(f"model '{model}' has no cross-attention; a cross variant applies to seq2seq models")
    cross_spec = registry.variant(cross_variant or "softmax") if model_spec.uses_cross_attention else None
    model_options, variant_options, cross_options = split_options(
        options or {}, model_spec, variant_spec, cross_spec
    )
    model_config = model_spec.make_config(
        with_defaults(model_options, variant_spec.model_defaults, model_spec.config)
    )
    roles = {"self": (variant_spec, variant_options)}
    if cross_spec is not None:
        roles["cross"] = (cross_spec, cross_options)
    roles = {
        role: (spec, spec.make_config(decoder_options(spec, given, model_spec)))
        for role, (spec, given) in roles.items()
    }
    _check_padding_masks(model_spec.name, model_config, roles.values())
    _check_dtype(dtype, roles.values())
    impls = {spec.name: spec.load() for spec, _ in roles.values()}

    def attention(spec: AttentionSpec, role: str = "self") -> nn.Module:
        chosen, config = roles[role]
        try:
            chosen.check_spec(spec)
        except AttnxError as exc:
            raise _cannot_serve(registry, model_spec.name, spec, exc) from None
        return impls[chosen.name].build(config, spec)

    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = model_spec.build(model_config, attention)
    module.to(getattr(torch, ACTIVATION_DTYPES[dtype]))
    cross_variant_spec, cross_config = roles.get("cross", (None, None))
    return Built(
        module,
        model_spec,
        model_config,
        roles["self"][0],
        roles["self"][1],
        impls,
        seed,
        cross_variant_spec,
        cross_config,
        dtype,
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


def with_defaults(
    given: Mapping[str, Any], defaults: Mapping[str, Any], config: type[Config]
) -> dict[str, Any]:
    """``given`` plus the ``defaults`` it lacks that ``config`` has a field for."""
    fields = {f.name for f in dataclasses.fields(config)}
    return {**{k: v for k, v in defaults.items() if k in fields}, **given}


def decoder_options(variant: Variant, given: Mapping[str, Any], model: ModelSpec) -> dict[str, Any]:
    """A variant's options in ``model``: its ``decoder_defaults`` apply when the model generates."""
    return with_defaults(given, variant.decoder_defaults if model.generates else {}, variant.config)


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


def _cannot_serve(registry: Registry, model: str, spec: AttentionSpec, why: AttnxError) -> AttnxError:
    """The one-line refusal of a variant that cannot serve ``spec``, naming the variants that can."""
    able = []
    for name, variant in sorted(registry.variants.items()):
        try:
            variant.check_spec(spec)
        except AttnxError:
            continue
        able.append(name)
    can = f"; variants that can: {', '.join(able)}" if able else ""
    return AttnxError(f"model '{model}' needs {_describe_need(spec)}: {why}{can}")


def _describe_need(spec: AttentionSpec) -> str:
    if spec.cross:
        return "cross-attention"
    return "causal self-attention" if spec.causal else "bidirectional self-attention"


def _check_dtype(dtype: str, roles: Any) -> None:
    """Refuse an fp16 build around a variant that declares fp32 only (``Capabilities.fp16``)."""
    for variant, _ in roles:
        if dtype == "fp16" and not variant.capabilities.fp16:
            raise AttnxError(
                f"variant '{variant.name}' cannot be exported in fp16 ({describe(variant.capabilities)}); "
                "export it in fp32 (dtype=fp32)"
            )


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
