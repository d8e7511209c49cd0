"""Read, validate and override recipes (importable without torch).

A recipe is a TOML file with the tables ``[model]`` and ``[variant]`` (each a ``name``
plus that config's options), optionally ``[cross_variant]`` (seq2seq), ``[export]``,
``[verify]`` and ``[bench]``, and the top-level strings ``description`` and ``paper``.
Validation is strict: an unknown table or key names the valid ones, a value of the
wrong TOML type names the expected type (TOML values are typed, so nothing is coerced),
an unknown model or variant suggests the closest name.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from attnx.adapter import Lengths
from attnx.config import Config, expected_type, make_config, require, value_type
from attnx.domains import Lowering
from attnx.errors import AttnxError, unknown_choice
from attnx.limits import MAX_SEED
from attnx.registry import Registry, get_registry
from attnx.targets import Target

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


RECIPE_DIR = Path(__file__).parent
SUFFIX = ".toml"
MAX_NESTING = 16  # a recipe nests 3 deep ([export] example_lengths); deeper is a mistake or an attack
# the default verify lengths: odd ones, 1 for the smallest graph, one across 128-token boundaries
DEFAULT_SEQ_LENS = (1, 7, 32, 129)
STATE_NAMES = ("genai", "transformers.js")  # the runtimes whose decoder an lm decode export can carry


@dataclasses.dataclass(frozen=True)
class ExportSettings(Config):
    """``[export]``: how ``attnx export`` writes the model.

    Attributes:
        dynamic_axes: symbolic axes kept dynamic (None: all of the model's, e.g. batch, seq);
            any other axis is fixed to its example length.
        example_lengths: length per axis of the example inputs torch.export traces with
            (None: distinct primes 17, 19, ... and batch 2); a dynamic axis needs >= 2.
        decode: also export ``prefill.onnx`` + ``decode.onnx`` (KV cache or recurrent state) for
            token-by-token generation (:mod:`attnx.decode`); an lm also gets the onnxruntime-genai
            decoder (``genai.onnx`` + ``genai_config.json``, :mod:`attnx.serve.genai`).
        tokenizer: a Hugging Face ``tokenizer.json`` copied into the export (text in, text out).
        checkpoint: weights to export instead of the seeded initialisation (safetensors or a
            torch state dict); in a recipe file a relative path is relative to that file, so a
            recipe can ship its trained weights next to it.
        target: the lowering target (:mod:`attnx.targets`): "portable" (standard ONNX ops), or a
            runtime's own kernels ("ort") for the ops that declare a body for them.
        shared_weights: every graph keeps its weights as external data in ``weights.safetensors``
            instead of a copy each (:mod:`attnx.exporter.store`); None: from 1 GiB of weights.
        state_names: the runtimes whose decoder an lm's ``decode`` export also gets, each under that
            runtime's state names: "genai" (``genai.onnx``, :mod:`attnx.serve.genai`),
            "transformers.js" (``transformers-js.onnx`` + ``config.json``,
            :mod:`attnx.serve.transformers_js`).
    """

    opset: int = 18
    lowering: Lowering = "function"
    target: Target = "portable"
    dtype: Literal["fp32", "fp16"] = "fp32"
    seed: int = 0
    dynamic_axes: tuple[str, ...] | None = None
    example_lengths: dict[str, int] | None = None
    decode: bool = False
    tokenizer: str | None = None
    checkpoint: str | None = None
    shared_weights: bool | None = None
    state_names: tuple[str, ...] = ("genai",)

    def validate(self) -> None:
        require(
            0 <= self.seed <= MAX_SEED,
            f"export setting seed={self.seed} must be in 0..{MAX_SEED} (a signed 64-bit integer)",
        )
        for axis, length in (self.example_lengths or {}).items():
            require(
                isinstance(length, int) and not isinstance(length, bool) and length >= 1,
                f"export setting example_lengths.{axis}={length!r} must be an integer >= 1",
            )
        unknown = sorted(set(self.state_names) - set(STATE_NAMES))
        require(
            not unknown,
            f"export setting state_names has {', '.join(unknown)}; runtimes attnx names a decoder's state "
            f"for: {', '.join(STATE_NAMES)}",
        )


@dataclasses.dataclass(frozen=True)
class VerifySettings(Config):
    """``[verify]``: the parity check after export (``attnx verify`` has the same defaults).

    Random inputs of ``batch`` rows at each of ``seq_lens`` (odd lengths included, 1 for the
    smallest graph); None: :data:`DEFAULT_SEQ_LENS` fitted to the lengths the model accepts
    (:meth:`lengths`); ``atol``/``rtol`` None: the variants' tolerance.
    """

    enabled: bool = True
    seq_lens: tuple[int, ...] | None = None
    batch: int = 2
    atol: float | None = None
    rtol: float | None = None

    def validate(self) -> None:
        lengths = self.seq_lens
        require(
            lengths is None or (bool(lengths) and min(lengths) >= 1),
            f"verify setting seq_lens={list(lengths or ())} must be lengths >= 1",
        )
        require(self.batch >= 1, f"verify setting batch={self.batch} must be >= 1")
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            require(value is None or value >= 0, f"verify setting {name}={value} must be >= 0")

    def lengths(self, accepted: Lengths | None = None) -> tuple[int, ...]:
        """The lengths to verify at: the given ones, else the defaults fitted to the lengths the model
        ``accepted`` (an adapted library model's limits, :class:`attnx.adapter.Lengths`)."""
        if self.seq_lens is not None:
            return self.seq_lens
        return DEFAULT_SEQ_LENS if accepted is None else accepted.fit(DEFAULT_SEQ_LENS)


@dataclasses.dataclass(frozen=True)
class BenchSettings(Config):
    """``[bench]``: stored for ``attnx bench`` (None: the bench command's defaults)."""

    seq_lens: tuple[int, ...] | None = None
    batch: int | None = None

    def validate(self) -> None:
        require(
            not self.seq_lens or min(self.seq_lens) >= 1,
            f"bench setting seq_lens={self.seq_lens} must be >= 1",
        )
        require(self.batch is None or self.batch >= 1, f"bench setting batch={self.batch} must be >= 1")


SETTINGS: dict[str, type[Config]] = {
    "export": ExportSettings,
    "verify": VerifySettings,
    "bench": BenchSettings,
}
NAMED_TABLES = {"model": "model", "variant": "variant", "cross_variant": "cross"}  # table -> option scope
TOP_LEVEL = ("description", "paper", *NAMED_TABLES, *SETTINGS)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A validated recipe: what to build and how to export, verify and benchmark it.

    ``options`` are scoped option keys in application order ("model.d_model",
    "variant.n_hashes", "cross.eps", or bare keys added by overrides), as
    :func:`attnx.models.factory.split_options` routes them.
    """

    name: str
    model: str = "encoder"
    variant: str = "softmax"
    cross_variant: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    export: ExportSettings = dataclasses.field(default_factory=ExportSettings)
    verify: VerifySettings = dataclasses.field(default_factory=VerifySettings)
    bench: BenchSettings = dataclasses.field(default_factory=BenchSettings)
    description: str = ""
    paper: str = ""
    source: str = ""

    def with_names(
        self, variant: str | None = None, model: str | None = None, cross_variant: str | None = None
    ) -> Recipe:
        """Replace the model/variant/cross variant; a replaced one's recipe options are dropped."""
        changes = {
            "variant": ("variant", variant),
            "model": ("model", model),
            "cross_variant": ("cross", cross_variant),
        }
        recipe = self
        for field, (scope, name) in changes.items():
            if name is None or name == getattr(recipe, field):
                continue
            kept = {k: v for k, v in recipe.options.items() if not k.startswith(f"{scope}.")}
            recipe = dataclasses.replace(recipe, **{field: name, "options": kept})
        return recipe

    def override(self, assignments: Mapping[str, Any]) -> Recipe:
        """``--set`` on top: "export.x", "verify.x", "bench.x" replace settings (converted and
        validated); every other key is a model/variant option, applied after the recipe's."""
        recipe = self
        options = dict(self.options)
        for key, value in assignments.items():
            section, dot, name = key.partition(".")
            if dot and section in SETTINGS:
                recipe = recipe.with_settings(section, {name: value})
            else:
                options.pop(key, None)
                options[key] = value
        return dataclasses.replace(recipe, options=options)

    def with_settings(self, section: str, values: Mapping[str, Any]) -> Recipe:
        """Replace ``[section]`` settings (None values are ignored), converting strings."""
        current: Config = getattr(self, section)
        given = {
            k: _parse_lengths(v) if k == "example_lengths" else v for k, v in values.items() if v is not None
        }
        merged = {**current.to_dict(), **given}
        return dataclasses.replace(
            self, **{section: make_config(SETTINGS[section], merged, what=f"{section} setting")}
        )


def recipe_names() -> list[str]:
    """The recipes shipped with attnx."""
    return sorted(path.stem for path in RECIPE_DIR.glob(f"*{SUFFIX}"))


def recipe_path(name_or_path: str | Path) -> Path:
    """A shipped recipe by name, or a TOML file by path."""
    text = str(name_or_path)
    if text.endswith(SUFFIX) or "/" in text or "\\" in text:
        path = Path(text)
        if not path.is_file():
            raise AttnxError(f"recipe file '{path}' does not exist")
        return path
    if text not in recipe_names():
        raise unknown_choice("recipe", text, recipe_names())
    return RECIPE_DIR / f"{text}{SUFFIX}"


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML document at ``path``.

    Raises:
        AttnxError: unreadable, not UTF-8, not TOML, or nested deeper than :data:`MAX_NESTING`.
    """
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise AttnxError(f"recipe '{path}' is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise AttnxError(
            f"recipe '{path}' is not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8"
        ) from None
    except RecursionError:
        raise AttnxError(f"recipe '{path}' nests arrays or tables too deeply (max {MAX_NESTING})") from None
    except OSError as exc:
        raise AttnxError(f"cannot read recipe '{path}': {exc.strerror or exc}") from None
    if _nesting(data) > MAX_NESTING:
        raise AttnxError(f"recipe '{path}' nests arrays or tables too deeply (max {MAX_NESTING})")
    return data


def _nesting(data: Any) -> int:
    """How deep arrays and tables nest in ``data`` (iteratively: a deep document must not recurse)."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def load_recipe(name_or_path: str | Path, registry: Registry | None = None) -> Recipe:
    """Read and strictly validate a recipe (a shipped name or a path).

    Raises:
        AttnxError: one line naming the recipe, the table and key, and the fix.
    """

    registry = registry or get_registry()
    path = recipe_path(name_or_path)
    name = path.stem
    data = read_toml(path)

    def fail(message: str) -> AttnxError:
        return AttnxError(f"recipe '{name}': {message}")

    for key in data:
        if key not in TOP_LEVEL:
            raise fail(_unknown("key", key, TOP_LEVEL, "at the top level"))
    for key in ("description", "paper"):
        if not isinstance(data.get(key, ""), str):
            raise fail(f"{key} must be a string, not {value_type(data[key])}")
    for table in ("model", "variant"):
        if table not in data:
            raise fail(f'missing table [{table}] (it needs at least name = "...")')
    names: dict[str, str] = {}
    options: dict[str, Any] = {}
    for table, scope in NAMED_TABLES.items():
        if table not in data:
            continue
        entries = dict(_table(data, table, fail))
        table_name = entries.pop("name", None)
        if not isinstance(table_name, str):
            raise fail(f'[{table}] needs name = "..." (a string)')
        try:
            spec = registry.model(table_name) if table == "model" else registry.variant(table_name)
        except AttnxError as exc:
            raise fail(f"[{table}] {exc}") from None
        _check_options(entries, spec.config, table, fail)
        try:
            spec.make_config(entries)
        except AttnxError as exc:
            raise fail(f"[{table}] {exc}") from None
        names[table] = table_name
        options.update({f"{scope}.{key}": value for key, value in entries.items()})
    settings: dict[str, Config] = {}
    for section, cls in SETTINGS.items():
        entries = _table(data, section, fail) if section in data else {}
        _check_options(entries, cls, section, fail)
        try:
            settings[section] = make_config(cls, entries, what=f"{section} setting")
        except AttnxError as exc:
            raise fail(f"[{section}] {exc}") from None
    settings["export"] = _checkpoint_beside(settings["export"], path, fail)
    return Recipe(
        name=name,
        model=names["model"],
        variant=names["variant"],
        cross_variant=names.get("cross_variant"),
        options=options,
        description=data.get("description", ""),
        paper=data.get("paper", ""),
        source=str(path),
        **settings,
    )


def resolve(
    recipe: str | Path | Recipe | None = None,
    *,
    variant: str | None = None,
    model: str | None = None,
    cross_variant: str | None = None,
    options: Mapping[str, Any] | None = None,
    registry: Registry | None = None,
) -> Recipe:
    """The effective recipe: ``recipe`` (or the defaults: softmax encoder), explicit names, then overrides."""
    if recipe is None:
        base = Recipe(name="")
    elif isinstance(recipe, Recipe):
        base = recipe
    else:
        base = load_recipe(recipe, registry)
    return base.with_names(variant, model, cross_variant).override(options or {})


def summaries() -> list[dict[str, Any]]:
    """Name, model, variant and description of every shipped recipe (no registry needed, for listings)."""
    result = []
    for name in recipe_names():
        try:
            data = read_toml(RECIPE_DIR / f"{name}{SUFFIX}")
        except AttnxError as exc:
            result.append({"name": name, "error": str(exc)})
            continue
        tables = {table: data.get(table) for table in NAMED_TABLES}
        names = {
            table: value.get("name") if isinstance(value, dict) else None for table, value in tables.items()
        }
        result.append(
            {
                "name": name,
                **names,
                "description": str(data.get("description", "")),
                "paper": str(data.get("paper", "")),
            }
        )
    return result


def _checkpoint_beside(export: Config, recipe: Path, fail: Any) -> Config:
    """``[export] checkpoint`` resolved against the recipe's folder; it must exist."""
    if export.checkpoint is None:
        return export
    path = recipe.parent / export.checkpoint
    if not path.is_file():
        raise fail(f"[export] checkpoint '{export.checkpoint}' does not exist (looked for {path})")
    return dataclasses.replace(export, checkpoint=str(path))


def _table(data: dict[str, Any], table: str, fail: Any) -> dict[str, Any]:
    value = data[table]
    if not isinstance(value, dict):
        raise fail(f"'{table}' must be a table ([{table}]), not {value_type(value)}")
    return value


def _check_options(entries: Mapping[str, Any], cls: type[Config], table: str, fail: Any) -> None:
    """Unknown keys and TOML type mismatches, before any conversion."""
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    for key, value in entries.items():
        if key not in fields:
            valid = ["name", *fields] if table in NAMED_TABLES else fields
            raise fail(_unknown("key", key, valid, f"in [{table}]"))
        expected = expected_type(value, hints[key])
        if expected:
            raise fail(f"[{table}] {key} = {value!r} must be {expected}, not {value_type(value)}")


def _unknown(kind: str, key: str, valid: Any, where: str) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown {kind} '{key}' {where}{hint} (valid: {', '.join(valid)})"


def _parse_lengths(value: Any) -> Any:
    """ "seq=128,src_seq=64" (from --set) -> {"seq": 128, "src_seq": 64}; other values unchanged."""
    if not isinstance(value, str):
        return value
    lengths: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        axis, sep, number = part.partition("=")
        if not sep or not axis.strip() or not number.strip().isdigit():
            raise AttnxError(f"export setting example_lengths={value!r} must look like seq=128,batch=2")
        lengths[axis.strip()] = int(number)
    return lengths
