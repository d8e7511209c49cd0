"""Applying the registered adapters to a model: the walk ``attnx.export_module`` runs first.

The model is copied (its parameters and buffers are shared, not copied, so the copy costs no
weight memory and the user's object is left as it was), then walked top-down: the first adapter
whose ``convert`` returns a replacement for a module replaces it, and that replacement's children
are not visited. A module an adapter says ``needs_adapter`` that is still in the model afterwards
is refused in one line, naming its class, where it sits and the adapters that exist.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

from torch import nn

from attnx.adapter import Adapter, AdapterImpl, Lengths
from attnx.errors import AttnxError, first_line
from attnx.registry import Registry, get_registry


@dataclasses.dataclass
class Adapted:
    """The converted copy of a model and the adapters that converted something in it (in order)."""

    module: nn.Module
    adapters: list[str]
    lengths: Lengths | None = None  # what the library's modules accept, as adapters read them (None: any)
    # the decoder layer list an adapter names (AdapterImpl.layers)
    layers: tuple[nn.Module, str] | None = None


def loaded_adapters(registry: Registry) -> tuple[list[tuple[Adapter, AdapterImpl]], dict[str, str]]:
    """The adapters whose library is installed and whose heavy half imports, and why the others
    cannot apply (adapter name -> reason)."""
    usable, unusable = [], {}
    for name, adapter in sorted(registry.adapters.items()):
        if adapter.library_version() is None:
            unusable[name] = f"{adapter.library} not installed"
            continue
        try:
            usable.append((adapter, adapter.load()))
        except Exception as exc:  # a broken adapter must not break models that do not need it
            unusable[name] = f"failed to load: {first_line(exc, with_type=True)}"
    return usable, unusable


def apply_adapters(module: nn.Module, registry: Registry | None = None) -> Adapted:
    """A copy of ``module`` (same parameter tensors) with every module an adapter converts replaced.

    Raises:
        AttnxError: an adapter refuses a module it recognises (its own message), or a module that
            needs an adapter is left unconverted.
    """
    registry = registry or get_registry()
    usable, unusable = loaded_adapters(registry)
    shared = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    model = copy.deepcopy(module, memo=dict(shared))
    used: list[str] = []
    replaced: dict[int, nn.Module] = {}
    limits: list[Lengths | None] = []

    def convert(child: nn.Module) -> nn.Module | None:
        if id(child) in replaced:  # one module used in two places stays one module
            return replaced[id(child)]
        # the limits of every library module the walk reaches, read before a convert changes it
        limits.extend(impl.lengths(child) for _, impl in usable if impl.lengths)
        for adapter, impl in usable:
            replacement = impl.convert(child)
            if replacement is not None:
                used.extend([adapter.name] if adapter.name not in used else [])
                replaced[id(child)] = replacement
                return replacement
        return None

    def walk(parent: nn.Module) -> None:
        # _modules, not named_children(): that skips a second reference to one module.
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            replacement = convert(child)
            if replacement is None:
                walk(child)
            else:
                setattr(parent, name, replacement)

    root = convert(model)
    if root is None:
        walk(model)
    model = root or model
    _refuse_leftovers(model, usable, registry, unusable)
    return Adapted(model, used, Lengths.of(limits), _layer_list(model, usable, used))


def _layer_list(
    model: nn.Module, usable: list[tuple[Adapter, AdapterImpl]], used: list[str]
) -> tuple[nn.Module, str] | None:
    """The decoder layer list the first adapter that converted something in ``model`` names, or None."""
    for adapter, impl in usable:
        if adapter.name in used and impl.layers is not None and (found := impl.layers(model)) is not None:
            return found
    return None


def _refuse_leftovers(
    model: nn.Module,
    usable: list[tuple[Adapter, AdapterImpl]],
    registry: Registry,
    unusable: dict[str, str],
) -> None:
    for path, child in model.named_modules():
        if any(impl.needs_adapter(child) for _, impl in usable):
            kind = f"{type(child).__module__}.{type(child).__qualname__}"
            raise AttnxError(
                f"{kind} (at {path or 'the root'}) cannot be exported: no adapter converts it "
                f"(adapters: {adapter_summary(registry, unusable)}); see docs/importing.md"
            )


def adapter_summary(registry: Registry, unusable: dict[str, str] | None = None) -> str:
    """Every registered adapter with its library's version, and why one that is installed cannot apply."""
    parts = []
    for name, adapter in sorted(registry.adapters.items()):
        reason = (unusable or {}).get(name, "")
        parts.append(adapter.describe() + (f" ({reason})" if reason.startswith("failed") else ""))
    return ", ".join(parts) or "none registered"
