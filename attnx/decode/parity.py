"""Decode parity: prefill + one-token steps reproduce the full forward at every position.

:data:`DECODE_PARITY` is the :class:`attnx.parity.check.ParityExtension` of decode exports. For
each prompt length n (the verify ``seq_lens``), random ids of length n + :data:`STEPS` (after a
random source of n + 2 tokens with a random padding mask, for seq2seq) go through the torch
model's full forward once; each backend then runs prefill on the first n ids and decodes the
remaining ones token by token. Every position is compared with the full forward's logits at that
position by the one parity rule: one row for the prompt ("prefill logits") and one per decoded
token ("logits @ p", p counted from 0).

Backends: "torch decode" (the stateful torch modules, checking the decode machinery itself) and
"<backend> decode" for each backend the check was asked for (prefill.onnx + decode.onnx).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from attnx.decode.module import full_inputs
from attnx.decode.runtime import Stepper, decode_graphs, decode_section
from attnx.exporter.assemble import Assembly
from attnx.exporter.directory import ExportDir
from attnx.exporter.inputs import random_feed
from attnx.exporter.manifest import DecodeSection
from attnx.exporter.module import ModuleAssembly
from attnx.parity.backends import BACKENDS, REFERENCE, Backend
from attnx.parity.check import Cases, Pending
from attnx.parity.report import BackendParity, Comparison
from attnx.parity.rule import compare
from attnx.parity.runners import BackendSkipped, Graph
from attnx.variant import Tolerance

STEPS = 4


@dataclasses.dataclass(frozen=True)
class DecodeCase:
    """One prompt length: ``ids`` (prompt + :data:`STEPS` tokens), the seq2seq ``source`` feed and
    ``full``, the torch model's logits over all of ``ids`` (float32)."""

    length: int
    ids: np.ndarray
    source: dict[str, np.ndarray]
    full: np.ndarray


def decode_cases(
    section: DecodeSection, assembly: Assembly | ModuleAssembly, cases: Cases
) -> list[DecodeCase]:
    """A :class:`DecodeCase` per verify length, each through the torch model's full forward once (a
    language model's inputs beside the token ids as their omission stands for: :func:`full_inputs`).

    The forwards run once per model and ``cases``: decode parity and the runtime decoders' parity
    (:mod:`attnx.serve.genai_parity`) compare with the same ones, so they share one copy of the logits
    (at real size, hundreds of MB, and a forward of the model at each length)."""
    made = _MADE.setdefault(assembly.module, {})
    if cases not in made:
        made[cases] = _full_forwards(section, assembly, cases)
    return made[cases]


_MADE: weakref.WeakKeyDictionary[nn.Module, dict[Cases, list[DecodeCase]]] = weakref.WeakKeyDictionary()
"""The runs :func:`decode_cases` made, per torch model (dropped with it) and cases."""


def _full_forwards(
    section: DecodeSection, assembly: Assembly | ModuleAssembly, cases: Cases
) -> list[DecodeCase]:
    rng = np.random.default_rng(cases.seed + 1)
    source_specs = section.prefill.inputs[:-1]  # seq2seq: source ids and mask
    runs = []
    for n in cases.seq_lens:
        ids = rng.integers(0, section.vocab_size, size=(cases.batch, n + STEPS))
        source = random_feed(source_specs, {"batch": cases.batch, "src_seq": n + 2}, rng)
        if source:  # seq2seq: the source, the target ids and their mask (every target token is real)
            target = [torch.from_numpy(ids), torch.ones(ids.shape, dtype=torch.bool)]
            args = [*(torch.from_numpy(a) for a in source.values()), *target]
        else:
            args = full_inputs(assembly.inputs, ids)
        with torch.inference_mode():
            full = assembly.module(*args)[0]  # the logits (a module export's first output)
        runs.append(DecodeCase(n, ids, source, full.float().numpy()))
    return runs


def position_row(
    length: int, what: str, actual: np.ndarray, expected: np.ndarray, tolerance: Tolerance
) -> Comparison:
    """The report row of one prefill ("prefill logits") or decoded position ("logits @ p")."""
    return Comparison(length, what, *dataclasses.astuple(compare(actual, expected, tolerance)))


class DecodeParity:
    """Checks ``prefill.onnx`` + ``decode.onnx`` against the full torch forward."""

    def applies(self, export: ExportDir) -> bool:
        return export.manifest.decode is not None

    def reference(
        self, export: ExportDir, assembly: Assembly, backends: Sequence[Backend], cases: Cases
    ) -> Pending:
        """The full forward's logits and "torch decode" (and any backend that loads the weights) now; the
        others, named "<backend> decode", when the returned call runs."""
        section = decode_section(export)
        runs = decode_cases(section, assembly, cases)
        loaded = [BACKENDS[REFERENCE], *(b for b in backends if b.loads_weights)]
        ran = [
            _backend_decode(b, export, section, runs, cases, decode_graphs(export, assembly)) for b in loaded
        ]

        def others(backends: Sequence[Backend]) -> list[BackendParity]:
            graphs = decode_graphs(export)
            return ran + [_backend_decode(b, export, section, runs, cases, graphs) for b in backends]

        return others


def _backend_decode(
    backend: Backend,
    export: ExportDir,
    section: DecodeSection,
    runs: Sequence[DecodeCase],
    cases: Cases,
    graphs: tuple[Graph, Graph],
) -> BackendParity:
    """``backend``'s prefill + decode steps of every run against the full forward, one session at a time."""
    label = f"{backend.name} decode"
    reason = backend.unavailable(export) if "decode" in backend.graphs else "runs model.onnx only"
    if reason:
        return BackendParity(label, "skipped", reason)
    try:
        runners = backend.runner(graphs[0], None), backend.runner(graphs[1], None)
        with Stepper(section, *runners, one_at_a_time=True) as stepper:
            comparisons = _positions(stepper, runs, cases.tolerance)
    except BackendSkipped as exc:
        return BackendParity(label, "skipped", str(exc))
    status = "passed" if all(c.passed for c in comparisons) else "failed"
    return BackendParity(label, status, comparisons=comparisons)


def _positions(stepper: Stepper, runs: Sequence[DecodeCase], tolerance: Tolerance) -> list[Comparison]:
    """Prefill each run on ids[:, :n] (after the source), then decode the rest; each position against the
    full forward's logits. Every prefill runs first, then every decode step: one graph's session at a
    time."""
    rows: dict[int, list[Comparison]] = {}
    states = []
    for run in runs:
        logits, state = stepper.prefill(run.ids[:, : run.length], run.source)
        rows[run.length] = [
            position_row(run.length, "prefill logits", logits, run.full[:, : run.length], tolerance)
        ]
        states.append(state)
    for run, state in zip(runs, states, strict=True):
        for position in range(run.length, run.ids.shape[1]):
            logits, state = stepper.decode(run.ids[:, position : position + 1], state)
            expected = run.full[:, position : position + 1]
            rows[run.length].append(
                position_row(run.length, f"logits @ {position}", logits, expected, tolerance)
            )
    return [row for run in runs for row in rows[run.length]]


DECODE_PARITY = DecodeParity()
