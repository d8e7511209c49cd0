"""``attnx export``: build a model around a variant (or from a recipe), export to ONNX, verify parity."""

from __future__ import annotations

import json
import sys
from typing import Any

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
  attnx export --recipe transformer-base -o wmt-base
  attnx export --recipe tiny-seq2seq --cross-variant linear --set export.opset=19 -o s2s
  attnx export --recipe tiny-lm --checkpoint lm.safetensors --save-checkpoint copy.pt -o lm
  attnx export --recipe linear-lm --decode -o lm-decode
  attnx export --variant linear --model lm --dtype fp16 -o lm-fp16
  attnx export --recipe tiny-lm --decode --tokenizer tokenizer.json -o chat   # + genai, text in/out
  attnx export --variant myplugin --model lm --target ort -o fused     # ONNX Runtime's own kernels
  attnx export --module mymodels.py:linear_lm --decode -o my-lm     # any nn.Module (docs/importing.md)
  attnx export --from hf:saved-lfm2 --decode --state-names transformers.js -o lfm2-web  # + transformers.js
"""

# The flags that describe a registered model, which --module and --from do not take.
MODEL_FLAGS = ("--recipe", "--variant", "--model", "--cross-variant", "--checkpoint", "--save-checkpoint")


@click.command("export", epilog=EPILOG)
@click.option(
    "--recipe",
    "-r",
    default=None,
    metavar="NAME|PATH",
    help="Start from a recipe (see `attnx list`); the options below override it.",
)
@click.option(
    "--variant", "-v", default=None, help="Attention variant (see `attnx list`).  [default: softmax]"
)
@click.option(
    "--model", "-m", default=None, help="Model architecture: encoder, lm, seq2seq.  [default: encoder]"
)
@click.option("--cross-variant", default=None, help="Variant of seq2seq cross-attention.  [default: softmax]")
@click.option(
    "--module",
    "entry",
    default=None,
    metavar="PKG.MOD:FACTORY",
    help="Export the nn.Module that FACTORY() returns with its example inputs, adapters applied "
    "(instead of --variant/--model; see docs/importing.md).",
)
@click.option(
    "--from",
    "source",
    default=None,
    metavar="SCHEME:DIR",
    help="Export a library's saved model through the adapter that loads SCHEME (see `attnx list`).",
)
@click.option("--out", "-o", default="out", show_default=True, type=click.Path(), help="Output directory.")
@click.option("--lowering", "-l", default=None, help="function | decomposed | plugin.  [default: function]")
@click.option(
    "--target",
    default=None,
    help="portable | ort: bodies of standard ONNX ops, or of ONNX Runtime's own kernels (com.microsoft) for "
    "the ops that declare them (see `attnx list`).  [default: portable]",
)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Model or variant option (repeatable); prefix model./variant./cross. if ambiguous, "
    "export./verify./bench. for recipe settings.",
)
@click.option(
    "--opset",
    default=None,
    type=int,
    help="ONNX opset (18-27; 23+: softmax on the standard Attention op, needs onnxruntime >= 1.23; 27: "
    "linear and gated layers on the standard LinearAttention op, needs onnxruntime >= 1.32).  "
    "[default: 18]",
)
@click.option(
    "--dtype",
    default=None,
    help="fp32 | fp16: weights and activations; fp16 is checked against torch in fp16.  [default: fp32]",
)
@click.option(
    "--seed", default=None, type=int, help="Seed of the deterministic initialisation.  [default: 0]"
)
@click.option(
    "--checkpoint",
    default=None,
    type=click.Path(),
    metavar="FILE",
    help="Export these weights (.safetensors, or a PyTorch state dict loaded with weights_only).",
)
@click.option(
    "--save-checkpoint",
    default=None,
    type=click.Path(),
    metavar="FILE",
    help="Also save the exported weights (.safetensors, or .pt for a PyTorch state dict).",
)
@click.option(
    "--decode",
    is_flag=True,
    help="Also export prefill.onnx + decode.onnx (KV cache or recurrent state) for generation "
    "(an lm also gets genai.onnx + genai_config.json for onnxruntime-genai).",
)
@click.option(
    "--state-names",
    "state_names",
    multiple=True,
    type=click.Choice(["genai", "transformers.js"]),
    help="With --decode, the runtimes whose decoder an lm gets, under their state names (repeatable): "
    "genai (genai.onnx), transformers.js (transformers-js.onnx + config.json; Hugging Face models).  "
    "[default: genai]",
)
@click.option(
    "--tokenizer",
    default=None,
    type=click.Path(),
    metavar="FILE",
    help="A Hugging Face tokenizer.json to ship with the export (attnx generate --prompt TEXT).",
)
@click.option("--verify/--no-verify", default=None, help="Check parity torch vs ORT.  [default: verify]")
@tolerance_options
@click.option(
    "--force",
    is_flag=True,
    help="Replace OUT if it is an earlier export (has attnx.json) or empty, and the --save-checkpoint file.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
@json_option
def command(
    recipe: str | None,
    variant: str | None,
    model: str | None,
    cross_variant: str | None,
    entry: str | None,
    source: str | None,
    out: str,
    lowering: str | None,
    target: str | None,
    assignments: tuple[str, ...],
    opset: int | None,
    dtype: str | None,
    seed: int | None,
    checkpoint: str | None,
    save_checkpoint: str | None,
    decode: bool,
    state_names: tuple[str, ...],
    tokenizer: str | None,
    verify: bool | None,
    seq_lens: str | None,
    atol: float | None,
    rtol: float | None,
    force: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Export MODEL built around VARIANT attention to OUT/model.onnx (+ attnx.json manifest).

    The export is atomic: on any error OUT is left untouched. With --verify (default)
    the model is compared with its torch original by Polygraphy at several sequence
    lengths, and OUT/parity.json records the result; a mismatch exits with code 1.
    """
    from attnx.api import export

    lengths = parse_int_list(seq_lens, "--seq-lens")
    flags = (
        lowering,
        target,
        opset,
        dtype,
        seed,
        decode,
        state_names,
        tokenizer,
        verify,
        lengths,
        atol,
        rtol,
    )
    options = _options(assignments, *flags)
    progress = progress_printer(quiet or as_json)
    if entry is not None or source is not None:
        given = (recipe, variant, model, cross_variant, checkpoint, save_checkpoint)
        model_flags = dict(zip(MODEL_FLAGS, given, strict=True))
        result = _export_module(entry, source, model_flags, out, options, force, progress)
    else:
        result = export(
            variant,
            out,
            model=model,
            recipe=recipe,
            cross_variant=cross_variant,
            options=options,
            force=force,
            checkpoint=checkpoint,
            save_checkpoint=save_checkpoint,
            progress=progress,
        )
    show(result, save_checkpoint, as_json)
    if result.parity and not result.parity.passed:
        sys.exit(1)


