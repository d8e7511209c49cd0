"""Every option a user can ``--set``, derived from the declarations, and Hypothesis strategies for values
of each option's type: in range, at the edges and out of range.

The options come from the registered models' and variants' config dataclasses and the recipe settings
(``[export]``, ``[verify]``, ``[bench]``), so a new variant, model or setting is fuzzed without a change
here. Values are strings, as ``--set KEY=VALUE`` passes them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from hypothesis import strategies as st

from attnx.recipes.loader import SETTINGS, load_recipe, recipe_names
from attnx.registry import get_registry
from tests.conftest import TINY
from tests.models.cases import VARIANT_OPTIONS

HUGE = ("1000000000", str(2**32), str(2**63), "1e30")
NOT_NUMBERS = ("", "abc", "nan", "inf", "-inf", "0x10", "true", "1,2")
AXES = ("batch", "seq", "src_seq", "tgt_seq", "bogus", "")
FAST_VERIFY = {"verify.seq_lens": "1,6"}  # short, across reformer's test chunks of 4


@dataclasses.dataclass(frozen=True)
class Option:
    """One ``--set`` key: ``key`` as typed (bare where unambiguous), ``field`` the config field it sets."""

    key: str
    field: str
    annotation: Any


@dataclasses.dataclass(frozen=True)
class Target:
    """What ``attnx export`` builds: a shipped recipe, or a model around a variant."""

    recipe: str | None = None
    model: str | None = None
    variant: str | None = None

    @property
    def id(self) -> str:
        return f"recipe-{self.recipe}" if self.recipe else f"{self.model}-{self.variant}"

    def args(self) -> list[str]:
        return (
            ["--recipe", self.recipe] if self.recipe else ["--model", self.model, "--variant", self.variant]
        )

    def names(self) -> tuple[str, str, str | None]:
        """Model, variant and cross-attention variant (None: the model has no cross-attention)."""
        if self.recipe:
            recipe = load_recipe(self.recipe)
            model, variant, cross = recipe.model, recipe.variant, recipe.cross_variant
        else:
            model, variant, cross = self.model, self.variant, None
        uses_cross = get_registry().model(model).uses_cross_attention
        return model, variant, (cross or "softmax") if uses_cross else None

    def base(self) -> dict[str, str]:
        """The ``--set`` values every case starts from: tiny sizes (a recipe with trained weights keeps its
        own, which the weights fix), the variant's test options, short verify lengths."""
        model, variant, _ = self.names()
        sizes = {} if self.recipe and load_recipe(self.recipe).export.checkpoint else TINY
        tested = {} if self.recipe else VARIANT_OPTIONS.get(variant, {})
        return {**{k: str(v) for k, v in {**sizes, **tested}.items()}, **FAST_VERIFY}

    def options(self) -> list[Option]:
        """Every option of this target's model, variant, cross variant and the recipe settings."""
        registry = get_registry()
        model, variant, cross = self.names()
        owners = {"model": registry.model(model).config, "variant": registry.variant(variant).config}
        if cross:
            owners["cross"] = registry.variant(cross).config
        found = []
        fields = {scope: _fields(config) for scope, config in owners.items()}
        for scope, declared in fields.items():
            for name, annotation in declared.items():
                shared = scope != "cross" and sum(name in fields[s] for s in ("model", "variant")) > 1
                key = f"{scope}.{name}" if scope == "cross" or shared else name
                found.append(Option(key, name, annotation))
        for section, config in SETTINGS.items():
            found += [Option(f"{section}.{n}", n, a) for n, a in _fields(config).items()]
        return found


def targets() -> list[Target]:
    """Every shipped recipe, and every registered model around every registered variant that can serve it
    (the capabilities its attention needs: other pairs are refused by name before any option is read,
    which tests/models/test_matrix.py covers)."""
    from tests.models.cases import SUPPORTED

    pairs = [Target(model=m, variant=v) for v, models in sorted(SUPPORTED.items()) for m in models]
    return [Target(recipe=name) for name in recipe_names()] + pairs


def _fields(config: type) -> dict[str, Any]:
    hints = typing.get_type_hints(config)
    return {f.name: hints[f.name] for f in dataclasses.fields(config)}


def ints() -> st.SearchStrategy[str]:
    in_range = st.integers(min_value=1, max_value=12).map(str)
    edges = st.sampled_from(["0", "-1", "1", "2", "3", "33", "64"])
    wrong = st.sampled_from([*HUGE, *NOT_NUMBERS, "2.5", "1e3", "-7"])
    return st.one_of(in_range, edges, wrong)


def floats() -> st.SearchStrategy[str]:
    in_range = st.floats(min_value=1e-9, max_value=10.0).map(repr)
    edges = st.sampled_from(["0", "-1", "1", "1e-300", "1e300", "-0.0"])
    return st.one_of(in_range, edges, st.sampled_from(NOT_NUMBERS))


def values(annotation: Any) -> st.SearchStrategy[str]:
    """Strings for an option declared as ``annotation`` (a config field's type)."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return st.one_of(st.just("none"), *(values(m) for m in members))
    if origin is Literal:
        return st.sampled_from([*map(str, typing.get_args(annotation)), "bogus", ""])
    if origin in (tuple, list):
        (item, *_) = typing.get_args(annotation) or (str,)
        items = ints() if item is int else st.sampled_from(AXES)
        return st.lists(items, max_size=3).map(",".join)
    if origin is dict:
        pair = st.tuples(st.sampled_from(AXES), ints()).map("=".join)
        return st.lists(pair, max_size=2).map(",".join)
    if annotation is bool:
        return st.sampled_from(["true", "false", "1", "0", "yes", "maybe", "2", ""])
    if annotation is int:
        return ints()
    if annotation is float:
        return floats()
    return st.sampled_from(["missing.json", "", ".", "/"])  # str settings are paths


@dataclasses.dataclass(frozen=True)
class Case:
    """``attnx export TARGET --set BASE --set ASSIGNMENTS -o out``."""

    target: Target
    assignments: tuple[tuple[Option, str], ...]

    def argv(self) -> list[str]:
        settings = {**self.target.base(), **{option.key: value for option, value in self.assignments}}
        sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
        return ["export", *self.target.args(), "-o", "out", "--quiet", *sets]

    def named(self, line: str) -> bool:
        """Whether ``line`` names one of the options this case set."""
        return any(option.field in line for option, _ in self.assignments)


@st.composite
def cases(draw: Any, chosen: list[Target] | None = None, most: int = 3) -> Case:
    """A target and 1..``most`` of its options, each with a drawn value."""
    target = draw(st.sampled_from(chosen or targets()))
    options = draw(
        st.lists(st.sampled_from(target.options()), min_size=1, max_size=most, unique_by=lambda o: o.key)
    )
    return Case(target, tuple((option, draw(values(option.annotation))) for option in options))


def _key(option: Option) -> str:
    return option.key
