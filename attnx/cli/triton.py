"""``attnx triton``: a Triton Inference Server model repository serving an export."""

from __future__ import annotations

import click

from attnx.cli.common import echo_json, json_option, progress_printer

EPILOG = """\b
Examples:
  attnx export --recipe linear-lm --decode -o lm
  attnx triton lm --repo models                       # sequence batching, implicit state
  attnx triton lm --repo models --batching dynamic    # the full model.onnx, dynamic batching
  attnx export --variant softmax -o enc && attnx triton enc --repo models --name encoder --max-batch 16
  attnx triton lm --repo models --instances 4 --force # four concurrent sequences; replace models/
  attnx triton lm --repo models --backend python      # Triton's python backend: model.py + ONNX Runtime
  tritonserver --model-repository=models
"""


@click.command("triton", epilog=EPILOG)
@click.argument("out", type=click.Path())
@click.option("--repo", required=True, type=click.Path(), help="Directory of the model repository to write.")
@click.option(
    "--name", default=None, help="Model name in the repository.  [default: the model kind, e.g. lm]"
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
    type=int,
    help="Dynamic batching's max_batch_size (0: no batching).  [default: 8]",
)
@click.option(
    "--instances", default=1, show_default=True, type=int, help="Model instances (instance_group count)."
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
    batching. The repository's README.md has the tritonserver command and a client request.

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
        f"(see {result.path}/README.md)"
    )
