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
A variant with a position limit (``Variant.position_limit_option``: cosFormer's M) gets it set to the
longest position reached.

:func:`source_latency` times a seq2seq decoder against the *source* length instead: its
cross-attention keys and values are projected once in prefill and read by every step, so
a step costs O(src · d) per layer for the read, not O(src · d_model²) for re-projection.

Run ``python -m attnx.bench.decode`` for the markdown table (``... decode seq2seq`` for the
source-length one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnx import api
from attnx.decode.export import decoders
from attnx.decode.runtime import State, Stepper, open_stepper, state_bytes
from attnx.exporter.directory import ExportDir
from attnx.registry import get_registry

POSITIONS = (16, 256, 1024, 4096)
MODEL = {"vocab_size": 1000, "d_model": 256, "n_heads": 4, "n_layers": 4, "d_ff": 1024}
STEPS, WARMUP, ROUNDS = 32, 4, 3
SOURCES = (256, 1024, 4096)
PAIRS = (("softmax", "softmax"), ("linear", "linear"), ("linear", "cosformer"))  # (self, cross) variants
PROMPT = 16  # target tokens prefilled before the timed seq2seq steps


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
    report = progress or (lambda message: None)
    options = dict(MODEL if model is None else model)
    longest = max(positions) + WARMUP + steps
    timings = []
    for name in variants or decoders():
        report(f"exporting a {options['n_layers']}-layer lm with {name} attention and its decode graphs")
        with _stepper("lm", name, None, options, longest, threads) as stepper:
            rng = np.random.default_rng(0)
            for position in positions:
                report(f"{name}: prefill {position} tokens, then {ROUNDS} x {steps} timed steps")
                _, prefilled = stepper.prefill(rng.integers(0, options["vocab_size"], size=(1, position)))
                tokens = rng.integers(0, options["vocab_size"], size=(WARMUP + steps, 1, 1))
                best = min(_median_step(stepper, prefilled, tokens) for _ in range(ROUNDS))
                size = state_bytes(prefilled)
                timings.append(DecodeTiming(name, position, 1000 * best, size))
    return timings


@dataclasses.dataclass(frozen=True)
class SourceTiming:
    variant: str
    cross_variant: str
    source_len: int
    ms_per_token: float
    context_bytes: int  # the decode inputs that stay fixed: cached cross keys/values, source mask (batch 1)


def source_latency(
    pairs: Sequence[tuple[str, str]] = PAIRS,
    sources: Sequence[int] = SOURCES,
    steps: int = STEPS,
    model: Mapping[str, Any] | None = None,
    threads: int | None = 1,
    progress: Callable[[str], None] | None = None,
) -> list[SourceTiming]:
    """Median ONNX Runtime decode-step time of a seq2seq decoder after sources of each length, per
    (self, cross) variant pair; :data:`PROMPT` target tokens are prefilled first."""
    report = progress or (lambda message: None)
    options = dict(MODEL if model is None else model)
    vocab = options["vocab_size"]
    timings = []
    for name, cross in pairs:
        report(f"exporting a seq2seq with {name} self- and {cross} cross-attention and its decode graphs")
        with _stepper("seq2seq", name, cross, options, PROMPT + WARMUP + steps, threads) as stepper:
            rng = np.random.default_rng(0)
            for n in sources:
                report(f"{name}/{cross}: prefill a {n}-token source, then {ROUNDS} x {steps} timed steps")
                ids = rng.integers(0, vocab, (1, n))
                source = {"input_ids": ids, "attention_mask": np.ones(ids.shape, dtype=bool)}
                _, prefilled = stepper.prefill(rng.integers(0, vocab, (1, PROMPT)), source)
                tokens = rng.integers(0, vocab, size=(WARMUP + steps, 1, 1))
                best = min(_median_step(stepper, prefilled, tokens) for _ in range(ROUNDS))
                size = state_bytes({c.input: prefilled[c.input] for c in stepper.section.context})
                timings.append(SourceTiming(name, cross, n, 1000 * best, size))
    return timings


@contextlib.contextmanager
def _stepper(
    model: str,
    variant: str,
    cross: str | None,
    options: Mapping[str, Any],
    positions: int,
    threads: int | None,
) -> Iterator[Stepper]:
    """ONNX Runtime over freshly exported decode graphs of ``model`` (in a temporary directory); a
    variant with a position limit (cosFormer's M) gets it set to ``positions``, the longest reached."""
    registry = get_registry()
    limits = {
        f"{scope}.{spec.position_limit_option}": positions
        for scope, name in (("variant", variant), ("cross", cross))
        if name is not None and (spec := registry.variant(name)).position_limit_option
    }
    with tempfile.TemporaryDirectory(prefix="attnx-decode-bench-") as tmp:
        settings = {"export.decode": True, "verify.enabled": False}
        api.export(
            variant,
            Path(tmp) / "out",
            model=model,
            cross_variant=cross,
            options={**options, **limits, **settings},
        )
        with open_stepper(ExportDir.open(Path(tmp) / "out"), "ort-cpu", threads, many_runs=True) as stepper:
            yield stepper


def _median_step(stepper: Any, state: State, tokens: np.ndarray) -> float:
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
    points = {(t.variant, t.position): (t.ms_per_token, t.state_bytes) for t in timings}
    return _table("position", "state", points)


def source_table(timings: Sequence[SourceTiming]) -> str:
    """Rows: source lengths; columns: ms/token and context size per (self/cross) pair."""
    points = {
        (f"{t.variant}/{t.cross_variant}", t.source_len): (t.ms_per_token, t.context_bytes) for t in timings
    }
    return _table("source", "context", points)


def _table(length: str, size: str, points: Mapping[tuple[str, int], tuple[float, int]]) -> str:
    """Markdown: one row per length; ms/token, then ``size`` columns, per series (in first-seen order)."""
    series = list(dict.fromkeys(name for name, _ in points))
    header = [length, *(f"{name} ms/token" for name in series), *(f"{name} {size}" for name in series)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for n in sorted({n for _, n in points}):
        cells = [str(n)]
        cells += [f"{points[(name, n)][0]:.3f}" for name in series]
        cells += [_size(points[(name, n)][1]) for name in series]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


if __name__ == "__main__":
    import sys

    def progress(message: str) -> None:
        print(f"· {message}", file=sys.stderr)

    if sys.argv[1:] == ["seq2seq"]:
        print(source_table(source_latency(progress=progress)))
    else:
        print(markdown_table(decode_latency(progress=progress)))
