"""Write ``prefill.onnx`` and ``decode.onnx`` next to an export's ``model.onnx``.

Both graphs go through the same path as ``model.onnx`` (:func:`attnx.exporter.export.to_onnx`,
then the lowering); the stateful ``attnx::*Step`` ops come from the variants'
``VariantImpl.decode_ops``. Only the ``function`` and ``decomposed`` lowerings are
offered: TensorRT plugins and the ORT plugin kernels have a single output, and a step op has three.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import onnx
from torch import nn

from attnx.decode.model import DecodeLayout, StepModel, check_decodable
from attnx.errors import AttnxError
from attnx.models.spec import TensorSpec
from attnx.ops import AttentionOp

PREFILL_FILE, DECODE_FILE = "prefill.onnx", "decode.onnx"
DECODE_LOWERINGS = ("function", "decomposed")


@dataclasses.dataclass
class _Graph:
    """What :func:`attnx.exporter.export.to_onnx` reads from an assembly."""

    module: nn.Module
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    ops: list[AttentionOp]


def decoders() -> list[str]:
    """Names of the registered variants that decode."""
    from attnx.registry import get_registry

    return sorted(name for name, v in get_registry().variants.items() if v.capabilities.decode)


def check(model: str, variant: str, lowering: str) -> None:
    """Refuse, before any work, a decode export that cannot be made (one line naming what can)."""
    from attnx.registry import get_registry

    check_decodable(model, get_registry().variant(variant), decoders())
    if lowering not in DECODE_LOWERINGS:
        raise AttnxError(
            f"--decode exports use the {' or '.join(DECODE_LOWERINGS)} lowering, not '{lowering}' "
            "(step ops have several outputs, which the attnx TensorRT/ORT plugins do not carry)"
        )


def decode_ops(assembly: Any) -> list[AttentionOp]:
    """Every op the prefill/decode graphs may hold: the full forward's and the step ops."""
    ops = {op.name: op for op in assembly.ops}
    for impl in assembly.impls.values():
        ops.update({op.name: op for op in impl.decode_ops})
    return list(ops.values())


def run_prefill_once(prefill: StepModel, specs: list[TensorSpec]) -> None:
    """Run prefill in torch on one token (and a one-token source): a layer that cannot decode raises
    its one-line AttnxError here, where torch.export would wrap it in a long report."""
    import numpy as np
    import torch

    from attnx.parity.inputs import random_feed

    feed = random_feed(specs, {"batch": 1, "seq": 1, "src_seq": 1}, np.random.default_rng(0))
    with torch.inference_mode():
        prefill(*(torch.from_numpy(feed[s.name]) for s in specs))


def export_decode(assembly: Any, directory: Path, opset: int, lowering: str) -> dict[str, Any]:
    """Export, lower, check and save the two graphs into ``directory``; return the manifest entry."""
    from attnx.exporter import lowering as lowering_mod
    from attnx.exporter.export import save_onnx, to_onnx

    check(assembly.model.name, assembly.variant.name, lowering)
    layout = DecodeLayout.of(assembly.module, assembly.variant.capabilities.decode)
    run_prefill_once(StepModel(assembly.module, layout, False), layout.inputs(False))
    ops = decode_ops(assembly)
    files, used = {}, set()
    for key, name, with_past in (("prefill", PREFILL_FILE, False), ("decode", DECODE_FILE, True)):
        graph = _Graph(
            StepModel(assembly.module, layout, with_past),
            layout.inputs(with_past),
            layout.outputs(with_past),
            ops,
        )
        proto = to_onnx(graph, opset, graph.inputs, graph.outputs)
        used |= {f"{lowering_mod.DOMAIN}::{node.op_type}" for node in lowering_mod.attnx_nodes(proto)}
        proto = lowering_mod.lower(proto, ops, lowering)
        onnx.checker.check_model(proto, full_check=True)
        save_onnx(proto, directory / name)
        files[key] = name
    return {"files": files, "ops": sorted(used), **layout.describe()}


def graph_specs(entry: dict[str, Any], graph: str, side: str) -> list[TensorSpec]:
    """The TensorSpecs of ``graph`` ("prefill"/"decode") ``side`` ("inputs"/"outputs") in a manifest entry."""
    return [
        TensorSpec(d["name"], d["dtype"], tuple(d["axes"]), d.get("high"), d.get("doc", ""))
        for d in entry[graph][side]
    ]


def state_map(entry: dict[str, Any]) -> dict[str, str]:
    """Output name -> the input it feeds at the next step."""
    return {s["output"]: s["input"] for s in entry["state"]}
