"""A stand-in for ``triton_python_backend_utils`` (the module Triton's python backend gives ``model.py``),
so the python-backend model runs in-process: requests with a correlation id and sequence flags, tensors,
responses and errors, as the backend's documentation describes them."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

from tests.serve.triton_sim import parse_config

START, END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END


@dataclasses.dataclass
class Tensor:
    tensor_name: str
    array: np.ndarray

    def name(self) -> str:
        return self.tensor_name

    def as_numpy(self) -> np.ndarray:
        return self.array


@dataclasses.dataclass
class TritonError:
    text: str

    def message(self) -> str:
        return self.text


@dataclasses.dataclass
class InferenceResponse:
    output_tensors: list[Tensor] = dataclasses.field(default_factory=list)
    error: TritonError | None = None

    def output(self, name: str) -> np.ndarray:
        assert self.error is None, self.error.text
        return next(t.array for t in self.output_tensors if t.name() == name)


@dataclasses.dataclass
class Request:
    inputs: dict[str, np.ndarray]
    sequence: Any = 0
    sequence_flags: int = 0

    def correlation_id(self) -> Any:
        return self.sequence

    def flags(self) -> int:
        return self.sequence_flags


class Logger:
    messages: list[str] = []

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.messages.append(message)


def get_input_tensor_by_name(request: Request, name: str) -> Tensor | None:
    return Tensor(name, request.inputs[name]) if name in request.inputs else None


def install(monkeypatch) -> types.ModuleType:
    """Put the stand-in in ``sys.modules`` as ``triton_python_backend_utils`` for this test."""
    module = types.ModuleType("triton_python_backend_utils")
    module.__dict__.update(
        Tensor=Tensor,
        TritonError=TritonError,
        InferenceResponse=InferenceResponse,
        Logger=Logger,
        get_input_tensor_by_name=get_input_tensor_by_name,
        TRITONSERVER_REQUEST_FLAG_SEQUENCE_START=START,
        TRITONSERVER_REQUEST_FLAG_SEQUENCE_END=END,
    )
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", module)
    Logger.messages = []
    return module


def load_model(model_dir: Path) -> Any:
    """The repository's ``model.py`` (imported from the file attnx wrote), initialized as Triton does."""
    import importlib.util

    from google.protobuf import json_format

    spec = importlib.util.spec_from_file_location(f"model_{id(model_dir)}", model_dir / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = json_format.MessageToDict(parse_config(model_dir), preserving_proto_field_name=True)
    model = module.TritonPythonModel()
    model.initialize(
        {"model_repository": str(model_dir), "model_version": "1", "model_config": json.dumps(config)}
    )
    return model
