"""The adapter contract (no torch): how a plugin takes models of another library into attnx.

An adapter recognises a third-party module (Hugging Face's ``LSHSelfAttention``,
fast-transformers' ``CausalLinearAttention``, ...) and supplies an attnx module that computes the
same function with the same parameters, built on attnx ops, so ``attnx.export_module`` exports a
library's own model object unchanged and proves parity against the library's own forward. A
plugin returns :class:`Adapter` declarations from ``attnx_register_adapters``; the heavy half
(:class:`AdapterImpl`, which imports the library and torch) loads lazily from ``impl``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from attnx.variant import load_object


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One adapter, as a plugin declares it.

    Attributes:
        name: e.g. "hf-reformer", shown by ``attnx list``.
        summary: one line.
        library: the distribution it adapts (e.g. "transformers"); ``attnx list``/``doctor`` say
            whether it is installed.
        impl: "module:attribute" of the :class:`AdapterImpl`, imported on first use.
        sources: the schemes of ``attnx export --from SCHEME:PATH`` it loads (e.g. ``("hf",)``).
        extra: attnx's optional-dependency group that installs :attr:`library` (e.g. "fla"), named by
            the error for a missing library; None: name the library.
    """

    name: str
    summary: str
    library: str
    impl: str
    sources: tuple[str, ...] = ()
    extra: str | None = None

    def install_hint(self) -> str:
        """e.g. "pip install 'attnx[fla]'" or "pip install transformers"."""
        return f"pip install 'attnx[{self.extra}]'" if self.extra else f"pip install {self.library}"

    def load(self) -> AdapterImpl:
        """Import and return the heavy half."""
        return load_object(self.impl, f"adapter '{self.name}'")

    def library_version(self) -> str | None:
        """The installed version of :attr:`library` (None: not installed)."""
        try:
            return metadata.version(self.library)
        except metadata.PackageNotFoundError:
            return None

    def describe(self) -> str:
        """e.g. "fast_transformers (pytorch-fast-transformers 0.4.0)" or
        "fla (flash-linear-attention not installed)"."""
        version = self.library_version()
        return f"{self.name} ({self.library} {version or 'not installed'})"


@dataclasses.dataclass(frozen=True)
class Lengths:
    """The sequence lengths a library's model accepts, as its adapter reads them from the model.

    Attributes:
        maximum: the longest input, after any padding the model does itself (a position table's size,
            an axial position shape's product, rounded down to the chunk multiple the model pads to);
            None: no limit.
        multiple: every length is a multiple of it (e.g. a chunked feed-forward's chunk); 1: any.
    """

    maximum: int | None = None
    multiple: int = 1

    def __and__(self, other: Lengths) -> Lengths:
        """Lengths both accept (a model holding two limited parts)."""
        maxima = [m for m in (self.maximum, other.maximum) if m is not None]
        return Lengths(min(maxima) if maxima else None, math.lcm(self.multiple, other.multiple))

    def fit(self, wanted: Sequence[int]) -> tuple[int, ...]:
        """``wanted`` made acceptable: each length rounded up to the multiple, capped at the longest
        accepted; distinct, in order. The default verify lengths of an export of this model."""
        step = max(self.multiple, 1)
        cap = None if self.maximum is None else max(step, self.maximum // step * step)
        fitted = (-(-n // step) * step for n in wanted)
        return tuple(dict.fromkeys(n if cap is None else min(n, cap) for n in fitted))

    @staticmethod
    def of(parts: Iterable[Lengths | None]) -> Lengths | None:
        """What every part accepts (None: no part declares a limit)."""
        found = [p for p in parts if p is not None]
        if not found:
            return None
        combined = found[0]
        for part in found[1:]:
            combined = combined & part
        return combined


@dataclasses.dataclass(frozen=True)
class AdapterImpl:
    """The heavy half of an adapter.

    Attributes:
        convert: ``convert(module) -> replacement | None``: the attnx module computing what
            ``module`` computes with the same parameters, or None when this adapter does not handle
            it. attnx walks a private copy of the model (parameters shared) top-down and replaces the
            first module an adapter converts (its children are not visited), so ``convert`` may also
            change the module it is given and return it. A replacement that decodes is (or holds)
            an :class:`attnx.state.DecodableLayer` with a ``stepping`` slot (an attnx layer, or
            :class:`attnx.attention.Stepping` on the library's layer). A module whose library
            behaviour cannot be reproduced raises :class:`attnx.errors.AttnxError` naming why.
        needs_adapter: ``needs_adapter(module) -> bool``: a module that must be converted for the
            model to export (the library's attention classes); one left unconverted is refused,
            naming its class and the adapters that exist.
        load: ``load(path) -> (model, example_inputs, dynamic_axes, notes)`` for ``attnx export --from
            SCHEME:PATH`` (SCHEME in :attr:`Adapter.sources`): the library's model in eval mode from
            a local directory, example inputs and dynamic axes (None: the defaults) exactly as
            ``attnx.export_module`` takes them (the graph's specs are derived from them), and notes:
            lines on what loading had to fix (e.g. a random draw made once), which the export prints
            and records in its manifest; None when the adapter loads nothing. Raises AttnxError for
            a directory it cannot load.
        lengths: ``lengths(module) -> Lengths | None``: the sequence lengths a module of its library
            accepts (a position limit, chunk multiples), asked of every module the walk reaches (the
            library's model class too, whose attention layers it converts) before any conversion;
            None for a module without limits or not its library's. attnx fits an
            export's default verify lengths (1, 7, 32, 129) to them, so an adapted model verifies with
            no flags (``attnx export --from``, ``attnx verify``); the manifest records them.
        layers: ``layers(model) -> (owner, attribute) | None``: the decoder layer list of a model
            this adapter converted something in (``getattr(owner, attribute)``, an ``nn.ModuleList``),
            asked of the converted model; attnx converts one layer of each kind and stamps the others
            (:mod:`attnx.exporter.repeat`). None: no list worth it. A module of the user's own names
            its list with a ``repeated_layers()`` method instead.
    """

    convert: Callable[[Any], Any | None]
    needs_adapter: Callable[[Any], bool]
    load: Callable[[Path], tuple[Any, Any, Any, list[str]]] | None = None
    lengths: Callable[[Any], Lengths | None] | None = None
    layers: Callable[[Any], tuple[Any, str] | None] | None = None
