"""``OUT/attnx.json``: everything needed to rebuild, verify and serve an export."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from attnx.errors import AttnxError
from attnx.atomic import write_atomic
from attnx.models.spec import TensorSpec

MANIFEST = "attnx.json"
MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "weights.safetensors"
PARITY_FILE = "parity.json"
SCHEMA_VERSION = 1
_PACKAGES = ("attnx", "torch", "onnx", "onnxscript", "onnxruntime", "polygraphy", "tensorrt")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dynamic_axes(specs: list[TensorSpec]) -> dict[str, dict[str, str]]:
    return {s.name: {str(i): a for i, a in enumerate(s.axes) if isinstance(a, str)} for s in specs}


@dataclasses.dataclass
class Manifest:
    variant: str
    variant_config: dict[str, Any]
    model: str
    model_config: dict[str, Any]
    lowering: str
    opset: int
    seed: int
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    ops: list[str]
    weights_sha256: str
    tolerance: dict[str, float]
    files: dict[str, str] = dataclasses.field(
        default_factory=lambda: {"model": MODEL_FILE, "weights": WEIGHTS_FILE}
    )
    versions: dict[str, str | None] = dataclasses.field(default_factory=package_versions)
    schema_version: int = SCHEMA_VERSION
    engine: dict[str, Any] | None = None  # `attnx build` settings of OUT/engine.plan (attnx.trt.build)
    cross_variant: str | None = None  # seq2seq: the cross-attention variant (attnx.exporter.assemble)
    cross_variant_config: dict[str, Any] | None = None
    recipe: str | None = None  # the recipe exported, if any (attnx.recipes)
    decode: dict[str, Any] | None = None  # prefill.onnx + decode.onnx and their state (attnx.decode)
    dtype: str = "fp32"  # weights and activations: "fp32" or "fp16" (recipe [export] dtype)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["dynamic_axes"] = dynamic_axes(self.input_specs() + self.output_specs())
        return json.dumps(data, indent=2, sort_keys=False) + "\n"

    def input_specs(self) -> list[TensorSpec]:
        return [_spec(d) for d in self.inputs]

    def output_specs(self) -> list[TensorSpec]:
        return [_spec(d) for d in self.outputs]

    def write(self, directory: Path) -> None:
        write_atomic(Path(directory) / MANIFEST, self.to_json())

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        path = Path(directory) / MANIFEST
        if not Path(directory).is_dir():
            raise AttnxError(f"'{directory}' is not a directory; pass the OUT directory of an `attnx export`")
        if not path.is_file():
            raise AttnxError(f"'{directory}' has no {MANIFEST}; pass the OUT directory of an `attnx export`")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise AttnxError(
                f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); re-export"
            ) from None
        data.pop("dynamic_axes", None)
        known = {f.name for f in dataclasses.fields(cls)}
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in data
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]  # type: ignore[misc]
        if missing:
            raise AttnxError(f"{path} lacks {', '.join(missing)}; re-export with this attnx version")
        return cls(**{k: v for k, v in data.items() if k in known})


def _spec(data: dict[str, Any]) -> TensorSpec:
    return TensorSpec(
        name=data["name"],
        dtype=data["dtype"],
        axes=tuple(data["axes"]),
        high=data.get("high"),
        doc=data.get("doc", ""),
    )
