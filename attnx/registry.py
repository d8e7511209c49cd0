"""Plugin manager: loads the ``attnx`` entry-point group once and isolates failures.

Environment:
    ATTNX_DISABLE_PLUGIN_AUTOLOAD=1  do not load entry points (tests, debugging).
    ATTNX_PLUGINS=mod_a,mod_b        also register these importable modules as plugins
                                      (like pytest's PYTEST_PLUGINS).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import traceback
from collections.abc import Iterable
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import pluggy

from attnx import hookspecs
from attnx.errors import AttnxError, unknown_choice

ENTRY_POINT_GROUP = "attnx"
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
        self._variant_conflicts: dict[str, list[str]] = {}
        self._model_conflicts: dict[str, list[str]] = {}
        self._adapter_conflicts: dict[str, list[str]] = {}

    # -- loading -----------------------------------------------------------------
    def _load_entry_points(self) -> None:
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = getattr(ep.dist, "name", "?")
            try:
                module = ep.load()
            except Exception as exc:  # a broken plugin must not break the CLI
                self.failures.append(PluginFailure(ep.name, "import", _one_line(exc)))
                continue
            self._register(ep.name, module, f"entry point ({dist})")

    def _register_import(self, name: str, module_name: str, source: str) -> None:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            self.failures.append(PluginFailure(name, "import", _one_line(exc)))
            return
        self._register(name, module, source)

    def _register(self, name: str, plugin: ModuleType | object, source: str) -> None:
        if self.pm.has_plugin(name):
            return
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:
            self.failures.append(PluginFailure(name, "register", _one_line(exc)))
            return
        self.plugins.append(LoadedPlugin(name, source))

    # -- hook calls, one implementation at a time ----------------------------------
    def _collect(self, hook_name: str, stage: str) -> list[tuple[str, Any]]:
        results: list[tuple[str, Any]] = []
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            try:
                items = impl.function() or []
            except Exception as exc:
                self.failures.append(PluginFailure(impl.plugin_name, stage, _one_line(exc)))
                continue
            results.extend((impl.plugin_name, item) for item in items)
        return results

    def _index(self, hook_name: str, kind: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
        owners: dict[str, list[tuple[str, Any]]] = {}
        for plugin_name, item in self._collect(hook_name, "register"):
            owners.setdefault(item.name, []).append((plugin_name, item))
        table, conflicts = {}, {}
        for name, claims in owners.items():
            if len(claims) == 1:
                table[name] = claims[0][1]
                continue
            plugins = [p for p, _ in claims]
            conflicts[name] = plugins
            self.failures.append(
                PluginFailure(
                    ", ".join(plugins),
                    "conflict",
                    f"{kind} '{name}' is registered by plugins {' and '.join(repr(p) for p in plugins)}; "
                    "uninstall or rename one",
                )
            )
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

    def _lookup(self, name: str, table: dict, conflicts: dict, kind: str):
        if name in table:
            return table[name]
        if name in conflicts:
            plugins = " and ".join(repr(p) for p in conflicts[name])
            raise AttnxError(f"{kind} '{name}' is registered by plugins {plugins}; uninstall or rename one")
        failed = [f for f in self.failures if f.plugin == name]
        if failed:
            raise AttnxError(
                f"{kind} '{name}' is unavailable: plugin failed to {failed[0].stage}: {failed[0].error}"
            )
        raise unknown_choice(kind, name, table)

    def add_commands(self, cli: Any) -> None:
        for impl in self.pm.hook.attnx_register_commands.get_hookimpls():
            try:
                impl.function(cli=cli)
            except Exception as exc:
                self.failures.append(PluginFailure(impl.plugin_name, "commands", _one_line(exc)))


def _one_line(exc: BaseException) -> str:
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
