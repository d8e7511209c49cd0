"""What an export was made from, read back from its manifest when the export is reopened.

At export, the job's :class:`attnx.exporter.source.Source` writes the manifest fields that say how to
rebuild its torch reference: a registered model's name and configs, or a user's module's section and
stored program. :func:`source_for` is the one place that reads which: verify, bench, decode parity and
generate ask the object it returns (through :class:`attnx.exporter.directory.ExportDir`) for the
model's spec, the lengths it accepts and the rebuilt reference, never which kind it is. Torch is
imported by a rebuild only: readers of OUT (bench's ONNX Runtime worker) stay light.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from attnx.adapter import Lengths
from attnx.config import Config
from attnx.errors import AttnxError, first_line
from attnx.exporter.assemble import Assembly, rebuild
from attnx.exporter.budget import weights_within
from attnx.exporter.manifest import MANIFEST, MODULE_MODEL, Manifest, ModuleSection
from attnx.models.spec import ModelSpec
from attnx.registry import Registry

if TYPE_CHECKING:
    from attnx.exporter.module import ModuleAssembly

FileOf = Callable[[str], Path]  # manifest file key -> its path in OUT (ExportDir.file)
REBUILD_SLACK = 256 << 20


@dataclasses.dataclass(frozen=True)
class ModuleConfig(Config):
    """A module export has no model options: its layers carry their own."""


# A module export's model: no options, no cost model.
MODULE_SPEC = ModelSpec(MODULE_MODEL, "a user's nn.Module (attnx.export_module)", ModuleConfig, impl="")


class ExportedSource(Protocol):
    """What a reopened export asks of the source its manifest describes."""

    def spec(self, registry: Registry) -> ModelSpec:
        """The model the export was made of (its options and cost model)."""

    def accepted_lengths(self) -> Lengths | None:
        """The sequence lengths the model accepts, for the default verify lengths (None: any)."""

    def rebuild(self, file: FileOf) -> Assembly | ModuleAssembly:
        """The torch reference, from the export's files (``file``: a manifest file key's path)."""


@dataclasses.dataclass(frozen=True)
class RegisteredExport:
    """A registered model's export: rebuilt by name from the manifest's configs and the saved weights."""

    manifest: Manifest

    def spec(self, registry: Registry) -> ModelSpec:
        return registry.model(self.manifest.model)

    def accepted_lengths(self) -> None:
        return None

    def rebuild(self, file: FileOf) -> Assembly:
        """The model with the weights file loaded; one whose manifest describes more weights than that
        file holds is refused while it is built, before they are allocated.

        Raises:
            AttnxError: a manifest that describes more weights than the file holds, or a model that cannot
                be rebuilt from it.
        """
        weights = file("weights")
        described = weights.parent / MANIFEST  # an export's files are names inside OUT
        stored = weights.stat().st_size
        limit = 2 * stored + REBUILD_SLACK  # non-persistent buffers are not stored; modules cost a little

        def refusal(counted: int) -> AttnxError:
            return AttnxError(
                f"{described} describes a model whose weights pass {counted / 2**20:.0f} MiB, but "
                f"{weights.name} holds {stored / 2**20:.1f} MiB; re-export"
            )

        try:
            with weights_within(limit, refusal):
                return rebuild(self.manifest, weights)
        except (RuntimeError, ValueError, OverflowError, MemoryError) as exc:
            why = first_line(exc, with_type=True)
            raise AttnxError(f"cannot rebuild the model {described} describes ({why}); re-export") from None


@dataclasses.dataclass(frozen=True)
class ModuleExport:
    """A user's module's export: its stored program, loaded as data (nothing is unpickled)."""

    manifest: Manifest
    section: ModuleSection

    def spec(self, registry: Registry) -> ModelSpec:
        return MODULE_SPEC

    def accepted_lengths(self) -> Lengths | None:
        return self.section.lengths

    def rebuild(self, file: FileOf) -> ModuleAssembly:
        """The stored program, its variants' plugins imported first (see
        :func:`attnx.exporter.module.load_reference`)."""
        from attnx.exporter.module import load_reference  # imports torch: readers of OUT stay light

        return load_reference(self.manifest, file)


def source_for(manifest: Manifest) -> ExportedSource:
    """What ``manifest``'s export was made from: a user's module (it has a ``module`` section), else a
    registered model."""
    if manifest.module is None:
        return RegisteredExport(manifest)
    return ModuleExport(manifest, manifest.module)
