"""One export per (variant, model, lowering, options) per test process, shared by every test file; the
tests that use one export join its pytest-xdist group (:func:`same_worker`), so one worker makes it."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from attnx.api import ExportResult, export
from tests.models.cases import VARIANT_OPTIONS, cross_for

SEQ_LENS = [1, 7, 33]
_made: dict[str, ExportResult] = {}
_root: Path | None = None


def tiny_export(variant: str, model: str, lowering: str = "function", **options: Any) -> ExportResult:
    """The tiny-<model> recipe around ``variant`` (seq2seq: cross-attention by :func:`cross_for`),
    exported and verified at SEQ_LENS the first time it is asked for."""
    global _root
    key = json.dumps([variant, model, lowering, options], sort_keys=True)
    if key not in _made:
        if _root is None:
            _root = Path(tempfile.mkdtemp(prefix="attnx-test-exports-"))
            atexit.register(shutil.rmtree, _root, ignore_errors=True)
        _made[key] = export(
            variant,
            _root / f"{len(_made)}-{variant}-{model}-{lowering}",
            recipe=f"tiny-{model}",
            cross_variant=cross_for(variant) if model == "seq2seq" else None,
            options={
                **{**VARIANT_OPTIONS.get(variant, {}), **options},
                "export.lowering": lowering,
                "verify.seq_lens": SEQ_LENS,
            },
        )
    return _made[key]


def same_worker(variant: str, model: str, lowering: str = "function", **options: Any) -> pytest.MarkDecorator:
    """The ``xdist_group`` of the tests that call ``tiny_export`` with these arguments: ``--dist loadgroup``
    runs them on one worker, which makes the export once (a test in a fixture's group cannot join one)."""
    settings = "".join(f"-{key}={value}" for key, value in sorted(options.items()))
    return pytest.mark.xdist_group(f"tiny-{variant}-{model}-{lowering}{settings}")
