"""``attnx triton``: a Triton Inference Server model repository serving an export."""

from __future__ import annotations

import re

import click

from attnx.cli.common import echo_json, json_option, progress_printer
from attnx.limits import MAX_BATCH, MAX_INSTANCES, MAX_NAME

EPILOG = """\b
Examples:
  attnx export --recipe linear-lm --decode -o lm
  attnx triton lm --repo models                       # sequence batching, implicit state
  attnx triton lm --repo models --batching dynamic    # the full model.onnx, dynamic batching
  attnx export --variant softmax -o enc && attnx triton enc --repo models --name encoder --max-batch 16
  attnx triton lm --repo models --instances 4 --force # four concurrent sequences; replace models/lm
  attnx triton lm --repo models --backend python      # Triton's python backend: model.py + ONNX Runtime
  tritonserver --model-repository=models
"""


def check_name(name: str | None) -> str | None:
    """A model name Triton and the filesystem take: letters, digits, '_', '.' and '-', not starting with
    '.' or '-', at most MAX_NAME characters.

    Raises:
        click.BadParameter: naming the rule.
    """
    if name is not None and not re.fullmatch(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}", name):
        raise click.BadParameter(
            f"{name[:40]!r}{'...' if len(name) > 40 else ''} is not a model name: use 1 to {MAX_NAME} "
            "letters, digits, '_', '.' or '-', starting with a letter, digit or '_'"
        )
    return name


@click.command("triton", epilog=EPILOG)
@click.argument("out", type=click.Path())
@click.option("--repo", required=True, type=click.Path(), help="Directory of the model repository to write.")
@click.option(
    "--name",
    default=None,
    callback=lambda ctx, param, value: check_name(value),
    help=f"Model name in the repository (letters, digits, _ . -; at most {MAX_NAME}).  "
    "[default: the model kind, e.g. lm]",
)
@click.option(
    "--batching",
    default="auto",
    show_default=True,
    help="auto (sequence for an lm decode export, else dynamic), dynamic or sequence.",
)
@click.option(
    "--max-batch",
    default=None,
    type=click.IntRange(0, MAX_BATCH),
    help="Dynamic batching's max_batch_size (0: no batching).  [default: 8]",
)
@click.option(
    "--instances",
    default=1,
    show_default=True,
    type=click.IntRange(1, MAX_INSTANCES),
    help="Model instances (instance_group count; each holds a copy of the model).",
)
@click.option(
    "--backend",
    default="onnxruntime",
    show_default=True,
    help="Triton backend: onnxruntime (Triton's own ONNX Runtime) or python (model.py running the export "
    "in ONNX Runtime, in a python environment attnx prepares).",
)
@click.option(
    "--env-cache",
    default=None,
    type=click.Path(),
    help="Where --backend python builds and reuses its python environment.  "
    "[default: ~/.cache/attnx/triton-python]",
)
@click.option("--force", is_flag=True, help="Replace REPO if it is a repository attnx wrote.")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
@json_option
def command(
    out: str,
    repo: str,
    name: str | None,
    batching: str,
    max_batch: int | None,
    instances: int,
    backend: str,
    env_cache: str | None,
    force: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Write a Triton model repository (config.pbtxt + ONNX model) that serves the export OUT.

    An lm decode export (attnx export --decode) is served token by token with sequence
    batching: every state tensor (KV cache or recurrent sums, and the position) is an
    implicit state Triton keeps per sequence. Other exports serve model.onnx with dynamic
    batching. The model is added to the repository DIR (made if missing): an existing model of
    the same name is refused without --force, and --force replaces only that model. Its folder's
    README.md has the tritonserver command and a client request.

    --backend python writes a model for Triton's python backend instead: model.py runs the
    export in ONNX Runtime (a decoder keeps each sequence's state itself), in a python
    environment built once under --env-cache (numpy<2 and onnxruntime; pip needs the package
    index the first time) and named in config.pbtxt.
    """
    from attnx.api import triton

    result = triton(
        out,
        repo,
        name=name,
        max_batch=max_batch,
        batching=batching,
        instances=instances,
        force=force,
        backend=backend,
        env_cache=env_cache,
        progress=progress_printer(quiet or as_json),
    )
    if as_json:
        plan = result.model
        echo_json(
            {
                "repo": str(result.path),
                "model": plan.name,
                "batching": plan.batching,
                "backend": plan.backend,
                "python_env": plan.python_env,
                "max_batch_size": plan.max_batch_size,
                "states": [s.input for s in plan.states],
                "files": list(result.files),
            }
        )
        return
    plan = result.model
    states = f", {len(plan.states)} implicit states" if plan.states else ""
    click.echo(
        f"wrote {result.path}/{plan.name} ({plan.backend} backend, {plan.batching} batching, "
        f"max_batch_size {plan.max_batch_size}"
        f"{states}); serve it with `tritonserver --model-repository={result.path}` "
        f"(see {result.path}/{plan.name}/README.md)"
    )
