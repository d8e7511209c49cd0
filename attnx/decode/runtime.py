"""Run a decode export's two graphs on ONNX Runtime or torch, state in and state out.

A :class:`Stepper` hides the backend: ``prefill(ids[, source])`` and ``decode(ids, state)``
both return the logits and the next state, a dict keyed by the decode graph's input names
(``past_length``, ``past.<layer>.<name>``), filled from the outputs the manifest's
``decode.state`` pairs with them, plus the ``decode.context`` inputs (seq2seq: the cached
cross-attention keys/values, or the encoder output, and the source mask), which stay as
prefill made or took them. Nothing here knows which variant or model it drives: the
manifest entry is the whole contract, checked on opening (:func:`check_entry`) and
against the graphs' own inputs, so a malformed or mismatched export fails with one line.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnx.decode.export import graph_specs, state_map
from attnx.decode.model import LOGITS
from attnx.errors import AttnxError, unknown_choice
from attnx.exporter.manifest import WEIGHTS_FILE, Manifest, sha256_file

State = dict[str, np.ndarray]
BACKENDS = ("ort", "torch")


def decode_entry(directory: Path, manifest: Manifest) -> dict[str, Any]:
    """The manifest's decode description, once its files are checked.

    Raises:
        AttnxError: the export has no decode graphs, one of them is missing, or the entry is malformed.
    """
    entry = manifest.decode
    if not entry:
        raise AttnxError(
            f"'{directory}' has no decode export (prefill.onnx + decode.onnx); "
            "re-export with `attnx export --model lm --decode`"
        )
    check_entry(entry)
    for name in entry["files"].values():
        if not (directory / name).is_file():
            raise AttnxError(f"'{directory}' lacks {name}; re-export with `attnx export --decode`")
    return entry


ENTRY_KEYS = ("files", "mode", "tokens", "prefill", "decode", "state", "context")
CONTEXT_SOURCES = {"prefill output": "outputs", "prefill input": "inputs"}


def _malformed(why: str) -> AttnxError:
    return AttnxError(f"attnx.json's decode entry is malformed: {why}; re-export with attnx export --decode")


def check_entry(entry: dict[str, Any]) -> None:
    """Check that a manifest's decode entry describes a loop a runtime can drive.

    Every decode input must be the token input, a state input or a context input; each state
    output must come out of both graphs; each context input must be a prefill output or input.

    Raises:
        AttnxError: a missing key, or names that do not connect (one line naming them).
    """
    missing = [key for key in ENTRY_KEYS if key not in entry]
    if missing:
        raise _malformed(f"no {', '.join(repr(k) for k in missing)}")
    try:
        names = {
            (graph, side): {spec["name"] for spec in entry[graph][side]}
            for graph in ("prefill", "decode")
            for side in ("inputs", "outputs")
        }
        states = [(state["output"], state["input"]) for state in entry["state"]]
        context = [(c["input"], c["from"]) for c in entry["context"]]
        fed = {entry["tokens"]} | {name for _, name in states} | {name for name, _ in context}
    except (KeyError, TypeError):
        raise _malformed("its inputs/outputs, state and context need name/input/output/from fields") from None
    if entry["tokens"] not in names["prefill", "inputs"]:
        raise _malformed(f"the token input {entry['tokens']!r} is not a prefill input")
    if fed != names["decode", "inputs"]:
        unfed, extra = sorted(names["decode", "inputs"] - fed), sorted(fed - names["decode", "inputs"])
        raise _malformed(f"decode inputs not fed by tokens/state/context: {unfed}; fed, not inputs: {extra}")
    outputs = names["prefill", "outputs"] & names["decode", "outputs"]
    for output in [LOGITS, *(output for output, _ in states)]:
        if output not in outputs:
            raise _malformed(f"{output!r} is not an output of both graphs")
    for name, source in context:
        side = CONTEXT_SOURCES.get(source)
        if side is None or name not in names["prefill", side]:
            raise _malformed(f"context input {name!r} is not a {source!r} (one of {list(CONTEXT_SOURCES)})")


class Stepper(abc.ABC):
    """Prefill and decode calls of one export on one backend."""

    def __init__(self, entry: dict[str, Any]) -> None:
        check_entry(entry)
        self.feeds = state_map(entry)
        self.tokens = entry["tokens"]
        self.context = [c["input"] for c in entry["context"]]
        self.prefill_inputs = [s.name for s in graph_specs(entry, "prefill", "inputs")]
        self.decode_inputs = [s.name for s in graph_specs(entry, "decode", "inputs")]
        self.prefill_outputs = [s.name for s in graph_specs(entry, "prefill", "outputs")]
        self.decode_outputs = [s.name for s in graph_specs(entry, "decode", "outputs")]

    def prefill(self, input_ids: np.ndarray, source: State | None = None) -> tuple[np.ndarray, State]:
        """Logits (batch, n, vocab) of a prompt (batch, n) and the state after it.

        ``source``: a seq2seq model's ``input_ids`` and ``attention_mask`` (batch, src_seq).
        """
        feed = {self.tokens: input_ids, **(source or {})}
        outputs = self._run("prefill", feed)
        context = {name: outputs[name] if name in outputs else feed[name] for name in self.context}
        return self._split(outputs, context)

    def decode(self, input_ids: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """Logits (batch, 1, vocab) of one more token per row (batch, 1) and the state after it."""
        outputs = self._run("decode", {self.tokens: input_ids, **state})
        return self._split(outputs, {name: state[name] for name in self.context})

    def _split(self, outputs: dict[str, np.ndarray], context: State) -> tuple[np.ndarray, State]:
        return outputs[LOGITS], {
            **context,
            **{self.feeds[k]: v for k, v in outputs.items() if k in self.feeds},
        }

    @abc.abstractmethod
    def _run(self, graph: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run graph "prefill" or "decode" on ``feed`` (input name -> array); outputs by name."""


