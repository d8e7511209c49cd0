"""Decode parity: prefill + one-token steps reproduce the full forward at every position.

For each prompt length n (the verify ``seq_lens``), random ids of length n + :data:`STEPS`
(after a random source of n + 2 tokens with a random padding mask, for seq2seq) go through
the torch model's full forward once; each backend then runs prefill on the
first n ids and decodes the remaining ones token by token. Every position is compared
with the full forward's logits at that position: one row for the prompt ("prefill
logits") and one per decoded token ("logits @ p", p counted from 0), with the same
element-wise rule as the model check, |a - b| <= atol + rtol |b|.

Backends: "torch decode" (the stateful torch modules, checking the decode machinery
itself) and "<ort backend> decode" (prefill.onnx + decode.onnx on ONNX Runtime).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnx.decode.export import graph_specs
from attnx.decode.runtime import OrtStepper, Stepper, TorchStepper, decode_entry
from attnx.parity.inputs import random_feed

STEPS = 4
ORT_PROVIDERS = {"ort-cpu": "CPUExecutionProvider", "ort-cuda": "CUDAExecutionProvider"}


def decode_parity(
    directory: Path,
    manifest: Any,
    assembly: Any,
    backends: Sequence[str],
    seq_lens: Sequence[int],
    batch: int,
    atol: float,
    rtol: float,
    seed: int,
) -> list[Any]:
    """One :class:`attnx.parity.verify.BackendParity` per backend, named "<backend> decode"."""
    import torch

    from attnx.parity.runners import BACKENDS
    from attnx.parity.verify import BackendParity

    entry = decode_entry(Path(directory), manifest)
    rng = np.random.default_rng(seed + 1)
    vocab = int(manifest.model_config["vocab_size"])
    source_specs = graph_specs(entry, "prefill", "inputs")[:-1]  # seq2seq: source ids and mask
    cases = []
    for n in seq_lens:
        ids = rng.integers(0, vocab, size=(batch, n + STEPS))
        source = random_feed(source_specs, {"batch": batch, "src_seq": n + 2}, rng)
        args = [torch.from_numpy(a) for a in source.values()] + [torch.from_numpy(ids)]
        if source:
            args.append(torch.ones(ids.shape, dtype=torch.bool))  # every target token is real
        with torch.inference_mode():
            (full,) = assembly.module(*args)
        cases.append((n, ids, source, full.float().numpy()))
    steppers: list[tuple[str, Stepper | str]] = [("torch decode", TorchStepper(assembly, entry))]
    for name in backends:
        if name not in ORT_PROVIDERS:
            steppers.append(
                (f"{name} decode", "decode graphs are checked on ONNX Runtime (ort-cpu, ort-cuda)")
            )
            continue
        providers = list(dict.fromkeys([ORT_PROVIDERS[name], "CPUExecutionProvider"]))
        reason = BACKENDS[name].unavailable(directory)
        steppers.append((f"{name} decode", reason or OrtStepper(Path(directory), entry, providers)))
    results = []
    for label, stepper in steppers:
        if isinstance(stepper, str):
            results.append(BackendParity(label, "skipped", stepper))
            continue
        comparisons = [c for case in cases for c in _compare_positions(stepper, *case, atol, rtol)]
        status = "passed" if all(c.passed for c in comparisons) else "failed"
        results.append(BackendParity(label, status, comparisons=comparisons))
    return results


def _compare_positions(
    stepper: Stepper,
    n: int,
    ids: np.ndarray,
    source: dict[str, np.ndarray],
    full: np.ndarray,
    atol: float,
    rtol: float,
) -> list[Any]:
    """Prefill on ids[:, :n] (after ``source``), then decode the rest; compare each position with ``full``."""
    logits, state = stepper.prefill(ids[:, :n], source)
    rows = [_comparison(n, "prefill logits", logits, full[:, :n], atol, rtol)]
    for position in range(n, ids.shape[1]):
        logits, state = stepper.decode(ids[:, position : position + 1], state)
        label = f"logits @ {position}"
        rows.append(_comparison(n, label, logits, full[:, position : position + 1], atol, rtol))
    return rows


def _comparison(
    n: int, label: str, actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float
) -> Any:
    from attnx.parity.verify import Comparison, max_errors

    diff = np.abs(actual.astype(np.float64) - expected)
    passed = bool(np.all(diff <= atol + rtol * np.abs(expected))) and actual.shape == expected.shape
    return Comparison(n, label, *max_errors(actual, expected), passed)
