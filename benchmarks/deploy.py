"""The precisions people ship, side by side on the same weights: attnx's fp32 export and its ``attnx optimize
--int8`` / ``--int4`` copies against onnxruntime-genai's model builder at fp32 and int4 (``-p int4 -e cpu``).

The weights: a Qwen3.5 text directory (``--model``; default the trained width-64 test hybrid of
``attnx.testing.hf_hybrid``, made once). The builder reads them from a ``Qwen3_5ForConditionalGeneration``
checkpoint of the same weights (``hf_hybrid.conditional_checkpoint``). Per contender, one at a time:

* build wall time (attnx: the CLI, default verify; the builder: its own run);
* deploy bytes: the genai graph's file and every byte of external data it points into (attnx keeps its
  float32 reference weights beside the graphs for ``attnx verify``; those a graph does not read are not
  counted), and the bytes of the whole output directory;
* on the text of ``attnx optimize``'s gate (``attnx.optimizer.text``: the model's tokenizer, 2048 tokens in
  rows of 256), against Hugging Face's own float32 forward: mean KL of the next-token distributions, top-1
  agreement, perplexity (attnx: ``model.onnx``; the builder: its stateful ``model.onnx`` from an empty
  state);
* decode ms/token in onnxruntime-genai after a ``--context``-token prompt (``hf_hybrid.genai_speed``;
  the lowest of ``--rounds`` timings, interleaved over the contenders).

    python benchmarks/deploy.py --work /tmp/deploy --json deploy.json
    python benchmarks/deploy.py --model /path/to/qwen3_5-text --work /tmp/deploy-08b --context 256
    python benchmarks/deploy.py --model DIR --work W --target ort --fuse --speed-only --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from hf_hybrid import build_with_genai, conditional_checkpoint, genai_speed  # noqa: E402
from scale import feed, head_dim_of, session_of  # noqa: E402

from attnx.optimizer.text import WINDOW, TokenComparison, read_text, text_ids  # noqa: E402
from attnx.testing import hf_hybrid  # noqa: E402

CONTENDERS = ("attnx-fp32", "attnx-int8", "attnx-int4", "builder-fp32", "builder-int4")


def text_rows(model_dir: Path) -> tuple[np.ndarray, str]:
    """The gate's text as rows of :data:`WINDOW` ids, tokenised as ``attnx optimize`` does."""
    tokenizer = model_dir / "tokenizer.json"
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    ids, how = text_ids(read_text(), tokenizer if tokenizer.is_file() else None, vocab)
    rows = len(ids) // WINDOW
    return np.asarray(ids[: rows * WINDOW], dtype=np.int64).reshape(rows, WINDOW), how


def hf_logits(model_dir: Path, rows: np.ndarray) -> list[np.ndarray]:
    """Hugging Face's own float32 forward on each row (its pure-torch delta rule)."""
    import torch
    import transformers

    hf_hybrid.pure_torch_gated_delta()
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [
            model(input_ids=torch.from_numpy(row[None]), use_cache=False).logits[0].numpy() for row in rows
        ]


def build(contender: str, model_dir: Path, work: Path, args: argparse.Namespace) -> tuple[Path, float]:
    """Make ``contender``'s output under ``work`` (reused when present); its directory and build seconds.
    attnx's exports take ``args.target`` (``--target``), its optimised copies ``args.fuse`` (``--fuse``)."""
    out = work / contender
    tool, precision = contender.split("-")
    if (out / "genai_config.json").is_file():
        return out, float("nan")
    start = time.perf_counter()
    if tool == "builder":
        checkpoint = work / "conditional"
        if not (checkpoint / "config.json").is_file():
            conditional_checkpoint(model_dir, checkpoint)
        return out, build_with_genai(checkpoint, out, precision)
    source = work / "attnx-fp32"
    if precision == "fp32":
        command = ["export", "--from", f"hf:{model_dir}", "--decode", "-o", str(out)]
        command += ["--target", args.target] if args.target else []
    else:
        build("attnx-fp32", model_dir, work, args)
        start = time.perf_counter()
        command = ["optimize", str(source), "-o", str(out), f"--{precision}"] + (
            ["--fuse"] if args.fuse else []
        )
    done = subprocess.run(
        [sys.executable, "-m", "attnx", *command, "--quiet"], capture_output=True, text=True
    )
    if done.returncode not in (0, 1):  # 1: written, a gate missed (the table shows by how much)
        raise SystemExit(f"attnx {command[0]} failed: {done.stderr.strip()[-300:]}")
    return out, time.perf_counter() - start


