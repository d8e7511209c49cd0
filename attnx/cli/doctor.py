"""``attnx doctor``: versions, runtimes, devices and plugin health."""

from __future__ import annotations

import dataclasses
import platform

import click

from attnx.cli.common import echo_json, json_option


def doctor_data() -> dict:
    from attnx.exporter.manifest import package_versions
    from attnx.exporter.runners import BACKENDS
    from attnx.registry import get_registry

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
        "backends": {name: (b.unavailable() or "available") for name, b in BACKENDS.items()},
        "plugins": [dataclasses.asdict(p) for p in registry.plugins],
        "variants": sorted(registry.variants),
        "models": sorted(registry.models),
        "failed_plugins": [dataclasses.asdict(f) for f in registry.failures],
    }


@click.command("doctor")
@json_option
def command(as_json: bool) -> None:
    """Report library versions, ONNX Runtime providers, CUDA/TensorRT status and plugin health.

    \b
    Examples:
      attnx doctor
      attnx doctor --json > doctor.json
    """
    data = doctor_data()
    if as_json:
        echo_json(data)
        return
    click.echo(f"python       {data['python']} ({data['platform']})")
    for name, version in data["versions"].items():
        click.echo(f"{name:12} {version or 'not installed'}")
    click.echo(f"ORT providers {', '.join(data['onnxruntime_providers'])}")
    cuda = data["cuda"]
    click.echo(f"CUDA         {'available: ' + ', '.join(cuda['devices']) if cuda['available'] else 'not available'}")
    for name, status in data["backends"].items():
        click.echo(f"backend {name:8} {status}")
    click.echo(f"variants     {', '.join(data['variants'])}")
    click.echo(f"models       {', '.join(data['models'])}")
    for plugin in data["plugins"]:
        click.echo(f"plugin ok    {plugin['name']} [{plugin['source']}]")
    for failure in data["failed_plugins"]:
        click.echo(f"plugin FAIL  {failure['plugin']} ({failure['stage']}): {failure['error']}")
