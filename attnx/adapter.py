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
from collections.abc import Callable
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
    """

    convert: Callable[[Any], Any | None]
    needs_adapter: Callable[[Any], bool]
    load: Callable[[Path], tuple[Any, Any, Any, list[str]]] | None = None
