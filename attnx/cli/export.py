"""``attnx export``: build a model around a variant, export to ONNX, verify parity."""

from __future__ import annotations

import sys

import click

from attnx.cli.common import (
    echo_json,
    json_option,
    parity_summary,
    parse_int_list,
    print_parity,
    progress_printer,
    tolerance_options,
)
from attnx.config import parse_assignments

EPILOG = """\b
Examples:
  attnx export --variant softmax -o out
  attnx export --variant linear --lowering decomposed --set d_model=512 --set n_layers=6 -o linear-enc
  attnx export --variant reformer --set n_hashes=4 --lowering plugin -o reformer-trt --force
"""


@click.command("export", epilog=EPILOG)
@click.option("--variant", "-v", default="softmax", show_default=True, help="Attention variant (see `attnx list`).")
@click.option("--model", "-m", default="encoder", show_default=True, help="Model architecture.")
@click.option("--out", "-o", default="out", show_default=True, type=click.Path(), help="Output directory.")
@click.option("--lowering", "-l", default="function", show_default=True, help="function | decomposed | plugin.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="Model or variant option (repeatable); prefix model./variant. if both have the key.")
@click.option("--opset", default=18, show_default=True, type=int, help="ONNX opset (18-21).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the deterministic initialisation.")
@click.option("--verify/--no-verify", default=True, show_default=True, help="Check parity torch vs ORT.")
@tolerance_options
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
@json_option
def command(variant: str, model: str, out: str, lowering: str, assignments: tuple[str, ...], opset: int,
            seed: int, verify: bool, seq_lens: str | None, atol: float | None, rtol: float | None,
            force: bool, quiet: bool, as_json: bool) -> None:
    """Export MODEL built around VARIANT attention to OUT/model.onnx (+ attnx.json manifest).

    The export is atomic: on any error OUT is left untouched. With --verify (default)
    the model is compared with its torch original by Polygraphy at several sequence
    lengths, and OUT/parity.json records the result; a mismatch exits with code 1.
    """
    from attnx.exporter.export import export

    result = export(
        variant,
        out,
        model=model,
        lowering=lowering,
        options=parse_assignments(assignments),
        seed=seed,
        opset=opset,
        verify=verify,
        force=force,
        seq_lens=parse_int_list(seq_lens, "--seq-lens"),
        atol=atol,
        rtol=rtol,
        progress=progress_printer(quiet or as_json),
    )
    if as_json:
        echo_json({"out": str(result.out), "manifest": result.manifest.__dict__, "attnx_nodes": result.attnx_nodes,
                   "parity": result.parity.to_dict() if result.parity else None})
    else:
        click.echo(f"wrote {result.out}/model.onnx ({result.manifest.lowering} lowering, "
                   f"{result.attnx_nodes} attnx nodes, opset {result.manifest.opset})")
        if result.parity:
            print_parity(result.parity)
            click.echo(parity_summary(result.parity))
    if result.parity and not result.parity.passed:
        sys.exit(1)
