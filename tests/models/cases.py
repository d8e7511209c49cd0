"""The variant x model table every model test draws from, derived from the variants' declarations.

A variant that attends both ways serves the ``encoder``; a causal one the ``lm``, and one that does
both the ``seq2seq`` (a bidirectional encoder, a causal decoder; its cross-attention is the variant
itself when it has a cross form, else softmax). A new variant joins these tests by declaring its
capabilities; its ``testing.options`` (e.g. Reformer's small chunks) are what the tests give it.
The decode, fp16, genai and optimize tables take their variants from here too (:func:`decoders`,
:func:`one_per_kind`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from attnx.registry import get_registry

MODELS = ("encoder", "lm", "seq2seq")


# attnx's own variants (third-party plugins installed in the environment have their own tests)
REGISTERED = sorted(
    name for name, v in get_registry().variants.items() if v.config.__module__.startswith("attnx.")
)


def capabilities(variant: str) -> Any:
    return get_registry().variant(variant).capabilities


def supported(variant: str) -> tuple[str, ...]:
    caps = capabilities(variant)
    wanted = {"encoder": caps.bidirectional, "lm": caps.causal, "seq2seq": caps.bidirectional and caps.causal}
    return tuple(model for model in MODELS if wanted[model])


SUPPORTED = {variant: supported(variant) for variant in REGISTERED}
VARIANT_OPTIONS: dict[str, dict[str, Any]] = {
    variant: dict(get_registry().variant(variant).testing.options) for variant in REGISTERED
}
CASES = [(variant, model) for variant in REGISTERED for model in SUPPORTED[variant]]


def cross_for(variant: str) -> str:
    """The cross-attention variant a seq2seq test uses: the variant itself when it can."""
    return variant if capabilities(variant).cross else "softmax"


def causal_variants() -> list[str]:
    return [v for v in REGISTERED if capabilities(v).causal]


def decoders(kind: str | None = None) -> list[str]:
    """attnx's variants that decode (``Capabilities.decode``), or those whose state is of ``kind``."""
    return [v for v in REGISTERED if capabilities(v).decode and kind in (None, capabilities(v).decode)]


def one_per_kind(variants: Sequence[str]) -> list[Any]:
    """``variants`` as pytest params: the first that decodes with each kind of state (and the first that
    does not decode) in the default run, the others marked slow."""
    seen: set[Any] = set()
    params = []
    for variant in variants:
        kind = capabilities(variant).decode
        params.append(pytest.param(variant, marks=[] if kind not in seen else [pytest.mark.slow]))
        seen.add(kind)
    return params


def covering(cases: Sequence[tuple[str, str]]) -> list[Any]:
    """``(variant, model)`` cases as pytest params (id ``variant-model``): in the default run, each case
    that brings a variant or a model kind not seen before (every variant and every kind run at least
    once); the others marked slow (``-m slow`` runs the whole table)."""
    variants: set[str] = set()
    models: set[str] = set()
    params = []
    for variant, model in cases:
        new = variant not in variants or model not in models
        marks = [] if new else [pytest.mark.slow]
        params.append(pytest.param(variant, model, id=f"{variant}-{model}", marks=marks))
        variants.add(variant)
        models.add(model)
    return params
