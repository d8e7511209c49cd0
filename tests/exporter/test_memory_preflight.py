"""The memory preflight refuses what cannot fit before anything is built, naming what to make smaller:
weights no machine holds before even the meta-device build, buffers (LSH rotations) counted, the trace's
example lengths counted (``attnx export`` in-process, nothing written). And the pages of a weights file
the torch model read in place are paged out before ONNX Runtime loads the graphs, no value changed."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import pytest

from attnx.exporter import source
from attnx.exporter.budget import page_out_weight_files
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


def rss_file() -> int:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(status["RssFile"].split()[0]) * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_PAGEOUT) is Linux's")
def test_paging_out_a_mapped_weights_file_frees_its_pages_and_changes_no_value(tmp_path):
    size = 64 * mmap.PAGESIZE * 64
    path = tmp_path / "model.safetensors"
    values = np.random.default_rng(0).standard_normal(size // 4).astype(np.float32)
    values.tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="c")  # private, as safetensors maps a checkpoint
    assert float(mapped.sum(dtype=np.float64)) == pytest.approx(float(values.sum(dtype=np.float64)))
    mapped[5] = 123.0  # a page written in memory: it must survive
    before = rss_file()
    assert page_out_weight_files() >= size
    assert rss_file() < before - size // 2, "the mapped file's pages stayed resident"
    assert mapped[5] == 123.0
    expected = values.copy()
    expected[5] = 123.0
    assert np.array_equal(np.asarray(mapped), expected)
