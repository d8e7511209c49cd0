"""``attnx verify``: re-check an export's parity in a fresh process."""

from __future__ import annotations

import sys

import click

from attnx.cli.common import (
    echo_json,
    json_option,
    parity_summary,
    parse_int_list,
    parse_name_list,
    print_parity,
    tolerance_options,
)
from attnx.limits import MAX_SEED

EPILOG = """\b
Examples:
  attnx verify out
  attnx verify out --seq-lens 1,17,256 --atol 1e-3
  attnx verify out --backends ort-cpu,ort-cuda,trt --json
"""


@click.command("verify", epilog=EPILOG)
@click.argument("out", type=click.Path())
@click.option(
    "--backends",
    default="ort-cpu",
    show_default=True,
    help="Comma-separated: torch-compile, ort-cpu, ort-cuda, ort-trt, trt (compared with torch eager; "
    "unavailable ones are skipped with the reason).",
)
@tolerance_options
@click.option("--batch", default=2, show_default=True, type=int, help="Batch size of the random inputs.")
@click.option(
    "--seed",
    default=None,
    type=click.IntRange(0, MAX_SEED),
    help="Seed of the random inputs (default: fresh; recorded).",
)
@click.option(
    "--write/--no-write", default=True, show_default=True, help="Record the report in OUT/parity.json."
)
@json_option
def command(
    out: str,
    backends: str,
    seq_lens: str | None,
    atol: float | None,
    rtol: float | None,
    batch: int,
    seed: int | None,
    write: bool,
    as_json: bool,
) -> None:
    """Compare the torch model with OUT/model.onnx on fresh random inputs (Polygraphy).

    The torch model is rebuilt from OUT/attnx.json and OUT/weights.safetensors. Writes
    OUT/parity.json. Exit code 0: parity holds; 1: a mismatch; 2: bad input.
    """
    from attnx.api import verify

    report = verify(
        out,
        backends=parse_name_list(backends),
        seq_lens=parse_int_list(seq_lens, "--seq-lens"),
        batch=batch,
        atol=atol,
        rtol=rtol,
        seed=seed,
        write=write,
    )
    if as_json:
        echo_json(report.to_dict())
    else:
        print_parity(report)
        click.echo(parity_summary(report))
    if not report.passed:
        sys.exit(1)
