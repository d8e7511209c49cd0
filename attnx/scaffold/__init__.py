"""``attnx new-plugin``: scaffold an installable attention-variant plugin package.

The templates (package data, ``templates/**/*.tmpl``) hold a working example, a
sliding-window attention, with its tests. Paths name ``PACKAGE`` and ``NAME``
placeholders; contents use :class:`string.Template` fields (``${name}``, ``${camel}``,
``${package}``, ``${distribution}``, ``${attnx_version}``). Every generated name is
derived from the plugin name, so two plugins never collide: the entry point and
variant ``NAME``, the package ``attnx_NAME``, the torch op ``attnx_NAME::NAME_attention``,
the ONNX op ``<Camel>Attention`` and library functions ``<Camel>...``.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Iterator
from importlib import resources
from importlib.abc import Traversable
from importlib.metadata import entry_points
from pathlib import Path

from attnx import __version__
from attnx.atomic import staged_directory
from attnx.errors import AttnxError
from attnx.registry import ENTRY_POINT_GROUP, Registry, get_registry

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
MAX_NAME_LENGTH = 40
TEMPLATE_SUFFIX = ".tmpl"


@dataclasses.dataclass(frozen=True)
class Plugin:
    """The names a scaffolded plugin uses, all derived from ``name``."""

    name: str

    @property
    def camel(self) -> str:
        """CamelCase prefix of the ONNX op and library functions: ``local_window`` -> ``LocalWindow``."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def package(self) -> str:
        return f"attnx_{self.name}"

    @property
    def distribution(self) -> str:
        return f"attnx-{self.name.replace('_', '-')}"

    def fields(self) -> dict[str, str]:
        return {
            "name": self.name,
            "camel": self.camel,
            "package": self.package,
            "distribution": self.distribution,
            "attnx_version": __version__,
        }


@dataclasses.dataclass(frozen=True)
class ScaffoldResult:
    plugin: Plugin
    out: Path
    files: list[Path]


def validate_name(name: str, registry: Registry | None = None) -> Plugin:
    """Check that ``name`` can name a new plugin: lower-case identifier, not taken.

    Raises:
        AttnxError: one line naming the problem and a valid alternative.
    """
    if not NAME_PATTERN.match(name):
        suggestion = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
        if not suggestion[:1].isalpha():
            suggestion = f"my_{suggestion}".rstrip("_")
        raise AttnxError(
            f"plugin name '{name}' must be lower-case letters and digits, words joined by single "
            f"underscores, starting with a letter (e.g. '{suggestion}')"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise AttnxError(
            f"plugin name '{name}' is longer than {MAX_NAME_LENGTH} characters; choose a shorter one"
        )
    registry = registry or get_registry()
    taken = set(registry.variants) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name in taken:
        raise AttnxError(
            f"variant '{name}' already exists (see `attnx list`); choose another name, e.g. '{name}_v2'"
        )
    return Plugin(name)


def templates() -> Traversable:
    return resources.files(__name__) / "templates"


def _walk(
    directory: Traversable, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Traversable]]:
    for entry in sorted(directory.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            yield from _walk(entry, (*prefix, entry.name))
        elif entry.name.endswith(TEMPLATE_SUFFIX):
            yield (*prefix, entry.name.removesuffix(TEMPLATE_SUFFIX)), entry


def render(plugin: Plugin) -> dict[Path, str]:
    """Relative path -> file content of the scaffolded package."""
    fields = plugin.fields()
    files = {}
    for parts, template in _walk(templates()):
        path = Path(*(part.replace("PACKAGE", plugin.package).replace("NAME", plugin.name) for part in parts))
        files[path] = string.Template(template.read_text(encoding="utf-8")).substitute(fields)
    return files


def scaffold(
    name: str, out: str | Path | None = None, *, force: bool = False, registry: Registry | None = None
) -> ScaffoldResult:
    """Write a new plugin package for variant ``name`` to ``out`` (default ``./attnx-NAME``), atomically.

    Raises:
        AttnxError: an invalid or taken name, or ``out`` exists (without ``force``; with it, and is
            neither empty nor an earlier scaffold of this plugin) or is not writable.
    """
    plugin = validate_name(name, registry)
    target = Path(out) if out is not None else Path(plugin.distribution)
    files = render(plugin)
    # --force replaces an earlier scaffold of this plugin (or an empty directory), nothing else
    with staged_directory(target, force, marker=f"{plugin.package}/__init__.py") as staging:
        for path, content in files.items():
            (staging / path).parent.mkdir(parents=True, exist_ok=True)
            (staging / path).write_text(content, encoding="utf-8")
    return ScaffoldResult(plugin, target, sorted(files))
