"""attnx.bench on a tiny exported model: result fields, skips with reasons, JSON, isolation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attnx
from attnx.config import parse_size
from attnx.errors import AttnxError
from attnx.parity.backends import BACKENDS, Backend, _compiler_missing
from attnx.parity.runners import BackendSkipped
from tests.helpers import run_cli

LENGTHS = [8, 33]


@pytest.fixture(scope="module")
def report(tiny_out: Path):
    return attnx.bench(
        tiny_out,
        backends=["torch", "ort-cpu", "ort-cuda", "trt"],
        seq_lens=LENGTHS,
        batch=2,
        warmup=1,
        repeat=3,
        threads=1,
        seed=5,
    )


def test_every_case_is_reported_in_order(report) -> None:
    cases = [(m.backend, m.seq_len) for m in report.measurements]
    assert cases == [(b, n) for n in LENGTHS for b in ("torch", "ort-cpu", "ort-cuda", "trt")]


def test_measured_cases_carry_raw_timings_and_consistent_statistics(report) -> None:
    measured = [m for m in report.measurements if m.backend in ("torch", "ort-cpu")]
    for m in measured:
        assert m.status == "ok", m.reason
        assert len(m.timings_s) == 3 and all(t > 0 for t in m.timings_s)
        assert m.min_s == min(m.timings_s)
        assert m.median_s == sorted(m.timings_s)[1]
        assert m.min_s <= m.median_s <= m.p90_s <= max(m.timings_s)
        assert m.p90_s == pytest.approx(float(np.percentile(m.timings_s, 90)))
        assert m.tokens_per_s == pytest.approx(2 * m.seq_len / m.median_s)
        assert m.flops and m.flops_per_s == pytest.approx(m.flops / m.median_s)
        assert m.peak_rss_bytes is not None and m.peak_rss_bytes >= 0
        assert m.estimated_bytes and m.load_s and m.load_s > 0 and m.threads == 1 and m.warmup == 1
    providers = {m.backend: m.providers for m in measured}
    assert providers["ort-cpu"] == ["CPUExecutionProvider"] and providers["torch"] == ["torch-cpu"]


def test_unavailable_backends_are_skipped_with_their_reason(report) -> None:
    for m in report.measurements:
        if m.backend in ("ort-cuda", "trt") and m.status == "skipped":
            assert m.reason and not m.timings_s and m.median_s is None
    reasons = {m.backend: m.reason for m in report.measurements if m.status == "skipped"}
    if "ort-cuda" in reasons:
        assert "CUDAExecutionProvider" in reasons["ort-cuda"]


def test_slopes_are_fitted_per_backend(report) -> None:
    fits = {f.backend: f for f in report.scaling}
    assert set(fits) == {"torch", "ort-cpu"}
    assert fits["ort-cpu"].seq_lens == LENGTHS and np.isfinite(fits["ort-cpu"].slope)


def test_json_holds_machine_settings_versions_and_every_raw_timing(report, tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    report.write_json(path)
    data = json.loads(path.read_text())
    assert data["machine"]["cpu"] and data["machine"]["usable_cpus"] >= 1
    assert data["machine"]["memory_total_bytes"] > 0
    assert data["versions"]["onnxruntime"] and data["versions"]["torch"]
    assert data["settings"]["seed"] == 5 and data["settings"]["threads"] == 1
    assert data["models"][0]["variant"] == "softmax"
    timings = [m["timings_s"] for m in data["measurements"] if m["status"] == "ok"]
    assert timings == [m.timings_s for m in report.measurements if m.ok]
    fields = {"median_s", "p90_s", "min_s", "tokens_per_s", "peak_rss_bytes", "reason", "timings_s"}
    assert fields <= set(data["measurements"][0])
    assert {s["backend"] for s in data["scaling"]} == {"torch", "ort-cpu"}


def test_progress_reports_each_case_then_done(tiny_out: Path) -> None:
    calls: list[tuple[int, int, str]] = []
    attnx.bench(
        tiny_out,
        backends=["ort-cpu", "trt"],
        seq_lens=[4, 8],
        repeat=1,
        warmup=0,
        progress=lambda done, total, case: calls.append((done, total, case)),
    )
    assert [c[:2] for c in calls] == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    cases = [f"softmax-tiny {backend} N={n}" for n in (4, 8) for backend in ("ort-cpu", "trt")]
    assert [c[2] for c in calls] == [*cases, "done"]


def test_a_case_over_the_memory_limit_is_skipped_with_the_estimate(tiny_out: Path) -> None:
    result = attnx.bench(tiny_out, backends=["ort-cpu"], seq_lens=[64], max_memory=1000, repeat=1, warmup=0)
    (m,) = result.measurements
    assert m.status == "skipped" and "exceeds the memory limit" in m.reason and m.estimated_bytes > 1000


def test_max_time_stops_early_but_keeps_three_runs(tiny_out: Path) -> None:
    result = attnx.bench(tiny_out, backends=["ort-cpu"], seq_lens=[8], repeat=50, warmup=0, max_time=1e-9)
    assert len(result.measurements[0].timings_s) == 3


def test_a_crashing_backend_fails_and_a_refusing_one_is_skipped(tiny_out: Path, monkeypatch) -> None:
    def crash(graph, threads):
        raise RuntimeError("kernel exploded\nsecond line")

    def refuse(graph, threads):
        raise BackendSkipped("not on Tuesdays")

    monkeypatch.setitem(BACKENDS, "crash", Backend("crash", "", lambda export: None, crash))
    monkeypatch.setitem(BACKENDS, "refuse", Backend("refuse", "", lambda export: None, refuse))
    result = attnx.bench(tiny_out, backends=["crash", "refuse"], seq_lens=[8], repeat=1)
    crashed, refused = result.measurements
    assert (crashed.status, crashed.reason) == ("failed", "RuntimeError: kernel exploded")
    assert (refused.status, refused.reason) == ("skipped", "not on Tuesdays")
    assert result.failed == [crashed]


def test_an_internal_inconsistency_is_a_failure_never_a_skip(tiny_out: Path, monkeypatch) -> None:
    """An AttnxError while a backend runs (e.g. an op no plugin provides) fails the case: exit 1."""

    def inconsistent(graph, threads):
        raise AttnxError("the export uses attnx::NoSuchAttention, which no installed plugin provides")

    monkeypatch.setitem(
        BACKENDS, "inconsistent", Backend("inconsistent", "", lambda export: None, inconsistent)
    )
    (m,) = attnx.bench(tiny_out, backends=["inconsistent"], seq_lens=[8], repeat=1).measurements
    assert m.status == "failed" and "NoSuchAttention" in m.reason


def test_a_plugin_lowered_seq2seq_with_another_cross_variant_runs_on_ort_cpu(tmp_path: Path) -> None:
    """The export's own op list drives the plugin kernels, cross-attention ops included."""
    out = tmp_path / "s2s"
    code, _, stderr = run_cli(
        [
            "export",
            "--recipe",
            "tiny-seq2seq",
            "--cross-variant",
            "linear",
            "--lowering",
            "plugin",
            "--no-verify",
            "-o",
            str(out),
        ]
    )
    assert code == 0, stderr
    code, stdout, stderr = run_cli(
        ["bench", str(out), "--backends", "ort-cpu", "--seq-lens", "8", "--repeat", "1", "--warmup", "0"]
    )
    assert code == 0, stderr
    (m,) = attnx.bench(out, backends=["ort-cpu"], seq_lens=[8], repeat=1, warmup=0).measurements
    assert m.status == "ok", m.reason


