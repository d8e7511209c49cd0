"""Per-token decode latency against position, for every variant that decodes.

For each variant a causal LM of :data:`MODEL` size is exported with its decode graphs;
for each position P a prompt of P random tokens goes through ``prefill.onnx``, then
``decode.onnx`` runs :data:`WARMUP` untimed and ``steps`` timed one-token steps on ONNX
Runtime (CPU, one intra-op thread by default: a step is small, and one thread keeps
timings steady on a shared machine). The per-token latency at position ~P is the lowest
of :data:`ROUNDS` medians, each round stepping from the same prefilled state (other work
on a shared machine only ever slows a round down; the position grows by ``steps`` within
a round, small against P).

A kv-cache (softmax) reads and copies O(P) keys and values per step; the recurrent state
of linear and cosFormer has the same size at every P, so their step costs the same.
Variants whose config has ``max_len`` (cosFormer's M) get M = the longest position reached.

Run ``python -m attnx.decode.bench`` for the markdown table.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

POSITIONS = (16, 256, 1024, 4096)
MODEL = {"vocab_size": 1000, "d_model": 256, "n_heads": 4, "n_layers": 4, "d_ff": 1024}
STEPS, WARMUP, ROUNDS = 32, 4, 3


@dataclasses.dataclass(frozen=True)
class DecodeTiming:
    variant: str
    position: int
    ms_per_token: float
    state_bytes: int  # every state tensor at this position (batch 1)


def decode_latency(
    variants: Sequence[str] | None = None,
    positions: Sequence[int] = POSITIONS,
    steps: int = STEPS,
    model: Mapping[str, Any] | None = None,
    threads: int | None = 1,
    progress: Callable[[str], None] | None = None,
) -> list[DecodeTiming]:
    """Median ONNX Runtime decode-step time at each position, per variant (default: every decoder)."""
    from attnx.decode.export import decoders, export_decode
    from attnx.decode.runtime import OrtStepper
    from attnx.exporter.assemble import assemble
    from attnx.registry import get_registry

    report = progress or (lambda message: None)
    options = dict(MODEL if model is None else model)
    longest = max(positions) + WARMUP + steps
    timings = []
    for name in variants or decoders():
        variant_fields = {f.name for f in dataclasses.fields(get_registry().variant(name).config)}
        extra = {"max_len": longest} if "max_len" in variant_fields else {}
        report(f"exporting a {options['n_layers']}-layer lm with {name} attention and its decode graphs")
        with tempfile.TemporaryDirectory(prefix="attnx-decode-bench-") as tmp:
            assembly = assemble(name, "lm", {**options, **extra}, 0)
            entry = export_decode(assembly, Path(tmp), 18, "function")
            stepper = OrtStepper(Path(tmp), entry, threads=threads)
            rng = np.random.default_rng(0)
            for position in positions:
                report(f"{name}: prefill {position} tokens, then {ROUNDS} x {steps} timed steps")
                _, prefilled = stepper.prefill(rng.integers(0, options["vocab_size"], size=(1, position)))
                tokens = rng.integers(0, options["vocab_size"], size=(WARMUP + steps, 1, 1))
                best = min(_median_step(stepper, prefilled, tokens) for _ in range(ROUNDS))
                size = sum(a.nbytes for a in prefilled.values())
                timings.append(DecodeTiming(name, position, 1000 * best, size))
    return timings


def _median_step(stepper: Any, state: dict[str, np.ndarray], tokens: np.ndarray) -> float:
    """Median time of the decode steps after :data:`WARMUP`, starting from ``state`` (left unchanged)."""
    times = []
    for i, token in enumerate(tokens):
        start = time.perf_counter()
        _, state = stepper.decode(token, state)
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def markdown_table(timings: Sequence[DecodeTiming]) -> str:
    """Rows: positions; columns: ms/token and state size per variant."""
    variants = list(dict.fromkeys(t.variant for t in timings))
    by_key = {(t.variant, t.position): t for t in timings}
    header = ["position", *(f"{v} ms/token" for v in variants), *(f"{v} state" for v in variants)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for position in sorted({t.position for t in timings}):
        cells = [str(position)]
        cells += [f"{by_key[(v, position)].ms_per_token:.3f}" for v in variants]
        cells += [_size(by_key[(v, position)].state_bytes) for v in variants]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


if __name__ == "__main__":
    import sys

    print(markdown_table(decode_latency(progress=lambda m: print(f"· {m}", file=sys.stderr))))
