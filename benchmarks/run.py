#!/usr/bin/env python
"""attnx's standard benchmark: the performance targets, measured side by side in one run.

    python benchmarks/run.py                  # full run (about 10 min on 2 quiet cores)
    python benchmarks/run.py --quick          # smoke run: small models and lengths (about 2 min)
    python benchmarks/run.py --variants softmax,linear --json out.json --plot out.png

It exports the standard set (each registered variant in a 6-layer encoder, d_model 512,
8 heads, FFN 2048, the variant's paper architecture defaults) with
``attnx.export(...)`` without verification into a work directory, then measures with
``attnx.bench``:

P1      ORT-cpu latency / torch eager latency at N=4096 (batch 1) and N=512 (batch 8)
P2      ORT-cpu latency(N=16384) / latency(N=1024)
P5      achieved FLOP rate of the model (attnx.exporter.budget) / fp32 GEMM rate (a 2048³
        torch matmul measured in the same run, before and after; the higher rate is used)
P6      wall time of ``attnx export --variant softmax -o DIR --no-verify`` (default encoder)
P7      peak RSS of a fresh process running the linear encoder in ORT at N=32768
decode  per-token latency vs position (attnx.bench.decode: a causal LM per decoding
        variant, prefill then timed decode steps in ORT), reported, no target

With ``--profile`` (default) ORT's profiler gives each variant's op-type breakdown at
P1's long length, to explain a missed target.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import attnx
from attnx.bench.decode import decode_latency as measure_decode
from attnx.bench.machine import default_threads, machine_info
from attnx.bench.profile import ort_op_profile
from attnx.bench.report import BenchReport, Measurement, print_report, progress_bar
from attnx.bench.worker import request, run_isolated
from attnx.cost import Shape
from attnx.decode.export import decoders
from attnx.errors import first_line
from attnx.exporter.directory import ExportDir

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes of one run; ``QUICK`` keeps every step but shrinks models and lengths."""

    model: dict[str, int]
    sweep: tuple[int, ...]  # batch 1; holds P1's long N and both P2 lengths
    p1_long: int
    p1_batch: tuple[int, int]  # (batch, N)
    p2: tuple[int, int]
    p7: int
    decode: tuple[int, ...]  # positions
    decode_steps: int
    decode_model: dict[str, int] | None  # None: attnx.decode.bench's default LM
    gemm: int
    warmup: int
    repeat: int
    max_time: float


FULL = Plan(
    model={"d_model": 512, "n_heads": 8, "n_layers": 6, "d_ff": 2048},
    sweep=(256, 1024, 4096, 16384),
    p1_long=4096,
    p1_batch=(8, 512),
    p2=(1024, 16384),
    p7=32768,
    decode=(16, 256, 1024, 4096),
    decode_steps=32,
    decode_model=None,
    gemm=2048,
    warmup=1,
    repeat=5,
    max_time=20.0,
)
QUICK = Plan(
    model={"d_model": 64, "n_heads": 2, "n_layers": 2, "d_ff": 128, "vocab_size": 1000},
    sweep=(64, 256, 1024),
    p1_long=1024,
    p1_batch=(8, 64),
    p2=(256, 1024),
    p7=4096,
    decode=(16, 256),
    decode_steps=8,
    decode_model={"vocab_size": 1000, "d_model": 64, "n_heads": 2, "n_layers": 2, "d_ff": 128},
    gemm=512,
    warmup=1,
    repeat=3,
    max_time=2.0,
)


