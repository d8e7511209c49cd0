"""Where ONNX Runtime spends a forward: per-op-type times from ORT's own profiler.

``SessionOptions.enable_profiling`` makes ORT write a Chrome-trace JSON with one
event per executed node (category "Node", ``args.op_name``, duration in µs) and one
"model_run" event per run. The first run (allocations, first-touch) is dropped; the
op times of the remaining runs are averaged. Function-lowered attnx nodes are inlined
by ORT, so the op types are the standard ops of the attention bodies.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np

from attnx.bench.timing import feed_for
from attnx.exporter.directory import ExportDir
from attnx.parity.runners import ort_session_options


@dataclasses.dataclass(frozen=True)
class OpTime:
    op_type: str
    mean_ms: float  # per run
    share: float  # of the summed node time
    nodes: int  # node executions per run


def ort_op_profile(export: ExportDir, *, batch: int, seq_len: int, threads: int, runs: int = 1,
                   seed: int = 0) -> list[OpTime]:
    """Per-op-type node time of ``runs`` CPU runs, after one warm-up run whose events are dropped."""
    import onnxruntime

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="attnx-profile-") as directory:
        options = ort_session_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(directory) / "ort")
        providers = ["CPUExecutionProvider"]
        session = onnxruntime.InferenceSession(str(export.model_path), options, providers=providers)
        for _ in range(1 + runs):
            session.run(None, feed_for(export, batch, seq_len, rng))
        events = json.loads(Path(session.end_profiling()).read_text())
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")[1:]
    totals: dict[str, list[float]] = {}
    for event in events:
        op_type = event.get("args", {}).get("op_name")
        if event.get("cat") != "Node" or not op_type or not event["name"].endswith("_kernel_time"):
            continue
        if any(start <= event["ts"] <= end for start, end in windows):
            totals.setdefault(op_type, []).append(event["dur"])
    overall = sum(sum(d) for d in totals.values()) or 1.0
    found = [OpTime(op, sum(d) / 1e3 / max(len(windows), 1), sum(d) / overall, len(d) // max(len(windows), 1))
             for op, d in totals.items()]
    return sorted(found, key=lambda t: -t.mean_ms)
