"""What a parity check found: per backend, sequence length and output, the differences and the verdict."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from attnx.atomic import write_atomic
from attnx.exporter.manifest import PARITY_FILE
from attnx.parity.weights import WeightCheck


@dataclasses.dataclass
class Comparison:
    seq_len: int
    output: str
    max_abs: float
    max_rel: float
    passed: bool


@dataclasses.dataclass
class Drift:
    """fp16 exports: how far the torch model in fp16 is from the same weights run in float32.

    Informational (no pass/fail): it shows what half precision itself changes, which the
    parity check (ONNX fp16 vs torch fp16) cannot see.
    """

    seq_len: int
    output: str
    max_abs: float
    max_rel: float


@dataclasses.dataclass
class BackendParity:
    backend: str
    status: str  # "passed" | "failed" | "skipped"
    reason: str = ""
    comparisons: list[Comparison] = dataclasses.field(default_factory=list)
    tolerance: dict[str, float] | None = None  # when not the report's (an fp16 TensorRT engine)


@dataclasses.dataclass
class ParityReport:
    atol: float
    rtol: float
    batch: int
    seq_lens: list[int]
    seed: int
    backends: list[BackendParity]
    dtype: str = "fp32"
    fp32_drift: list[Drift] = dataclasses.field(default_factory=list)
    weights: list[WeightCheck] = dataclasses.field(default_factory=list)  # the graphs' weights vs the model's

    @property
    def ran(self) -> list[BackendParity]:
        return [b for b in self.backends if b.status != "skipped"]

    @property
    def weight_mismatches(self) -> list[str]:
        return [m.describe() for check in self.weights for m in check.mismatches]

    @property
    def passed(self) -> bool:
        return bool(self.ran) and all(b.status == "passed" for b in self.ran) and not self.weight_mismatches

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, **dataclasses.asdict(self)}

    def write(self, directory: Path) -> None:
        """``directory/parity.json``, atomically."""
        write_atomic(Path(directory) / PARITY_FILE, json.dumps(self.to_dict(), indent=2) + "\n")
