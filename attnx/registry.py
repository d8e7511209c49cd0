"""Plugin manager: loads the ``attnx`` entry-point group once and isolates failures.

Environment:
    ATTNX_DISABLE_PLUGIN_AUTOLOAD=1  do not load entry points (tests, debugging).
    ATTNX_PLUGINS=mod_a,mod_b        also register these importable modules as plugins
                                      (like pytest's PYTEST_PLUGINS).

A plugin can break only itself: an import or hook that raises (``SystemExit`` included;
Ctrl-C still interrupts), a hook that returns anything but a list of well-formed
declarations, or a name that another plugin registered is recorded in
:attr:`Registry.failures` (shown by ``attnx list`` and ``attnx doctor``) and the rest
keeps working. A name claimed by a built-in plugin (an entry point of the attnx
distribution itself) and by another plugin stays the built-in's.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import traceback
import typing
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import pluggy

from attnx import hookspecs
from attnx.errors import AttnxError, unknown_choice

ENTRY_POINT_GROUP = "attnx"
BUILTIN_DISTRIBUTION = "attnx"
DISABLE_AUTOLOAD_ENV = "ATTNX_DISABLE_PLUGIN_AUTOLOAD"
EXTRA_PLUGINS_ENV = "ATTNX_PLUGINS"


@dataclasses.dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be imported or registered, and why."""

    plugin: str
    stage: str  # "import", "register", "commands", "conflict"
    error: str


@dataclasses.dataclass(frozen=True)
class LoadedPlugin:
    name: str
    source: str  # "entry point <dist>" or "ATTNX_PLUGINS" or "explicit"
    builtin: bool = False  # an entry point of the attnx distribution itself


