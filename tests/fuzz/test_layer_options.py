"""Property: ``attnx.nn.Attention(variant, **keywords)`` with any values of its keywords (its own and
every option of the variant's config) gives a layer that computes a finite output of the right shape,
or raises one AttnxError naming a keyword it was given.

The keywords come from the function's signature and the registered variants' configs, so a new
variant or option is fuzzed as it is registered. A fixed Hypothesis seed; more examples under -m slow.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnx.nn
from attnx.errors import AttnxError
from attnx.registry import get_registry

DEFAULT = settings(
    max_examples=60, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
MANY = settings(DEFAULT, max_examples=600)
BUDGETS = [pytest.param(DEFAULT, id="default"), pytest.param(MANY, id="many", marks=pytest.mark.slow)]
OWN = [
    name
    for name, p in inspect.signature(attnx.nn.Attention).parameters.items()
    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in ("variant", "registry")
]
NUMBERS = st.one_of(
    st.integers(min_value=1, max_value=12),
    st.sampled_from([0, -1, 3, 33, 2**40, 2.5, 4.0, math.nan, math.inf, -1e-9, 1e-9, 1e300]),
)
VALUES = st.one_of(NUMBERS, st.booleans(), st.sampled_from(["4", "abc", "", None, "trax", "paper"]))


def keywords(variant: str) -> list[str]:
    return [*OWN, *(f.name for f in dataclasses.fields(get_registry().variant(variant).config))]


@st.composite
def layers(draw: Any) -> tuple[str, dict[str, Any]]:
    """A variant, its d_model and n_heads (drawn, usually in range), and up to three other keywords."""
    variant = draw(st.sampled_from(sorted(get_registry().variants)))
    given = {"d_model": draw(st.one_of(st.sampled_from([8, 12, 6, 33]), VALUES)), "n_heads": draw(VALUES)}
    others = [k for k in keywords(variant) if k not in given]
    for key in draw(st.lists(st.sampled_from(others), max_size=3, unique=True)):
        given[key] = draw(VALUES)
    return variant, given


def check(case: tuple[str, dict[str, Any]]) -> None:
    variant, given = case
    try:
        layer = attnx.nn.Attention(variant, **given)
    except AttnxError as exc:
        message = str(exc)
        named = any(key in message for key in [*given, *OWN])  # a default's refusal names the keyword to give
        assert "\n" not in message and named, f"{variant} {given}: {message}"
        return
    d_model = given["d_model"]
    x = torch.randn(2, 5, d_model)
    context = torch.randn(2, 7, d_model) if given.get("cross") else None
    with torch.no_grad():
        y = layer.eval()(x, context)
    assert y.shape == x.shape and torch.isfinite(y).all(), f"{variant} {given}"


def test_the_keywords_come_from_the_signature_and_every_variant_config():
    assert {"d_model", "n_heads", "causal", "cross"} <= set(OWN)
    assert {"chunk_size", "n_hashes", "max_len", "eps", "scale", "share_qv"} <= {
        k for v in get_registry().variants for k in keywords(v)
    }


@pytest.mark.parametrize("budget", BUDGETS)
def test_any_keyword_values_build_a_working_layer_or_are_refused_by_name(budget: settings):
    budget(given(layers())(check))()