def test_torch_compile_without_a_compiler_says_so(monkeypatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert "C++ compiler" in (_compiler_missing() or "")


def test_torch_compile_failure_is_skipped_with_the_reason(tiny_out: Path, monkeypatch) -> None:
    import torch

    def broken(module, **kwargs):
        def run(*args):
            raise RuntimeError("inductor could not codegen")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    compiled = Backend("torch-compile", "", lambda export: None, BACKENDS["torch-compile"].runner)
    monkeypatch.setitem(BACKENDS, "torch-compile", compiled)
    (m,) = attnx.bench(tiny_out, backends=["torch-compile"], seq_lens=[8], repeat=1).measurements
    assert m.status == "skipped"
    assert m.reason == "torch.compile failed: RuntimeError: inductor could not codegen"


def test_every_torch_compile_case_is_compiled_afresh(tiny_out: Path, monkeypatch) -> None:
    """The cases share the model's forward code: without a fresh compile cache per runner, Dynamo stops
    compiling it at its recompile limit and the later cases silently run eager."""
    import torch

    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **kw: real_compile(module, backend=counting, **kw))
    compiled = Backend("torch-compile", "", lambda export: None, BACKENDS["torch-compile"].runner)
    monkeypatch.setitem(BACKENDS, "torch-compile", compiled)
    # Dynamo's own patch restores its config; monkeypatch.setattr would delete the option on undo (it
    # is not in the module's __dict__), and every later torch.compile in the process would fail.
    with torch._dynamo.config.patch(recompile_limit=2):
        attnx.bench(tiny_out, backends=["torch-compile"], seq_lens=[8], repeat=1)
        per_case = len(graphs)
        result = attnx.bench(tiny_out, backends=["torch-compile"], seq_lens=[8, 12, 16, 20], repeat=1)
    assert per_case > 0 and all(m.status == "ok" for m in result.measurements)
    assert len(graphs) == 5 * per_case


