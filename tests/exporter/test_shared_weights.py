"""Shared weights (attnx.exporter.store): every graph of an export keeps its weights as external data in the
one ``weights.safetensors``, so a model past protobuf's 2 GiB exports, verifies and serves, and no graph
holds a copy; the disk preflight refuses an export that cannot fit before anything is built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attnx
from attnx.cost import GiB, require_disk
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.layout import copy_graph, external_files
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli

GRAPHS = ("model.onnx", "prefill.onnx", "decode.onnx", "genai.onnx")


def stored_initializers(path: Path) -> tuple[int, int]:
    """(initializers kept in weights.safetensors, float initializers of more than 1 KiB held in the graph)."""
    model = onnx.load(str(path), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {dict((e.key, e.value) for e in t.external_data)["location"] for t in external} <= {
        "weights.safetensors"
    }
    held = [
        t
        for t in model.graph.initializer
        if t.data_location != onnx.TensorProto.EXTERNAL and len(t.raw_data) > 1024 and t.data_type == 1
    ]
    return len(external), len(held)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shared") / "out"
    options = {**TINY, "export.decode": True, "export.shared_weights": True, "verify.seq_lens": [1, 9]}
    result = attnx.export("gated_delta", out, model="lm", options=options)
    assert result.parity.passed
    return out


def test_every_graph_keeps_its_weights_in_the_one_weights_file(shared):
    assert set(GRAPHS) <= {r.path for r in ExportDir.open(shared).manifest.files.values()}
    for name in GRAPHS:
        external, held = stored_initializers(shared / name)
        assert external >= 5 and held == 0, name
    assert not list(shared.glob("*.data"))


def test_a_shared_export_verifies_in_a_fresh_process(shared, tmp_path):
    code, stdout, stderr = run_cli(["verify", str(shared), "--no-write", "--seq-lens", "1,5"])
    assert code == 0, stderr
    assert "weights.safetensors" in stdout + stderr


def test_a_copied_graph_takes_its_weights_file_along(shared, tmp_path):
    copy_graph(shared / "decode.onnx", tmp_path / "model.onnx")
    assert external_files(onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)) == {
        "weights.safetensors"
    }
    assert (tmp_path / "weights.safetensors").stat().st_size == (
        shared / "weights.safetensors"
    ).stat().st_size
    import onnxruntime

    onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])


def test_an_export_past_protobufs_limit_keeps_one_copy_of_its_weights(tmp_path):
    """A 2.1 GiB vocabulary in one tied embedding: exported (default: shared from 1 GiB), verified
    against torch, every graph small."""
    vocab = 540_000
    options = {"d_model": 1024, "n_heads": 4, "n_layers": 1, "d_ff": 64, "vocab_size": vocab}
    result = attnx.export("linear", tmp_path / "out", model="lm", options={**options, "verify.seq_lens": [3]})
    assert result.parity.passed
    weights = (tmp_path / "out" / "weights.safetensors").stat().st_size
    assert weights > 2 * GiB
    assert (tmp_path / "out" / "model.onnx").stat().st_size < 16 << 20
    on_disk = sum(p.stat().st_size for p in (tmp_path / "out").iterdir())
    assert on_disk < 1.02 * weights


@settings(max_examples=40, deadline=None)
@given(needed=st.integers(0, 2**50), free=st.integers(0, 2**50))
def test_the_disk_preflight_refuses_exactly_what_does_not_fit(needed, free, tmp_path_factory):
    import shutil
    from unittest import mock

    usage = shutil._ntuple_diskusage(total=2**51, used=2**51 - free, free=free)
    directory = tmp_path_factory.getbasetemp() / "missing" / "deeper"
    with mock.patch("shutil.disk_usage", return_value=usage):
        if needed > free:
            with pytest.raises(AttnxError, match="GiB free; free some space or write it elsewhere"):
                require_disk(needed, "exporting", directory)
        else:
            require_disk(needed, "exporting", directory)


def test_an_export_that_cannot_fit_on_disk_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**6, 10**6 - 1000, 1000)
    )
    args = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
    code, _, stderr = run_cli(["export", "-o", "out", "--quiet", *args])
    assert_one_line_error(code, stderr, "writes about", "GiB free")
    assert list(tmp_path.iterdir()) == []


def test_weights_file_bytes_are_where_the_graph_says(shared):
    """The graph's external offsets point at the stored tensor's bytes: a graph initializer read through
    onnx equals the tensor read through safetensors."""
    from safetensors.numpy import load_file

    stored = load_file(str(shared / "weights.safetensors"))
    model = onnx.load(str(shared / "model.onnx"))  # external data loaded from the weights file
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    matched = [
        n
        for n, a in arrays.items()
        if any(a.shape == s.shape and np.array_equal(a, s) for s in stored.values())
    ]
    assert len(matched) >= 5
