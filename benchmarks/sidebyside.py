#!/usr/bin/env python
"""attnx side by side with what a user would pick instead, in one process, timed in turns.

    python benchmarks/sidebyside.py --threads 2 --json sidebyside.json   # N = 1024, 4096, 16384
    python benchmarks/sidebyside.py --quick                               # N = 1024 only (smoke run)
    python benchmarks/sidebyside.py --variants linear,reformer --sizes 1024,4096 --cases layer-causal

Cases (benchmarks/bodies.py builds them; d_model 256, 4 heads, batch 1):

layer         one attention layer (projections included), bidirectional
layer-causal  the same layer, causal (variants that declare it)
encoder       the small full model: attnx's default encoder (4 layers, FFN 1024, attention mask)

Contenders per case, loaded once and timed round-robin (``attnx.bench.roundrobin``; median of
``--repeat`` runs after a warm-up whose peak RSS is the forward's memory): attnx in torch eager, in
``torch.compile`` (where it works), in ONNX Runtime in each lowering (function, decomposed; softmax also
on the standard ``Attention`` op at opset 23), its dynamic int8 and fp16 exports (``attnx.optimize``, with
the accuracy each one measured) and, beside the layers, the
peers' own PyTorch modules (benchmarks/peers.py). A memory guard skips a contender whose estimated peak
exceeds ``--max-memory``. Decode: ms per token of a one-layer causal LM vs position, per decoding
variant (``attnx.bench.decode``). It prints every figure, then the issue-14 targets, met or missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bodies import CASES, D_MODEL, N_HEADS, case_plan, use_layer_model
from peers import Peer, peers_for
from rich.console import Console
from rich.table import Table
from run import is_linear_time, print_targets, target_row

import attnx
from attnx.bench.api import default_memory_limit, estimate_case
from attnx.bench.decode import decode_latency
from attnx.bench.machine import machine_info
from attnx.bench.report import Measurement
from attnx.bench.roundrobin import Contender, round_robin
from attnx.bench.timing import feed_for
from attnx.cost import FLOAT_BYTES, Shape, dense_attention_cost
from attnx.decode.export import decoders
from attnx.errors import first_line
from attnx.exporter.budget import ORT_MEMORY_FACTOR, SAFETY, model_cost
from attnx.exporter.directory import ExportDir
from attnx.models.spec import TensorSpec
from attnx.parity.backends import BACKENDS, Backend
from attnx.parity.runners import Graph, TorchRunner

SIZES = (1024, 4096, 16384)
TARGET_N = 4096
LOWERINGS = ("function", "decomposed")
ATTENTION_OP = "function opset 23"  # softmax on the standard ONNX Attention op
DECODE_POSITIONS = (128, 1024, 4096, 16384)
DECODE_MODEL = {"vocab_size": 1000, "d_model": D_MODEL, "n_heads": N_HEADS, "n_layers": 1, "d_ff": 1024}
# the input, q, k, v, the merged heads, the output, and the copies eager code and Inductor make of them
LAYER_ACTIVATIONS = 8
PEER_MEMORY_FACTOR = 4  # a peer's peak bound: attnx torch eager's estimate for the same case, times this
EAGER, COMPILED, ORT = "attnx torch", "attnx torch.compile", "attnx ort"
GiB, MiB = 1 << 30, 1 << 20


def ort_exports(variant: str) -> dict[str, dict[str, Any]]:
    """The ORT rows' export settings by row label: each lowering at the default opset, and for
    softmax the function lowering at opset 23, where its body is the standard ``Attention`` op."""
    exports: dict[str, dict[str, Any]] = {lowering: {"export.lowering": lowering} for lowering in LOWERINGS}
    if variant == "softmax":
        exports[ATTENTION_OP] = {"export.lowering": "function", "export.opset": 23}
    return exports


def export(variant: str, case: str, label: str, work: Path) -> ExportDir | str:
    """The attnx export of ``case`` with row ``label``'s settings (a reason string where it fails)."""
    model, options = case_plan(variant, case)  # type: ignore[misc]
    out = work / f"{variant}-{case}-{label.replace(' ', '-')}"
    settings = ort_exports(variant)[label]
    try:
        attnx.export(
            variant,
            out,
            model=model,
            force=True,
            options={**options, **settings, "verify.enabled": False},
        )
    except Exception as exc:
        return f"export failed: {first_line(exc, with_type=True)}"
    return ExportDir.open(out)