def test_isolated_measurement_reports_the_whole_process_peak(tiny_out: Path) -> None:
    result = attnx.bench(tiny_out, backends=["ort-cpu"], seq_lens=[16], repeat=2, warmup=0, isolate=True)
    (m,) = result.measurements
    assert m.status == "ok" and len(m.timings_s) == 2
    assert m.process_peak_rss_bytes > m.peak_rss_bytes > 0


def test_an_ort_measurement_process_never_imports_torch(tiny_out: Path) -> None:
    request = json.dumps(
        {
            "out": str(tiny_out),
            "backend": "ort-cpu",
            "batch": 1,
            "seq_len": 8,
            "warmup": 0,
            "repeat": 1,
            "threads": 1,
            "seed": 0,
            "max_time": None,
        }
    )
    code = (
        "import sys, attnx.bench.worker as w; w.main(sys.argv[1:]); "
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported')"
    )
    done = subprocess.run([sys.executable, "-c", code, request], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "torch not imported"


def test_bench_is_callable_as_attnx_bench_even_after_the_package_is_imported(tiny_out: Path) -> None:
    import attnx.bench.timing  # noqa: F401  (binds the package to attnx.bench)

    assert callable(attnx.bench)
    assert attnx.bench(tiny_out, backends=["ort-cpu"], seq_lens=[4], repeat=1, warmup=0).measurements[0].ok


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"backends": ["ort-cpuu"]}, "did you mean 'ort-cpu'"),
        ({"backends": []}, "no backend given"),
        ({"seq_lens": [0, 8]}, "must be >= 1"),
        ({"batch": 0}, "must be >= 1"),
    ],
)
def test_bad_arguments_raise_one_line_errors(tiny_out: Path, kwargs: dict, fragment: str) -> None:
    with pytest.raises(AttnxError, match=fragment):
        attnx.bench(tiny_out, **kwargs)


def test_a_directory_that_is_not_an_export_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AttnxError, match="attnx export"):
        attnx.bench(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8GiB", 8 << 30), ("512M", 512 << 20), ("2GB", 2 * 10**9), ("1e9", 10**9), ("100 kib", 100 << 10)],
)
def test_sizes_parse(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "8XB", "0"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(AttnxError, match="8GiB"):
        parse_size(text)
