"""``attnx build``: a TensorRT engine for an export (OUT/engine.plan)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import click

from attnx.cli.common import echo_json, json_option, progress_printer
from attnx.trt.build import DEFAULT_BATCH, DEFAULT_SEQ

F = TypeVar("F", bound=Callable[..., Any])
EPILOG = """\b
Examples:
  attnx build out
  attnx build out --workspace 4G --min-seq 1 --opt-seq 256 --max-seq 2048 --max-batch 16
  attnx export --variant reformer --lowering plugin -o rf && attnx build rf && attnx verify rf --backends trt
  attnx export --variant linear --lowering plugin --dtype fp16 -o lin16 && attnx build lin16 --aot
  attnx build rf --jit          # plugins call the variants' torch ops: the engine needs Python
"""


def _range_options(name: str, default: tuple[int, int, int]) -> Callable[[F], F]:
    """--min-NAME/--opt-NAME/--max-NAME integer options."""

    def decorate(func: F) -> F:
        for bound, value in reversed(list(zip(("min", "opt", "max"), default, strict=True))):
            option = click.option(f"--{bound}-{name}", f"{bound}_{name}", default=value, show_default=True,
                                  type=int, help=f"{bound.capitalize()} {name} size of the build profile.")
            func = option(func)
        return func

    return decorate


@click.command("build", epilog=EPILOG)
@click.argument("out", type=click.Path())
@click.option(
    "--fp16",
    is_flag=True,
    help="An fp16 engine. TensorRT >= 11 builds the export's own dtypes, so this needs an fp16 export "
    "(attnx export --dtype fp16, attnx optimize --fp16); TensorRT 10 allows fp16 kernels on any export.",
)
@click.option(
    "--aot/--jit",
    "aot",
    default=None,
    help="Plugins as Triton kernels compiled into the engine (no Python needed to load it), or as Python "
    "callbacks into the torch ops. Default: AOT when every plugin op has a kernel and triton can compile.",
)
@click.option("--workspace", default=None, metavar="SIZE", help="Workspace memory limit, e.g. 4G or 512M.")
@_range_options("seq", DEFAULT_SEQ)
@_range_options("batch", DEFAULT_BATCH)
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
@json_option
def command(out: str, fp16: bool, aot: bool | None, workspace: str | None, min_seq: int, opt_seq: int,
            max_seq: int, min_batch: int, opt_batch: int, max_batch: int, quiet: bool, as_json: bool) -> None:
    """Build OUT/engine.plan from OUT/model.onnx with TensorRT.

    One optimisation profile covers the manifest's dynamic axes: "batch" takes the batch
    range, every other named axis the sequence range. A plugin-lowered export registers
    the attnx TensorRT plugins first (AOT Triton kernels or JIT torch callbacks; the
    progress output says which and why). OUT/attnx.json records what the engine holds
    (layer precisions, plugin layers, whether loading it needs Python);
    `attnx verify OUT --backends trt` then compares the engine with torch.
    """
    from attnx.config import parse_size
    from attnx.trt.build import BuildSettings, build

    settings = BuildSettings(
        fp16=fp16,
        workspace=parse_size(workspace, "--workspace") if workspace is not None else None,
        batch=(min_batch, opt_batch, max_batch),
        seq=(min_seq, opt_seq, max_seq),
        plugins=None if aot is None else ("aot" if aot else "jit"),
    )
    result = build(out, settings, progress=progress_printer(quiet or as_json))
    if as_json:
        echo_json({"engine": str(result.engine), **dataclasses.asdict(result.record)})
    else:
        record = result.record
        plugins = {"aot": "AOT plugins", "jit": "JIT plugins", None: "no plugins"}[record.plugin_mode]
        loading = "needs Python to load" if record.needs_python else "loads without Python"
        click.echo(f"wrote {result.engine} (TensorRT {record.tensorrt}, {record.typing}ly typed, "
                   f"{'fp16' if record.fp16 else 'fp32'}, {plugins}, {loading}, {record.device})")
