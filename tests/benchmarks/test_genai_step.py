"""benchmarks/genai_step.py on a tiny decode export, so the script cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.exports import same_worker, tiny_export

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "genai_step.py"
OPTIONS = {"export.decode": True}


@pytest.mark.slow  # a benchmark script's quick run, as the other benchmark scripts' are
@same_worker("gated_delta", "lm", "function", **OPTIONS)
@pytest.mark.parametrize("runtime", ["ort", "genai"])
def test_one_step_is_timed_with_the_states_bound_in_place(tmp_path: Path, runtime: str) -> None:
    out = tiny_export("gated_delta", "lm", **OPTIONS).out
    results = tmp_path / "step.json"
    command = [sys.executable, str(SCRIPT), f"tiny={out}", "--context", "5", "--rounds", "2", "--steps", "2"]
    command += ["--runtime", runtime, "--json", str(results)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(results.read_text())
    assert report["runtime"] == runtime
    row = report["rows"]["tiny"]
    assert len(row["medians_ms"]) == 2 and row["least_ms"] == min(row["medians_ms"]) > 0
    assert "tiny" in done.stdout