def estimate(source: ExportDir, backend: Backend, n: int) -> int:
    """Peak bytes of ``source`` on ``backend`` at length ``n``: ``attnx bench``'s estimate, or for a
    model without a cost model (the one-layer case) its attention's bound (quadratic when undeclared)
    plus :data:`LAYER_ACTIVATIONS` (B, N, d_model) tensors around it (without them, torch eager's causal
    linear and cosFormer layers peaked at up to 2x the estimate)."""
    bound = estimate_case(source, backend, 1, n)[0]
    if bound is not None:
        return bound
    _, config, roles = source.specs()
    variant, variant_config = roles["self"]
    shape = Shape(1, n, config.d_model, config.n_heads, causal=getattr(config, "causal", False))
    cost = variant.cost(shape, variant_config) if variant.cost else dense_attention_cost(shape)
    activations = LAYER_ACTIVATIONS * FLOAT_BYTES * n * config.d_model
    return int(SAFETY * backend.memory_factor * (cost.working_bytes + activations))


def backend_contender(name: str, backend: str, source: ExportDir, case: str, threads: int) -> Contender:
    """A row running ``source`` on one backend of attnx's table (``unavailable`` is its skip reason)."""
    chosen = BACKENDS[backend]
    return Contender(
        name,
        case,
        source.manifest.variant,
        lambda: chosen.runner(Graph.of_model(source), threads),
        lambda n, rng: feed_for(source, 1, n, rng),
        lambda n: estimate(source, chosen, n),
        skip=chosen.unavailable(source) or "",
    )


def skipped(name: str, case: str, variant: str, reason: str) -> Contender:
    return Contender(name, case, variant, None, None, skip=reason)


def attnx_contenders(
    variant: str, case: str, work: Path, threads: int, compile: bool
) -> tuple[list[Contender], ExportDir | None]:
    """attnx eager, compiled (``compile``) and in ORT per lowering; the function export (None if it
    failed)."""
    exports = {label: export(variant, case, label, work) for label in ort_exports(variant)}
    rows = []
    reference = exports["function"]
    torch_rows = ((EAGER, "torch"), (COMPILED, "torch-compile")) if compile else ((EAGER, "torch"),)
    for name, backend in torch_rows:
        if isinstance(reference, str):
            rows.append(skipped(name, case, variant, reference))
        else:
            rows.append(backend_contender(name, backend, reference, case, threads))
    for label, made in exports.items():
        name = f"{ORT} {label}"
        rows.append(
            skipped(name, case, variant, made)
            if isinstance(made, str)
            else backend_contender(name, "ort-cpu", made, case, threads)
        )
    return rows, None if isinstance(reference, str) else reference


def optimized_contenders(
    source: ExportDir, case: str, work: Path, threads: int
) -> tuple[list[Contender], dict[str, dict[str, Any]]]:
    """The dynamic int8 and fp16 optimised exports of ``source`` (``attnx.optimize``) in ORT, with what
    each one's accuracy report measured (relative output error, LM next-token agreement on the text)."""
    variant, rows, reports = source.manifest.variant, [], {}
    for flag, step in (("int8", "dynamic_int8"), ("fp16", "fp16")):
        name = f"{ORT} {flag}"
        out = work / f"{source.path.name}-{flag}"
        try:
            result = attnx.optimize(source.path, out, **{step: True}, force=True)
        except attnx.AttnxError as exc:
            rows.append(skipped(name, case, variant, f"optimize refused: {first_line(exc)}"))
            continue
        text = result.report.text
        reports[flag] = {"rel_error": result.report.rel_error, "top1": None if text is None else text.top1}
        rows.append(backend_contender(name, "ort-cpu", ExportDir.open(out), case, threads))
    return rows, reports


def peer_contender(peer: Peer, source: ExportDir, case: str, threads: int) -> Contender:
    """A peer's own module on the same inputs as the attnx layer ``source``; its memory bound is
    :data:`PEER_MEMORY_FACTOR` times attnx eager's."""
    specs = [TensorSpec("x", "float32", ("batch", "seq", D_MODEL))]
    outputs = [TensorSpec("y", "float32", ("batch", "seq", D_MODEL))]

    def make() -> TorchRunner:
        torch.manual_seed(0)
        return TorchRunner(
            peer.build(D_MODEL, N_HEADS).eval(), specs, outputs, name=peer.name, threads=threads
        )

    def bound(n: int) -> int | None:
        return PEER_MEMORY_FACTOR * estimate(source, BACKENDS["torch"], n)

    return Contender(
        peer.name,
        case,
        peer.variant,
        make,
        lambda n, rng: feed_for(source, 1, n, rng),
        bound,
        skip=peer.missing(),
    )


