"""Run a decode export's two graphs on any backend, state in and state out.

A :class:`Stepper` drives ``prefill`` and ``decode`` runners made by the one backend table
(:mod:`attnx.parity.backends`): ``prefill(ids[, source])`` and ``decode(ids, state)`` both
return the logits and the next state, a dict keyed by the decode graph's input names
(``past_length``, ``past.<layer>.<name>``), filled from the outputs the manifest's decode
section pairs with them, plus its ``context`` inputs (seq2seq: the cached cross-attention
keys/values, or the encoder output, and the source mask), which stay as prefill made or took
them. Nothing here knows which variant or model it drives: the manifest's decode section is
the whole contract, checked when the export is opened and against the graphs' own inputs.

On ONNX Runtime the stepper runs each decode step through IO binding: the state and context tensors are
``OrtValue``s that stay where the decode session made them (its device) from one step to the next, and
only the logits come back as NumPy arrays; a prefill's outputs, and a torch backend's, are NumPy arrays.
A caller treats the state as opaque: it passes what one call returned to the next (:func:`state_bytes`
sizes it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from polygraphy.backend.base import BaseRunner

from attnx.decode.export import layout_of, step_model
from attnx.decode.model import LOGITS
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.manifest import DecodeSection, GraphIO
from attnx.parity.backends import BACKENDS, backends
from attnx.parity.runners import BackendSkipped, Graph, OrtRunner

State = dict[str, Any]
"""Decode input name -> a NumPy array, or an ``OrtValue`` on an ONNX Runtime backend."""


def decode_section(export: ExportDir) -> DecodeSection:
    """The export's decode section.

    Raises:
        AttnxError: the export has no decode graphs.
    """
    if export.manifest.decode is None:
        raise AttnxError(
            f"'{export.path}' has no decode export (prefill.onnx + decode.onnx); "
            "re-export with `attnx export --model lm --decode`"
        )
    return export.manifest.decode


def decode_graphs(export: ExportDir, assembly: Any = None, many_runs: bool = False) -> tuple[Graph, Graph]:
    """The prefill and decode graphs of ``export``; their torch modules wrap ``assembly`` (default:
    the model rebuilt from the export, once, on first use); ``many_runs``: see :class:`Graph`."""
    section = decode_section(export)
    built = functools.cache(lambda: assembly if assembly is not None else export.rebuild())
    layout = functools.cache(lambda: layout_of(built()))

    def torch_graph(key: str, io: GraphIO, with_past: bool) -> Any:
        made = step_model(built(), layout(), with_past)
        _check_inputs(f"the torch {key} graph", made.names, [s.name for s in io.inputs])
        return made

    return tuple(  # type: ignore[return-value]
        Graph(export, key, io.inputs, io.outputs, functools.partial(torch_graph, key, io, past), many_runs)
        for key, io, past in (("prefill", section.prefill, False), ("decode", section.decode, True))
    )


class Stepper:
    """Prefill and decode calls of one export on one backend (a runner per graph, active until closed).

    ``one_at_a_time``: a runner is activated when its graph is first run and the other one deactivated
    then, so one session holds the weights at a time (a real-size model's parity check runs every prefill
    first, then every decode step); otherwise both are activated, and their inputs checked, at once.
    """

    def __init__(
        self, section: DecodeSection, prefill: BaseRunner, decode: BaseRunner, one_at_a_time: bool = False
    ) -> None:
        self.section, self.feeds = section, section.feeds()
        self.kept = {*self.feeds, *(c.input for c in section.context)}  # outputs a later call is fed
        self.runners = {"prefill": prefill, "decode": decode}
        self.one_at_a_time = one_at_a_time
        if not one_at_a_time:
            for graph in self.runners:
                self.open(graph)

    def open(self, graph: str) -> BaseRunner:
        """The active runner of ``graph`` ("prefill" or "decode"), activated now if it is not (closing the
        other one first when one session at a time), its inputs checked against the manifest."""
        runner = self.runners[graph]
        if runner.is_active:
            return runner
        if self.one_at_a_time:
            self.close()
        runner.activate()
        declared = [s.name for s in getattr(self.section, graph).inputs]
        _check_inputs(f"{graph}.onnx", list(runner.get_input_metadata().keys()), declared)
        return runner

    def __enter__(self) -> Stepper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for runner in self.runners.values():
            if runner.is_active:
                runner.deactivate()

    def prefill(self, input_ids: np.ndarray, source: State | None = None) -> tuple[np.ndarray, State]:
        """Logits (batch, n, vocab) of a prompt (batch, n) and the state after it.

        ``source``: a seq2seq model's ``input_ids`` and ``attention_mask`` (batch, src_seq).
        """
        feed = {self.section.tokens: input_ids, **(source or {})}
        outputs = self._run("prefill", feed)
        given = {**feed, **outputs}
        missing = sorted(c.input for c in self.section.context if c.input not in given)
        if missing:
            raise AttnxError(
                f"prefill.onnx and attnx.json disagree on its outputs (listed as decode context, not "
                f"produced: {missing}); re-export with `attnx export --decode`"
            )
        return self._split(outputs, {c.input: given[c.input] for c in self.section.context})

    def decode(self, input_ids: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """Logits (batch, 1, vocab) of one more token per row (batch, 1) and the state after it."""
        outputs = self._run("decode", {self.section.tokens: input_ids, **state})
        return self._split(outputs, {c.input: state[c.input] for c in self.section.context})

    def _run(self, graph: str, feed: State) -> State:
        """``graph``'s outputs: a decode step on ONNX Runtime binds them, keeping the state and context where
        its session made them; a prefill, or another runner, returns NumPy arrays.

        A prefill's state outlives its session (the decode session is made after it is closed, one at a
        time), and an ``OrtValue`` keeps the allocator it came from: bound, the prefill's state held the
        closed session's arena (its activations at the longest prompt) and raised the 0.8B export's verify
        from 5.9 to 8.7 GB."""
        runner = self.open(graph)
        if isinstance(runner, OrtRunner) and graph == "decode":
            return runner.infer_bound(feed, self.kept)
        return dict(runner.infer(feed, check_inputs=False))

    def _split(self, outputs: State, context: State) -> tuple[np.ndarray, State]:
        return outputs[LOGITS], {
            **context,
            **{self.feeds[k]: v for k, v in outputs.items() if k in self.feeds},
        }


def state_bytes(state: State) -> int:
    """The bytes of every tensor of ``state`` (NumPy arrays or ``OrtValue``s)."""
    return sum(v.nbytes if isinstance(v, np.ndarray) else v.tensor_size_in_bytes() for v in state.values())


def _check_inputs(graph: str, actual: Sequence[str], declared: Sequence[str]) -> None:
    """Refuse a graph whose inputs are not the ones the manifest says a runtime feeds it."""
    if set(actual) != set(declared):
        lacks, extra = sorted(set(declared) - set(actual)), sorted(set(actual) - set(declared))
        raise AttnxError(
            f"{graph} and attnx.json disagree on its inputs (listed, not taken: {lacks}; taken, not "
            f"listed: {extra}); re-export with `attnx export --decode`"
        )


def open_stepper(
    export: ExportDir,
    backend: str = "ort-cpu",
    threads: int | None = None,
    assembly: Any = None,
    one_at_a_time: bool = False,
    many_runs: bool = False,
) -> Stepper:
    """The stepper of ``export`` on ``backend`` (a name from the backend table); ``one_at_a_time``: see
    :class:`Stepper`; ``many_runs`` (generation, benchmarks): see :class:`~attnx.parity.runners.Graph`.

    Raises:
        AttnxError: not a decode export, an unknown backend, or one that cannot run here.
    """
    (chosen,) = backends([backend])
    if "decode" not in chosen.graphs:
        runs = ", ".join(b.name for b in BACKENDS.values() if "decode" in b.graphs)
        raise AttnxError(f"backend {chosen.name} does not run decode graphs; choose one that does: {runs}")
    reason = chosen.unavailable(export)
    if reason:
        raise AttnxError(f"backend {chosen.name} cannot run {export.label} here: {reason}")
    prefill, decode = decode_graphs(export, assembly, many_runs)
    try:
        runners = chosen.runner(prefill, threads), chosen.runner(decode, threads)
    except BackendSkipped as exc:
        raise AttnxError(f"backend {chosen.name} cannot run {export.label}: {exc}") from None
    return Stepper(decode_section(export), *runners, one_at_a_time=one_at_a_time)
