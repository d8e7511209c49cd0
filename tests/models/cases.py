"""The variant x model table every model test draws from, derived from the variants' declarations.

A variant serves the ``encoder``; a causal one also the ``lm`` and the ``seq2seq`` decoder (its
cross-attention is the variant itself when it has a cross form, else softmax). A new variant joins
these tests by declaring its capabilities; its ``testing.options`` (e.g. Reformer's small chunks)
are what the tests give it.
"""

from __future__ import annotations

from typing import Any

from attnx.registry import get_registry

MODELS = ("encoder", "lm", "seq2seq")


# attnx's own variants (third-party plugins installed in the environment have their own tests)
REGISTERED = sorted(
    name for name, v in get_registry().variants.items() if v.config.__module__.startswith("attnx.")
)


def capabilities(variant: str) -> Any:
    return get_registry().variant(variant).capabilities


def supported(variant: str) -> tuple[str, ...]:
    return ("encoder", "lm", "seq2seq") if capabilities(variant).causal else ("encoder",)


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