def run_case(
    variant: str, case: str, args: argparse.Namespace, work: Path, rng: np.random.Generator, console: Console
) -> tuple[list[Measurement], dict]:
    console.print(f"· {variant} {case}: exporting", style="dim")
    contenders, reference = attnx_contenders(variant, case, work, args.threads, not args.no_compile)
    reports: dict = {}
    if reference is not None and case == "encoder":
        rows, reports = optimized_contenders(reference, case, work, args.threads)
        contenders += rows
    if case != "encoder":
        for peer in peers_for(variant, case == "layer-causal"):
            if reference is None:
                contenders.append(skipped(peer.name, case, variant, "attnx export failed"))
            else:
                contenders.append(peer_contender(peer, reference, case, args.threads))
    console.print(f"· {variant} {case}: timing {len(contenders)} contenders at N = {args.sizes}", style="dim")
    measured = round_robin(
        contenders,
        args.sizes,
        warmup=1,
        repeat=args.repeat,
        threads=args.threads,
        rng=rng,
        limit=args.max_memory,
        max_time=args.max_time,
    )
    return measured, reports


def decode_guard(variant: str, position: int, limit: int | None) -> str:
    """Why the decode benchmark's prefill of ``position`` tokens would not fit ("" when it fits)."""
    registry = attnx.get_registry()
    declared, model = registry.variant(variant), registry.model("lm")
    cost = model_cost(
        model, model.make_config(DECODE_MODEL), {"self": (declared, declared.make_config({}))}, 1, position
    )
    need = None if cost is None else ORT_MEMORY_FACTOR * cost.working_bytes
    if limit is not None and need is not None and need > limit:
        return f"memory guard: prefill estimated {need / GiB:.1f} GiB > limit {limit / GiB:.1f} GiB"
    return ""


def decode_rows(
    variants: list[str], positions: tuple[int, ...], limit: int | None, console: Console
) -> list[dict[str, Any]]:
    """ms per token per layer (a one-layer LM) at each position, per decoding variant."""
    rows: list[dict[str, Any]] = []
    for variant in (v for v in decoders() if v in variants):
        reasons = {p: decode_guard(variant, p, limit) for p in positions}
        rows += [
            {"variant": variant, "position": p, "ms_per_token": None, "reason": r}
            for p, r in reasons.items()
            if r
        ]
        fit = [p for p in positions if not reasons[p]]
        try:
            timings = decode_latency(
                [variant],
                positions=fit,
                model=DECODE_MODEL,
                progress=lambda message: console.print(f"· {message}", style="dim"),
            )
        except Exception as exc:
            reason = f"failed: {first_line(exc, with_type=True)}"
            rows += [{"variant": variant, "position": p, "ms_per_token": None, "reason": reason} for p in fit]
            continue
        rows += [
            {
                "variant": t.variant,
                "position": t.position,
                "ms_per_token": t.ms_per_token,
                "reason": "",
                "state_bytes": t.state_bytes,
            }
            for t in timings
        ]
    return rows


def select(measured: list[Measurement], case: str, variant: str, n: int) -> list[Measurement]:
    """Every row of ``case`` and ``variant`` at length ``n``, measured or not."""
    return [m for m in measured if (m.model, m.variant, m.seq_len) == (case, variant, n)]


def best(
    measured: list[Measurement], case: str, variant: str, n: int, pick: Callable[[str], bool]
) -> Measurement | None:
    """The fastest measured row of ``case`` and ``variant`` at ``n`` among the contenders ``pick`` takes."""
    found = [m for m in select(measured, case, variant, n) if m.ok and pick(m.backend)]
    return min(found, key=lambda m: m.median_s, default=None)


def find(measured: list[Measurement], case: str, variant: str, name: str, n: int) -> Measurement | None:
    return best(measured, case, variant, n, lambda backend: backend == name)


def is_ort_fp32(name: str) -> bool:
    return name in {f"{ORT} {label}" for label in (*LOWERINGS, ATTENTION_OP)}


def ratio_row(
    target: str, variant: str, top: Measurement, bottom: Measurement, limit: float
) -> dict[str, Any]:
    """``top``'s median over ``bottom``'s against ``≤ limit``."""
    ratio = top.median_s / bottom.median_s
    detail = f"{top.backend} {top.median_s * 1e3:.1f} ms / {bottom.backend} {bottom.median_s * 1e3:.1f} ms"
    return target_row(target, variant, ratio, f"≤ {limit:g}", ratio <= limit, detail)


