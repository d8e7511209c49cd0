"""Real size, side by side: attnx against mobius-onnx and onnxruntime-genai's model builder on the same
Qwen3.5 text directories (the released 0.8B and 2B shapes, random weights: ``attnx.testing.real_size``).

Each tool runs in its own child process, one at a time, so its wall time and peak RSS are its own:

* ``attnx``: ``attnx export --from hf:DIR --decode -o OUT`` (default verify); ``attnx-no-verify`` the same
  with ``--no-verify``;
* ``mobius``: Microsoft's mobius-onnx (``mobius.build(DIR).save(OUT)``; ``pip install mobius-onnx==0.1.0``);
* ``builder``: ``python -m onnxruntime_genai.models.builder -p fp32 -e cpu`` on a
  ``Qwen3_5ForConditionalGeneration`` checkpoint of the same weights (``hf_hybrid.conditional_checkpoint``).

Then, per tool: bytes on disk and, against HF's own forward on one row of fresh seeded ids, the largest
absolute logits error of its full graph at each ``--lengths`` (an empty state for the stateful graphs). HF's
logits are computed first and the model freed before any graph is loaded, so one copy of the weights is in
memory at a time.

    python benchmarks/scale.py --shapes 0.8b --work /tmp/scale --json scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from hf_hybrid import builder_prefill, conditional_checkpoint  # noqa: E402

from attnx.testing import hf_hybrid, real_size  # noqa: E402

TOOLS = ("attnx", "attnx-no-verify", "mobius", "builder")
MOBIUS = "import sys, mobius; mobius.build(sys.argv[1]).save(sys.argv[2])"


def directory(shape: str, work: Path) -> Path:
    """The saved model of ``shape`` (made once)."""
    path = work / shape
    if not (path / "config.json").is_file():
        real_size.save(shape, path)
    return path


def command(tool: str, source: Path, out: Path) -> list[str]:
    """The command line that builds ``tool``'s export of ``source`` into ``out``."""
    if tool.startswith("attnx"):
        extra = ["--no-verify"] if tool == "attnx-no-verify" else []
        return ["attnx", "export", "--from", f"hf:{source}", "--decode", "-o", str(out), "--force", *extra]
    if tool == "mobius":
        return [sys.executable, "-c", MOBIUS, str(source), str(out)]
    checkpoint = out.parent / f"{source.name}-conditional"
    if not (checkpoint / "config.json").is_file():
        conditional_checkpoint(source, checkpoint)
    builder = ["-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out)]
    return [sys.executable, *builder, "-p", "fp32", "-e", "cpu", "-c", str(out.parent / "builder-cache")]


def timed(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run ``argv`` as a child; its wall time, its own peak RSS (``wait4``) and, on failure, its last line."""
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        timer = threading.Timer(timeout, child.kill)
        timer.start()
        _, status, usage = os.wait4(child.pid, 0)
        timer.cancel()
        wall = time.perf_counter() - start
        log.seek(0)
        lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    row: dict[str, Any] = {"wall_s": round(wall, 1), "peak_rss_gb": round(usage.ru_maxrss / 1e6, 2)}
    if status:
        row["error"] = lines[-1][:300] if lines else f"exit status {status}"
    return row


def full_logits(out: Path, ids: np.ndarray) -> np.ndarray:
    """``out/model.onnx``'s logits for ``ids`` (1, n) from an empty state: attnx's full graph, or mobius's
    stateful one (zero conv and recurrent state, a KV cache of length 0; the builder's layout is
    ``hf_hybrid.builder_prefill``'s)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    n = ids.shape[1]
    feed: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        if arg.name == "input_ids":
            feed[arg.name] = ids
        elif arg.name == "attention_mask":
            dtype = np.bool_ if arg.type == "tensor(bool)" else np.int64
            feed[arg.name] = np.ones((1, n), dtype)
        elif arg.name == "position_ids":
            feed[arg.name] = np.arange(n, dtype=np.int64)[None]
        else:
            shape = [1 if i == 0 else d if isinstance(d, int) else 0 for i, d in enumerate(arg.shape)]
            feed[arg.name] = np.zeros(shape, np.float32)
    return session.run(["logits"], feed)[0]


def reference_logits(source: Path, lengths: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """(ids, HF's logits) per length, from HF's own forward; the model is freed on return."""
    import torch
    import transformers

    model = transformers.Qwen3_5ForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    found = {}
    for n in lengths:
        ids = rng.integers(0, model.config.vocab_size, (1, n))
        with torch.no_grad():
            found[n] = ids, model(input_ids=torch.from_numpy(ids)).logits.float().numpy()
    return found


def measure(
    shape: str, tools: list[str], work: Path, lengths: list[int], timeout: float
) -> list[dict[str, Any]]:
    source = directory(shape, work)
    weights = sum(f.stat().st_size for f in source.glob("*.safetensors"))
    rows = []
    for tool in tools:
        out = work / f"{shape}-{tool}"
        row = {"shape": shape, "tool": tool, **timed(command(tool, source, out), timeout)}
        if "error" not in row:
            row["disk_x_weights"] = round(
                sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / weights, 3
            )
        if "error" not in row:
            row["peak_rss_x_weights"] = round(row["peak_rss_gb"] * 1e9 / weights, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    reference = reference_logits(source, lengths)
    for row in rows:
        if "error" in row:
            continue
        out = work / f"{shape}-{row['tool']}"
        for n, (ids, expected) in reference.items():
            try:
                logits = builder_prefill(out, ids) if row["tool"] == "builder" else full_logits(out, ids)
                row[f"logits_err_{n}"] = float(np.abs(logits - expected).max())
            except Exception as exc:  # a peer's graph may not run on these inputs: report, go on
                row[f"logits_err_{n}"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="0.8b,2b", help=f"comma list of {', '.join(real_size.SHAPES)}")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma list of {', '.join(TOOLS)}")
    parser.add_argument("--work", type=Path, default=Path("scale-work"))
    parser.add_argument("--lengths", default="37,130")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per tool")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    hf_hybrid.pure_torch_gated_delta()  # HF's forward is the reference: its torch path, not fla's kernels
    rows = []
    for shape in args.shapes.split(","):
        rows += measure(shape, args.tools.split(","), args.work, lengths, args.timeout)
    for row in rows:
        print(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