def _options(
    assignments: tuple[str, ...],
    lowering: str | None,
    target: str | None,
    opset: int | None,
    dtype: str | None,
    seed: int | None,
    decode: bool,
    state_names: tuple[str, ...],
    tokenizer: str | None,
    verify: bool | None,
    seq_lens: list[int] | None,
    atol: float | None,
    rtol: float | None,
) -> dict[str, Any]:
    """The ``--set`` assignments, then the flags given (a flag wins)."""
    flags = {
        "export.lowering": lowering,
        "export.target": target,
        "export.opset": opset,
        "export.dtype": dtype,
        "export.seed": seed,
        "export.decode": decode or None,
        "export.state_names": list(state_names) or None,
        "export.tokenizer": tokenizer,
        "verify.enabled": verify,
        "verify.seq_lens": seq_lens,
        "verify.atol": atol,
        "verify.rtol": rtol,
    }
    return {**parse_assignments(assignments), **{k: v for k, v in flags.items() if v is not None}}


def _export_module(
    entry: str | None,
    source: str | None,
    model_flags: dict[str, Any],
    out: str,
    options: dict[str, Any],
    force: bool,
    progress: Any,
) -> Any:
    """Export the module ``--module ENTRY`` or ``--from SOURCE`` names, as it is.

    Raises:
        AttnxError: both given, or a flag that describes a registered model given with them.
    """
    from attnx.api import export_module
    from attnx.errors import AttnxError
    from attnx.exporter.module import from_entry, from_source

    if entry is not None and source is not None:
        raise AttnxError("--module and --from both name what to export; give one")
    clashes = [flag for flag, value in model_flags.items() if value is not None]
    if clashes:
        raise AttnxError(
            f"{'--module' if entry else '--from'} exports a module as it is; drop {', '.join(clashes)}"
        )
    given = from_entry(entry) if entry is not None else from_source(source)
    if given.tokenizer is not None:  # a tokenizer saved beside the model travels with the export
        options.setdefault("export.tokenizer", str(given.tokenizer))
    return export_module(
        given.module,
        given.example,
        out,
        dynamic_axes=given.dynamic_axes,
        options=options,
        force=force,
        entry=given.entry,
        notes=given.notes,
        progress=progress,
    )


