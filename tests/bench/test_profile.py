"""ORT's op-type breakdown, and the plugin-lowered path of the ORT backend."""

from __future__ import annotations

from pathlib import Path

import pytest

import attnx
from attnx.bench.profile import ort_op_profile
from attnx.exporter.directory import ExportDir
from tests.conftest import TINY


def test_profile_splits_node_time_by_op_type(tiny_out: Path) -> None:
    ops = ort_op_profile(ExportDir.open(tiny_out), batch=2, seq_len=16, threads=1, runs=2)
    types = {o.op_type for o in ops}
    assert {"MatMul", "Softmax"} <= types  # projections/FFN and the attention body, inlined by ORT
    assert sum(o.share for o in ops) == pytest.approx(1.0)
    assert all(o.mean_ms >= 0 and o.nodes >= 1 for o in ops)
    assert [o.mean_ms for o in ops] == sorted((o.mean_ms for o in ops), reverse=True)


@pytest.mark.slow
def test_plugin_lowered_export_runs_through_the_cpu_kernels(tmp_path: Path) -> None:
    out = tmp_path / "plugin"
    attnx.export("softmax", out, options={**TINY, "export.lowering": "plugin", "verify.enabled": False})
    report = attnx.bench(out, backends=["ort-cpu"], seq_lens=[8, 16], repeat=2, warmup=1)
    assert all(m.ok and m.providers == ["CPUExecutionProvider"] for m in report.measurements)
