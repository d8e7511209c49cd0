"""``attnx optimize``: int8 / fp16 / slimmed / fused copies of an export, with an accuracy report."""

from __future__ import annotations

import sys

import click

from attnx.cli.common import echo_json, json_option, parity_summary, progress_printer
from attnx.limits import MAX_SEED

EPILOG = """\b
Examples:
  attnx optimize out -o out-int8 --int8
  attnx optimize out -o out-fp16 --fp16 --slim
  attnx optimize qwen -o qwen-fused --fuse
  attnx optimize out -o out-int8 --int8 --max-rel-error 0.02 --min-top1 0.95
  attnx verify out-int8 && attnx bench out-int8
"""


@click.command("optimize", epilog=EPILOG)
@click.argument("out", type=click.Path())
@click.option("-o", "--output", "target", required=True, type=click.Path(), help="The new export directory.")
@click.option("--int8", is_flag=True, help="ONNX Runtime dynamic int8 quantisation of the weights.")
@click.option("--fp16", is_flag=True, help="fp16 inside the graphs (inputs and outputs stay float32).")
@click.option("--slim", is_flag=True, help="onnxslim: constant folding, dead code, fusions.")
@click.option(
    "--fuse",
    is_flag=True,
    help="ONNX Runtime's kernels for RMSNorm, residual + RMSNorm and rotary embeddings (onnxscript's "
    "ort_fusions); the graphs then run in ONNX Runtime only.",
)
@click.option("--force", is_flag=True, help="Replace the output directory if it is an attnx export.")
@click.option(
    "--max-rel-error",
    type=float,
    default=None,
    help="Fail (exit 1) when the largest output error exceeds this fraction of the largest output magnitude.",
)
@click.option(
    "--min-top1",
    type=float,
    default=None,
    help="Fail (exit 1) when a language model's next-token top-1 agreement is below this fraction.",
)
@click.option(
    "--seed",
    default=None,
    type=click.IntRange(0, MAX_SEED),
    help="Seed of the random prompts (default: fresh; recorded).",
)
@click.option("--quiet", is_flag=True, help="No progress messages on stderr.")
@json_option
def command(
    out: str,
    target: str,
    int8: bool,
    fp16: bool,
    slim: bool,
    fuse: bool,
    force: bool,
    max_rel_error: float | None,
    min_top1: float | None,
    seed: int | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Write a new export from OUT with int8-quantised (--int8), fp16 (--fp16), slimmed (--slim) and/or
    fused (--fuse) graphs (model.onnx and any decode graphs), then compare it with the float32 torch model
    rebuilt from OUT: the largest output error relative to the largest output magnitude and, for language
    models, the next-token top-1 agreement over random prompts.

    The new manifest records the steps and holds the export to the transformation's error bound (int8
    10%, fp16 1%, slim and fuse 0.01% of the output scale), so `attnx verify` and `attnx bench` work on
    it like on any export. The report is also in accuracy.json. Exit code 0: within every bound and limit (the
    limits here only tighten it); 1: a bound or limit missed (the export is written anyway); 2: bad
    input.
    """
    from attnx.optimizer.optimize import optimize

    result = optimize(
        out,
        target,
        int8=int8,
        fp16=fp16,
        slim=slim,
        fuse=fuse,
        force=force,
        max_rel_error=max_rel_error,
        min_top1=min_top1,
        seed=seed,
        progress=progress_printer(quiet or as_json),
    )
    report = result.report
    if as_json:
        echo_json({"out": str(result.out), "accuracy": report.to_dict(), "parity": result.parity.to_dict()})
    else:
        click.echo(f"wrote {result.out} ({' + '.join(report.steps)}; error bound {report.error_bound:g})")
        for row in report.outputs:
            click.echo(
                f"  {row.output}: max abs err {row.max_abs:.3g}, relative to max |output| {row.scale:.3g}: "
                f"{row.rel:.3g}"
            )
        if report.top1 is not None:
            click.echo(f"  next-token top-1 agreement: {report.top1:.1%} of {report.tokens} positions")
        click.echo(f"  over {report.prompts} random prompts (seed {report.seed})")
        for failure in report.failures():
            click.echo(f"FAILED: {failure}")
        click.echo(parity_summary(result.parity))
    if not result.passed:
        sys.exit(1)
