"""Runtime decoder parity: ``genai.onnx`` (and ``transformers-js.onnx``), driven the way onnxruntime-genai
(and transformers.js) drive it, reproduces the full forward.

:data:`GENAI_PARITY` is the :class:`attnx.parity.check.ParityExtension` of exports that carry an
onnxruntime-genai or a transformers.js decoder (:data:`DECODERS`). For each verify length n, the
same prompts as decode parity (n + ``STEPS`` random ids, through the torch model's full forward
once) run on each requested ONNX Runtime backend (the runtimes' own): the first n ids after an empty
state (a length-0 KV cache, or a zero buffer where past and present share one; zero recurrent and conv
state) with ``position_ids`` (or ``attention_mask``, which genai's LFM2 contract takes instead), then one
id at a time with each step's ``present*`` outputs fed back as the inputs the manifest's section pairs
them with. Every position is compared with the full
forward by the one parity rule; the rows are named "<backend> genai" (or "<backend> transformers.js")
and read like decode parity's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.datatype import DataType

from attnx.decode.parity import DecodeCase, decode_cases, position_row
from attnx.decode.runtime import decode_section
from attnx.exporter.assemble import Assembly
from attnx.exporter.directory import ExportDir
from attnx.exporter.manifest import GenaiState
from attnx.parity.backends import Backend
from attnx.parity.check import Cases, Pending
from attnx.parity.report import BackendParity, Comparison
from attnx.parity.runners import ORT_NAMES, BackendSkipped, Graph
from attnx.serve.decoders import DECODERS
from attnx.serve.genai import ATTENTION_MASK, BATCH, POSITION_IDS
from attnx.serve.kv_buffer import BUFFER_AXIS
from attnx.variant import Tolerance

LOGITS, INPUT_IDS = "logits", "input_ids"


def empty_state(
    runner: BaseRunner, state: Sequence[GenaiState], batch: int, capacity: int, axis: str = BATCH
) -> dict[str, np.ndarray]:
    """A runtime's state before the first token: every state input zero, with its batch ``axis``
    ``batch``, a KV buffer that past and present share ``capacity`` positions long (genai's
    ``max_length``), its other symbolic dims 0 (a KV cache of length 0)."""
    sizes = {axis: batch, BUFFER_AXIS: capacity}
    empty = {}
    pasts = {s.past for s in state}
    for name, meta in runner.get_input_metadata().items():
        if name in pasts:
            shape = [d if isinstance(d, int) else sizes.get(d, 0) for d in meta.shape]
            empty[name] = np.zeros(shape, dtype=DataType.to_dtype(meta.dtype, "numpy"))
    return empty


def genai_positions(
    runner: BaseRunner,
    state: Sequence[GenaiState],
    run: DecodeCase,
    tolerance: Tolerance,
    axis: str = BATCH,
) -> list[Comparison]:
    """The prompt after an empty state, then one id per step; each position against the full forward."""
    batch, total = run.ids.shape
    feeds = {s.present: s.past for s in state}
    masked = ATTENTION_MASK in runner.get_input_metadata()  # genai's LFM2 contract (genai.position_input)
    carried, start, rows = empty_state(runner, state, batch, total, axis), 0, []
    for stop in [run.length, *range(run.length + 1, total + 1)]:
        if masked:
            positions = {ATTENTION_MASK: np.ones((batch, stop), dtype=np.int64)}
        else:
            ids = np.ascontiguousarray(np.broadcast_to(np.arange(start, stop), (batch, stop - start)))
            positions = {POSITION_IDS: ids}
        outputs = runner.infer({INPUT_IDS: run.ids[:, start:stop], **positions, **carried})
        what = "prefill logits" if start == 0 else f"logits @ {start}"
        rows.append(position_row(run.length, what, outputs[LOGITS], run.full[:, start:stop], tolerance))
        carried = {feeds[k]: v for k, v in outputs.items() if k in feeds}
        start = stop
    return rows


def decoders(export: ExportDir) -> list[str]:
    """The manifest sections of the runtime decoders ``export`` carries."""
    return [name for name in DECODERS if getattr(export.manifest, name) is not None]


class GenaiParity:
    """Checks the runtime decoders (``genai.onnx``, ``transformers-js.onnx``) against the full torch
    forward on the ONNX Runtime backends asked for."""

    def applies(self, export: ExportDir) -> bool:
        return bool(decoders(export))

    def reference(
        self, export: ExportDir, assembly: Assembly, backends: Sequence[Backend], cases: Cases
    ) -> Pending:
        """The full forward's logits now; one result per ONNX Runtime backend (genai runs nothing else)
        when the returned call runs."""
        if not any(b.name in ORT_NAMES.values() for b in backends):
            return lambda backends: []
        runs = decode_cases(decode_section(export), assembly, cases)
        return lambda backends: self._check(export, runs, backends, cases)

    def _check(
        self, export: ExportDir, runs: Sequence[DecodeCase], backends: Sequence[Backend], cases: Cases
    ) -> list[BackendParity]:
        results = []
        for section, backend in (
            (s, b) for s in decoders(export) for b in backends if b.name in ORT_NAMES.values()
        ):
            decoder = DECODERS[section]
            state = getattr(export.manifest, section).state
            graph = Graph(export, section, (), (), lambda: export.rebuild().module)
            label = f"{backend.name} {decoder.runtime}"
            reason = backend.unavailable(export)
            if reason:
                results.append(BackendParity(label, "skipped", reason))
                continue
            try:
                with backend.runner(graph, None) as runner:
                    comparisons = [
                        c
                        for run in runs
                        for c in genai_positions(runner, state, run, cases.tolerance, decoder.batch)
                    ]
            except BackendSkipped as exc:
                results.append(BackendParity(label, "skipped", str(exc)))
                continue
            status = "passed" if all(c.passed for c in comparisons) else "failed"
            results.append(BackendParity(label, status, comparisons=comparisons))
        return results


GENAI_PARITY = GenaiParity()
