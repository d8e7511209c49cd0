"""A parity check in two phases (attnx.parity.check): the torch model's part keeps no reference to it, so a
caller frees its weights before ONNX Runtime loads the graphs, and the report is check_parity's."""

from __future__ import annotations

import gc
import weakref

import numpy as np

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


def test_checks_load_weights_as_stored_and_many_runs_as_onnx_runtime_prepares_them(
    decode_export, monkeypatch
):
    """A check's CPU session neither folds constants nor packs weights (each made a copy of every weight at
    load: the 0.8B verify's peak), and computes the same; one that runs many times (bench, generate,
    accuracy) keeps both."""
    import onnxruntime

    from attnx.decode.runtime import open_stepper
    from attnx.parity.runners import CHECK_SKIPS

    made: list[tuple[str | None, list[str] | None]] = []

    class Recorded(onnxruntime.InferenceSession):
        def __init__(self, path, options, **kwargs):
            try:
                packing = options.get_session_config_entry("session.disable_prepacking")
            except RuntimeError:  # not set
                packing = None
            made.append((packing, kwargs.get("disabled_optimizers")))
            super().__init__(path, options, **kwargs)

    export = ExportDir.open(decode_export("softmax")[0])
    monkeypatch.setattr(onnxruntime, "InferenceSession", Recorded)
    ids = np.arange(5)[None] % export.manifest.decode.vocab_size
    logits = {}
    for many_runs in (False, True):
        with open_stepper(export, many_runs=many_runs) as stepper:
            logits[many_runs] = stepper.prefill(ids, {})[0]
    assert made == [("1", CHECK_SKIPS), ("1", CHECK_SKIPS), (None, None), (None, None)]
    np.testing.assert_allclose(logits[False], logits[True], rtol=1e-5, atol=1e-6)
