"""A parity check in two phases (attnx.parity.check): the torch model's part keeps no reference to it, so a
caller frees its weights before ONNX Runtime loads the graphs, and the report is check_parity's."""

from __future__ import annotations

import gc
import weakref

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
