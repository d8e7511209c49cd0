"""benchmarks/sidebyside.py on its tiniest setting, so the script cannot rot; peers may be absent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sidebyside.py"
ATTNX_ROWS = {"attnx torch", "attnx ort function", "attnx ort decomposed"}
PEERS = {"linear-attention-transformer", "fast-transformers"}  # the causal linear layer's peers


@pytest.mark.slow  # a benchmark script's quick run, as the other benchmark scripts' are
def test_quick_run_times_attnx_beside_the_peers_and_judges_the_targets(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    command = [
        sys.executable,
        str(SCRIPT),
        "--quick",
        "--variants",
        "linear",
        "--cases",
        "layer-causal",
        "--sizes",
        "64",
        "--repeat",
        "1",
        "--threads",
        "1",
        "--decode-positions",
        "",
        "--no-compile",
        "--json",
        str(results),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(results.read_text())
    rows = {m["backend"]: m for m in data["measurements"]}
    assert set(rows) == ATTNX_ROWS | PEERS
    for name in ("attnx torch", "attnx ort function", "attnx ort decomposed"):
        assert rows[name]["status"] == "ok" and rows[name]["median_s"] > 0, rows[name]
    for name in PEERS:  # a missing peer is a skip row with the reason, never a crash
        peer = rows[name]
        assert peer["status"] == "ok" or (peer["status"], peer["reason"][:13]) == ("skipped", "not installed")
    targets = {row["target"] for row in data["targets"]}
    assert "layer-causal fp32 ORT / attnx eager N=64" in targets
    assert "skipped: not installed" in done.stdout or all(rows[p]["status"] == "ok" for p in PEERS)
