"""A parity check in two phases (attnx.parity.check): the torch model's part keeps no reference to it, so a
caller frees its weights before ONNX Runtime loads the graphs, and the report is check_parity's."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import numpy as np
import pytest

from attnx.api import PARITY_EXTENSIONS
from attnx.exporter.directory import ExportDir
from attnx.parity.backends import backends
from attnx.parity.check import Cases, check_parity, compare_backends, reference_side


def rows(report) -> list[tuple]:
    return [
        (b.backend, b.status, [(c.seq_len, c.output, c.max_abs, c.passed) for c in b.comparisons])
        for b in report.backends
    ]


def test_the_torch_side_holds_no_model_and_the_report_is_check_paritys(decode_export):
    export = ExportDir.open(decode_export("gated_delta")[0])
    cases = Cases.make(export, [1, 6], seed=11)
    ort = backends(["ort-cpu"])
    assembly = export.rebuild()
    model = weakref.ref(assembly.module)
    side = reference_side(export, assembly, ort, cases, PARITY_EXTENSIONS)
    del assembly
    gc.collect()
    assert model() is None, "the torch side still holds the model: its weights would sit beside ORT's"
    report = compare_backends(export, side, ort, cases)
    assert report.passed
    assert not side.expected, "model.onnx's expected outputs would sit beside the decode graphs' sessions"
    labels = ["ort-cpu", "torch decode", "ort-cpu decode", "ort-cpu genai"]
    assert [b.backend for b in report.backends] == labels
    assert rows(report) == rows(check_parity(export, export.rebuild(), ort, cases, PARITY_EXTENSIONS))


def recorded_sessions(monkeypatch) -> list[tuple[str | None, list[str] | None]]:
    """Each ONNX Runtime session made from now on, as (its ``session.disable_prepacking`` entry, the
    optimizers it disables)."""
    import onnxruntime

    made: list[tuple[str | None, list[str] | None]] = []

    class Recorded(onnxruntime.InferenceSession):
        def __init__(self, path, options, **kwargs):
            try:
                packing = options.get_session_config_entry("session.disable_prepacking")
            except RuntimeError:  # not set
                packing = None
            made.append((packing, kwargs.get("disabled_optimizers")))
            super().__init__(path, options, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", Recorded)
    return made


def test_checks_load_weights_as_stored_and_many_runs_as_onnx_runtime_prepares_them(
    decode_export, monkeypatch
):
    """A check's CPU session neither folds constants nor packs weights (each made a copy of every weight at
    load: the 0.8B verify's peak), and computes the same; one that runs many times (bench, generate,
    accuracy) keeps both."""
    from attnx.decode.runtime import open_stepper
    from attnx.parity.runners import CHECK_SKIPS

    export = ExportDir.open(decode_export("softmax")[0])
    made = recorded_sessions(monkeypatch)
    ids = np.arange(5)[None] % export.manifest.decode.vocab_size
    logits = {}
    for many_runs in (False, True):
        with open_stepper(export, many_runs=many_runs) as stepper:
            logits[many_runs] = stepper.prefill(ids, {})[0]
    assert made == [("1", CHECK_SKIPS), ("1", CHECK_SKIPS), (None, None), (None, None)]
    np.testing.assert_allclose(logits[False], logits[True], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("steps", "packs"),
    [
        (["int4"], True),
        (["fuse", "int8"], True),
        (["dynamic-int8"], True),
        (["fp16"], False),
        (["fuse"], False),
    ],
)
def test_a_check_packs_quantised_weights_only(decode_export, monkeypatch, steps, packs):
    """Quantised kernels run from packed weights: unpacked, a 0.8B int4 decode step took 3.2 s against
    75 ms, in more memory. A check of quantised graphs packs them (and still folds nothing); of float ones,
    neither."""
    from attnx.decode.runtime import open_stepper
    from attnx.exporter.manifest import OptimizedSection
    from attnx.parity.runners import CHECK_SKIPS

    export = ExportDir.open(decode_export("softmax")[0])
    section = OptimizedSection("source", "0" * 64, steps, ["model", "decode"], 0.5, {})
    export = dataclasses.replace(export, manifest=dataclasses.replace(export.manifest, optimized=section))
    made = recorded_sessions(monkeypatch)
    with open_stepper(export) as stepper:
        stepper.prefill(np.arange(5)[None] % export.manifest.decode.vocab_size, {})
    assert made == [(None if packs else "1", CHECK_SKIPS)] * 2
