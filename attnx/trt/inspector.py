"""What a built engine holds, read from TensorRT's engine inspector (pure Python, no tensorrt).

``ICudaEngine.create_engine_inspector().get_engine_information(LayerInformationFormat.JSON)`` of an
engine built with ``ProfilingVerbosity.DETAILED`` is ``{"Layers": [...], "Bindings": [...]}``; each
layer has ``Name``, ``LayerType`` and ``Inputs``/``Outputs`` tensors whose data type is part of
``"Format/Datatype"`` in TensorRT 10 ("Row major linear FP32", "Channel major FP16 format ...") and a
separate ``"Datatype"`` (plus ``"Format"``) in TensorRT 11. Plugin layers have a ``LayerType`` (or
``ParameterType``) starting with "Plugin". With a lower verbosity the layers are bare strings and
carry no types; they count as "unknown".

A layer's precision is the data type of its first output (its first input when it has none), so
the counts say what the engine computes in, not what the build asked for.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

from attnx.exporter.manifest import PluginLayer

# Substrings of TensorRT's data type names -> attnx names; longer names first ("FLOAT8" before "FLOAT").
_PRECISIONS = (
    ("BFLOAT16", "bf16"), ("BF16", "bf16"),
    ("FLOAT8", "fp8"), ("FP8", "fp8"), ("FLOAT4", "fp4"), ("FP4", "fp4"),
    ("HALF", "fp16"), ("FP16", "fp16"), ("FLOAT", "fp32"), ("FP32", "fp32"),
    ("UINT8", "uint8"), ("INT64", "int64"), ("INT32", "int32"), ("INT8", "int8"), ("INT4", "int4"),
    ("BOOL", "bool"),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class EngineLayers:
    """Layer counts of a built engine: per precision, per layer type, and its plugin layers."""

    precisions: dict[str, int]
    layer_types: dict[str, int]
    plugin_layers: list[PluginLayer]

    @property
    def has_fp16(self) -> bool:
        return self.precisions.get("fp16", 0) > 0

    def describe(self) -> str:
        counts = ", ".join(f"{n} {p}" for p, n in sorted(self.precisions.items(), key=lambda kv: -kv[1]))
        total = sum(self.precisions.values())
        return f"{total} layers ({counts}), {len(self.plugin_layers)} plugin layer(s)"


def read_engine_information(information: str | dict[str, Any]) -> EngineLayers:
    """Count the layers of the inspector's JSON (text or parsed) by precision and type."""
    data = json.loads(information) if isinstance(information, str) else information
    layers = data.get("Layers", []) if isinstance(data, dict) else data
    precisions: Counter[str] = Counter()
    types: Counter[str] = Counter()
    plugins = []
    for layer in layers:
        if not isinstance(layer, dict):  # ProfilingVerbosity below DETAILED: names only
            precisions["unknown"] += 1
            types["unknown"] += 1
            continue
        precision = layer_precision(layer)
        kind = str(layer.get("LayerType", "unknown"))
        precisions[precision] += 1
        types[kind] += 1
        if _is_plugin(layer):
            tactic = layer.get("TacticName", layer.get("TacticValue"))
            plugins.append(PluginLayer(
                name=str(layer.get("Name", "")),
                plugin=str(layer.get("PluginType") or layer.get("PluginName") or kind),
                precision=precision,
                tactic=None if tactic is None else str(tactic),
            ))  # fmt: skip
    return EngineLayers(dict(precisions), dict(types), plugins)


def layer_precision(layer: dict[str, Any]) -> str:
    """The data type of the layer's first output (or first input), as "fp32", "fp16", "int64", ..."""
    for key in ("Outputs", "Inputs"):
        tensors = layer.get(key) or []
        if tensors and isinstance(tensors[0], dict):
            return tensor_precision(tensors[0])
    return "unknown"


def tensor_precision(tensor: dict[str, Any]) -> str:
    """A tensor entry's data type: TensorRT 11's "Datatype", or the one in TensorRT 10's "Format/Datatype"."""
    text = str(tensor.get("Datatype") or tensor.get("Format/Datatype") or "").upper()
    return next((name for key, name in _PRECISIONS if key in text), "unknown")


def _is_plugin(layer: dict[str, Any]) -> bool:
    return any(str(layer.get(key, "")).startswith("Plugin") for key in ("LayerType", "ParameterType"))
