"""Bad input through the real CLI, one row per case: the exit code, the one error line (or what a
command that must keep working prints), and that nothing was written and nothing the user had changed.

Add a row to ``CASES``: ``Case(id, argv, expect, files=..., env=...)``. Paths in ``argv`` and
``files`` are relative to a fresh temporary directory, which is also the working directory.
``files`` maps a path to its content: text or bytes, ``DIR``, ``Link(target)``, ``EXPORT`` (a
directory holding attnx.json, as ``--force`` may replace), ``Made(kind)`` (a copy of a real tiny export:
"encoder", or "lm" with decode graphs), ``Manifest(kind, change)`` (that export's attnx.json after
``change``), or a callable returning bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from attnx.exporter.manifest import SCHEMA_VERSION
from attnx.registry import set_registry
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, interruptible, run_cli, start_holder

REPO = Path(__file__).resolve().parents[2]
TINY_SET = tuple(arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}"))
QUICK = ("--no-verify", *TINY_SET)
DIR = "<dir>"
EXPORT = "<export>"
BIG = str(2**63)
MALFORMED = "tests.third_party.malformed_plugin"


@dataclasses.dataclass(frozen=True)
class Link:
    target: str


@dataclasses.dataclass(frozen=True)
class Made:
    kind: str  # "encoder" or "lm"


@dataclasses.dataclass(frozen=True)
class Manifest:
    kind: str
    change: Callable[[dict[str, Any]], None]


def without(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda manifest: manifest.pop(key)


def setting(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda manifest: manifest.__setitem__(key, value)


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad input.

    Attributes:
        argv: the ``attnx`` arguments.
        expect: fragments of the one error line (code 2), or of stdout (code 0).
        files: what exists before the run (see the module docstring).
        env: environment variables for the run (e.g. ATTNX_PLUGINS); the registry is rebuilt.
        code: the exit code.
        absent: text that must appear nowhere in the output (e.g. torch's advice).
        creates: top-level names the run may add (a command that must keep working).
    """

    id: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    files: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    code: int = 2
    absent: tuple[str, ...] = ()
    creates: tuple[str, ...] = ()


def torch_bytes(make: Callable[[], Any]) -> Callable[[], bytes]:
    """The bytes ``torch.save`` writes for ``make()`` (built when the row runs)."""

    def build() -> bytes:
        import torch

        buffer = io.BytesIO()
        torch.save(make(), buffer)
        return buffer.getvalue()

    return build


class RunsCode:
    """Unpickling this would run a shell command: what a malicious checkpoint does."""

    def __reduce__(self):
        return (os.system, ("touch pwned",))


class Custom:
    pass


def zeros(*shape: int) -> Callable[[], Any]:
    def make() -> Any:
        import torch

        return {"weight": torch.zeros(*shape)}

    return make


def safetensors_bytes() -> bytes:
    import numpy as np
    from safetensors.numpy import save

    return save({"not.a.weight": np.zeros((3, 3), dtype=np.float32)})


