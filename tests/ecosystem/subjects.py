"""The graphs the ecosystem matrix runs the tools on, derived from the registered variants.

Every variant's tiny encoder (``model.onnx``, function lowering and decomposed; a causal-only variant's
decomposed lm instead), a causal variant's
tiny lm (with ``prefill.onnx`` + ``decode.onnx`` when it decodes), and the graphs of one ``attnx optimize
--slim`` output. Exports are made on first use, once per test process (:func:`tests.models.exports.
tiny_export`, shared with the model tests).
"""

from __future__ import annotations

import atexit
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import attnx
from attnx.exporter.directory import ExportDir
from attnx.exporter.inputs import random_feed
from tests.models.cases import REGISTERED, capabilities
from tests.models.exports import same_worker, tiny_export

BATCH, SEQ = 2, 9


@dataclasses.dataclass(frozen=True)
class Subject:
    """One graph of one export: ``graph`` is its manifest file key (model, prefill, decode)."""

    variant: str
    model: str
    graph: str
    lowering: str = "function"
    optimized: bool = False

    @property
    def id(self) -> str:
        kind = "optimized-" if self.optimized else ""
        lowering = "" if self.lowering == "function" else f"-{self.lowering}"
        return f"{kind}{self.variant}-{self.model}{lowering}-{self.graph}"

    @property
    def decodes(self) -> bool:
        return self.model == "lm" and capabilities(self.variant).decode is not None

    @property
    def options(self) -> dict[str, Any]:
        """``tiny_export``'s options for the export that holds this graph (an optimized graph: the export
        it was optimized from)."""
        return {"export.decode": True} if self.decodes else {}

    def same_worker(self) -> pytest.MarkDecorator:
        """The group of the tests that use this graph's export (the model tests' too)."""
        return same_worker(self.variant, self.model, self.lowering, **self.options)

    def export(self) -> ExportDir:
        """The export holding this graph, made on first use."""
        made = tiny_export(self.variant, self.model, lowering=self.lowering, **self.options).out
        return ExportDir.open(optimized(made) if self.optimized else made)


def in_default_run(subject: Subject) -> bool:
    """Whether the default run gives every tool this graph (``-m slow``: every graph). One export per
    variant: its function-lowered encoder, or a causal-only variant's decomposed lm; the lm graphs (model,
    prefill, decode) of the first variant of each kind of decode state; the optimized graphs. So every
    variant, both lowerings, every graph kind and every kind of state meet every tool; the exports, not
    the tools, are what the matrix spends its time on."""
    caps = capabilities(subject.variant)
    if subject.optimized:
        return True
    if subject.model == "encoder":
        return subject.lowering == "function"
    if subject.lowering == "decomposed":
        return not caps.bidirectional
    first = next(v for v in REGISTERED if capabilities(v).decode == caps.decode)
    return caps.decode is not None and subject.variant == first


def subjects() -> list[Subject]:
    found = []
    for variant in REGISTERED:
        model = "encoder" if capabilities(variant).bidirectional else "lm"  # causal-only rules: no encoder
        found += [Subject(variant, model, "model", "decomposed")]
        if model == "encoder":
            found.append(Subject(variant, "encoder", "model"))
        if capabilities(variant).causal:
            graphs = ("model", "prefill", "decode") if capabilities(variant).decode else ("model",)
            found += [Subject(variant, "lm", graph) for graph in graphs]
    decoder = next(v for v in REGISTERED if capabilities(v).decode)
    found += [Subject(decoder, "lm", graph, optimized=True) for graph in ("model", "prefill", "decode")]
    return found


_optimized: dict[Path, Path] = {}


def optimized(source: Path) -> Path:
    """``attnx optimize SOURCE --slim`` into a temporary directory, made on first use."""
    if source not in _optimized:
        root = Path(tempfile.mkdtemp(prefix="attnx-test-optimized-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        result = attnx.optimize(source, root / "out", slim=True, seed=0, decode_tokens=0)
        assert result.passed, result.report
        _optimized[source] = result.out
    return _optimized[source]


def feed(export: ExportDir, graph: str, run) -> dict[str, np.ndarray]:
    """Inputs of ``graph``: random ids and masks for model.onnx and prefill.onnx; a decode step after a
    prefill (its state and context as prefill made them, ``run(graph, feed)`` runs the fp32 graph)."""
    rng = np.random.default_rng(0)
    sizes = {"batch": BATCH, "seq": SEQ, "src_seq": SEQ, "tgt_seq": SEQ}
    manifest = export.manifest
    if graph == "model":
        return random_feed(manifest.inputs, sizes, rng)
    section = manifest.decode
    prompt = random_feed(section.prefill.inputs, sizes, rng)
    if graph == "prefill":
        return prompt
    made = run("prefill", prompt)
    step = random_feed(
        [s for s in section.decode.inputs if s.name == section.tokens], {**sizes, "seq": 1}, rng
    )
    step.update({pair.input: made[pair.output] for pair in section.state})
    for context in section.context:
        step[context.input] = (
            made[context.input] if context.source == "prefill output" else prompt[context.input]
        )
    return step
