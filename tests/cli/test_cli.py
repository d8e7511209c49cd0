"""The CLI, driven for real: success paths, one-line errors with exit 2, nothing left on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli

REPO = Path(__file__).resolve().parents[2]
TINY_SET = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="module")
def exported_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out"
    code, stdout, stderr = run_cli(
        ["export", "--variant", "softmax", "-o", str(out), "--seq-lens", "1,5,17", *TINY_SET]
    )
    assert code == 0, stderr
    assert "parity: PASSED on ort-cpu" in stdout
    assert "wrote" in stdout and "function lowering" in stdout
    return out


def test_help_and_list_do_not_import_torch():
    """`attnx --help` and `attnx list` load every plugin's entry module, none may pull in torch."""
    for args in (["--help"], ["list", "--json"]):
        code = (
            "import sys; from attnx.cli import main\n"
            f"try: main({args!r})\n"
            "except SystemExit: pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'"
        )
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("command", ["list", "doctor", "export", "verify"])
def test_every_command_help_has_an_example(command):
    code, stdout, _ = run_cli([command, "--help"])
    assert code == 0 and "Example" in stdout and f"attnx {command}" in stdout


def test_list_shows_variants_models_lowerings():
    code, stdout, _ = run_cli(["list", "--json"])
    data = json.loads(stdout)
    assert code == 0
    softmax = next(v for v in data["variants"] if v["name"] == "softmax")
    assert softmax["capabilities"] == {
        "causal": True,
        "cross": True,
        "key_padding_mask": True,
        "bidirectional": True,
        "decode": "kv-cache",
        "fp16": True,
        "trainable": True,
    }
    reformer = next(v for v in data["variants"] if v["name"] == "reformer")
    assert reformer["capabilities"]["fp16"] is False
    assert softmax["fp16_tolerance"] == {"atol": 2e-2, "rtol": 1e-2}
    assert "encoder" in [m["name"] for m in data["models"]]
    assert set(data["lowerings"]) == {"function", "decomposed", "plugin"}
    assert set(data["targets"]) == {"portable", "ort"}
    code, stdout, _ = run_cli(["list"])
    assert code == 0 and "softmax" in stdout and "decomposed" in stdout and "lowering targets" in stdout


def test_doctor_reports_versions_and_plugins():
    code, stdout, _ = run_cli(["doctor", "--json"])
    data = json.loads(stdout)
    assert code == 0
    assert data["versions"]["onnx"] and "CPUExecutionProvider" in data["onnxruntime_providers"]
    assert "softmax" in data["variants"] and data["backends"]["ort-cpu"] == "available"
    assert "trt" in data["backends"]


def test_export_json_output(tmp_path):
    code, stdout, _ = run_cli(["export", "-o", str(tmp_path / "o"), "--no-verify", "--json", *TINY_SET])
    assert code == 0
    data = json.loads(stdout)
    assert data["parity"] is None and data["attnx_nodes"] == TINY["n_layers"]


def test_verify_passes_in_a_new_process(exported_dir):
    result = subprocess.run(
        [sys.executable, "-m", "attnx", "verify", str(exported_dir), "--seq-lens", "3,8"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "parity: PASSED" in result.stdout
    assert json.loads((exported_dir / "parity.json").read_text())["seq_lens"] == [3, 8]


def test_verify_reports_skipped_backends_with_reasons(exported_dir):
    code, stdout, _ = run_cli(
        ["verify", str(exported_dir), "--backends", "ort-cpu,trt", "--seq-lens", "4", "--json"]
    )
    data = json.loads(stdout)
    assert code == 0
    trt = next(b for b in data["backends"] if b["backend"] == "trt")
    assert trt["status"] == "skipped" and trt["reason"]


def test_verify_exits_1_on_mismatch(exported_dir):
    code, stdout, _ = run_cli(["verify", str(exported_dir), "--seq-lens", "9", "--atol", "0", "--rtol", "0"])
    assert code == 1 and "parity: FAILED" in stdout


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["export", "--variant", "refomer"], ["unknown variant 'refomer'"]),
        (["export", "--variant", "sofmax"], ["did you mean 'softmax'?"]),
        (["export", "--model", "encodr"], ["unknown model 'encodr'", "did you mean 'encoder'?"]),
        (["export", "--lowering", "plugn"], ["lowering='plugn' must be one of", "did you mean 'plugin'?"]),
        (["export", "--set", "heads=0"], ["unknown option 'heads'", "did you mean 'n_heads'?"]),
        (["export", "--set", "n_heads=0"], ["n_heads=0 must be > 0"]),
        (["export", "--set", "d_model=big"], ["d_model='big' must be an integer"]),
        (["export", "--set", "d_model=30", "--set", "n_heads=4"], ["divisible"]),
        (["export", "--set", "novalue"], ["--set expects key=value"]),
        (["export", "--opset", "9"], ["opset 9 is not supported"]),
        (["export", "--seq-lens", "3,x"], ["--seq-lens must be comma-separated integers"]),
        (["export", "--bogus"], ["No such option"]),
    ],
)
def test_export_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, fragments):
    out = tmp_path / "out"
    code, _, stderr = run_cli([*args, "-o", str(out)])
    assert_one_line_error(code, stderr, *fragments)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_export_refuses_existing_out(exported_dir):
    before = sorted(p.name for p in exported_dir.iterdir())
    code, _, stderr = run_cli(["export", "-o", str(exported_dir)])
    assert_one_line_error(code, stderr, "already exists", "--force")
    assert sorted(p.name for p in exported_dir.iterdir()) == before