def truncated_checkpoint() -> bytes:
    data = torch_bytes(zeros(4, 4))()
    return data[: len(data) // 2]


def export(*argv: str) -> tuple[str, ...]:
    return ("export", *argv)


def recipe(text: str | bytes) -> dict[str, Any]:
    return {"r.toml": text}


TOML_HEAD = '[model]\nname = "encoder"\n[variant]\nname = "softmax"\n'
CHECKPOINT = ("--checkpoint", "w.pt", "-o", "out", *QUICK)

OUT_PATHS = [
    Case("dot", export("-o", ".", *QUICK), ("working directory", "choose a new output path"), {"keep": "x"}),
    Case("dot-force", export("-o", ".", "--force", *QUICK), ("working directory",), {"keep": "x"}),
    Case("empty-path-force", export("-o", "", "--force", *QUICK), ("working directory",)),
    Case("sub-dotdot-force", export("-o", "sub/..", "--force", *QUICK), ("working directory",), {"sub": DIR}),
    Case("parent-force", export("-o", "..", "--force", *QUICK), ("working directory",)),
    Case(
        "dangling-link",
        export("-o", "out", *QUICK),
        ("is a broken symbolic link",),
        {"out": Link("nowhere")},
    ),
    Case(
        "dangling-link-force",
        export("-o", "out", "--force", *QUICK),
        ("is a broken symbolic link", "give a real directory path"),
        {"out": Link("nowhere")},
    ),
    Case(
        "link-loop",
        export("-o", "la", *QUICK),
        ("is a broken symbolic link",),
        {"la": Link("lb"), "lb": Link("la")},
    ),
    Case(
        "under-link-loop",
        export("-o", "la/o", *QUICK),
        ("'la' is a broken",),
        {"la": Link("lb"), "lb": Link("la")},
    ),
    Case("link-to-dir", export("-o", "out", *QUICK), ("is a symbolic link",), {"d": DIR, "out": Link("d")}),
    Case(
        "link-to-export-force",
        export("-o", "out", "--force", *QUICK),
        ("is a symbolic link (to 'e')",),
        {"e": EXPORT, "out": Link("e")},
    ),
    Case("out-is-file", export("-o", "out", *QUICK), ("exists and is not a directory",), {"out": "text"}),
    Case("out-is-file-force", export("-o", "out", "--force", *QUICK), ("is not a directory",), {"out": "t"}),
    Case("under-file", export("-o", "f/out", *QUICK), ("'f' is a file, not a directory",), {"f": "text"}),
    Case("deep-under-file", export("-o", "f/a/b/out", *QUICK), ("is a file, not a directory",), {"f": "t"}),
    Case(
        "under-dangling-link",
        export("-o", "l/out", *QUICK),
        ("'l' is a broken symbolic link",),
        {"l": Link("nowhere")},
    ),
    Case(
        "force-over-user-data",
        export("-o", "mine", "--force", *QUICK),
        ("holds no attnx.json, so it is not an earlier output", "choose another output path"),
        {"mine/thesis.tex": "years of work", "mine/data/x.csv": "1,2"},
    ),
    Case(
        "force-over-hidden-only",
        export("-o", "mine", "--force", *QUICK),
        ("holds no attnx.json",),
        {"mine/.git/HEAD": "ref: main"},
    ),
    Case(
        "force-over-nested-export",
        export("-o", "mine", "--force", *QUICK),
        ("holds no attnx.json",),
        {"mine/inner": EXPORT},
    ),
    Case("existing-dir", export("-o", "mine", *QUICK), ("already exists", "--force"), {"mine/a": "x"}),
    Case("existing-export", export("-o", "e", *QUICK), ("already exists", "--force"), {"e": EXPORT}),
    Case("existing-empty", export("-o", "e", *QUICK), ("already exists", "--force"), {"e": DIR}),
    Case(
        "scaffold-over-user-data",
        ("new-plugin", "window", "-o", "mine", "--force"),
        ("holds no attnx_window/__init__.py",),
        {"mine/notes.txt": "keep"},
    ),
    Case("scaffold-at-file", ("new-plugin", "window", "-o", "f"), ("is not a directory",), {"f": "x"}),
    Case(
        "scaffold-dangling",
        ("new-plugin", "window", "-o", "l"),
        ("broken symbolic link",),
        {"l": Link("nowhere")},
    ),
]

SAVE_CHECKPOINT = [
    Case(
        "save-at-dir",
        export("--save-checkpoint", "d", "-o", "out", *QUICK),
        ("checkpoint file 'd' is a directory",),
        {"d": DIR},
    ),
    Case(
        "save-at-dir-force",
        export("--save-checkpoint", "d", "-o", "out", "--force", *QUICK),
        ("is a directory; give a file path",),
        {"d/keep": "x"},
    ),
    Case(
        "save-under-file",
        export("--save-checkpoint", "f/w.pt", "-o", "out", *QUICK),
        ("cannot create 'f/w.pt'", "is a file, not a directory"),
        {"f": "x"},
    ),
    Case(
        "save-existing",
        export("--save-checkpoint", "w.pt", "-o", "out", *QUICK),
        ("checkpoint file 'w.pt' already exists", "--force"),
        {"w.pt": "old"},
    ),
    Case(
        "save-under-dangling",
        export("--save-checkpoint", "l/w.pt", "-o", "out", *QUICK),
        ("broken symbolic link",),
        {"l": Link("nowhere")},
    ),
]

CHECKPOINTS = [
    Case(
        "pickle-runs-code",
        export(*CHECKPOINT),
        ("refusing checkpoint 'w.pt'", "pickles objects other than tensors", "GLOBAL posix.system"),
        {"w.pt": torch_bytes(lambda: {"weight": RunsCode()})},
        absent=("weights_only",),
    ),
    Case(
        "pickle-custom-class",
        export(*CHECKPOINT),
        ("refusing checkpoint", "Custom"),
        {"w.pt": torch_bytes(lambda: {"weight": Custom()})},
        absent=("weights_only",),
    ),
    Case(
        "pickle-builtin",
        export(*CHECKPOINT),
        ("refusing checkpoint", "GLOBAL print"),
        {"w.pt": pickle.dumps({"weight": print}, protocol=2)},
        absent=("weights_only",),
    ),
    Case("ckpt-text", export(*CHECKPOINT), ("cannot read checkpoint 'w.pt'",), {"w.pt": "hello world"}),
    Case("ckpt-empty", export(*CHECKPOINT), ("cannot read checkpoint",), {"w.pt": b""}),
    Case("ckpt-short", export(*CHECKPOINT), ("cannot read checkpoint",), {"w.pt": b"abc"}),
    Case("ckpt-random", export(*CHECKPOINT), ("cannot read checkpoint",), {"w.pt": bytes(range(256)) * 4}),
    Case("ckpt-truncated", export(*CHECKPOINT), ("cannot read checkpoint",), {"w.pt": truncated_checkpoint}),
    Case("ckpt-missing", export(*CHECKPOINT), ("checkpoint 'w.pt' does not exist",)),
    Case("ckpt-directory", export(*CHECKPOINT), ("is not a file",), {"w.pt": DIR}),
    Case("ckpt-list", export(*CHECKPOINT), ("is not a state dict",), {"w.pt": torch_bytes(lambda: [1, 2])}),
    Case(
        "ckpt-bad-safetensors",
        export("--checkpoint", "w.safetensors", "-o", "out", *QUICK),
        ("cannot read safetensors checkpoint",),
        {"w.safetensors": "not really"},
    ),
    Case(
        "ckpt-wrong-keys",
        export("--checkpoint", "w.safetensors", "-o", "out", *QUICK),
        ("does not fit the model", "unexpected 1 key: not.a.weight"),
        {"w.safetensors": safetensors_bytes},
    ),
    Case(
        "ckpt-wrong-shapes",
        export(*CHECKPOINT),
        ("does not fit the model", "missing"),
        {"w.pt": torch_bytes(zeros(2, 2))},
    ),
]

RECIPES = [
    Case(
        "recipe-latin1",
        export("--recipe", "r.toml", "-o", "out"),
        ("is not UTF-8 text",),
        recipe(b"x = '\xe9'"),
    ),
    Case(
        "recipe-deep-arrays",
        export("--recipe", "r.toml", "-o", "out"),
        ("nests arrays or tables too deeply",),
        recipe("a = " + "[" * 5000 + "]" * 5000),
    ),
    Case(
        "recipe-deep-tables",
        export("--recipe", "r.toml", "-o", "out"),
        ("too deeply",),
        recipe("a = " + "{b = " * 2000 + "1" + "}" * 2000),
    ),
    Case(
        "recipe-deep-value",
        export("--recipe", "r.toml", "-o", "out"),
        ("too deeply",),
        recipe(TOML_HEAD.replace('"encoder"\n', '"encoder"\nd_model = ' + "[" * 300 + "]" * 300 + "\n")),
    ),
    Case("recipe-not-toml", export("--recipe", "r.toml", "-o", "out"), ("is not valid TOML",), recipe("[[[")),
    Case(
        "recipe-missing", export("--recipe", "r.toml", "-o", "out"), ("recipe file 'r.toml' does not exist",)
    ),
    Case("recipe-dir", export("--recipe", "r.toml", "-o", "out"), ("does not exist",), {"r.toml": DIR}),
    Case("recipe-empty", export("--recipe", "r.toml", "-o", "out"), ("missing table [model]",), recipe("")),
    Case(
        "recipe-unknown-key",
        export("--recipe", "r.toml", "-o", "out"),
        ("unknown key 'colour'",),
        recipe(TOML_HEAD + "colour = 1\n"),
    ),
    Case(
        "recipe-wrong-type",
        export("--recipe", "r.toml", "-o", "out"),
        ("d_model = 'big' must be an integer",),
        recipe(TOML_HEAD.replace('"encoder"\n', '"encoder"\nd_model = "big"\n')),
    ),
    Case(
        "recipe-huge-seed",
        export("--recipe", "r.toml", "-o", "out"),
        ("seed=9223372036854775808 must be in 0..9223372036854775807",),
        recipe(TOML_HEAD + "[export]\nseed = 9223372036854775808\n"),
    ),
    Case(
        "recipe-unknown-name",
        export("--recipe", "tiny-encodr", "-o", "out"),
        ("unknown recipe 'tiny-encodr'",),
    ),
]

SEEDS = [
    Case(
        "seed-above-int64", export("--seed", BIG, "-o", "out", *QUICK), ("must be in 0..9223372036854775807",)
    ),
    Case("seed-above-uint64", export("--seed", str(2**64 + 5), "-o", "out", *QUICK), ("signed 64-bit",)),
    Case("seed-negative", export("--seed", "-1", "-o", "out", *QUICK), ("seed=-1 must be in 0..",)),
    Case(
        "seed-set-override", export("--set", f"export.seed={BIG}", "-o", "out", *QUICK), ("must be in 0..",)
    ),
    Case(
        "generate-seed-above-int64",
        ("generate", "out", "--prompt-ids", "1", "--seed", str(2**64)),
        ("'--seed'", "is not in the range 0<=x<=9223372036854775807"),
    ),
    Case("generate-seed-negative", ("generate", "out", "--prompt-ids", "1", "--seed", "-1"), ("'--seed'",)),
]

PROMPTS = [
    Case(
        "prompt-latin1",
        ("generate", "out", "--prompt-file", "p.txt"),
        ("prompt file 'p.txt' is not UTF-8 text",),
        {"p.txt": b"1 2 \xe9 3"},
    ),
    Case(
        "prompt-missing",
        ("generate", "out", "--prompt-file", "p.txt"),
        ("prompt file 'p.txt' does not exist",),
    ),
    Case("prompt-dir", ("generate", "out", "--prompt-file", "p.txt"), ("does not exist",), {"p.txt": DIR}),
    Case(
        "prompt-words", ("generate", "out", "--prompt-file", "p.txt"), ("got 'hello'",), {"p.txt": "1 hello"}
    ),
]


def malformed(choice: str) -> dict[str, str]:
    return {"ATTNX_PLUGINS": MALFORMED, "ATTNX_TEST_MALFORMED": choice}


def plugins(*modules: str) -> dict[str, str]:
    return {"ATTNX_PLUGINS": ",".join(f"tests.third_party.{m}" for m in modules)}


PLUGINS = [
    *(
        Case(f"list-{choice}", ("list", "--json"), (MALFORMED, fragment), env=malformed(choice), code=0)
        for choice, fragment in [
            ("dict", "returned dict"),
            ("bare-variant", "returned Variant"),
            ("not-a-variant", "not a Variant"),
            ("config-not-a-dataclass", "is not a @dataclass subclass of Config"),
            ("config-instance", "is not a @dataclass subclass of Config"),
            ("capabilities-dict", "is dict, not Capabilities"),
            ("model-config-not-a-config", "attnx_register_models()"),
            ("sys-exit", "SystemExit: 3"),
        ]
    ),
    Case(
        "doctor-malformed", ("doctor", "--json"), (MALFORMED, "returned dict"), env=malformed("dict"), code=0
    ),
    Case(
        "export-from-malformed",
        export("--variant", "malformed_test", "-o", "out", *QUICK),
        ("unknown variant 'malformed_test'", f"plugins that failed: {MALFORMED}"),
        env=malformed("dict"),
    ),
    Case(
        "builtin-exports-beside-malformed",
        export("--variant", "softmax", "-o", "out", *QUICK),
        ("wrote out/model.onnx",),
        env=malformed("bare-variant"),
        code=0,
        creates=("out",),
    ),
    Case("help-with-exiting", ("--help",), ("Usage: attnx",), env=plugins("exiting_plugin"), code=0),
    Case(
        "list-with-exiting",
        ("list", "--json"),
        ("SystemExit: exiting_plugin: cannot find my license file", '"softmax"'),
        env=plugins("exiting_plugin"),
        code=0,
    ),
    Case(
        "export-help-exiting",
        (
            "export",
            "--help",
        ),
        ("attnx export",),
        env=plugins("exiting_plugin"),
        code=0,
    ),
    Case(
        "list-with-intruder",
        ("list", "--json"),
        ("registered by the built-in plugin 'softmax' and by 'tests.third_party.intruder_plugin'",),
        env=plugins("intruder_plugin"),
        code=0,
    ),
    Case(
        "recipe-beside-intruder",
        export("--recipe", "tiny-encoder", "-o", "out", "--no-verify"),
        ("with softmax attention",),
        env=plugins("intruder_plugin"),
        code=0,
        creates=("out",),
    ),
    Case(
        "list-hook-typo", ("list", "--json"), ("which is no attnx hook",), env=plugins("typo_plugin"), code=0
    ),
    Case("help-hook-typo", ("export", "--help"), ("attnx export",), env=plugins("typo_plugin"), code=0),
    Case(
        "list-broken-import", ("list", "--json"), ("flash_attn_9000",), env=plugins("broken_plugin"), code=0
    ),
    Case(
        "list-raising-hook",
        ("list", "--json"),
        ("cannot read my config file",),
        env=plugins("raising_hook_plugin"),
        code=0,
    ),
    Case(
        "duplicate-names",
        export("--variant", "sigmoid_test", "-o", "out", *QUICK),
        ("variant 'sigmoid_test' is registered by plugins", "uninstall or rename one"),
        env=plugins("sigmoid_plugin", "duplicate_plugin"),
    ),
]

ENCODER, LM = Made("encoder"), Made("lm")
ENC = {"e": ENCODER}

EXPORTS = [
    Case("manifest-empty", ("verify", "e"), ("schema_version None", "re-export"), {"e/attnx.json": "{}"}),
    Case("manifest-not-json", ("bench", "e"), ("is not valid JSON",), {"e/attnx.json": "not json"}),
    Case(
        "manifest-array", ("generate", "e", "--prompt-ids", "1"), ("holds an array",), {"e/attnx.json": "[1]"}
    ),
    Case("manifest-absent", ("doctor", "e"), ("has no attnx.json",), {"e/model.onnx": "x"}),
    Case("export-absent", ("verify", "nodir"), ("'nodir' is not a directory", "pass the OUT directory")),
    Case(
        "manifest-future",
        ("verify", "e"),
        (f"schema_version 99; this attnx reads {SCHEMA_VERSION}",),
        {**ENC, "e/attnx.json": Manifest("encoder", setting("schema_version", 99))},
    ),
    Case(
        "manifest-lacks-inputs",
        ("verify", "e"),
        ("lacks 'inputs'",),
        {**ENC, "e/attnx.json": Manifest("encoder", without("inputs"))},
    ),
    Case(
        "manifest-unknown-variant",
        ("verify", "e"),
        ("unknown variant 'nosuch'",),
        {**ENC, "e/attnx.json": Manifest("encoder", setting("variant", "nosuch"))},
    ),
    Case(
        "onnx-corrupt",
        ("verify", "e"),
        ("model.onnx changed since it was written",),
        {**ENC, "e/model.onnx": "x"},
    ),
    Case(
        "weights-corrupt",
        ("bench", "e", "--backends", "torch"),
        ("weights.safetensors changed since it was written",),
        {**ENC, "e/weights.safetensors": b"\0" * 8},
    ),
    Case(
        "decode-corrupt",
        ("generate", "e", "--prompt-ids", "1"),
        ("decode.onnx changed since it was written",),
        {"e": LM, "e/decode.onnx": b"x"},
    ),
    Case("generate-no-decode", ("generate", "e", "--prompt-ids", "1"), ("has no decode export",), ENC),
    Case("verify-torch", ("verify", "e", "--backends", "torch"), ("torch is the reference",), ENC),
    Case("verify-seq-lens-zero", ("verify", "e", "--seq-lens", "0"), ("must be positive integers",), ENC),
    Case("verify-atol-negative", ("verify", "e", "--atol", "-1"), ("--atol and --rtol must be >= 0",), ENC),
    Case("verify-batch-zero", ("verify", "e", "--batch", "0"), ("batch must be >= 1",), ENC),
    Case("bench-unknown-backend", ("bench", "e", "--backends", "ort-gpu"), ("did you mean 'ort-cpu'",), ENC),
    Case("generate-id-out-of-range", ("generate", "e", "--prompt-ids", "99"), ("ids are 0..49",), {"e": LM}),
    Case("generate-zero-tokens", ("generate", "e", "--prompt-ids", "1", "-n", "0"), ("1<=x<=",), {"e": LM}),
    Case(
        "generate-engine-backend",
        ("generate", "e", "--prompt-ids", "1", "--backend", "trt"),
        ("does not run decode graphs",),
        {"e": LM},
    ),
    Case(
        "triton-over-export",
        ("triton", "e", "--repo", "mine", "--force"),
        ("'mine' is an attnx export, not a Triton model repository",),
        {"e": LM, "mine": ENCODER},
    ),
]

CASES = [*OUT_PATHS, *SAVE_CHECKPOINT, *CHECKPOINTS, *RECIPES, *SEEDS, *PROMPTS, *PLUGINS, *EXPORTS]


def create(root: Path, files: Mapping[str, Any], made: Callable[[str], Path]) -> None:
    for name, content in sorted(files.items()):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Made):
            shutil.copytree(made(content.kind), path)
        elif isinstance(content, Manifest):
            manifest = json.loads((made(content.kind) / "attnx.json").read_text())
            content.change(manifest)
            path.write_text(json.dumps(manifest))
        elif content == DIR:
            path.mkdir()
        elif content == EXPORT:
            path.mkdir()
            (path / "attnx.json").write_text("{}")
            (path / "model.onnx").write_bytes(b"earlier export")
        elif isinstance(content, Link):
            path.symlink_to(content.target)
        else:
            data = content() if callable(content) else content
            path.write_bytes(data.encode() if isinstance(data, str) else data)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (links not followed): its kind, mode and content hash or target."""
    entries: dict[str, tuple] = {}
    for directory, subdirs, files in os.walk(root):
        for name in [*subdirs, *files]:
            path = Path(directory, name)
            info = path.lstat()
            if path.is_symlink():
                entries[str(path.relative_to(root))] = ("link", os.readlink(path))
            elif path.is_dir():
                entries[str(path.relative_to(root))] = ("dir", info.st_mode)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                entries[str(path.relative_to(root))] = ("file", info.st_mode, digest)
    return entries


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Callable[[str], Path]:
    """``made(kind)`` -> a tiny unverified export ("encoder"; "lm" with decode graphs), made on first use."""
    exports: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in exports:
            import attnx

            options = {**TINY, "verify.enabled": False, "export.decode": kind == "lm"}
            out = tmp_path_factory.mktemp("made") / kind
            attnx.export("linear" if kind == "lm" else "softmax", out, model=kind, options=options)
            exports[kind] = out
        return exports[kind]

    return get


@pytest.fixture
def fresh_registry(monkeypatch) -> Iterator[Callable[[Mapping[str, str]], None]]:
    """Set environment variables, then let the CLI build its registry from them."""
    previous = set_registry(None)

    def apply(env: Mapping[str, str]) -> None:
        monkeypatch.setenv("PYTHONPATH", str(REPO))
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        set_registry(None)

    yield apply
    set_registry(previous)


def test_the_table_covers_every_class_with_enough_rows():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    assert len(CASES) >= 100


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input(case: Case, tmp_path, monkeypatch, fresh_registry, made):
    create(tmp_path, case.files, made)
    (tmp_path / "sub").mkdir(exist_ok=True)
    monkeypatch.chdir(tmp_path / "sub" if case.id == "parent-force" else tmp_path)
    before = snapshot(tmp_path)
    fresh_registry(case.env)
    code, stdout, stderr = run_cli(list(case.argv))
    if case.code == 2:
        assert_one_line_error(code, stderr, *case.expect)
    else:
        assert code == case.code, f"exit code {code}, stderr: {stderr}"
        assert "Traceback" not in stderr
        for fragment in case.expect:
            assert fragment in stdout, f"{fragment!r} not in stdout: {stdout[:2000]}"
    for text in case.absent:
        assert text not in stdout + stderr, f"{text!r} in the output"
    after = snapshot(tmp_path)
    added = {name for name in set(after) - set(before) if name.split(os.sep)[0] not in case.creates}
    assert not added, f"written: {sorted(added)}"
    assert {name: after.get(name) for name in before} == before, "something the user had changed"
    assert not (tmp_path / "pwned").exists()


# -- signals and concurrent writers: real processes -------------------------------------------------


def start_export(root: Path, inside: bool = True) -> subprocess.Popen:
    """``attnx export -o out`` of a tiny linear encoder in a child process (``inside``: once it is
    inside torch.onnx, holding OUT's lock)."""
    child = subprocess.Popen(
        interruptible("attnx", "export", "--variant", "linear", "-o", "out", *QUICK),
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stderr is not None
    while inside and "exporting with torch.onnx" not in (line := child.stderr.readline()):
        assert line, f"the export ended early: {child.communicate()}"
    return child


def test_ctrl_c_during_the_export_prints_interrupted_exits_130_and_leaves_nothing(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    before = snapshot(tmp_path)
    child = start_export(tmp_path)
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert child.returncode == 130 and lines[-1] == "Interrupted.", stderr
    assert "Traceback" not in stderr
    assert snapshot(tmp_path) == before


def test_ctrl_c_that_torch_onnx_wraps_is_still_an_interrupt(tmp_path, monkeypatch):
    """torch.onnx turns Ctrl-C during its lazy imports into a TorchExportError caused by an
    AttributeError whose context is the KeyboardInterrupt (seen with torch 2.13)."""
    import torch

    def interrupted(*args, **kwargs):
        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise AttributeError("module 'torch._dynamo' has no attribute 'exc'") from None
        except AttributeError as exc:
            raise RuntimeError("Failed to export the model with torch.export") from exc

    monkeypatch.setattr(torch.onnx, "export", interrupted)
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_cli(["export", "-o", "out", *QUICK])
    assert code == 130 and stderr.strip().splitlines()[-1] == "Interrupted." and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []


def test_a_killed_export_leaves_staging_that_the_next_export_removes(tmp_path, monkeypatch):
    """SIGKILL cannot be handled (SIGTERM is, like Ctrl-C: tests/security/test_hostile_inputs.py)."""
    child = start_export(tmp_path)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL
    left = sorted(p.name for p in tmp_path.iterdir())
    assert any(name.startswith(".out.") and name.endswith(".partial") for name in left), left
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_cli(["export", "-o", "out", *QUICK])
    assert code == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.slow  # two export processes racing; tests/test_atomic.py proves the lock by default
def test_concurrent_exports_to_one_out_one_wins_the_other_gets_one_line(tmp_path):
    children = [start_export(tmp_path), start_export(tmp_path, inside=False)]
    results = [(child.wait(timeout=300), child.communicate()[1]) for child in children]
    assert [code for code, _ in results] == [0, 2], results
    stderr = results[1][1]
    assert_one_line_error(2, stderr)
    assert "another attnx process is writing 'out'" in stderr or "already exists" in stderr
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (tmp_path / "out" / "model.onnx").is_file()
    )


def test_an_export_while_another_writes_out_is_refused_in_one_line(tmp_path, monkeypatch):
    holder = start_holder(tmp_path / "out", seconds=120)
    try:
        monkeypatch.chdir(tmp_path)
        code, _, stderr = run_cli(["export", "-o", "out", "--force", *QUICK])
        assert_one_line_error(
            code, stderr, "another attnx process is writing 'out'", "choose another output path"
        )
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    "argv", [["list"], ["list", "--json"], ["--help"], ["export", "--help"]], ids=" ".join
)
def test_a_closed_stdout_ends_the_command_with_exit_0(argv):
    """``attnx list | head -1``: the reader goes away before attnx writes; no traceback, exit 0."""
    read, write = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "attnx", *argv], stdout=write, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    os.close(write)
    os.close(read)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 0 and stderr == "", stderr
