#!/usr/bin/env python
"""fp16 vs fp32 exports of the same model, measured side by side in one run.

    python benchmarks/fp16.py                       # standard encoders, N = 512 and 2048 (about 5 min)
    python benchmarks/fp16.py --quick               # small models (about 1 min)
    python benchmarks/fp16.py --variants linear --seq-lens 1024 --json fp16.json

Each fp16-capable variant is exported twice (``dtype="fp32"`` and ``"fp16"``, same seed) in
the standard benchmark encoder (benchmarks/run.py: d_model 512, 6 layers) and timed with
``attnx.bench`` on the chosen backends. It prints the latencies, the fp16/fp32 latency ratio
per backend and length, and the ONNX file sizes. No target: fp16 is a GPU format, and this
shows what it costs or saves on the machine at hand.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

import attnx
from attnx.bench.machine import default_threads, machine_info
from attnx.bench.report import print_report, progress_bar

STANDARD = {"d_model": 512, "n_heads": 8, "n_layers": 6, "d_ff": 2048}
SMALL = {"d_model": 64, "n_heads": 2, "n_layers": 2, "d_ff": 128, "vocab_size": 1000}
DTYPES = ("fp32", "fp16")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small models (smoke run)")
    parser.add_argument("--variants", default=None, help="comma-separated (default: every fp16-capable one)")
    parser.add_argument("--backends", default="torch,ort-cpu", help="backends to time")
    parser.add_argument("--seq-lens", default=None, help="comma-separated (default 512,2048; quick 64,256)")
    parser.add_argument("--threads", type=int, default=default_threads(), help="intra-op threads")
    parser.add_argument("--json", type=Path, default=None, help="write every number to this JSON file")
    args = parser.parse_args(argv)
    registry = attnx.get_registry()
    variants = (
        args.variants.split(",")
        if args.variants
        else sorted(name for name, v in registry.variants.items() if v.capabilities.fp16)
    )
    model = SMALL if args.quick else STANDARD
    lengths = [int(n) for n in (args.seq_lens or ("64,256" if args.quick else "512,2048")).split(",")]
    backends = args.backends.split(",")
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(f"fp16 vs fp32, encoder {model}, {args.threads} threads, variants {', '.join(variants)}")
    with tempfile.TemporaryDirectory(prefix="attnx-fp16-") as work:
        outs = []
        for variant in variants:
            for dtype in DTYPES:
                out = Path(work) / f"{variant}-{dtype}"
                console.print(f"· exporting {variant} in {dtype}", style="dim")
                attnx.export(
                    variant,
                    out,
                    options={**model, "export.dtype": dtype, "verify.enabled": False},
                    force=True,
                )
                outs.append(out)
        sizes = {out.name: (out / "model.onnx").stat().st_size for out in outs}
        with progress_bar(False) as progress:
            report = attnx.bench(
                outs,
                backends=backends,
                seq_lens=lengths,
                warmup=1,
                repeat=5,
                threads=args.threads,
                max_time=20.0,
                progress=progress,
            )
    print_report(report, console)
    table = Table(title="fp16 / fp32 median latency (same model, same inputs)")
    for column in ("variant", "backend", "N", "fp32 ms", "fp16 ms", "fp16/fp32", "model.onnx fp16/fp32"):
        table.add_column(column, justify="left" if column in ("variant", "backend") else "right")
    rows = []
    for variant in variants:
        for backend in backends:
            for n in lengths:
                full, half = (report.find(f"{variant}-{dtype}", backend, n, 1) for dtype in DTYPES)
                if not (full and half and full.ok and half.ok):
                    reason = next((m.reason for m in (full, half) if m and not m.ok), "not measured")
                    table.add_row(variant, backend, str(n), "", "", reason, "")
                    continue
                ratio = half.median_s / full.median_s
                size = sizes[f"{variant}-fp16"] / sizes[f"{variant}-fp32"]
                rows.append(
                    {
                        "variant": variant,
                        "backend": backend,
                        "seq_len": n,
                        "fp32_s": full.median_s,
                        "fp16_s": half.median_s,
                        "ratio": ratio,
                        "onnx_size_ratio": size,
                    }
                )
                table.add_row(
                    variant,
                    backend,
                    str(n),
                    f"{full.median_s * 1e3:.1f}",
                    f"{half.median_s * 1e3:.1f}",
                    f"{ratio:.2f}",
                    f"{size:.2f}",
                )
    console.print(table)
    if args.json:
        data = {
            "machine": machine_info(),
            "model": model,
            "threads": args.threads,
            "rows": rows,
            "report": report.to_dict(),
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