def deploy_bytes(out: Path) -> int:
    """The genai graph's bytes plus every distinct span of external data it points into."""
    import onnx

    config = json.loads((out / "genai_config.json").read_text())
    graph = out / config["model"]["decoder"]["filename"]
    model = onnx.load(str(graph), load_external_data=False)
    spans = set()
    for tensor in model.graph.initializer:
        info = {entry.key: entry.value for entry in tensor.external_data}
        if "location" in info:
            spans.add((info["location"], int(info.get("offset", 0)), int(info.get("length", 0))))
    external = sum(length for _, _, length in spans)
    whole_files = {location for location, _, length in spans if length == 0}
    return graph.stat().st_size + external + sum((out / name).stat().st_size for name in whole_files)


def quality(
    out: Path, model_dir: Path, rows: np.ndarray, reference: list[np.ndarray], how: str
) -> dict[str, Any]:
    """KL, top-1 and perplexity of ``out/model.onnx`` against the reference logits on the text rows."""
    session, head_dim = session_of(out), head_dim_of(str(model_dir))
    comparison = TokenComparison()
    for row, want in zip(rows, reference, strict=True):
        logits = session.run(["logits"], feed(session, row[None], 0, head_dim, {}))[0][0]
        comparison.add(row, want, logits)
    found = comparison.quality("pydoc_data.topics", how)
    return {
        "kl": found.kl,
        "top1": round(found.top1, 4),
        "perplexity": round(found.perplexity, 3),
        "hf_perplexity": round(found.reference_perplexity, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, help="a Qwen3.5 text directory (default: the trained test hybrid)"
    )
    parser.add_argument("--work", type=Path, default=Path("deploy-work"))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--context", type=int, default=256, help="prompt tokens before the decode timing")
    parser.add_argument("--steps", type=int, default=32, help="decoded tokens timed")
    parser.add_argument("--target", help="attnx export's --target (e.g. ort; default: attnx's own default)")
    parser.add_argument("--fuse", action="store_true", help="attnx optimize with --fuse beside its precision")
    parser.add_argument("--speed-only", action="store_true", help="no quality columns (no HF forward)")
    parser.add_argument("--rounds", type=int, default=1, help="decode timings, interleaved over contenders")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model_dir = (args.model or hf_hybrid.make("qwen3_5")).resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.speed_only:
        rows, how = text_rows(model_dir)
        reference = hf_logits(model_dir, rows)
    results, outs = [], []
    for contender in args.contenders.split(","):
        out, seconds = build(contender, model_dir.resolve(), args.work.resolve(), args)
        row: dict[str, Any] = {"contender": contender, "build_s": round(seconds, 1)}
        row["deploy_mb"] = round(deploy_bytes(out) / 1e6, 2)
        row["dir_mb"] = round(sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6, 2)
        if not args.speed_only:
            row.update(quality(out, model_dir, rows, reference, how))
        print(json.dumps(row), flush=True)
        results.append(row)
        outs.append(out)
    for _ in range(args.rounds):  # interleaved: every contender once per round
        for row, out in zip(results, outs, strict=True):
            speed = genai_speed(out, args.context, args.steps)
            row.setdefault("decode_ms_rounds", []).append(round(speed["decode_ms_per_token"], 2))
    for row in results:
        row["decode_ms_per_token"] = min(row["decode_ms_rounds"])
        print(json.dumps(row), flush=True)
    keys = list(results[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in results:
        print(
            "| "
            + " | ".join(f"{row[k]:.3g}" if isinstance(row[k], float) else str(row[k]) for k in keys)
            + " |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
