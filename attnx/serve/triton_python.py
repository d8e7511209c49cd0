"""The version folder of a Triton python-backend model: ``model.py``, ``attnx-model.json``, the graphs.

``model.py`` is :mod:`attnx.serve.triton_model`, copied unchanged; ``attnx-model.json`` tells it which
graphs to run and, for a decoder, the token input, the logits and every state tensor as the export's
manifest lists them (decode section: each state output of prefill and decode and the decode input it
feeds), so nothing here or there knows which attention, layer layout or kind of state it serves.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from attnx.decode.model import LOGITS
from attnx.decode.runtime import decode_section
from attnx.exporter.directory import ExportDir
from attnx.exporter.layout import copy_graph
from attnx.serve.triton_model import DESCRIPTION


def description(export: ExportDir, batching: str) -> dict[str, Any]:
    """What ``model.py`` runs: the graphs (files in the version folder) and, for sequence batching, the
    decode loop (``state``: the manifest's state pairs, with their dtype and axes for a reader)."""
    if batching != "sequence":
        return {"kind": "dynamic", "graphs": {"model": export.model_path.name}}
    section = decode_section(export)
    return {
        "kind": "sequence",
        "graphs": {key: export.file(key).name for key in ("prefill", "decode")},
        "tokens": section.tokens,
        "logits": LOGITS,
        "vocab_size": section.vocab_size or None,
        "state": [
            {"input": p.input, "output": p.output, "dtype": p.dtype, "axes": list(p.axes)}
            for p in section.state
        ],
    }


def write_python_model(export: ExportDir, batching: str, folder: Path) -> None:
    """Write ``model.py``, ``attnx-model.json`` and the graphs they name into ``folder``."""
    spec = description(export, batching)
    for file in spec["graphs"].values():
        copy_graph(export.path / file, folder / file)
    (folder / DESCRIPTION).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    source = resources.files("attnx.serve").joinpath("triton_model.py").read_text(encoding="utf-8")
    (folder / "model.py").write_text(source, encoding="utf-8")
