"""``attnx new-plugin``: name checks, the scaffolded package, and the plugin it makes, end to end."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from attnx.cli import cli
from attnx.registry import DISABLE_AUTOLOAD_ENV, EXTRA_PLUGINS_ENV, set_registry
from attnx.scaffold import Plugin, render
from attnx.testing import check_variant
from tests.helpers import assert_one_line_error, run_cli

EXPECTED_FILES = [
    "README.md",
    "attnx_{n}/__init__.py",
    "attnx_{n}/kernel.py",
    "pyproject.toml",
    "tests/test_{n}.py",
]


def scaffold(tmp_path: Path, name: str) -> Path:
    out = tmp_path / f"{name}-plugin"
    result = CliRunner().invoke(cli, ["new-plugin", name, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def plugin_env(root: Path, plugins: str = "") -> dict[str, str]:
    """The environment of a subprocess that sees ``root`` on its path (and ATTNX_PLUGINS=plugins)."""
    env = {k: v for k, v in os.environ.items() if k not in (DISABLE_AUTOLOAD_ENV, EXTRA_PLUGINS_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    if plugins:
        env[EXTRA_PLUGINS_ENV] = plugins
    return env


def attnx(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnx", *args], env=env, cwd=cwd, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("Window", "must be lower-case letters and digits"),
        ("9lives", "(e.g. 'my_9lives')"),
        ("my-window", "(e.g. 'my_window')"),
        ("window__x", "words joined by single underscores"),
        ("w" * 41, "longer than 40 characters"),
        ("softmax", "variant 'softmax' already exists"),
    ],
)
def test_bad_names_are_refused_with_one_line_and_nothing_written(tmp_path, name, fragment):
    code, _, err = run_cli(["new-plugin", name, "-o", str(tmp_path / "out")])
    assert_one_line_error(code, err, fragment)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_needs_force_and_must_be_an_earlier_scaffold(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    code, _, err = run_cli(["new-plugin", "window", "-o", str(target)])
    assert_one_line_error(code, err, "already exists", "--force")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (target / "keep.txt").read_text() == "mine"

    code, _, err = run_cli(["new-plugin", "window", "-o", str(target), "--force"])
    assert_one_line_error(code, err, "holds no attnx_window/__init__.py", "choose another output path")
    assert (target / "keep.txt").read_text() == "mine"

    (target / "keep.txt").unlink()
    for _ in range(2):  # into the empty directory, then over that earlier scaffold
        result = CliRunner().invoke(cli, ["new-plugin", "window", "-o", str(target), "--force"])
        assert result.exit_code == 0, result.output
        assert (target / "attnx_window" / "kernel.py").is_file()
        assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging leftovers


def test_the_default_directory_is_the_distribution_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["new-plugin", "local_window"])
    assert result.exit_code == 0, result.output
    assert (
        "created attnx-local-window/ (package attnx_local_window, variant 'local_window', " in result.output
    )
    assert "op attnx::LocalWindowAttention" in result.output
    assert "pip install -e attnx-local-window" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["attnx-local-window"]


def test_every_generated_name_derives_from_the_plugin_name(tmp_path):
    root = scaffold(tmp_path, "local_window")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == sorted(f.format(n="local_window") for f in EXPECTED_FILES)
    for name in files:
        text = (root / name).read_text()
        assert "${" not in text and "PACKAGE" not in text and "NAME" not in text, name
        if name.endswith(".py"):
            compile(text, name, "exec")
    project = (root / "pyproject.toml").read_text()
    assert 'name = "attnx-local-window"' in project
    assert '[project.entry-points.attnx]\nlocal_window = "attnx_local_window"\n' in project
    kernel = (root / "attnx_local_window" / "kernel.py").read_text()
    assert 'custom_op("attnx_local_window::local_window_attention"' in kernel
    assert 'name="LocalWindowAttention"' in kernel
    library = re.findall(r"@onnxscript\.script\(LIBRARY, default_opset=op\)\ndef (\w+)\(", kernel)
    assert library and all(fn.startswith("LocalWindow") for fn in library), library
    assert Plugin("a_b2_c").camel == "AB2C"


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed (pip install -e '.[dev]')")
def test_the_generated_code_is_ruff_clean(tmp_path):
    root = scaffold(tmp_path, "window")
    for args in (["check", "."], ["format", "--check", "."]):
        done = subprocess.run(["ruff", *args], cwd=root, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_rendering_needs_no_filesystem_and_the_light_module_imports_no_torch(tmp_path):
    files = render(Plugin("window"))
    assert sorted(map(str, files)) == sorted(f.format(n="window") for f in EXPECTED_FILES)
    root = scaffold(tmp_path, "window")
    probe = "import sys, attnx_window; assert 'torch' not in sys.modules, 'the light module imported torch'"
    done = subprocess.run([sys.executable, "-c", probe], env=plugin_env(root), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_scaffolded_plugin_passes_the_light_kit(tmp_path, monkeypatch):
    """In process, before any installation: the kit registers the Variant object itself."""
    root = scaffold(tmp_path, "window_kit")
    monkeypatch.syspath_prepend(str(root))
    from attnx_window_kit import VARIANT

    report = check_variant(VARIANT, heavy=False, bad_options={"window": -1, "scale": 0.0})
    assert report.passed, str(report)
    assert report.result("causality").status == "passed"


def test_the_scaffolded_plugin_registers_exports_and_verifies_without_pip(tmp_path, monkeypatch):
    root = scaffold(tmp_path, "window_dev")
    env = plugin_env(root, plugins="attnx_window_dev")

    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv(EXTRA_PLUGINS_ENV, "attnx_window_dev")
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    previous = set_registry(None)
    try:
        code, out, err = run_cli(["list", "--json"])
    finally:
        set_registry(previous)
    assert code == 0, err
    listing = json.loads(out)
    (variant,) = [v for v in listing["variants"] if v["name"] == "window_dev"]
    assert variant["capabilities"]["causal"] and variant["options"] == {"window": 4, "scale": None}
    assert listing["failed_plugins"] == []

    export = attnx(
        "export",
        "--variant",
        "window_dev",
        "--set",
        "window=2",
        "--seq-lens",
        "1,7,19",
        "-o",
        "out",
        env=env,
        cwd=tmp_path,
    )
    assert export.returncode == 0, export.stdout + export.stderr
    assert "parity: PASSED on ort-cpu" in export.stdout
    manifest = json.loads((tmp_path / "out" / "attnx.json").read_text())
    assert manifest["variant"] == "window_dev" and manifest["variant_config"]["window"] == 2
    assert manifest["ops"] == ["attnx::WindowDevAttention"]

    verify = attnx("verify", "out", "--seq-lens", "1,13", env=env, cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "parity: PASSED on ort-cpu" in verify.stdout


@pytest.mark.slow
def test_the_pip_installed_plugin_works_with_no_change_to_attnx(tmp_path):
    """The issue's promise: new-plugin, pip install -e, then list/export/verify and the plugin's own tests."""
    root = scaffold(tmp_path, "window_pip")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    env = plugin_env(tmp_path / "nothing")  # nothing extra on the path: only the installed entry point
    install = subprocess.run(
        [*pip, "install", "--no-deps", "--no-build-isolation", "-e", str(root)],
        capture_output=True,
        text=True,
    )
    try:
        assert install.returncode == 0, install.stdout + install.stderr
        listing = attnx("list", "--json", env=env, cwd=tmp_path)
        assert listing.returncode == 0, listing.stderr
        data = json.loads(listing.stdout)
        assert "window_pip" in [v["name"] for v in data["variants"]]
        plugin = {"builtin": False, "name": "window_pip", "source": "entry point (attnx-window-pip)"}
        assert plugin in data["plugins"]

        export = attnx(
            "export", "--variant", "window_pip", "--lowering", "plugin", "-o", "out", env=env, cwd=tmp_path
        )
        assert export.returncode == 0, export.stdout + export.stderr
        verify = attnx("verify", "out", env=env, cwd=tmp_path)
        assert verify.returncode == 0, verify.stdout + verify.stderr

        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
        assert " passed" in tests.stdout and "failed" not in tests.stdout
    finally:
        subprocess.run([*pip, "uninstall", "-y", "attnx-window-pip"], capture_output=True, text=True)