class Registry:
    """Variants, models and the plugins that provided them."""

    def __init__(self, plugins: Iterable[tuple[str, Any, str]] = (), autoload: bool | None = None) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: list[LoadedPlugin] = []
        self.failures: list[PluginFailure] = []
        if autoload is None:
            autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
        if autoload:
            self._load_entry_points()
        for module_name in filter(None, os.environ.get(EXTRA_PLUGINS_ENV, "").split(",")):
            self._register_import(module_name.strip(), module_name.strip(), EXTRA_PLUGINS_ENV)
        for name, plugin, source in plugins:
            self._register(name, plugin, source)
        self.pm.check_pending()
        self._variants: dict[str, Any] | None = None
        self._models: dict[str, Any] | None = None
        self._adapters: dict[str, Any] | None = None
        self._variant_conflicts: dict[str, str] = {}
        self._model_conflicts: dict[str, str] = {}
        self._adapter_conflicts: dict[str, str] = {}

    # -- loading -----------------------------------------------------------------
    def _load_entry_points(self) -> None:
        def builtins_first(ep: Any) -> tuple[bool, str]:
            return _distribution(ep) != BUILTIN_DISTRIBUTION, ep.name

        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=builtins_first):
            dist = _distribution(ep)
            loaded, module = self._attempt(ep.name, "import", ep.load)
            if loaded:
                self._register(ep.name, module, f"entry point ({dist})", builtin=dist == BUILTIN_DISTRIBUTION)

    def _register_import(self, name: str, module_name: str, source: str) -> None:
        loaded, module = self._attempt(name, "import", lambda: importlib.import_module(module_name))
        if loaded:
            self._register(name, module, source)

    def _register(self, name: str, plugin: ModuleType | object, source: str, builtin: bool = False) -> None:
        if self.pm.has_plugin(name):
            taken = next((p.source for p in self.plugins if p.name == name), "another plugin")
            message = f"plugin name '{name}' ({source}) is taken by {taken}; rename it"
            self.failures.append(PluginFailure(name, "conflict", message))
            return
        if self._attempt(name, "register", lambda: self._register_checked(name, plugin))[0]:
            self.plugins.append(LoadedPlugin(name, source, builtin))

    def _register_checked(self, name: str, plugin: ModuleType | object) -> None:
        """Register ``plugin``; one that implements a hook attnx does not declare (a typo) is
        unregistered again, so ``check_pending`` cannot fail for everyone."""
        self.pm.register(plugin, name=name)
        unknown = sorted(
            caller.name
            for caller in self.pm.get_hookcallers(plugin) or []
            if not caller.has_spec()
            and any(impl.plugin is plugin and not impl.optionalhook for impl in caller.get_hookimpls())
        )
        if unknown:
            self.pm.unregister(plugin)
            hooks = ", ".join(sorted(n for n in dir(hookspecs) if n.startswith("attnx_")))
            raise AttnxError(f"implements {unknown[0]}, which is no attnx hook (hooks: {hooks})")

    def _attempt(self, plugin: str, stage: str, call: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, call()), or (False, None) with the failure recorded against ``plugin``."""
        try:
            return True, call()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: a plugin calling sys.exit() must not end the CLI
            self.failures.append(PluginFailure(plugin, stage, _one_line(exc)))
            return False, None

    # -- hook calls, one implementation at a time ----------------------------------
    def _collect(self, hook_name: str) -> list[tuple[str, Any]]:
        """Every plugin's well-formed declarations; a malformed result fails its plugin."""
        kind = _declared_item(hook_name)
        results: list[tuple[str, Any]] = []
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            called, items = self._attempt(impl.plugin_name, "register", impl.function)
            if not called:
                continue
            problem = _malformed(items, kind)
            if problem:
                self.failures.append(PluginFailure(impl.plugin_name, "register", f"{hook_name}() {problem}"))
                continue
            results.extend((impl.plugin_name, item) for item in items or [])
        return results

    def _index(self, hook_name: str, word: str) -> tuple[dict[str, Any], dict[str, str]]:
        """Declarations by name, and the names two plugins claim (with the error to show)."""
        owners: dict[str, list[tuple[str, Any]]] = {}
        for plugin_name, item in self._collect(hook_name):
            owners.setdefault(item.name, []).append((plugin_name, item))
        builtins = {p.name for p in self.plugins if p.builtin}
        table, conflicts = {}, {}
        for name, claims in owners.items():
            plugins = [p for p, _ in claims]
            builtin = [claim for claim in claims if claim[0] in builtins]
            if len(claims) == 1 or len(builtin) == 1:
                winner, table[name] = claims[0] if len(claims) == 1 else builtin[0]
                others = [p for p in plugins if p != winner]
                if others:
                    message = (
                        f"{word} '{name}' is registered by the built-in plugin {winner!r} and by "
                        f"{' and '.join(repr(p) for p in others)}; the built-in is used, rename the other"
                    )
                    self.failures.append(PluginFailure(", ".join(others), "conflict", message))
                continue
            conflicts[name] = (
                f"{word} '{name}' is registered by plugins {' and '.join(repr(p) for p in plugins)}; "
                "uninstall or rename one"
            )
            self.failures.append(PluginFailure(", ".join(plugins), "conflict", conflicts[name]))
        return table, conflicts

    @property
    def variants(self) -> dict[str, Any]:
        if self._variants is None:
            self._variants, self._variant_conflicts = self._index("attnx_register_variants", "variant")
        return self._variants

    @property
    def models(self) -> dict[str, Any]:
        if self._models is None:
            self._models, self._model_conflicts = self._index("attnx_register_models", "model")
        return self._models

    @property
    def adapters(self) -> dict[str, Any]:
        """Adapters by name (:class:`attnx.adapter.Adapter`)."""
        if self._adapters is None:
            self._adapters, self._adapter_conflicts = self._index("attnx_register_adapters", "adapter")
        return self._adapters

    def adapter(self, name: str):
        return self._lookup(name, self.adapters, self._adapter_conflicts, "adapter")

    def variant(self, name: str):
        """The variant called ``name``, or an :class:`AttnxError` naming the closest match."""
        return self._lookup(name, self.variants, self._variant_conflicts, "variant")

    def model(self, name: str):
        return self._lookup(name, self.models, self._model_conflicts, "model")

    def op_index(
        self, variants: Iterable[str] | None = None, decode: bool = True
    ) -> Iterator[tuple[Any, Any]]:
        """(variant, op) for each ``attnx::`` op of ``variants`` (default: every registered variant, by
        name): a variant's full-forward ops, then its step ops (with ``decode``). Lazy: a variant's
        implementation is imported only when the iteration reaches it, so a reader may stop early."""
        for name in sorted(self.variants) if variants is None else variants:
            variant = self.variant(name)
            impl = variant.load()
            for op in (*impl.ops, *(impl.decode_ops if decode else ())):
                yield variant, op

    def _lookup(self, name: str, table: dict, conflicts: dict, kind: str):
        if name in table:
            return table[name]
        if name in conflicts:
            raise AttnxError(conflicts[name])
        failed = [f for f in self.failures if f.plugin == name]
        if failed:
            raise AttnxError(
                f"{kind} '{name}' is unavailable: plugin failed to {failed[0].stage}: {failed[0].error}"
            )
        error = unknown_choice(kind, name, table)
        if self.failures:  # the name may be one a failed plugin would have registered
            plugins = ", ".join(sorted({f.plugin for f in self.failures}))
            error = AttnxError(f"{error}; plugins that failed: {plugins} (see `attnx list`)")
        raise error

    def add_commands(self, cli: Any) -> None:
        for impl in self.pm.hook.attnx_register_commands.get_hookimpls():
            self._attempt(impl.plugin_name, "commands", lambda impl=impl: impl.function(cli=cli))