def targets(
    measured: list[Measurement],
    decode: list[dict[str, Any]],
    variants: list[str],
    sizes: list[int],
    reports: dict[str, dict[str, dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The issue-14 targets that this benchmark measures, one row per (target, variant, case)."""
    rows = []
    n, short, long = (TARGET_N if TARGET_N in sizes else max(sizes)), min(sizes), max(sizes)
    attnx_names = {EAGER, COMPILED, *(f"{ORT} {x}" for x in (*LOWERINGS, ATTENTION_OP, "int8", "fp16"))}
    for variant in variants:
        for case in ("layer", "layer-causal"):
            ort, eager = (
                best(measured, case, variant, n, is_ort_fp32),
                find(measured, case, variant, EAGER, n),
            )
            peer = best(measured, case, variant, n, lambda name: name not in attnx_names)
            if ort and eager:
                rows.append(ratio_row(f"{case} fp32 ORT / attnx eager N={n}", variant, ort, eager, 0.6))
            if ort and peer:
                rows.append(ratio_row(f"{case} fp32 ORT / best peer eager N={n}", variant, ort, peer, 0.25))
        eager, int8 = (find(measured, "encoder", variant, name, n) for name in (EAGER, f"{ORT} int8"))
        label = f"encoder int8 ORT / torch eager N={n}"
        if int8 and eager:
            rows.append(ratio_row(label, variant, int8, eager, 0.6))
            accuracy = reports.get(f"{variant}-encoder", {}).get("int8", {})
            if accuracy:
                error = accuracy["rel_error"]
                rows.append(
                    target_row("encoder int8 relative error", variant, error, "≤ 0.02", error <= 0.02, "")
                )
        else:
            why = [m.reason for m in select(measured, "encoder", variant, n) if m.backend == f"{ORT} int8"]
            rows.append(target_row(label, variant, None, "≤ 0.6", None, "; ".join(why) or "not measured"))
        for case in ("layer", "layer-causal", "encoder"):
            first, last = (find(measured, case, variant, f"{ORT} function", k) for k in (short, long))
            if first and last and long > short:
                linear = is_linear_time(variant, (short, long), D_MODEL, N_HEADS)
                ratio = last.median_s / first.median_s
                goal = "≤ 18" if linear else "reported (quadratic)"
                met = ratio <= 18 if linear else None
                rows.append(target_row(f"P2 {case} ORT t({long})/t({short})", variant, ratio, goal, met, ""))
    if "softmax" in variants:
        rows += softmax_rows(measured, n, long)
    rows += decode_targets(decode)
    return rows


def softmax_rows(measured: list[Measurement], n: int, long: int) -> list[dict[str, Any]]:
    """softmax's encoder in ORT: time and peak memory against torch's SDPA at ``n``; runs at ``long``."""
    rows = []
    ort = find(measured, "encoder", "softmax", f"{ORT} {ATTENTION_OP}", n) or best(
        measured, "encoder", "softmax", n, is_ort_fp32
    )  # the Attention op is the export this target is for (time and memory from one row)
    eager = find(measured, "encoder", "softmax", EAGER, n)
    if ort and eager:
        rows.append(ratio_row(f"softmax encoder ORT / torch SDPA N={n}", "softmax", ort, eager, 1.0))
        if ort.peak_rss_bytes and eager.peak_rss_bytes:
            memory = ort.peak_rss_bytes / eager.peak_rss_bytes
            detail = f"{ort.peak_rss_bytes / MiB:.0f} / {eager.peak_rss_bytes / MiB:.0f} MiB"
            rows.append(
                target_row(
                    f"softmax encoder ORT / torch peak memory N={n}",
                    "softmax",
                    memory,
                    "≤ 2",
                    memory <= 2,
                    detail,
                )
            )
    longest = [m for m in select(measured, "encoder", "softmax", long) if is_ort_fp32(m.backend)]
    detail = "; ".join(f"{m.backend}: {m.status} ({m.reason})" if m.reason else f"{m.backend}: {m.status}"
                       for m in longest)
    rows.append(
        target_row(
            f"softmax encoder ORT runs at N={long}",
            "softmax",
            None,
            "within the guard",
            any(m.ok for m in longest),
            detail,
        )
    )
    return rows


def decode_targets(decode: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step time at the last position over the first: flat for a recurrent state, growing for a KV cache."""
    rows = []
    for variant in sorted({r["variant"] for r in decode}):
        points = sorted(
            (r["position"], r["ms_per_token"])
            for r in decode
            if r["variant"] == variant and r["ms_per_token"]
        )
        if len(points) < 2:
            continue
        (p0, t0), (p1, t1) = points[0], points[-1]
        kv = attnx.get_registry().variant(variant).capabilities.decode == "kv-cache"
        goal, met = ("grows (> 1.2)", t1 / t0 > 1.2) if kv else ("≤ 1.1", t1 / t0 <= 1.1)
        detail = " · ".join(f"{p}: {t:.3f}" for p, t in points)
        rows.append(target_row(f"decode ms/token P={p1} / P={p0}", variant, t1 / t0, goal, met, detail))
    return rows


def print_measurements(measured: list[Measurement], console: Console) -> None:
    table = Table(title="side by side (batch 1, d_model 256, 4 heads; median of the timed runs)")
    for column in (
        "case",
        "variant",
        "N",
        "contender",
        "median ms",
        "min ms",
        "vs attnx torch",
        "peak MiB",
        "note",
    ):
        table.add_column(
            column,
            justify="right"
            if column in ("N", "median ms", "min ms", "vs attnx torch", "peak MiB")
            else "left",
        )
    for m in measured:
        eager = find(measured, m.model, m.variant, EAGER, m.seq_len)
        if m.ok:
            ratio = f"{m.median_s / eager.median_s:.2f}" if eager else ""
            peak = "" if m.peak_rss_bytes is None else f"{m.peak_rss_bytes / MiB:.0f}"
            table.add_row(
                m.model,
                m.variant,
                str(m.seq_len),
                m.backend,
                f"{m.median_s * 1e3:.1f}",
                f"{m.min_s * 1e3:.1f}",
                ratio,
                peak,
                "; ".join([f"{len(m.timings_s)} runs", *([m.reason] if m.reason else [])]),
            )
        else:
            table.add_row(
                m.model, m.variant, str(m.seq_len), m.backend, "", "", "", "", f"{m.status}: {m.reason}"
            )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="N=1024 only, decode at 128 and 1024 (smoke run)"
    )
    parser.add_argument("--sizes", default=None, help="comma-separated N (default 1024,4096,16384)")
    parser.add_argument("--variants", default=None, help="comma-separated (default: every registered one)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated of {', '.join(CASES)}")
    parser.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime intra-op threads")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per contender and N (median)")
    parser.add_argument("--max-time", type=float, default=30.0, help="s of timed runs per contender and N")
    parser.add_argument("--max-memory", type=float, default=None, help="GiB (default: 80%% of available)")
    parser.add_argument("--decode-positions", default=None, help="comma-separated; empty: no decode rows")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    parser.add_argument("--json", type=Path, default=None, help="write every number to this JSON file")
    args = parser.parse_args(argv)
    args.sizes = [
        int(n) for n in (args.sizes or ("1024" if args.quick else ",".join(map(str, SIZES)))).split(",")
    ]
    positions = args.decode_positions
    if positions is None:
        positions = "128,1024" if args.quick else ",".join(map(str, DECODE_POSITIONS))
    decode_positions = tuple(int(p) for p in positions.split(",") if p)
    args.max_memory = default_memory_limit() if args.max_memory is None else int(args.max_memory * GiB)
    use_layer_model()
    variants = args.variants.split(",") if args.variants else sorted(attnx.get_registry().variants)
    console = Console(width=None if sys.stdout.isatty() else 220)
    console.print(
        f"attnx side by side: {args.threads} threads, N {args.sizes}, variants {', '.join(variants)}, "
        f"memory limit {args.max_memory / GiB:.1f} GiB"
    )
    started, rng = time.perf_counter(), np.random.default_rng(0)
    measured: list[Measurement] = []
    reports: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="attnx-sidebyside-") as scratch:
        for variant in variants:
            for case in args.cases.split(","):
                if case_plan(variant, case) is not None:
                    rows, reports[f"{variant}-{case}"] = run_case(
                        variant, case, args, Path(scratch), rng, console
                    )
                    measured += rows
                    print_measurements(rows, console)  # as it goes: a long run killed late keeps its figures
    decode = decode_rows(variants, decode_positions, args.max_memory, console) if decode_positions else []
    for flags in (r for r in reports.values() if r):
        console.print(f"optimize reports: {flags}")
    for r in decode:
        per = "" if r["ms_per_token"] is None else f"{r['ms_per_token']:.3f} ms/token/layer"
        console.print(f"decode {r['variant']} P={r['position']}: {per}{r['reason']}")
    rows = targets(measured, decode, variants, args.sizes, reports)
    print_targets(rows, console)
    elapsed = time.perf_counter() - started
    console.print(f"total wall time {elapsed / 60:.1f} min")
    if args.json:
        data = {
            "machine": machine_info(),
            "threads": args.threads,
            "sizes": args.sizes,
            "elapsed_s": elapsed,
            "measurements": [m.to_dict() for m in measured],
            "decode": decode,
            "targets": rows,
            "optimize_reports": reports,
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
