"""``attnx doctor``: versions, runtimes, devices and plugin health."""

from __future__ import annotations

import dataclasses
import platform
from typing import Any

import click

from attnx.cli.common import echo_json, json_option
from attnx.errors import AttnxError


def plugin_status(registry: Any) -> dict[str, list[dict[str, Any]]]:
    """Per variant, whether each of its ops can be described as a TensorRT QDP plugin (no TensorRT needed)."""
    from attnx.errors import AttnxError
    from attnx.trt.spec import describe

    status: dict[str, list[dict[str, Any]]] = {}
    for name, variant in sorted(registry.variants.items()):
        try:
            ops = variant.load().ops
        except Exception as exc:  # a broken variant is reported, never fatal
            status[name] = [{"plugin": None, "status": "error", "error": f"{type(exc).__name__}: {exc}"}]
            continue
        entries = []
        for op in ops:
            try:
                spec = describe(op)
            except AttnxError as exc:
                entries.append({"plugin": f"attnx::{op.name}", "status": "error", "error": str(exc)})
                continue
            entries.append({
                "plugin": spec.plugin_id,
                "status": "ok",
                "version": spec.version,
                "inputs": spec.signature_inputs(),
                "fields": {f.name: f.qdp_annotation for f in spec.fields},
            })
        status[name] = entries
    return status


def doctor_data() -> dict:
    from attnx.cli.listing import adapter_data
    from attnx.exporter.manifest import package_versions
    from attnx.ortkernels import kernels_missing
    from attnx.parity.backends import BACKENDS
    from attnx.registry import get_registry
    from attnx.trt import tensorrt_missing, tensorrt_version

    registry = get_registry()
    import onnxruntime
    import torch

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": package_versions(),
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "cuda": {
            "available": torch.cuda.is_available(),
            "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        },
        "tensorrt": {"version": tensorrt_version(), "reason": tensorrt_missing()},
        "trt_plugins": plugin_status(registry),
        "ort_kernels": kernels_missing() or "available",
        "backends": {name: (b.unavailable(None) or "available") for name, b in BACKENDS.items()},
        "plugins": [dataclasses.asdict(p) for p in registry.plugins],
        "variants": sorted(registry.variants),
        "models": sorted(registry.models),
        "adapters": adapter_data(registry),
        "failed_plugins": [dataclasses.asdict(f) for f in registry.failures],
    }


def print_runtimes(out: str, as_json: bool) -> None:
    """Which serving runtimes the export ``out`` can be served with, and why not."""
    from attnx.exporter.directory import ExportDir
    from attnx.serve.runtimes import serving_runtimes

    runtimes = serving_runtimes(ExportDir.open(out))
    if as_json:  # the JSON key stays "targets": what scripts reading `attnx doctor OUT --json` parse
        echo_json({"export": out, "targets": [dataclasses.asdict(r) for r in runtimes]})
        return
    for runtime in runtimes:
        status = "ok" if runtime.reason is None else f"no: {runtime.reason}"
        click.echo(f"{runtime.name:25} {status}")
        click.echo(f"{'':25} {runtime.how}")


@click.command("doctor")
@click.argument("out", required=False, type=click.Path())
@click.option("--export", "export", default=None, type=click.Path(), help="Same as OUT.")
@json_option
def command(out: str | None, export: str | None, as_json: bool) -> None:
    """Report library versions, ONNX Runtime providers, CUDA/TensorRT status and plugin health;
    with OUT (an export), which serving targets it can be served with and why not.

    \b
    Examples:
      attnx doctor
      attnx doctor --json > doctor.json
      attnx doctor out          # ORT, onnxruntime-genai, Triton, TensorRT for this export
    """
    if out is not None and export is not None and out != export:
        raise AttnxError("give the export once: OUT or --export OUT")
    if (out or export) is not None:
        print_runtimes(str(out or export), as_json)
        return
    data = doctor_data()
    if as_json:
        echo_json(data)
        return
    click.echo(f"python       {data['python']} ({data['platform']})")
    for name, version in data["versions"].items():
        click.echo(f"{name:12} {version or 'not installed'}")
    click.echo(f"ORT providers {', '.join(data['onnxruntime_providers'])}")
    cuda = data["cuda"]
    devices = "available: " + ", ".join(cuda["devices"]) if cuda["available"] else "not available"
    click.echo(f"CUDA         {devices}")
    trt = data["tensorrt"]
    click.echo(f"TensorRT     {trt['version'] or 'unavailable: ' + trt['reason']}")
    click.echo(f"ORT kernels  {data['ort_kernels']} (plugin-lowered models on ONNX Runtime CPU)")
    for variant, entries in data["trt_plugins"].items():
        for entry in entries:
            if entry["status"] == "ok":
                fields = ", ".join(f"{k}: {v}" for k, v in entry["fields"].items()) or "-"
                inputs = ", ".join(entry["inputs"])
                click.echo(f"trt plugin   {entry['plugin']} ({variant}): inputs {inputs}; fields {fields}")
            else:
                click.echo(f"trt plugin   FAIL {entry['plugin'] or variant}: {entry['error']}")
    for name, status in data["backends"].items():
        click.echo(f"backend {name:8} {status}")
    click.echo(f"variants     {', '.join(data['variants'])}")
    click.echo(f"models       {', '.join(data['models'])}")
    for a in data["adapters"]:
        sources = f"; --from {', '.join(f'{s}:DIR' for s in a['sources'])}" if a["sources"] else ""
        installed = a["installed"] or "not installed"
        click.echo(f"adapter      {a['name']}: {a['library']} {installed}{sources}")
    for plugin in data["plugins"]:
        click.echo(f"plugin ok    {plugin['name']} [{plugin['source']}]")
    for failure in data["failed_plugins"]:
        click.echo(f"plugin FAIL  {failure['plugin']} ({failure['stage']}): {failure['error']}")
