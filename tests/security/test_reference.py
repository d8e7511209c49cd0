"""A module export's torch reference loads as data: payloads planted in it never run.

The first two tests show why attnx does not use torch's loaders: ``torch.export.load`` runs a pickle
planted in an archive, and torch's JSON deserializer evaluates a planted shape expression. Every
other test plants a payload in an export (hashes rewritten to match, as a forger would) and runs the
commands that read the reference (verify, bench on torch, optimize): exit 2, one line naming the
file and the fix, and the payload's marker is never written.
"""

from __future__ import annotations

import contextlib
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from attnx.errors import AttnxError
from attnx.exporter.reference import PROGRAM_FILE, check_program, check_targets, load_program, save_program
from tests.helpers import assert_one_line_error, run_cli
from tests.security.conftest import MARKER, RunsCode, edit_manifest, rehash

READERS = [
    ["verify", "e", "--no-write"],
    ["bench", "e", "--backends", "torch", "--seq-lens", "8", "--repeat", "1", "--warmup", "0"],
    ["optimize", "e", "-o", "o", "--slim"],
]
PAYLOAD = f"__import__('os').system('touch {MARKER}')"


def tiny_program() -> Any:
    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.weight

    batch = torch.export.Dim("batch")
    return torch.export.export(Scale(), (torch.ones(2, 4),), dynamic_shapes=({0: batch},))


def plant_pickle(archive: Path) -> None:
    """Replace every pickled record of a torch.export archive (its sample inputs) with a payload."""
    payload = io.BytesIO()
    torch.save({"x": RunsCode()}, payload)
    with zipfile.ZipFile(archive) as source:
        records = {info.filename: source.read(info) for info in source.infolist()}
    planted = [name for name in records if "sample_inputs" in name and name.endswith(".pt")]
    assert planted, sorted(records)
    with zipfile.ZipFile(archive, "w") as target:
        for name, data in records.items():
            target.writestr(name, payload.getvalue() if name in planted else data)


def test_torch_export_load_runs_a_pickle_planted_in_an_archive(tmp_path, workdir):
    """Why reference.pt2 went: torch retries a refused sample-input pickle with weights_only=False."""
    archive = tmp_path / "program.pt2"
    torch.export.save(tiny_program(), str(archive))
    plant_pickle(archive)
    with contextlib.suppress(Exception):  # torch may fail after the payload ran (it returned an int)
        torch.export.load(str(archive))
    assert (workdir / MARKER).exists()


