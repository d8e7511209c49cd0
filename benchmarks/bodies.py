#!/usr/bin/env python
"""Where the attention bodies spend ONNX Runtime's time: per variant, latency and op-type breakdown.

    python benchmarks/bodies.py export DIR                 # every variant and case (about 1 min)
    python benchmarks/bodies.py run DIR                    # N = 1024 and 4096 (a few minutes)
    python benchmarks/bodies.py run BEFORE AFTER           # two exports of the same cases, timed in turn
    python benchmarks/bodies.py export DIR --variants linear --lowering decomposed
    python benchmarks/bodies.py export DIR --variants softmax --opset 23   # softmax on Attention
    python benchmarks/bodies.py run DIR --seq-lens 4096 --threads 1 --json bodies.json

``export`` writes one ``attnx export`` per variant and case into DIR/<variant>-<case>:

layer         one attention layer (d_model 256, 4 heads; projections included), bidirectional, no mask
layer-causal  the same layer, causal (variants that declare it; cosFormer with max_len 16384)
encoder       the default encoder (4 layers, d_model 256, 4 heads, FFN 1024, attention mask), in the
              variant's paper architecture (Reformer reversible + chunked FFN, Fastformer shared layers)

``run`` times every case of DIR on ONNX Runtime CPU (all graph optimisations, ``--threads`` intra-op
threads, batch 1): median and min of ``--repeat`` runs after one warm-up, fresh random inputs each
run, and the process CPU time of each run (with ``--threads 1`` the work itself, which other load on
the machine inflates far less than wall time), then ORT's profiler gives its op-type breakdown
(``attnx.bench.profile``). Given two directories (say one exported from the code before a change and
one after), it loads both sessions and alternates their runs, so both see the same machine load, and
prints after/before. ``run`` needs only ONNX Runtime and the manifests, so exports made by an older
attnx checkout compare directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import attnx
from attnx.bench.machine import machine_info
from attnx.bench.profile import ort_op_profile
from attnx.bench.timing import feed_for
from attnx.config import Config
from attnx.exporter.directory import ExportDir
from attnx.models.spec import ModelSpec, TensorSpec
from attnx.parity.runners import ort_session_options
from attnx.registry import Registry, set_registry
from attnx.variant import AttentionSpec

D_MODEL, N_HEADS = 256, 4
CASES = ("layer", "layer-causal", "encoder")
COSFORMER_MAX_LEN = 16384
TOP_OPS = 8


@dataclasses.dataclass(frozen=True)
class LayerConfig(Config):
    """One attention layer: ``y = attention(x)``."""

    d_model: int = D_MODEL
    n_heads: int = N_HEADS
    causal: bool = False


class AttentionLayerModel(nn.Module):
    """The one-layer model: ``y = attention(x)``, x (batch, seq, d_model)."""

    def __init__(self, config: LayerConfig, attention: Any) -> None:
        super().__init__()
        self.d_model = config.d_model
        spec = AttentionSpec(config.d_model, config.n_heads, causal=config.causal)
        self.attention = attention(spec, "self")

    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec("x", "float32", ("batch", "seq", self.d_model))]

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec("y", "float32", ("batch", "seq", self.d_model))]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.attention(x),)


LAYER = ModelSpec("attention-layer", "one attention layer", LayerConfig, f"{__name__}:AttentionLayerModel")


@attnx.hookimpl
def attnx_register_models() -> list[ModelSpec]:
    return [LAYER]


def case_plan(variant: str, case: str) -> tuple[str, dict[str, Any]] | None:
    """(model, options) of ``case`` for ``variant``; None when the variant cannot run it."""
    if case == "encoder":
        return "encoder", {}
    causal = case == "layer-causal"
    if causal and not attnx.get_registry().variant(variant).capabilities.causal:
        return None
    options: dict[str, Any] = {"model.causal": causal}
    if causal and variant == "cosformer":
        options["variant.max_len"] = COSFORMER_MAX_LEN
    return LAYER.name, options


def use_layer_model() -> None:
    """Make the process-wide registry the built-ins plus :data:`LAYER`."""
    set_registry(Registry(plugins=[("bodies-benchmark", sys.modules[__name__], "benchmarks/bodies.py")]))


def export_cases(
    directory: Path, variants: list[str] | None, cases: list[str], lowering: str, opset: int
) -> None:
    use_layer_model()
    for variant in variants or sorted(attnx.get_registry().variants):
        for case in cases:
            plan = case_plan(variant, case)
            if plan is not None:
                model, options = plan
                out = directory / f"{variant}-{case}"
                settings = {"export.lowering": lowering, "export.opset": opset, "verify.enabled": False}
                attnx.export(variant, out, model=model, options={**options, **settings}, force=True)
                print(f"exported {out}", flush=True)


def timed_runs(models: list[ExportDir], seq_len: int, threads: int, repeat: int,
               rng: np.random.Generator) -> list[list[tuple[float, float]]]:
    """Per model, ``repeat`` (wall, process CPU) run times in s after one warm-up; the models' runs
    alternate. With one thread the CPU time is the work done, whatever else the machine runs."""
    import onnxruntime

    sessions = [onnxruntime.InferenceSession(str(m.model_path), ort_session_options(threads),
                                             providers=["CPUExecutionProvider"]) for m in models]
    feeds = [feed_for(m, 1, seq_len, rng) for m in models]
    for session, feed in zip(sessions, feeds, strict=True):
        session.run(None, feed)
    times: list[list[tuple[float, float]]] = [[] for _ in models]
    for _ in range(repeat):
        for i, (model, session) in enumerate(zip(models, sessions, strict=True)):
            feed = feed_for(model, 1, seq_len, rng)
            start, cpu = time.perf_counter(), time.process_time()
            session.run(None, feed)
            times[i].append((time.perf_counter() - start, time.process_time() - cpu))
    return times


def run_cases(
    directories: list[Path], seq_lens: list[int], threads: int, repeat: int
) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for first in sorted(p for p in directories[0].iterdir() if (p / "attnx.json").is_file()):
        models = [ExportDir.open(d / first.name) for d in directories]
        for n in seq_lens:
            times = timed_runs(models, n, threads, repeat, rng)
            row: dict[str, Any] = {"case": first.name, "seq_len": n, "runs": []}
            for model, run in zip(models, times, strict=True):
                ops = ort_op_profile(model, batch=1, seq_len=n, threads=threads, runs=2)
                wall, cpu = ([t[i] * 1e3 for t in run] for i in (0, 1))
                row["runs"].append({"export": str(model.path), "median_ms": statistics.median(wall),
                                    "min_ms": min(wall), "cpu_median_ms": statistics.median(cpu),
                                    "ops": [dataclasses.asdict(o) for o in ops]})
            rows.append(row)
            print(describe(row), flush=True)
    return rows


def describe(row: dict[str, Any]) -> str:
    """One markdown row: case, N, per export median wall ms (min) and median CPU ms, [after/before of the
    wall and CPU medians,] top op types."""
    times = " | ".join(f"{r['median_ms']:.1f} ({r['min_ms']:.1f}) | {r['cpu_median_ms']:.1f}"
                       for r in row["runs"])
    ratio = ""
    if len(row["runs"]) == 2:
        before, after = row["runs"]
        ratio = (f" | {after['median_ms'] / before['median_ms']:.2f} | "
                 f"{after['cpu_median_ms'] / before['cpu_median_ms']:.2f}")
    ops = " | ".join(", ".join(f"{o['op_type']} {o['share'] * 100:.0f}%" for o in r["ops"][:TOP_OPS])
                     for r in row["runs"])
    return f"| {row['case']} | {row['seq_len']} | {times}{ratio} | {ops} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="export every variant and case into DIR")
    export.add_argument("directory", type=Path)
    export.add_argument("--variants", default=None, help="comma-separated (default: every registered one)")
    export.add_argument("--cases", default=",".join(CASES), help=f"comma-separated of {', '.join(CASES)}")
    export.add_argument("--lowering", default="function", help="function or decomposed")
    export.add_argument("--opset", type=int, default=18, help="ONNX opset (23+: softmax on Attention)")
    run = commands.add_parser("run", help="time and profile the cases of DIR (alternating with DIR2)")
    run.add_argument("directories", type=Path, nargs="+", metavar="DIR")
    run.add_argument("--seq-lens", default="1024,4096", help="comma-separated")
    run.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    run.add_argument("--repeat", type=int, default=5, help="timed runs per case and length")
    run.add_argument("--json", type=Path, default=None, help="write every number to this JSON file")
    args = parser.parse_args(argv)
    if args.command == "export":
        export_cases(args.directory, args.variants and args.variants.split(","), args.cases.split(","),
                     args.lowering, args.opset)
        return 0
    lengths = [int(n) for n in args.seq_lens.split(",")]
    print(f"{len(args.directories)} export(s), {args.threads} threads, batch 1, {args.repeat} runs: per "
          f"export median (min) wall ms | median CPU ms: {', '.join(map(str, args.directories))}")
    rows = run_cases(args.directories, lengths, args.threads, args.repeat)
    if args.json:
        data = {"machine": machine_info(), "threads": args.threads, "repeat": args.repeat, "rows": rows}
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
