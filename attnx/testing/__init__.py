"""attnx's conformance kit: the promises every attention-variant plugin makes, as tests.

Third-party plugins and the built-ins run the same checks. In a plugin's tests::

    from attnx.testing import conformance_tests

    test_conformance = conformance_tests("window", bad_options={"window": -1})

gives one pytest item per check (``test_conformance[onnx-body]``, ...), each failing
with the promise it breaks and the numbers. Outside pytest::

    from attnx.testing import check_variant

    report = check_variant("window")    # or a Variant object, before installing it
    print(report)
    report.raise_for_failures()

The checks (:data:`CHECKS`, in order; the ``export-*`` ones are heavy, seconds each):
``contract``, ``capabilities``, ``fake-impl``, ``onnx-schema``, ``onnx-body``,
``causality``, ``fp16``, ``gradients``, ``plugin-kernel``, ``export-function``, ``export-decomposed``,
``export-plugin``, ``export-fp16``; docs/plugins.md says what each promises and how it is checked.
They need no knowledge of the op's signature: the kit builds the variant's layer for
each declared capability, records its custom-op calls and replays them (see
:mod:`attnx.testing.subject`).
"""

from __future__ import annotations

from attnx.testing.checks import CHECKS, Check
from attnx.testing.report import CheckResult, ConformanceError, ConformanceReport
from attnx.testing.suite import check_variant, conformance_tests

__all__ = [
    "CHECKS",
    "Check",
    "CheckResult",
    "ConformanceError",
    "ConformanceReport",
    "check_variant",
    "conformance_tests",
]
