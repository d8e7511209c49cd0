"""``attnx bench`` through Click: the table, --json, --plot, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from attnx.cli import cli
from tests.helpers import assert_one_line_error, run_cli


def test_bench_prints_the_table_and_writes_json_and_plot(tiny_out: Path, tmp_path: Path) -> None:
    json_path, plot_path = tmp_path / "r.json", tmp_path / "r.png"
    args = [
        "bench",
        str(tiny_out),
        "--backends",
        "torch,ort-cpu,trt",
        "--seq-lens",
        "8,16",
        "--repeat",
        "2",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--json",
        str(json_path),
        "--plot",
        str(plot_path),
        "--quiet",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "median ms" in result.output and "slope" in result.output
    assert "skipped softmax-tiny trt batch 1 N=8,16:" in result.output  # grouped, with the reason
    data = json.loads(json_path.read_text())
    assert [(m["backend"], m["seq_len"], m["status"]) for m in data["measurements"]][:4] == [
        ("torch", 8, "ok"),
        ("ort-cpu", 8, "ok"),
        ("trt", 8, "skipped"),
        ("torch", 16, "ok"),
    ]
    assert plot_path.read_bytes().startswith(b"\x89PNG")


def test_default_output_is_the_table_on_stdout(tiny_out: Path) -> None:
    code, stdout, stderr = run_cli(
        ["bench", str(tiny_out), "--backends", "ort-cpu", "--seq-lens", "4", "--repeat", "1", "--warmup", "0"]
    )
    assert code == 0 and "ort-cpu" in stdout and "Traceback" not in stderr


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--backends", "ort-gpu"], ["unknown backend 'ort-gpu'", "did you mean"]),
        (["--seq-lens", "8,x"], ["--seq-lens"]),
        (["--seq-lens", "0"], ["--seq-lens"]),
        (["--batch", "0"], ["--batch"]),
        (["--max-memory", "lots"], ["--max-memory 'lots'"]),
        (["--json", "/nonexistent-dir/r.json"], ["--json", "does not exist"]),
        (["--plot", "/nonexistent-dir/r.png"], ["--plot", "does not exist"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_out: Path, extra: list[str], fragments: list[str]) -> None:
    code, _, stderr = run_cli(["bench", str(tiny_out), *extra])
    assert_one_line_error(code, stderr, *fragments)


def test_not_an_export_is_one_line(tmp_path: Path) -> None:
    code, _, stderr = run_cli(["bench", str(tmp_path / "missing")])
    assert_one_line_error(code, stderr, "attnx export")


def test_missing_outs_is_a_usage_error() -> None:
    code, _, stderr = run_cli(["bench"])
    assert_one_line_error(code, stderr, "OUT")


def test_plot_without_matplotlib_fails_before_running_and_writes_nothing(
    tiny_out: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, stdout, stderr = run_cli(
        ["bench", str(tiny_out), "--plot", str(tmp_path / "p.png"), "--json", str(tmp_path / "r.json")]
    )
    assert_one_line_error(code, stderr, "pip install 'attnx[plot]'")
    assert stdout == "" and list(tmp_path.iterdir()) == []
