"""``attnx generate``: continue a prompt of token ids with a decode export (ONNX Runtime or torch)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from attnx.cli.common import echo_json, json_option, progress_printer
from attnx.errors import AttnxError
from attnx.limits import MAX_NEW_TOKENS, MAX_SEED, MAX_THREADS

EPILOG = """\b
Examples:
  attnx export --recipe linear-lm --decode -o out
  attnx generate out --prompt-ids 1,2,3 --max-new-tokens 64
  attnx generate out --prompt-file prompt.txt --temperature 0.8 --top-k 20 --seed 7
  attnx generate out --prompt-ids 5 --backend torch --greedy --json
  attnx generate s2s-out --source-ids 4,8,15,16,23,42 --prompt-ids 0 -n 20
  attnx generate chat --prompt "once upon a time" -n 20     # an export with --tokenizer
"""


def parse_ids(text: str, what: str) -> list[int]:
    """ "1, 2 3" -> [1, 2, 3] (commas and/or whitespace between ids)."""
    parts = [part for part in re.split(r"[\s,]+", text.strip()) if part]
    try:
        return [int(part) for part in parts]
    except ValueError:
        bad = next(p for p in parts if not re.fullmatch(r"[+-]?\d+", p))
        message = f"{what} must hold integer token ids, comma- or space-separated (got '{bad}')"
        raise AttnxError(message) from None


def read_prompt(name: str) -> str:
    """The text of a ``--prompt-file``; one-line errors for a missing, unreadable or non-UTF-8 file."""
    path = Path(name)
    if not path.is_file():
        raise AttnxError(f"prompt file '{name}' does not exist")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AttnxError(
            f"prompt file '{name}' is not UTF-8 text (bad byte at offset {exc.start}); "
            "it should hold token ids"
        ) from None
    except OSError as exc:
        raise AttnxError(f"cannot read prompt file '{name}': {exc.strerror or exc}") from None


@click.command("generate", epilog=EPILOG)
@click.argument("out", type=click.Path())
@click.option("--prompt-ids", default=None, metavar="ID,ID,...", help="Prompt token ids, comma-separated.")
@click.option(
    "--prompt-file",
    default=None,
    type=click.Path(),
    metavar="FILE",
    help="Read the prompt ids from FILE (separated by whitespace or commas).",
)
@click.option("--prompt", default=None, metavar="TEXT", help="Prompt text (exports made with --tokenizer).")
@click.option(
    "--source-ids", default=None, metavar="ID,ID,...", help="seq2seq exports: the source token ids."
)
@click.option(
    "--max-new-tokens",
    "-n",
    default=32,
    show_default=True,
    type=click.IntRange(1, MAX_NEW_TOKENS),
    help="Tokens to generate.",
)
@click.option(
    "--backend",
    default="ort-cpu",
    show_default=True,
    help="Runtime of the prefill/decode graphs: ort-cpu, ort-cuda or torch (the rebuilt model).",
)
@click.option("--greedy", is_flag=True, help="Pick the likeliest token (default without --temperature).")
@click.option("--temperature", default=None, type=float, help="Sample from softmax(logits / T).")
@click.option("--top-k", default=0, show_default=True, type=int, help="Sample from the K likeliest.")
@click.option(
    "--seed", default=0, show_default=True, type=click.IntRange(0, MAX_SEED), help="Seed of the sampler."
)
@click.option(
    "--threads",
    default=None,
    type=click.IntRange(1, MAX_THREADS),
    help="ONNX Runtime intra-op threads (default: all cores).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
@json_option
def command(
    out: str,
    prompt_ids: str | None,
    prompt_file: str | None,
    prompt: str | None,
    source_ids: str | None,
    max_new_tokens: int,
    backend: str,
    greedy: bool,
    temperature: float | None,
    top_k: int,
    seed: int,
    threads: int | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Generate token ids after a prompt with OUT's prefill.onnx and decode.onnx.

    OUT is an `attnx export --decode` directory. Ids in, ids out: the new ids are printed
    on one line, then the speed; with --prompt (an export with a tokenizer) text in, text
    out. Progress goes to stderr. A seq2seq export also needs the source (--source-ids);
    the prompt then starts the target.
    """
    if sum(given is not None for given in (prompt_ids, prompt_file, prompt)) != 1:
        raise AttnxError("give the prompt with exactly one of --prompt-ids, --prompt-file or --prompt")
    if greedy and (temperature is not None or top_k):
        raise AttnxError("--greedy picks the argmax; drop it to sample with --temperature/--top-k")
    if top_k and temperature is None:
        temperature = 1.0
    if prompt_file is not None:
        ids = parse_ids(read_prompt(prompt_file), f"prompt file '{prompt_file}'")
    elif prompt is not None:
        from attnx.serve.tokenizer import encode, export_tokenizer

        tokenizer = export_tokenizer(out)
        ids = encode(tokenizer, prompt)
    else:
        ids = parse_ids(prompt_ids or "", "--prompt-ids")

    from attnx.decode.generate import generate

    result = generate(
        out,
        ids,
        max_new_tokens,
        source_ids=None if source_ids is None else parse_ids(source_ids, "--source-ids"),
        backend=backend,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
        threads=threads,
        progress=progress_printer(quiet or as_json),
    )
    text = None if prompt is None else tokenizer.decode(result.tokens)
    if as_json:
        echo_json({**result.to_dict(), **({"text": text} if text is not None else {})})
        return
    click.echo(text if text is not None else ",".join(str(t) for t in result.tokens))
    per_token = result.decode_ms_per_token
    decode = f"; decode {per_token:.2f} ms/token" if per_token is not None else ""
    click.echo(
        f"{len(result.tokens)} tokens in {result.seconds:.3f} s: {result.tokens_per_second:.1f} tokens/s "
        f"(prefill {len(result.prompt)} tokens {1000 * result.prefill_seconds:.1f} ms{decode}) on {backend}"
    )
