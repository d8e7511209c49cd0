"""Exports someone else made: real tiny exports to plant payloads, links and corrupt files in, a record
of every file Python opens while a command runs, and the marker a payload would write."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import attnx
from tests.conftest import TINY
from tests.serve.conftest import word_tokenizer

MARKER = "pwned"  # what every planted payload writes (in the working directory)


class RunsCode:
    """Unpickling this runs a shell command that writes :data:`MARKER`: a malicious file's payload."""

    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


@pytest.fixture(scope="session")
def made(tmp_path_factory) -> Callable[[str], Path]:
    """``made(kind)`` -> a tiny unverified export: "lm" (linear, decode graphs, genai decoder and a
    tokenizer) or "module" (``attnx.export_module`` of a module of attnx layers), made on first use."""
    exports: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in exports:
            root = tmp_path_factory.mktemp(f"made-{kind}")
            out = root / kind
            if kind == "lm":
                tokenizer = word_tokenizer(root / "tokenizer.json")
                options = {
                    **TINY,
                    "verify.enabled": False,
                    "export.decode": True,
                    "export.tokenizer": str(tokenizer),
                }
                attnx.export("linear", out, model="lm", options=options)
            else:
                from tests.adapters.factories import attnx_layers

                module, example = attnx_layers()
                attnx.export_module(module, example, out, options={"verify.enabled": False})
            exports[kind] = out
        return exports[kind]

    return get


@pytest.fixture
def copy(made, tmp_path) -> Callable[[str], Path]:
    """``copy(kind)`` -> a fresh copy of ``made(kind)`` at ``tmp_path/e``."""

    def get(kind: str) -> Path:
        target = tmp_path / "e"
        shutil.copytree(made(kind), target)
        return target

    return get


def rehash(out: Path, key: str | None = None) -> None:
    """Rewrite the SHA-256 of manifest file ``key`` (every file: None) as a forger would."""
    manifest = json.loads((out / "attnx.json").read_text())
    for name, record in manifest["files"].items():
        if key in (None, name) and not (out / record["path"]).is_symlink():
            record["sha256"] = hashlib.sha256((out / record["path"]).read_bytes()).hexdigest()
    (out / "attnx.json").write_text(json.dumps(manifest))


def edit_manifest(out: Path, change: Callable[[dict], None]) -> None:
    manifest = json.loads((out / "attnx.json").read_text())
    change(manifest)
    (out / "attnx.json").write_text(json.dumps(manifest))


_OPENED: list[tuple[str, int]] | None = None


def _record(event: str, args: tuple) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        _OPENED.append((os.fsdecode(args[0]), flags))


sys.addaudithook(_record)  # audit hooks cannot be removed; this one records only inside `opened`


class Opened:
    """Records every file Python opens (``open``, ``os.open``) after :meth:`start`."""

    def start(self) -> None:
        global _OPENED
        _OPENED = []

    def following(self, target: Path) -> list[str]:
        """The opens that reached ``target`` (through a link to it too); ``O_NOFOLLOW`` opens do not."""
        real = os.path.realpath(target)
        records = list(_OPENED or [])
        return [
            path for path, flags in records if os.path.realpath(path) == real and not flags & os.O_NOFOLLOW
        ]


@pytest.fixture
def opened() -> Iterator[Opened]:
    global _OPENED
    yield Opened()
    _OPENED = None


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """The working directory of a run: where a payload would write :data:`MARKER`."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
