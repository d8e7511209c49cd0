"""Which runtimes an export can be served with, and why not: ``attnx doctor OUT``.

(Serving runtimes, not lowering targets: those are :mod:`attnx.targets`.)"""

from __future__ import annotations

import dataclasses
import importlib.util

from attnx.exporter.directory import ExportDir
from attnx.parity.backends import BACKENDS
from attnx.serve.genai import blocker as genai_blocker
from attnx.serve.triton import SERVED_LOWERINGS, sequence_blocker


@dataclasses.dataclass(frozen=True)
class ServingRuntime:
    """A serving runtime: ``reason`` None when the export can be served there on this machine; ``how``
    the command that does it (or the fix)."""

    name: str
    reason: str | None
    how: str


def serving_runtimes(export: ExportDir) -> list[ServingRuntime]:
    """Every target attnx knows, for ``export``."""
    out = str(export.path)
    lowering = export.manifest.lowering
    triton_lowering = (
        None
        if lowering in SERVED_LOWERINGS
        else f"the {lowering} lowering's bare attnx nodes need attnx's kernels; re-export with --lowering "
        + " or ".join(SERVED_LOWERINGS)
    )
    sequence = triton_lowering or sequence_blocker(export)
    batch_first = all(
        s.axes and s.axes[0] == "batch" for s in [*export.manifest.inputs, *export.manifest.outputs]
    )
    return [
        ServingRuntime("onnxruntime", BACKENDS["ort-cpu"].unavailable(export), f"attnx verify {out}"),
        ServingRuntime(
            "onnxruntime decode",
            None if export.has("decode") else "no decode graphs; re-export with --decode",
            f"attnx generate {out} --prompt-ids 1,2,3",
        ),
        ServingRuntime("onnxruntime-genai", _genai(export), f"onnxruntime_genai.Model('{out}')"),
        ServingRuntime(
            "triton dynamic batching",
            triton_lowering,
            f"attnx triton {out} --repo REPO --batching dynamic"
            + ("" if batch_first else " --max-batch 0 (the batch axis is fixed)"),
        ),
        ServingRuntime("triton sequence batching", sequence, f"attnx triton {out} --repo REPO"),
        ServingRuntime("tensorrt", BACKENDS["trt"].unavailable(export), f"attnx build {out}"),
    ]


def _genai(export: ExportDir) -> str | None:
    """Why onnxruntime-genai cannot run the export here (None: it can)."""
    reason = genai_blocker(export.manifest.decode)
    if reason is None and not export.has("genai"):
        reason = "it was exported without genai.onnx (an older attnx); re-export with --decode"
    if reason is None and importlib.util.find_spec("onnxruntime_genai") is None:
        reason = "onnxruntime-genai is not installed: pip install 'attnx[genai]' (the files are ready)"
    return reason