def gemm_rate(size: int, threads: int, repeat: int = 10) -> dict[str, Any]:
    """fp32 FLOP rate of a size³ torch matmul (2·size³ FLOPs), median and best of ``repeat``."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(2):
        a @ b
    timings = []
    for _ in range(repeat):
        start = time.perf_counter()
        a @ b
        timings.append(time.perf_counter() - start)
    torch.set_num_threads(previous)
    flops = 2 * size**3
    return {
        "size": size,
        "threads": threads,
        "timings_s": timings,
        "median_flops_per_s": flops / statistics.median(timings),
        "best_flops_per_s": flops / min(timings),
    }


def export_set(variants: list[str], plan: Plan, work: Path, console: Console) -> tuple[list[Path], dict]:
    """Export each variant; a failure is recorded and the run goes on."""
    outs, failures = [], {}
    for variant in variants:
        console.print(f"· exporting {variant} ({plan.model})", style="dim")
        try:
            attnx.export(variant, work / variant, options={**plan.model, "verify.enabled": False}, force=True)
            outs.append(work / variant)
        except Exception as exc:
            failures[variant] = first_line(exc, with_type=True)
            console.print(f"  export of {variant} failed: {failures[variant]}", style="red")
    return outs, failures


def export_wall_time(work: Path) -> dict[str, Any]:
    """P6: ``attnx export --variant softmax -o DIR --no-verify`` in a fresh process, timed end to end."""
    executable = shutil.which("attnx")
    command = [executable] if executable else [sys.executable, "-m", "attnx"]
    out = str(work / "p6-softmax")
    arguments = ["export", "--variant", "softmax", "-o", out, "--no-verify", "--force", "-q"]
    command += arguments
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    return {
        "command": " ".join(["attnx", *arguments]),
        "wall_s": wall,
        "exit_code": done.returncode,
        "error": done.stderr.strip().splitlines()[-1] if done.returncode else "",
    }


def peak_rss(out: Path, n: int, threads: int) -> Measurement:
    """P7: one ORT run at length ``n`` in a fresh process (no torch imported), its whole-life peak RSS."""
    model = ExportDir.open(out)
    args = request(
        model, "ort-cpu", batch=1, seq_len=n, warmup=0, repeat=1, threads=threads, seed=0, max_time=None
    )
    return run_isolated(model, args)


def profile(out: Path, plan: Plan, threads: int) -> list[dict[str, Any]]:
    """ORT's op-type breakdown of one run at P1's long length."""
    ops = ort_op_profile(ExportDir.open(out), batch=1, seq_len=plan.p1_long, threads=threads)
    return [dataclasses.asdict(t) for t in ops]


def decode_latency(plan: Plan, variants: list[str], console: Console) -> dict[str, Any]:
    """Per-token decode latency vs position from ``attnx.bench.decode``; a one-line reason where it fails."""
    chosen = [v for v in decoders() if v in variants]
    try:
        timings = measure_decode(
            chosen,
            positions=plan.decode,
            steps=plan.decode_steps,
            model=plan.decode_model,
            progress=lambda message: console.print(f"· {message}", style="dim"),
        )
    except Exception as exc:
        reason = f"decode benchmark failed: {first_line(exc, with_type=True)}"
        return {"status": "failed", "reason": reason, "timings": []}
    return {"status": "ok", "reason": "", "timings": [dataclasses.asdict(t) for t in timings]}


def is_linear_time(variant: str, lengths: tuple[int, int], d_model: int, n_heads: int) -> bool:
    """Whether the variant's declared cost model grows linearly with the length (P2's ≤ 18 applies):
    its attention FLOPs at the long length over the short one, against the length ratio."""
    declared = attnx.get_registry().variant(variant)
    if declared.cost is None:
        return False
    short, long = lengths
    config = declared.make_config({})
    ratio = (
        declared.cost(Shape(1, long, d_model, n_heads), config).flops
        / declared.cost(Shape(1, short, d_model, n_heads), config).flops
    )
    return ratio < 2 * long / short


def target_row(
    target: str, variant: str, value: float | None, goal: str, met: bool | None, detail: str
) -> dict[str, Any]:
    """One row of a targets table; ``met`` None: reported, no verdict."""
    verdict = "n/a" if met is None else "met" if met else "MISSED"
    return {"target": target, "variant": variant, "value": value, "goal": goal, "verdict": verdict,
            "detail": detail}


def _median(report: BenchReport, variant: str, backend: str, n: int, batch: int = 1) -> Measurement | None:
    m = report.find(variant, backend, n, batch)
    return m if m is not None and m.ok else None


def _why(report: BenchReport, variant: str, backend: str, n: int, batch: int = 1) -> str:
    m = report.find(variant, backend, n, batch)
    return "not measured" if m is None else f"{m.status}: {m.reason}"


def targets(
    sweep: BenchReport,
    batched: BenchReport,
    plan: Plan,
    gemm: float,
    p6: dict[str, Any],
    p7: Measurement | None,
    decode: dict[str, Any],
    variants: list[str],
) -> list[dict[str, Any]]:
    """One row per (target, variant): the measured value, the target and the verdict."""
    rows: list[dict[str, Any]] = []

    def row(target: str, variant: str, value: float | None, goal: str, met: bool | None, detail: str) -> None:
        rows.append(target_row(target, variant, value, goal, met, detail))

    for variant in variants:
        batch, short_n = plan.p1_batch
        for label, report, b, n, goal, limit in (
            (f"P1 ORT/torch N={plan.p1_long}", sweep, 1, plan.p1_long, "≤ 0.8 (stretch 0.6)", 0.8),
            (f"P1 ORT/torch N={short_n}×{batch}", batched, batch, short_n, "≤ 0.5", 0.5),
        ):
            ort, eager = _median(report, variant, "ort-cpu", n, b), _median(report, variant, "torch", n, b)
            if ort and eager:
                ratio = ort.median_s / eager.median_s
                stretch = " (stretch met)" if limit == 0.8 and ratio <= 0.6 else ""
                row(
                    label,
                    variant,
                    ratio,
                    goal,
                    ratio <= limit,
                    f"ORT {ort.median_s * 1e3:.0f} ms / torch {eager.median_s * 1e3:.0f} ms{stretch}; "
                    f"ratio of minima {ort.min_s / eager.min_s:.2f}",
                )
            else:
                missing = "ort-cpu" if not ort else "torch"
                row(label, variant, None, goal, None, _why(report, variant, missing, n, b))
        short, long = plan.p2
        first, last = _median(sweep, variant, "ort-cpu", short), _median(sweep, variant, "ort-cpu", long)
        linear_time = is_linear_time(variant, plan.p2, plan.model["d_model"], plan.model["n_heads"])
        label, goal = f"P2 ORT t({long})/t({short})", "≤ 18" if linear_time else "reported (quadratic)"
        if first and last:
            ratio = last.median_s / first.median_s
            row(
                label,
                variant,
                ratio,
                goal,
                ratio <= 18 if linear_time else None,
                f"{last.median_s * 1e3:.0f} ms / {first.median_s * 1e3:.0f} ms; "
                f"ratio of minima {last.min_s / first.min_s:.2f}",
            )
        else:
            row(label, variant, None, goal, None, _why(sweep, variant, "ort-cpu", long if first else short))
        for backend in ("ort-cpu", "torch"):
            m = _median(sweep, variant, backend, plan.p1_long)
            judged = variant == "linear" and backend == "ort-cpu"
            label = f"P5 FLOP rate / GEMM, {backend} N={plan.p1_long}"
            goal = "≥ 0.60" if judged else "reported"
            if m and m.flops and m.flops_per_s:
                share = m.flops_per_s / gemm
                rate = f"{m.flops_per_s / 1e9:.1f} GFLOP/s of {gemm / 1e9:.1f}"
                row(
                    label,
                    variant,
                    share,
                    goal,
                    share >= 0.6 if judged else None,
                    f"{rate} (model {m.flops / 1e9:.1f} GFLOP)",
                )
            else:
                row(label, variant, None, goal, None, _why(sweep, variant, backend, plan.p1_long))
    ok = p6["exit_code"] == 0
    row(
        "P6 attnx export wall time (s)",
        "softmax",
        p6["wall_s"] if ok else None,
        "≤ 10 s",
        p6["wall_s"] <= 10 if ok else None,
        p6["command"] if ok else f"failed: {p6['error']}",
    )
    if p7 is not None and p7.ok and p7.process_peak_rss_bytes:
        peak = p7.process_peak_rss_bytes / GiB
        delta = p7.peak_rss_bytes
        delta = "" if delta is None else f"; load+run {delta / GiB:.2f} GiB over the process baseline"
        row(
            f"P7 ORT peak RSS N={plan.p7} (GiB)",
            "linear",
            peak,
            "≤ 2 GiB",
            peak <= 2,
            f"whole process, one run of {p7.median_s:.1f} s{delta}",
        )
    else:
        row(
            f"P7 ORT peak RSS N={plan.p7} (GiB)",
            "linear",
            None,
            "≤ 2 GiB",
            None,
            "linear not exported" if p7 is None else f"{p7.status}: {p7.reason}",
        )
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for t in decode["timings"]:
        by_variant.setdefault(t["variant"], []).append(t)
    for variant, points in by_variant.items():
        first, last = min(points, key=lambda t: t["position"]), max(points, key=lambda t: t["position"])
        row(
            f"decode ms/token P={last['position']} / P={first['position']}",
            variant,
            last["ms_per_token"] / first["ms_per_token"],
            "reported",
            None,
            " · ".join(f"P={t['position']}: {t['ms_per_token']:.3f} ms" for t in points),
        )
    if not by_variant:
        row("decode per-token latency", "-", None, "reported", None, decode["reason"])
    return rows


def print_targets(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="attnx performance targets")
    for column in ("target", "variant", "measured", "target value", "verdict", "detail"):
        table.add_column(column, justify="right" if column == "measured" else "left")
    for r in rows:
        value = "" if r["value"] is None else f"{r['value']:.2f}"
        style = "red" if r["verdict"] == "MISSED" else "green" if r["verdict"] == "met" else None
        table.add_row(r["target"], r["variant"], value, r["goal"], r["verdict"], r["detail"], style=style)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small models and lengths (smoke run)")
    parser.add_argument("--variants", default=None, help="comma-separated (default: every registered one)")
    parser.add_argument("--backends", default="torch,ort-cpu", help="backends of the sweep")
    parser.add_argument("--threads", type=int, default=default_threads(), help="intra-op threads")
    parser.add_argument("--work", type=Path, default=None, help="export directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write every number to this JSON file")
    parser.add_argument("--plot", type=Path, default=None, help="latency vs N plot (PNG)")
    parser.add_argument("--no-profile", action="store_true", help="skip the ORT op-type profiles")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    console = Console(width=None if sys.stdout.isatty() else 200)
    variants = args.variants.split(",") if args.variants else sorted(attnx.get_registry().variants)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnx-bench-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        console.print(
            f"attnx benchmark ({'quick' if args.quick else 'full'}), {args.threads} threads, "
            f"variants {', '.join(variants)}; work dir {work}"
        )
        gemm_before = gemm_rate(plan.gemm, args.threads)
        outs, export_failures = export_set(variants, plan, work, console)
        exported = [p.name for p in outs]
        backends = args.backends.split(",")
        common = {
            "warmup": plan.warmup,
            "repeat": plan.repeat,
            "max_time": plan.max_time,
            "threads": args.threads,
        }
        with progress_bar(False) as progress:
            sweep = attnx.bench(outs, backends=backends, seq_lens=plan.sweep, progress=progress, **common)
        batch, n = plan.p1_batch
        with progress_bar(False) as progress:
            batched = attnx.bench(
                outs, backends=["torch", "ort-cpu"], seq_lens=[n], batch=batch, progress=progress, **common
            )
        gemm_after = gemm_rate(plan.gemm, args.threads)
        gemm = max(gemm_before["median_flops_per_s"], gemm_after["median_flops_per_s"])
        console.print(f"· timing `attnx export` (P6) and the N={plan.p7} peak RSS (P7)", style="dim")
        p6 = export_wall_time(work)
        p7 = peak_rss(work / "linear", plan.p7, args.threads) if "linear" in exported else None
        decode = decode_latency(plan, variants, console)
        profiles = {} if args.no_profile else {v: profile(work / v, plan, args.threads) for v in exported}

    print_report(sweep, console)
    print_report(batched, console)
    console.print(
        f"fp32 GEMM {plan.gemm}³: {gemm_before['median_flops_per_s'] / 1e9:.1f} GFLOP/s before, "
        f"{gemm_after['median_flops_per_s'] / 1e9:.1f} after (median); P5 uses {gemm / 1e9:.1f}"
    )
    for name, ops in profiles.items():
        top = ", ".join(f"{o['op_type']} {o['share']:.0%}" for o in ops[:6])
        console.print(f"ORT profile {name} N={plan.p1_long}: {top}")
    for variant, reason in export_failures.items():
        console.print(f"export failed for {variant}: {reason}")
    rows = targets(sweep, batched, plan, gemm, p6, p7, decode, exported)
    print_targets(rows, console)
    elapsed = time.perf_counter() - started
    console.print(f"total wall time {elapsed / 60:.1f} min")
    if args.json:
        data = {
            "plan": dataclasses.asdict(plan),
            "quick": args.quick,
            "machine": machine_info(),
            "elapsed_s": elapsed,
            "targets": rows,
            "gemm": [gemm_before, gemm_after],
            "p6": p6,
            "p7": p7.to_dict() if p7 else None,
            "decode": decode,
            "export_failures": export_failures,
            "ort_profiles": profiles,
            "sweep": sweep.to_dict(),
            "batched": batched.to_dict(),
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    if args.plot:
        from attnx.bench.plot import plot_report

        model = f"encoder d_model {plan.model['d_model']}, {plan.model['n_layers']} layers, batch 1"
        plot_report(sweep, args.plot, title=f"{model} — {sweep.machine['cpu']}, {args.threads} threads")
        console.print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
