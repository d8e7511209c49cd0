"""The accuracy report of an optimised export: its outputs against the float32 torch model's.

Per output, over random prompts: the largest absolute error and the largest reference magnitude
(``scale``); the relative error is their ratio (an elementwise ratio would blow up at a reference near 0).
A language model (``input_ids`` in, ``logits`` out) also reads a fixed text (:mod:`attnx.optimizer.text`):
the KL divergence of its next-token distributions from the float32 model's, their top-1 agreement and
both perplexities. That is its gate (``max_kl``, ``min_top1``; defaults per step in
:data:`attnx.optimizer.settings.TEXT_BOUNDS`); the relative error gates the other models, and every model
when the user sets ``max_rel_error``. A decode export also decodes greedily beside its float32 source
(:mod:`attnx.optimizer.longdecode`); after the exact steps (fp16, slim, fuse) its tokens must stay the
float32 ones up to a tie.
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
from attnx.optimizer.longdecode import LongDecode
from attnx.optimizer.settings import TEXT_BOUNDS
from attnx.optimizer.text import LOGITS, EvaluationText, TextQuality, measure_text
from attnx.parity.backends import backends
from attnx.parity.check import Cases, infer
from attnx.parity.runners import Graph, TorchRunner

ACCURACY_FILE = "accuracy.json"
PROMPT_LENGTHS = (7, 16, 32, 33)  # random prompts of these lengths, ``batch`` of each
PROMPT_BATCH = 4
EXACT_STEPS = ("fp16", "slim", "fuse")  # their long decode keeps the float32 tokens up to a tie


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
    ``error_bound`` (the transformation's relative error), ``max_kl`` and ``min_top1`` (the text gate of a
    language model: the steps' defaults unless the user set them), ``max_rel_error`` (the user's; None:
    unset)."""

    steps: list[str]
    error_bound: float
    prompts: int
    seed: int
    outputs: list[OutputError]
    text: TextQuality | None = None  # a language model's quality on the text
    decode: LongDecode | None = None  # a decode export's long greedy decode beside the float32 one
    max_kl: float | None = None
    min_top1: float | None = None
    max_rel_error: float | None = None

    @property
    def rel_error(self) -> float:
        return max((o.rel for o in self.outputs), default=0.0)

    def failures(self) -> list[str]:
        """One line per limit the export misses (empty: it passed)."""
        problems = []
        bounds = [("--max-rel-error", self.max_rel_error)]
        if self.text is None:
            bounds.insert(0, ("the transformation's bound", self.error_bound))
        for name, bound in bounds:
            if bound is not None and not self.rel_error <= bound:
                problems.append(f"relative output error {self.rel_error:.3g} exceeds {name} {bound:g}")
        text = self.text
        if text is not None and self.max_kl is not None and not text.kl <= self.max_kl:
            problems.append(f"KL divergence {text.kl:.3g} on the text exceeds --max-kl {self.max_kl:g}")
        if text is not None and self.min_top1 is not None and not text.top1 >= self.min_top1:
            problems.append(
                f"top-1 agreement {text.top1:.1%} on the text is below --min-top1 {self.min_top1:g}"
            )
        decode = self.decode
        exact = set(self.steps) <= set(EXACT_STEPS)
        if exact and decode is not None and decode.first_difference is not None and not decode.tie:
            problems.append(
                f"greedy decode leaves the float32 export's tokens at step {decode.first_difference} (its "
                f"top two logits {decode.gap:.3g} apart: more than the step's own error)"
            )
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


def text_bounds(steps: Sequence[str]) -> tuple[float, float]:
    """The default text gate of ``steps`` taken together: the loosest KL and top-1 bounds among them."""
    return max(TEXT_BOUNDS[s][0] for s in steps), min(TEXT_BOUNDS[s][1] for s in steps)


def measure(
    export: ExportDir,
    reference: Assembly,
    steps: Sequence[str],
    error_bound: float,
    seed: int,
    text: EvaluationText | None = None,
) -> AccuracyReport:
    """Run ``export``'s model.onnx in ONNX Runtime (CPU) and the float32 ``reference`` on the same random
    prompts (:data:`PROMPT_LENGTHS` x :data:`PROMPT_BATCH`) and compare them; a language model also on
    ``text`` (:func:`attnx.optimizer.text.text_rows`)."""
    cases = Cases.make(export, PROMPT_LENGTHS, PROMPT_BATCH, seed=seed)
    feeds = cases.feeds(export.manifest.inputs)
    graph = Graph.of_model(export, reference.module, many_runs=True)
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
    if text is not None:
        torch_runner = TorchRunner(reference.module, graph.inputs, graph.outputs)
        ort_runner = ort.runner(graph, None)
        with torch_runner, ort_runner:
            report.text = measure_text(
                text,
                graph.inputs,
                lambda feed: torch_runner.infer(feed)[LOGITS],
                lambda feed: ort_runner.infer(feed)[LOGITS],
            )
    return report
