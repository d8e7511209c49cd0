"""genai parity: ``genai.onnx``, driven the way onnxruntime-genai drives it, reproduces the full forward.

:data:`GENAI_PARITY` is the :class:`attnx.parity.check.ParityExtension` of exports that carry an
onnxruntime-genai decoder. For each verify length n, the same prompts as decode parity (n +
``STEPS`` random ids, through the torch model's full forward once) run on each requested ONNX
Runtime backend (genai's own runtime): the first n ids after an empty state (a length-0 KV cache,
zero recurrent and conv state) with ``position_ids``, then one id at a time with each step's
``present.*`` fed back as ``past_key_values.*``. Every position is compared with the full forward
by the one parity rule; the rows are named "<backend> genai" and read like decode parity's.
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
from attnx.parity.backends import Backend
from attnx.parity.check import Cases
from attnx.parity.report import BackendParity, Comparison
from attnx.parity.runners import ORT_NAMES, BackendSkipped, Graph
from attnx.serve.genai import PAST, POSITION_IDS, PRESENT
from attnx.variant import Tolerance

LOGITS, INPUT_IDS = "logits", "input_ids"
_PAST, _PRESENT = PAST.split("%")[0], PRESENT.split("%")[0]  # "past_key_values.", "present."


def empty_state(runner: BaseRunner, batch: int) -> dict[str, np.ndarray]:
    """genai's state before the first token: every ``past_key_values.*`` input zero, with its
    symbolic dims 0 (a KV cache of length 0) and its ``batch`` dim ``batch``."""
    state = {}
    for name, meta in runner.get_input_metadata().items():
        if name.startswith(_PAST):
            shape = [batch if d == "batch" else d if isinstance(d, int) else 0 for d in meta.shape]
            state[name] = np.zeros(shape, dtype=DataType.to_dtype(meta.dtype, "numpy"))
    return state


def genai_positions(runner: BaseRunner, run: DecodeCase, tolerance: Tolerance) -> list[Comparison]:
    """The prompt after an empty state, then one id per step; each position against the full forward."""
    batch, total = run.ids.shape
    state, start, rows = empty_state(runner, batch), 0, []
    for stop in [run.length, *range(run.length + 1, total + 1)]:
        positions = np.ascontiguousarray(np.broadcast_to(np.arange(start, stop), (batch, stop - start)))
        outputs = runner.infer({INPUT_IDS: run.ids[:, start:stop], POSITION_IDS: positions, **state})
        what = "prefill logits" if start == 0 else f"logits @ {start}"
        rows.append(position_row(run.length, what, outputs[LOGITS], run.full[:, start:stop], tolerance))
        state = {k.replace(_PRESENT, _PAST, 1): v for k, v in outputs.items() if k != LOGITS}
        start = stop
    return rows


class GenaiParity:
    """Checks ``genai.onnx`` against the full torch forward on the ONNX Runtime backends asked for."""

    def applies(self, export: ExportDir) -> bool:
        return export.manifest.genai is not None

    def check(
        self, export: ExportDir, assembly: Assembly, backends: Sequence[Backend], cases: Cases
    ) -> list[BackendParity]:
        """One result per ONNX Runtime backend among ``backends`` (genai runs nothing else)."""
        ort = [b for b in backends if b.name in ORT_NAMES.values()]
        if not ort:
            return []
        runs = decode_cases(decode_section(export), assembly, cases)
        graph = Graph(export, "genai", (), (), lambda: assembly.module)
        results = []
        for backend in ort:
            label = f"{backend.name} genai"
            reason = backend.unavailable(export)
            if reason:
                results.append(BackendParity(label, "skipped", reason))
                continue
            try:
                with backend.runner(graph, None) as runner:
                    comparisons = [c for run in runs for c in genai_positions(runner, run, cases.tolerance)]
            except BackendSkipped as exc:
                results.append(BackendParity(label, "skipped", str(exc)))
                continue
            status = "passed" if all(c.passed for c in comparisons) else "failed"
            results.append(BackendParity(label, status, comparisons=comparisons))
        return results


GENAI_PARITY = GenaiParity()