class OrtStepper(Stepper):
    """ONNX Runtime sessions of ``prefill.onnx`` and ``decode.onnx``."""

    def __init__(
        self,
        directory: Path,
        entry: dict[str, Any],
        providers: Sequence[str] = ("CPUExecutionProvider",),
        threads: int | None = None,
    ) -> None:
        import onnxruntime

        super().__init__(entry)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        self.sessions = {
            graph: onnxruntime.InferenceSession(str(directory / name), options, providers=list(providers))
            for graph, name in entry["files"].items()
        }
        for graph, session in self.sessions.items():
            declared = self.prefill_inputs if graph == "prefill" else self.decode_inputs
            _check_inputs(directory / entry["files"][graph], [i.name for i in session.get_inputs()], declared)

    def _run(self, graph: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self.sessions[graph]
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feed), strict=True))


class TorchStepper(Stepper):
    """The same two computations in torch (:class:`attnx.decode.model.StepModel`) on CPU."""

    def __init__(self, assembly: Any, entry: dict[str, Any]) -> None:
        from attnx.decode.model import DecodeLayout, StepModel

        super().__init__(entry)
        layout = DecodeLayout.of(assembly.module, entry["mode"])
        for with_past, declared in ((False, self.prefill_inputs), (True, self.decode_inputs)):
            graph = "decode" if with_past else "prefill"
            _check_inputs(f"the torch {graph} graph", [s.name for s in layout.inputs(with_past)], declared)
        self.models = {
            "prefill": StepModel(assembly.module, layout, False),
            "decode": StepModel(assembly.module, layout, True),
        }

    def _run(self, graph: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        inputs = self.prefill_inputs if graph == "prefill" else self.decode_inputs
        outputs = self.prefill_outputs if graph == "prefill" else self.decode_outputs
        args = [torch.from_numpy(np.ascontiguousarray(feed[name])) for name in inputs]
        with torch.inference_mode():
            results = self.models[graph](*args)
        return {name: r.numpy() for name, r in zip(outputs, results, strict=True)}


def _check_inputs(graph: Any, actual: Sequence[str], declared: Sequence[str]) -> None:
    """Refuse a graph whose inputs are not the ones the manifest says a runtime feeds it."""
    if set(actual) != set(declared):
        lacks, extra = sorted(set(declared) - set(actual)), sorted(set(actual) - set(declared))
        raise AttnxError(
            f"{graph} and attnx.json disagree on its inputs (listed, not taken: {lacks}; taken, not "
            f"listed: {extra}); re-export with `attnx export --decode`"
        )


def open_stepper(
    out: str | Path, backend: str = "ort", threads: int | None = None
) -> tuple[Stepper, Manifest]:
    """The stepper of export ``out`` on ``backend`` ("ort": ONNX Runtime CPU, "torch": the rebuilt model).

    Raises:
        AttnxError: not a decode export, changed weights, or an unknown backend.
    """
    if backend not in BACKENDS:
        raise unknown_choice("backend", backend, BACKENDS)
    directory = Path(out)
    manifest = Manifest.read(directory)
    entry = decode_entry(directory, manifest)
    if backend == "ort":
        return OrtStepper(directory, entry, threads=threads), manifest
    from attnx.exporter.assemble import rebuild

    weights = directory / WEIGHTS_FILE
    if not weights.is_file() or sha256_file(weights) != manifest.weights_sha256:
        raise AttnxError(f"{weights} is missing or does not match the manifest's weights hash; re-export")
    return TorchStepper(rebuild(manifest, weights), entry), manifest
