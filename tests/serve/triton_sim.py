"""A client-side stand-in for Triton's sequence batcher, read from config.pbtxt (tritonclient's protobuf).

Like Triton (triton-inference-server/core, sequence_state.cc): each state starts as zeros of its
``dims`` with every variable dimension 1; after each request, the state outputs become the state
inputs of the next request, an output paired with an input by their positions in the name-sorted
lists (Triton's two std::maps), which is why the names must sort alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

NUMPY = {
    "TYPE_FP32": np.float32,
    "TYPE_FP16": np.float16,
    "TYPE_INT64": np.int64,
    "TYPE_INT32": np.int32,
    "TYPE_BOOL": np.bool_,
}


def parse_config(model_dir: Path):
    """config.pbtxt as tritonclient's ModelConfig message."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def dtype_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(value)


class SequenceBatcher:
    """One sequence of requests against ``model_dir/1/model.onnx`` with implicit state."""

    def __init__(self, model_dir: Path) -> None:
        self.config = parse_config(model_dir)
        self.session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"))
        states = self.config.sequence_batching.state
        inputs, outputs = sorted(s.input_name for s in states), sorted(s.output_name for s in states)
        self.feeds = dict(zip(outputs, inputs, strict=True))  # Triton's pairing, by sorted position
        self.state = {
            s.input_name: np.zeros(
                [1 if d == -1 else d for d in s.dims], dtype=NUMPY[dtype_name(s.data_type)]
            )
            for s in states
        }

    def infer(self, input_ids: list[int]) -> np.ndarray:
        """One request of one row: the logits; the state kept for the next request."""
        names = [o.name for o in self.session.get_outputs()]
        feed = {"input_ids": np.asarray([input_ids], dtype=np.int64), **self.state}
        outputs = dict(zip(names, self.session.run(None, feed), strict=True))
        self.state = {self.feeds[name]: value for name, value in outputs.items() if name in self.feeds}
        return outputs["logits"]

    def greedy(self, prompt: list[int], new: int) -> list[int]:
        """Generate like the repository README's client: the prompt, then one token per request."""
        tokens = [int(self.infer(prompt)[0, -1].argmax())]
        while len(tokens) < new:
            tokens.append(int(self.infer([tokens[-1]])[0, -1].argmax()))
        return tokens
