"""benchmarks/gated_sidebyside.py end to end in its smoke mode (slow: it exports and times every rule, the
opset-27 rows and the short convolution's)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gated_sidebyside.py"
RULES = ("linear", "gated", "gla", "delta", "gated_delta", "kda")


@pytest.mark.slow
def test_quick_run_times_every_rule_and_agrees(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    results = tmp_path / "results.json"
    command = [sys.executable, str(SCRIPT), "--quick", "--shapes", "d256", "--conv", "--json", str(results)]
    if not importlib.util.find_spec("fla"):
        command.append("--no-fla")
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(results.read_text())
    rows = {(r["shape"], r["rule"], r["name"], r["n"]): r for r in data["results"]}
    for rule in RULES:
        for name in (
            "attnx torch",
            "attnx portable",
            "attnx ort",
            "attnx opset27",
            "ORT native",
            "ONNX std27",
        ):
            row = rows["d256", rule, name, 128]
            assert row["times_s"] and row["agreement"] < 1e-4, (rule, name, row)
    for name in ("attnx torch", "attnx portable", "attnx ort"):  # the layer from the op matches MiniMax's
        row = rows["layer", "gated", name, 128]
        assert row["times_s"] and row["agreement"] < 1e-4, (name, row)
    assert all(r["agreement"] < 1e-4 for r in data["results"] if r["times_s"])  # the references too
    assert {r["rule"] for r in data["decode"]} == set(RULES)
    assert {d["row"] for d in data["decode"]} >= {"attnx opset27", "ONNX std27"}
    conv = {(c["row"], c["n"]): c for c in data["conv"]}  # the short convolution's three forms agree
    assert {row for row, _ in conv} == {"attnx conv", "ORT CausalConvWithState", "ONNX std27 conv"}
    assert all(c["ms"] > 0 and c["agreement"] < 1e-4 for c in conv.values())
    assert all(d["ms_per_token"] > 0 for d in data["decode"])
    targets = {row["target"] for row in data["targets"]}
    assert "portable / ORT native N=256" in targets and "attnx portable decode P=64 / P=16" in targets