def test_torchs_json_deserializer_evaluates_a_planted_shape_expression(workdir):
    """Why attnx checks the JSON first: torch parses symbolic shapes with sympy.sympify (eval)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass, serialize

    program = tiny_program()
    document = json.loads(serialize(program).exported_program)
    plant(document, "expr_str", PAYLOAD)
    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises after the payload ran
        ExportedProgramDeserializer().deserialize(
            _dict_to_dataclass(schema.ExportedProgram, document), dict(program.state_dict), {}, None
        )
    assert (workdir / MARKER).exists()
    planted = plant(json.loads(serialize(program).exported_program), "expr_str", PAYLOAD)
    with pytest.raises(AttnxError, match="a shape expression calling __import__"):
        check_program(planted, "reference.json")


def plant(document: Any, key: str, value: Any) -> Any:
    """Set every ``key`` in the JSON ``document`` to ``value`` (or add it at the top); returns it."""
    found = [False]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k in list(node):
                if k == key:
                    node[k], found[0] = value, True
                else:
                    walk(node[k])
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(document)
    if not found[0]:
        document[key] = value
    return document


def first_node(document: dict) -> dict:
    return document["graph_module"]["graph"]["nodes"][0]


def set_target(target: str) -> Callable[[dict], None]:
    return lambda document: first_node(document).__setitem__("target", target)


def set_name(name: str) -> Callable[[dict], None]:
    def change(document: dict) -> None:
        node = first_node(document)
        node["outputs"][0]["as_tensor"]["name"] = name

    return change


def set_treespec(document: dict) -> None:
    (call,) = [c for c in document["graph_module"]["module_call_graph"] if c["fqn"] == ""]
    call["signature"]["in_spec"] = json.dumps(
        [1, {"type": "os.system", "context": "null", "children_spec": []}]
    )


def add_script_object(document: dict) -> None:
    document["graph_module"]["graph"]["custom_obj_values"] = {"obj": {"class_fqn": "os.system"}}


PLANTED_JSON = [
    ("expr_str", lambda d: plant(d, "expr_str", PAYLOAD), "a shape expression calling __import__"),
    ("expr-attribute", lambda d: plant(d, "expr_str", "Integer(1).__class__"), "not a shape expression"),
    ("target-torch-load", set_target("torch.load"), "a call attnx does not run"),
    ("name-injection", set_name('x = __import__("os").system("touch pwned")#'), "not a Python name"),
    ("name-attribute", set_name("torch.load"), "not a Python name"),
    ("treespec-type", set_treespec, "a tree spec of another type"),
    ("script-object", add_script_object, "script object"),
    ("not-json", None, "is not valid JSON"),
]


@pytest.mark.parametrize(
    ("change", "fragment"), [p[1:] for p in PLANTED_JSON], ids=[p[0] for p in PLANTED_JSON]
)
def test_a_planted_reference_program_is_refused_and_nothing_runs(change, fragment, copy, workdir):
    out = copy("module")
    program = out / PROGRAM_FILE
    if change is None:
        program.write_bytes(b"\x80\x04payload")
    else:
        document = json.loads(program.read_text())
        change(document)
        program.write_text(json.dumps(document))
    rehash(out, "reference")
    code, _, stderr = run_cli(READERS[0])
    assert_one_line_error(code, stderr, f"e/{PROGRAM_FILE}", fragment, "re-export")
    assert not (workdir / MARKER).exists()


def test_a_call_that_reads_a_file_is_refused():
    """``aten::from_file`` is an aten op like any other, but it reads a file named in the graph."""
    from types import SimpleNamespace

    graph = torch.fx.Graph()
    graph.output(graph.call_function(torch.ops.aten.from_file.default, ("/etc/passwd", False, 4)))
    program = SimpleNamespace(graph_module=torch.fx.GraphModule(torch.nn.Module(), graph))
    with pytest.raises(AttnxError, match="aten.from_file.default, which reads a file"):
        check_targets(program, "reference.json")


class Einsum(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.einsum("btnr,hnr->btnh", x, y)


def test_string_arguments_of_ops_round_trip_and_control_characters_are_refused(tmp_path):
    """An op's string argument (einsum's equation, as RWKV-6 uses) is a value, stored and loaded as it is;
    one with a control character is not something attnx wrote."""
    x, y = torch.randn(2, 3, 4, 5), torch.randn(6, 4, 5)
    program_file, tensors_file = save_program(torch.export.export(Einsum(), (x, y)), tmp_path)
    loaded = load_program(tmp_path / program_file, tmp_path / tensors_file)
    torch.testing.assert_close(loaded.module()(x, y), Einsum()(x, y))
    document = json.loads((tmp_path / program_file).read_text())
    text = json.dumps(document).replace("btnr,hnr->btnh", "btnr,hnr->btnh\\n")
    with pytest.raises(AttnxError, match="not a printable string argument"):
        check_program(json.loads(text), PROGRAM_FILE)


def test_guards_code_is_dropped_not_run(copy, workdir):
    """torch exec()s ``guards_code`` when it makes the module; attnx drops it (and all source metadata)."""
    out = copy("module")
    document = json.loads((out / PROGRAM_FILE).read_text())
    document["guards_code"] = [PAYLOAD]
    (out / PROGRAM_FILE).write_text(json.dumps(document))
    rehash(out, "reference")
    code, stdout, stderr = run_cli(["verify", "e", "--no-write"])
    assert code == 0, stderr
    assert "parity: PASSED" in stdout and not (workdir / MARKER).exists()


@pytest.mark.parametrize("argv", READERS, ids=[a[0] for a in READERS])
def test_an_older_pickled_reference_is_refused_by_every_reader(argv, copy, workdir):
    """An export whose reference is a torch.export archive (an older attnx's, or a forger's) with a
    pickle planted in it: verify, bench on torch and optimize refuse it without unpickling."""
    out = copy("module")
    archive = out / "reference.pt2"
    torch.export.save(tiny_program(), str(archive))
    plant_pickle(archive)

    def older(manifest: dict) -> None:
        manifest["files"]["reference"] = {"path": "reference.pt2", "sha256": ""}
        del manifest["files"]["reference_tensors"]
        del manifest["module"]["tensors"]

    edit_manifest(out, older)
    rehash(out)
    code, _, stderr = run_cli(argv)
    assert_one_line_error(code, stderr, "reference.pt2", "pickled torch.export archive", "re-export")
    assert not (workdir / MARKER).exists()
    assert not (workdir / "o").exists()


def test_reference_tensors_with_a_lying_header_are_refused(copy, workdir):
    out = copy("module")
    tensors = out / "reference.safetensors"
    data = bytearray(tensors.read_bytes())
    header = int.from_bytes(data[:8], "little")
    text = data[8 : 8 + header].decode().replace('"data_offsets":[0,', '"data_offsets":[4,', 1)
    tensors.write_bytes(len(text).to_bytes(8, "little") + text.encode() + data[8 + header :])
    rehash(out, "reference_tensors")
    code, _, stderr = run_cli(READERS[0])
    assert_one_line_error(code, stderr, "e/reference.safetensors", "header lies", "re-export")


def test_the_reference_loads_and_verifies_with_nothing_pickled(copy, workdir, monkeypatch):
    """A module export verifies with pickle's loaders broken: nothing on the way unpickles."""
    import pickle

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unpickled")

    out = copy("module")
    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    code, stdout, stderr = run_cli(["verify", str(out), "--no-write"])
    assert code == 0, stderr
    assert "parity: PASSED" in stdout
    assert not any(Path(out).glob("*.pt2"))
