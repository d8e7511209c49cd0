"""``attnx list``: variants with capabilities, models, adapters, recipes, lowerings and targets, failed
plugins."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from attnx.cli.common import console, echo_json, json_option
from attnx.recipes import summaries
from attnx.registry import get_registry
from attnx.targets import TARGETS

LOWERINGS = {
    "function": "one attnx::<Op> node per attention call, body as an ONNX local function (default)",
    "decomposed": "standard ONNX ops only (bodies inlined)",
    "plugin": "bare attnx::<Op> nodes for TensorRT plugins (plugin_namespace=attnx)",
}


def listing_data() -> dict:
    registry = get_registry()
    variants = [
        {
            "name": v.name,
            "summary": v.summary,
            "paper": v.paper,
            "capabilities": dataclasses.asdict(v.capabilities),
            "options": {f.name: f.default for f in dataclasses.fields(v.config)},
            "tolerance": dataclasses.asdict(v.tolerance),
            "fp16_tolerance": dataclasses.asdict(v.fp16_tolerance),
        }
        for v in sorted(registry.variants.values(), key=lambda v: v.name)
    ]
    models = [
        {
            "name": m.name,
            "summary": m.summary,
            "options": {f.name: f.default for f in dataclasses.fields(m.config)},
        }
        for m in sorted(registry.models.values(), key=lambda m: m.name)
    ]
    return {
        "variants": variants,
        "models": models,
        "adapters": adapter_data(registry),
        "recipes": summaries(),
        "lowerings": LOWERINGS,
        "targets": {name: target.summary for name, target in TARGETS.items()},
        "plugins": [dataclasses.asdict(p) for p in registry.plugins],
        "failed_plugins": [dataclasses.asdict(f) for f in registry.failures],
    }


def adapter_data(registry: Any) -> list[dict[str, Any]]:
    """Each adapter: name, summary, library, its installed version (None: not installed), sources."""
    return [
        {
            "name": a.name,
            "summary": a.summary,
            "library": a.library,
            "installed": a.library_version(),
            "sources": list(a.sources),
        }
        for a in sorted(registry.adapters.values(), key=lambda a: a.name)
    ]


@click.command("list")
@json_option
def command(as_json: bool) -> None:
    """List attention variants (with capabilities), models, adapters, recipes, lowerings, lowering targets
    and plugin failures.

    \b
    Examples:
      attnx list
      attnx list --json | jq '.variants[].name'
    """
    data = listing_data()
    if as_json:
        echo_json(data)
        return
    out = console()
    for title, columns, rows in tables(data):
        if rows or not title.startswith("FAILED"):
            out.print(_table(title, columns, rows))


def tables(data: dict[str, Any]) -> list[tuple[str, tuple[str, ...], list[tuple[str, ...]]]]:
    """(title, columns, rows) of each table ``attnx list`` prints, from :func:`listing_data`."""
    yes = {True: "yes", False: "-"}
    flags = ("bidirectional", "causal", "cross", "key_padding_mask")
    variants = [
        (v["name"], *(yes[v["capabilities"][f]] for f in flags), v["capabilities"]["decode"] or "-",
         yes[v["capabilities"]["fp16"]], v["paper"].split(" (")[0])
        for v in data["variants"]
    ]  # fmt: skip
    adapters = [
        (a["name"], a["library"], a["installed"] or "no", ", ".join(f"{s}:" for s in a["sources"]) or "-",
         a["summary"])
        for a in data["adapters"]
    ]  # fmt: skip
    recipes = [
        (r["name"], r.get("model") or "?",
         (r.get("variant") or "?") + (f" (cross: {r['cross_variant']})" if r.get("cross_variant") else ""),
         r.get("error") or r["description"])
        for r in data["recipes"]
    ]  # fmt: skip
    return [
        ("attention variants", ("variant", "bidir", "causal", "cross", "pad mask", "decode", "fp16",
                                "paper"), variants),
        ("models", ("model", "summary"), [(m["name"], m["summary"]) for m in data["models"]]),
        ("adapters (attnx.export_module, docs/importing.md)",
         ("adapter", "library", "installed", "sources", "summary"), adapters),
        ("recipes (--recipe)", ("recipe", "model", "variant", "description"), recipes),
        ("lowerings (--lowering)", ("lowering", "ONNX graph holds"), list(data["lowerings"].items())),
        ("lowering targets (--target)", ("target", "bodies"), list(data["targets"].items())),
        ("FAILED plugins", ("plugin", "stage", "error"),
         [(f["plugin"], f["stage"], f["error"]) for f in data["failed_plugins"]]),
    ]  # fmt: skip


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table
