"""The accuracy report of an optimised export: its outputs against the float32 torch model's.

Per output: the largest absolute error and the largest reference magnitude (``scale``); the relative
error is their ratio (an elementwise ratio would blow up at a reference near 0). For a language
model (an output named ``logits``), the next-token top-1 agreement: how often the optimised graph's
most likely next token equals the torch model's, over every position of random prompts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnx.atomic import write_atomic
from attnx.exporter.assemble import Assembly
from attnx.exporter.directory import ExportDir
from attnx.parity.backends import backends
from attnx.parity.check import Cases, infer
from attnx.parity.runners import Graph, TorchRunner

ACCURACY_FILE = "accuracy.json"
LOGITS = "logits"
PROMPT_LENGTHS = (7, 16, 32, 33)  # random prompts of these lengths, ``batch`` of each
PROMPT_BATCH = 4


@dataclasses.dataclass
class OutputError:
    """One output of model.onnx against the float32 torch model, over every prompt."""

    output: str
    max_abs: float
    scale: float  # max |reference|

    @property
    def rel(self) -> float:
        return self.max_abs / self.scale if self.scale > 0 else (0.0 if self.max_abs == 0 else float("inf"))


@dataclasses.dataclass
class AccuracyReport:
    """How far an optimised export is from the float32 torch model, and the limits it is held to:
    ``error_bound`` (the transformation's), ``max_rel_error`` and ``min_top1`` (the user's; None: unset)."""

    steps: list[str]
    error_bound: float
    prompts: int
    seed: int
    outputs: list[OutputError]
    top1: float | None = None  # next-token agreement (language models)
    tokens: int = 0  # positions the agreement counts
    max_rel_error: float | None = None
    min_top1: float | None = None

    @property
    def rel_error(self) -> float:
        return max((o.rel for o in self.outputs), default=0.0)

    def failures(self) -> list[str]:
        """One line per limit the export misses (empty: it passed)."""
        problems = []
        bounds = (("the transformation's bound", self.error_bound), ("--max-rel-error", self.max_rel_error))
        for name, bound in bounds:
            if bound is not None and not self.rel_error <= bound:
                problems.append(f"relative output error {self.rel_error:.3g} exceeds {name} {bound:g}")
        if self.min_top1 is not None and self.top1 is not None and self.top1 < self.min_top1:
            problems.append(f"top-1 agreement {self.top1:.1%} is below --min-top1 {self.min_top1:g}")
        return problems

    @property
    def passed(self) -> bool:
        return not self.failures()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for row, output in zip(data["outputs"], self.outputs, strict=True):
            row["rel"] = output.rel
        return {"passed": self.passed, "rel_error": self.rel_error, **data, "failures": self.failures()}

    def write(self, directory: Path) -> None:
        """``directory/accuracy.json``, atomically."""
        write_atomic(Path(directory) / ACCURACY_FILE, json.dumps(self.to_dict(), indent=2) + "\n")


def measure(
    export: ExportDir, reference: Assembly, steps: Sequence[str], error_bound: float, seed: int
) -> AccuracyReport:
    """Run ``export``'s model.onnx in ONNX Runtime (CPU) and the float32 ``reference`` on the same random
    prompts (:data:`PROMPT_LENGTHS` x :data:`PROMPT_BATCH`) and compare them."""
    cases = Cases.make(export, PROMPT_LENGTHS, PROMPT_BATCH, seed=seed)
    feeds = cases.feeds(export.manifest.inputs)
    graph = Graph.of_model(export, reference.module)
    expected = infer(TorchRunner(reference.module, graph.inputs, graph.outputs), feeds)
    (ort,) = backends(["ort-cpu"])
    actual = infer(ort.runner(graph, None), feeds)
    outputs = []
    for spec in graph.outputs:
        got = [np.asarray(a[spec.name], dtype=np.float64) for a in actual]
        want = [np.asarray(e[spec.name], dtype=np.float64) for e in expected]
        max_abs = max(float(np.abs(g - w).max(initial=0.0)) for g, w in zip(got, want, strict=True))
        outputs.append(OutputError(spec.name, max_abs, max(float(np.abs(w).max(initial=0.0)) for w in want)))
    report = AccuracyReport(list(steps), error_bound, len(feeds) * cases.batch, cases.seed, outputs)
    if any(spec.name == LOGITS for spec in graph.outputs):
        pairs = zip(actual, expected, strict=True)
        same = [np.argmax(a[LOGITS], -1) == np.argmax(e[LOGITS], -1) for a, e in pairs]
        report.tokens = sum(s.size for s in same)
        report.top1 = float(sum(s.sum() for s in same)) / report.tokens
    return report
