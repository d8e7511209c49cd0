"""An export directory someone else made: nothing outside OUT is read, and every file is what it claims.

Each case plants a symbolic link or a corrupt file in a real export, rewrites the manifest's hashes to
match (as a forger would) and runs the commands that read that file: exit 2, one line naming the file
and the fix, nothing written, and no file outside OUT opened (Python's audit hook sees every open).
A link to a valid copy of the file shows that following it would have worked: only the refusal
stops it. A link inside OUT to a file inside OUT is refused too: an export's files are plain files.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error, run_cli
from tests.security.conftest import rehash

COMMANDS = {
    "verify": ["verify", "e", "--no-write"],
    "generate": ["generate", "e", "--prompt-ids", "1", "-n", "2"],
    "text": ["generate", "e", "--prompt", "the cat", "-n", "2"],
    "bench": ["bench", "e", "--backends", "ort-cpu", "--seq-lens", "8", "--repeat", "1", "--warmup", "0"],
    "optimize": ["optimize", "e", "-o", "o", "--slim"],
    "triton": ["triton", "e", "--repo", "r"],
    "doctor": ["doctor", "e"],
}
# file -> the commands that read it
READERS = {
    "attnx.json": ["verify", "generate", "doctor", "triton"],
    "model.onnx": ["verify", "bench", "optimize", "triton", "doctor"],
    "weights.safetensors": ["verify", "optimize"],
    "decode.onnx": ["generate", "triton"],
    "genai.onnx": ["verify"],
    "tokenizer.json": ["text", "triton"],
    "genai_config.json": ["doctor"],
}
CASES = [(name, command) for name, commands in READERS.items() for command in commands]


def run_refused(root: Path, command: str, *fragments: str) -> None:
    before = sorted(p.name for p in root.iterdir())
    code, _, stderr = run_cli(COMMANDS[command])
    assert_one_line_error(code, stderr, *fragments)
    assert sorted(p.name for p in root.iterdir()) == before, "something was written"


@pytest.mark.parametrize(("name", "command"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_a_link_out_of_the_export_is_not_followed(name, command, copy, workdir, opened):
    out = copy("lm")
    outside = workdir / "outside"
    outside.mkdir()
    shutil.move(out / name, outside / name)  # a valid copy: following the link would work
    (out / name).symlink_to(outside / name)
    opened.start()
    run_refused(workdir, command, f"e/{name}", "symbolic link", "does not follow links")
    assert opened.following(outside / name) == []


@pytest.mark.parametrize("name", ["model.onnx", "weights.safetensors"])
def test_a_link_to_a_file_inside_the_export_is_refused_too(name, copy, workdir):
    out = copy("lm")
    os.rename(out / name, out / f"real-{name}")
    (out / name).symlink_to(f"real-{name}")
    run_refused(workdir, "verify", f"e/{name}", "symbolic link")


@pytest.mark.parametrize(("name", "command"), [("weights.safetensors", "optimize"), ("model.onnx", "verify")])
def test_a_hard_linked_file_is_refused_in_one_line(name, command, copy, workdir):
    """A file with a second hard link (``cp -l`` of an export): onnx refuses such external data as a possible
    hard-link attack, with a traceback; attnx refuses it first, in one line naming the file and the fix."""
    out = copy("lm")
    os.link(out / name, workdir / f"second-{name}")
    run_refused(workdir, command, f"e/{name}", "2 hard links", "cp -r")


def random_bytes(data: bytes) -> bytes:
    return bytes((i * 131 + 7) % 256 for i in range(len(data)))


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def empty(data: bytes) -> bytes:
    return b""


def lying_header(data: bytes) -> bytes:
    """A safetensors file whose first tensor claims twice its shape."""
    size = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + size].decode()
    start = header.index('"shape":[') + len('"shape":[')
    header = header[:start] + "2," + header[start:]
    return len(header).to_bytes(8, "little") + header.encode() + data[8 + size :]


def not_json(data: bytes) -> bytes:
    return b"{not json"


CORRUPT: list[tuple[str, Callable[[bytes], bytes], str, str]] = [
    ("model.onnx", random_bytes, "verify", "is not an ONNX model"),
    ("model.onnx", random_bytes, "triton", "is not an ONNX model"),
    ("model.onnx", truncated, "verify", "model.onnx"),
    ("model.onnx", truncated, "optimize", "model.onnx"),
    ("model.onnx", empty, "bench", "is not a complete ONNX model"),
    ("decode.onnx", truncated, "generate", "decode.onnx"),
    ("decode.onnx", empty, "triton", "is not a complete ONNX model"),
    ("weights.safetensors", lying_header, "verify", "the header lies"),
    ("weights.safetensors", truncated, "optimize", "weights.safetensors"),
    ("weights.safetensors", random_bytes, "verify", "is not a safetensors file"),
    ("tokenizer.json", not_json, "text", "is not valid JSON"),
    ("tokenizer.json", not_json, "triton", "is not valid JSON"),
    ("genai_config.json", empty, "doctor", "is not valid JSON"),
]


@pytest.mark.parametrize(
    ("name", "corrupt", "command", "fragment"),
    CORRUPT,
    ids=[f"{n}-{c.__name__}-{cmd}" for n, c, cmd, _ in CORRUPT],
)
def test_a_corrupt_file_with_a_matching_hash_is_one_line(name, corrupt, command, fragment, copy, workdir):
    out = copy("lm")
    (out / name).write_bytes(corrupt((out / name).read_bytes()))
    rehash(out)
    run_refused(workdir, command, f"e/{name}", fragment, "re-export")


@pytest.mark.parametrize("location", ["../secret.data", "unlisted.data"])
def test_external_data_outside_the_export_is_refused(location, copy, workdir, opened):
    """A graph whose tensor points at a file outside OUT (``../``) or at one the manifest does not list."""
    import onnx

    out = copy("lm")
    model = onnx.load(str(out / "model.onnx"))
    tensor = model.graph.initializer[0]
    size = len(tensor.raw_data)
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(size))):
        tensor.external_data.add(key=key, value=value)
    (out / location).write_bytes(b"\0" * size)
    (out / "model.onnx").write_bytes(model.SerializeToString())
    rehash(out)
    opened.start()
    run_refused(workdir, "verify", "e/model.onnx", f"'{location}'", "not a file the export lists")
    assert opened.following(out / location) == []


def test_graph_inputs_that_are_not_the_manifests_are_refused(copy, workdir):
    import onnx

    out = copy("lm")
    model = onnx.load(str(out / "model.onnx"))
    model.graph.input[0].name = "renamed"
    onnx.save(model, str(out / "model.onnx"))
    rehash(out)
    run_refused(workdir, "verify", "e/model.onnx", "['renamed']", "re-export")