def _distribution(ep: Any) -> str:
    return getattr(ep.dist, "name", "?")


def _declared_item(hook_name: str) -> str:
    """The class a registration hook's list holds, from its hookspec (``-> list[Variant]``)."""
    annotation = str(getattr(hookspecs, hook_name).__annotations__["return"])
    found = re.fullmatch(r"list\[(\w+)\]", annotation)
    if found is None:
        raise AssertionError(f"hookspec {hook_name} must return list[<declaration class>], not {annotation}")
    return found.group(1)


def _malformed(items: Any, kind: str) -> str | None:
    """What is wrong with a registration hook's result (None: a list of well-formed ``kind``)."""
    if items is None:
        return None
    if not isinstance(items, (list, tuple)):
        return f"returned {type(items).__name__} {_short(items)}, not a list of {kind}"
    for item in items:
        if kind not in (c.__name__ for c in type(item).__mro__) or not dataclasses.is_dataclass(item):
            return f"returned a list holding {type(item).__name__} {_short(item)}, not a {kind}"
        hints = typing.get_type_hints(type(item))
        for field in dataclasses.fields(item):
            value, hint = getattr(item, field.name), hints[field.name]
            if typing.get_origin(hint) is type:
                (base,) = typing.get_args(hint)
                if not (isinstance(value, type) and issubclass(value, base) and _declares_dataclass(value)):
                    return (
                        f"returned {kind} {_short(item.name)} whose {field.name} {_short(value)} is not a "
                        f"@dataclass subclass of {base.__name__}"
                    )
            elif isinstance(hint, type) and not isinstance(value, hint):
                return (
                    f"returned {kind} {_short(item.name)} whose {field.name} {_short(value)} is "
                    f"{type(value).__name__}, not {hint.__name__}"
                )
    return None


def _declares_dataclass(cls: type) -> bool:
    """``cls`` itself is decorated with @dataclass (a plain subclass inherits Config's empty fields)."""
    return "__dataclass_fields__" in vars(cls)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, AttnxError):
        return str(exc)
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return text[-1] if text else type(exc).__name__


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, created on first use."""
    global _registry
    if _registry is None:
        _registry = Registry()
    return _registry


def set_registry(registry: Registry | None) -> Registry | None:
    """Replace the process-wide registry (tests); returns the previous one."""
    global _registry
    previous, _registry = _registry, registry
    return previous
