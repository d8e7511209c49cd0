"""An export on disk, opened and checked once: the one door every reader of an OUT directory uses.

``ExportDir.open(OUT)`` reads ``attnx.json`` strictly and checks that every file it lists is a plain
file inside OUT (no symbolic link is followed), has the recorded SHA-256 and holds what it claims
(:mod:`attnx.exporter.files`; model.onnx's inputs and outputs are the manifest's), so verify, bench,
generate, build and serving configs never read a file the manifest does not describe, nor one
outside OUT. It answers "which ops does this export use" (from the manifest, resolved through the
installed plugins), resolves the model and variants it was made of and rebuilds the torch model, the
latter two through :func:`attnx.exporter.reopen.source_for` (a module export's from data: nothing is
unpickled).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnx.atomic import write_atomic
from attnx.config import Config
from attnx.domains import DOMAIN
from attnx.errors import AttnxError
from attnx.exporter.files import check_content, check_onnx, read_plain, sha256_plain
from attnx.exporter.manifest import MANIFEST, EngineSection, FileRecord, Manifest, sha256_file
from attnx.exporter.reopen import source_for
from attnx.models.spec import ModelSpec, TensorSpec
from attnx.registry import Registry, get_registry
from attnx.variant import Variant

if TYPE_CHECKING:
    from attnx.exporter.assemble import Assembly
    from attnx.exporter.module import ModuleAssembly
    from attnx.ops import AttentionOp

# What to do when an optional file is missing, per manifest file key.
_FIXES = {
    "prefill": "re-export with `attnx export --decode`",
    "decode": "re-export with `attnx export --decode`",
    "engine": "run `attnx build OUT`",
}
MANIFEST_LIMIT = 64 << 20
# What the files attnx writes under these keys must be (the suffix selects the content check).
_SUFFIXES = {
    **dict.fromkeys(("model", "prefill", "decode", "genai"), ".onnx"),
    **dict.fromkeys(("weights", "reference_tensors"), ".safetensors"),
    **dict.fromkeys(("genai_config", "tokenizer", "tokenizer_config"), ".json"),
}


@dataclasses.dataclass(frozen=True)
class ExportDir:
    """An ``attnx export`` OUT directory whose manifest and files were checked when opened."""

    path: Path
    manifest: Manifest

    @classmethod
    def open(cls, out: str | Path) -> ExportDir:
        """Read ``OUT/attnx.json`` and check every file it lists (a plain file inside OUT, same hash,
        the content it claims).

        Raises:
            AttnxError: OUT is not an attnx export, its manifest is malformed, or a file is missing, a
                symbolic link, changed since export or not what it claims to be.
        """
        return cls._opened(out, hashed=True)

    @classmethod
    def written(cls, out: str | Path) -> ExportDir:
        """An export this process has just written and hashed (:func:`attnx.exporter.export.write`), opened
        as :meth:`open` does without reading every file again for its hash (a real-size export's weights are
        gigabytes)."""
        return cls._opened(out, hashed=False)

    @classmethod
    def _opened(cls, out: str | Path, hashed: bool) -> ExportDir:
        directory = Path(out)
        if not directory.is_dir():
            raise AttnxError(f"'{directory}' is not a directory; pass the OUT directory of an `attnx export`")
        path = directory / MANIFEST
        if not os.path.lexists(path):
            raise AttnxError(f"'{directory}' has no {MANIFEST}; pass the OUT directory of an `attnx export`")
        try:
            text = read_plain(path, MANIFEST_LIMIT).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AttnxError(f"cannot read {path} ({type(exc).__name__}); re-export") from None
        export = cls(directory, Manifest.from_json(text, str(path)))
        for key in export.manifest.files:
            export._check(key, hashed)
        return export

    def _check(self, key: str, hashed: bool) -> None:
        """File ``key`` is a plain file of OUT with the content it claims (and, ``hashed``, its recorded
        hash)."""
        record = self.manifest.files[key]
        path = self.path / record.path
        if hashed and sha256_plain(path) != record.sha256:
            raise AttnxError(
                f"{path} changed since it was written (its SHA-256 differs from attnx.json's); re-export"
            )
        suffix = _SUFFIXES.get(key)
        if suffix is not None and path.suffix != suffix:
            raise AttnxError(f"{MANIFEST} lists {key} as {record.path}, not a {suffix} file; re-export")
        listed = [r.path for r in self.manifest.files.values()]
        if key == "model":  # the decode graphs' inputs are checked by the decode runtime, naming both sides
            _check_io(path, check_onnx(path, set(listed)), self.manifest.inputs, self.manifest.outputs)
        else:
            check_content(path, listed)

    def has(self, key: str) -> bool:
        return key in self.manifest.files

    def file(self, key: str) -> Path:
        """The path of manifest file ``key`` ("model", "weights", "prefill", "decode", "engine", ...)."""
        if key not in self.manifest.files:
            fix = _FIXES.get(key, "re-export it with `attnx export`").replace("OUT", str(self.path))
            raise AttnxError(f"'{self.path}' has no {key} file; {fix}")
        return self.path / self.manifest.files[key].path

    @property
    def model_path(self) -> Path:
        return self.file("model")

    @property
    def label(self) -> str:
        return self.path.name or str(self.path)

    def size(self, key: str) -> int:
        """Bytes of file ``key`` (with its external data, file ``<key>_data``, for a large ONNX graph)."""
        keys = [key, f"{key}_data"] if self.has(f"{key}_data") else [key]
        return sum(self.file(k).lstat().st_size for k in keys)

    def ops(self, registry: Registry | None = None) -> list[AttentionOp]:
        """The ``attnx::`` ops the export's graphs hold, from the installed plugins.

        Raises:
            AttnxError: an op no installed plugin provides (naming it and the fix).
        """
        registry = registry or get_registry()
        wanted = [name.split("::", 1)[-1] for name in self.manifest.ops]
        first = [n for n in (self.manifest.variant, self.manifest.cross_variant) if n]
        found: dict[str, AttentionOp] = {}
        for _, op in registry.op_index([*first, *sorted(set(registry.variants) - set(first))]):
            if set(wanted) <= set(found):
                break
            found.setdefault(op.name, op)
        missing = [name for name in wanted if name not in found]
        if missing:
            raise AttnxError(
                f"'{self.path}' uses {', '.join(f'{DOMAIN}::{m}' for m in missing)}, which no installed "
                "plugin provides; install the plugin it was exported with"
            )
        return [found[name] for name in wanted]

    def specs(
        self, registry: Registry | None = None
    ) -> tuple[ModelSpec, Config, dict[str, tuple[Variant, Config]]]:
        """The model and variants the export was made from, with their configs: (model, its config,
        {"self": (variant, config)[, "cross": (variant, config)]}). A module export's model is
        :data:`attnx.exporter.reopen.MODULE_SPEC` (no options, no cost model)."""
        registry = registry or get_registry()
        m = self.manifest
        model = source_for(m).spec(registry)
        variant = registry.variant(m.variant)
        roles = {"self": (variant, variant.make_config(m.variant_config))}
        if m.cross_variant is not None:
            cross = registry.variant(m.cross_variant)
            roles["cross"] = (cross, cross.make_config(m.cross_variant_config or {}))
        return model, model.make_config(m.model_config), roles

    def rebuild(self) -> Assembly | ModuleAssembly:
        """The torch model the export was made from (:func:`attnx.exporter.reopen.source_for`): a registered
        model rebuilt from the manifest and the saved weights, or a module export's stored program.

        Raises:
            AttnxError: a model that cannot be rebuilt from the manifest, or a program attnx does not load.
        """
        return source_for(self.manifest).rebuild(self.file)

    def write_manifest(self, manifest: Manifest) -> ExportDir:
        """Replace ``attnx.json`` atomically; returns the export with the new manifest."""
        write_atomic(self.path / MANIFEST, manifest.to_json())
        return dataclasses.replace(self, manifest=manifest)

    def record_engine(self, file_name: str, section: EngineSection) -> ExportDir:
        """Add ``OUT/<file_name>`` (already written) as the export's engine."""
        files = {**self.manifest.files, "engine": record_file(self.path, file_name)}
        return self.write_manifest(dataclasses.replace(self.manifest, files=files, engine=section))


def _check_io(path: Path, model: Any, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
    """The graph's inputs and outputs are the ones the manifest declares, by name.

    Raises:
        AttnxError: naming the file and the names that differ.
    """
    initializers = {t.name for t in model.graph.initializer}
    for side, declared, values in (
        ("inputs", inputs, model.graph.input),
        ("outputs", outputs, model.graph.output),
    ):
        actual = {v.name for v in values} - initializers
        if actual != {s.name for s in declared}:
            raise AttnxError(
                f"{path}'s {side} {sorted(actual)[:8]} are not the {side} attnx.json declares "
                f"{sorted(s.name for s in declared)[:8]}; re-export"
            )


def record_file(directory: Path, name: str) -> FileRecord:
    """The manifest record of ``directory/name``."""
    return FileRecord(name, sha256_file(Path(directory) / name))
