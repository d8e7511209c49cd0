"""``model.py`` of a Triton python-backend model that ``attnx triton --backend python`` writes.

Copied unchanged into ``REPO/<name>/1/model.py``; it runs in the repository's own python environment
(numpy < 2 and onnxruntime, nothing else: no attnx), so it imports only those and the standard
library, and takes everything it needs from ``attnx-model.json`` next to it and from the model
config Triton hands it:

* ``dynamic``: each request runs ``model.onnx`` on its own inputs (the batch Triton gathered is a
  list of requests of their own lengths).
* ``sequence``: a decoder served token by token. The state of each sequence (every state tensor the
  export's manifest lists: KV caches, recurrent sums, the position) lives here, keyed by the sequence
  batcher's correlation id: the request that starts a sequence runs ``prefill.onnx`` on its tokens,
  every later one ``decode.onnx`` on its tokens and the sequence's state, each state output feeding
  the input the manifest pairs it with. The state is freed by the request that ends the sequence,
  and after the config's ``max_sequence_idle_microseconds`` without a request (Triton's sequence
  batcher releases such a sequence's slot without telling the model). At most
  ``oldest.max_candidate_sequences`` states are live, as many as Triton's slots for this instance; a
  sequence that starts when they are taken replaces the least recently used one, which Triton has
  released.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

DESCRIPTION = "attnx-model.json"
State = dict[str, np.ndarray]
Run = Callable[[str, Mapping[str, np.ndarray]], dict[str, np.ndarray]]


class RequestError(Exception):
    """A request this model refuses; its message becomes the request's Triton error."""


class SequenceStore:
    """The live sequences' states, least recently used first, with an idle timeout and a bound;
    ``notify`` hears of every state dropped without its sequence's end."""

    def __init__(
        self,
        limit: int,
        idle_seconds: float,
        notify: Callable[[str], None] = lambda message: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.idle_seconds, self.notify, self.clock = max(1, limit), idle_seconds, notify, clock
        self.states: OrderedDict[Any, tuple[float, State]] = OrderedDict()

    def expire(self) -> None:
        """Drop the states idle for longer than the timeout."""
        now = self.clock()
        for key in [key for key, (seen, _) in self.states.items() if now - seen > self.idle_seconds]:
            del self.states[key]
            self.notify(f"sequence {key!r} was idle over {self.idle_seconds:g} s: its state is freed")

    def get(self, key: Any) -> State | None:
        entry = self.states.get(key)
        return None if entry is None else entry[1]

    def put(self, key: Any, state: State) -> None:
        """Keep ``state`` as the sequence's newest, dropping the least recently used one if full."""
        self.states.pop(key, None)
        if len(self.states) >= self.limit:
            dropped, _ = self.states.popitem(last=False)
            self.notify(f"{self.limit} sequences are live: the state of sequence {dropped!r} is freed")
        self.states[key] = (self.clock(), state)

    def end(self, key: Any) -> None:
        self.states.pop(key, None)

    def __len__(self) -> int:
        return len(self.states)


class Decoder:
    """One step of a sequence: prefill on its first request, decode with its state after that."""

    def __init__(self, description: Mapping[str, Any], run: Run, store: SequenceStore) -> None:
        self.tokens, self.logits = description["tokens"], description["logits"]
        self.vocab_size = description["vocab_size"]  # None: not recorded, not checked
        self.feeds = {pair["output"]: pair["input"] for pair in description["state"]}
        self.run, self.store = run, store

    def step(self, key: Any, tokens: np.ndarray, start: bool, end: bool) -> np.ndarray:
        """The logits of ``tokens`` (1, n) continuing sequence ``key``.

        Raises:
            RequestError: no tokens, ids outside the vocabulary, or a sequence with no state here.
        """
        if tokens.size == 0:
            raise RequestError(f"'{self.tokens}' is empty; send at least one token")
        if self.vocab_size is not None and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise RequestError(
                f"'{self.tokens}' holds ids outside 0..{self.vocab_size - 1}: {int(tokens.min())}..."
                f"{int(tokens.max())}"
            )
        if start:
            outputs = self.run("prefill", {self.tokens: tokens})
        else:
            state = self.store.get(key)
            if state is None:
                raise RequestError(
                    f"sequence {key!r} has no state in this model instance (it ended, or was idle over "
                    f"{self.store.idle_seconds:g} s); start it again with sequence_start"
                )
            outputs = self.run("decode", {self.tokens: tokens, **state})
        if end:
            self.store.end(key)
        else:
            self.store.put(key, {self.feeds[k]: v for k, v in outputs.items() if k in self.feeds})
        return outputs[self.logits]


def session_runner(folder: Path, graphs: Mapping[str, str]) -> Run:
    """``run(graph, feed)`` over one ONNX Runtime CPU session per graph file."""
    import onnxruntime as ort

    sessions = {
        key: ort.InferenceSession(str(folder / file), providers=["CPUExecutionProvider"])
        for key, file in graphs.items()
    }
    names = {key: [o.name for o in s.get_outputs()] for key, s in sessions.items()}

    def run(graph: str, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names[graph], sessions[graph].run(None, dict(feed)), strict=True))

    return run


class TritonPythonModel:
    """The python backend's entry point (``initialize``, ``execute``, ``finalize``)."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        folder = Path(args["model_repository"]) / args["model_version"]
        config = json.loads(args["model_config"])
        description = json.loads((folder / DESCRIPTION).read_text(encoding="utf-8"))
        self.run = session_runner(folder, description["graphs"])
        self.inputs = [entry["name"] for entry in config["input"]]
        self.outputs = [entry["name"] for entry in config["output"]]
        self.decoder = None
        if description["kind"] == "sequence":
            batching = config["sequence_batching"]
            store = SequenceStore(
                int(batching.get("oldest", {}).get("max_candidate_sequences", 1)),
                int(batching["max_sequence_idle_microseconds"]) / 1e6,
                pb_utils.Logger.log_warn,
            )
            self.decoder = Decoder(description, self.run, store)

    def execute(self, requests: list[Any]) -> list[Any]:
        if self.decoder is not None:
            self.decoder.store.expire()
        return [self._respond(request) for request in requests]

    def _respond(self, request: Any) -> Any:
        pb = self.pb
        try:
            feed = {name: pb.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            if self.decoder is None:
                outputs = self.run("model", feed)
            else:
                flags = request.flags()
                logits = self.decoder.step(
                    request.correlation_id(),
                    feed[self.decoder.tokens],
                    bool(flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
                    bool(flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
                )
                outputs = {self.decoder.logits: logits}
        except Exception as exc:  # a failed request fails alone: the others and the model go on
            message = str(exc) if isinstance(exc, RequestError) else f"{type(exc).__name__}: {exc}"
            return pb.InferenceResponse(error=pb.TritonError(message))
        return pb.InferenceResponse([pb.Tensor(name, outputs[name]) for name in self.outputs])

    def finalize(self) -> None:
        if self.decoder is not None:
            self.decoder.store.states.clear()
