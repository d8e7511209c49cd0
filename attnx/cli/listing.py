"""``attnx list``: variants with capabilities, models, adapters, recipes, lowerings, failed plugins."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from attnx.cli.common import console, echo_json, json_option
from attnx.recipes import summaries
from attnx.registry import get_registry

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
    """List attention variants (with capabilities), models, adapters, recipes, lowerings and plugin failures.

    \b
    Examples:
      attnx list
      attnx list --json | jq '.variants[].name'
    """
    data = listing_data()
    if as_json:
        echo_json(data)
        return
    from rich.table import Table

    out = console()
    table = Table(title="attention variants")
    for column in ("variant", "bidirectional", "causal", "cross", "pad mask", "decode", "fp16", "paper"):
        table.add_column(column)
    yes = {True: "yes", False: "-"}
    for v in data["variants"]:
        caps = v["capabilities"]
        table.add_row(
            v["name"],
            yes[caps["bidirectional"]],
            yes[caps["causal"]],
            yes[caps["cross"]],
            yes[caps["key_padding_mask"]],
            caps["decode"] or "-",
            yes[caps["fp16"]],
            v["paper"].split(" (")[0],
        )
    out.print(table)
    models = Table(title="models")
    models.add_column("model")
    models.add_column("summary")
    for m in data["models"]:
        models.add_row(m["name"], m["summary"])
    out.print(models)
    adapters = Table(title="adapters (attnx.export_module, docs/importing.md)")
    for column in ("adapter", "library", "installed", "sources", "summary"):
        adapters.add_column(column)
    for a in data["adapters"]:
        sources = ", ".join(f"{s}:" for s in a["sources"]) or "-"
        adapters.add_row(a["name"], a["library"], a["installed"] or "no", sources, a["summary"])
    out.print(adapters)
    recipes = Table(title="recipes (--recipe)")
    for column in ("recipe", "model", "variant", "description"):
        recipes.add_column(column)
    for r in data["recipes"]:
        variant = r.get("variant") or "?"
        if r.get("cross_variant"):
            variant += f" (cross: {r['cross_variant']})"
        recipes.add_row(r["name"], r.get("model") or "?", variant, r.get("error") or r["description"])
    out.print(recipes)
    lowerings = Table(title="lowerings (--lowering)")
    lowerings.add_column("lowering")
    lowerings.add_column("ONNX graph holds")
    for name, text in LOWERINGS.items():
        lowerings.add_row(name, text)
    out.print(lowerings)
    if data["failed_plugins"]:
        failed = Table(title="FAILED plugins")
        for column in ("plugin", "stage", "error"):
            failed.add_column(column)
        for f in data["failed_plugins"]:
            failed.add_row(f["plugin"], f["stage"], f["error"])
        out.print(failed)