def test_export_refuses_unwritable_out(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, stderr = run_cli(["export", "-o", str(blocker / "out")])
    assert_one_line_error(code, stderr, "is a file, not a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only directories")
def test_export_refuses_read_only_parent(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    code, _, stderr = run_cli(["export", "-o", str(locked / "out")])
    assert_one_line_error(code, stderr, "permission denied")


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["verify", "missing-dir"], ["is not a directory"]),
        (["verify", "."], ["has no attnx.json"]),
        (["verify", "OUT", "--backends", "ort-gpu"], ["unknown backend 'ort-gpu'", "did you mean"]),
    ],
)
def test_verify_bad_input(exported_dir, args, fragments, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    args = [str(exported_dir) if a == "OUT" else a for a in args]
    code, _, stderr = run_cli(args)
    assert_one_line_error(code, stderr, *fragments)


def test_verify_refuses_tampered_weights(exported_dir, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for item in exported_dir.iterdir():
        (copy / item.name).write_bytes(item.read_bytes())
    (copy / "weights.safetensors").write_bytes(b"\0" + (copy / "weights.safetensors").read_bytes()[1:])
    code, _, stderr = run_cli(["verify", str(copy)])
    assert_one_line_error(code, stderr, "weights.safetensors changed since it was written", "re-export")


def test_broken_plugin_does_not_break_the_cli(tmp_path):
    env = {**os.environ, "ATTNX_PLUGINS": "tests.third_party.broken_plugin", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "attnx", "list", "--json"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert any(
        f["plugin"] == "tests.third_party.broken_plugin" and "flash_attn_9000" in f["error"]
        for f in data["failed_plugins"]
    )
    assert "softmax" in [v["name"] for v in data["variants"]]
    doctor = subprocess.run(
        [sys.executable, "-m", "attnx", "doctor"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert doctor.returncode == 0 and "plugin FAIL  tests.third_party.broken_plugin" in doctor.stdout


@pytest.mark.slow  # three processes; test_new_plugin exports and verifies a third-party plugin by default
def test_third_party_plugin_end_to_end_through_the_cli(tmp_path):
    """Listed, exported and verified (in a second process) with no change to attnx."""
    env = {**os.environ, "ATTNX_PLUGINS": "tests.third_party.sigmoid_plugin", "PYTHONPATH": str(REPO)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "attnx", *args], capture_output=True, text=True, env=env, cwd=REPO
        )

    listing = run("list", "--json")
    assert "sigmoid_test" in [v["name"] for v in json.loads(listing.stdout)["variants"]]
    out = tmp_path / "out"
    exported = run(
        "export",
        "--variant",
        "sigmoid_test",
        "-o",
        str(out),
        "--set",
        "attention_mask=false",
        "--seq-lens",
        "2,9",
        *TINY_SET,
    )
    assert exported.returncode == 0, exported.stderr
    verified = run("verify", str(out), "--seq-lens", "5")
    assert verified.returncode == 0 and "parity: PASSED" in verified.stdout