def show(result: Any, save_checkpoint: str | None, as_json: bool) -> None:
    """The export's result as JSON, or in lines for a person."""
    if as_json:
        echo_json(
            {
                "out": str(result.out),
                "manifest": json.loads(result.manifest.to_json()),
                "attnx_nodes": result.attnx_nodes,
                "parity": result.parity.to_dict() if result.parity else None,
            }
        )
    else:
        report(result, save_checkpoint)


def report(result: Any, save_checkpoint: str | None) -> None:
    """What the export wrote, then its parity, in lines for a person."""
    manifest = result.manifest
    click.echo(
        f"wrote {result.out}/model.onnx ({describe_source(manifest)}, {manifest.dtype}, "
        f"{manifest.lowering} lowering, {result.attnx_nodes} attnx nodes, opset {manifest.opset})"
    )
    if manifest.target:
        lowered = ", ".join(manifest.target.ops)
        click.echo(f"target {manifest.target.name}: {lowered} on {manifest.target.runtime}'s own kernels")
    if manifest.decode:
        click.echo(
            f"wrote {result.out}/prefill.onnx and {result.out}/decode.onnx ({manifest.decode.summary()}, "
            f"{len(manifest.decode.state)} tensors; run `attnx generate {result.out} --prompt-ids 1,2,3`)"
        )
    if manifest.genai:
        click.echo(
            f"wrote {result.out}/genai.onnx + genai_config.json (onnxruntime_genai.Model('{result.out}'))"
        )
    if manifest.transformers_js:
        click.echo(
            f"wrote {result.out}/transformers-js.onnx + config.json (transformers.js: AutoModelForCausalLM"
            f".from_pretrained('{result.out}', {{subfolder: '', model_file_name: 'transformers-js'}}))"
        )
    if manifest.tokenizer:
        click.echo(f"wrote {result.out}/tokenizer.json ({manifest.tokenizer.vocab_size} tokens)")
    for note in manifest.module.notes if manifest.module else ():
        click.echo(f"note: {note}")
    if save_checkpoint:
        click.echo(f"saved weights to {save_checkpoint}")
    if result.parity:
        print_parity(result.parity)
        click.echo(parity_summary(result.parity))


def describe_source(manifest: Any) -> str:
    """ "recipe r, lm with linear attention" or "module pkg.M through adapters a (linear attention)"."""
    section = manifest.module
    if section is not None:
        through = f" through adapter {', '.join(section.adapters)}" if section.adapters else ""
        return f"module {section.module_class}{through} ({', '.join(section.variants)} attention)"
    recipe = f"recipe {manifest.recipe}, " if manifest.recipe else ""
    return f"{recipe}{manifest.model} with {manifest.variant} attention"
