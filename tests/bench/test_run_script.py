"""benchmarks/run.py end to end in its smoke mode (slow: it exports and times several models)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"


@pytest.mark.slow
def test_quick_run_reports_every_target(tmp_path: Path) -> None:
    results, plot = tmp_path / "results.json", tmp_path / "plot.png"
    command = [
        sys.executable,
        str(SCRIPT),
        "--quick",
        "--variants",
        "softmax,linear",
        "--json",
        str(results),
        "--plot",
        str(plot),
        "--work",
        str(tmp_path / "work"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(results.read_text())
    targets = {(row["target"].split()[0], row["variant"]) for row in data["targets"]}
    for variant in ("softmax", "linear"):
        assert {("P1", variant), ("P2", variant), ("P5", variant)} <= targets
    assert {("P6", "softmax"), ("P7", "linear")} <= targets
    decode = data["decode"]
    if decode["status"] == "ok":  # attnx.decode.bench present: per-token latency for each decoder
        assert {t["variant"] for t in decode["timings"]} == {"softmax", "linear"}
        assert {("decode", "softmax"), ("decode", "linear")} <= targets
    else:
        assert decode["status"] == "skipped" and decode["reason"] and ("decode", "-") in targets
    assert data["p6"]["exit_code"] == 0 and data["p7"]["process_peak_rss_bytes"] > 0
    assert all(m["status"] == "ok" for m in data["sweep"]["measurements"])
    assert plot.read_bytes().startswith(b"\x89PNG")
