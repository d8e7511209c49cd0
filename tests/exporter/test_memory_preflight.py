"""The memory preflight refuses what cannot fit before anything is built, naming what to make smaller:
weights no machine holds before even the meta-device build, buffers (LSH rotations) counted, the trace's
example lengths counted (``attnx export`` in-process, nothing written)."""

from __future__ import annotations

import pytest

from attnx.exporter import source
from attnx.models.config import LMConfig, Seq2SeqConfig
from attnx.models.cost import weights_floor
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli

SMALL = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]


def refused(tmp_path, monkeypatch, *args: str) -> str:
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_cli(["export", "-o", "out", "--quiet", *SMALL, *args])
    assert_one_line_error(code, stderr, "of memory, but")
    assert list(tmp_path.iterdir()) == []
    return stderr


def test_a_billion_layers_is_refused_before_any_build(tmp_path, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("the model was built, even on the meta device")

    monkeypatch.setattr(source, "assemble", no_build)
    stderr = refused(tmp_path, monkeypatch, "--set", f"n_layers={10**9}")
    assert f"n_layers={10**9}" in stderr and "at least" in stderr


def test_buffers_count_reformer_rotations(tmp_path, monkeypatch):
    """n_buckets adds no parameter: its rotations are a buffer of head_dim x n_hashes x n_buckets/2."""
    stderr = refused(tmp_path, monkeypatch, "--variant", "reformer", "--set", f"n_buckets={2 * 10**9}")
    assert f"n_buckets={2 * 10**9}" in stderr


def test_the_trace_at_huge_example_lengths_is_refused_by_name(tmp_path, monkeypatch):
    stderr = refused(tmp_path, monkeypatch, "--set", f"export.example_lengths=seq={10**9}")
    assert "export.example_lengths" in stderr


@pytest.mark.parametrize(
    ("config", "floor"),
    [
        (LMConfig(vocab_size=10, d_model=4, n_layers=3, d_ff=8), 10 * 4 + 3 * 2 * 4 * 8),
        (Seq2SeqConfig(vocab_size=10, d_model=4, n_layers=2, n_decoder_layers=1, d_ff=8), 40 + 3 * 64),
    ],
)
def test_the_weights_floor_is_below_the_built_model(config, floor):
    from attnx.exporter.assemble import assemble

    assert weights_floor(config) == floor
    fields = {k: v for k, v in config.to_dict().items() if v is not None}
    built = assemble("softmax", config.kind, fields)
    assert weights_floor(config) <= sum(p.numel() for p in built.module.parameters())
