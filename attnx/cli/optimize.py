"""``attnx optimize``: int4 / int8 / fp16 / slimmed / fused copies of an export, gated on its accuracy."""

from __future__ import annotations

import sys

import click

from attnx.cli.common import echo_json, json_option, parity_summary, progress_printer
from attnx.limits import MAX_SEED
from attnx.optimizer.settings import (
    ALGORITHMS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DECODE_TOKENS,
    DEFAULT_SEED,
    TEXT_BOUNDS,
)

EPILOG = """\b
Examples:
  attnx optimize out -o out-int4 --int4
  attnx optimize out -o out-int8 --int8
  attnx optimize qwen -o qwen-int4 --int4 --layers recurrent=int8 --layers head=fp32
  attnx optimize qwen -o qwen-int4 --int4 --algorithm hqq --block-size 64 --max-kl 0.02
  attnx optimize out -o out-fp16 --fp16 --slim
  attnx optimize qwen -o qwen-fused --fuse --int4
  attnx verify out-int4 && attnx bench out-int4
"""


def _layers(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """``KIND=PRECISION`` pairs as a dict."""
    layers = {}
    for value in values:
        kind, sep, precision = value.partition("=")
        if not sep:
            raise click.BadParameter(f"{value!r} is not KIND=PRECISION (e.g. recurrent=int8)")
        layers[kind.strip()] = precision.strip()
    return layers


def _per_step(bound: int) -> str:
    """The text gate's default ``bound`` (0: KL, 1: top-1) of each step, for the help."""
    return ", ".join(f"{step} {bounds[bound]:g}" for step, bounds in TEXT_BOUNDS.items())


@click.command("optimize", epilog=EPILOG)
@click.argument("out", type=click.Path())
@click.option("-o", "--output", "target", required=True, type=click.Path(), help="The new export directory.")
@click.option("--int4", is_flag=True, help="Weight-only int4 blocks (ONNX Runtime's MatMulNBits).")
@click.option("--int8", is_flag=True, help="Weight-only int8 blocks (MatMulNBits); activations stay float32.")
@click.option(
    "--dynamic-int8",
    is_flag=True,
    help="ONNX Runtime's dynamic int8 quantisation of weights and activations (MatMulInteger).",
)
@click.option("--fp16", is_flag=True, help="fp16 inside the graphs (inputs and outputs stay float32).")
@click.option("--slim", is_flag=True, help="onnxslim: constant folding, dead code, fusions.")
@click.option(
    "--fuse",
    is_flag=True,
    help="ONNX Runtime's kernels for RMSNorm, residual + RMSNorm and rotary embeddings (onnxscript's "
    "ort_fusions); the graphs then run in ONNX Runtime only.",
)
@click.option(
    "--layers",
    multiple=True,
    callback=_layers,
    metavar="KIND=PRECISION",
    help="Precision of one layer kind under --int4/--int8: attention, recurrent, mlp or head = int4, "
    "int8 or fp32 (repeatable). Decay and gate projections always stay fp32.",
)
@click.option(
    "--block-size",
    type=int,
    default=DEFAULT_BLOCK_SIZE,
    show_default=True,
    help="Weights per quantisation block (16, 32, 64, 128 or 256).",
)
@click.option("--asymmetric", is_flag=True, help="Blocks with zero points (default: symmetric, none).")
@click.option(
    "--accuracy-level",
    type=int,
    default=None,
    help="MatMulNBits' compute: 0 float32, 4 int8 activations (default: 4 for int4, 0 for int8).",
)
@click.option(
    "--algorithm",
    type=click.Choice(ALGORITHMS),
    default="rtn",
    show_default=True,
    help="How quantised values are chosen: round to nearest, or HQQ (int4 only; slower, closer).",
)
@click.option("--force", is_flag=True, help="Replace the output directory if it is an attnx export.")
@click.option(
    "--max-kl",
    type=float,
    default=None,
    help=f"A language model's gate: largest mean KL divergence (nats/token) on the text (default per step: "
    f"{_per_step(0)}).",
)
@click.option(
    "--min-top1",
    type=float,
    default=None,
    help=f"A language model's gate: smallest next-token top-1 agreement on the text (default per step: "
    f"{_per_step(1)}).",
)
@click.option(
    "--text",
    type=click.Path(dir_okay=False),
    default=None,
    help="UTF-8 text the language-model gate reads (default: CPython's documentation, pydoc_data).",
)
@click.option(
    "--decode-tokens",
    type=click.IntRange(min=0),
    default=DEFAULT_DECODE_TOKENS,
    show_default=True,
    help="Greedy steps a decode export takes beside its float32 source (0: none); after --fp16, --slim "
    "or --fuse its tokens must stay the float32 ones up to a tie.",
)
@click.option(
    "--max-rel-error",
    type=float,
    default=None,
    help="Also fail (exit 1) when the largest output error on random prompts exceeds this fraction of the "
    "largest output magnitude.",
)
@click.option(
    "--seed",
    default=DEFAULT_SEED,
    show_default=True,
    type=click.IntRange(0, MAX_SEED),
    help="Seed of the random prompts.",
)
@click.option("--quiet", is_flag=True, help="No progress messages on stderr.")
@json_option
def command(
    out: str,
    target: str,
    int4: bool,
    int8: bool,
    dynamic_int8: bool,
    fp16: bool,
    slim: bool,
    fuse: bool,
    layers: dict[str, str],
    block_size: int,
    asymmetric: bool,
    accuracy_level: int | None,
    algorithm: str,
    force: bool,
    max_kl: float | None,
    min_top1: float | None,
    text: str | None,
    decode_tokens: int,
    max_rel_error: float | None,
    seed: int,
    quiet: bool,
    as_json: bool,
) -> None:
    """Write a new export from OUT with weight-only int4/int8 (--int4, --int8), dynamic int8
    (--dynamic-int8), fp16 (--fp16), slimmed (--slim) and/or fused (--fuse) graphs (model.onnx and any
    decode graphs), then compare it with the float32 torch model rebuilt from OUT.

    A language model is gated on text, the same every run: the mean KL divergence of its next-token
    distributions from the float32 model's and their top-1 agreement over 2048 tokens, with both
    perplexities reported. Other models are gated on their largest output error relative to the
    largest output magnitude over random prompts (int8 5%, int4 50%, fp16 1%, slim and fuse 0.01%).

    The new manifest records the steps, and its tolerance is the step's relative error bound, so
    `attnx verify` and `attnx bench` work on it like on any export. The report is also in accuracy.json.
    Exit code 0: within every bound; 1: a bound missed (the export is written anyway); 2: bad input.
    """
    from attnx.optimizer.optimize import optimize

    result = optimize(
        out,
        target,
        int4=int4,
        int8=int8,
        dynamic_int8=dynamic_int8,
        fp16=fp16,
        slim=slim,
        fuse=fuse,
        layers=layers,
        block_size=block_size,
        symmetric=not asymmetric,
        accuracy_level=accuracy_level,
        algorithm=algorithm,
        force=force,
        max_rel_error=max_rel_error,
        max_kl=max_kl,
        min_top1=min_top1,
        text=text,
        decode_tokens=decode_tokens,
        seed=seed,
        progress=progress_printer(quiet or as_json),
    )
    report = result.report
    if as_json:
        echo_json({"out": str(result.out), "accuracy": report.to_dict(), "parity": result.parity.to_dict()})
    else:
        click.echo(f"wrote {result.out} ({' + '.join(report.steps)})")
        text_quality = report.text
        if text_quality is not None:
            click.echo(
                f"  on {text_quality.tokens} tokens of {text_quality.text} ({text_quality.tokenizer}): "
                f"KL {text_quality.kl:.3g} nats/token (gate {report.max_kl:g}), top-1 agreement "
                f"{text_quality.top1:.1%} (gate {report.min_top1:g}), perplexity "
                f"{text_quality.perplexity:.4g} (float32 {text_quality.reference_perplexity:.4g})"
            )
        decode = report.decode
        if decode is not None:
            step, gap = decode.first_difference, decode.gap
            where = "never" if step is None else f"first at step {step}"
            tie = "" if gap is None else f" (float32 top two {gap:.3g} apart{': a tie' * bool(decode.tie)})"
            click.echo(
                f"  greedy decode of {decode.tokens} tokens beside float32: KL {decode.mean_kl:.3g} mean, "
                f"{decode.max_kl:.3g} max; next token differs {where}{tie}, same at "
                f"{decode.agreement:.1%} of steps"
            )
        for row in report.outputs:
            click.echo(
                f"  {row.output}: max abs err {row.max_abs:.3g}, relative to max |output| {row.scale:.3g}: "
                f"{row.rel:.3g} (bound {report.error_bound:g})"
            )
        click.echo(f"  over {report.prompts} random prompts (seed {report.seed})")
        for failure in report.failures():
            click.echo(f"FAILED: {failure}")
        click.echo(parity_summary(result.parity))
    if not result.passed:
        sys.exit(1)
