"""Checkpoints: safetensors and weights-only state dicts in, exact-match checks, one-line refusals."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import save_file

import attnx
from attnx.checkpoint import load_checkpoint, read_state_dict
from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.exporter.manifest import MODEL_FILE, WEIGHTS_FILE
from tests.helpers import assert_one_line_error, run_cli
from tests.models.exports import tiny_export

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64, "vocab_size": 50}
TINY_SET = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
MARKER = "attnx-checkpoint-was-unpickled"


class Evil:
    """Unpickling this would create a marker file: what a malicious checkpoint does."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def model(seed: int, **options) -> torch.nn.Module:
    return assemble("softmax", "lm", {**TINY, **options}, seed=seed).module


def equal_states(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_save_then_load_gives_the_checkpoints_weights(tmp_path, suffix):
    source, target = model(seed=1), model(seed=2)
    assert not equal_states(source, target)
    path = attnx.save_checkpoint(source, tmp_path / f"weights{suffix}")
    load_checkpoint(target, path)
    assert equal_states(source, target)
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        assert torch.equal(source(ids)[0], target(ids)[0])


def test_state_dict_wrapped_in_state_dict_key_loads(tmp_path):
    source, target = model(seed=1), model(seed=2)
    torch.save({"state_dict": source.state_dict()}, tmp_path / "wrapped.pt")
    load_checkpoint(target, tmp_path / "wrapped.pt")
    assert equal_states(source, target)


def test_mismatches_are_listed_in_one_line_and_truncated(tmp_path):
    state = model(seed=1).state_dict()
    del state["norm.weight"], state["norm.bias"]
    state["extra.weight"] = torch.zeros(3)
    state["embedding.embed.weight"] = torch.zeros(51, 32)
    save_file(state, tmp_path / "bad.safetensors")
    with pytest.raises(AttnxError) as error:
        load_checkpoint(model(seed=2), tmp_path / "bad.safetensors")
    message = str(error.value)
    assert "\n" not in message
    assert "missing 2 keys: norm.weight, norm.bias" in message
    assert "unexpected 1 key: extra.weight" in message
    assert "1 shape mismatch: embedding.embed.weight (51, 32) vs model (50, 32)" in message
    small = {k: v for k, v in model(seed=1, n_layers=1).state_dict().items()}
    save_file(small, tmp_path / "small.safetensors")
    with pytest.raises(AttnxError, match=r"missing \d+ keys: blocks\.1\.[^;]*, \.\.\.$"):
        load_checkpoint(model(seed=2), tmp_path / "small.safetensors")


def test_a_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / MARKER
    torch.save({"weight": Evil(marker)}, tmp_path / "evil.pt")
    out = tmp_path / "out"
    code, _, stderr = run_cli(
        ["export", "--checkpoint", str(tmp_path / "evil.pt"), "-o", str(out), *TINY_SET]
    )
    assert_one_line_error(code, stderr, "refusing checkpoint", "evil.pt")
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"not a checkpoint at all", "cannot read checkpoint"),
        (None, "is not a state dict"),
    ],
)
def test_unreadable_or_non_state_dict_files_are_refused(tmp_path, content, fragment):
    path = tmp_path / "weights.bin"
    if content is None:
        torch.save([1, 2, 3], path)
    else:
        path.write_bytes(content)
    with pytest.raises(AttnxError, match=fragment):
        read_state_dict(path)


def test_missing_file_is_refused():
    with pytest.raises(AttnxError, match="does not exist"):
        read_state_dict("/nonexistent/weights.safetensors")


def test_cli_mismatch_exits_2_and_writes_nothing(tmp_path):
    save_file(model(seed=1, d_model=64, n_heads=2).state_dict(), tmp_path / "wide.safetensors")
    out = tmp_path / "out"
    code, _, stderr = run_cli(
        [
            "export",
            "--model",
            "lm",
            "--checkpoint",
            str(tmp_path / "wide.safetensors"),
            "-o",
            str(out),
            *TINY_SET,
        ]
    )
    assert_one_line_error(code, stderr, "does not fit the model", "shape mismatches", "vs model")
    assert not out.exists()


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    """A: the shared tiny softmax LM export (seed 0). B: exported with seed 2 from A's weights file,
    saving its weights to b.pt."""
    a = tiny_export("softmax", "lm").out
    root = tmp_path_factory.mktemp("round-trip")
    code, _, stderr = run_cli(
        [
            "export",
            "--recipe",
            "tiny-lm",
            "--seed",
            "2",
            "--seq-lens",
            "1,9",
            "-o",
            str(root / "b"),
            "--checkpoint",
            str(a / WEIGHTS_FILE),
            "--save-checkpoint",
            str(root / "b.pt"),
        ]
    )
    assert code == 0, stderr
    return a, root / "b", root / "b.pt"


def test_round_trip_reproduces_weights_and_outputs(round_trip):
    a, b, _ = round_trip
    manifests = [json.loads((out / "attnx.json").read_text()) for out in (a, b)]
    weights = [m["files"]["weights"]["sha256"] for m in manifests]
    assert weights[0] == weights[1] and manifests[1]["seed"] == 2
    ids = np.random.default_rng(0).integers(0, 50, size=(2, 13))
    outputs = [ort.InferenceSession(str(out / MODEL_FILE)).run(None, {"input_ids": ids})[0] for out in (a, b)]
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_saved_checkpoint_holds_the_exported_weights_and_verify_rebuilds(round_trip):
    _, b, saved = round_trip
    code, _, stderr = run_cli(["verify", str(b), "--seq-lens", "4"])
    assert code == 0, stderr
    recipe = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 50}
    reference, target = (assemble("softmax", "lm", recipe, seed=seed).module for seed in (0, 3))
    load_checkpoint(target, saved)
    assert equal_states(target, reference)


def test_save_checkpoint_refuses_an_existing_file_without_force(round_trip, tmp_path):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--save-checkpoint", str(round_trip[2]), "-o", str(out), *TINY_SET])
    assert_one_line_error(code, stderr, "already exists", "--force")
    assert not out.exists()
